//! What a cached-inference run reports: how many prompt tokens were reused from the store, computed
//! new or recomputed, which units had to be encoded on the fly, and where the prefill time went.

use std::fmt;
use std::time::Duration;

use super::InferenceMode;

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
    /// Positions of the tokens that ran through the last layer in mode `blend` (the recomputed
    /// cached tokens and the new ones); empty in the other modes.
    pub recomputed_positions: Vec<u32>,
    /// Units whose state was read from the store.
    pub units_loaded: usize,
    /// Units missing from the store, encoded (and stored) during this prefill: correct, but slow.
    pub units_encoded_on_the_fly: Vec<String>,
    /// Reading (and, for missing units, encoding) states, selecting rows, re-rotating moved ones.
    pub load: Duration,
    /// Concatenating the blocks into one cache.
    pub splice: Duration,
    /// The forward pass of the new tokens (of all tokens in mode `full`).
    pub compute: Duration,
    /// Problems worked around, for a warning line.
    pub warnings: Vec<String>,
}

impl PrefillStats {
    pub fn new(mode: InferenceMode) -> Self {
        Self {
            mode,
            tokens_reused: 0,
            tokens_new: 0,
            tokens_recomputed: 0,
            recomputed_positions: Vec::new(),
            units_loaded: 0,
            units_encoded_on_the_fly: Vec::new(),
            load: Duration::ZERO,
            splice: Duration::ZERO,
            compute: Duration::ZERO,
            warnings: Vec::new(),
        }
    }

    /// Load, splice and compute together.
    pub fn total(&self) -> Duration {
        self.load + self.splice + self.compute
    }
}

/// A whole run: the prefill's account and the generation's timings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunStats {
    pub prefill: PrefillStats,
    /// Prefill (store loads and splice included) up to the first sampled token.
    pub time_to_first_token: Duration,
    pub tokens_generated: usize,
    /// Mean decode time per token after the first, if any were decoded.
    pub decode_ms_per_token: Option<f64>,
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
        if let Some(ms) = self.decode_ms_per_token {
            write!(f, " | decode {ms:.1} ms/token")?;
        }
        if !prefill.units_encoded_on_the_fly.is_empty() {
            write!(
                f,
                " | warning: encoded on the fly (not in the store): {}",
                prefill.units_encoded_on_the_fly.join(", ")
            )?;
        }
        Ok(())
    }
}
