//! A prompt's prefill, in chunks: prepared at admission — a plain prompt tokenized, a PML prompt
//! bound to its schema, either checked against the context, which tells the KV its sequences
//! reserve — then started once the reservation fits — a plain prompt's longest cached prefix
//! spliced from the prefix cache, a PML prompt's cached modules spliced in its mode (mode
//! `blend` runs whole there: its layer-wise recompute is one pass) — then advanced by at most the
//! step's tokens at a time, so a long prompt never holds the engine longer than one chunk: running
//! streams decode in between, and a client that leaves or a shutdown is noticed between chunks.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use candle_core::Tensor;
use pml_compiler::plan::BoundPrompt;
use pml_engine::kv_cache::KvCache;
use pml_runtime::inference::{
    BlendOptions, LaidOutSchema, Prefill, PrefixCache, Ratio, Runtime, SplicePlan, Staged,
    StagedPrefill,
};
use pml_runtime::kv_budget::{HeavyHitters, KvBudget};

use super::prompt_rows::{PromptRows, RowKind};
use super::sequence::{Prefilled, check_context, prompt_tokens, reserved_slots, runtime_error};
use super::{CompletionJob, JobError, PromptSource, PromptUsage};
use crate::incident::{Incident, error_chain};

/// Prompt tokens computed per step, across all prefilling prompts: about 0.8 s of the default
/// model on two cores, so running streams get a token at least that often during a long prefill
/// and a cancelled one frees the engine within that.
pub const PREFILL_CHUNK_TOKENS: usize = 128;

/// A prompt part way through its prefill.
pub struct PendingPrefill {
    pub job: CompletionJob,
    /// KV slots each of the job's sequences reserves ([`reserved_slots`]).
    pub slots: usize,
    work: Work,
}

/// A job whose prompt is tokenized (or bound) and checked, not yet started.
pub struct Prepared {
    pub job: CompletionJob,
    /// KV slots each of the job's sequences reserves ([`reserved_slots`]).
    pub slots: usize,
    prompt: PreparedPrompt,
}

enum PreparedPrompt {
    Plain(Vec<u32>),
    Pml {
        schema: String,
        bound: Box<BoundPrompt>,
        rows: PromptRows,
        /// One past the highest position its tokens take.
        positions: usize,
    },
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
        rows: PromptRows,
    },
    /// A plain prompt computed within its KV budget, in chunks of its own passes (each observes
    /// the attention the heavy-hitter scores sum), evicting as it goes; it neither reads nor
    /// keeps prefix-cache blocks, whose rows would not be what it holds.
    Budgeted {
        tokens: Vec<u32>,
        /// Prompt tokens computed so far (the cache holds fewer once it evicts).
        done: usize,
        kv: KvCache,
        hitters: Box<HeavyHitters>,
    },
}

/// Where a prefill stands after admission or a chunk.
pub enum Advance {
    Pending(PendingPrefill),
    Done(CompletionJob, Prefilled),
    Failed(CompletionJob, JobError),
}

impl Prepared {
    /// Tokenizes (or binds) `job`'s prompt and checks it against the model's context.
    pub fn new(
        runtime: &Runtime,
        schemas: &HashMap<String, LaidOutSchema>,
        job: CompletionJob,
    ) -> Result<Self, Box<(CompletionJob, JobError)>> {
        let prompt =
            match &job.prompt {
                PromptSource::Pml { source, schema } => bind_pml(runtime, schemas, source, schema)
                    .map(|(bound, rows, positions)| PreparedPrompt::Pml {
                        schema: schema.clone(),
                        bound: Box::new(bound),
                        rows,
                        positions,
                    }),
                _ => prompt_tokens(runtime, &job.prompt, true).and_then(|tokens| {
                    if tokens.is_empty() {
                        Err(JobError::BadRequest("the prompt is empty".to_string()))
                    } else {
                        Ok(PreparedPrompt::Plain(tokens))
                    }
                }),
            };
        let prompt = match prompt {
            Ok(prompt) => prompt,
            Err(error) => return Err(Box::new((job, error))),
        };
        let (prompt_len, positions) = match &prompt {
            PreparedPrompt::Plain(tokens) => (tokens.len(), tokens.len()),
            PreparedPrompt::Pml {
                rows, positions, ..
            } => (rows.tokens.len(), *positions),
        };
        let mut job = job;
        if let Err(error) = check_context(runtime, positions, &mut job) {
            return Err(Box::new((job, error)));
        }
        let whole = reserved_slots(prompt_len, &job);
        // A budget the prompt and answer never reach changes nothing: the prompt then runs as
        // any other (batched, prefix-cached).
        job.kv_budget = job
            .kv_budget
            .filter(|budget| matches!(prompt, PreparedPrompt::Plain(_)) && whole > budget.slots);
        Ok(Self {
            slots: job.kv_budget.map_or(whole, |budget| budget.slots),
            job,
            prompt,
        })
    }

    /// An open-ended answer cut so each of the job's sequences reserves at most `max_slots`
    /// (what the KV pool can ever hold), where the prompt leaves room for one token or more.
    pub fn fit_pool(&mut self, max_slots: usize) {
        if self.slots <= max_slots || self.job.kv_budget.is_some() {
            return;
        }
        let prompt_slots = self.slots - self.job.params.max_tokens - 1;
        if max_slots > prompt_slots + 1 {
            self.job.fit_answer(max_slots - prompt_slots - 1);
            self.slots = reserved_slots(prompt_slots, &self.job);
        }
    }

    /// Within `budget` instead (the pool's pressure valve): a plain prompt whose reservation is
    /// larger takes the budget and reserves only its slots; false where it cannot (a PML
    /// prompt) or it would not reserve less.
    pub fn impose_budget(&mut self, budget: KvBudget) -> bool {
        if !matches!(self.prompt, PreparedPrompt::Plain(_)) || budget.slots >= self.slots {
            return false;
        }
        self.job.kv_budget = Some(budget);
        self.slots = budget.slots;
        true
    }

    /// Everything but the computing of the prompt (a `blend` PML prompt: everything).
    pub fn start(
        self,
        runtime: &Runtime,
        schemas: &HashMap<String, LaidOutSchema>,
        prefix_cache: &PrefixCache,
        edit_reuse: Option<&BlendOptions>,
    ) -> Advance {
        let Self { job, slots, prompt } = self;
        // Room for the whole answer, so decoding appends in place.
        let reserve = job.params.max_tokens + 1;
        let started = match (prompt, job.kv_budget) {
            (PreparedPrompt::Plain(tokens), Some(budget)) => {
                start_budgeted(runtime, tokens, budget)
            }
            (PreparedPrompt::Plain(tokens), None) => {
                start_plain(runtime, prefix_cache, tokens, reserve, slots, edit_reuse)
            }
            (
                PreparedPrompt::Pml {
                    schema,
                    bound,
                    rows,
                    ..
                },
                _,
            ) => stage_pml(runtime, schemas, &job, &schema, &bound, rows, reserve),
        };
        Advance::of(job, slots, started)
    }
}

/// A prompt's next chunk, lent to the step's pass ([`PendingPrefill::chunk`]): its tokens, their
/// positions (a plain prompt's counted from its start, a PML prompt's as laid out) and its cache.
pub struct PromptChunk<'p> {
    pub tokens: &'p [u32],
    pub positions: Cow<'p, [u32]>,
    pub kv: &'p mut KvCache,
}

impl PendingPrefill {
    /// A plain prompt takes the blocks another prompt with the same start kept in the prefix
    /// cache since this one began (eight chats with one system prompt arriving together compute
    /// it once, not eight times). A failed lookup only costs the computing it would have saved.
    pub fn catch_up(&mut self, runtime: &Runtime, prefix_cache: &PrefixCache) {
        let reserve = self.job.params.max_tokens + 1;
        let Work::Plain {
            tokens,
            kv,
            cached_tokens,
        } = &mut self.work
        else {
            return;
        };
        match prefix_cache.catch_up(runtime.model(), tokens, kv, reserve, PREFILL_CHUNK_TOKENS) {
            Ok(Some(cached)) => {
                kv.limit_rows(self.slots);
                *cached_tokens = cached;
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(
                "the prefix cache could not be read for a prompt part way through: {}",
                error_chain(&error)
            ),
        }
    }

    /// Whether the prompt's chunks join the step's one pass (all but a budgeted prompt's,
    /// whose passes observe its attention).
    pub fn joins_batch(&self) -> bool {
        !matches!(self.work, Work::Budgeted { .. })
    }

    /// The prompt's next chunk of at most `step_tokens` tokens, for the step's pass that runs
    /// it with the other sequences' rows ([`pml_engine::model::BatchSlot`]); `None` for a
    /// budgeted prompt, whose chunks run passes of their own ([`Self::advance_alone`]). Once
    /// the pass has written the chunk into the cache, [`Self::after_batched_chunk`] takes its
    /// last token's logits.
    pub fn chunk(&mut self, step_tokens: usize) -> Option<PromptChunk<'_>> {
        match &mut self.work {
            Work::Plain { tokens, kv, .. } => {
                let (start, end) = chunk_range(tokens, kv, step_tokens);
                Some(PromptChunk {
                    tokens: &tokens[start..end],
                    positions: Cow::Owned((start as u32..end as u32).collect()),
                    kv,
                })
            }
            Work::Pml { staged, .. } => {
                let chunk = staged.chunk(step_tokens);
                Some(PromptChunk {
                    tokens: chunk.tokens,
                    positions: Cow::Borrowed(chunk.positions),
                    kv: chunk.kv,
                })
            }
            Work::Budgeted { .. } => None,
        }
    }

    /// After the step's pass ran [`Self::chunk`] of `step_tokens` in `elapsed`, with `logits`
    /// those of its last token: still pending, or prefilled.
    pub fn after_batched_chunk(
        self,
        runtime: &Runtime,
        prefix_cache: &PrefixCache,
        step_tokens: usize,
        logits: Tensor,
        elapsed: Duration,
    ) -> Advance {
        let Self { job, slots, work } = self;
        let advanced = match work {
            Work::Plain {
                tokens,
                kv,
                cached_tokens,
            } => after_chunk(runtime, prefix_cache, tokens, kv, cached_tokens, logits),
            Work::Pml { staged, rows } => {
                let staged = (*staged).after_chunk(step_tokens, logits, elapsed);
                Ok(pml_started(staged, rows, job.prompt_token_kinds))
            }
            Work::Budgeted { .. } => Err(JobError::Internal(Incident::report(
                "a budgeted prompt's chunk was run in the step's shared pass",
            ))),
        };
        Advance::of(job, slots, advanced)
    }

    /// Bytes the prompt's cache holds so far that `seen` does not name yet
    /// ([`KvCache::resident_bytes`]).
    pub fn resident_bytes(&self, seen: &mut HashSet<(usize, usize)>) -> usize {
        match &self.work {
            Work::Plain { kv, .. } => kv.resident_bytes(seen),
            Work::Pml { staged, .. } => staged.kv().resident_bytes(seen),
            Work::Budgeted { kv, .. } => kv.resident_bytes(seen),
        }
    }

    /// Prompt tokens still to compute.
    pub fn remaining(&self) -> usize {
        match &self.work {
            Work::Plain { tokens, kv, .. } => tokens.len() - kv.len(),
            Work::Pml { staged, .. } => staged.remaining(),
            Work::Budgeted { tokens, done, .. } => tokens.len() - done,
        }
    }

    /// A budgeted prompt's next `step_tokens` tokens (at least one) in a pass of its own, which
    /// observes the attention its heavy-hitter scores sum; when that ends the prompt, hands back
    /// the prefilled prompt. Every other prompt advances in the step's shared pass instead
    /// ([`Self::chunk`]).
    pub fn advance_alone(self, runtime: &Runtime, step_tokens: usize) -> Advance {
        let Self { job, slots, work } = self;
        let advanced = match work {
            Work::Budgeted {
                tokens,
                done,
                kv,
                hitters,
            } => advance_budgeted(runtime, tokens, done, kv, hitters, step_tokens),
            Work::Plain { .. } | Work::Pml { .. } => Err(JobError::Internal(Incident::report(
                "a prompt that joins the step's shared pass was run alone",
            ))),
        };
        Advance::of(job, slots, advanced)
    }
}

impl Advance {
    /// Where `job` stands after its prefill started or advanced with `outcome`.
    fn of(job: CompletionJob, slots: usize, outcome: Result<Started, JobError>) -> Self {
        match outcome {
            Ok(Started::Pending(work)) => Advance::Pending(PendingPrefill { job, slots, work }),
            Ok(Started::Done(prefilled)) => Advance::Done(job, prefilled),
            Err(error) => Advance::Failed(job, error),
        }
    }
}

enum Started {
    Pending(Work),
    Done(Prefilled),
}

/// A plain prompt's cache starts with room for one step's chunk and grows as its prefill goes,
/// up to its reservation (`slots`): a prompt that catches up on another's blocks part way
/// (eight chats with one system prompt) never allocates the rows it will not compute. With
/// `edit_reuse`, a prompt that differs by a few edits from one the cache kept reuses the rows
/// of its unchanged tokens and is prefilled whole in mode `blend` at once
/// ([`PrefixCache::edit_prefill`]).
fn start_plain(
    runtime: &Runtime,
    prefix_cache: &PrefixCache,
    tokens: Vec<u32>,
    reserve: usize,
    slots: usize,
    edit_reuse: Option<&BlendOptions>,
) -> Result<Started, JobError> {
    let mut spliced = prefix_cache
        .splice(runtime.model(), &tokens, reserve, PREFILL_CHUNK_TOKENS)
        .map_err(JobError::internal)?;
    if let Some(options) = edit_reuse {
        let edited = prefix_cache.edit_prefill(
            runtime.model(),
            &tokens,
            spliced.cached_tokens,
            options,
            reserve,
        );
        match edited {
            Ok(Some(prefill)) => {
                let mut prefilled = pml_prefilled(prefill, tokens, None);
                prefilled.kv.limit_rows(slots);
                return Ok(Started::Done(prefilled));
            }
            Ok(None) => {}
            // What it would have saved is computed instead.
            Err(error) => tracing::warn!(
                "edit reuse of a plain prompt failed, computing it: {}",
                error_chain(&error)
            ),
        }
    }
    spliced.kv.limit_rows(slots);
    Ok(Started::Pending(Work::Plain {
        tokens,
        kv: spliced.kv,
        cached_tokens: spliced.cached_tokens,
    }))
}

/// A plain prompt within a KV budget: an empty cache that never holds more than the budget.
fn start_budgeted(
    runtime: &Runtime,
    tokens: Vec<u32>,
    budget: KvBudget,
) -> Result<Started, JobError> {
    let hitters = HeavyHitters::new(budget);
    let kv = hitters
        .new_cache(runtime.model())
        .map_err(JobError::internal)?;
    Ok(Started::Pending(Work::Budgeted {
        tokens,
        done: 0,
        kv,
        hitters: Box::new(hitters),
    }))
}

/// A budgeted prompt's next `step_tokens` tokens (at least one), evicting before them as needed.
fn advance_budgeted(
    runtime: &Runtime,
    tokens: Vec<u32>,
    done: usize,
    mut kv: KvCache,
    mut hitters: Box<HeavyHitters>,
    step_tokens: usize,
) -> Result<Started, JobError> {
    let end = (done + step_tokens.max(1)).min(tokens.len());
    let positions: Vec<u32> = (done as u32..end as u32).collect();
    let logits = hitters
        .forward(runtime.model(), &tokens[done..end], &positions, &mut kv)
        .map_err(JobError::internal)?;
    if end < tokens.len() {
        return Ok(Started::Pending(Work::Budgeted {
            tokens,
            done: end,
            kv,
            hitters,
        }));
    }
    Ok(Started::Done(Prefilled {
        kv,
        logits,
        usage: PromptUsage {
            prompt_tokens: tokens.len(),
            new_tokens: tokens.len(),
            ..PromptUsage::default()
        },
        all_tokens: tokens,
        row_kinds: None,
        hitters: Some(hitters),
        exact: false,
    }))
}

/// The prompt's next chunk of at most `step_tokens` tokens (at least one): its first and end slots.
fn chunk_range(tokens: &[u32], kv: &KvCache, step_tokens: usize) -> (usize, usize) {
    let start = kv.len();
    (start, (start + step_tokens.max(1)).min(tokens.len()))
}

/// After a chunk: the prompt still pending, or (its last chunk, whose last token's `logits` the
/// answer starts from) prefilled, its new full blocks kept in the prefix cache.
fn after_chunk(
    runtime: &Runtime,
    prefix_cache: &PrefixCache,
    tokens: Vec<u32>,
    kv: KvCache,
    cached_tokens: usize,
    logits: Tensor,
) -> Result<Started, JobError> {
    if kv.len() < tokens.len() {
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
        row_kinds: None,
        usage,
        hitters: None,
        exact: true,
    }))
}

/// A PML prompt bound to its schema, every token of it, and one past its highest position.
fn bind_pml(
    runtime: &Runtime,
    schemas: &HashMap<String, LaidOutSchema>,
    source: &str,
    schema: &str,
) -> Result<(BoundPrompt, PromptRows, usize), JobError> {
    runtime
        .check_prompt_bytes(source.len() as u64)
        .map_err(JobError::Context)?;
    let schema = laid_out(schemas, schema)?;
    let bound = runtime
        .bind(schema, source)
        .map_err(|error| runtime_error(error, source))?;
    let plan = SplicePlan::new(&schema.layout, &bound).map_err(JobError::internal)?;
    let positions = plan.positions_taken();
    Ok((bound, PromptRows::of(plan), positions))
}

/// A loaded schema: resolved at the HTTP edge, gone since only if deleted in between.
fn laid_out<'s>(
    schemas: &'s HashMap<String, LaidOutSchema>,
    schema: &str,
) -> Result<&'s LaidOutSchema, JobError> {
    schemas
        .get(schema)
        .ok_or_else(|| JobError::UnknownSchema(schema.to_string()))
}

/// Stages a bound PML prompt's prefill in the job's mode.
fn stage_pml(
    runtime: &Runtime,
    schemas: &HashMap<String, LaidOutSchema>,
    job: &CompletionJob,
    schema: &str,
    bound: &BoundPrompt,
    rows: PromptRows,
    reserve: usize,
) -> Result<Started, JobError> {
    let schema = laid_out(schemas, schema)?;
    let staged = runtime
        .stage_prefill(&schema.layout, bound, job.mode, reserve)
        .map_err(JobError::internal)?;
    Ok(pml_started(staged, rows, job.prompt_token_kinds))
}

/// A PML prompt's staged prefill as the server's: still to compute, or prefilled (with how each
/// token was obtained when its request asked, `with_kinds`).
fn pml_started(staged: Staged, rows: PromptRows, with_kinds: bool) -> Started {
    match staged {
        Staged::Pending(staged) => Started::Pending(Work::Pml {
            staged: Box::new(staged),
            rows,
        }),
        Staged::Ready(prefill) => Started::Done(bound_prefilled(prefill, rows, with_kinds)),
    }
}

/// A PML prompt's prefill as the server's, with how each of its tokens was obtained when its
/// request asked (`with_kinds`).
fn bound_prefilled(prefill: Prefill, rows: PromptRows, with_kinds: bool) -> Prefilled {
    let kinds = with_kinds.then(|| rows.kinds(&prefill.stats));
    pml_prefilled(prefill, rows.tokens, kinds)
}

/// A prefill the runtime computed (a PML prompt's, an edited plain prompt's) as the server's.
fn pml_prefilled(
    prefill: Prefill,
    all_tokens: Vec<u32>,
    row_kinds: Option<Vec<RowKind>>,
) -> Prefilled {
    let stats = &prefill.stats;
    Prefilled {
        usage: PromptUsage {
            prompt_tokens: all_tokens.len(),
            cached_tokens: stats.tokens_reused,
            recomputed_tokens: stats.tokens_recomputed,
            new_tokens: stats.tokens_new,
            estimated_fidelity: stats
                .blend_estimate()
                .and_then(|estimate| Ratio::new(f64::from(estimate.fidelity()))),
            fidelity_guard_fired: stats.guard.is_some(),
            ..PromptUsage::default()
        },
        all_tokens,
        row_kinds,
        kv: prefill.kv,
        logits: prefill.logits,
        hitters: None,
        exact: false,
    }
}
