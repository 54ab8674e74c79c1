//! A prompt's prefill, in chunks: started at admission — a plain prompt tokenized, checked
//! against the context and its longest cached prefix spliced from the prefix cache; a PML prompt
//! bound to its schema, checked, and its cached modules spliced in its mode (mode `blend` runs
//! whole there: its layer-wise recompute is one pass) — then advanced by at most the step's
//! token budget at a time, so a long prompt never holds the engine longer than one chunk: running
//! streams decode in between, and a client that leaves or a shutdown is noticed between chunks.

use std::collections::HashMap;

use pml_engine::kv_cache::KvCache;
use pml_runtime::inference::{
    LaidOutSchema, Prefill, PrefixCache, Runtime, SplicePlan, Staged, StagedPrefill,
};

use super::sequence::{Prefilled, check_context, prompt_tokens, runtime_error};
use super::{CompletionJob, JobError, PromptSource, PromptUsage};
use crate::incident::error_chain;

/// A prompt part way through its prefill.
pub struct PendingPrefill {
    pub job: CompletionJob,
    work: Work,
}

enum Work {
    Plain {
        tokens: Vec<u32>,
        /// Holds the prompt's first `kv.len()` tokens; room for the rest and the answer.
        kv: KvCache,
        cached_tokens: usize,
    },
    Pml {
        staged: Box<StagedPrefill>,
        all_tokens: Vec<u32>,
    },
}

/// Where a prefill stands after admission or a chunk.
pub enum Advance {
    Pending(PendingPrefill),
    Done(CompletionJob, Prefilled),
    Failed(CompletionJob, JobError),
}

impl PendingPrefill {
    /// Everything but the computing of `job`'s prompt (a `blend` PML prompt: everything).
    pub fn start(
        runtime: &Runtime,
        schemas: &HashMap<String, LaidOutSchema>,
        prefix_cache: &PrefixCache,
        job: CompletionJob,
    ) -> Advance {
        // Room for the whole answer, so decoding appends in place.
        let reserve = job.params.max_tokens + 1;
        let started = match &job.prompt {
            PromptSource::Pml { source, schema } => {
                stage_pml(runtime, schemas, &job, source, schema, reserve)
            }
            _ => start_plain(runtime, prefix_cache, &job, reserve),
        };
        match started {
            Ok(Started::Pending(work)) => Advance::Pending(Self { job, work }),
            Ok(Started::Done(prefilled)) => Advance::Done(job, prefilled),
            Err(error) => Advance::Failed(job, error),
        }
    }

    /// Prompt tokens still to compute.
    pub fn remaining(&self) -> usize {
        match &self.work {
            Work::Plain { tokens, kv, .. } => tokens.len() - kv.len(),
            Work::Pml { staged, .. } => staged.remaining(),
        }
    }

    /// Computes the next `budget` tokens (at least one); when that ends the prompt, hands back
    /// the prefilled prompt (a plain prompt's new full blocks kept in the prefix cache).
    pub fn advance(self, runtime: &Runtime, prefix_cache: &PrefixCache, budget: usize) -> Advance {
        let Self { job, work } = self;
        let advanced = match work {
            Work::Plain {
                tokens,
                kv,
                cached_tokens,
            } => advance_plain(runtime, prefix_cache, tokens, kv, cached_tokens, budget),
            Work::Pml { staged, all_tokens } => match (*staged).advance(runtime.model(), budget) {
                Ok(Staged::Pending(staged)) => Ok(Started::Pending(Work::Pml {
                    staged: Box::new(staged),
                    all_tokens,
                })),
                Ok(Staged::Ready(prefill)) => Ok(Started::Done(pml_prefilled(prefill, all_tokens))),
                Err(error) => Err(JobError::internal(error)),
            },
        };
        match advanced {
            Ok(Started::Pending(work)) => Advance::Pending(Self { job, work }),
            Ok(Started::Done(prefilled)) => Advance::Done(job, prefilled),
            Err(error) => Advance::Failed(job, error),
        }
    }
}

enum Started {
    Pending(Work),
    Done(Prefilled),
}

fn start_plain(
    runtime: &Runtime,
    prefix_cache: &PrefixCache,
    job: &CompletionJob,
    reserve: usize,
) -> Result<Started, JobError> {
    let tokens = prompt_tokens(runtime, &job.prompt, true)?;
    if tokens.is_empty() {
        return Err(JobError::BadRequest("the prompt is empty".to_string()));
    }
    check_context(runtime, tokens.len(), job)?;
    let spliced = prefix_cache
        .splice(runtime.model(), &tokens, reserve)
        .map_err(JobError::internal)?;
    Ok(Started::Pending(Work::Plain {
        tokens,
        kv: spliced.kv,
        cached_tokens: spliced.cached_tokens,
    }))
}

fn advance_plain(
    runtime: &Runtime,
    prefix_cache: &PrefixCache,
    tokens: Vec<u32>,
    mut kv: KvCache,
    cached_tokens: usize,
    budget: usize,
) -> Result<Started, JobError> {
    let start = kv.len();
    let end = (start + budget.max(1)).min(tokens.len());
    let positions: Vec<u32> = (start as u32..end as u32).collect();
    let logits = runtime
        .model()
        .forward(&tokens[start..end], &positions, &mut kv)
        .map_err(JobError::internal)?;
    if end < tokens.len() {
        return Ok(Started::Pending(Work::Plain {
            tokens,
            kv,
            cached_tokens,
        }));
    }
    // A block that cannot be kept costs the next prompt time, never this answer.
    if let Err(error) = prefix_cache.keep(runtime.model(), &tokens, &kv) {
        tracing::warn!(
            "the prefix cache could not keep a prompt's blocks: {}",
            error_chain(&error)
        );
    }
    let usage = PromptUsage {
        prompt_tokens: tokens.len(),
        cached_tokens,
        new_tokens: tokens.len() - cached_tokens,
        ..PromptUsage::default()
    };
    Ok(Started::Done(Prefilled {
        kv,
        logits,
        all_tokens: tokens,
        usage,
    }))
}

/// Binds a PML prompt to its schema and stages its prefill in the job's mode.
fn stage_pml(
    runtime: &Runtime,
    schemas: &HashMap<String, LaidOutSchema>,
    job: &CompletionJob,
    source: &str,
    schema: &str,
    reserve: usize,
) -> Result<Started, JobError> {
    // Resolved at the HTTP edge; gone since only if deleted in between.
    let schema = schemas
        .get(schema)
        .ok_or_else(|| JobError::UnknownSchema(schema.to_string()))?;
    let bound = runtime
        .bind(schema, source)
        .map_err(|error| runtime_error(error, source))?;
    let all_tokens = SplicePlan::new(&schema.layout, &bound)
        .map_err(JobError::internal)?
        .all_tokens;
    check_context(runtime, all_tokens.len(), job)?;
    match runtime.stage_prefill(&schema.layout, &bound, job.mode, reserve) {
        Ok(Staged::Pending(staged)) => Ok(Started::Pending(Work::Pml {
            staged: Box::new(staged),
            all_tokens,
        })),
        Ok(Staged::Ready(prefill)) => Ok(Started::Done(pml_prefilled(prefill, all_tokens))),
        Err(error) => Err(JobError::internal(error)),
    }
}

fn pml_prefilled(prefill: Prefill, all_tokens: Vec<u32>) -> Prefilled {
    let stats = &prefill.stats;
    Prefilled {
        usage: PromptUsage {
            prompt_tokens: all_tokens.len(),
            cached_tokens: stats.tokens_reused,
            recomputed_tokens: stats.tokens_recomputed,
            new_tokens: stats.tokens_new,
        },
        all_tokens,
        kv: prefill.kv,
        logits: prefill.logits,
    }
}
