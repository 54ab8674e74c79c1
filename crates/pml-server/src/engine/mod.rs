//! The engine: one thread owns the [`Runtime`] (model, tokenizer, store) and everything that
//! touches tensors; the HTTP layer talks to it only through [`EngineHandle`], over channels.
//!
//! - [`schemas`]: uploaded schemas and their compile progress, readable without the engine.
//! - [`schema_compile`]: laying uploaded schemas out and encoding them, one per engine step.
//! - [`encode_pace`]: how much of an encoding one step does (passes of its own when idle, rows
//!   joining the step's pass while completions run).
//! - [`admission`]: completions waiting for room in the batch, and the ones refused instead.
//! - [`scheduler`]: the engine loop — one forward pass a step for decoding tokens and prompt
//!   chunks of a step's tokens, admission within the KV pool, timeouts and cancellation.
//! - [`prefill`]: a prompt's prefill, prepared, started and advanced in chunks.
//! - [`prompt_rows`]: a PML prompt's tokens and how each was obtained (reused, recomputed, new).
//! - [`sequence`]: one completion between decode steps; a PML prompt's prefill.
//! - [`structured`]: `response_format` by constrained decoding (llguidance).

pub mod admission;
pub mod encode_pace;
pub mod prefill;
pub mod prompt_rows;
pub mod scheduler;
pub mod schema_compile;
pub mod schemas;
pub mod sequence;
pub mod structured;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use pml_compiler::conversation::Conversation;
use pml_compiler::tool_calls::ToolCallFormat;
use pml_engine::generation::{FinishReason, SamplingParams};
use pml_runtime::inference::{InferenceMode, PrefixCache, Ratio, Runtime};
use pml_runtime::store::RedisTier;
use pml_syntax::ast::Role;
use pml_syntax::json::JsonDiagnostic;
use pml_syntax::{Omitted, plural};
use tokio::sync::{mpsc, oneshot};

use crate::config::ServerConfig;
use crate::incident::{Incident, log_panics};
use crate::metrics::{Metrics, Outcome};
use prompt_rows::PromptToken;
use schemas::{SchemaInfo, SchemaRegistry};

/// What a completion is asked to continue.
#[derive(Clone, Debug)]
pub enum PromptSource {
    /// A PML prompt, answered with the cached modules of `schema`, the loaded schema it names
    /// (or the only one loaded): resolved once, at the HTTP edge ([`crate::api::prompt_schema`]).
    Pml { source: String, schema: String },
    /// Plain text, tokenized as is after BOS and prefilled in full.
    Text(String),
    /// Chat turns, wrapped in the model's chat template.
    Chat(Vec<(Role, String)>),
    /// A chat with tools, tool calls or tool results, rendered whole by the model's template.
    Conversation(Conversation),
}

/// A completion request as the engine receives it.
#[derive(Debug)]
pub struct CompletionJob {
    pub prompt: PromptSource,
    pub mode: InferenceMode,
    pub params: SamplingParams,
    /// When the request arrived: time to first token counts from here.
    pub arrived: Instant,
    pub deadline: Instant,
    /// `Some(k)`: report each generated token's log-probability and its `k` likeliest
    /// alternatives.
    pub logprobs: Option<usize>,
    /// What the answer must be (JSON, or JSON under a schema), by constrained decoding.
    pub format: Option<structured::ResponseFormat>,
    /// Where the engine reports; dropping the receiver cancels the job.
    pub events: EventSink,
    /// The request's other choices (`n` > 1): the prompt is prefilled once, for this job, and
    /// each sibling decodes from a copy-on-write fork of its KV with its own sampling.
    pub siblings: Vec<Sibling>,
    /// Most KV slots each of its sequences keeps (H2O): a plain prompt whose prompt and answer
    /// would hold more is computed and decoded within it, evicting what its attention reads
    /// least ([`pml_runtime::kv_budget`]); dropped at admission where it could never be reached.
    pub kv_budget: Option<pml_runtime::kv_budget::KvBudget>,
    /// The request named no `max_tokens`: its answers may run until the model ends its turn, so
    /// `max_tokens` (the server's limit) is cut to the room the context and the KV pool leave
    /// rather than a reason to refuse the prompt.
    pub open_ended: bool,
    /// Report a PML prompt's tokens and how each was obtained (`usage.prompt_token_kinds`).
    pub prompt_token_kinds: bool,
}

/// One more choice of a [`CompletionJob`]'s request.
#[derive(Debug)]
pub struct Sibling {
    pub params: SamplingParams,
    pub events: EventSink,
}

impl CompletionJob {
    /// Sequences the job decodes once prefilled: itself and its siblings.
    pub fn width(&self) -> usize {
        1 + self.siblings.len()
    }

    /// The job of `sibling`'s choice: this job's prompt and options, its own sampling and sink.
    pub fn sibling(&self, sibling: Sibling) -> CompletionJob {
        CompletionJob {
            prompt: self.prompt.clone(),
            mode: self.mode,
            params: sibling.params,
            arrived: self.arrived,
            deadline: self.deadline,
            logprobs: self.logprobs,
            format: self.format.clone(),
            events: sibling.events,
            siblings: Vec::new(),
            kv_budget: self.kv_budget,
            open_ended: self.open_ended,
            prompt_token_kinds: false,
        }
    }

    /// Cuts an open-ended job's answers (and its siblings') to `room` tokens; a job whose request
    /// named its `max_tokens` keeps it.
    pub fn fit_answer(&mut self, room: usize) {
        if !self.open_ended {
            return;
        }
        for params in std::iter::once(&mut self.params)
            .chain(self.siblings.iter_mut().map(|sibling| &mut sibling.params))
        {
            params.max_tokens = params.max_tokens.min(room);
        }
    }
}

/// Where one choice of a request reports: the request's channel, each event tagged with the
/// choice's index (a request for `n` choices runs `n` jobs over one channel).
#[derive(Clone, Debug)]
pub struct EventSink {
    pub choice: usize,
    pub sender: mpsc::UnboundedSender<(usize, JobEvent)>,
}

impl EventSink {
    /// Sends `event`; `false` when the client has gone away.
    pub fn send(&self, event: JobEvent) -> bool {
        self.sender.send((self.choice, event)).is_ok()
    }

    /// Whether the client has gone away (its response future or stream was dropped).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// A generated token's log-probability under the model's distribution (before temperature and
/// truncation), with its likeliest alternatives, most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: TokenText,
    pub logprob: f32,
    pub top: Vec<(TokenText, f32)>,
}

/// A token as text (lossy where it is part of a UTF-8 sequence) and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenText {
    pub text: String,
    pub bytes: Vec<u8>,
}

/// Token counts of a prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptUsage {
    pub prompt_tokens: usize,
    /// Rows spliced from stored module KV.
    pub cached_tokens: usize,
    pub recomputed_tokens: usize,
    /// Tokens computed in the prefill.
    pub new_tokens: usize,
    /// Mode `blend`'s estimated fidelity to mode `full` (of the answer the guard replaced,
    /// where it fired).
    pub estimated_fidelity: Option<Ratio>,
    /// The fidelity guard (`min_fidelity`) sent the prompt to mode `full`.
    pub fidelity_guard_fired: bool,
    /// A PML prompt's tokens and how each was obtained, when the request asked.
    pub prompt_token_kinds: Option<Arc<[PromptToken]>>,
}

/// A completion's drafted tokens (speculative decoding): those verified, and those the model
/// agreed with (each one a decode step saved).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DraftCounts {
    pub drafted: usize,
    pub accepted: usize,
}

impl std::ops::AddAssign for DraftCounts {
    fn add_assign(&mut self, other: Self) {
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// How a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobEnd {
    Finished(FinishReason),
    TimedOut,
}

/// What the engine reports about one completion, in order: `Started`, then `Token`s, then `Done`
/// — or a single `Failed` when the prompt cannot be run.
#[derive(Debug)]
pub enum JobEvent {
    Started(PromptUsage),
    /// The text one generated token released (may be empty: the detokenizer waits for whole
    /// characters and stop strings), with its log-probability when asked for.
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    Done {
        end: JobEnd,
        completion_tokens: usize,
        drafts: DraftCounts,
    },
    Failed(JobError),
}

/// Why a completion or an upload could not be run.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The schema or prompt has errors, as JSON diagnostics: the first few, and a count of the
    /// others.
    #[error(
        "the {what} has {}{}",
        plural(*errors, "error"),
        omitted.describe().map(|note| format!("; {note}")).unwrap_or_default()
    )]
    Diagnostics {
        what: &'static str,
        /// Errors among all the diagnostics, shown or not.
        errors: usize,
        diagnostics: Vec<JsonDiagnostic>,
        omitted: Omitted,
    },
    #[error("no schema named `{0}` is loaded")]
    UnknownSchema(String),
    #[error("{0}")]
    BadRequest(String),
    /// The prompt and its answer run past the model's context (PML305), or its text is longer in
    /// bytes than the context could hold at the longest token (PML306): refused before anything
    /// is computed, a text before it is tokenized or bound.
    #[error(transparent)]
    Context(pml_runtime::inference::ContextError),
    #[error(
        "the prompt and max_tokens need {} MiB of KV cache ({slots} slots for each of {width} \
         choice(s)); this server's KV pool is {} MiB (--kv-cache-mib)",
        needed.div_ceil(1 << 20),
        pool >> 20
    )]
    OverKvPool {
        slots: usize,
        width: usize,
        needed: usize,
        pool: usize,
    },
    /// Logged when it was made; the client hears only the incident's number.
    #[error("the engine failed: {0}")]
    Internal(Incident),
    #[error("the server is shutting down")]
    ShuttingDown,
}

impl JobError {
    /// An engine failure, logged now with its causes.
    pub fn internal(error: impl std::error::Error + 'static) -> Self {
        JobError::Internal(Incident::of_error(&error))
    }
}

/// Requests the engine thread serves.
#[derive(Debug)]
pub enum EngineRequest {
    /// Lay a schema out now (answering with its diagnostics if it has errors) and encode it in
    /// the background.
    Upload {
        source: String,
        /// Folder `src=` includes are read from: only for the operator's own schemas
        /// (`--schemas DIR`); `None` (every HTTP upload) refuses them.
        sources_root: Option<std::path::PathBuf>,
        reply: oneshot::Sender<Result<SchemaInfo, JobError>>,
    },
    /// Forget a schema; answers whether it was loaded.
    Delete {
        name: String,
        reply: oneshot::Sender<bool>,
    },
    Complete(Box<CompletionJob>),
    /// A loaded schema's units at their positions, each with the tier its state is in.
    Layout {
        name: String,
        reply: oneshot::Sender<Result<schemas::SchemaLayoutView, JobError>>,
    },
    /// The tokens of a prompt, answered between engine steps.
    Tokenize {
        prompt: PromptSource,
        add_special: bool,
        reply: oneshot::Sender<Result<Vec<u32>, JobError>>,
    },
    /// The text of some token ids.
    Detokenize {
        tokens: Vec<u32>,
        reply: oneshot::Sender<Result<String, JobError>>,
    },
    /// Wakes the engine when a shutdown begins (the state is in [`Shutdown`]).
    Shutdown,
}

/// Why a request could not reach the engine.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full ({0} completions waiting)")]
    QueueFull(usize),
    #[error("the engine is busy ({0} requests waiting)")]
    Busy(usize),
    #[error("the engine has stopped")]
    Stopped,
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// A shutdown in progress, seen by the HTTP layer (refuse new work) and the engine (refuse what
/// waits, cut off what still runs at the deadline).
#[derive(Debug, Default)]
pub struct Shutdown {
    deadline: std::sync::Mutex<Option<Instant>>,
}

impl Shutdown {
    pub fn begin(&self, grace: std::time::Duration) {
        if let Ok(mut deadline) = self.deadline.lock() {
            deadline.get_or_insert(Instant::now() + grace);
        }
    }

    /// When running work is cut off; `None` while no shutdown has begun.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.lock().ok().and_then(|deadline| *deadline)
    }
}

/// The HTTP layer's side of the engine: cheap to clone, never blocks.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    requests: mpsc::UnboundedSender<EngineRequest>,
    queue_capacity: usize,
    pub schemas: Arc<SchemaRegistry>,
    pub metrics: Arc<Metrics>,
    /// Positions the model was trained for (its context length).
    pub max_positions: u32,
    /// The tool-call format the model's template teaches (`None`: it renders no tools).
    pub tool_format: Option<ToolCallFormat>,
    pub shutdown: Arc<Shutdown>,
}

impl EngineHandle {
    /// Queues a completion, or refuses it when `queue_capacity` completions already wait.
    pub fn submit(&self, job: CompletionJob) -> Result<(), SubmitError> {
        if self.shutdown.deadline().is_some() {
            return Err(SubmitError::ShuttingDown);
        }
        let queued = self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
        if queued >= self.queue_capacity {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            self.metrics.count_outcome(Outcome::Rejected);
            tracing::debug!("queue full: refused a completion ({queued} waiting)");
            return Err(SubmitError::QueueFull(queued));
        }
        self.requests
            .send(EngineRequest::Complete(Box::new(job)))
            .map_err(|_| {
                self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
                SubmitError::Stopped
            })
    }

    /// Begins a shutdown: new completions are refused, waiting ones too, and running ones are
    /// cut off after `grace`.
    pub fn begin_shutdown(&self, grace: std::time::Duration) {
        self.shutdown.begin(grace);
        let _ = self.requests.send(EngineRequest::Shutdown);
    }

    /// Sends a schema upload or deletion, or a tokenize or detokenize request: refused, as a
    /// completion is, when `queue_capacity` of them already wait, so that no client can grow
    /// the engine's channel without bound. (A shutdown goes through [`Self::begin_shutdown`].)
    pub fn send(&self, request: EngineRequest) -> Result<(), SubmitError> {
        let waiting = &self.metrics.control_queue_depth;
        let queued = waiting.fetch_add(1, Ordering::SeqCst);
        if queued >= self.queue_capacity {
            waiting.fetch_sub(1, Ordering::SeqCst);
            tracing::debug!("queue full: refused a request ({queued} waiting)");
            return Err(SubmitError::Busy(queued));
        }
        self.requests.send(request).map_err(|_| {
            waiting.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Stopped
        })
    }
}

/// The prefix cache `config` asks for: RAM, and Redis when it names one.
fn prefix_cache(runtime: &Runtime, config: &ServerConfig) -> std::io::Result<PrefixCache> {
    let spec = runtime.store().spec();
    let cache = PrefixCache::new(config.prefix_cache_bytes, spec.model_fingerprint.clone());
    let Some(redis) = &config.prefix_cache_redis else {
        return Ok(cache);
    };
    // Blocks are shared exact: stored in the engine's KV dtype, a namespace of their own.
    let spec = spec.clone().with_state_dtype(spec.layout.dtype);
    let tier = RedisTier::open(redis.clone(), spec).map_err(std::io::Error::other)?;
    Ok(cache.with_shared(Arc::new(tier)))
}

/// Starts the engine thread on `runtime`. The thread ends when every handle is dropped and the
/// last admitted completion has finished (graceful shutdown drains).
pub fn spawn(
    runtime: Runtime,
    config: &ServerConfig,
) -> std::io::Result<(EngineHandle, JoinHandle<()>)> {
    let (requests, receiver) = mpsc::unbounded_channel();
    let handle = EngineHandle {
        requests,
        queue_capacity: config.queue_capacity,
        schemas: Arc::new(SchemaRegistry::default()),
        metrics: Arc::new(Metrics::default()),
        max_positions: runtime.max_positions(),
        tool_format: ToolCallFormat::of(runtime.template()),
        shutdown: Arc::new(Shutdown::default()),
    };
    let shutdown = Arc::clone(&handle.shutdown);
    let schemas = Arc::clone(&handle.schemas);
    let metrics = Arc::clone(&handle.metrics);
    let settings = scheduler::SchedulerSettings::of(config);
    // Published before the server answers anything, not when the engine thread gets to it.
    metrics
        .kv_pool_bytes
        .store(settings.kv_cache_bytes.unwrap_or(0), Ordering::Relaxed);
    let prefix_cache = prefix_cache(&runtime, config)?;
    let thread = std::thread::Builder::new()
        .name("pml-engine".to_string())
        .spawn(move || {
            log_panics("engine", || {
                scheduler::Scheduler::new(&runtime, schemas, metrics, settings, prefix_cache)
                    .run(receiver, &shutdown);
            })
        })?;
    Ok((handle, thread))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle whose engine never drains its channel: what a busy engine looks like to the
    /// HTTP layer.
    fn stalled_handle(
        queue_capacity: usize,
    ) -> (EngineHandle, mpsc::UnboundedReceiver<EngineRequest>) {
        let (requests, receiver) = mpsc::unbounded_channel();
        let handle = EngineHandle {
            requests,
            queue_capacity,
            schemas: Arc::new(SchemaRegistry::default()),
            metrics: Arc::new(Metrics::default()),
            max_positions: 32,
            tool_format: None,
            shutdown: Arc::new(Shutdown::default()),
        };
        (handle, receiver)
    }

    fn detokenize() -> EngineRequest {
        let (reply, _) = oneshot::channel();
        EngineRequest::Detokenize {
            tokens: vec![1],
            reply,
        }
    }

    #[test]
    fn requests_other_than_completions_are_bounded_too() {
        let (handle, mut receiver) = stalled_handle(2);
        handle.send(detokenize()).expect("first fits");
        handle.send(detokenize()).expect("second fits");
        assert!(matches!(
            handle.send(detokenize()),
            Err(SubmitError::Busy(2))
        ));
        assert_eq!(handle.metrics.control_queue_depth.load(Ordering::SeqCst), 2);
        // A shutdown is never refused.
        handle.begin_shutdown(std::time::Duration::ZERO);
        let mut queued = 0;
        while receiver.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, 3, "two requests and the shutdown");
    }
}
