//! A PML prompt's prefill in stages, for a server that interleaves prompts with running answers:
//! [`stage`] does what is cheap or cannot be split at once — binding the plan, loading and
//! splicing the cached spans (mode `reuse`), the whole of mode `blend` (its layer-wise
//! recompute is one pass) — and leaves the tokens to compute, which the server's step computes
//! a chunk at a time ([`StagedPrefill::chunk`]) in the one pass it runs for every sequence, in
//! position order (exact: a token never attends a later one).

use std::time::Duration;

use candle_core::Tensor;

use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, Model};

use super::plan::SplicePlan;
use super::reuse::{kept_plan, mark_parallel_contexts, splice};
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};
use crate::encode::UnitEncoder;

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
    // Chunks are exact only in position order (a token never attends a later chunk).
    if positions.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(EngineError::InvalidInput(
            "a chunked prefill needs tokens in position order".into(),
        )
        .into());
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

    /// The next chunk of at most `step_tokens` tokens (at least one), in position order, lent
    /// to a pass that computes it beside other sequences' rows ([`Model::forward_batch`]: each
    /// row placed at its laid-out position). Once the pass has written it into the cache,
    /// [`Self::after_chunk`] takes its last token's logits.
    pub fn chunk(&mut self, step_tokens: usize) -> StagedChunk<'_> {
        let end = self.chunk_end(step_tokens);
        StagedChunk {
            tokens: &self.tokens[self.done..end],
            positions: &self.positions[self.done..end],
            kv: &mut self.kv,
        }
    }

    /// After a pass computed [`Self::chunk`]`(step_tokens)` in `elapsed`, the last token's
    /// `logits` `(vocab,)`: still pending, or the prefill once its last token is done.
    pub fn after_chunk(mut self, step_tokens: usize, logits: Tensor, elapsed: Duration) -> Staged {
        self.stats.compute += elapsed;
        self.done = self.chunk_end(step_tokens);
        if self.done < self.tokens.len() {
            return Staged::Pending(self);
        }
        self.stats.tokens_new = self.tokens.len();
        Staged::Ready(Prefill {
            kv: self.kv,
            logits,
            stats: self.stats,
        })
    }

    /// One past the last token of the next chunk of at most `step_tokens` (at least one).
    fn chunk_end(&self, step_tokens: usize) -> usize {
        (self.done + step_tokens.max(1)).min(self.tokens.len())
    }
}

/// A staged prefill's next tokens, their positions and its cache ([`StagedPrefill::chunk`]).
pub struct StagedChunk<'s> {
    pub tokens: &'s [u32],
    pub positions: &'s [u32],
    pub kv: &'s mut KvCache,
}
