//! Layout: a checked schema laid out on one model's token positions ([`layout_schema`]), giving
//! the [`SchemaLayout`] that `pmlc compile` encodes and a prompt is bound to.
//!
//! Unit 0 is the root: BOS (when the model has one) at position 0, anonymous text and the role
//! strings outside modules. Every module is a unit of its own with its *own* tokens (its text,
//! the role strings inside it and its parameter slots; nested modules are their own units), in
//! schema order, so the module with [`ModuleId`] `i` is unit `i + 1` ([`unit_of`]). Each text run
//! is tokenized on its own, role strings with control tokens allowed; the separator rule
//! (`separator`) decides where a run gets a trailing `"\n"`. Collection members are laid out one
//! after another, so a collection reserves the sum of its members' extents; binding re-packs the
//! members a prompt imports, in prompt order, from the collection's start.

mod encode;
mod separator;
mod walker;

pub(crate) use encode::{TextKind, encode};
pub(crate) use separator::{Follow, needs_separator};

use crate::chat_template::ChatTemplate;
use crate::check::check_schema;
use crate::plan::{SchemaLayout, UnitId};
use crate::rules::{self, diagnostic};
use crate::schema_index::{ModuleId, SchemaIndex};
use crate::source_loader::SourceLoader;
use crate::tokenizer::Tokenizer;
use pml_syntax::Diagnostic;
use pml_syntax::ast::Schema;
use walker::{WalkInput, Walker};

/// The unit that holds module `module`'s own tokens.
pub fn unit_of(module: ModuleId) -> UnitId {
    UnitId(u32::try_from(module.index() + 1).unwrap_or(u32::MAX))
}

/// Lays `schema` out for a model. `index` is the schema's index (as [`check_schema`] builds it),
/// `source` the schema's text (its spans point into it), `loader` reads `src` files, and
/// `max_positions` is the model's context length: the schema must leave at least one position
/// free. The schema is checked first; its errors, or the layout's own (PML3xx), come back as
/// diagnostics in source order.
pub fn layout_schema(
    schema: &Schema,
    index: &SchemaIndex,
    source: &str,
    tokenizer: &dyn Tokenizer,
    template: &ChatTemplate,
    loader: &dyn SourceLoader,
    max_positions: u32,
) -> Result<SchemaLayout, Vec<Diagnostic>> {
    let check = check_schema(schema, loader);
    if check.error_count() > 0 {
        return Err(check
            .diagnostics
            .into_iter()
            .filter(Diagnostic::is_error)
            .collect());
    }
    let walked = Walker::new(WalkInput {
        source,
        index,
        tokenizer,
        template,
        sources: &check.sources,
    })
    .walk(&schema.items);
    let mut diagnostics = walked.diagnostics;
    let schema_name = index
        .name()
        .map_or_else(String::new, |name| name.text.clone());
    let layout = SchemaLayout {
        schema_name,
        units: walked.units,
        end_position: walked.end_position,
    };
    if u64::from(layout.end_position) + 1 > u64::from(max_positions) {
        diagnostics.push(too_long(schema, &layout, max_positions));
    }
    if diagnostics.is_empty() {
        Ok(layout)
    } else {
        diagnostics.sort_by_key(|diagnostic| diagnostic.primary_span().map(|span| span.start));
        Err(diagnostics)
    }
}

fn too_long(schema: &Schema, layout: &SchemaLayout, max_positions: u32) -> Diagnostic {
    let mut largest: Vec<(&str, u32)> = layout
        .units
        .iter()
        .filter(|unit| unit.parent == Some(UnitId::ROOT))
        .map(|unit| (unit.name.as_str(), unit.end - unit.start))
        .collect();
    largest.sort_by_key(|(_, extent)| std::cmp::Reverse(*extent));
    let listed: Vec<String> = largest
        .iter()
        .take(3)
        .map(|(name, extent)| format!("`{name}` ({extent} positions)"))
        .collect();
    let mut help = "put alternatives in a `<union>` (its members share positions), move rarely \
                    used modules to another schema, or shorten the text"
        .to_string();
    if !listed.is_empty() {
        help.push_str(&format!("; the largest modules: {}", listed.join(", ")));
    }
    let end = layout.end_position;
    let message = if end > max_positions {
        format!(
            "schema `{}` takes {end} positions, more than the model's context of {max_positions}",
            layout.schema_name
        )
    } else {
        format!(
            "schema `{}` takes all {end} positions of the model's context, leaving none for the answer",
            layout.schema_name
        )
    };
    diagnostic(&rules::SCHEMA_TOO_LONG, message)
        .with_label(
            schema.open_tag,
            format!(
                "{end} positions; at most {} fit",
                max_positions.saturating_sub(1)
            ),
        )
        .with_help(help)
}
