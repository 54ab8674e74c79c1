//! What a cached-inference run reports: how many prompt tokens were reused from the store, computed
//! new or recomputed, which units had to be encoded on the fly, where the prefill time went, and
//! in mode `blend` how the cached layers were streamed and which fraction the loading controller
//! chose.

use std::fmt;
use std::time::Duration;

use pml_engine::generation::SpeculationStats;

use super::InferenceMode;
use super::controller::{RatioChoice, Shortcut};
use super::fidelity::{FidelityEstimate, GuardFired};

/// How a pipelined `blend` prefill streamed the cached layers ([`super::layer_feed`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PipelineStats {
    /// Cached units whose layers came one entry at a time from the loader thread.
    pub units_streamed: usize,
    /// Layers the compute side received from the loader.
    pub layers_streamed: usize,
    /// Units spliced whole because their per-layer entries were missing, whose per-layer entries
    /// were written in this run (so the next prompt streams them).
    pub units_layered: usize,
    /// The loader's time reading, verifying, selecting and re-rotating layers (it overlaps the
    /// compute).
    pub fetch: Duration,
    /// Time the compute side waited for the loader (the part of `fetch` not hidden).
    pub waited: Duration,
}

/// The prefill's account.
#[derive(Clone, Debug, PartialEq)]
pub struct PrefillStats {
    pub mode: InferenceMode,
    /// Cached rows spliced from module states.
    pub tokens_reused: usize,
    /// Tokens computed in the prefill pass (every prompt token in mode `full`).
    pub tokens_new: usize,
    /// Cached tokens recomputed (selective recompute; 0 in `reuse` and `full`).
    pub tokens_recomputed: usize,
    /// Cached tokens the prompt imports that compressed module states do not hold
    /// (`pmlc compile --keep F`): neither spliced nor computed.
    pub tokens_dropped: usize,
    /// Positions of the tokens that ran through the last layer in mode `blend` (the recomputed
    /// cached tokens and the new ones); empty in the other modes.
    pub recomputed_positions: Vec<u32>,
    /// Units whose state was read from the store.
    pub units_loaded: usize,
    /// Units missing from the store, encoded (and stored) during this prefill: correct, but slow.
    pub units_encoded_on_the_fly: Vec<String>,
    /// Units missing from the store, encoded during this prefill, that the store could not
    /// take: the next prompt encodes them again.
    pub units_not_stored: Vec<String>,
    /// Reading (and, for missing units, encoding) states, selecting rows, re-rotating moved ones;
    /// when pipelined, what was read before the compute started plus the waits for the loader.
    pub load: Duration,
    /// The part of `load` spent reading whole unit states from the store (not encoding them).
    pub store_reads: Duration,
    /// Concatenating the blocks into one cache.
    pub splice: Duration,
    /// The forward pass of the new tokens (of all tokens in mode `full`).
    pub compute: Duration,
    /// Problems worked around, for a warning line.
    pub warnings: Vec<String>,
    /// Mode `blend` with the cached layers streamed during the compute.
    pub pipeline: Option<PipelineStats>,
    /// Mode `blend` with `--recompute auto`: the loading controller's choice.
    pub ratio_choice: Option<RatioChoice>,
    /// Mode `blend` did the cheaper thing instead of its selective recompute.
    pub shortcut: Option<Shortcut>,
    /// Mode `blend`'s estimated fidelity to mode `full` ([`super::fidelity`]); `None` where it
    /// was not estimated (no probe ran, or the ranking made no pass of the new tokens alone).
    pub fidelity: Option<FidelityEstimate>,
    /// The fidelity guard sent the prompt to mode `full`; the other figures are that prefill's.
    pub guard: Option<GuardFired>,
}

impl PrefillStats {
    pub fn new(mode: InferenceMode) -> Self {
        Self {
            mode,
            tokens_reused: 0,
            tokens_new: 0,
            tokens_recomputed: 0,
            tokens_dropped: 0,
            recomputed_positions: Vec::new(),
            units_loaded: 0,
            units_encoded_on_the_fly: Vec::new(),
            units_not_stored: Vec::new(),
            load: Duration::ZERO,
            store_reads: Duration::ZERO,
            splice: Duration::ZERO,
            compute: Duration::ZERO,
            warnings: Vec::new(),
            pipeline: None,
            ratio_choice: None,
            shortcut: None,
            fidelity: None,
            guard: None,
        }
    }

    /// Load, splice and compute together.
    pub fn total(&self) -> Duration {
        self.load + self.splice + self.compute
    }

    /// Blend's estimate: of the answer given, or, where the guard fired, of the one it replaced.
    pub fn blend_estimate(&self) -> Option<FidelityEstimate> {
        self.guard.map(|fired| fired.estimate).or(self.fidelity)
    }
}

/// A whole run: the prefill's account and the generation's timings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunStats {
    pub prefill: PrefillStats,
    /// Decoded within a KV budget (`--kv-budget`) that the prompt and answer could exceed.
    pub kv_budget: Option<super::budgeted_decode::BudgetReport>,
    /// Prefill (store loads and splice included) up to the first sampled token.
    pub time_to_first_token: Duration,
    pub tokens_generated: usize,
    /// Mean decode time per token after the first, if any were decoded.
    pub decode_ms_per_token: Option<f64>,
    /// Tokens drafted ahead of the model and accepted.
    pub speculation: SpeculationStats,
}

impl fmt::Display for RunStats {
    /// The one-line summary `pml run` prints to stderr.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefill = &self.prefill;
        write!(
            f,
            "mode {} | TTFT {:.0} ms (load {:.0} ms, splice {:.0} ms, compute {:.0} ms) | tokens \
             reused {} / recomputed {} / new {} | generated {}",
            prefill.mode,
            self.time_to_first_token.as_secs_f64() * 1e3,
            prefill.load.as_secs_f64() * 1e3,
            prefill.splice.as_secs_f64() * 1e3,
            prefill.compute.as_secs_f64() * 1e3,
            prefill.tokens_reused,
            prefill.tokens_recomputed,
            prefill.tokens_new,
            self.tokens_generated,
        )?;
        if prefill.tokens_dropped > 0 {
            write!(
                f,
                " | {} module tokens not kept (compressed states)",
                prefill.tokens_dropped
            )?;
        }
        if let Some(choice) = &prefill.ratio_choice {
            write!(f, " | {choice}")?;
        }
        if let Some(shortcut) = &prefill.shortcut {
            write!(f, " | {shortcut}")?;
        }
        match (&prefill.guard, &prefill.fidelity) {
            (Some(fired), _) => write!(f, " | {fired}")?,
            (None, Some(estimate)) => write!(f, " | {estimate}")?,
            (None, None) => {}
        }
        if let Some(pipeline) = &prefill.pipeline {
            write!(
                f,
                " | pipelined: {} units streamed, loader {:.0} ms, waited {:.0} ms",
                pipeline.units_streamed,
                pipeline.fetch.as_secs_f64() * 1e3,
                pipeline.waited.as_secs_f64() * 1e3
            )?;
            if pipeline.units_layered > 0 {
                write!(f, ", {} units stored per layer", pipeline.units_layered)?;
            }
        }
        if let Some(ms) = self.decode_ms_per_token {
            write!(f, " | decode {ms:.1} ms/token")?;
        }
        if self.speculation.drafted > 0 {
            write!(f, " | {}", self.speculation)?;
        }
        if let Some(report) = &self.kv_budget {
            let budget = report.budget;
            write!(
                f,
                " | KV budget {} slots ({} recent, {} sinks): {} evicted, {} held",
                budget.slots, budget.recent, budget.sinks, report.evicted, report.held
            )?;
        }
        if !prefill.units_encoded_on_the_fly.is_empty() {
            write!(
                f,
                " | not in the store, encoded now and stored for next time: {}",
                prefill.units_encoded_on_the_fly.join(", ")
            )?;
        }
        if !prefill.units_not_stored.is_empty() {
            write!(
                f,
                " | not in the store, encoded now but not stored (the store cannot be written): {}",
                prefill.units_not_stored.join(", ")
            )?;
        }
        Ok(())
    }
}
