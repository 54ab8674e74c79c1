//! The engine loop, a bounded step (llama.cpp's `update_slots`, vLLM's scheduler with chunked
//! prefill). Each turn: take every request that arrived (blocking only when idle); drop
//! sequences — waiting, prefilling or decoding — whose client left or whose deadline passed;
//! encode one uploaded schema; admit waiting completions while the batch has room (what is
//! cached is spliced: a plain prompt's prefix, a PML prompt's modules; a `blend` PML prompt is
//! prefilled whole, its computed tokens counted against the step's [`PREFILL_CHUNK_TOKENS`]);
//! run one batched decode step over every decoding sequence; then compute prompt chunks with
//! what is left of the budget, shortest remaining prompt first with the oldest always given a
//! share, so a long prompt neither stalls running streams nor starves.
//!
//! A sequence is in exactly one state: waiting (`waiting`), prefilling (`prefilling`), decoding
//! (`active`) or finished (reported and dropped).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use candle_core::DType;
use pml_compiler::{FsSourceLoader, RefuseSources};
use pml_engine::Tokenizer;
use pml_engine::model::DecodeSlot;
use pml_runtime::encode::EncodeEvent;
use pml_runtime::inference::{LaidOutSchema, PrefixCache, Runtime};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::mpsc::error::TryRecvError;

use super::prefill::{Advance, PendingPrefill};
use super::schemas::{SchemaInfo, SchemaRegistry, SchemaStatus};
use super::sequence::{Prefilled, Sequence, prompt_tokens, runtime_error};
use super::structured::{Constraint, Grammars, ResponseFormat};
use super::{CompletionJob, EngineRequest, JobEnd, JobError, JobEvent, PromptSource, Shutdown};
use crate::metrics::{Metrics, Outcome, TierHits};

/// Prompt tokens computed per step, across all prefilling prompts: about 0.8 s of the default
/// model on two cores, so running streams get a token at least that often during a long prefill
/// and a cancelled one frees the engine within that.
pub const PREFILL_CHUNK_TOKENS: usize = 128;

/// Tokens of each step's budget the oldest prefilling prompt always gets, so a stream of short
/// prompts cannot starve a long one.
const OLDEST_SHARE: usize = 32;

/// Reports that `job` cannot run.
fn fail(job: CompletionJob, error: JobError, metrics: &Metrics) {
    metrics.count_outcome(Outcome::Failed);
    job.events.send(JobEvent::Failed(error));
}

/// The engine thread's state; borrows the runtime it owns for the thread's lifetime.
pub struct Scheduler<'r> {
    runtime: &'r Runtime,
    registry: Arc<SchemaRegistry>,
    metrics: Arc<Metrics>,
    max_batch: usize,
    schemas: HashMap<String, LaidOutSchema>,
    to_encode: VecDeque<String>,
    waiting: VecDeque<CompletionJob>,
    prefilling: Vec<PendingPrefill>,
    active: Vec<Sequence<'r>>,
    /// KV of plain prompts' full blocks, for the prompts that follow.
    prefix_cache: PrefixCache,
    /// Grammar parsers over the vocabulary, built at the first `response_format` request.
    grammars: Option<Grammars>,
}

impl<'r> Scheduler<'r> {
    pub fn new(
        runtime: &'r Runtime,
        registry: Arc<SchemaRegistry>,
        metrics: Arc<Metrics>,
        max_batch: usize,
        prefix_cache: PrefixCache,
    ) -> Self {
        Self {
            prefix_cache,
            grammars: None,
            runtime,
            registry,
            metrics,
            max_batch,
            schemas: HashMap::new(),
            to_encode: VecDeque::new(),
            waiting: VecDeque::new(),
            prefilling: Vec::new(),
            active: Vec::new(),
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
            self.encode_one_schema();
            let spent = self.admit();
            self.decode_step();
            self.prefill_chunks(PREFILL_CHUNK_TOKENS.saturating_sub(spent).max(OLDEST_SHARE));
            self.metrics
                .active_sequences
                .store(self.active.len(), Ordering::Relaxed);
        }
    }

    fn is_idle(&self) -> bool {
        self.active.is_empty()
            && self.prefilling.is_empty()
            && self.waiting.is_empty()
            && self.to_encode.is_empty()
    }

    fn handle(&mut self, request: EngineRequest) {
        match request {
            EngineRequest::Upload {
                source,
                sources_root,
                reply,
            } => {
                let _ = reply.send(self.lay_out(&source, sources_root));
            }
            EngineRequest::Delete { name, reply } => {
                let known = self.schemas.remove(&name).is_some();
                self.registry.remove(&name);
                let _ = reply.send(known);
            }
            EngineRequest::Complete(job) => self.waiting.push_back(*job),
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

    /// Checks and lays out an uploaded schema and queues its encoding. `src=` includes are
    /// refused unless `sources_root` names the operator's folder: an upload must not read the
    /// server's files.
    fn lay_out(
        &mut self,
        source: &str,
        sources_root: Option<PathBuf>,
    ) -> Result<SchemaInfo, JobError> {
        let laid_out = match sources_root {
            Some(root) => self.runtime.lay_out(source, &FsSourceLoader::new(root)),
            None => self.runtime.lay_out(source, &RefuseSources),
        }
        .map_err(|error| runtime_error(error, source))?;
        let name = laid_out
            .schema
            .name
            .as_ref()
            .map(|name| name.text.clone())
            .ok_or_else(|| {
                JobError::BadRequest("the schema has no name (`<schema name=\"…\">`)".to_string())
            })?;
        let info = SchemaInfo {
            name: name.clone(),
            status: SchemaStatus::Queued,
            units_total: laid_out.layout.units.len(),
            units_done: 0,
            units_encoded: 0,
            error: None,
        };
        self.registry.insert(info.clone());
        self.schemas.insert(name.clone(), laid_out);
        self.to_encode.retain(|queued| *queued != name);
        self.to_encode.push_back(name);
        Ok(info)
    }

    /// Encodes every unit of the next queued schema that the store lacks, reporting progress.
    fn encode_one_schema(&mut self) {
        let Some(name) = self.to_encode.pop_front() else {
            return;
        };
        let Some(schema) = self.schemas.get(&name) else {
            return; // deleted while queued
        };
        let registry = &self.registry;
        registry.update(&name, |info| info.status = SchemaStatus::Compiling);
        let result = self
            .runtime
            .encode(&schema.layout, &mut |event| match event {
                EncodeEvent::Start { n_units, .. } => {
                    registry.update(&name, |info| info.units_total = n_units);
                }
                EncodeEvent::Unit { index, .. } => {
                    registry.update(&name, |info| info.units_done = index + 1);
                }
                EncodeEvent::Waiting { .. } => {}
            });
        registry.update(&name, |info| match &result {
            Ok(report) => {
                info.status = SchemaStatus::Ready;
                info.units_done = info.units_total;
                info.units_encoded = report.n_encoded();
            }
            Err(error) => {
                info.status = SchemaStatus::Failed;
                info.error = Some(error.to_string());
            }
        });
        self.publish_store_stats();
    }

    /// Admits waiting completions, oldest first, while the batch has room and the step's budget
    /// lasts: each starts its chunked prefill (what is cached spliced now). Returns the tokens
    /// computed.
    fn admit(&mut self) -> usize {
        let mut spent = 0;
        while self.active.len() + self.prefilling.len() < self.max_batch {
            if spent >= PREFILL_CHUNK_TOKENS {
                break;
            }
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            if job.events.is_closed() {
                self.metrics.count_outcome(Outcome::Cancelled);
                continue;
            }
            if Instant::now() >= job.deadline {
                // Counted before the client hears of it, so the metric is there when it looks.
                self.metrics.count_outcome(Outcome::TimedOut);
                job.events.send(super::JobEvent::Done {
                    end: JobEnd::TimedOut,
                    completion_tokens: 0,
                });
                continue;
            }
            self.metrics.queue_time.observe(job.arrived.elapsed());
            // Admission splices what is cached; a `blend` PML prompt is prefilled whole here,
            // its computed tokens counted against the step's budget.
            match PendingPrefill::start(self.runtime, &self.schemas, &self.prefix_cache, job) {
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

    /// During a shutdown: refuses every waiting completion and schema encoding, and past the
    /// deadline fails whatever still prefills or decodes (the client gets a 503 or, in a stream,
    /// an error event), so the server stops within the grace period plus one step.
    fn wind_down(&mut self, deadline: Instant) {
        for job in std::mem::take(&mut self.waiting) {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            fail(job, JobError::ShuttingDown, &self.metrics);
        }
        self.to_encode.clear();
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
    fn start_decoding(&mut self, job: CompletionJob, prefilled: Prefilled) {
        let usage = prefilled.usage;
        if !matches!(job.prompt, PromptSource::Pml(_)) {
            self.metrics
                .prefix_cache_queries
                .fetch_add(usage.prompt_tokens as u64, Ordering::Relaxed);
            self.metrics
                .prefix_cache_hits
                .fetch_add(usage.cached_tokens as u64, Ordering::Relaxed);
        }
        let constraint = match &job.format {
            Some(format) => match self.constraint(format) {
                Ok(constraint) => Some(constraint),
                Err(error) => return fail(job, error, &self.metrics),
            },
            None => None,
        };
        if let Some(sequence) =
            Sequence::start(self.runtime, job, prefilled, constraint, &self.metrics)
        {
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
            None => Err(JobError::Internal("no grammar parsers".to_string())),
        }
    }

    /// Computes prompt chunks up to `budget` tokens in all: the oldest prompt gets at least
    /// [`OLDEST_SHARE`] of them, the rest go to the prompts with the fewest tokens left (a short
    /// question is not kept waiting behind a long document).
    fn prefill_chunks(&mut self, mut budget: usize) {
        if self.prefilling.is_empty() {
            return;
        }
        let mut order: Vec<usize> = (0..self.prefilling.len()).collect();
        order[1..].sort_by_key(|&index| self.prefilling[index].remaining());
        let mut grants = vec![0; self.prefilling.len()];
        grants[0] = self.prefilling[0].remaining().min(OLDEST_SHARE).min(budget);
        budget -= grants[0];
        for &index in &order[1..] {
            let grant = self.prefilling[index].remaining().min(budget);
            grants[index] = grant;
            budget -= grant;
        }
        // What the others left, the oldest may use.
        grants[0] = (grants[0] + budget).min(self.prefilling[0].remaining());
        let pending = std::mem::take(&mut self.prefilling);
        for (prefill, grant) in pending.into_iter().zip(grants) {
            if grant == 0 {
                self.prefilling.push(prefill);
                continue;
            }
            match prefill.advance(self.runtime, &self.prefix_cache, grant) {
                Advance::Pending(prefill) => self.prefilling.push(prefill),
                Advance::Done(job, prefilled) => self.start_decoding(job, prefilled),
                Advance::Failed(job, error) => fail(job, error, &self.metrics),
            }
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
            let job = &prefill.job;
            if job.events.is_closed() {
                metrics.count_outcome(Outcome::Cancelled);
            } else if now >= job.deadline {
                metrics.count_outcome(Outcome::TimedOut);
                job.events.send(super::JobEvent::Done {
                    end: JobEnd::TimedOut,
                    completion_tokens: 0,
                });
            } else {
                self.prefilling.push(prefill);
            }
        }
    }

    /// One token for every active sequence, in one batched forward pass.
    fn decode_step(&mut self) {
        if self.active.is_empty() {
            return;
        }
        let start = Instant::now();
        let mut slots: Vec<DecodeSlot<'_>> = self
            .active
            .iter_mut()
            .map(|sequence| DecodeSlot {
                token: sequence.next_token,
                position: sequence.next_position,
                kv: &mut sequence.kv,
            })
            .collect();
        let rows = self
            .runtime
            .model()
            .decode_batch(&mut slots)
            .and_then(|logits| Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?));
        let elapsed = start.elapsed();
        let active = std::mem::take(&mut self.active);
        let metrics = &self.metrics;
        match rows {
            Ok(rows) => {
                for (sequence, mut row) in active.into_iter().zip(rows) {
                    metrics.inter_token_latency.observe(elapsed);
                    if let Some(sequence) = sequence.accept(&mut row, metrics) {
                        self.active.push(sequence);
                    }
                }
            }
            Err(error) => {
                for sequence in active {
                    sequence.fail(JobError::Internal(error.to_string()), metrics);
                }
            }
        }
    }

    fn publish_store_stats(&self) {
        let stats = self.runtime.store().stats();
        self.metrics.set_store(
            stats
                .tiers
                .iter()
                .map(|tier| TierHits {
                    tier: tier.tier,
                    hits: tier.hits,
                    misses: tier.misses,
                })
                .collect(),
        );
    }
}
