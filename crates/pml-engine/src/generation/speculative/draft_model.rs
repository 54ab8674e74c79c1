//! Drafts from a smaller model of the same vocabulary (e.g. Qwen2.5-0.5B for the 1.5B): it
//! decodes greedily a few tokens ahead in its own KV cache, and stops early when its own
//! confidence in the next token falls under `p_min` (llama.cpp's `--draft-p-min`).
//!
//! Greedy drafts are a deterministic function of the sequence, so the proposal distribution
//! `q` is one-hot and [`super::super::DecodeState::accept_drafted`]'s rule (keep a draft while
//! the token drawn from the target's row equals it) is speculative sampling exactly, as for
//! n-gram drafts; llama.cpp's server verifies its draft model's tokens the same way.
//!
//! The draft's cache holds a prefix of the sequence; tokens not in it yet (the step's token,
//! a last draft that was accepted without being run, drafts of the n-gram lookup) wait in
//! `pending` and go through the draft model in the next draft's first pass. Rejected drafts'
//! rows are rolled back.

use std::time::Instant;

use candle_core::Tensor;

use crate::kv_cache::KvCache;
use crate::model::Model;
use crate::tokenizer::Tokenizer;

use super::super::error::GenerateError;
use super::super::logits::logits_to_vec;
use super::pace::{PassCosts, update_mean};

/// The most tokens two vocabularies may differ by and still draft for each other (llama.cpp's
/// `SPEC_VOCAB_MAX_SIZE_DIFFERENCE`): models of one family pad their vocabularies differently.
pub const MAX_VOCAB_SIZE_DIFFERENCE: usize = 128;

/// Refuses a draft model whose tokens are not the target's: every id both have must spell the
/// same bytes, with the same BOS and end-of-turn tokens.
pub fn check_vocabularies(target: &dyn Tokenizer, draft: &dyn Tokenizer) -> Result<(), String> {
    let (target_size, draft_size) = (target.vocab_size(), draft.vocab_size());
    if target_size.abs_diff(draft_size) > MAX_VOCAB_SIZE_DIFFERENCE {
        return Err(format!(
            "the draft model's vocabulary has {draft_size} tokens, the model's {target_size}: \
             a draft model must share the model's tokenizer"
        ));
    }
    if target.bos_token() != draft.bos_token() {
        return Err(format!(
            "the draft model's BOS token is {:?}, the model's {:?}",
            draft.bos_token(),
            target.bos_token()
        ));
    }
    let (mut target_eos, mut draft_eos) = (target.eos_tokens(), draft.eos_tokens());
    target_eos.sort_unstable();
    draft_eos.sort_unstable();
    if target_eos != draft_eos {
        return Err(format!(
            "the draft model's end-of-turn tokens are {draft_eos:?}, the model's {target_eos:?}"
        ));
    }
    let shared = target_size.min(draft_size) as u32;
    if let Some(id) = (0..shared).find(|&id| target.token_bytes(id) != draft.token_bytes(id)) {
        return Err(format!(
            "token {id} is {:?} in the draft model's vocabulary and {:?} in the model's: a \
             draft model must share the model's tokenizer",
            draft.token_bytes(id),
            target.token_bytes(id)
        ));
    }
    Ok(())
}

/// A draft model for one answer: the model, and how its cache is filled with the prompt.
pub struct DraftModel<'m> {
    pub model: &'m Model,
    /// Fills the draft model's cache with the whole prompt, at the positions the target's
    /// cache holds it (spliced from the draft model's own module states where the prompt has
    /// modules). It runs at the first draft, after the first token, as llama.cpp's server
    /// prefills its draft context: its time is the first decode step's. It is handed the
    /// cache `kept` holds, to go on from.
    pub prefill: PrefillFn<'m>,
    /// The draft model's cache from before, for a caller that goes on with the sequence (a
    /// conversation's next turn), and where the cache is left after the answer: its rows are
    /// then a prefix of the sequence (drafts the model refused rolled back), perhaps shorter
    /// than the model's. Left as it was when nothing was drafted.
    pub kept: Option<&'m mut Option<KvCache>>,
}

/// One sequence's drafting state with a draft model.
pub struct ModelDrafter<'m> {
    model: &'m Model,
    /// The draft model's cache, filled by its prefill at the first draft: a prompt's first
    /// token does not wait for the draft model.
    kv: Option<KvCache>,
    prefill: Option<PrefillFn<'m>>,
    kept: Option<&'m mut Option<KvCache>>,
    /// Tokens of the sequence (with their positions) the draft's cache lacks.
    pending: Vec<(u32, u32)>,
    max_draft: usize,
    p_min: f32,
    /// Tokens the target may take: a draft past it would not run there.
    target_vocab: usize,
    /// The cache's length once `pending` went in, and the drafts run through the model after.
    fed: usize,
    drafts_run: usize,
    /// Position of the last token pushed.
    last_position: u32,
    /// Mean seconds of one drafted token's pass through the draft model, measured.
    step_seconds: Option<f64>,
    /// Seconds the last [`Self::draft`] took, its catch-up pass included.
    drafting_seconds: f64,
}

/// A draft model's prefill of the prompt, after the cache it is handed (empty when `None`).
pub type PrefillFn<'m> = Box<dyn FnOnce(Option<KvCache>) -> Result<KvCache, GenerateError> + 'm>;

impl<'m> ModelDrafter<'m> {
    /// A drafter with `draft`'s model, drafting at most `max_draft` tokens a pass.
    pub fn new(draft: DraftModel<'m>, max_draft: usize, p_min: f32, target_vocab: usize) -> Self {
        Self {
            model: draft.model,
            kv: None,
            prefill: Some(draft.prefill),
            kept: draft.kept,
            pending: Vec::new(),
            max_draft,
            p_min,
            target_vocab,
            fed: 0,
            drafts_run: 0,
            last_position: 0,
            step_seconds: None,
            drafting_seconds: 0.0,
        }
    }

    /// A drafter whose cache `kv` (the sequence's start, perhaps empty) is filled with the rest
    /// of the sequence, `tokens` at `positions`, a chunk at a time by [`Self::feed`] rather
    /// than by a prefill at the first draft: a server fills a sequence's between its steps, so
    /// no one waits for a whole prompt's draft prefill.
    pub fn filling(
        model: &'m Model,
        kv: KvCache,
        tokens: &[u32],
        positions: &[u32],
        max_draft: usize,
        p_min: f32,
        target_vocab: usize,
    ) -> Self {
        Self {
            model,
            kv: Some(kv),
            prefill: None,
            kept: None,
            pending: tokens
                .iter()
                .copied()
                .zip(positions.iter().copied())
                .collect(),
            max_draft,
            p_min,
            target_vocab,
            fed: 0,
            drafts_run: 0,
            last_position: positions.last().copied().unwrap_or(0),
            step_seconds: None,
            drafting_seconds: 0.0,
        }
    }

    /// The draft model.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The draft model's cache: rows of the sequence's first tokens, and while a draft is
    /// verified, of its drafts after them.
    pub fn kv(&self) -> Option<&KvCache> {
        self.kv.as_ref()
    }

    /// Tokens of the sequence the draft model has not run yet: the next draft runs them first.
    pub fn unfed(&self) -> usize {
        self.pending.len()
    }

    /// Runs up to `max_tokens` of the tokens the draft's cache lacks through the draft model.
    pub fn feed(&mut self, max_tokens: usize) -> Result<(), GenerateError> {
        let Some(kv) = &mut self.kv else {
            return Ok(());
        };
        let n = max_tokens.min(self.pending.len());
        if n == 0 {
            return Ok(());
        }
        let (tokens, positions): (Vec<u32>, Vec<u32>) = self.pending.drain(..n).unzip();
        self.model.forward(&tokens, &positions, kv)?;
        // No draft of its own is in the cache now: a verdict keeps every row.
        self.fed = kv.len();
        self.drafts_run = 0;
        Ok(())
    }

    /// Seconds the last [`Self::draft`] took: what a pass's time holds beside verification.
    pub fn drafting_seconds(&self) -> f64 {
        self.drafting_seconds
    }

    /// The step's token joined the sequence at `position`.
    pub fn push(&mut self, token: u32, position: u32) {
        self.pending.push((token, position));
        self.last_position = position;
    }

    /// Up to `room` tokens (and [`Self::new`]'s `max_draft`) the draft model expects after the
    /// sequence, each with its probability of at least `p_min` there, as many as pay for
    /// themselves by `costs` (the target's passes by their rows): a draft is kept while the
    /// chance that it and every one before it are accepted (the draft model's probabilities'
    /// product), times a plain step's cost, exceeds what it adds: a row to verify and a step
    /// of the draft model.
    pub fn draft(&mut self, room: usize, costs: &PassCosts) -> Result<Vec<u32>, GenerateError> {
        let started = Instant::now();
        let drafts = self.draft_tokens(room, costs);
        self.drafting_seconds = started.elapsed().as_secs_f64();
        drafts
    }

    fn draft_tokens(&mut self, room: usize, costs: &PassCosts) -> Result<Vec<u32>, GenerateError> {
        let limit = room.min(self.max_draft);
        let mut drafts = Vec::with_capacity(limit);
        self.drafts_run = 0;
        let kv = match (&mut self.kv, self.prefill.take()) {
            (Some(kv), _) => kv,
            (None, Some(prefill)) => {
                let earlier = self.kept.as_mut().and_then(|kept| kept.take());
                self.kv.insert(prefill(earlier)?)
            }
            (None, None) => {
                return Err(GenerateError::InvalidPrompt(
                    "the draft model's prefill failed before".into(),
                ));
            }
        };
        if limit == 0 {
            // Nothing to draft: the pending tokens wait for the next pass that drafts.
            self.fed = kv.len();
            return Ok(drafts);
        }
        let (tokens, positions): (Vec<u32>, Vec<u32>) = self.pending.drain(..).unzip();
        let mut logits = self.model.forward(&tokens, &positions, kv)?;
        self.fed = kv.len();
        let plain_step = costs.estimate(1);
        let mut all_accepted = 1.0f64;
        loop {
            let (token, probability) = most_likely(&logits)?;
            all_accepted *= f64::from(probability);
            let rows = drafts.len() + 2;
            let added =
                costs.estimate(rows) - costs.estimate(rows - 1) + self.step_seconds.unwrap_or(0.0);
            if probability < self.p_min
                || token as usize >= self.target_vocab
                || all_accepted * plain_step <= added
            {
                break;
            }
            drafts.push(token);
            if drafts.len() == limit {
                break;
            }
            let position = self.last_position + drafts.len() as u32;
            let step_started = Instant::now();
            logits = self.model.forward(&[token], &[position], kv)?;
            let seconds = step_started.elapsed().as_secs_f64();
            update_mean(&mut self.step_seconds, seconds);
            self.drafts_run += 1;
        }
        Ok(drafts)
    }

    /// The target kept the first `accepted` of this drafter's `drafts`: their rows stay in the
    /// draft's cache, the others' go; a kept draft the draft model never ran waits for the
    /// next pass.
    pub fn verdict(&mut self, drafts: &[u32], accepted: usize) {
        let kept_run = accepted.min(self.drafts_run);
        if let Some(kv) = &mut self.kv {
            kv.rollback(self.fed + kept_run);
        }
        if accepted > self.drafts_run {
            self.accepted_elsewhere(&drafts[self.drafts_run..accepted]);
        }
        self.drafts_run = 0;
    }

    /// The target kept `tokens` drafted by someone else after the step's token: they wait for
    /// the draft model's next pass.
    pub fn accepted_elsewhere(&mut self, tokens: &[u32]) {
        for &token in tokens {
            self.last_position += 1;
            self.pending.push((token, self.last_position));
        }
    }
}

/// Whether a draft model is worth asking: while the passes it drafted for deliver more tokens
/// a second than plain steps, else again after [`MODEL_RETRY_PASSES`] passes without it, in
/// case the answer reached text it predicts better, twice as long after each retry that did
/// not pay (up to [`MODEL_RETRY_MAX`]): trying costs the catch-up of what it has not run.
#[derive(Clone, Debug, Default)]
pub struct ModelPace {
    /// Tokens per second of the passes the draft model drafted for (its drafting included),
    /// a running mean.
    rate: Option<f64>,
    /// Passes since the draft model was last asked.
    since_asked: usize,
    /// Retries in a row that did not pay.
    failed_retries: u32,
    /// Seconds the draft model took per token it caught up on, a running mean.
    catch_up_per_token: Option<f64>,
    /// Whether the last ask was a retry of a draft model that did not pay.
    retrying: bool,
}

/// A draft model slower than plain steps is asked again after this many passes at first.
pub const MODEL_RETRY_PASSES: usize = 16;

/// The most passes between retries.
pub const MODEL_RETRY_MAX: usize = 256;

/// The most of an answer's remaining plain decode time a draft model may spend catching up.
pub const CATCH_UP_SHARE: f64 = 0.25;

/// Doublings of the wait that reach [`MODEL_RETRY_MAX`].
const MAX_RETRY_DOUBLINGS: u32 = (MODEL_RETRY_MAX / MODEL_RETRY_PASSES).ilog2();

impl ModelPace {
    /// Whether to ask the draft model for this pass, plain steps delivering `plain_rate`
    /// tokens a second.
    pub fn ask(&mut self, plain_rate: f64) -> bool {
        self.since_asked += 1;
        let pays = self.rate.is_none_or(|rate| rate > plain_rate);
        if std::mem::take(&mut self.retrying) && !pays {
            self.failed_retries = (self.failed_retries + 1).min(MAX_RETRY_DOUBLINGS);
        }
        if pays {
            self.failed_retries = 0;
        }
        let wait = (MODEL_RETRY_PASSES << self.failed_retries).min(MODEL_RETRY_MAX);
        if !pays && self.since_asked < wait {
            return false;
        }
        self.since_asked = 0;
        self.retrying = !pays;
        true
    }

    /// Whether a draft model `unfed` tokens behind is worth catching up with an answer that
    /// has `room` tokens left, plain steps taking `plain_step` seconds: when catching up costs
    /// at most [`CATCH_UP_SHARE`] of the plain steps left (drafts save at most about as
    /// much), at the measured cost per token, else a guess of 1/16 of a plain step.
    pub fn worth_catching_up(&self, unfed: usize, room: usize, plain_step: f64) -> bool {
        let per_token = self.catch_up_per_token.unwrap_or(plain_step / 16.0);
        unfed as f64 * per_token <= CATCH_UP_SHARE * room as f64 * plain_step
    }

    /// Catching up on `tokens` took `seconds`.
    pub fn record_catch_up(&mut self, tokens: usize, seconds: f64) {
        if tokens > 0 {
            update_mean(&mut self.catch_up_per_token, seconds / tokens as f64);
        }
    }

    /// A pass the draft model drafted for gave `tokens` in `seconds`, its drafting included.
    pub fn record(&mut self, tokens: usize, seconds: f64) {
        if seconds > 0.0 {
            update_mean(&mut self.rate, tokens as f64 / seconds);
        }
    }
}

impl Drop for ModelDrafter<'_> {
    fn drop(&mut self) {
        if let (Some(kept), Some(kv)) = (self.kept.take(), self.kv.take()) {
            *kept = Some(kv);
        }
    }
}

/// The most likely next token of `logits` and its probability.
fn most_likely(logits: &Tensor) -> Result<(u32, f32), GenerateError> {
    let logits = logits_to_vec(logits)?;
    let (token, max) =
        logits
            .iter()
            .copied()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (token, logit)| {
                if logit > best.1 { (token, logit) } else { best }
            });
    let total: f32 = logits.iter().map(|&logit| (logit - max).exp()).sum();
    Ok((token as u32, 1.0 / total))
}
