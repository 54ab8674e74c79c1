//! Hover text (Markdown). A module: its path, where it sits (union, collection), its parameters,
//! and — laid out for the injected model — its own token count and position range, or why those
//! figures are missing, and what the module store holds for it when the host provides a store;
//! an import in a prompt adds the module's source, truncated. A parameter
//! (in a schema, or an argument in a prompt): its `len`, scaffold and reserved positions.

use crate::analysis::{Analysis, DocumentKind};
use crate::locate::{PromptTarget, SchemaTarget, prompt_target, resolve_chain, schema_target};
use crate::location::Range;
use crate::model::ModelAvailability;
use crate::schema_source::SchemaSource;
use pml_compiler::schema_index::ParamInfo;
use pml_compiler::{ModuleId, unit_of};
use std::fmt::Write;

/// How much of a module's source an import's hover shows.
const SOURCE_PREVIEW_BYTES: usize = 600;

/// What a hover shows, and the range of the hovered word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hover {
    pub markdown: String,
    pub range: Range,
}

/// The hover text at `offset`, and the span it is about.
pub fn hover(
    analysis: &Analysis,
    offset: usize,
    model: &ModelAvailability,
) -> Option<(String, pml_syntax::Span)> {
    let schema = analysis.schema.as_deref()?;
    let index = schema.index();
    match &analysis.kind {
        DocumentKind::Schema => match schema_target(index, offset)? {
            SchemaTarget::Module(id) => {
                let module = index.module(id);
                let span = module
                    .name
                    .as_ref()
                    .map_or(module.open_tag, |name| name.span);
                Some((module_text(schema, id, model), span))
            }
            SchemaTarget::Param(id, position) => {
                let param = &index.module(id).params[position];
                Some((param_text(schema, id, param, model), param.span))
            }
        },
        DocumentKind::Prompt(prompt) => match prompt_target(prompt, offset)? {
            PromptTarget::Import { chain } => {
                let id = resolve_chain(index, &chain)?;
                let mut text = module_text(schema, id, model);
                append_source(&mut text, schema, id);
                Some((text, chain.last()?.name.span))
            }
            PromptTarget::Argument { chain, argument } => {
                let id = resolve_chain(index, &chain)?;
                let param = index.module(id).param(&argument.name.text)?;
                Some((param_text(schema, id, param, model), argument.span))
            }
            PromptTarget::SchemaName(name) => {
                let text = format!(
                    "**schema `{}`** — {} modules\n\n{}",
                    schema.name(),
                    index.modules().len(),
                    schema.resolved.location
                );
                Some((text, name.span))
            }
        },
        DocumentKind::Empty => None,
    }
}

fn module_text(schema: &SchemaSource, id: ModuleId, model: &ModelAvailability) -> String {
    let index = schema.index();
    let module = index.module(id);
    let path: Vec<&str> = index
        .path(id)
        .iter()
        .map(|&id| index.module(id).name_text())
        .collect();
    let mut text = format!("**module `{}`**", module.name_text());
    if path.len() > 1 {
        let _ = write!(text, " — `{}`", path.join(" › "));
    }
    text.push_str("\n\n");
    if module.union.is_some() {
        text.push_str("A member of a union: a prompt imports at most one member.\n\n");
    }
    if let Some(collection) = module.collection {
        let name = index
            .collection(collection)
            .name
            .as_ref()
            .map_or("", |name| name.text.as_str());
        let _ = writeln!(
            text,
            "A member of collection `{name}`: importable any number of times, in any order.\n"
        );
    }
    if !module.params.is_empty() {
        let params: Vec<String> = module
            .params
            .iter()
            .map(|param| {
                let name = param.name.as_ref().map_or("", |name| name.text.as_str());
                match param.len {
                    Some(len) => format!("`{name}` ({len})"),
                    None => format!("`{name}`"),
                }
            })
            .collect();
        let _ = writeln!(text, "Parameters: {}\n", params.join(", "));
    }
    match model.model() {
        Ok(model) => match schema.layout(model) {
            Ok(layout) => match layout.units.get(unit_of(id).index()) {
                Some(unit) => {
                    let _ = write!(
                        text,
                        "With `{}`: {} tokens of its own, positions {}..{} (nested modules included)",
                        model.name,
                        unit.tokens.len(),
                        unit.start,
                        unit.end
                    );
                    if let Some(compiled) = &model.compiled {
                        let _ =
                            write!(text, "\n\n{}", compiled.describe(&layout.schema_name, unit));
                    }
                }
                None => text.push_str("Token counts: the layout has no unit for this module"),
            },
            Err(reason) => {
                let _ = write!(text, "Token counts and positions: {reason}");
            }
        },
        Err(reason) => {
            let _ = write!(text, "Token counts and positions: not shown ({reason})");
        }
    }
    text
}

fn param_text(
    schema: &SchemaSource,
    owner: ModuleId,
    param: &ParamInfo,
    model: &ModelAvailability,
) -> String {
    let index = schema.index();
    let name = param.name.as_ref().map_or("", |name| name.text.as_str());
    let mut text = format!(
        "**param `{name}`** of module `{}`\n\n",
        index.module(owner).name_text()
    );
    match (param.len, &param.len_attribute) {
        (Some(len), _) => {
            let _ = writeln!(
                text,
                "`len`: {len} tokens (an argument may take at most {len})\n"
            );
        }
        (None, Some(attribute)) => {
            let _ = writeln!(text, "`len`: `{}` (not a valid length)\n", attribute.value);
        }
        (None, None) => text.push_str("No `len`.\n\n"),
    }
    if let Some(scaffold) = &param.scaffold {
        let _ = writeln!(
            text,
            "Scaffold (used without an argument): {}\n",
            scaffold.text
        );
    }
    if let Ok(model) = model.model()
        && let Ok(layout) = schema.layout(model)
        && let Some(slot) = layout
            .units
            .get(unit_of(owner).index())
            .and_then(|unit| unit.params.iter().find(|slot| slot.name == name))
    {
        let _ = write!(
            text,
            "With `{}`: positions {}..{}",
            model.name,
            slot.start,
            slot.start + slot.len
        );
    }
    text
}

fn append_source(text: &mut String, schema: &SchemaSource, id: ModuleId) {
    let span = schema.index().module(id).span;
    let Some(source) = schema.text.get(span.start..span.end) else {
        return;
    };
    let mut end = source.len().min(SOURCE_PREVIEW_BYTES);
    while !source.is_char_boundary(end) {
        end -= 1;
    }
    let ellipsis = if end < source.len() { "\n…" } else { "" };
    let _ = write!(text, "\n\n```xml\n{}{ellipsis}\n```", &source[..end]);
}
