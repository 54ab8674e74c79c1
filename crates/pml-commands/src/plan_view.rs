//! `pml run --show-plan`: a readable account of a bound prompt — which units' cached rows are
//! spliced, at which positions, and which new tokens are computed where, with their text.

use std::fmt::Write;

use pml_compiler::Tokenizer;
use pml_compiler::plan::{BoundPrompt, NewTokenKind, SchemaLayout};

/// Characters of a run of new tokens' text shown before it is cut.
const MAX_TEXT_CHARS: usize = 60;

/// The plan of `bound`, one line per cached span and per run of new tokens.
pub fn describe_plan(
    layout: &SchemaLayout,
    bound: &BoundPrompt,
    tokenizer: &dyn Tokenizer,
) -> String {
    let mut out = String::new();
    let n_cached: usize = bound.cached.iter().map(|span| span.rows.len()).sum();
    let _ = writeln!(
        out,
        "plan: schema `{}`, {n_cached} cached rows in {} spans, {} new tokens",
        bound.schema_name,
        bound.cached.len(),
        bound.new_tokens.len()
    );
    for span in &bound.cached {
        let Some(unit) = layout.units.get(span.unit.index()) else {
            let _ = writeln!(out, "  cached  unit {} (not in the layout)", span.unit.0);
            continue;
        };
        let label = if unit.path.is_empty() {
            "(root)".to_owned()
        } else {
            unit.path.join("/")
        };
        // A collection member placed elsewhere moves by the delta between its first positions.
        let delta = match (span.placed_at, unit.positions.first()) {
            (Some(placed_at), Some(&first)) => i64::from(placed_at) - i64::from(first),
            _ => 0,
        };
        let positions: Vec<i64> = span
            .rows
            .iter()
            .filter_map(|&row| unit.positions.get(row))
            .map(|&position| i64::from(position) + delta)
            .collect();
        let range = match (positions.first(), positions.last()) {
            (Some(first), Some(last)) => format!("{first}..={last}"),
            _ => "-".to_owned(),
        };
        let dropped = unit.tokens.len() - span.rows.len();
        let _ = write!(
            out,
            "  cached  {:>5} rows at {range:<13} {label}",
            span.rows.len()
        );
        if dropped > 0 {
            let _ = write!(out, " ({dropped} placeholder rows replaced by arguments)");
        }
        if delta != 0 {
            let _ = write!(out, " (moved by {delta:+})");
        }
        out.push('\n');
    }
    for run in runs(bound) {
        let tokens = bound.new_tokens.get(run.start..run.end).unwrap_or_default();
        let text = tokenizer
            .decode(tokens)
            .unwrap_or_else(|_| "<undecodable>".to_owned());
        let _ = writeln!(
            out,
            "  new     {:>5} {:<9} at {}..={} {:?}",
            tokens.len(),
            kind_name(run.kind),
            bound.new_positions[run.start],
            bound.new_positions[run.end - 1],
            shorten(&text)
        );
    }
    out
}

/// Consecutive new tokens of one kind at consecutive positions.
struct Run {
    kind: NewTokenKind,
    start: usize,
    end: usize,
}

fn runs(bound: &BoundPrompt) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (index, (&kind, &position)) in bound.new_kinds.iter().zip(&bound.new_positions).enumerate()
    {
        match runs.last_mut() {
            Some(run)
                if run.kind == kind
                    && bound.new_positions[run.end - 1].checked_add(1) == Some(position) =>
            {
                run.end = index + 1;
            }
            _ => runs.push(Run {
                kind,
                start: index,
                end: index + 1,
            }),
        }
    }
    runs
}

fn kind_name(kind: NewTokenKind) -> &'static str {
    match kind {
        NewTokenKind::Argument => "argument",
        NewTokenKind::Text => "text",
        NewTokenKind::Template => "template",
        NewTokenKind::GenerationPrompt => "gen",
    }
}

fn shorten(text: &str) -> String {
    if text.chars().count() <= MAX_TEXT_CHARS {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(MAX_TEXT_CHARS).collect();
    short.push('…');
    short
}
