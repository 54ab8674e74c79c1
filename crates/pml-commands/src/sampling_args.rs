//! Sampling flags shared by the commands that generate (`pml generate`, `pml run`).

use clap::{Args, ValueEnum};
use pml_engine::generation::speculative::{DEFAULT_DRAFT_P_MIN, MAX_DRAFT};
use pml_engine::generation::{SamplingParams, Speculation};

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = SamplingParams::default().max_tokens)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = SamplingParams::default().temperature)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,
    /// Sample within the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    pub top_p: f32,
    /// Penalty on recently seen tokens (1: none).
    #[arg(long, default_value_t = SamplingParams::default().repetition_penalty)]
    pub repeat_penalty: f32,
    /// Seed of the sampler's random generator.
    #[arg(long, default_value_t = SamplingParams::default().seed)]
    pub seed: u64,
    /// Stop when this string appears (repeatable); the text before it is kept.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[command(flatten)]
    pub speculation: SpeculationArgs,
}

/// Drafting flags, shared by the commands that generate and `pml serve`.
#[derive(Args, Clone, Debug)]
pub struct SpeculationArgs {
    /// How tokens are drafted ahead of the model, to verify several in one pass; the answer is
    /// the same either way. `ngram` looks the answer's last tokens up in the prompt (its
    /// modules included) and the answer so far; `draft` has `--draft-model` decode ahead.
    /// Default: `draft` with a `--draft-model`, else `ngram`, but `off` for `pml serve` (as
    /// llama-server's and vLLM's: with 8 clients its steps are compute-bound and drafts measured
    /// no faster).
    #[arg(long, value_enum)]
    pub speculative: Option<SpeculativeArg>,
    /// Most drafted tokens verified in one pass (the pace picks fewer where they do not pay).
    #[arg(long, default_value_t = MAX_DRAFT)]
    pub draft_max: usize,
    #[command(flatten)]
    pub draft: DraftModelArgs,
    /// The draft model stops before a token it gives less probability than this (llama.cpp's
    /// `--draft-p-min`).
    #[arg(long, value_name = "P", default_value_t = DEFAULT_DRAFT_P_MIN)]
    pub draft_p_min: f32,
}

/// `--draft-model`: shared by the commands that decode and `pmlc compile`.
#[derive(Args, Clone, Debug, Default)]
pub struct DraftModelArgs {
    /// A smaller model with the model's tokenizer that drafts tokens for it (e.g.
    /// `qwen2.5-0.5b` for `qwen2.5-1.5b`): an id or a GGUF path. Its module states are its
    /// own: `pmlc compile --draft-model` encodes the schemas for it too (else `pml run` does
    /// on first use).
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
}

impl SpeculationArgs {
    /// The flags' speculation; when `--speculative` is not given, `draft` with a draft model,
    /// else `default`.
    pub fn speculation(&self, default: SpeculativeArg) -> Speculation {
        let default = match self.draft.draft_model {
            Some(_) => SpeculativeArg::Draft,
            None => default,
        };
        match self.speculative.unwrap_or(default) {
            SpeculativeArg::Off => Speculation::Off,
            SpeculativeArg::Ngram => Speculation::Ngram {
                max_draft: self.draft_max,
                min_match: 1,
            },
            SpeculativeArg::Draft => Speculation::Draft {
                max_draft: self.draft_max,
                p_min: self.draft_p_min,
            },
        }
    }

    /// Refuses numbers out of range, and `--speculative draft` without a `--draft-model`.
    pub fn check(&self) -> Result<(), String> {
        if self.speculative == Some(SpeculativeArg::Draft) && self.draft.draft_model.is_none() {
            return Err(
                "`--speculative draft` needs a `--draft-model` (e.g. `--draft-model \
                 qwen2.5-0.5b` for `qwen2.5-1.5b`)"
                    .into(),
            );
        }
        self.speculation(SpeculativeArg::Ngram)
            .validate()
            .map_err(|error| format!("{error} (`--draft-max`, `--draft-p-min`)"))
    }
}

/// `--speculative`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpeculativeArg {
    Ngram,
    Draft,
    Off,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            speculation: self.speculation.speculation(SpeculativeArg::Ngram),
            ..SamplingParams::default()
        }
    }
}
