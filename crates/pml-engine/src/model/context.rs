//! The forward context: which position each token of a call is at and which KV slot it
//! occupies, plus the options and output of a whole-model call. Positions travel per token,
//! never as one offset for the batch, because spliced prompts have gaps and shared positions.

use std::sync::{Mutex, PoisonError};

use candle_core::{Device, Tensor};

use super::EngineError;
use super::rope::{RotaryEmbedding, RotaryTables, positions_as_offsets};
use crate::kv_cache::KvCache;

/// Positions and KV slots of the tokens of one call, row `i` describing token `i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForwardContext {
    positions: Vec<u32>,
    slots: Vec<usize>,
    rope: RopeMemo,
}

/// The RoPE tables of a context's positions, made once per distinct RoPE (one for most models,
/// a local and a global one for Gemma 3) and shared by every layer. A memo, not state: clones
/// start empty and it never takes part in equality.
#[derive(Debug, Default)]
struct RopeMemo(Mutex<Vec<(RotaryEmbedding, RotaryTables)>>);

impl Clone for RopeMemo {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for RopeMemo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RopeMemo {}

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
        Ok(Self {
            positions,
            slots,
            rope: RopeMemo::default(),
        })
    }

    /// Tokens that follow everything already in `kv`, in new slots.
    pub fn appending(positions: Vec<u32>, kv: &KvCache) -> Self {
        let first_slot = kv.len();
        let slots = (first_slot..first_slot + positions.len()).collect();
        Self {
            positions,
            slots,
            rope: RopeMemo::default(),
        }
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
            rope: RopeMemo::default(),
        })
    }

    /// `rope`'s tables for these positions on `device`, made on the first call for that RoPE.
    pub(crate) fn rope_tables(
        &self,
        rope: &RotaryEmbedding,
        device: &Device,
    ) -> Result<RotaryTables, EngineError> {
        let mut memo = self.rope.0.lock().unwrap_or_else(PoisonError::into_inner);
        let made = memo
            .iter()
            .find(|(seen, tables)| seen == rope && tables.device().same_device(device));
        if let Some((_, tables)) = made {
            return Ok(tables.clone());
        }
        let tables = rope.tables(&positions_as_offsets(&self.positions), device)?;
        memo.push((rope.clone(), tables.clone()));
        Ok(tables)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rope::RotaryEmbedding;

    /// Every layer of a call gets the tables the RoPE would make for the call's positions, made
    /// once per distinct RoPE; a clone or a selection starts without them.
    #[test]
    fn rope_tables_are_made_once_per_rope_and_call() -> Result<(), EngineError> {
        let cpu = Device::Cpu;
        let context = ForwardContext::new(vec![0, 7, 3], vec![0, 1, 2])?;
        let global = RotaryEmbedding::for_test(&[1.0, 0.1], 1.0);
        let local = RotaryEmbedding::for_test(&[1.0, 0.01], 1.0);
        let first = context.rope_tables(&global, &cpu)?;
        let again = context.rope_tables(&global, &cpu)?;
        assert_eq!(first.cos().id(), again.cos().id());
        let made = global.tables(&[0.0, 7.0, 3.0], &cpu)?;
        assert_eq!(first.cos().to_vec2::<f32>()?, made.cos().to_vec2::<f32>()?);
        let other = context.rope_tables(&local, &cpu)?;
        assert_ne!(other.cos().id(), first.cos().id());
        assert_ne!(other.cos().to_vec2::<f32>()?, first.cos().to_vec2::<f32>()?);
        let clone = context.clone();
        assert_eq!(clone, context);
        assert_ne!(
            clone.rope_tables(&global, &cpu)?.cos().id(),
            first.cos().id()
        );
        let selected = context.select(&[1])?.rope_tables(&global, &cpu)?;
        assert_eq!(
            selected.cos().to_vec2::<f32>()?,
            made.cos().narrow(0, 1, 1)?.to_vec2::<f32>()?
        );
        Ok(())
    }
}
