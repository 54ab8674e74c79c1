//! What `pml bench cache --peer` measures, before any summary: llama.cpp's setup, each round of
//! both engines and every round of one document prompt. A module of their own so that the report
//! depends on the figures it summarises, not on the code that takes them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use pml_commands::run_command::RunJson;

/// The llama.cpp script's account of its setup, printed before the rounds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaReady {
    pub load_s: f64,
    pub prefix_tokens: usize,
    pub question_tokens: usize,
    /// The whole prompt prefilled without a cache, to the greedy first token (once).
    pub full_ttft_s: f64,
    pub full_first_token: u32,
    /// The prefix alone, whose state the rounds restore.
    pub prefix_prefill_s: f64,
    pub state_bytes: u64,
    pub threads: usize,
}

/// One round of the llama.cpp script.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaRound {
    /// `llama_state_set_data` from RAM + the question's tokens + the greedy first token.
    pub ttft_s: f64,
    pub restore_s: f64,
    pub eval_s: f64,
    pub first_token: u32,
    /// The same through llama-cpp-python's `Llama.load_state` (which also copies its numpy
    /// logits buffers).
    pub wrapper_ttft_s: f64,
    pub wrapper_restore_s: f64,
    pub wrapper_first_token: u32,
}

/// One fresh `pml run --mode reuse` process.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PmlRound {
    /// The run's TTFT: store read + splice + the new tokens + first sample.
    pub ttft_ms: f64,
    pub load_ms: f64,
    pub splice_ms: f64,
    pub compute_ms: f64,
    /// Loading the model before the run (not in the TTFT).
    pub model_load_ms: f64,
    /// The whole process, start to exit.
    pub wall_ms: f64,
    /// `None` when the answer ended at once (end-of-turn as first token).
    pub first_token: Option<u32>,
}

impl PmlRound {
    pub fn new(run: &RunJson, wall: Duration) -> Self {
        Self {
            ttft_ms: run.ttft_ms,
            load_ms: run.load_ms,
            splice_ms: run.splice_ms,
            compute_ms: run.compute_ms,
            model_load_ms: run.model_load_ms,
            wall_ms: wall.as_secs_f64() * 1e3,
            first_token: run.token_ids.first().copied(),
        }
    }
}

/// Both engines in one round.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PeerRound {
    pub pml_first: bool,
    pub pml: PmlRound,
    pub llama: LlamaRound,
    /// The 1-minute load average right after the round.
    pub load_average_1min: f64,
}

/// Every round of one document prompt.
#[derive(Clone, Debug, Serialize)]
pub struct PeerSize {
    pub prompt: String,
    pub prefix_tokens: usize,
    pub question_tokens: usize,
    pub llama_ready: LlamaReady,
    pub rounds: Vec<PeerRound>,
    /// Load averages (1, 5, 15 minutes) before llama.cpp's setup and after the last round.
    pub load_before: [f64; 3],
    pub load_after: [f64; 3],
}
