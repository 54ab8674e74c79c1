//! Decoding within a KV budget after a cached prefill (`pml run --kv-budget`, H2O): the prompt is
//! prefilled in its mode (modules spliced, a selective recompute), then its rows are scored by the
//! attention its last computed tokens pay them — SnapKV's observation window, the question and
//! the template's tail reading everything before them — and decoding goes on in
//! [`HeavyHitters`] passes that cut the cache to the budget before the first answer token runs
//! and keep it there, each pass adding its attention to the scores.
//!
//! The window is re-run at its own slots, rewriting the rows it already wrote with what it wrote
//! (the same tokens over the same cache), once the first answer token is sampled: time to first
//! token is the mode's. A budget the prompt and answer never reach changes nothing.

use std::collections::HashMap;

use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, ForwardContext, Model};

use super::plan::SplicePlan;
use crate::attention_mass::observed_layers;
use crate::kv_budget::{HeavyHitters, KvBudget};

/// The newest computed prompt tokens whose attention scores the prompt's rows: the question and
/// the template's tail in a typical prompt (SnapKV observes a window of the same kind).
pub const OBSERVATION_TOKENS: usize = 64;

/// What a KV budget did to one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetReport {
    /// The budget decoding kept to.
    pub budget: KvBudget,
    /// Slots evicted.
    pub evicted: usize,
    /// Slots held at the end.
    pub held: usize,
}

/// The heavy hitters to decode with after `plan`'s prefill left `kv`, the next token at
/// `next_position`: the prompt's rows scored by the observation window's attention.
pub fn hitters_after_prefill(
    model: &Model,
    plan: &SplicePlan,
    kv: &mut KvCache,
    budget: KvBudget,
    next_position: u32,
) -> Result<HeavyHitters, EngineError> {
    let scores = window_scores(model, plan, kv)?;
    Ok(HeavyHitters::after_prefill(budget, scores, next_position))
}

/// Each slot's attention from the last [`OBSERVATION_TOKENS`] new tokens (at most, and none
/// before the cache's horizon), summed over them, the heads and the layers, in a pass that
/// rewrites their rows at their slots.
fn window_scores(
    model: &Model,
    plan: &SplicePlan,
    kv: &mut KvCache,
) -> Result<Vec<f32>, EngineError> {
    let slot_of: HashMap<u32, usize> = kv
        .positions()
        .iter()
        .enumerate()
        .map(|(slot, &position)| (position, slot))
        .collect();
    // A splice for queries from a horizon on left out of its sliding-window layers the slots
    // such queries cannot see: only new tokens from there on can run again.
    let horizon = (0..kv.n_layers())
        .map(|layer_idx| kv.layer(layer_idx).map(|layer| layer.horizon()))
        .collect::<Result<Vec<u32>, _>>()?
        .into_iter()
        .max()
        .unwrap_or(0);
    let runnable = plan
        .new_positions
        .iter()
        .rposition(|&position| position < horizon)
        .map_or(0, |before| before + 1);
    let start = runnable.max(plan.new_tokens.len().saturating_sub(OBSERVATION_TOKENS));
    let positions = plan.new_positions[start..].to_vec();
    let slots = positions
        .iter()
        .map(|position| {
            slot_of.get(position).copied().ok_or_else(|| {
                EngineError::InvalidInput(format!(
                    "the prefill left no row at the new token's position {position}"
                ))
            })
        })
        .collect::<Result<Vec<usize>, EngineError>>()?;
    let context = ForwardContext::new(positions, slots)?;
    let mut scores = vec![0.0; kv.len()];
    observed_layers(model, &plan.new_tokens[start..], &context, kv, &mut scores)?;
    Ok(scores)
}
