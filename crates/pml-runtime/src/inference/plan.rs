//! Splice planning: a [`BoundPrompt`] checked against its layout and turned into what both modes
//! need — each cached span's rows and their positions in this prompt, the new tokens in position
//! order, and the whole prompt's tokens in position order (what mode `full` prefills and what the
//! sampler's repetition penalty and the detokenizer look back over).

use pml_compiler::plan::{BoundPrompt, SchemaLayout, UnitId};

use crate::encode::context::unit;

use super::InferenceError;

/// One cached span, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedSpan {
    pub unit: UnitId,
    /// Rows of the unit's tokens to splice, ascending.
    pub rows: Vec<usize>,
    pub tokens: Vec<u32>,
    /// Positions of the rows at encoding time.
    pub encoded_positions: Vec<u32>,
    /// Positions of the rows in this prompt (differ only for a unit placed elsewhere).
    pub positions: Vec<u32>,
}

impl PlannedSpan {
    pub fn is_moved(&self) -> bool {
        self.positions != self.encoded_positions
    }
}

/// A bound prompt ready to splice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplicePlan {
    /// Non-empty spans, ordered by their first position.
    pub spans: Vec<PlannedSpan>,
    /// New tokens and their positions, sorted by position (stable).
    pub new_tokens: Vec<u32>,
    pub new_positions: Vec<u32>,
    /// Every token of the prompt, cached and new, in position order, with its position.
    pub all_tokens: Vec<u32>,
    pub all_positions: Vec<u32>,
}

impl SplicePlan {
    /// Checks `bound` against `layout` (schema name, unit ids, rows, placements, the new tokens)
    /// and resolves it.
    pub fn new(layout: &SchemaLayout, bound: &BoundPrompt) -> Result<Self, InferenceError> {
        let invalid = |message: String| Err(InferenceError::InvalidPrompt(message));
        if bound.schema_name != layout.schema_name {
            return invalid(format!(
                "the prompt is bound to schema `{}`, the layout is of `{}`",
                bound.schema_name, layout.schema_name
            ));
        }
        if bound.new_tokens.is_empty() {
            return invalid("no new tokens: at least the generation prompt is computed".into());
        }
        if bound.new_tokens.len() != bound.new_positions.len() {
            return invalid(format!(
                "{} new tokens with {} positions",
                bound.new_tokens.len(),
                bound.new_positions.len()
            ));
        }
        let mut spans = Vec::with_capacity(bound.cached.len());
        for span in &bound.cached {
            let layout_unit = unit(layout, span.unit)?;
            if span.rows.windows(2).any(|pair| pair[0] >= pair[1]) {
                return invalid(format!("rows of unit {} are not ascending", span.unit.0));
            }
            if let Some(&row) = span
                .rows
                .iter()
                .find(|&&row| row >= layout_unit.tokens.len())
            {
                return invalid(format!(
                    "row {row} of unit {}, which has {} tokens",
                    span.unit.0,
                    layout_unit.tokens.len()
                ));
            }
            if span.rows.is_empty() {
                continue;
            }
            let tokens: Vec<u32> = span
                .rows
                .iter()
                .map(|&row| layout_unit.tokens[row])
                .collect();
            let encoded_positions: Vec<u32> = span
                .rows
                .iter()
                .map(|&row| layout_unit.positions[row])
                .collect();
            let positions = match (span.placed_at, layout_unit.positions.first()) {
                (Some(placed_at), Some(&first)) => {
                    let delta = i64::from(placed_at) - i64::from(first);
                    encoded_positions
                        .iter()
                        .map(|&position| {
                            u32::try_from(i64::from(position) + delta).map_err(|_| {
                                InferenceError::InvalidPrompt(format!(
                                    "unit {} placed at {placed_at} moves position {position} \
                                     out of range",
                                    span.unit.0
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?
                }
                _ => encoded_positions.clone(),
            };
            spans.push(PlannedSpan {
                unit: span.unit,
                rows: span.rows.clone(),
                tokens,
                encoded_positions,
                positions,
            });
        }
        spans.sort_by_key(|span| span.positions[0]);
        let plan = Self::assemble(spans, &bound.new_tokens, &bound.new_positions);
        if plan.all_positions.last() != plan.new_positions.last() {
            return invalid(format!(
                "the last new token (position {:?}) must come after every cached token \
                 (position {:?}): its logits choose the first answer token",
                plan.new_positions.last(),
                plan.all_positions.last()
            ));
        }
        Ok(plan)
    }

    /// The plan over `spans` (ordered, non-empty) and the new tokens at their positions.
    fn assemble(spans: Vec<PlannedSpan>, new_tokens: &[u32], new_positions: &[u32]) -> Self {
        let (new_tokens, new_positions) = sorted_by_position(
            new_tokens
                .iter()
                .copied()
                .zip(new_positions.iter().copied()),
        );
        let cached_pairs = spans.iter().flat_map(|span| {
            span.tokens
                .iter()
                .copied()
                .zip(span.positions.iter().copied())
        });
        let new_pairs = new_tokens
            .iter()
            .copied()
            .zip(new_positions.iter().copied());
        let (all_tokens, all_positions) = sorted_by_position(cached_pairs.chain(new_pairs));
        Self {
            spans,
            new_tokens,
            new_positions,
            all_tokens,
            all_positions,
        }
    }

    /// The plan splicing only the cached rows `held` marks (one flag per row of each span, in
    /// order): what compressed states hold. Spans left with no row are dropped.
    pub fn retaining(
        &self,
        mut held: impl FnMut(&PlannedSpan) -> Result<Vec<bool>, InferenceError>,
    ) -> Result<Self, InferenceError> {
        let mut spans = Vec::with_capacity(self.spans.len());
        for span in &self.spans {
            let flags = held(span)?;
            if flags.len() != span.rows.len() {
                return Err(InferenceError::InvalidPrompt(format!(
                    "{} flags for the {} rows of unit {}",
                    flags.len(),
                    span.rows.len(),
                    span.unit.0
                )));
            }
            let keep = |values: &[u32]| -> Vec<u32> {
                values
                    .iter()
                    .zip(&flags)
                    .filter_map(|(&value, &held)| held.then_some(value))
                    .collect()
            };
            let rows: Vec<usize> = span
                .rows
                .iter()
                .zip(&flags)
                .filter_map(|(&row, &held)| held.then_some(row))
                .collect();
            if rows.is_empty() {
                continue;
            }
            spans.push(PlannedSpan {
                unit: span.unit,
                rows,
                tokens: keep(&span.tokens),
                encoded_positions: keep(&span.encoded_positions),
                positions: keep(&span.positions),
            });
        }
        Ok(Self::assemble(spans, &self.new_tokens, &self.new_positions))
    }

    /// The positions the prompt takes: one past its highest (where decoding goes on), or its
    /// token count where that is more. Collection members imported more often than their
    /// collection holds run on past the schema's end, so this can exceed the layout's.
    pub fn positions_taken(&self) -> usize {
        let past_highest = self
            .all_positions
            .last()
            .map_or(0, |&position| position as usize + 1);
        past_highest.max(self.all_tokens.len())
    }

    /// Number of cached rows spliced.
    pub fn n_cached(&self) -> usize {
        self.spans.iter().map(|span| span.rows.len()).sum()
    }

    /// The lowest position of a new token (they are sorted): no row computed after the splice
    /// is earlier. `None` without new tokens.
    pub fn first_new_position(&self) -> Option<u32> {
        self.new_positions.first().copied()
    }
}

/// Tokens and positions of `pairs`, stably sorted by position.
fn sorted_by_position(pairs: impl Iterator<Item = (u32, u32)>) -> (Vec<u32>, Vec<u32>) {
    let mut pairs: Vec<(u32, u32)> = pairs.collect();
    pairs.sort_by_key(|&(_, position)| position);
    pairs.into_iter().unzip()
}
