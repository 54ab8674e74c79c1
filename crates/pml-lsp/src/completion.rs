//! Completion. In a prompt: the modules that may be imported at the cursor (the children of the
//! enclosing import's module, or the top-level modules), leaving out modules already imported
//! (collection members may repeat) and union members excluded by a member already chosen; inside
//! an import's open tag, its parameters not yet given. In a schema: element names and each
//! element's attributes. Where the cursor is (content, a tag name, a tag's attributes) is read
//! from the text before it, so half-typed tags the parser cannot make sense of still complete.

use crate::analysis::{Analysis, DocumentKind};
use crate::line_map::LineMap;
use crate::locate::{import_chain, resolve_chain, resolved_imports, touches};
use crate::location::Range;
use crate::schema_source::SchemaSource;
use pml_compiler::check::element_attributes;
use pml_compiler::{ModuleId, Scope};
use pml_syntax::Span;
use pml_syntax::ast::Prompt;
use pml_syntax::names::SCHEMA_ELEMENTS;
use std::collections::HashSet;

/// Where the cursor is, judged from the text before it.
#[derive(Debug, PartialEq, Eq)]
enum TagContext<'a> {
    /// Between tags.
    Content,
    /// Right after `<` and part of a name: `start` is the name's first byte.
    TagName { start: usize },
    /// After a tag's name: `written` are the attributes already there.
    Attributes { tag: &'a str, written: Vec<&'a str> },
    /// A close tag, a comment or an attribute value: nothing to complete.
    Other,
}

fn tag_context(text: &str, offset: usize) -> TagContext<'_> {
    let Some(before) = text.get(..offset) else {
        return TagContext::Other;
    };
    let Some(open) = before.rfind('<') else {
        return TagContext::Content;
    };
    if before.rfind('>').is_some_and(|close| close > open) {
        return TagContext::Content;
    }
    let inside = &before[open + 1..];
    if inside.starts_with(['/', '!', '?']) {
        return TagContext::Other;
    }
    let Some(name_end) = inside.find(char::is_whitespace) else {
        return TagContext::TagName { start: open + 1 };
    };
    let rest = &inside[name_end..];
    if rest.matches('"').count() % 2 == 1 {
        return TagContext::Other;
    }
    // A last word not yet followed by `=` is the attribute being typed, not one written.
    let typed = if rest.ends_with(|c: char| c.is_whitespace() || c == '"') {
        rest
    } else {
        rest.trim_end_matches(|c: char| !c.is_whitespace() && c != '"')
    };
    let written = typed
        .split('"')
        .step_by(2)
        .filter_map(|outside| outside.split('=').next())
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    TagContext::Attributes {
        tag: &inside[..name_end],
        written,
    }
}

/// What a completion inserts, in PML terms; the edge picks the editor's icon for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// A schema element's name (`module`, `union`, ...).
    Element,
    /// An attribute, a module's parameter included.
    Attribute,
    /// A module to import.
    Module,
}

/// A completion as the editor gets it: choosing it replaces `replace` with `insert`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionItem {
    pub label: String,
    pub kind: CompletionKind,
    pub detail: Option<String>,
    pub replace: Range,
    pub insert: String,
}

/// A completion while it is worked out, on the byte spans the syntax tree uses.
struct Completion {
    label: String,
    insert: String,
    replace: Span,
    kind: CompletionKind,
    detail: Option<String>,
}

/// The completions at `offset`, with edits in the document's positions.
pub fn completions(
    analysis: &Analysis,
    text: &str,
    lines: &LineMap,
    offset: usize,
) -> Vec<CompletionItem> {
    complete(analysis, text, offset)
        .into_iter()
        .map(|completion| CompletionItem {
            label: completion.label,
            kind: completion.kind,
            detail: completion.detail,
            replace: lines.range(text, completion.replace),
            insert: completion.insert,
        })
        .collect()
}

fn complete(analysis: &Analysis, text: &str, offset: usize) -> Vec<Completion> {
    let context = tag_context(text, offset);
    match (&analysis.kind, analysis.schema.as_deref()) {
        (DocumentKind::Prompt(prompt), Some(schema)) => {
            complete_prompt(prompt, schema, text, offset, context)
        }
        (DocumentKind::Schema, _) => complete_schema(offset, context),
        _ => Vec::new(),
    }
}

fn complete_schema(offset: usize, context: TagContext) -> Vec<Completion> {
    match context {
        TagContext::TagName { start } => SCHEMA_ELEMENTS
            .iter()
            .map(|tag| keyword(tag, tag, Span::new(start, offset), CompletionKind::Element))
            .collect(),
        TagContext::Content => SCHEMA_ELEMENTS
            .iter()
            .map(|tag| {
                keyword(
                    tag,
                    &format!("<{tag}"),
                    Span::new(offset, offset),
                    CompletionKind::Element,
                )
            })
            .collect(),
        TagContext::Attributes { tag, written } => {
            attributes(element_attributes(tag), &written, offset)
        }
        TagContext::Other => Vec::new(),
    }
}

/// `name=""` for each of `names` not already `written`, inserted at `offset`.
fn attributes(names: &[&str], written: &[&str], offset: usize) -> Vec<Completion> {
    names
        .iter()
        .filter(|name| !written.contains(name))
        .map(|name| {
            keyword(
                name,
                &format!("{name}=\"\""),
                Span::new(offset, offset),
                CompletionKind::Attribute,
            )
        })
        .collect()
}

fn keyword(label: &str, insert: &str, replace: Span, kind: CompletionKind) -> Completion {
    Completion {
        label: label.to_string(),
        insert: insert.to_string(),
        replace,
        kind,
        detail: None,
    }
}

fn complete_prompt(
    prompt: &Prompt,
    schema: &SchemaSource,
    text: &str,
    offset: usize,
    context: TagContext,
) -> Vec<Completion> {
    let index = schema.index();
    let (position, replace, bracket) = match context {
        TagContext::Content => (offset, Span::new(offset, offset), true),
        TagContext::TagName { start } => (start - 1, Span::new(start, offset), false),
        TagContext::Attributes { tag, written } => {
            return complete_arguments(prompt, schema, offset, tag, &written);
        }
        TagContext::Other => return Vec::new(),
    };
    // The imports around the cursor, not counting one being typed at it.
    let chain: Vec<_> = import_chain(&prompt.items, position)
        .into_iter()
        .take_while(|import| {
            import.span.start < position
                && (position < import.span.end || import.span.end == text.len())
        })
        .collect();
    let scope = match chain.as_slice() {
        [] => Scope::Root,
        chain => match resolve_chain(index, chain) {
            Some(id) => Scope::Module(id),
            None => return Vec::new(),
        },
    };
    let imported: HashSet<ModuleId> = resolved_imports(prompt, index)
        .into_iter()
        .filter(|(import, _)| import.span.start != position)
        .filter_map(|(_, id)| id)
        .collect();
    index
        .children(scope)
        .iter()
        .copied()
        .filter(|&id| !imported.contains(&id) || index.module(id).collection.is_some())
        .filter(|&id| !imported.iter().any(|&other| index.are_exclusive(id, other)))
        .filter_map(|id| {
            let module = index.module(id);
            let name = module.name.as_ref()?.text.clone();
            let insert = if bracket {
                format!("<{name}/>")
            } else {
                name.clone()
            };
            let params: Vec<&str> = module
                .params
                .iter()
                .filter_map(|param| param.name.as_ref().map(|name| name.text.as_str()))
                .collect();
            let detail = if params.is_empty() {
                "module".to_string()
            } else {
                format!("module ({})", params.join(", "))
            };
            Some(Completion {
                label: name,
                insert,
                replace,
                kind: CompletionKind::Module,
                detail: Some(detail),
            })
        })
        .collect()
}

fn complete_arguments(
    prompt: &Prompt,
    schema: &SchemaSource,
    offset: usize,
    tag: &str,
    written: &[&str],
) -> Vec<Completion> {
    let insert_at = Span::new(offset, offset);
    if tag == "prompt" {
        return attributes(&["schema"], written, offset);
    }
    let chain = import_chain(&prompt.items, offset);
    let Some(innermost) = chain.last() else {
        return Vec::new();
    };
    if !touches(innermost.open_tag, offset) || innermost.name.text != tag {
        return Vec::new();
    }
    let index = schema.index();
    let Some(id) = resolve_chain(index, &chain) else {
        return Vec::new();
    };
    index
        .module(id)
        .params
        .iter()
        .filter_map(|param| {
            let name = param.name.as_ref()?.text.as_str();
            (!written.contains(&name)).then(|| Completion {
                label: name.to_string(),
                insert: format!("{name}=\"\""),
                replace: insert_at,
                kind: CompletionKind::Attribute,
                detail: Some(match param.len {
                    Some(len) => format!("param, at most {len} tokens"),
                    None => "param".to_string(),
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_from_the_text_before_the_cursor() {
        let text = r#"<prompt schema="s"> <topic reader="a b" t"#;
        assert_eq!(tag_context(text, 0), TagContext::Content);
        assert_eq!(tag_context(text, 19), TagContext::Content);
        assert_eq!(tag_context(text, 23), TagContext::TagName { start: 21 });
        assert_eq!(
            tag_context(text, text.len()),
            TagContext::Attributes {
                tag: "topic",
                written: vec!["reader"]
            }
        );
        // Inside `"a b"`.
        assert_eq!(tag_context(text, 37), TagContext::Other);
        assert_eq!(tag_context("<a></", 5), TagContext::Other);
    }
}
