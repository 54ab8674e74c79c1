//! Sampling flags shared by the commands that generate (`pml generate`, `pml run`).

use clap::Args;
use pml_engine::generation::SamplingParams;

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
            ..SamplingParams::default()
        }
    }
}
