//! A plain prompt's prefill (a completion's text or a chat without a schema), in chunks: started
//! at admission (tokenized, checked against the context, its longest cached prefix spliced from
//! the prefix cache), then advanced by at most the step's token budget at a time, so a long
//! prompt never holds the engine longer than one chunk: running streams decode in between, and a
//! client that leaves or a shutdown is noticed between chunks.

use pml_engine::kv_cache::KvCache;
use pml_runtime::inference::{PrefixCache, Runtime};

use super::sequence::{Prefilled, check_context, prompt_tokens};
use super::{CompletionJob, JobError, PromptSource, PromptUsage};

/// A plain prompt part way through its prefill.
pub struct PendingPrefill {
    pub job: CompletionJob,
    tokens: Vec<u32>,
    /// Holds the prompt's first `kv.len()` tokens; room for the rest and the answer.
    kv: KvCache,
    cached_tokens: usize,
}

/// Where a prefill stands after a chunk.
pub enum Advance {
    Pending(PendingPrefill),
    Done(CompletionJob, Prefilled),
    Failed(CompletionJob, JobError),
}

impl PendingPrefill {
    /// Tokenizes `job`'s prompt, refuses it when it cannot fit the context, and splices its
    /// longest cached prefix: everything but the computing.
    pub fn start(
        runtime: &Runtime,
        prefix_cache: &PrefixCache,
        job: CompletionJob,
    ) -> Result<Self, Box<(CompletionJob, JobError)>> {
        let started = (|| {
            if matches!(job.prompt, PromptSource::Pml(_)) {
                return Err(JobError::Internal(
                    "a PML prompt is not prefilled in chunks".to_string(),
                ));
            }
            let tokens = prompt_tokens(runtime, &job.prompt, true)?;
            if tokens.is_empty() {
                return Err(JobError::BadRequest("the prompt is empty".to_string()));
            }
            check_context(runtime, tokens.len(), &job)?;
            // Room for the whole answer, so decoding appends in place.
            let spliced = prefix_cache
                .splice(runtime.model(), &tokens, job.params.max_tokens + 1)
                .map_err(|error| JobError::Internal(error.to_string()))?;
            Ok((tokens, spliced))
        })();
        match started {
            Ok((tokens, spliced)) => Ok(Self {
                job,
                tokens,
                kv: spliced.kv,
                cached_tokens: spliced.cached_tokens,
            }),
            Err(error) => Err(Box::new((job, error))),
        }
    }

    /// Prompt tokens still to compute.
    pub fn remaining(&self) -> usize {
        self.tokens.len() - self.kv.len()
    }

    /// Computes the next `budget` tokens (at least one); when that ends the prompt, keeps its
    /// new full blocks in the prefix cache and hands back the prefilled prompt.
    pub fn advance(
        mut self,
        runtime: &Runtime,
        prefix_cache: &PrefixCache,
        budget: usize,
    ) -> Advance {
        let start = self.kv.len();
        let end = (start + budget.max(1)).min(self.tokens.len());
        let positions: Vec<u32> = (start as u32..end as u32).collect();
        let logits =
            match runtime
                .model()
                .forward(&self.tokens[start..end], &positions, &mut self.kv)
            {
                Ok(logits) => logits,
                Err(error) => {
                    return Advance::Failed(self.job, JobError::Internal(error.to_string()));
                }
            };
        if end < self.tokens.len() {
            return Advance::Pending(self);
        }
        // A block that cannot be kept costs the next prompt time, never this answer.
        let _ = prefix_cache.keep(runtime.model(), &self.tokens, &self.kv);
        let usage = PromptUsage {
            prompt_tokens: self.tokens.len(),
            cached_tokens: self.cached_tokens,
            new_tokens: self.tokens.len() - self.cached_tokens,
            ..PromptUsage::default()
        };
        Advance::Done(
            self.job,
            Prefilled {
                kv: self.kv,
                logits,
                all_tokens: self.tokens,
                usage,
            },
        )
    }
}
