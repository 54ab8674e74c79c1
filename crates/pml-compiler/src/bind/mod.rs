//! Binding: a prompt bound to its schema's [`SchemaLayout`] ([`bind_prompt`]), giving the
//! [`BoundPrompt`] the runtime runs: which cached rows to splice (`selection`) and which new tokens
//! to compute at which positions (`placement`).
//!
//! The prompt is checked against the schema first, with the model's tokenizer so that argument
//! lengths are checked too; a prompt with errors is refused with them.

mod placement;
mod selection;

use crate::chat_template::ChatTemplate;
use crate::check::{PromptCheckOptions, check_prompt};
use crate::layout::unit_of;
use crate::plan::{BoundPrompt, SchemaLayout, UnitKind};
use crate::rules::{self, diagnostic};
use crate::schema_index::SchemaIndex;
use crate::tokenizer::Tokenizer;
use placement::Placer;
use pml_syntax::Diagnostic;
use pml_syntax::ast::Prompt;
use selection::Selector;

/// Binds `prompt` (whose spans point into `source`) to `layout`, the layout of the schema indexed
/// by `index`, for the model whose tokenizer and chat template are given. With
/// `add_generation_prompt` the template's generation prompt ends the new tokens.
pub fn bind_prompt(
    prompt: &Prompt,
    index: &SchemaIndex,
    layout: &SchemaLayout,
    source: &str,
    tokenizer: &dyn Tokenizer,
    template: &ChatTemplate,
    add_generation_prompt: bool,
) -> Result<BoundPrompt, Vec<Diagnostic>> {
    let options = PromptCheckOptions {
        tokenizer: Some(tokenizer),
    };
    let errors: Vec<Diagnostic> = check_prompt(prompt, index, &options)
        .into_iter()
        .filter(Diagnostic::is_error)
        .collect();
    if !errors.is_empty() {
        return Err(errors);
    }
    check_layout(prompt, index, layout)?;
    let selection = Selector {
        index,
        layout,
        tokenizer,
    }
    .select(&prompt.items)?;
    let new = Placer {
        source,
        tokenizer,
        template,
        selection: &selection,
        end_position: layout.end_position,
    }
    .place(&prompt.items, prompt.open_tag, add_generation_prompt)?;
    Ok(BoundPrompt {
        schema_name: layout.schema_name.clone(),
        cached: selection.cached,
        new_tokens: new.tokens,
        new_positions: new.positions,
        new_kinds: new.kinds,
    })
}

/// How the units of one import are moved from their layout positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shift {
    delta: i64,
    /// Whether the unit belongs to a collection member's copy (its `placed_at` is set, even when
    /// the copy happens to sit at its layout position).
    moved: bool,
}

impl Shift {
    const NONE: Shift = Shift {
        delta: 0,
        moved: false,
    };

    fn apply(self, position: u32) -> u32 {
        let shifted = i64::from(position) + self.delta;
        u32::try_from(shifted.max(0)).unwrap_or(u32::MAX)
    }
}

/// Whether `layout` was laid out from the schema `index` describes: one unit per module, in
/// order, with the same names, and units whose rows and slots are consistent.
fn check_layout(
    prompt: &Prompt,
    index: &SchemaIndex,
    layout: &SchemaLayout,
) -> Result<(), Vec<Diagnostic>> {
    let same_modules = layout.units.len() == index.modules().len() + 1
        && layout
            .units
            .first()
            .is_some_and(|root| root.kind == UnitKind::Root)
        && index
            .modules()
            .all(|(id, module)| layout.units[unit_of(id).index()].name == module.name_text());
    let consistent = layout.units.iter().all(|unit| {
        unit.tokens.len() == unit.positions.len()
            && unit
                .params
                .iter()
                .all(|slot| slot.token_offset + slot.len as usize <= unit.tokens.len())
    });
    let schema_name = index.name().map_or("", |name| name.text.as_str());
    if same_modules && consistent && layout.schema_name == schema_name {
        return Ok(());
    }
    let span = prompt
        .schema
        .as_ref()
        .map_or(prompt.open_tag, |name| name.span);
    Err(vec![
        diagnostic(
            &rules::LAYOUT_MISMATCH,
            format!(
                "the layout of schema `{}` does not match the schema `{schema_name}`",
                layout.schema_name
            ),
        )
        .with_label(span, "bound to a stale layout")
        .with_help("compile the schema again (`pmlc compile`), then run the prompt"),
    ])
}
