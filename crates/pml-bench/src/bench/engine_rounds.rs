//! What `pml bench engine` measures, before any summary: one process's figures per engine and
//! prompt size, and every round's of one size. A module of their own so that the report depends
//! on the figures it summarises, not on the code that takes them.

use serde::{Deserialize, Serialize};

/// One engine, one prompt size, one process.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Measurement {
    pub load_s: f64,
    pub prefill_s: f64,
    pub ttft_s: f64,
    pub decode_ms_per_token: f64,
    /// The same decode through `pml run`'s generation loop (PML only; llama.cpp's side has none).
    #[serde(default)]
    pub run_decode_ms_per_token: Option<f64>,
    pub peak_rss_bytes: u64,
}

/// Every round's measurements of one prompt size.
#[derive(Clone, Debug)]
pub struct SizeResult {
    pub tokens: usize,
    pub pml: Vec<Measurement>,
    pub llama: Vec<Measurement>,
}

impl SizeResult {
    pub fn new(tokens: usize) -> Self {
        Self {
            tokens,
            pml: Vec::new(),
            llama: Vec::new(),
        }
    }
}
