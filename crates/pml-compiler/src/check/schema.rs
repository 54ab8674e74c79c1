//! Checks of a schema on its own (rules `PML1xx`): names, scopes, unions, collections,
//! parameters, attributes and `src` files. Every problem is reported; none stops the walk.

use crate::rules::{self, diagnostic};
use crate::schema_index::{
    LenError, MAX_PARAM_LEN, MAX_SCHEMA_NAME_CHARS, ModuleId, SchemaIndex, Scope, is_blank,
    parse_len,
};
use crate::source_loader::{SourceError, SourceLoader};
use crate::suggest::did_you_mean;
use pml_syntax::ast::{
    Attribute, Collection, Module, Name, Param, Role, Schema, SchemaItem, Union,
};
use pml_syntax::{Diagnostic, Span};
use std::collections::{BTreeMap, HashMap};

/// The outcome of checking a schema: its index, the text of every `src` file that loaded, and
/// the diagnostics in source order.
#[derive(Clone, Debug)]
pub struct SchemaCheck {
    pub index: SchemaIndex,
    /// Text of each module's `src` file, for the modules whose file loaded.
    pub sources: BTreeMap<ModuleId, String>,
    pub diagnostics: Vec<Diagnostic>,
}

impl SchemaCheck {
    pub fn error_count(&self) -> usize {
        self.diagnostics
            .iter()
            .filter(|diagnostic| diagnostic.is_error())
            .count()
    }
}

/// Checks `schema`, reading `src` files through `loader`.
pub fn check_schema(schema: &Schema, loader: &dyn SourceLoader) -> SchemaCheck {
    let index = SchemaIndex::build(schema);
    let mut diagnostics = Vec::new();
    check_elements(schema, &mut diagnostics);
    check_duplicate_names(&index, &mut diagnostics);
    check_duplicate_params(&index, &mut diagnostics);
    let sources = load_sources(&index, loader, &mut diagnostics);
    sort_by_position(&mut diagnostics);
    SchemaCheck {
        index,
        sources,
        diagnostics,
    }
}

/// Orders diagnostics by their primary span, keeping the emission order of ties.
pub(crate) fn sort_by_position(diagnostics: &mut [Diagnostic]) {
    diagnostics
        .sort_by_key(|diagnostic| diagnostic.primary_span().map(|span| (span.start, span.end)));
}

/// Which element directly holds the items being walked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Container {
    /// The schema root, a module or a role block: anything may appear.
    Open,
    Union,
    Collection,
}

#[derive(Clone, Copy)]
struct Context {
    container: Container,
    in_module: bool,
}

const SCHEMA_ATTRIBUTES: &[&str] = &["name"];
const MODULE_ATTRIBUTES: &[&str] = &["name", "src"];
const UNION_ATTRIBUTES: &[&str] = &["default", "scaffold"];
const COLLECTION_ATTRIBUTES: &[&str] = &["name"];
const PARAM_ATTRIBUTES: &[&str] = &["name", "len", "length"];

/// The attributes a schema element (or the `schema` root) accepts: the checker's table, which
/// editors complete from. Role blocks and unknown elements accept none.
pub fn element_attributes(tag: &str) -> &'static [&'static str] {
    match tag {
        "schema" => SCHEMA_ATTRIBUTES,
        "module" => MODULE_ATTRIBUTES,
        "union" => UNION_ATTRIBUTES,
        "collection" => COLLECTION_ATTRIBUTES,
        "param" | "parameter" => PARAM_ATTRIBUTES,
        _ => &[],
    }
}

fn check_elements(schema: &Schema, diagnostics: &mut Vec<Diagnostic>) {
    check_attributes("schema", &schema.attributes, SCHEMA_ATTRIBUTES, diagnostics);
    check_name_present("schema", schema.name.as_ref(), schema.open_tag, diagnostics);
    if let Some(name) = &schema.name {
        check_schema_name_length(name, diagnostics);
    }
    let root = Context {
        container: Container::Open,
        in_module: false,
    };
    walk(&schema.items, root, diagnostics);
}

fn walk(items: &[SchemaItem], context: Context, diagnostics: &mut Vec<Diagnostic>) {
    for item in items {
        if context.container != Container::Open
            && !matches!(item, SchemaItem::Module(_))
            && !is_blank(item)
        {
            report_misplaced_member(item, context.container, diagnostics);
        }
        match item {
            SchemaItem::Text(_) => {}
            SchemaItem::Module(module) => {
                check_module(module, diagnostics);
                walk(
                    &module.items,
                    Context {
                        container: Container::Open,
                        in_module: true,
                    },
                    diagnostics,
                );
            }
            SchemaItem::Union(union) => {
                check_union(union, diagnostics);
                walk(
                    &union.items,
                    Context {
                        container: Container::Union,
                        ..context
                    },
                    diagnostics,
                );
            }
            SchemaItem::Collection(collection) => {
                check_collection(collection, diagnostics);
                walk(
                    &collection.items,
                    Context {
                        container: Container::Collection,
                        ..context
                    },
                    diagnostics,
                );
            }
            SchemaItem::Param(param) => {
                // A parameter directly in a union or collection was reported as a misplaced member.
                if context.container == Container::Open && !context.in_module {
                    diagnostics.push(
                        diagnostic(
                            &rules::PARAM_OUTSIDE_MODULE,
                            "parameter outside every module",
                        )
                        .with_label(param.open_tag, "this parameter belongs to no module")
                        .with_help(
                            "move it into the module whose import should receive the argument",
                        ),
                    );
                }
                check_param(param, diagnostics);
            }
            SchemaItem::Role(block) => {
                // A misplaced role block was reported above; its own content is judged as if it
                // stood where the block does.
                walk(&block.items, context, diagnostics);
            }
        }
    }
}

fn report_misplaced_member(
    item: &SchemaItem,
    container: Container,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let (what, span) = match item {
        SchemaItem::Text(run) => ("text", run.span),
        SchemaItem::Param(param) => ("a parameter", param.open_tag),
        SchemaItem::Union(union) => ("a union", union.open_tag),
        SchemaItem::Collection(collection) => ("a collection", collection.open_tag),
        SchemaItem::Role(block) => ("a role block", block.open_tag),
        SchemaItem::Module(_) => return,
    };
    let (rule, holder) = match container {
        Container::Union => (&rules::UNION_MEMBER_NOT_MODULE, "union"),
        Container::Collection => (&rules::COLLECTION_MEMBER_NOT_MODULE, "collection"),
        Container::Open => return,
    };
    diagnostics.push(
        diagnostic(rule, format!("{what} directly inside a {holder}"))
            .with_label(span, format!("only modules may be members of a {holder}"))
            .with_help(format!(
                "wrap it in a `<module name=\"...\">`, or move it out of the {holder}"
            )),
    );
}

fn check_module(module: &Module, diagnostics: &mut Vec<Diagnostic>) {
    check_attributes("module", &module.attributes, MODULE_ATTRIBUTES, diagnostics);
    check_name_present("module", module.name.as_ref(), module.open_tag, diagnostics);
    let Some(name) = &module.name else { return };
    if Role::from_tag(&name.text).is_some() {
        diagnostics.push(
            diagnostic(
                &rules::RESERVED_MODULE_NAME,
                format!("module named after the role tag `{}`", name.text),
            )
            .with_label(name.span, "a prompt tag with this name opens a chat role")
            .with_help(format!("rename the module, e.g. `{}-text`", name.text)),
        );
    } else if let Some(problem) = tag_name_problem(&name.text) {
        diagnostics.push(
            diagnostic(&rules::INVALID_MODULE_NAME, format!("module name `{}` cannot be written as a tag", name.text))
                .with_label(name.span, problem)
                .with_help("rename it: a letter or `_`, then letters, digits, `_`, `.`, `:` or `-` (`unit.py` is fine)"),
        );
    }
}

/// Why `name` cannot be a tag name, if it cannot (an empty name is reported as missing). Mirrors
/// the lexer's tag names: a letter or `_`, then letters, digits, `_`, `.`, `:` and `-`.
fn tag_name_problem(name: &str) -> Option<&'static str> {
    let first = name.chars().next()?;
    if !(first.is_alphabetic() || first == '_') {
        return Some("a tag name starts with a letter or `_`");
    }
    if name.chars().any(char::is_whitespace) {
        return Some("a tag name cannot hold whitespace");
    }
    if name
        .chars()
        .any(|c| !(c.is_alphanumeric() || "_.:-".contains(c)))
    {
        return Some("a tag name holds only letters, digits, `_`, `.`, `:` and `-`");
    }
    None
}

fn check_union(union: &Union, diagnostics: &mut Vec<Diagnostic>) {
    check_attributes("union", &union.attributes, UNION_ATTRIBUTES, diagnostics);
    if union.items.iter().all(is_blank) {
        diagnostics.push(
            diagnostic(&rules::EMPTY_UNION, "union without members")
                .with_label(union.open_tag, "this union holds nothing")
                .with_help("add `<module name=\"...\">` members, or remove the union"),
        );
    }
    let Some(default) = &union.default else {
        return;
    };
    let mut members = Vec::new();
    collect_member_names(&union.items, &mut members);
    if !members.iter().any(|member| member.text == default.value) {
        let names = members.iter().map(|member| member.text.as_str());
        let help = did_you_mean(&default.value, names.clone()).unwrap_or_else(|| {
            let listed: Vec<String> = names.map(|name| format!("`{name}`")).collect();
            if listed.is_empty() {
                "the union has no named members".to_string()
            } else {
                format!("members: {}", listed.join(", "))
            }
        });
        diagnostics.push(
            diagnostic(
                &rules::UNKNOWN_UNION_DEFAULT,
                format!("`{}` is not a member of this union", default.value),
            )
            .with_label(
                default.value_span,
                format!("`{}` names no member", default.name.text),
            )
            .with_help(help),
        );
    }
}

/// Names of the modules directly in a union or collection (role blocks are transparent).
fn collect_member_names<'a>(items: &'a [SchemaItem], names: &mut Vec<&'a Name>) {
    for item in items {
        match item {
            SchemaItem::Module(module) => names.extend(module.name.as_ref()),
            SchemaItem::Role(block) => collect_member_names(&block.items, names),
            _ => {}
        }
    }
}

fn check_collection(collection: &Collection, diagnostics: &mut Vec<Diagnostic>) {
    check_attributes(
        "collection",
        &collection.attributes,
        COLLECTION_ATTRIBUTES,
        diagnostics,
    );
    check_name_present(
        "collection",
        collection.name.as_ref(),
        collection.open_tag,
        diagnostics,
    );
}

fn check_param(param: &Param, diagnostics: &mut Vec<Diagnostic>) {
    check_attributes(
        &param.tag.text,
        &param.attributes,
        PARAM_ATTRIBUTES,
        diagnostics,
    );
    check_name_present(
        "parameter",
        param.name.as_ref(),
        param.open_tag,
        diagnostics,
    );
    let Some(len) = &param.len else {
        diagnostics.push(
            diagnostic(&rules::INVALID_PARAM_LEN, "parameter without `len`")
                .with_label(
                    param.open_tag,
                    "how many token positions does this parameter reserve?",
                )
                .with_help("add `len=\"N\"`: the most tokens an argument may take"),
        );
        return;
    };
    let problem = match parse_len(&len.value) {
        Ok(_) => return,
        Err(LenError::NotANumber) => diagnostic(
            &rules::INVALID_PARAM_LEN,
            format!("`{}` is not a whole number", len.value),
        )
        .with_label(len.value_span, "expected a token count such as `8`"),
        Err(LenError::Zero) => diagnostic(
            &rules::INVALID_PARAM_LEN,
            "a parameter must reserve at least one position",
        )
        .with_label(len.value_span, "`0` reserves nothing"),
        Err(LenError::TooLarge) => diagnostic(
            &rules::PARAM_LEN_TOO_LARGE,
            format!(
                "`{}` is above the limit of {MAX_PARAM_LEN} tokens",
                len.value.trim()
            ),
        )
        .with_label(len.value_span, "too many positions"),
    };
    diagnostics.push(problem.with_help(format!(
        "`{}` must be a whole number from 1 to {MAX_PARAM_LEN}",
        len.name.text
    )));
}

fn check_name_present(
    element: &str,
    name: Option<&Name>,
    open_tag: Span,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let span = match name {
        None => open_tag,
        Some(name) if name.text.trim().is_empty() => name.span,
        Some(_) => return,
    };
    let message = if name.is_some() {
        format!("{element} with an empty name")
    } else {
        format!("{element} without a name")
    };
    diagnostics.push(
        diagnostic(&rules::MISSING_NAME, message)
            .with_label(span, "add `name=\"...\"`")
            .with_help(format!("every {element} needs a name to be referred to by")),
    );
}

fn check_schema_name_length(name: &Name, diagnostics: &mut Vec<Diagnostic>) {
    let length = name.text.chars().count();
    if length <= MAX_SCHEMA_NAME_CHARS {
        return;
    }
    diagnostics.push(
        diagnostic(
            &rules::SCHEMA_NAME_TOO_LONG,
            format!(
                "the schema's name is {length} characters long, more than the \
                 {MAX_SCHEMA_NAME_CHARS} a name may have"
            ),
        )
        .with_label(name.span, "this name")
        .with_help(format!(
            "shorten the name to at most {MAX_SCHEMA_NAME_CHARS} characters (it becomes part of \
             file names) and rename it in the prompts that use it"
        )),
    );
}

fn check_attributes(
    element: &str,
    attributes: &[Attribute],
    known: &[&str],
    diagnostics: &mut Vec<Diagnostic>,
) {
    for attribute in attributes {
        let name = attribute.name.text.as_str();
        if known.contains(&name) {
            continue;
        }
        let known_list: Vec<String> = known.iter().map(|known| format!("`{known}`")).collect();
        let help = did_you_mean(name, known.iter().copied())
            .unwrap_or_else(|| format!("`<{element}>` takes {}", known_list.join(", ")));
        diagnostics.push(
            diagnostic(
                &rules::UNKNOWN_ATTRIBUTE,
                format!("unknown attribute `{name}` on `<{element}>`"),
            )
            .with_label(attribute.name.span, "this attribute is ignored")
            .with_help(help),
        );
    }
}

/// One name declared in a scope: a module's or a collection's.
struct Declaration<'a> {
    scope: Scope,
    name: &'a Name,
    kind: &'static str,
    /// Declared inside a union or a collection, whose members are named in the enclosing scope.
    in_group: bool,
}

fn check_duplicate_names(index: &SchemaIndex, diagnostics: &mut Vec<Diagnostic>) {
    let modules = index.modules().filter_map(|(_, module)| {
        let in_group = module.union.is_some() || module.collection.is_some();
        module.name.as_ref().map(|name| Declaration {
            scope: module.scope,
            name,
            kind: "module",
            in_group,
        })
    });
    let collections = index.collections().filter_map(|(_, collection)| {
        collection.name.as_ref().map(|name| Declaration {
            scope: collection.scope,
            name,
            kind: "collection",
            in_group: false,
        })
    });
    let mut declarations: Vec<Declaration> = modules.chain(collections).collect();
    declarations.sort_by_key(|declaration| declaration.name.span.start);
    let mut first_seen: HashMap<(Scope, &str), &Declaration> = HashMap::new();
    for declaration in &declarations {
        let key = (declaration.scope, declaration.name.text.as_str());
        let Some(first) = first_seen.get(&key) else {
            first_seen.insert(key, declaration);
            continue;
        };
        let scope = match declaration.scope {
            Scope::Root => "at the schema root".to_string(),
            Scope::Module(id) => format!("in module `{}`", index.module(id).name_text()),
        };
        let mut help = "rename one of them".to_string();
        if first.in_group || declaration.in_group {
            help.push_str(
                "; members of unions and collections are named in the enclosing module's scope",
            );
        }
        diagnostics.push(
            diagnostic(
                &rules::DUPLICATE_NAME,
                format!("`{}` is declared twice {scope}", declaration.name.text),
            )
            .with_label(
                declaration.name.span,
                format!("this {} reuses the name", declaration.kind),
            )
            .with_label(
                first.name.span,
                format!("first declared here (a {})", first.kind),
            )
            .with_help(help),
        );
    }
}

fn check_duplicate_params(index: &SchemaIndex, diagnostics: &mut Vec<Diagnostic>) {
    for (_, module) in index.modules() {
        let mut first_seen: HashMap<&str, Span> = HashMap::new();
        for name in module.params.iter().filter_map(|param| param.name.as_ref()) {
            if let Some(&first) = first_seen.get(name.text.as_str()) {
                diagnostics.push(
                    diagnostic(
                        &rules::DUPLICATE_PARAM,
                        format!(
                            "module `{}` has two parameters named `{}`",
                            module.name_text(),
                            name.text
                        ),
                    )
                    .with_label(name.span, "this parameter reuses the name")
                    .with_label(first, "first declared here")
                    .with_help("rename one of them"),
                );
            } else {
                first_seen.insert(&name.text, name.span);
            }
        }
    }
}

fn load_sources(
    index: &SchemaIndex,
    loader: &dyn SourceLoader,
    diagnostics: &mut Vec<Diagnostic>,
) -> BTreeMap<ModuleId, String> {
    let mut sources = BTreeMap::new();
    for (id, module) in index.modules() {
        let Some(src) = &module.src else { continue };
        if module.has_inline_content {
            diagnostics.push(
                diagnostic(
                    &rules::SRC_WITH_CONTENT,
                    format!("module `{}` has both `src` and content", module.name_text()),
                )
                .with_label(src.span, "the text comes from this file")
                .with_label(module.span, "and is also written here")
                .with_help("keep either the `src` attribute or the inline content"),
            );
        }
        if src.value.trim().is_empty() {
            diagnostics.push(
                diagnostic(&rules::SRC_UNREADABLE, "empty `src` path")
                    .with_label(src.value_span, "no file named")
                    .with_help("name a file relative to the schema's folder"),
            );
            continue;
        }
        match loader.load(&src.value) {
            Ok(text) => {
                sources.insert(id, text);
            }
            Err(error) => {
                let (rule, help) = if error.is_escape() {
                    (
                        &rules::SRC_OUTSIDE_SCHEMA_FOLDER,
                        "name a file inside the schema's folder, by a relative path",
                    )
                } else if matches!(error, SourceError::NotRegularFile { .. }) {
                    (
                        &rules::SRC_UNREADABLE,
                        "name a regular file, not a directory, FIFO, socket or device (reading \
                         a FIFO would wait for a writer)",
                    )
                } else if matches!(error, SourceError::Refused(_)) {
                    (
                        &rules::SRC_UNREADABLE,
                        "write the file's text inside the module instead of `src` (a schema sent \
                         to a server, or not saved in a folder, cannot name files)",
                    )
                } else {
                    (
                        &rules::SRC_UNREADABLE,
                        "the path is relative to the schema's folder",
                    )
                };
                diagnostics.push(
                    diagnostic(
                        rule,
                        format!("cannot load the source of module `{}`", module.name_text()),
                    )
                    .with_label(src.value_span, error.to_string())
                    .with_help(help),
                );
            }
        }
    }
    sources
}
