//! Sampling flags shared by the commands that generate (`pml generate`, `pml run`).

use clap::{Args, ValueEnum};
use pml_engine::generation::speculative::MAX_DRAFT;
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
    /// How tokens are drafted ahead of the model: `ngram` looks the answer's last tokens up in
    /// the prompt (its modules included) and the answer so far, and verifies what followed them
    /// in the step's pass; the answer is the same either way. Default: `ngram`, but `off` for
    /// `pml serve` (with 8 clients its steps are compute-bound and drafts measured slower).
    #[arg(long, value_enum)]
    pub speculative: Option<SpeculativeArg>,
    /// Most drafted tokens verified in one pass (the pace picks fewer where they do not pay).
    #[arg(long, default_value_t = MAX_DRAFT)]
    pub draft_max: usize,
}

impl SpeculationArgs {
    /// The flags' speculation, `default` when `--speculative` is not given.
    pub fn speculation(&self, default: SpeculativeArg) -> Speculation {
        match self.speculative.unwrap_or(default) {
            SpeculativeArg::Off => Speculation::Off,
            SpeculativeArg::Ngram => Speculation::Ngram {
                max_draft: self.draft_max,
                min_match: 1,
            },
        }
    }
}

/// `--speculative`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SpeculativeArg {
    Ngram,
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
