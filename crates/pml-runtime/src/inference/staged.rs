//! A PML prompt's prefill in stages, for a server that interleaves prompts with running answers:
//! [`stage`] does what is cheap or cannot be split at once — binding the plan, loading and
//! splicing the cached spans (mode `reuse`), the whole of mode `blend` (its layer-wise
//! recompute is one pass) — and leaves the tokens to compute, which [`StagedPrefill::advance`]
//! computes a chunk at a time, in position order (exact: a token never attends a later one).

use std::time::Instant;

use pml_engine::kv_cache::KvCache;
use pml_engine::model::Model;

use super::plan::SplicePlan;
use super::reuse::{kept_plan, mark_parallel_contexts, splice};
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};
use crate::encode::UnitEncoder;
use crate::encode::chunked::prefill_sorted;

/// A prefill whose tokens are still (partly) to compute.
pub struct StagedPrefill {
    kv: KvCache,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    done: usize,
    stats: PrefillStats,
}

/// Where a staged prefill stands.
pub enum Staged {
    Ready(Prefill),
    Pending(StagedPrefill),
}

/// Starts `plan`'s prefill in `mode`, with room for `reserve` decoded tokens.
pub fn stage(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    mode: InferenceMode,
    reserve: usize,
) -> Result<Staged, InferenceError> {
    let (kv, tokens, positions, stats) = match mode {
        InferenceMode::Blend(_) => {
            return super::prefill(model, encoder, plan, mode, reserve).map(Staged::Ready);
        }
        InferenceMode::Reuse => {
            let mut stats = PrefillStats::new(mode);
            let plan = &*kept_plan(encoder, plan, &mut stats)?;
            let extra = plan.new_tokens.len() + reserve;
            let first_query = plan.first_new_position();
            let mut kv = splice(model, encoder, plan, extra, first_query, &mut stats)?;
            stats.tokens_reused = kv.len();
            mark_parallel_contexts(&mut kv, plan, encoder.parallel_scaling());
            (
                kv,
                plan.new_tokens.clone(),
                plan.new_positions.clone(),
                stats,
            )
        }
        InferenceMode::Full => {
            let capacity = plan.all_tokens.len() + reserve;
            let kv = KvCache::with_capacity(model.kv_layout(), model.device(), capacity)?;
            let stats = PrefillStats::new(mode);
            (
                kv,
                plan.all_tokens.clone(),
                plan.all_positions.clone(),
                stats,
            )
        }
    };
    if tokens.is_empty() {
        return Err(InferenceError::InvalidPrompt("no tokens to compute".into()));
    }
    Ok(Staged::Pending(StagedPrefill {
        kv,
        tokens,
        positions,
        done: 0,
        stats,
    }))
}

impl StagedPrefill {
    /// Tokens still to compute.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.done
    }

    /// The prompt's cache so far (what is spliced and computed).
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Computes the next `budget` tokens (at least one); the prefill once the last is done.
    pub fn advance(mut self, model: &Model, budget: usize) -> Result<Staged, InferenceError> {
        let started = Instant::now();
        let end = (self.done + budget.max(1)).min(self.tokens.len());
        let last = end == self.tokens.len();
        let logits = prefill_sorted(
            model,
            &self.tokens[self.done..end],
            &self.positions[self.done..end],
            &mut self.kv,
            last,
        )?;
        self.stats.compute += started.elapsed();
        self.done = end;
        match logits {
            Some(logits) if last => {
                self.stats.tokens_new = self.tokens.len();
                Ok(Staged::Ready(Prefill {
                    kv: self.kv,
                    logits,
                    stats: self.stats,
                }))
            }
            _ => Ok(Staged::Pending(self)),
        }
    }
}
