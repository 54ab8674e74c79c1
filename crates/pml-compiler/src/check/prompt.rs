//! Checks of a prompt against its schema (rules `PML2xx`): the schema it names, every import
//! resolved in its scope, union exclusivity, repeats, arguments (and their token length, when a
//! tokenizer is known), text inside imports, import order and role close tags.

use crate::rules::{self, diagnostic};
use crate::schema_index::{ModuleId, SchemaIndex, Scope, UnionId};
use crate::suggest::did_you_mean;
use crate::tokenizer::Tokenizer;
use pml_syntax::ast::{Import, Prompt, PromptItem, Role};
use pml_syntax::{Diagnostic, Span};
use std::collections::HashMap;

/// What the prompt checker may use besides the schema.
#[derive(Clone, Copy, Default)]
pub struct PromptCheckOptions<'a> {
    /// Counts argument tokens; without one, argument lengths are not checked.
    pub tokenizer: Option<&'a dyn Tokenizer>,
}

/// Checks `prompt` against `schema`; diagnostics come in source order.
pub fn check_prompt(
    prompt: &Prompt,
    schema: &SchemaIndex,
    options: &PromptCheckOptions,
) -> Vec<Diagnostic> {
    let mut checker = PromptChecker {
        index: schema,
        tokenizer: options.tokenizer,
        diagnostics: Vec::new(),
        imported: HashMap::new(),
        union_choices: HashMap::new(),
        closed_roles: Vec::new(),
    };
    checker
        .diagnostics
        .extend(check_schema_attribute(prompt, Some(schema)));
    checker.check_sequence(&prompt.items, Scope::Root, None);
    let mut diagnostics = checker.diagnostics;
    super::schema::sort_by_position(&mut diagnostics);
    diagnostics
}

/// The prompt's `schema` attribute: present, and naming `schema` when one is given.
pub fn check_schema_attribute(prompt: &Prompt, schema: Option<&SchemaIndex>) -> Option<Diagnostic> {
    let Some(named) = prompt
        .schema
        .as_ref()
        .filter(|name| !name.text.trim().is_empty())
    else {
        let near_miss = prompt
            .attributes
            .iter()
            .map(|attribute| attribute.name.text.as_str());
        let help = match did_you_mean("schema", near_miss) {
            Some(_) => "write the attribute as `schema=\"...\"`".to_string(),
            None => "add `schema=\"NAME\"`, the name of the schema this prompt uses".to_string(),
        };
        let span = prompt
            .schema
            .as_ref()
            .map_or(prompt.open_tag, |name| name.span);
        return Some(
            diagnostic(
                &rules::MISSING_SCHEMA_ATTRIBUTE,
                "prompt without a schema name",
            )
            .with_label(span, "which schema does this prompt use?")
            .with_help(help),
        );
    };
    let actual = schema?.name()?;
    (actual.text != named.text).then(|| {
        diagnostic(
            &rules::SCHEMA_NAME_MISMATCH,
            format!(
                "prompt written for schema `{}` is checked against schema `{}`",
                named.text, actual.text
            ),
        )
        .with_label(named.span, format!("the schema given is `{}`", actual.text))
        .with_help("give the schema this prompt names, or change the prompt's `schema` attribute")
    })
}

/// Where an import's name leads.
enum Resolution {
    InScope(ModuleId),
    /// Declared, but not in the scope it is imported in (reported already).
    Misplaced(ModuleId),
    Unknown,
}

fn module_union(index: &SchemaIndex, id: ModuleId) -> Option<UnionId> {
    index.module(id).union
}

struct PromptChecker<'a> {
    index: &'a SchemaIndex,
    tokenizer: Option<&'a dyn Tokenizer>,
    diagnostics: Vec<Diagnostic>,
    /// Each module imported so far, with the span of its first import's name.
    imported: HashMap<ModuleId, Span>,
    /// The member chosen for each union so far.
    union_choices: HashMap<UnionId, (ModuleId, Span)>,
    /// Indices into `index.open_roles()` already closed by the prompt.
    closed_roles: Vec<usize>,
}

/// The enclosing import of the items being checked.
#[derive(Clone, Copy)]
struct Parent<'a> {
    import: &'a Import,
    /// False under an import that was itself a repeat, so its children are not reported again.
    count_repeats: bool,
}

impl<'a> PromptChecker<'a> {
    /// Checks one list of siblings: the prompt's top level (role blocks included) or the children
    /// of one import.
    fn check_sequence(&mut self, items: &[PromptItem], scope: Scope, parent: Option<Parent>) {
        let mut last_import = None;
        self.check_items(items, scope, parent, &mut last_import);
    }

    fn check_items(
        &mut self,
        items: &[PromptItem],
        scope: Scope,
        parent: Option<Parent>,
        last_import: &mut Option<(ModuleId, Span)>,
    ) {
        for item in items {
            match item {
                PromptItem::Text(run) => {
                    if let Some(parent) = parent.filter(|_| !run.text.trim().is_empty()) {
                        self.report_content_in_import("text", run.span, parent.import);
                    }
                }
                PromptItem::Role(block) => match parent {
                    Some(parent) => {
                        self.report_content_in_import("a role block", block.open_tag, parent.import)
                    }
                    // Role blocks are transparent at the top level: imports inside keep their order.
                    None => self.check_items(&block.items, scope, None, last_import),
                },
                PromptItem::RoleClose { role, span } => match parent {
                    Some(parent) => {
                        self.report_content_in_import("a role close tag", *span, parent.import)
                    }
                    None => self.check_role_close(*role, *span),
                },
                PromptItem::Import(import) => self.check_import(import, scope, parent, last_import),
            }
        }
    }

    fn check_import(
        &mut self,
        import: &Import,
        scope: Scope,
        parent: Option<Parent>,
        last_import: &mut Option<(ModuleId, Span)>,
    ) {
        let id = match self.resolve(import, scope) {
            Resolution::InScope(id) => {
                self.check_order(id, import.name.span, last_import);
                id
            }
            Resolution::Misplaced(id) => id,
            Resolution::Unknown => return,
        };
        let count_repeats = parent.is_none_or(|parent| parent.count_repeats);
        let first_time = !count_repeats || self.check_repeats(id, import.name.span);
        self.check_arguments(id, import);
        self.check_sequence(
            &import.items,
            Scope::Module(id),
            Some(Parent {
                import,
                count_repeats: count_repeats && first_time,
            }),
        );
    }

    fn resolve(&mut self, import: &Import, scope: Scope) -> Resolution {
        let name = import.name.text.as_str();
        if let Some(id) = self.index.lookup(scope, name) {
            return Resolution::InScope(id);
        }
        let declared = self.index.modules_named(name);
        // Prefer a declaration nested in the current scope: then the fix is a shorter path.
        if let Some(&target) = declared
            .iter()
            .find(|&&id| self.index.is_within(id, scope))
            .or(declared.first())
        {
            self.report_misplaced(import, scope, target);
            return Resolution::Misplaced(target);
        }
        self.report_unknown(import, scope);
        Resolution::Unknown
    }

    fn report_misplaced(&mut self, import: &Import, scope: Scope, target: ModuleId) {
        let name = &import.name.text;
        let path = self.index.path(target);
        let (relative, where_to) = match scope {
            Scope::Module(outer) if self.index.is_within(target, scope) => {
                let below: Vec<ModuleId> = path
                    .iter()
                    .copied()
                    .skip_while(|&id| id != outer)
                    .skip(1)
                    .collect();
                (
                    below,
                    format!("inside `{}`", self.index.module(outer).name_text()),
                )
            }
            _ => (path.clone(), "at the top level of the prompt".to_string()),
        };
        let message = match self.index.parent(target) {
            Some(parent) => format!(
                "`{name}` is nested in `{}` and cannot be imported here",
                self.index.module(parent).name_text()
            ),
            None => format!(
                "`{name}` is a top-level module and cannot be imported {}",
                self.scope_description(scope)
            ),
        };
        self.diagnostics.push(
            diagnostic(&rules::IMPORT_OUTSIDE_PARENT, message)
                .with_label(
                    import.name.span,
                    format!("not declared {}", self.scope_description(scope)),
                )
                .with_help(format!(
                    "import it through its parents, {where_to}: {}",
                    self.render_path(&relative)
                )),
        );
    }

    fn report_unknown(&mut self, import: &Import, scope: Scope) {
        let name = import.name.text.as_str();
        let index = self.index;
        let in_scope = index
            .children(scope)
            .iter()
            .map(|&id| index.module(id).name_text());
        let help = if let Scope::Module(owner) = scope
            && index.module(owner).param(name).is_some()
        {
            let owner_name = index.module(owner).name_text();
            format!(
                "`{name}` is a parameter of `{owner_name}`: pass it as an attribute, `<{owner_name} {name}=\"...\">`"
            )
        } else if let Some(collection) = index
            .collections()
            .map(|(_, c)| c)
            .find(|c| c.scope == scope && c.name.as_ref().is_some_and(|n| n.text == name))
        {
            match collection.members.first() {
                Some(&member) => format!(
                    "`{name}` is a collection: import its members by name, such as `<{}/>`",
                    index.module(member).name_text()
                ),
                None => format!("`{name}` is a collection without members"),
            }
        } else if let Some(suggestion) = did_you_mean(name, in_scope.clone()) {
            suggestion
        } else if import.looks_like_code {
            format!(
                "`<{name}>` looks like code (a generic type, as in `Vec<u8>` or `<T>`), not an import: if \
                 it is text, write `&lt;` for `<` or wrap the text in `<![CDATA[ ... ]]>`"
            )
        } else if let Some(elsewhere) =
            did_you_mean(name, index.modules().map(|(_, module)| module.name_text()))
        {
            format!("{elsewhere} (declared elsewhere in the schema)")
        } else {
            let listed: Vec<String> = in_scope.take(8).map(|name| format!("`{name}`")).collect();
            if listed.is_empty() {
                format!(
                    "no modules can be imported {}",
                    self.scope_description(scope)
                )
            } else {
                format!("modules that can be imported here: {}", listed.join(", "))
            }
        };
        let schema_name = index.name().map_or("", |name| name.text.as_str());
        self.diagnostics.push(
            diagnostic(
                &rules::UNKNOWN_MODULE,
                format!("schema `{schema_name}` has no module `{name}`"),
            )
            .with_label(
                import.name.span,
                format!("unknown {}", self.scope_description(scope)),
            )
            .with_help(help),
        );
    }

    fn scope_description(&self, scope: Scope) -> String {
        match scope {
            Scope::Root => "at the top level".to_string(),
            Scope::Module(id) => format!("in `{}`", self.index.module(id).name_text()),
        }
    }

    /// `<a><b><c/></b></a>` for the modules `[a, b, c]`.
    fn render_path(&self, path: &[ModuleId]) -> String {
        let names: Vec<&str> = path
            .iter()
            .map(|&id| self.index.module(id).name_text())
            .collect();
        let Some((last, outer)) = names.split_last() else {
            return String::new();
        };
        let opening: String = outer.iter().map(|name| format!("<{name}>")).collect();
        let closing: String = outer
            .iter()
            .rev()
            .map(|name| format!("</{name}>"))
            .collect();
        format!("`{opening}<{last}/>{closing}`")
    }

    fn check_order(
        &mut self,
        id: ModuleId,
        span: Span,
        last_import: &mut Option<(ModuleId, Span)>,
    ) {
        // Collection members are positioned in prompt order, so any order is theirs.
        if self.index.module(id).collection.is_some() {
            return;
        }
        match *last_import {
            // Members of one union share their start position; importing two is another error.
            Some((previous, _))
                if module_union(self.index, id).is_some()
                    && module_union(self.index, id) == module_union(self.index, previous) => {}
            Some((previous, previous_span)) if id < previous => {
                let name = self.index.module(id).name_text();
                let previous_name = self.index.module(previous).name_text();
                self.diagnostics.push(
                    diagnostic(&rules::IMPORT_OUT_OF_ORDER, format!("`{name}` is imported after `{previous_name}` but comes before it in the schema"))
                        .with_label(span, format!("laid out before `{previous_name}`"))
                        .with_label(previous_span, "imported earlier")
                        .with_help(format!("move `{name}` before `{previous_name}`: positions follow the schema, not the prompt")),
                );
            }
            _ => *last_import = Some((id, span)),
        }
    }

    /// Reports a second import of `id`, or a second member of its union; true when neither.
    fn check_repeats(&mut self, id: ModuleId, span: Span) -> bool {
        let module = self.index.module(id);
        if module.collection.is_some() {
            return true;
        }
        if let Some(&first) = self.imported.get(&id) {
            self.diagnostics.push(
                diagnostic(
                    &rules::DUPLICATE_IMPORT,
                    format!("`{}` is imported twice", module.name_text()),
                )
                .with_label(span, "imported again here")
                .with_label(first, "first imported here")
                .with_help("a module has one place in the layout: remove one of the imports"),
            );
            return false;
        }
        self.imported.insert(id, span);
        let Some(union) = module.union else {
            return true;
        };
        match self.union_choices.get(&union) {
            Some(&(chosen, chosen_span)) => {
                let chosen_name = self.index.module(chosen).name_text();
                self.diagnostics.push(
                    diagnostic(
                        &rules::UNION_CONFLICT,
                        format!(
                            "`{}` and `{chosen_name}` are alternatives of one union",
                            module.name_text()
                        ),
                    )
                    .with_label(span, format!("conflicts with `{chosen_name}`"))
                    .with_label(chosen_span, "the union's member is already chosen here")
                    .with_help("import only one member of a union"),
                );
                false
            }
            None => {
                self.union_choices.insert(union, (id, span));
                true
            }
        }
    }

    fn check_arguments(&mut self, id: ModuleId, import: &Import) {
        let module = self.index.module(id);
        for argument in &import.arguments {
            let name = argument.name.text.as_str();
            let Some(param) = module.param(name) else {
                let params = module
                    .params
                    .iter()
                    .filter_map(|param| param.name.as_ref())
                    .map(|name| name.text.as_str());
                let help = did_you_mean(name, params.clone()).unwrap_or_else(|| {
                    let listed: Vec<String> = params.map(|param| format!("`{param}`")).collect();
                    if listed.is_empty() {
                        format!("`{}` takes no arguments", module.name_text())
                    } else {
                        format!(
                            "parameters of `{}`: {}",
                            module.name_text(),
                            listed.join(", ")
                        )
                    }
                });
                self.diagnostics.push(
                    diagnostic(
                        &rules::UNKNOWN_ARGUMENT,
                        format!("`{}` has no parameter `{name}`", module.name_text()),
                    )
                    .with_label(argument.name.span, "unknown argument")
                    .with_help(help),
                );
                continue;
            };
            let (Some(tokenizer), Some(len)) = (self.tokenizer, param.len) else {
                continue;
            };
            // A tokenizer that fails on plain text is broken in a way the binder reports when it
            // encodes the argument; the length check has nothing to add then.
            let Ok(n_tokens) = tokenizer.count_tokens(&argument.value) else {
                continue;
            };
            if n_tokens > len as usize {
                self.diagnostics.push(
                    diagnostic(&rules::ARGUMENT_TOO_LONG, format!("argument `{name}` takes {n_tokens} tokens but the parameter holds {len}"))
                        .with_label(argument.value_span, format!("{n_tokens} tokens, {} too many", n_tokens - len as usize))
                        .with_help(format!("shorten it to at most {len} tokens, or raise `len` of `{name}` in module `{}`", module.name_text())),
                );
            }
        }
    }

    fn report_content_in_import(&mut self, what: &str, span: Span, import: &Import) {
        self.diagnostics.push(
            diagnostic(
                &rules::TEXT_IN_IMPORT,
                format!("{what} inside the import of `{}`", import.name.text),
            )
            .with_label(span, "only nested imports may go here")
            .with_help(format!(
                "move it after `</{}>`; new text goes between or after imports",
                import.name.text
            )),
        );
    }

    fn check_role_close(&mut self, role: Role, span: Span) {
        let open_roles = self.index.open_roles();
        let unclosed = (0..open_roles.len()).find(|&position| {
            open_roles[position].role == role && !self.closed_roles.contains(&position)
        });
        if let Some(position) = unclosed {
            self.closed_roles.push(position);
            return;
        }
        let tag = role.tag();
        let help = if open_roles.iter().any(|open| open.role == role) {
            format!(
                "the `<{tag}>` block the schema leaves open is already closed earlier in this prompt"
            )
        } else {
            format!(
                "remove it: a prompt may close only a role the schema opens and leaves open, and the schema leaves no `<{tag}>` open"
            )
        };
        self.diagnostics.push(
            diagnostic(
                &rules::UNEXPECTED_ROLE_CLOSE,
                format!("`</{tag}>` closes a role that is not open"),
            )
            .with_label(span, "nothing to close")
            .with_help(help),
        );
    }
}
