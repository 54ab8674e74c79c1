//! One admitted completion: its prefill (a PML prompt's cached modules spliced in the requested
//! mode, or a plain prompt computed in full), then its decoding state and KV cache between the
//! scheduler's batched steps, and the reports it sends back.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use candle_core::{DType, Tensor};
use pml_engine::Tokenizer;
use pml_engine::generation::{DecodeState, DecodeStep};
use pml_engine::kv_cache::KvCache;
use pml_runtime::chat::chat_prompt_tokens;
use pml_runtime::inference::{LaidOutSchema, Runtime, RuntimeError, SplicePlan};
use pml_syntax::LineIndex;
use pml_syntax::ast::SourceFile;
use pml_syntax::json::JsonDiagnostic;

use super::{CompletionJob, JobEnd, JobError, JobEvent, PromptSource, PromptUsage};
use crate::metrics::{Metrics, Outcome};

/// A completion between decode steps.
pub struct Sequence<'r> {
    job: CompletionJob,
    state: DecodeState<'r>,
    pub kv: KvCache,
    /// The token to run through the model next and its position.
    pub next_token: u32,
    pub next_position: u32,
}

/// A prefilled prompt: its cache, the last token's logits, every prompt token and the counts.
struct Prefilled {
    kv: KvCache,
    logits: Tensor,
    all_tokens: Vec<u32>,
    usage: PromptUsage,
}

/// A sequence that goes on after a step, or `None` when it ended (and reported why).
pub type Progress<'r> = Option<Sequence<'r>>;

impl<'r> Sequence<'r> {
    /// Prefills `job`'s prompt, samples its first token and reports `Started`. Ends the job at
    /// once (reporting why) when the prompt is bad or the answer is already complete.
    pub fn admit(
        runtime: &'r Runtime,
        schemas: &HashMap<String, LaidOutSchema>,
        job: CompletionJob,
        metrics: &Metrics,
    ) -> Progress<'r> {
        let arrived = job.arrived;
        let prefilled = match prefill(runtime, schemas, &job) {
            Ok(prefilled) => prefilled,
            Err(error) => {
                metrics.count_outcome(Outcome::Failed);
                let _ = job.events.send(JobEvent::Failed(error));
                return None;
            }
        };
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
                let _ = job
                    .events
                    .send(JobEvent::Failed(JobError::BadRequest(error.to_string())));
                return None;
            }
        };
        if job.events.send(JobEvent::Started(usage)).is_err() {
            metrics.count_outcome(Outcome::Cancelled);
            return None;
        }
        let sequence = Sequence {
            job,
            state,
            kv: prefilled.kv,
            next_token: 0,
            next_position,
        };
        match logits_row(&prefilled.logits) {
            Ok(logits) => {
                let progress = sequence.accept(&logits, metrics);
                metrics.time_to_first_token.observe(arrived.elapsed());
                progress
            }
            Err(error) => sequence.fail(error, metrics),
        }
    }

    /// Samples from this sequence's row of a step's logits and streams the text.
    pub fn accept(mut self, logits: &[f32], metrics: &Metrics) -> Progress<'r> {
        let events = &self.job.events;
        let mut closed = false;
        let step = self.state.accept(logits, &mut |piece| {
            closed |= events.send(JobEvent::Text(piece.to_string())).is_err();
        });
        match step {
            _ if closed => {
                metrics.count_outcome(Outcome::Cancelled);
                None
            }
            Err(error) => self.fail(JobError::Internal(error.to_string()), metrics),
            Ok(DecodeStep::Finished(reason)) => self.end(JobEnd::Finished(reason), metrics),
            Ok(DecodeStep::Continue { token, position }) => {
                metrics.tokens_generated.fetch_add(1, Ordering::Relaxed);
                self.next_token = token;
                self.next_position = position;
                Some(self)
            }
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
        if matches!(end, JobEnd::Finished(_)) {
            // The last token of a finished answer never ran through the model.
            metrics.tokens_generated.fetch_add(1, Ordering::Relaxed);
        }
        metrics.count_outcome(match end {
            JobEnd::Finished(_) => Outcome::Completed,
            JobEnd::TimedOut => Outcome::TimedOut,
        });
        let _ = self.job.events.send(JobEvent::Done {
            end,
            completion_tokens,
        });
        None
    }

    pub fn fail(self, error: JobError, metrics: &Metrics) -> Progress<'r> {
        metrics.count_outcome(Outcome::Failed);
        let _ = self.job.events.send(JobEvent::Failed(error));
        None
    }
}

/// One row of logits as f32 values.
pub fn logits_row(logits: &Tensor) -> Result<Vec<f32>, JobError> {
    logits
        .flatten_all()
        .and_then(|logits| logits.to_dtype(DType::F32))
        .and_then(|logits| logits.to_vec1::<f32>())
        .map_err(|error| JobError::Internal(error.to_string()))
}

fn prefill(
    runtime: &Runtime,
    schemas: &HashMap<String, LaidOutSchema>,
    job: &CompletionJob,
) -> Result<Prefilled, JobError> {
    let tokens = match &job.prompt {
        PromptSource::Pml(source) => return prefill_pml(runtime, schemas, job, source),
        PromptSource::Text(text) => {
            let mut tokens: Vec<u32> = runtime.tokenizer().bos_token().into_iter().collect();
            tokens.extend(
                runtime
                    .tokenizer()
                    .encode(text, false)
                    .map_err(|error| JobError::BadRequest(error.to_string()))?,
            );
            tokens
        }
        PromptSource::Chat(turns) => {
            let turns: Vec<_> = turns
                .iter()
                .map(|(role, text)| (*role, text.as_str()))
                .collect();
            chat_prompt_tokens(runtime.template(), runtime.tokenizer(), &turns)
                .map_err(|error| JobError::BadRequest(error.to_string()))?
        }
    };
    if tokens.is_empty() {
        return Err(JobError::BadRequest("the prompt is empty".to_string()));
    }
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let model = runtime.model();
    let internal = |error: pml_engine::model::EngineError| JobError::Internal(error.to_string());
    let mut kv = model.new_kv_cache().map_err(internal)?;
    let logits = model
        .forward(&tokens, &positions, &mut kv)
        .map_err(internal)?;
    Ok(Prefilled {
        kv,
        logits,
        usage: PromptUsage {
            prompt_tokens: tokens.len(),
            new_tokens: tokens.len(),
            ..PromptUsage::default()
        },
        all_tokens: tokens,
    })
}

fn prefill_pml(
    runtime: &Runtime,
    schemas: &HashMap<String, LaidOutSchema>,
    job: &CompletionJob,
    source: &str,
) -> Result<Prefilled, JobError> {
    let schema_name = match pml_syntax::parse(source).file {
        SourceFile::Prompt(prompt) => prompt.schema.map(|name| name.text),
        _ => None,
    };
    let schema = match schema_name {
        Some(name) => schemas.get(&name).ok_or(JobError::UnknownSchema(name))?,
        // Let binding report what is wrong with the prompt.
        None => schemas.values().next().ok_or_else(|| {
            JobError::BadRequest("the prompt names no schema `<prompt schema=\"…\">`".to_string())
        })?,
    };
    let bound = runtime
        .bind(schema, source)
        .map_err(|error| runtime_error(error, source))?;
    let plan = SplicePlan::new(&schema.layout, &bound)
        .map_err(|error| JobError::Internal(error.to_string()))?;
    let prefill = runtime
        .prefill(&schema.layout, &bound, job.mode)
        .map_err(|error| JobError::Internal(error.to_string()))?;
    let stats = &prefill.stats;
    Ok(Prefilled {
        usage: PromptUsage {
            prompt_tokens: plan.all_tokens.len(),
            cached_tokens: stats.tokens_reused,
            recomputed_tokens: stats.tokens_recomputed,
            new_tokens: stats.tokens_new,
        },
        all_tokens: plan.all_tokens,
        kv: prefill.kv,
        logits: prefill.logits,
    })
}

/// A runtime error as a job error: diagnostics become JSON against `source`.
pub fn runtime_error(error: RuntimeError, source: &str) -> JobError {
    match error {
        RuntimeError::Diagnostics { what, diagnostics } => {
            let index = LineIndex::new(source);
            JobError::Diagnostics {
                what,
                diagnostics: diagnostics
                    .iter()
                    .map(|diagnostic| JsonDiagnostic::new(what, source, &index, diagnostic))
                    .collect(),
            }
        }
        RuntimeError::WrongKind { .. } => JobError::BadRequest(error.to_string()),
        other => JobError::Internal(other.to_string()),
    }
}
