//! [`UnitEncoder`]: a unit's KV on demand — from this run's memory, from the store (checked against
//! the unit's tokens and positions), or encoded now after its context and saved. Schema encoding
//! walks every unit through it; cached inference asks it for the units a prompt imports, so a
//! state missing from the store is encoded on the fly instead of failing or being guessed.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};

use crate::kv_cache::{KvBlock, KvCache};
use crate::model::Model;

use super::EncodeError;
use super::chunked::prefill_sorted;
use super::context::{UnitRows, context_rows, context_tokens, select_rows, unit};
use super::key::{ModelIdentity, UnitKey, context_hash};
use super::states::{UnitState, UnitStates};

/// Where a unit's state came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateOrigin {
    /// Already in hand in this run.
    Memory,
    /// Read from the store.
    Store,
    /// Computed now (and saved).
    Encoded,
    /// The unit has no tokens of its own: nothing to compute or store.
    Empty,
}

/// The model, layout and store that unit states are computed with and kept in.
pub struct UnitEncoder<'a> {
    model: &'a Model,
    identity: &'a ModelIdentity,
    layout: &'a SchemaLayout,
    mode: EncodeMode,
    bos: Option<u32>,
    states: &'a dyn UnitStates,
    known: HashMap<UnitId, Arc<KvBlock>>,
    /// The last context's rows, so the next unit with the same context (union members, siblings
    /// right after their parent's text) does not gather them again.
    last_context: Option<(Vec<UnitRows>, Vec<KvBlock>)>,
    warnings: Vec<String>,
}

impl<'a> UnitEncoder<'a> {
    /// `bos`: the model's BOS token, if it uses one (the isolated mode's only context).
    pub fn new(
        model: &'a Model,
        identity: &'a ModelIdentity,
        layout: &'a SchemaLayout,
        mode: EncodeMode,
        bos: Option<u32>,
        states: &'a dyn UnitStates,
    ) -> Result<Self, EncodeError> {
        super::context::validate_layout(layout)?;
        Ok(Self {
            model,
            identity,
            layout,
            mode,
            bos,
            states,
            known: HashMap::new(),
            last_context: None,
            warnings: Vec::new(),
        })
    }

    pub fn layout(&self) -> &'a SchemaLayout {
        self.layout
    }

    /// Problems met and worked around (a stored state that did not match its unit).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The store key of unit `unit_id`.
    pub fn key(&self, unit_id: UnitId) -> Result<UnitKey, EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let context = context_rows(self.layout, unit_id, self.mode, self.bos)?;
        let (tokens, positions) = context_tokens(self.layout, &context)?;
        Ok(UnitKey {
            model: self.identity.clone(),
            mode: self.mode,
            tokens: layout_unit.tokens.clone(),
            positions: layout_unit.positions.clone(),
            context_hash: context_hash(&tokens, &positions),
        })
    }

    /// Makes sure the store holds unit `unit_id`'s state, encoding it when it does not; the
    /// state is not read when it is already stored.
    pub fn ensure(&mut self, unit_id: UnitId) -> Result<StateOrigin, EncodeError> {
        if unit(self.layout, unit_id)?.tokens.is_empty() {
            return Ok(StateOrigin::Empty);
        }
        let key = self.key(unit_id)?;
        if self.states.contains(&key)? {
            return Ok(StateOrigin::Store);
        }
        self.encode(unit_id, &key)?;
        Ok(StateOrigin::Encoded)
    }

    /// Unit `unit_id`'s KV: one row per token of the unit, at the unit's positions.
    pub fn state(&mut self, unit_id: UnitId) -> Result<(Arc<KvBlock>, StateOrigin), EncodeError> {
        if let Some(block) = self.known.get(&unit_id) {
            return Ok((Arc::clone(block), StateOrigin::Memory));
        }
        let layout_unit = unit(self.layout, unit_id)?;
        if layout_unit.tokens.is_empty() {
            let block = Arc::new(self.empty_block()?);
            self.known.insert(unit_id, Arc::clone(&block));
            return Ok((block, StateOrigin::Empty));
        }
        let key = self.key(unit_id)?;
        if let Some(state) = self.states.load(&key)? {
            let matches = state.tokens == layout_unit.tokens
                && state.positions == layout_unit.positions
                && state.kv.len() == layout_unit.tokens.len()
                && state.kv.positions() == layout_unit.positions.as_slice()
                && state.kv.n_layers() == self.model.config().n_layers;
            if matches {
                self.known.insert(unit_id, Arc::clone(&state.kv));
                return Ok((state.kv, StateOrigin::Store));
            }
            self.warnings.push(format!(
                "the stored state of {} does not match its tokens and positions; re-encoded",
                describe(layout_unit)
            ));
        }
        let block = self.encode(unit_id, &key)?;
        Ok((block, StateOrigin::Encoded))
    }

    /// Encodes unit `unit_id` after its context, saves it under `key` and keeps it in memory.
    fn encode(&mut self, unit_id: UnitId, key: &UnitKey) -> Result<Arc<KvBlock>, EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let context = context_rows(self.layout, unit_id, self.mode, self.bos)?;
        let blocks = match self.last_context.take() {
            Some((last, blocks)) if last == context => blocks,
            _ => {
                let mut blocks = Vec::with_capacity(context.len());
                for part in &context {
                    let (block, _) = self.state(part.unit)?;
                    blocks.push(select_rows(&block, &part.rows)?);
                }
                blocks
            }
        };
        let block_refs: Vec<&KvBlock> = blocks.iter().collect();
        let mut kv = KvCache::from_blocks(
            self.model.kv_layout(),
            self.model.device(),
            &block_refs,
            layout_unit.tokens.len(),
        )?;
        let context_len = kv.len();
        prefill_sorted(
            self.model,
            &layout_unit.tokens,
            &layout_unit.positions,
            &mut kv,
            false,
        )?;
        let block = Arc::new(kv.slice(context_len..kv.len())?);
        self.last_context = Some((context, blocks));
        let state = UnitState {
            kv: Arc::clone(&block),
            tokens: layout_unit.tokens.clone(),
            positions: layout_unit.positions.clone(),
        };
        self.states.save(key, &state)?;
        self.known.insert(unit_id, Arc::clone(&block));
        Ok(block)
    }

    fn empty_block(&self) -> Result<KvBlock, EncodeError> {
        let layout = self.model.kv_layout();
        let empty = Tensor::zeros(
            (0, layout.n_kv_heads, layout.head_dim),
            layout.dtype,
            self.model.device(),
        )?;
        let layers = vec![(empty.clone(), empty); layout.n_layers];
        Ok(KvBlock::new(layers, Vec::new())?)
    }
}

/// `module `a/b`` or `the root`, for messages.
pub fn describe(layout_unit: &pml_compiler::plan::LayoutUnit) -> String {
    if layout_unit.path.is_empty() && layout_unit.name.is_empty() {
        "the root".to_string()
    } else if layout_unit.path.is_empty() {
        format!("module `{}`", layout_unit.name)
    } else {
        format!("module `{}`", layout_unit.path.join("/"))
    }
}
