//! Speculative decoding: draft a few tokens cheaply, run them through the model in one pass
//! beside the token that must run anyway, keep the drafts the model itself would have chosen
//! and one token of its own. Every pass reads the weights once, so each accepted draft is a
//! decode step whose weight traffic was saved.
//!
//! Drafts come from n-gram lookup over the prompt (the imported modules' tokens included) and
//! the answer so far ([`ngram`]); how many to verify is decided per pass from measured pass
//! costs and acceptance ([`pace`]). A drafted token is accepted when the token the sampler draws
//! from the model's row equals it: for a draft of probability one this is speculative sampling's
//! rule (accept with `min(1, p/q)`, else resample from `(p − q)+`) exactly, and it draws the
//! same random numbers in the same order as decoding without drafts, so greedy and seeded
//! answers are the same tokens either way: a pass of up to [`MAX_DRAFT`] drafts computes each
//! row bit for bit as a decode step would (on the CPU's own kernels; candle's, as on CUDA, may
//! round a pass of several rows differently).

pub mod ngram;
pub mod pace;
#[cfg(test)]
mod tests;

use ngram::{MAX_NGRAM, NgramIndex};
use pace::{Acceptance, DraftOffer, PassCosts, draft_lengths};

/// How the decoding loop proposes tokens ahead of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speculation {
    /// One forward pass per token.
    Off,
    /// Drafts by n-gram lookup over the prompt and the answer so far.
    Ngram {
        /// Most drafted tokens verified in one pass.
        max_draft: usize,
        /// Shortest match of the sequence's end that proposes a draft.
        min_match: usize,
    },
}

/// The most drafted tokens a pass may verify: with the step's own token, the most rows whose
/// attention runs the decode step's kernel (`pml_kernels`' few-query loops), so that every row
/// of the pass is computed exactly as a decode step of it alone would be, bit for bit, and the
/// answer is the same tokens. (Passes of more rows also cost more than they save on the CPUs
/// measured.)
pub const MAX_DRAFT: usize = 7;

impl Default for Speculation {
    fn default() -> Self {
        Speculation::Ngram {
            max_draft: MAX_DRAFT,
            min_match: 1,
        }
    }
}

impl Speculation {
    /// Checks the numbers are in range.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Speculation::Off => Ok(()),
            Speculation::Ngram {
                max_draft,
                min_match,
            } => {
                if max_draft == 0 || max_draft > MAX_DRAFT {
                    return Err(format!(
                        "the draft length must be 1 to {MAX_DRAFT}, got {max_draft}"
                    ));
                }
                if min_match == 0 || min_match > MAX_NGRAM {
                    return Err(format!(
                        "the shortest n-gram match must be 1 to {MAX_NGRAM}, got {min_match}"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// What speculation did for one answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpeculationStats {
    /// Drafted tokens verified.
    pub drafted: usize,
    /// Drafted tokens the model agreed with (each a decode step saved).
    pub accepted: usize,
    /// Decode passes run (with or without drafts).
    pub passes: usize,
}

impl SpeculationStats {
    /// Accepted over drafted, `None` before any draft.
    pub fn acceptance_rate(&self) -> Option<f64> {
        (self.drafted > 0).then(|| self.accepted as f64 / self.drafted as f64)
    }
}

impl std::fmt::Display for SpeculationStats {
    /// `drafted 40, accepted 31 (78%) in 22 passes`: what the summary lines print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "drafted {}, accepted {} ({:.0}%) in {} passes",
            self.drafted,
            self.accepted,
            self.acceptance_rate().unwrap_or(0.0) * 100.0,
            self.passes
        )
    }
}

/// One sequence's drafting state: the n-gram index of everything so far, its drafts'
/// acceptance, and (for a sequence decoded alone) what its passes cost.
pub struct Drafter {
    index: NgramIndex,
    acceptance: Acceptance,
    costs: PassCosts,
    max_draft: usize,
    min_match: usize,
    /// The match length behind the draft under verification.
    pending_match: usize,
}

impl Drafter {
    /// A drafter for a sequence of `tokens` so far (the prompt); `None` when speculation is off.
    pub fn new(speculation: Speculation, tokens: &[u32]) -> Option<Self> {
        match speculation {
            Speculation::Off => None,
            Speculation::Ngram {
                max_draft,
                min_match,
            } => Some(Drafter {
                index: NgramIndex::new(tokens),
                acceptance: Acceptance::new(MAX_NGRAM),
                costs: PassCosts::new(max_draft + 1),
                max_draft,
                min_match,
                pending_match: 0,
            }),
        }
    }

    /// A token joined the sequence (the one about to run, or an accepted draft).
    pub fn push(&mut self, token: u32) {
        self.index.push(token);
    }

    /// Tokens that may follow the sequence's last one, at most `room` (what the answer's length
    /// limit and cache leave), and the chance that each is accepted; `None` when nothing matches.
    pub fn offer(&mut self, room: usize) -> Option<(Vec<u32>, DraftOffer)> {
        let found = self.index.draft(self.min_match, room.min(self.max_draft))?;
        self.pending_match = found.matched;
        let offer = DraftOffer {
            alpha: self.acceptance.rate(found.matched),
            available: found.tokens.len(),
        };
        Some((found.tokens, offer))
    }

    /// The tokens to verify after the sequence's last one when it is decoded alone, as many of
    /// [`Self::offer`]'s as its own passes' costs say pay; empty for a plain step.
    pub fn draft(&mut self, room: usize) -> Vec<u32> {
        let Some((mut tokens, offer)) = self.offer(room) else {
            return Vec::new();
        };
        tokens.truncate(draft_lengths(&self.costs, 1, 1.0, &[offer])[0]);
        tokens
    }

    /// Records a pass of this sequence alone, of `rows` rows, that took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        self.costs.record(rows, seconds);
    }

    /// Records the verdict on the last draft: `accepted` of its tokens kept, and whether the
    /// next was refused (rather than the answer ending first).
    pub fn record_verdict(&mut self, accepted: usize, rejected: bool) {
        self.acceptance
            .record(self.pending_match, accepted, rejected);
    }
}
