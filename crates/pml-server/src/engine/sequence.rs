//! One completion being decoded: its decoding state and KV cache between the scheduler's batched
//! steps, and the reports it sends back. Prompts are prefilled before (`prefill.rs`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use candle_core::{DType, Tensor};
use pml_compiler::PlanError;
use pml_engine::Tokenizer;
use pml_engine::generation::speculative::pace::{DraftOffer, PassCosts};
use pml_engine::generation::speculative::{Drafter, Learnt, MAX_DRAFT, ModelDrafter, ModelPace};
use pml_engine::generation::{DecodeState, DecodeStep, Speculation};
use pml_engine::kv_cache::KvCache;
use pml_engine::model::Model;
use pml_runtime::chat::{chat_prompt_tokens, conversation_tokens};
use pml_runtime::inference::context_limit::check_positions;
use pml_runtime::inference::{InferenceError, PrefixCache, Runtime, RuntimeError};
use pml_runtime::kv_budget::HeavyHitters;
use pml_syntax::json::JsonDiagnostic;
use pml_syntax::{DEFAULT_MAX_SHOWN, first_shown};

use super::prompt_rows::{RowKind, spelled};
use super::structured::Constraint;
use super::{
    CompletionJob, DraftCounts, JobEnd, JobError, JobEvent, PromptSource, PromptUsage,
    TokenLogprob, TokenText,
};
use crate::incident::Incident;
use crate::metrics::{Metrics, Outcome};

/// A completion between decode steps.
pub struct Sequence<'r> {
    job: CompletionJob,
    tokenizer: &'r dyn Tokenizer,
    /// The grammar the answer must follow (`response_format`).
    constraint: Option<Constraint>,
    state: DecodeState<'r>,
    pub kv: KvCache,
    /// KV slots reserved for this sequence (its prompt and answer); its cache never grows
    /// past them.
    pub reserved_slots: usize,
    /// The token to run through the model next and its position.
    pub next_token: u32,
    pub next_position: u32,
    /// The prompt's tokens, when its KV sits at positions 0, 1, … (a plain prompt, not a PML
    /// one, that evicted nothing): a finished answer's blocks then join the prefix cache after
    /// them.
    plain_prompt: Option<Vec<u32>>,
    /// Within a KV budget: the heavy-hitter scores, and the passes of its own each step runs
    /// (they observe the attention; the batched pass does not).
    hitters: Option<Box<HeavyHitters>>,
    /// Drafts by n-gram lookup over the prompt and the answer (`None`: speculation off, or a
    /// KV budget's passes of one token).
    drafter: Option<Drafter>,
    /// Drafts by the server's draft model (speculation `draft`), its cache of the sequence
    /// filled between steps ([`Self::feed_draft_model`]).
    model_drafter: Option<ModelDrafter<'r>>,
    /// Whether the drafts under verification are the draft model's.
    modelled: bool,
    /// Whether the draft model, asked, is running the sequence it lacks before it drafts.
    catching_up: bool,
    /// Seconds that catching up took since the draft model last drafted: the price of its
    /// next drafts, charged to their pass.
    catch_up_seconds: f64,
    /// Slots at the cache's end that hold drafts not yet verified, during a step's rows.
    unverified: usize,
    /// The answer's drafts so far, for its `usage`.
    drafts: DraftCounts,
}

/// Where a finished answer goes.
pub struct Finish<'a> {
    /// A plain prompt's tokens, then the answer's, and their KV: for the prefix cache, so the
    /// next turn of a chat reuses the answer too.
    pub keep: &'a mut dyn FnMut(&[u32], &KvCache),
    /// What the server learnt from its answers' drafts; a drafted answer joins the earlier
    /// answers that later ones draft from.
    pub learnt: &'a mut Learnt,
}

/// A prefilled prompt: its cache, the last token's logits, every prompt token and the counts.
pub struct Prefilled {
    pub kv: KvCache,
    pub logits: Tensor,
    pub all_tokens: Vec<u32>,
    /// A PML prompt's whose request asked (`prompt_token_kinds`): how each of `all_tokens` was
    /// obtained.
    pub row_kinds: Option<Vec<RowKind>>,
    pub usage: PromptUsage,
    /// A prompt computed within a KV budget: its heavy-hitter scores, for its decoding.
    pub hitters: Option<Box<HeavyHitters>>,
    /// Whether the KV is what a full prefill of the plain prompt computes (up to summation
    /// order), so its blocks may join the prefix cache: not after edit reuse.
    pub exact: bool,
}

impl Prefilled {
    /// The same prompt for another choice: the KV shared until either appends (copy on
    /// write), every prompt token counted as reused.
    pub fn fork(&self) -> Prefilled {
        Prefilled {
            kv: self.kv.clone(),
            logits: self.logits.clone(),
            all_tokens: self.all_tokens.clone(),
            row_kinds: None,
            usage: PromptUsage {
                prompt_tokens: self.usage.prompt_tokens,
                cached_tokens: self.usage.prompt_tokens,
                recomputed_tokens: 0,
                new_tokens: 0,
                ..PromptUsage::default()
            },
            hitters: self.hitters.clone(),
            exact: self.exact,
        }
    }
}

/// A sequence that goes on after a step, or `None` when it ended (and reported why).
pub type Progress<'r> = Option<Sequence<'r>>;

impl<'r> Sequence<'r> {
    /// Takes a prefilled prompt: reports `Started`, samples the first token from the prompt's
    /// last logits and goes on decoding. Ends the job at once (reporting why) when it cannot go
    /// on or the answer is already complete.
    pub fn start(
        runtime: &'r Runtime,
        job: CompletionJob,
        prefilled: Prefilled,
        constraint: Option<Constraint>,
        draft_blocks: Option<&PrefixCache>,
        metrics: &Metrics,
        finish: &mut Finish<'_>,
    ) -> Progress<'r> {
        let arrived = job.arrived;
        let usage = prefilled.usage;
        metrics
            .tokens_reused
            .fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
        metrics
            .tokens_recomputed
            .fetch_add(usage.recomputed_tokens as u64, Ordering::Relaxed);
        metrics
            .tokens_new
            .fetch_add(usage.new_tokens as u64, Ordering::Relaxed);
        let next_position = prefilled
            .kv
            .positions()
            .iter()
            .max()
            .map_or(0, |&position| position + 1);
        let state = match DecodeState::new(
            runtime.tokenizer(),
            &prefilled.all_tokens,
            &job.params,
            next_position,
        ) {
            Ok(state) => state,
            Err(error) => {
                metrics.count_outcome(Outcome::Failed);
                job.events
                    .send(JobEvent::Failed(JobError::BadRequest(error.to_string())));
                return None;
            }
        };
        let usage = match &prefilled.row_kinds {
            Some(kinds) => PromptUsage {
                prompt_token_kinds: Some(spelled(runtime, &prefilled.all_tokens, kinds)),
                ..usage
            },
            None => usage,
        };
        if !job.events.send(JobEvent::Started(usage)) {
            metrics.count_outcome(Outcome::Cancelled);
            return None;
        }
        let hitters = prefilled.hitters;
        let (drafter, model_drafter) = match hitters {
            None => (
                Drafter::new(job.params.speculation.lookup(), &prefilled.all_tokens),
                model_drafter(
                    runtime,
                    job.params.speculation,
                    &prefilled.all_tokens,
                    prefilled.kv.positions(),
                    draft_blocks,
                ),
            ),
            Some(_) => (None, None),
        };
        let plain_prompt = (!matches!(job.prompt, PromptSource::Pml { .. })
            && hitters.is_none()
            && prefilled.exact)
            .then_some(prefilled.all_tokens);
        let mut kv = prefilled.kv;
        // A budgeted cache is limited to its budget already.
        let reserved_slots = match &hitters {
            Some(hitters) => hitters.budget().slots,
            None => reserved_slots(kv.len(), &job),
        };
        kv.limit_rows(reserved_slots);
        let sequence = Sequence {
            job,
            tokenizer: runtime.tokenizer(),
            constraint,
            state,
            kv,
            reserved_slots,
            next_token: 0,
            next_position,
            plain_prompt,
            hitters,
            drafter,
            model_drafter,
            modelled: false,
            catching_up: false,
            catch_up_seconds: 0.0,
            unverified: 0,
            drafts: DraftCounts::default(),
        };
        match logits_row(&prefilled.logits) {
            Ok(mut logits) => {
                let progress = sequence
                    .accept(&mut logits, metrics, finish)
                    .map(Sequence::next_to_draft_model);
                metrics.time_to_first_token.observe(arrived.elapsed());
                progress
            }
            Err(error) => sequence.fail(error, metrics),
        }
    }

    /// Samples from this sequence's row of a step's logits and streams the text (with the
    /// token's log-probability when the job asked for it); a finished answer goes to `finish`
    /// before its client hears that it is done.
    pub fn accept(
        mut self,
        logits: &mut [f32],
        metrics: &Metrics,
        finish: &mut Finish<'_>,
    ) -> Progress<'r> {
        let generated = self.state.token_ids().len();
        // Log-probabilities are the model's own, before the grammar's mask.
        let raw = match (&self.job.logprobs, &self.constraint) {
            (Some(_), Some(_)) => Some(logits.to_vec()),
            _ => None,
        };
        if let Some(constraint) = &mut self.constraint
            && let Err(error) = constraint.mask(logits)
        {
            return self.fail(error, metrics);
        }
        let mut text = String::new();
        let step = self.state.accept(logits, &mut |piece| text.push_str(piece));
        let token = self.state.token_ids()[generated..].first().copied();
        if let (Some(constraint), Some(token)) = (&mut self.constraint, token)
            && let Err(error) = constraint.accept(token)
        {
            return self.fail(error, metrics);
        }
        let closed = match token {
            Some(token) => {
                let source: &[f32] = raw.as_deref().unwrap_or(logits);
                let logprob = self
                    .job
                    .logprobs
                    .map(|top| token_logprob(self.tokenizer, source, token, top));
                !self.job.events.send(JobEvent::Token { text, logprob })
            }
            // The end-of-text token or the token limit: no token to report, but a stop
            // string's held-back text may still come out.
            None if !text.is_empty() => !self.job.events.send(JobEvent::Token {
                text,
                logprob: None,
            }),
            None => self.job.events.is_closed(),
        };
        match step {
            _ if closed => {
                metrics.count_outcome(Outcome::Cancelled);
                None
            }
            Err(error) => self.fail(JobError::internal(error), metrics),
            Ok(DecodeStep::Finished(reason)) => {
                // Drafts after the last token taken are not the answer's.
                let answered = self.kv.len() - self.unverified;
                self.kv.rollback(answered);
                if let Some(prompt) = &self.plain_prompt {
                    // The KV holds every token but the last one sampled; `keep` takes the
                    // full blocks the KV covers.
                    let mut tokens = prompt.clone();
                    tokens.extend_from_slice(self.state.token_ids());
                    (finish.keep)(&tokens, &self.kv);
                }
                if let Some(drafter) = &self.drafter {
                    (finish.learnt.answers).add(drafter.prompt(), self.state.token_ids());
                }
                self.end(JobEnd::Finished(reason), metrics)
            }
            Ok(DecodeStep::Continue { token, position }) => {
                metrics.tokens_generated.fetch_add(1, Ordering::Relaxed);
                if let Some(drafter) = &mut self.drafter {
                    drafter.push(token);
                }
                self.next_token = token;
                self.next_position = position;
                Some(self)
            }
        }
    }

    /// Tokens that may follow the next one, as many as the answer's length limit and the
    /// sequence's reserved slots leave room for, and the chance each is accepted (`learnt`: the
    /// server's record of its answers and their drafts).
    pub fn offer(&mut self, learnt: &Learnt) -> Option<(Vec<u32>, DraftOffer)> {
        let room = self.draft_room();
        self.drafter.as_mut()?.offer(room, Some(learnt))
    }

    /// The draft model's tokens after the next one, as many as the passes' `costs` say pay;
    /// empty when it has none or `pace` (the server's, of every answer's drafted passes) says
    /// it drafts slower than plain steps (then asked again now and then).
    /// A draft model asked while behind the sequence (a prompt it has not run, the tokens since
    /// it was last asked) runs [`DRAFT_FEED_TOKENS`] more of it instead, in each pass the
    /// lookup leaves to it, and drafts once it has caught up (the catching up charged to that
    /// pass in `pace`); a plain prompt's blocks then join `draft_blocks`, its prefix cache, for
    /// the prompts that start alike. One that fails drafts no more for this answer.
    pub fn model_drafts(
        &mut self,
        costs: &PassCosts,
        pace: &mut ModelPace,
        draft_blocks: Option<&PrefixCache>,
    ) -> Vec<u32> {
        let room = self.draft_room();
        let Some(model) = &mut self.model_drafter else {
            return Vec::new();
        };
        if !costs.measured(1) {
            return Vec::new();
        }
        if !self.catching_up && !pace.ask(1.0 / costs.estimate(1)) {
            return Vec::new();
        }
        let unfed = model.unfed();
        let behind = unfed > DRAFT_CATCH_UP;
        if behind && !self.catching_up && !pace.worth_catching_up(unfed, room, costs.estimate(1)) {
            return Vec::new();
        }
        let started = std::time::Instant::now();
        let drafted = match behind {
            true => model.feed(DRAFT_FEED_TOKENS).map(|()| None),
            false => model.draft(room, costs).map(Some),
        };
        let seconds = started.elapsed().as_secs_f64();
        if behind {
            pace.record_catch_up(unfed.min(DRAFT_FEED_TOKENS), seconds);
        }
        tracing::debug!(
            unfed,
            drafts = drafted
                .as_ref()
                .map_or(0, |drafts| drafts.as_ref().map_or(0, Vec::len)),
            ms = seconds * 1e3,
            "draft model asked"
        );
        match drafted {
            Ok(None) => {
                self.catch_up_seconds += seconds;
                self.catching_up = model.unfed() > DRAFT_CATCH_UP;
                if !self.catching_up {
                    self.keep_draft_blocks(draft_blocks);
                }
                Vec::new()
            }
            Ok(Some(drafts)) => {
                // Asked, it took time even when it drafted nothing: the pass paces it.
                self.modelled = true;
                drafts
            }
            Err(error) => {
                tracing::warn!(%error, "the draft model failed; the answer goes on without it");
                self.model_drafter = None;
                Vec::new()
            }
        }
    }

    /// A plain prompt's blocks (and its answer's so far) of the draft model's cache, into its
    /// prefix cache `draft_blocks`.
    fn keep_draft_blocks(&self, draft_blocks: Option<&PrefixCache>) {
        let (Some(blocks), Some(prompt), Some(model)) = (
            draft_blocks,
            self.plain_prompt.as_deref(),
            &self.model_drafter,
        ) else {
            return;
        };
        let Some(kv) = model.kv() else {
            return;
        };
        let mut tokens = prompt.to_vec();
        tokens.extend_from_slice(self.state.token_ids());
        if let Err(error) = blocks.keep(model.model(), &tokens, kv) {
            tracing::warn!(%error, "the draft model's prefix cache could not keep blocks");
        }
    }

    /// Rows after the next token's own: sampled tokens left, and slots left.
    fn draft_room(&self) -> usize {
        let tokens_left = self
            .job
            .params
            .max_tokens
            .saturating_sub(self.state.token_ids().len() + 1);
        let slots_left = self.reserved_slots.saturating_sub(self.kv.len() + 1);
        tokens_left.min(slots_left)
    }

    /// The next token joins what the draft model is to run.
    fn next_to_draft_model(mut self) -> Self {
        if let Some(model) = &mut self.model_drafter {
            model.push(self.next_token, self.next_position);
        }
        self
    }

    /// Takes the step's rows for this sequence: row 0 after its next token, row `i` after
    /// `drafts[..i]` too. Accepts ([`Self::accept`]) row after row while the token drawn is the
    /// draft that the next row assumed; the rejected drafts' slots are dropped. `pass_seconds`:
    /// the step's time, drafting included, which paces the draft model.
    pub fn accept_drafted(
        mut self,
        rows: Vec<Vec<f32>>,
        drafts: &[u32],
        pass_seconds: f64,
        metrics: &Metrics,
        finish: &mut Finish<'_>,
    ) -> Progress<'r> {
        let first_slot = self.kv.len() - rows.len();
        // Counted before a row can end the answer, so its `usage` has this pass's drafts too.
        self.drafts.drafted += drafts.len();
        let mut accepted = 0;
        let n_rows = rows.len();
        for (row, mut logits) in rows.into_iter().enumerate() {
            self.unverified = n_rows - 1 - row;
            self = self.accept(&mut logits, metrics, finish)?;
            match drafts.get(row) {
                Some(&draft) if self.next_token == draft => {
                    accepted += 1;
                    self.drafts.accepted += 1;
                    metrics.spec_accepted_tokens.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
        self.unverified = 0;
        if let Some(model) = &mut self.model_drafter {
            match self.modelled {
                true => model.verdict(drafts, accepted),
                false => model.accepted_elsewhere(&drafts[..accepted]),
            }
        }
        if std::mem::take(&mut self.modelled) {
            let catch_up = std::mem::take(&mut self.catch_up_seconds);
            (finish.learnt.model).record(accepted + 1, pass_seconds + catch_up);
            (metrics.spec_model_draft_tokens).fetch_add(drafts.len() as u64, Ordering::Relaxed);
            (metrics.spec_model_accepted_tokens).fetch_add(accepted as u64, Ordering::Relaxed);
        } else if !drafts.is_empty()
            && let Some(drafter) = &mut self.drafter
        {
            if drafter.drafting_from_answers() {
                (metrics.spec_answer_draft_tokens)
                    .fetch_add(drafts.len() as u64, Ordering::Relaxed);
                (metrics.spec_answer_accepted_tokens).fetch_add(accepted as u64, Ordering::Relaxed);
            }
            drafter.share_verdict(accepted, accepted < drafts.len(), finish.learnt);
        }
        if !drafts.is_empty() {
            self.kv.rollback(first_slot + 1 + accepted);
        }
        Some(self.next_to_draft_model())
    }

    /// Whether the sequence decodes within a KV budget, in passes of its own ([`Self::step_alone`]).
    pub fn is_budgeted(&self) -> bool {
        self.hitters.is_some()
    }

    /// A budgeted sequence's decoding step: its next token in a pass of its own that observes
    /// the attention, evicting first when the cache is full, then [`Self::accept`].
    pub fn step_alone(
        mut self,
        model: &Model,
        metrics: &Metrics,
        finish: &mut Finish<'_>,
    ) -> Progress<'r> {
        let Some(hitters) = &mut self.hitters else {
            return self.fail(
                JobError::Internal(Incident::report("an unbudgeted sequence stepped alone")),
                metrics,
            );
        };
        let started = Instant::now();
        let row = hitters
            .forward(
                model,
                &[self.next_token],
                &[self.next_position],
                &mut self.kv,
            )
            .map_err(JobError::internal)
            .and_then(|logits| logits_row(&logits));
        match row {
            Ok(mut row) => {
                metrics.inter_token_latency.observe(started.elapsed());
                self.accept(&mut row, metrics, finish)
            }
            Err(error) => self.fail(error, metrics),
        }
    }

    /// Whether the client has gone away (its response future or stream was dropped).
    pub fn is_cancelled(&self) -> bool {
        self.job.events.is_closed()
    }

    pub fn is_past_deadline(&self, now: Instant) -> bool {
        now >= self.job.deadline
    }

    /// Ends the sequence with `end`, reporting the tokens generated.
    pub fn end(self, end: JobEnd, metrics: &Metrics) -> Progress<'r> {
        let completion_tokens = self.state.token_ids().len();
        if let Some(hitters) = &self.hitters {
            metrics
                .kv_evicted_tokens
                .fetch_add(hitters.evicted() as u64, Ordering::Relaxed);
        }
        if matches!(end, JobEnd::Finished(_)) {
            // The last token of a finished answer never ran through the model.
            metrics.tokens_generated.fetch_add(1, Ordering::Relaxed);
        }
        metrics.count_outcome(match end {
            JobEnd::Finished(_) => Outcome::Completed,
            JobEnd::TimedOut => Outcome::TimedOut,
        });
        self.job.events.send(JobEvent::Done {
            end,
            completion_tokens,
            drafts: self.drafts,
        });
        None
    }

    pub fn fail(self, error: JobError, metrics: &Metrics) -> Progress<'r> {
        metrics.count_outcome(Outcome::Failed);
        self.job.events.send(JobEvent::Failed(error));
        None
    }
}

/// `token`'s log-probability under `logits` and the `top` likeliest tokens'.
fn token_logprob(
    tokenizer: &dyn Tokenizer,
    logits: &[f32],
    token: u32,
    top: usize,
) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = logits
        .iter()
        .map(|&logit| (logit - max).exp())
        .sum::<f32>()
        .ln()
        + max;
    let logprob = |id: u32| {
        logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |l| l - log_sum)
    };
    let mut best: Vec<u32> = Vec::with_capacity(top + 1);
    if top > 0 {
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        let top = top.min(ids.len());
        if top < ids.len() {
            ids.select_nth_unstable_by(top - 1, by_logit);
            ids.truncate(top);
        }
        ids.sort_by(by_logit);
        best = ids;
    }
    TokenLogprob {
        token: token_text(tokenizer, token),
        logprob: logprob(token),
        top: best
            .into_iter()
            .map(|id| (token_text(tokenizer, id), logprob(id)))
            .collect(),
    }
}

/// A token's text on its own and its bytes (the text's, so a token inside a multi-byte
/// character shows as U+FFFD, as OpenAI's do).
fn token_text(tokenizer: &dyn Tokenizer, token: u32) -> TokenText {
    let text = tokenizer.decode(&[token]).unwrap_or_default();
    TokenText {
        bytes: text.as_bytes().to_vec(),
        text,
    }
}

/// One row of logits as f32 values.
pub fn logits_row(logits: &Tensor) -> Result<Vec<f32>, JobError> {
    logits
        .flatten_all()
        .and_then(|logits| logits.to_dtype(DType::F32))
        .and_then(|logits| logits.to_vec1::<f32>())
        .map_err(JobError::internal)
}

/// Tokens a draft may still have to run first, the sequence's newest ones since its last
/// draft: a draft model no further behind drafts at once.
const DRAFT_CATCH_UP: usize = MAX_DRAFT + 1;

/// Tokens of a sequence run through its draft model in a step when it is behind: as many as
/// a step's prompt chunk (`PREFILL_CHUNK_TOKENS`), of a smaller model.
const DRAFT_FEED_TOKENS: usize = 128;

/// A draft model's drafter for a sequence of the prompt `tokens` (at `positions`) when `speculation` drafts with one
/// and the server has one: its cache is filled with the prompt's tokens at the positions the
/// sequence's cache holds them (computed, between steps; a PML prompt's modules are not spliced
/// from the draft model's states).
fn model_drafter<'r>(
    runtime: &'r Runtime,
    speculation: Speculation,
    tokens: &[u32],
    positions: &[u32],
    draft_blocks: Option<&PrefixCache>,
) -> Option<ModelDrafter<'r>> {
    let Speculation::Draft { max_draft, p_min } = speculation else {
        return None;
    };
    let draft = runtime.draft_model()?.model();
    if positions.len() != tokens.len() {
        tracing::debug!("the prompt's cache does not hold its tokens one a row: no draft model");
        return None;
    }
    let plain = positions.iter().copied().eq(0..tokens.len() as u32);
    let (kv, cached) = match draft_blocks.filter(|_| plain) {
        Some(blocks) => blocks
            .splice(draft, tokens, 0, tokens.len())
            .map(|spliced| (spliced.kv, spliced.cached_tokens))
            .map_err(|error| error.to_string()),
        None => draft
            .new_kv_cache()
            .map(|kv| (kv, 0))
            .map_err(|error| error.to_string()),
    }
    .inspect_err(|error| tracing::warn!(%error, "no draft model for this answer"))
    .ok()?;
    Some(ModelDrafter::filling(
        draft,
        kv,
        &tokens[cached..],
        &positions[cached..],
        max_draft,
        p_min,
        runtime.tokenizer().vocab_size(),
    ))
}

/// The tokens of a plain or chat prompt (a PML prompt's text as plain text); `add_special` puts
/// the model's BOS before plain text (chats get what their template writes).
pub fn prompt_tokens(
    runtime: &Runtime,
    prompt: &PromptSource,
    add_special: bool,
) -> Result<Vec<u32>, JobError> {
    let tokenizer = runtime.tokenizer();
    check_prompt_bytes(runtime, prompt)?;
    match prompt {
        PromptSource::Text(text) | PromptSource::Pml { source: text, .. } => {
            let mut tokens: Vec<u32> = match add_special {
                true => tokenizer.bos_token().into_iter().collect(),
                false => Vec::new(),
            };
            tokens.extend(
                tokenizer
                    .encode(text, false)
                    .map_err(|error| JobError::BadRequest(error.to_string()))?,
            );
            Ok(tokens)
        }
        PromptSource::Chat(turns) => {
            let turns: Vec<_> = turns
                .iter()
                .map(|(role, text)| (*role, text.as_str()))
                .collect();
            chat_prompt_tokens(runtime.template(), tokenizer, &turns)
                .map_err(|error| JobError::BadRequest(error.to_string()))
        }
        PromptSource::Conversation(conversation) => {
            conversation_tokens(runtime.template(), tokenizer, conversation)
                .map_err(|error| JobError::BadRequest(error.to_string()))
        }
    }
}

/// Refuses, before tokenizing or binding it, a prompt of more bytes than the model's context
/// could hold at its longest token: the tokenizer's memory grows with the text, not the context.
pub fn check_prompt_bytes(runtime: &Runtime, prompt: &PromptSource) -> Result<(), JobError> {
    let bytes = match prompt {
        PromptSource::Text(text) | PromptSource::Pml { source: text, .. } => text.len(),
        PromptSource::Chat(turns) => turns.iter().map(|(_, text)| text.len()).sum(),
        // Rendered by the template whole; the request's body limit bounds it.
        PromptSource::Conversation(_) => 0,
    };
    runtime
        .check_prompt_bytes(bytes as u64)
        .map_err(JobError::Context)
}

/// KV slots a sequence of `job` with a prompt of `prompt_slots` may fill: the prompt, the
/// answer, and the one more slot decoding writes before it stops.
pub fn reserved_slots(prompt_slots: usize, job: &CompletionJob) -> usize {
    prompt_slots + job.params.max_tokens + 1
}

/// Refuses, before any computing, a prompt whose answer could run past the model's positions
/// (`prompt_positions`: one past the highest a PML prompt takes, which skipped or repeated
/// modules make more than its tokens); an open-ended answer is cut to the positions the prompt
/// leaves instead (refused only when it leaves none).
pub fn check_context(
    runtime: &Runtime,
    prompt_positions: usize,
    job: &mut CompletionJob,
) -> Result<(), JobError> {
    let context = runtime.max_positions();
    job.fit_answer((context as usize).saturating_sub(prompt_positions).max(1));
    check_positions(prompt_positions, job.params.max_tokens, context).map_err(JobError::Context)
}

/// A runtime error as a job error: diagnostics become JSON against `source`, the first
/// [`DEFAULT_MAX_SHOWN`] of them as every host shows them, so that the answer to a megabyte of
/// broken markup stays a few kilobytes; the rest are counted.
pub fn runtime_error(error: RuntimeError, source: &str) -> JobError {
    match error {
        RuntimeError::Plan(PlanError::Diagnostics { what, diagnostics }) => {
            let errors = diagnostics
                .iter()
                .filter(|diagnostic| diagnostic.is_error())
                .count();
            let (shown, omitted) = first_shown(&diagnostics, DEFAULT_MAX_SHOWN);
            JobError::Diagnostics {
                what,
                errors,
                omitted,
                diagnostics: JsonDiagnostic::all(what, source, shown),
            }
        }
        RuntimeError::Plan(PlanError::WrongKind { .. }) => JobError::BadRequest(error.to_string()),
        RuntimeError::Inference(InferenceError::Context(error)) => JobError::Context(error),
        other => JobError::internal(other),
    }
}
