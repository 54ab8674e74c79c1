//! Cached inference: running a prompt bound to a laid-out schema
//! ([`BoundPrompt`](pml_compiler::plan::BoundPrompt)) with the modules' stored KV.
//!
//! - Mode [`InferenceMode::Reuse`] (Prompt Cache): splice the imported units' cached rows in
//!   position order, compute only the new tokens ([`reuse`]).
//! - Mode [`InferenceMode::Blend`] (CacheBlend): splice as `reuse` does, then recompute the
//!   cached tokens whose KV deviates most together with the new ones ([`blend`]); from a slow
//!   tier the cached layers stream in while the recompute runs (`layer_feed`), and with
//!   `--recompute auto` the loading controller picks the fraction ([`controller`]).
//! - Mode [`InferenceMode::Full`]: the identical token/position sequence prefilled with no cache,
//!   the reference every other mode is measured against ([`full`]).
//!
//! All produce a [`Prefill`] (the KV cache and the last prompt token's logits); [`generate`] hands
//! it to the shared decoding loop, so TTFT includes store loads and splicing. [`session`] wraps a
//! model, tokenizer, chat template and store into the API the CLI calls, and refuses a prompt
//! its model's context cannot hold before computing anything ([`context_limit`]).

pub mod blend;
pub mod blend_options;
pub mod budgeted_decode;
pub mod context_limit;
pub mod controller;
pub mod edit;
pub mod fidelity;
pub mod full;
mod layer_feed;
pub mod model_load;
pub mod plan;
pub mod prefix_cache;
pub mod prefix_edit;
pub mod previous_layout;
pub mod reuse;
pub mod session;
pub mod staged;
pub mod stats;

use std::fmt;
use std::str::FromStr;

use candle_core::Tensor;

use crate::encode::{EncodeError, UnitEncoder};
use crate::layer_stream::LayerError;
use pml_engine::generation::speculative::DraftModel;
use pml_engine::generation::{GenerateError, Generation, Generator, SamplingParams};
use pml_engine::kv_cache::{KvCache, KvCacheError};
use pml_engine::model::{EngineError, Model};

use crate::kv_budget::{HeavyHitters, KvBudget};

pub use crate::attention_mass::{AttentionMass, MassWeighting};
pub use blend_options::{
    BlendOptions, DeclaredCosts, Deviation, HEAD_ROWS, Pipelining, Ratio, Selection, ValueError,
};
pub use context_limit::{ContextError, PromptByteLimit};
pub use controller::{LayerCosts, RatioChoice, RemainingWork, Shortcut, choose_ratio};
pub use fidelity::{FidelityEstimate, GuardFired};
pub use model_load::load_model_and_tokenizer;
pub use plan::{PlannedSpan, SplicePlan};
pub use pml_compiler::LaidOutSchema;
pub use prefix_cache::{BLOCK_TOKENS, PrefixCache, PrefixCacheError, SplicedPrefix};
pub use session::{Runtime, RuntimeError, RuntimeOptions};
pub use staged::{Staged, StagedChunk, StagedPrefill};
pub use stats::{PipelineStats, PrefillStats, RunStats};

/// Decoding slots allocated with the spliced cache; longer answers grow it geometrically, so a
/// huge `max_tokens` never allocates up front.
const MAX_RESERVED_SLOTS: usize = 2048;

/// How a bound prompt's prefill is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InferenceMode {
    /// Splice cached module KV and compute only the new tokens.
    #[default]
    Reuse,
    /// Splice, then recompute the most deviating cached tokens with the new ones.
    Blend(BlendOptions),
    /// Compute every token with no cache (the reference).
    Full,
}

impl InferenceMode {
    pub fn name(self) -> &'static str {
        match self {
            InferenceMode::Reuse => "reuse",
            InferenceMode::Blend(_) => "blend",
            InferenceMode::Full => "full",
        }
    }
}

impl fmt::Display for InferenceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InferenceMode::Blend(options) => write!(f, "blend ({options})"),
            other => f.write_str(other.name()),
        }
    }
}

impl FromStr for InferenceMode {
    type Err = ValueError;

    fn from_str(text: &str) -> Result<Self, ValueError> {
        match text {
            "reuse" => Ok(InferenceMode::Reuse),
            "full" => Ok(InferenceMode::Full),
            "blend" => Ok(InferenceMode::Blend(BlendOptions::default())),
            other => Err(ValueError::new(
                other,
                "a mode (`reuse`, `blend` or `full`)",
            )),
        }
    }
}

/// Why cached inference failed.
#[derive(Debug, thiserror::Error)]
pub enum InferenceError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error(transparent)]
    Generate(Box<GenerateError>),
    #[error("invalid bound prompt: {0}")]
    InvalidPrompt(String),
    #[error("invalid inference options: {0}")]
    InvalidOptions(String),
    #[error("pipelined load failed: {0}")]
    Layer(#[from] LayerError),
    /// The prompt and its answer do not fit the model's context; nothing was computed.
    #[error(transparent)]
    Context(#[from] ContextError),
}

impl From<EngineError> for InferenceError {
    fn from(error: EngineError) -> Self {
        InferenceError::Engine(Box::new(error))
    }
}

impl From<candle_core::Error> for InferenceError {
    fn from(error: candle_core::Error) -> Self {
        InferenceError::Engine(Box::new(EngineError::Tensor(error)))
    }
}

impl From<KvCacheError> for InferenceError {
    fn from(error: KvCacheError) -> Self {
        InferenceError::Engine(Box::new(EngineError::KvCache(error)))
    }
}

/// A prompt's prefill: the KV cache holding every prompt token and the last one's logits.
#[derive(Clone, Debug)]
pub struct Prefill {
    pub kv: KvCache,
    /// `(vocab_size,)` logits of the prompt's last token (the highest position).
    pub logits: Tensor,
    pub stats: PrefillStats,
}

/// The prefill of `plan` in `mode`, leaving room for `reserve` decoded tokens.
pub fn prefill(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    mode: InferenceMode,
    reserve: usize,
) -> Result<Prefill, InferenceError> {
    match mode {
        InferenceMode::Reuse => reuse::prefill_reuse(model, encoder, plan, reserve),
        InferenceMode::Blend(options) => {
            blend::prefill_blend(model, encoder, plan, &options, reserve)
        }
        InferenceMode::Full => full::prefill_full(model, plan, reserve),
    }
}

/// `budget`, unless the prompt and its answer never reach it (then it changes nothing).
fn acting_budget(
    plan: &SplicePlan,
    params: &SamplingParams,
    budget: Option<KvBudget>,
) -> Option<KvBudget> {
    budget.filter(|budget| plan.all_tokens.len() + params.max_tokens + 1 > budget.slots)
}

/// Decoding slots [`generate`] allocates with the prompt's cache (`budget` as
/// [`acting_budget`] leaves it).
fn decode_reserve(plan: &SplicePlan, params: &SamplingParams, budget: Option<KvBudget>) -> usize {
    let reserve = match budget {
        Some(budget) => budget.slots.saturating_sub(plan.all_tokens.len()),
        None => params.max_tokens,
    };
    reserve.min(MAX_RESERVED_SLOTS)
}

/// Slots of the cache [`generate`] builds for `plan` (when the plan keeps every cached row)
/// and how many of them the prompt fills.
pub(super) fn cache_slots(
    plan: &SplicePlan,
    params: &SamplingParams,
    budget: Option<KvBudget>,
) -> (usize, usize) {
    let reserve = decode_reserve(plan, params, acting_budget(plan, params, budget));
    (plan.all_tokens.len() + reserve, plan.all_tokens.len())
}

/// A draft model and the encoder of its own module states: its prefill of a prompt splices
/// them as the target's does.
pub struct DraftPrefill<'a> {
    pub model: &'a Model,
    pub encoder: UnitEncoder<'a>,
}

/// Runs `plan` (a bound prompt resolved against the encoder's layout) in `mode` and generates
/// the answer, streaming text to `on_text`. Decoding continues at one past the prompt's highest
/// position; with `budget`, within that many KV slots ([`budgeted_decode`]).
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &Model,
    tokenizer: &dyn pml_engine::Tokenizer,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    mode: InferenceMode,
    params: &SamplingParams,
    budget: Option<KvBudget>,
    draft: Option<DraftPrefill<'_>>,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generation, RunStats), InferenceError> {
    let budget = acting_budget(plan, params, budget);
    let mut prefill_stats = None;
    let mut kv = model.new_kv_cache()?;
    let mut hitters: Option<HeavyHitters> = None;
    let generator = Generator::new(model, tokenizer);
    let prefill_step = |kv: &mut KvCache| {
        let reserve = decode_reserve(plan, params, budget);
        let prefill = prefill(model, encoder, plan, mode, reserve)
            .map_err(|error| GenerateError::Prefill(Box::new(error)))?;
        *kv = prefill.kv;
        prefill_stats = Some(prefill.stats);
        Ok(prefill.logits)
    };
    // Within a KV budget each step is the budget's own pass of one token, so nothing is drafted.
    let generated = match (budget, draft) {
        (None, None) => {
            generator.generate_after(&mut kv, &plan.all_tokens, params, on_text, prefill_step)
        }
        (
            None,
            Some(DraftPrefill {
                model: draft,
                mut encoder,
            }),
        ) => {
            let reserve = decode_reserve(plan, params, None);
            let draft = DraftModel {
                model: draft,
                prefill: Box::new(move |_| {
                    Ok(prefill(draft, &mut encoder, plan, mode, reserve)
                        .map_err(|error| GenerateError::Prefill(Box::new(error)))?
                        .kv)
                }),
                kept: None,
            };
            generator.generate_after_with_draft(
                &mut kv,
                &plan.all_tokens,
                params,
                on_text,
                prefill_step,
                Some(draft),
            )
        }
        (Some(budget), _) => generator.generate_stepped(
            &mut kv,
            &plan.all_tokens,
            params,
            on_text,
            prefill_step,
            |kv, token, position| {
                let hitters = match &mut hitters {
                    Some(hitters) => hitters,
                    empty => empty.insert(budgeted_decode::hitters_after_prefill(
                        model, plan, kv, budget, position,
                    )?),
                };
                Ok(hitters.step(model, token, kv)?)
            },
        ),
    };
    let generation = match generated {
        Ok(generation) => generation,
        Err(GenerateError::Prefill(error)) => {
            return Err(match error.downcast::<InferenceError>() {
                Ok(error) => *error,
                Err(other) => InferenceError::Generate(Box::new(GenerateError::Prefill(other))),
            });
        }
        Err(error) => return Err(InferenceError::Generate(Box::new(error))),
    };
    let prefill = prefill_stats.ok_or_else(|| {
        InferenceError::InvalidPrompt("generation finished without a prefill".into())
    })?;
    // No decoding step ran (the first token ended the answer): the budget never acted.
    let kv_budget =
        budget
            .zip(hitters.as_ref())
            .map(|(budget, hitters)| budgeted_decode::BudgetReport {
                budget,
                evicted: hitters.evicted(),
                held: kv.len(),
            });
    let stats = RunStats {
        prefill,
        kv_budget,
        time_to_first_token: generation.timings.time_to_first_token,
        tokens_generated: generation.token_ids.len(),
        decode_ms_per_token: generation.timings.decode_ms_per_token(),
        speculation: generation.speculation,
    };
    Ok((generation, stats))
}
