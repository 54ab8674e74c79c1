//! The engine loop, a bounded step (llama.cpp's `update_slots`, vLLM's scheduler with chunked
//! prefill). Each turn: take every request that arrived (blocking only when idle); drop
//! sequences — waiting, prefilling or decoding — whose client left or whose deadline passed;
//! encode one uploaded schema (in passes of its own when nothing else runs, else its next rows
//! join the step's pass); admit waiting completions while the batch has room and their KV
//! reservations fit the KV pool (what is cached is spliced: a plain prompt's prefix, a PML
//! prompt's modules; a `blend` PML prompt is prefilled whole, its computed tokens counted
//! against the step's [`PREFILL_CHUNK_TOKENS`]); let plain prompts part way through catch up on
//! blocks kept meanwhile; then run one forward pass over every decoding sequence's next token
//! and every prompt's chunk — plain prompts' at their token positions, PML prompts' at their
//! laid-out ones — so a step reads the weights once whatever the mix (llama.cpp's one
//! `llama_batch`), the step's tokens going to the shortest remaining prompt first with the
//! oldest always given a share, so a long prompt neither stalls running streams nor starves.
//! Only sequences under a KV budget (H2O) run passes of their own: theirs observe attention.
//!
//! A sequence is in exactly one state: waiting (in [`Admission`]), prefilling (`prefilling`),
//! decoding (`active`) or finished (reported and dropped).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use candle_core::DType;
use pml_engine::Tokenizer;
use pml_engine::generation::speculative::Learnt;
use pml_engine::generation::speculative::pace::{DraftOffer, PassCosts, draft_lengths};
use pml_engine::kv_cache::KvCache;
use pml_engine::model::BatchSlot;
use pml_runtime::inference::prefix_edit::edit_blend_options;
use pml_runtime::inference::{BlendOptions, PrefixCache, Runtime};
use pml_runtime::kv_budget::KvBudget;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;

use super::admission::{Admission, fail, still_wanted};
use super::encode_pace::StepTime;
use super::prefill::{Advance, PREFILL_CHUNK_TOKENS, PendingPrefill, Prepared, PromptChunk};
use super::schema_compile::SchemaCompiler;
use super::schemas::SchemaRegistry;
use super::sequence::{Finish, Prefilled, Sequence, prompt_tokens};
use super::structured::{Constraint, Grammars, ResponseFormat};
use super::{CompletionJob, EngineRequest, JobEnd, JobError, PromptSource, Shutdown};
use crate::incident::{Incident, error_chain};
use crate::metrics::{Metrics, Outcome};

/// Tokens of each step's allowance the oldest prefilling prompt always gets, so a stream of short
/// prompts cannot starve a long one.
const OLDEST_SHARE: usize = 32;

/// The rows of a step's batched pass.
#[derive(Clone, Copy, Debug, Default)]
struct PassRows {
    /// Whether a pass ran.
    ran: bool,
    /// Decoding sequences' tokens.
    decoding: usize,
    /// Prompts' chunk tokens.
    prompt: usize,
    /// A schema's encoding's tokens, if any joined.
    joined: Option<usize>,
}

/// What the scheduler takes from [`crate::ServerConfig`] (its fields' docs say what each does).
#[derive(Clone, Copy, Debug)]
pub struct SchedulerSettings {
    /// `ServerConfig::max_batch`.
    pub max_batch: usize,
    /// `ServerConfig::kv_cache_bytes`.
    pub kv_cache_bytes: Option<usize>,
    /// `ServerConfig::kv_pressure_budget`.
    pub kv_pressure_budget: Option<KvBudget>,
    /// `ServerConfig::edit_reuse`.
    pub edit_reuse: bool,
    /// `ServerConfig::max_schema_units`.
    pub max_schema_units: usize,
    /// `ServerConfig::answer_draft_tokens`.
    pub answer_tokens: usize,
    /// `ServerConfig::prefix_cache_bytes`: the draft model's prefix cache gets as many.
    pub prefix_cache_bytes: u64,
}

impl SchedulerSettings {
    /// The settings `config` gives.
    pub fn of(config: &crate::ServerConfig) -> Self {
        Self {
            max_batch: config.max_batch,
            kv_cache_bytes: config.kv_cache_bytes,
            kv_pressure_budget: config.kv_pressure_budget,
            edit_reuse: config.edit_reuse,
            max_schema_units: config.max_schema_units,
            answer_tokens: config.answer_draft_tokens,
            prefix_cache_bytes: config.prefix_cache_bytes,
        }
    }
}

/// The engine thread's state; borrows the runtime it owns for the thread's lifetime.
pub struct Scheduler<'r> {
    runtime: &'r Runtime,
    metrics: Arc<Metrics>,
    schemas: SchemaCompiler,
    admission: Admission,
    prefilling: Vec<PendingPrefill>,
    active: Vec<Sequence<'r>>,
    /// KV of plain prompts' full blocks, for the prompts that follow.
    prefix_cache: PrefixCache,
    /// The same of the draft model (`--draft-model`): its cache of a sequence starts there.
    draft_blocks: Option<PrefixCache>,
    /// Grammar parsers over the vocabulary, built at the first `response_format` request.
    grammars: Option<Grammars>,
    /// The KV pool of the sequences in bytes (`--kv-cache-mib`) and the bytes of one slot.
    kv_pool: Option<usize>,
    slot_bytes: usize,
    /// `--kv-pressure-budget`: what a plain prompt whose reservation does not fit is admitted
    /// within instead of waiting.
    pressure_budget: Option<KvBudget>,
    /// How an edited plain prompt's reused rows are repaired; `None`: no edit reuse.
    edit_reuse: Option<BlendOptions>,
    /// The oldest admitted job, prepared, waiting for its KV reservation to fit: nothing is
    /// admitted past it, so a long prompt is not starved by short ones.
    deferred: Option<Prepared>,
    /// How long the steps with completions in them take: the time an encoding's piece may take.
    step_time: StepTime,
    /// What passes of each number of rows cost: how many drafted tokens a step verifies.
    pass_costs: PassCosts,
    /// How often the answers' drafts were accepted, by match length: every answer's pace reads
    /// it (answers of a workload draft alike; a short one, or a batch's first pass, cannot
    /// learn alone); and the earlier answers, which later ones draft from.
    learnt: Learnt,
}

impl<'r> Scheduler<'r> {
    pub fn new(
        runtime: &'r Runtime,
        registry: Arc<SchemaRegistry>,
        metrics: Arc<Metrics>,
        settings: SchedulerSettings,
        prefix_cache: PrefixCache,
    ) -> Self {
        let max_batch = settings.max_batch.max(1);
        Self {
            pressure_budget: settings.kv_pressure_budget,
            edit_reuse: settings.edit_reuse.then(edit_blend_options),
            draft_blocks: draft_prefix_cache(runtime, settings.prefix_cache_bytes),
            prefix_cache,
            grammars: None,
            kv_pool: settings.kv_cache_bytes,
            // A draft model's cache of a sequence holds as many slots as the sequence's own.
            slot_bytes: runtime.model().kv_layout().slot_bytes()
                + (runtime.draft_model()).map_or(0, |draft| draft.model().kv_layout().slot_bytes()),
            deferred: None,
            runtime,
            schemas: SchemaCompiler::new(registry, settings.max_schema_units),
            admission: Admission::new(max_batch, Arc::clone(&metrics)),
            metrics,
            prefilling: Vec::new(),
            active: Vec::new(),
            step_time: StepTime::default(),
            pass_costs: PassCosts::new(MAX_COSTED_ROWS),
            learnt: Learnt::new(settings.answer_tokens),
        }
    }

    /// Serves requests until every sender is gone and all accepted work is done; once a
    /// shutdown begins, refuses what waits and, at its deadline, cuts off what still runs.
    pub fn run(mut self, mut requests: UnboundedReceiver<EngineRequest>, shutdown: &Shutdown) {
        let mut open = true;
        loop {
            if open && self.is_idle() {
                match requests.blocking_recv() {
                    Some(request) => self.handle(request),
                    None => open = false,
                }
            }
            while open {
                match requests.try_recv() {
                    Ok(request) => self.handle(request),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if !open && self.is_idle() {
                return;
            }
            if let Some(deadline) = shutdown.deadline() {
                self.wind_down(deadline);
            }
            self.retire_cancelled_and_late();
            // Beside completions, an encoding's rows join their step's pass (one read of the
            // weights for both); alone, it runs passes of its own.
            let serving = !(self.active.is_empty() && self.prefilling.is_empty());
            let encoded = if serving {
                self.schemas.prepare_joined(self.runtime)
            } else {
                self.schemas.encode_next(self.runtime)
            };
            if encoded {
                self.publish_store_stats();
            }
            let spent = self.admit();
            let stepped = Instant::now();
            let rows = self.step(PREFILL_CHUNK_TOKENS.saturating_sub(spent).max(OLDEST_SHARE));
            self.after_step(rows, stepped.elapsed());
            self.metrics
                .active_sequences
                .store(self.active.len(), Ordering::Relaxed);
            self.publish_kv();
        }
    }

    /// Times a step that decoded and computed no prompt rows — the wait between a stream's
    /// tokens — with and without an encoding's rows in it, which paces those rows.
    fn after_step(&mut self, rows: PassRows, elapsed: std::time::Duration) {
        if let Some(joined) = rows.joined {
            self.schemas.chunk_ran();
            self.metrics
                .encode_joined_tokens
                .fetch_add(joined as u64, Ordering::Relaxed);
        }
        if rows.decoding == 0 || rows.prompt > 0 {
            return;
        }
        if rows.joined.is_none() {
            self.step_time.observe(elapsed);
        }
        if let Some(plain) = self.step_time.get() {
            self.schemas.pace(rows.joined, elapsed, plain);
        }
    }

    fn is_idle(&self) -> bool {
        self.active.is_empty()
            && self.prefilling.is_empty()
            && self.deferred.is_none()
            && self.admission.is_empty()
            && self.schemas.is_idle()
    }

    fn handle(&mut self, request: EngineRequest) {
        // Counted in by `EngineHandle::send`; completions have their own count, shutdowns none.
        if !matches!(
            request,
            EngineRequest::Complete(_) | EngineRequest::Shutdown
        ) {
            self.metrics
                .control_queue_depth
                .fetch_sub(1, Ordering::SeqCst);
        }
        match request {
            EngineRequest::Upload {
                source,
                sources_root,
                reply,
            } => {
                let _ = reply.send(self.schemas.lay_out(self.runtime, &source, sources_root));
            }
            EngineRequest::Delete { name, reply } => {
                let _ = reply.send(self.schemas.remove(&name));
            }
            EngineRequest::Complete(job) => self.admission.push(*job),
            EngineRequest::Layout { name, reply } => {
                let _ = reply.send(self.schemas.layout_view(self.runtime, &name));
            }
            EngineRequest::Shutdown => {}
            EngineRequest::Tokenize {
                prompt,
                add_special,
                reply,
            } => {
                let _ = reply.send(prompt_tokens(self.runtime, &prompt, add_special));
            }
            EngineRequest::Detokenize { tokens, reply } => {
                let vocab = self.runtime.tokenizer().vocab_size();
                let answer = match tokens.iter().find(|&&token| token as usize >= vocab) {
                    Some(token) => Err(JobError::BadRequest(format!(
                        "token id {token} is outside the vocabulary (0..{vocab})"
                    ))),
                    None => self
                        .runtime
                        .tokenizer()
                        .decode(&tokens)
                        .map_err(|error| JobError::BadRequest(error.to_string())),
                };
                let _ = reply.send(answer);
            }
        }
    }

    /// Admits waiting completions while the batch has room, their KV reservations fit the
    /// pool and the step's tokens last: each starts its chunked prefill (what is cached spliced
    /// now; a `blend` PML prompt prefilled whole, its computed tokens counted against the
    /// step's). Returns the tokens computed.
    fn admit(&mut self) -> usize {
        let mut spent = 0;
        while spent < PREFILL_CHUNK_TOKENS {
            let mut prepared = match self.deferred.take() {
                Some(prepared) => {
                    self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
                    prepared
                }
                None => {
                    let running = self.active.len()
                        + self
                            .prefilling
                            .iter()
                            .map(|prefill| prefill.job.width())
                            .sum::<usize>();
                    let Some(job) = self.admission.next(running) else {
                        break;
                    };
                    match Prepared::new(self.runtime, self.schemas.laid_out(), job) {
                        Ok(prepared) => prepared,
                        Err(failed) => {
                            let (job, error) = *failed;
                            fail(job, error, &self.metrics);
                            continue;
                        }
                    }
                }
            };
            if let Some(pool) = self.kv_pool {
                let reserved = self.reserved_slots() * self.slot_bytes;
                prepared.fit_pool(pool / (prepared.job.width() * self.slot_bytes).max(1));
                self.relieve_pressure(&mut prepared, pool, reserved);
                let (slots, width) = (prepared.slots, prepared.job.width());
                let needed = slots * width * self.slot_bytes;
                if needed > pool {
                    let error = JobError::OverKvPool {
                        slots,
                        width,
                        needed,
                        pool,
                    };
                    fail(prepared.job, error, &self.metrics);
                    continue;
                }
                if reserved + needed > pool {
                    // Counted as waiting again until it fits.
                    self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
                    self.deferred = Some(prepared);
                    break;
                }
            }
            let schemas = self.schemas.laid_out();
            let edit_reuse = self.edit_reuse.as_ref();
            match prepared.start(self.runtime, schemas, &self.prefix_cache, edit_reuse) {
                Advance::Pending(prefill) => self.prefilling.push(prefill),
                Advance::Done(job, prefilled) => {
                    spent += prefilled.usage.new_tokens + prefilled.usage.recomputed_tokens;
                    self.start_decoding(job, prefilled);
                }
                Advance::Failed(job, error) => fail(job, error, &self.metrics),
            }
            self.publish_store_stats();
        }
        spent
    }

    /// The pool's pressure valve: a plain prompt whose reservation does not fit the `pool`
    /// bytes beside the `reserved` ones now — or could never fit — is put within
    /// `--kv-pressure-budget` slots when that lets it start now (or at all).
    fn relieve_pressure(&self, prepared: &mut Prepared, pool: usize, reserved: usize) {
        let Some(valve) = self.pressure_budget else {
            return;
        };
        let bytes = |slots: usize| slots * prepared.job.width() * self.slot_bytes;
        let (needed, squeezed) = (bytes(prepared.slots), bytes(valve.slots));
        let room = pool.saturating_sub(reserved);
        let helps = needed > room && (squeezed <= room || needed > pool);
        if helps && prepared.impose_budget(valve) {
            self.metrics
                .kv_pressure_admissions
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// During a shutdown: refuses every waiting completion and schema encoding, and past the
    /// deadline fails whatever still prefills or decodes (the client gets a 503 or, in a stream,
    /// an error event), so the server stops within the grace period plus one step.
    fn wind_down(&mut self, deadline: Instant) {
        self.admission.refuse_all();
        if let Some(prepared) = self.deferred.take() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            fail(prepared.job, JobError::ShuttingDown, &self.metrics);
        }
        self.schemas.cancel_queued();
        if Instant::now() < deadline {
            return;
        }
        for prefill in std::mem::take(&mut self.prefilling) {
            fail(prefill.job, JobError::ShuttingDown, &self.metrics);
        }
        for sequence in std::mem::take(&mut self.active) {
            sequence.fail(JobError::ShuttingDown, &self.metrics);
        }
    }

    /// Hands a prefilled prompt to the decoding sequences.
    /// Starts `job` and each of its siblings (`n` > 1) from the one prefill: the prompt's rows
    /// become shared ones that every choice reads in place and each appends its answer to rows
    /// of its own, so the prompt is computed and held once for every choice.
    fn start_decoding(&mut self, mut job: CompletionJob, mut prefilled: Prefilled) {
        let usage = &prefilled.usage;
        // A budgeted prompt never looks in the prefix cache.
        if !matches!(job.prompt, PromptSource::Pml { .. }) && prefilled.hitters.is_none() {
            self.metrics
                .count_prefix_lookup(usage.prompt_tokens, usage.cached_tokens);
        }
        if !job.siblings.is_empty()
            && let Err(error) = prefilled.kv.share_rows()
        {
            // The forks then copy the prompt's rows when they first append, as clones do.
            tracing::warn!(%error, "the prompt's rows could not be shared by its choices");
        }
        let forks: Vec<_> = std::mem::take(&mut job.siblings)
            .into_iter()
            .map(|sibling| (job.sibling(sibling), prefilled.fork()))
            .collect();
        self.start_sequence(job, prefilled);
        for (sibling, fork) in forks {
            self.start_sequence(sibling, fork);
        }
    }

    fn start_sequence(&mut self, job: CompletionJob, prefilled: Prefilled) {
        let constraint = match &job.format {
            Some(format) => match self.constraint(format) {
                Ok(constraint) => Some(constraint),
                Err(error) => return fail(job, error, &self.metrics),
            },
            None => None,
        };
        if let Some(sequence) = Sequence::start(
            self.runtime,
            job,
            prefilled,
            constraint,
            self.draft_blocks.as_ref(),
            &self.metrics,
            &mut Finish {
                keep: &mut |tokens, kv| keep_answer(self.runtime, &self.prefix_cache, tokens, kv),
                learnt: &mut self.learnt,
            },
        ) {
            self.active.push(sequence);
        }
    }

    /// A constraint for `format`, building the vocabulary's grammar parsers the first time.
    fn constraint(&mut self, format: &ResponseFormat) -> Result<Constraint, JobError> {
        if self.grammars.is_none() {
            self.grammars = Some(Grammars::new(self.runtime.tokenizer())?);
        }
        match &self.grammars {
            Some(grammars) => grammars.constraint(format),
            None => Err(JobError::Internal(Incident::report("no grammar parsers"))),
        }
    }

    /// How many of the step's `step_tokens` prompt tokens each prefilling prompt computes: the
    /// oldest at least [`OLDEST_SHARE`] of them, the rest to the prompts with the fewest tokens
    /// left (a short question is not kept waiting behind a long document), what is left to the
    /// oldest.
    fn grants(&self, mut step_tokens: usize) -> Vec<usize> {
        if self.prefilling.is_empty() {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..self.prefilling.len()).collect();
        order[1..].sort_by_key(|&index| self.prefilling[index].remaining());
        let mut grants = vec![0; self.prefilling.len()];
        grants[0] = self.prefilling[0]
            .remaining()
            .min(OLDEST_SHARE)
            .min(step_tokens);
        step_tokens -= grants[0];
        for &index in &order[1..] {
            let grant = self.prefilling[index].remaining().min(step_tokens);
            grants[index] = grant;
            step_tokens -= grant;
        }
        grants[0] = (grants[0] + step_tokens).min(self.prefilling[0].remaining());
        grants
    }

    /// One step: a single forward pass over every decoding sequence's next token and every
    /// prompt's chunk (the weights read once for all of them); only sequences under a KV budget
    /// run passes of their own after it, since each of those observes its attention. Counts the
    /// step and its passes (`pml_engine_steps_total`, `pml_forward_passes_total`). The rows the
    /// batched pass computed.
    fn step(&mut self, step_tokens: usize) -> PassRows {
        for prefill in &mut self.prefilling {
            prefill.catch_up(self.runtime, &self.prefix_cache);
        }
        let grants = self.grants(step_tokens);
        let mut batched = Vec::new();
        let mut alone = Vec::new();
        for (prefill, grant) in std::mem::take(&mut self.prefilling).into_iter().zip(grants) {
            match grant {
                0 => self.prefilling.push(prefill),
                _ if prefill.joins_batch() => batched.push((prefill, grant)),
                _ => alone.push((prefill, grant)),
            }
        }
        let (budgeted, batched_decodes): (Vec<_>, Vec<_>) = std::mem::take(&mut self.active)
            .into_iter()
            .partition(Sequence::is_budgeted);
        self.active = batched_decodes;
        let rows = self.batched_pass(batched);
        let mut passes = u64::from(rows.ran);
        let (runtime, prefix_cache) = (self.runtime, &self.prefix_cache);
        let mut keep =
            |tokens: &[u32], kv: &KvCache| keep_answer(runtime, prefix_cache, tokens, kv);
        let mut finish = Finish {
            keep: &mut keep,
            learnt: &mut self.learnt,
        };
        for sequence in budgeted {
            passes += 1;
            if let Some(sequence) = sequence.step_alone(runtime.model(), &self.metrics, &mut finish)
            {
                self.active.push(sequence);
            }
        }
        for (prefill, grant) in alone {
            passes += 1;
            let advanced = prefill.advance_alone(self.runtime, grant);
            self.take_advance(advanced);
        }
        self.metrics.count_step(passes);
        rows
    }

    fn take_advance(&mut self, advanced: Advance) {
        match advanced {
            Advance::Pending(prefill) => self.prefilling.push(prefill),
            Advance::Done(job, prefilled) => self.start_decoding(job, prefilled),
            Advance::Failed(job, error) => fail(job, error, &self.metrics),
        }
    }

    fn retire_cancelled_and_late(&mut self) {
        let now = Instant::now();
        let metrics = &self.metrics;
        let active = std::mem::take(&mut self.active);
        for sequence in active {
            if sequence.is_cancelled() {
                metrics.count_outcome(Outcome::Cancelled);
            } else if sequence.is_past_deadline(now) {
                sequence.end(JobEnd::TimedOut, metrics);
            } else {
                self.active.push(sequence);
            }
        }
        let prefilling = std::mem::take(&mut self.prefilling);
        for prefill in prefilling {
            if still_wanted(&prefill.job, now, metrics) {
                self.prefilling.push(prefill);
            }
        }
        if let Some(prepared) = self.deferred.take() {
            if still_wanted(&prepared.job, now, metrics) {
                self.deferred = Some(prepared);
            } else {
                metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// KV slots reserved by the prefilling and decoding sequences.
    fn reserved_slots(&self) -> usize {
        let prefilling: usize = self
            .prefilling
            .iter()
            .map(|prefill| prefill.slots * prefill.job.width())
            .sum();
        let active: usize = self
            .active
            .iter()
            .map(|sequence| sequence.reserved_slots)
            .sum();
        prefilling + active
    }

    /// The KV gauges: reserved, resident now, and the most resident at the end of any step.
    /// Resident bytes count every buffer the caches read once, however many share it (a
    /// spliced prefix, the prompt of `n` choices).
    fn publish_kv(&self) {
        let mut seen = HashSet::new();
        let prefilling: usize = self
            .prefilling
            .iter()
            .map(|prefill| prefill.resident_bytes(&mut seen))
            .sum();
        let active: usize = self
            .active
            .iter()
            .map(|sequence| sequence.kv.resident_bytes(&mut seen))
            .sum();
        let resident = prefilling + active;
        let metrics = &self.metrics;
        metrics
            .kv_reserved_bytes
            .store(self.reserved_slots() * self.slot_bytes, Ordering::Relaxed);
        metrics.kv_resident_bytes.store(resident, Ordering::Relaxed);
        metrics
            .kv_resident_peak_bytes
            .fetch_max(resident, Ordering::Relaxed);
    }

    /// One forward pass for the next token of every active sequence, the granted chunk of each
    /// of `prefills`, whose rows follow the decoding ones, and the next rows of a schema's
    /// encoding, last; the rows it computed.
    fn batched_pass(&mut self, mut prefills: Vec<(PendingPrefill, usize)>) -> PassRows {
        let mut encoding = self.schemas.joined_chunk(self.step_time.get());
        if self.active.is_empty() && prefills.is_empty() && encoding.is_none() {
            return PassRows::default();
        }
        let start = Instant::now();
        // A step that computes a prompt's chunk or an encoding's rows is compute-bound already:
        // drafts would only delay that prompt's first token, so it verifies none.
        let computes_prompts = !prefills.is_empty() || encoding.is_some();
        let decoding = if computes_prompts {
            plain_rows(&self.active)
        } else {
            decoding_rows(
                &mut self.active,
                &self.pass_costs,
                &mut self.learnt,
                self.draft_blocks.as_ref(),
                &self.metrics,
            )
        };
        // Drafting's time is not the pass's: the pass costs price rows.
        let drafted_in = start.elapsed();
        let mut chunks: Vec<PromptChunk<'_>> = prefills
            .iter_mut()
            .filter_map(|(prefill, grant)| prefill.chunk(*grant))
            .collect();
        let mut slots: Vec<BatchSlot<'_>> = self
            .active
            .iter_mut()
            .zip(&decoding)
            .map(|(sequence, rows)| BatchSlot {
                tokens: &rows.tokens,
                positions: &rows.positions,
                kv: &mut sequence.kv,
            })
            .chain(chunks.iter_mut().map(|chunk| BatchSlot {
                tokens: chunk.tokens,
                positions: &chunk.positions[..],
                kv: &mut *chunk.kv,
            }))
            .chain(encoding.as_mut().map(|chunk| BatchSlot {
                tokens: chunk.tokens,
                positions: chunk.positions,
                kv: &mut *chunk.kv,
            }))
            .collect();
        let n_decoding: usize = decoding.iter().map(|rows| rows.tokens.len()).sum();
        let logit_rows: Vec<usize> = slots
            .iter()
            .enumerate()
            .map(|(slot, batch)| {
                if slot < decoding.len() {
                    batch.tokens.len()
                } else {
                    1
                }
            })
            .collect();
        let pass_rows: usize = slots.iter().map(|slot| slot.tokens.len()).sum();
        let logits = self
            .runtime
            .model()
            .forward_batch_rows(&mut slots, &logit_rows);
        drop(slots);
        drop(chunks);
        let computed = PassRows {
            ran: true,
            decoding: decoding.len(),
            prompt: prefills.iter().map(|(_, grant)| grant).sum(),
            joined: encoding.map(|chunk| chunk.tokens.len()),
        };
        let elapsed = start.elapsed();
        (self.pass_costs).record(pass_rows, (elapsed - drafted_in).as_secs_f64());
        let rows = logits.and_then(|logits| {
            let decoded = logits
                .narrow(0, 0, n_decoding)?
                .to_dtype(DType::F32)?
                .to_vec2::<f32>()?;
            Ok((decoded, logits))
        });
        let (decoded, logits) = match rows {
            Ok(rows) => rows,
            Err(error) => {
                // One failure of the pass, logged once; every client in it hears of it.
                let incident = Incident::of_error(&error);
                for sequence in std::mem::take(&mut self.active) {
                    sequence.fail(JobError::Internal(incident.clone()), &self.metrics);
                }
                for (prefill, _) in prefills {
                    fail(
                        prefill.job,
                        JobError::Internal(incident.clone()),
                        &self.metrics,
                    );
                }
                if computed.joined.is_some() {
                    self.schemas.joined_failed(&incident);
                }
                return PassRows {
                    joined: None,
                    ..computed
                };
            }
        };
        let active = std::mem::take(&mut self.active);
        let metrics = &self.metrics;
        let (runtime, prefix_cache) = (self.runtime, &self.prefix_cache);
        let mut keep =
            |tokens: &[u32], kv: &KvCache| keep_answer(runtime, prefix_cache, tokens, kv);
        let mut finish = Finish {
            keep: &mut keep,
            learnt: &mut self.learnt,
        };
        let mut decoded = decoded.into_iter();
        for (sequence, rows) in active.into_iter().zip(decoding) {
            metrics.inter_token_latency.observe(elapsed);
            let logits: Vec<Vec<f32>> = decoded.by_ref().take(rows.tokens.len()).collect();
            if let Some(sequence) = sequence.accept_drafted(
                logits,
                &rows.tokens[1..],
                elapsed.as_secs_f64(),
                metrics,
                &mut finish,
            ) {
                self.active.push(sequence);
            }
        }
        for (index, (prefill, grant)) in prefills.into_iter().enumerate() {
            let advanced = match logits.get(n_decoding + index) {
                Ok(row) => prefill.after_batched_chunk(
                    self.runtime,
                    &self.prefix_cache,
                    grant,
                    row,
                    elapsed,
                ),
                Err(error) => Advance::Failed(prefill.job, JobError::internal(error)),
            };
            self.take_advance(advanced);
        }
        computed
    }

    fn publish_store_stats(&self) {
        self.metrics.set_store(&self.runtime.store().stats());
    }
}

/// Each decoding sequence's next token alone.
fn plain_rows(active: &[Sequence<'_>]) -> Vec<DecodingRows> {
    active
        .iter()
        .map(|sequence| DecodingRows {
            tokens: vec![sequence.next_token],
            positions: vec![sequence.next_position],
        })
        .collect()
}

/// Each decoding sequence's rows of a step of decoding alone: its next token, and the drafted
/// tokens after it that the passes' measured `costs` and the drafts' acceptance say pay, given
/// the sequences' own rows. A sequence decoding alone whose lookup has nothing worth verifying
/// asks its draft model, when it has one: several sequences' steps are compute-bound already,
/// and a draft model's passes are one sequence's.
fn decoding_rows(
    active: &mut [Sequence<'_>],
    costs: &PassCosts,
    learnt: &mut Learnt,
    draft_blocks: Option<&PrefixCache>,
    metrics: &Metrics,
) -> Vec<DecodingRows> {
    let base_rows = active.len();
    let offers: Vec<Option<(Vec<u32>, DraftOffer)>> = active
        .iter_mut()
        .map(|sequence| sequence.offer(&*learnt))
        .collect();
    let none = DraftOffer {
        alpha: 0.0,
        available: 0,
    };
    let terms: Vec<DraftOffer> = offers
        .iter()
        .map(|offer| offer.as_ref().map_or(none, |(_, offer)| *offer))
        .collect();
    let lengths = draft_lengths(costs, base_rows, active.len() as f64, &terms);
    if tracing::enabled!(tracing::Level::DEBUG) && terms.iter().any(|term| term.available > 0) {
        let alphas: Vec<String> = terms
            .iter()
            .zip(&lengths)
            .map(|(term, length)| format!("{:.2}x{}>{length}", term.alpha, term.available))
            .collect();
        tracing::debug!(
            rows = base_rows,
            base_cost_ms = costs.estimate(base_rows) * 1e3,
            more_cost_ms = costs.estimate(2 * base_rows) * 1e3,
            "drafts (alpha x available > taken): {}",
            alphas.join(" ")
        );
    }
    let alone = active.len() == 1;
    let mut drafted = 0;
    let rows = active
        .iter_mut()
        .zip(offers)
        .zip(lengths)
        .map(|((sequence, offer), length)| {
            let mut tokens = vec![sequence.next_token];
            match offer {
                Some((drafts, _)) if length > 0 => tokens.extend_from_slice(&drafts[..length]),
                _ if alone => {
                    tokens.extend(sequence.model_drafts(costs, &mut learnt.model, draft_blocks));
                }
                _ => {}
            }
            drafted += tokens.len() - 1;
            let positions = (sequence.next_position..).take(tokens.len()).collect();
            DecodingRows { tokens, positions }
        })
        .collect();
    metrics
        .spec_draft_tokens
        .fetch_add(drafted as u64, Ordering::Relaxed);
    rows
}

/// The draft model's prefix cache, in RAM, when the runtime has a draft model and plain
/// prompts' blocks are kept (`budget` bytes, as the model's).
fn draft_prefix_cache(runtime: &Runtime, budget: u64) -> Option<PrefixCache> {
    let draft = runtime.draft_model().filter(|_| budget > 0)?;
    Some(PrefixCache::new(
        budget,
        draft.store().spec().model_fingerprint.clone(),
    ))
}

/// The most rows whose pass cost is kept apart; larger passes are estimated from the largest.
const MAX_COSTED_ROWS: usize = 2 * PREFILL_CHUNK_TOKENS;

/// A decoding sequence's tokens in a step: the one it must run, then drafts; their positions.
struct DecodingRows {
    tokens: Vec<u32>,
    positions: Vec<u32>,
}

/// Keeps a finished answer's full blocks (after its prompt's) in the prefix cache: the next
/// turn of a chat sends the answer back inside its prompt. A block that cannot be kept costs
/// that turn time, never this answer.
fn keep_answer(runtime: &Runtime, prefix_cache: &PrefixCache, tokens: &[u32], kv: &KvCache) {
    if let Err(error) = prefix_cache.keep(runtime.model(), tokens, kv) {
        tracing::warn!(
            "the prefix cache could not keep an answer's blocks: {}",
            error_chain(&error)
        );
    }
}
