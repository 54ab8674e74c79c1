//! Mode `full`, the reference: the prompt's whole token/position sequence — the cached spans' rows
//! at their positions and the new tokens — prefilled with no cache. Same tokens, same positions,
//! same mask as mode `reuse`; only the caching differs.

use std::time::Instant;

use crate::encode::chunked::prefill_sorted;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::Model;

use super::plan::SplicePlan;
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};

/// Computes every token of the plan from scratch, leaving room for `reserve` decoded tokens.
pub fn prefill_full(
    model: &Model,
    plan: &SplicePlan,
    reserve: usize,
) -> Result<Prefill, InferenceError> {
    let mut stats = PrefillStats::new(InferenceMode::Full);
    let compute_start = Instant::now();
    let mut kv = KvCache::with_capacity(
        model.kv_layout(),
        model.device(),
        plan.all_tokens.len() + reserve,
    )?;
    let logits = prefill_sorted(model, &plan.all_tokens, &plan.all_positions, &mut kv, true)?
        .ok_or_else(|| InferenceError::InvalidPrompt("no tokens".into()))?;
    stats.compute = compute_start.elapsed();
    stats.tokens_new = plan.all_tokens.len();
    Ok(Prefill { kv, logits, stats })
}
