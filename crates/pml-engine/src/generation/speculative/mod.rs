//! Speculative decoding: draft a few tokens cheaply, run them through the model in one pass
//! beside the token that must run anyway, keep the drafts the model itself would have chosen
//! and one token of its own. Every pass reads the weights once, so each accepted draft is a
//! decode step whose weight traffic was saved.
//!
//! Drafts come from n-gram lookup over the prompt (the imported modules' tokens included) and
//! the answer so far ([`ngram`]), how many to verify decided per pass from measured pass costs
//! and acceptance ([`pace`]); or from a smaller model of the same vocabulary decoding greedily
//! ahead in its own cache until its confidence drops ([`draft_model`]). A drafted token is accepted when the token the sampler draws
//! from the model's row equals it: for a draft of probability one this is speculative sampling's
//! rule (accept with `min(1, p/q)`, else resample from `(p − q)+`) exactly, and it draws the
//! same random numbers in the same order as decoding without drafts, so greedy and seeded
//! answers are the same tokens either way: a pass of up to [`MAX_DRAFT`] drafts computes each
//! row bit for bit as a decode step would (on the CPU's own kernels; candle's, as on CUDA, may
//! round a pass of several rows differently).

pub mod draft_model;
#[cfg(test)]
mod draft_tests;
pub mod earlier;
pub mod ngram;
pub mod pace;
#[cfg(test)]
mod tests;

pub use draft_model::{DraftModel, ModelDrafter, ModelPace};
use earlier::AnswerAt;
pub use earlier::{EarlierAnswers, Learnt};
use ngram::{MAX_NGRAM, NgramDraft, NgramIndex};
use pace::{Acceptance, DraftOffer, PassCosts, draft_lengths};

/// How the decoding loop proposes tokens ahead of the model.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Drafts by a smaller model of the same vocabulary (the caller's [`DraftModel`]).
    Draft {
        /// Most drafted tokens verified in one pass.
        max_draft: usize,
        /// The draft stops before a token the draft model gives less than this probability.
        p_min: f32,
    },
}

/// `--draft-p-min`'s default: llama.cpp's.
pub const DEFAULT_DRAFT_P_MIN: f32 = 0.75;

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
    /// The n-gram lookup of this speculation: a draft model's drafts are asked for only where
    /// the lookup finds nothing worth verifying.
    pub fn lookup(self) -> Speculation {
        match self {
            Speculation::Draft { max_draft, .. } => Speculation::Ngram {
                max_draft,
                min_match: 1,
            },
            other => other,
        }
    }

    /// Checks the numbers are in range.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Speculation::Off => Ok(()),
            Speculation::Ngram {
                max_draft,
                min_match,
            } => {
                check_draft_length(max_draft)?;
                if min_match == 0 || min_match > MAX_NGRAM {
                    return Err(format!(
                        "the shortest n-gram match must be 1 to {MAX_NGRAM}, got {min_match}"
                    ));
                }
                Ok(())
            }
            Speculation::Draft { max_draft, p_min } => {
                check_draft_length(max_draft)?;
                if !(0.0..=1.0).contains(&p_min) {
                    return Err(format!("the draft's p-min must be 0 to 1, got {p_min}"));
                }
                Ok(())
            }
        }
    }
}

fn check_draft_length(max_draft: usize) -> Result<(), String> {
    if max_draft == 0 || max_draft > MAX_DRAFT {
        return Err(format!(
            "the draft length must be 1 to {MAX_DRAFT}, got {max_draft}"
        ));
    }
    Ok(())
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
/// acceptance (of those found in itself, and in a server's earlier answers), and (for a
/// sequence decoded alone) what its passes cost.
pub struct Drafter {
    index: NgramIndex,
    /// Tokens of the prompt, at the index's start.
    prompt_len: usize,
    acceptance: Acceptance,
    earlier_acceptance: Acceptance,
    costs: PassCosts,
    max_draft: usize,
    min_match: usize,
    /// The match length behind the draft under verification.
    pending_match: usize,
    /// The place in an earlier answer the last offer drafted from (`None`: it drafted from the
    /// sequence itself), and the sequence's length then: while the sequence goes on as that
    /// answer did, it drafts the answer's next tokens.
    following: Option<(AnswerAt, usize)>,
}

impl Drafter {
    /// A drafter for a sequence of `tokens` so far (the prompt); `None` when speculation is off.
    pub fn new(speculation: Speculation, tokens: &[u32]) -> Option<Self> {
        match speculation {
            Speculation::Off | Speculation::Draft { .. } => None,
            Speculation::Ngram {
                max_draft,
                min_match,
            } => Some(Drafter {
                index: NgramIndex::new(tokens),
                prompt_len: tokens.len(),
                acceptance: Acceptance::new(MAX_NGRAM),
                earlier_acceptance: Acceptance::new(earlier::MAX_FOLLOWED),
                costs: PassCosts::new(max_draft + 1),
                max_draft,
                min_match,
                pending_match: 0,
                following: None,
            }),
        }
    }

    /// A token joined the sequence (the one about to run, or an accepted draft).
    pub fn push(&mut self, token: u32) {
        self.index.push(token);
    }

    /// Tokens that may follow the sequence's last one, at most `room` (what the answer's length
    /// limit and cache leave), and the chance that each is accepted; `None` when nothing matches.
    /// `shared`: what a server learnt from its answers, where there is one: their drafts'
    /// acceptance ([`Acceptance::rate_with`]), and the answers, where a longer match than the
    /// sequence's own is drafted from.
    pub fn offer(
        &mut self,
        room: usize,
        shared: Option<&Learnt>,
    ) -> Option<(Vec<u32>, DraftOffer)> {
        let room = room.min(self.max_draft);
        let answers = shared.map(|learnt| &learnt.answers);
        // The answer followed so far, else an answer to the same prompt after its first token.
        let followed = match (answers, self.following.take()) {
            (Some(answers), Some((at, seen))) => {
                answers.follow(at, &self.index.tokens()[seen..], room)
            }
            (Some(answers), None) if self.index.len() == self.prompt_len + 1 => {
                let first = self.index.tokens()[self.prompt_len];
                answers.answer_to(earlier::prompt_key(self.prompt()), first, room)
            }
            _ => None,
        };
        let (found, at): (NgramDraft, Option<AnswerAt>) = match followed {
            Some((found, at)) => (found, Some(at)),
            None => {
                let own = self.index.draft(self.min_match, room);
                let earlier = answers
                    .and_then(|answers| answers.draft(self.index.tail(), self.min_match, room));
                match (own, earlier) {
                    (Some(own), Some((earlier, at))) if earlier.matched > own.matched => {
                        (earlier, Some(at))
                    }
                    (Some(own), _) => (own, None),
                    (None, Some((earlier, at))) => (earlier, Some(at)),
                    (None, None) => return None,
                }
            }
        };
        self.following = at.map(|at| (at, self.index.len()));
        self.pending_match = found.matched;
        let alpha = match self.drafting_from_answers() {
            false => (self.acceptance).rate_with(found.matched, shared.map(|learnt| &learnt.own)),
            true => (self.earlier_acceptance)
                .rate_with(found.matched, shared.map(|learnt| &learnt.earlier)),
        };
        let offer = DraftOffer {
            alpha,
            available: found.tokens.len(),
        };
        Some((found.tokens, offer))
    }

    /// Whether the draft under verification was found in a server's earlier answers.
    pub fn drafting_from_answers(&self) -> bool {
        self.following.is_some()
    }

    /// The prompt: an answer is held under it among a server's earlier answers.
    pub fn prompt(&self) -> &[u32] {
        &self.index.tokens()[..self.prompt_len]
    }

    /// The tokens to verify after the sequence's last one when it is decoded alone, as many of
    /// [`Self::offer`]'s as its own passes' costs say pay; empty for a plain step.
    pub fn draft(&mut self, room: usize) -> Vec<u32> {
        let Some((mut tokens, offer)) = self.offer(room, None) else {
            return Vec::new();
        };
        tokens.truncate(draft_lengths(&self.costs, 1, 1.0, &[offer])[0]);
        tokens
    }

    /// Records a pass of this sequence alone, of `rows` rows, that took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        self.costs.record(rows, seconds);
    }

    /// What this sequence's passes cost, by their rows.
    pub fn costs(&self) -> &PassCosts {
        &self.costs
    }

    /// Records the verdict on the last draft: `accepted` of its tokens kept, and whether the
    /// next was refused (rather than the answer ending first).
    pub fn record_verdict(&mut self, accepted: usize, rejected: bool) {
        let acceptance = match self.drafting_from_answers() {
            false => &mut self.acceptance,
            true => &mut self.earlier_acceptance,
        };
        acceptance.record(self.pending_match, accepted, rejected);
    }

    /// [`Self::record_verdict`], and the same verdict into `learnt`, the server's shared record.
    pub fn share_verdict(&mut self, accepted: usize, rejected: bool, learnt: &mut Learnt) {
        self.record_verdict(accepted, rejected);
        let shared = match self.drafting_from_answers() {
            false => &mut learnt.own,
            true => &mut learnt.earlier,
        };
        shared.record(self.pending_match, accepted, rejected);
    }
}

/// Where a sequence decoded alone gets its drafts: the n-gram lookup where it has a match
/// worth verifying (free to draft), else the draft model, when there is one.
pub struct Proposer<'m> {
    ngram: Option<Drafter>,
    model: Option<ModelDrafter<'m>>,
    /// Whether the drafts under verification are the draft model's.
    modelled: bool,
    /// Whether the draft model is worth asking.
    model_pace: ModelPace,
    /// The last pass's seconds.
    pass_seconds: f64,
}

impl<'m> Proposer<'m> {
    /// The proposer `speculation` asks for over a sequence of `tokens` so far (the prompt),
    /// `draft` its draft model; `None` when speculation is off.
    pub fn new(
        speculation: Speculation,
        tokens: &[u32],
        draft: Option<DraftModel<'m>>,
        target_vocab: usize,
    ) -> Result<Option<Self>, super::GenerateError> {
        let (ngram, model) = match (speculation, draft) {
            (Speculation::Off, _) => return Ok(None),
            (Speculation::Ngram { .. }, _) => (Drafter::new(speculation, tokens), None),
            (Speculation::Draft { max_draft, p_min }, Some(draft)) => (
                Drafter::new(speculation.lookup(), tokens),
                Some(ModelDrafter::new(draft, max_draft, p_min, target_vocab)),
            ),
            (Speculation::Draft { .. }, None) => {
                return Err(super::GenerateError::InvalidPrompt(
                    "speculation `draft` needs a draft model".into(),
                ));
            }
        };
        Ok(Some(Self {
            ngram,
            model,
            modelled: false,
            model_pace: ModelPace::default(),
            pass_seconds: 0.0,
        }))
    }

    /// The step's token joined the sequence at `position`.
    pub fn push(&mut self, token: u32, position: u32) {
        if let Some(ngram) = &mut self.ngram {
            ngram.push(token);
        }
        if let Some(model) = &mut self.model {
            model.push(token, position);
        }
    }

    /// The tokens to verify after the step's, at most `room`; empty for a plain step.
    pub fn draft(&mut self, room: usize) -> Result<Vec<u32>, super::GenerateError> {
        self.modelled = false;
        if let Some(ngram) = &mut self.ngram {
            let drafts = ngram.draft(room);
            if !drafts.is_empty() || self.model.is_none() {
                return Ok(drafts);
            }
        }
        let (Some(model), Some(ngram)) = (&mut self.model, &self.ngram) else {
            return Ok(Vec::new());
        };
        if !ngram.costs().measured(1) {
            // A plain step first: drafting's passes are weighed against it, and one never run
            // would be guessed from the drafted passes themselves.
            return Ok(Vec::new());
        }
        if !self.model_pace.ask(1.0 / ngram.costs().estimate(1)) {
            return Ok(Vec::new());
        }
        self.modelled = true;
        model.draft(room, ngram.costs())
    }

    /// Whether the drafts under verification are the draft model's.
    #[cfg(test)]
    pub(crate) fn modelled(&self) -> bool {
        self.modelled
    }

    /// Records a pass of `rows` rows that took `seconds`, drafting included: the costs of
    /// verification, the draft model's drafting taken out.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        let drafting = match (&self.model, self.modelled) {
            (Some(model), true) => model.drafting_seconds(),
            _ => 0.0,
        };
        if let Some(ngram) = &mut self.ngram {
            ngram.record_pass(rows, (seconds - drafting).max(0.0));
        }
        self.pass_seconds = seconds;
    }

    /// The pass kept the first `accepted` of `drafts`; `rejected`: it refused the next one
    /// (rather than the answer ending first).
    pub fn verdict(&mut self, drafts: &[u32], accepted: usize, rejected: bool) {
        if let Some(ngram) = &mut self.ngram {
            for &token in &drafts[..accepted] {
                ngram.push(token);
            }
            if !drafts.is_empty() && !self.modelled {
                ngram.record_verdict(accepted, rejected);
            }
        }
        if let Some(model) = &mut self.model {
            match self.modelled {
                true => model.verdict(drafts, accepted),
                false => model.accepted_elsewhere(&drafts[..accepted]),
            }
        }
        if self.modelled {
            self.model_pace.record(accepted + 1, self.pass_seconds);
        }
    }
}
