//! The forward context: which position each token of a call is at and which KV slot it
//! occupies, plus the options and output of a whole-model call. Positions travel per token,
//! never as one offset for the batch, because spliced prompts have gaps and shared positions.

use candle_core::Tensor;

use super::EngineError;
use crate::kv_cache::KvCache;

/// Positions and KV slots of the tokens of one call, row `i` describing token `i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardContext {
    positions: Vec<u32>,
    slots: Vec<usize>,
}

impl ForwardContext {
    /// Slots below the cache's length are overwritten; the others must continue it in order
    /// (checked when the cache is written).
    pub fn new(positions: Vec<u32>, slots: Vec<usize>) -> Result<Self, EngineError> {
        if positions.len() != slots.len() {
            return Err(EngineError::InvalidInput(format!(
                "{} positions for {} slots",
                positions.len(),
                slots.len()
            )));
        }
        Ok(Self { positions, slots })
    }

    /// Tokens that follow everything already in `kv`, in new slots.
    pub fn appending(positions: Vec<u32>, kv: &KvCache) -> Self {
        let first_slot = kv.len();
        let slots = (first_slot..first_slot + positions.len()).collect();
        Self { positions, slots }
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    pub fn slots(&self) -> &[usize] {
        &self.slots
    }

    /// The context of rows `rows` only (e.g. the tokens selected for recompute).
    pub fn select(&self, rows: &[usize]) -> Result<Self, EngineError> {
        if let Some(&row) = rows.iter().find(|&&row| row >= self.len()) {
            return Err(EngineError::InvalidInput(format!(
                "row {row} of a context of {} tokens",
                self.len()
            )));
        }
        Ok(Self {
            positions: rows.iter().map(|&row| self.positions[row]).collect(),
            slots: rows.iter().map(|&row| self.slots[row]).collect(),
        })
    }
}

/// Which rows of a call get logits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LogitRows {
    None,
    /// The last token only: what generation needs.
    #[default]
    Last,
    All,
    Rows(Vec<usize>),
}

/// Options of [`super::Model::forward_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardOptions {
    pub logits: LogitRows,
    /// Keep each layer's input hidden states (what a hidden-state store saves).
    pub keep_layer_inputs: bool,
}

/// What a whole-model call returns.
#[derive(Clone, Debug)]
pub struct ForwardOutput {
    /// `(n_rows, vocab_size)` f32 for the rows asked for; `None` for [`LogitRows::None`].
    pub logits: Option<Tensor>,
    /// Input of every layer, `(n_tokens, d_model)` each, when asked for.
    pub layer_inputs: Vec<Tensor>,
    /// Output of the last layer, before the final norm, `(n_tokens, d_model)`.
    pub hidden: Tensor,
}
