//! [`UnitEncoder`]: a unit's KV on demand — from this run's memory, from the module store
//! (checked against the unit's tokens and positions), or encoded now after its context and put in
//! the store. Schema encoding walks every unit through it; cached inference asks it for the units
//! a prompt imports, so a state missing from the store (evicted, corrupt, never compiled) is
//! encoded on the fly instead of failing or being guessed.
//!
//! A unit's store key covers the model (the store's fingerprint, the weight format, the KV
//! dtype), the encoding mode, the unit's tokens and positions and a hash of its context's tokens
//! and positions ([`StoreKeyParts`]); so recompiling re-encodes only the units whose tokens,
//! positions or context changed.

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::Tensor;
use pml_compiler::plan::{EncodeMode, LayoutUnit, SchemaLayout, UnitId};

use crate::store::{
    ContextHash, KeepFraction, ModuleState, ModuleStore, StateKind, StoreError, StoreKey, TierPut,
};
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::Model;

use crate::unit_key::UnitKey;

use super::EncodeError;
use super::chunked::prefill_sorted;
use super::context::{
    UnitRows, context_rows, context_tokens, held_rows, unit, unit_rows, validate_layout,
};
use super::kept::{heavy_rows, reread_scores};

/// Where a unit's state came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateOrigin {
    /// Already in hand in this run.
    Memory,
    /// Read from the store.
    Store,
    /// Computed now (and put in the store).
    Encoded,
    /// The unit has no tokens of its own: nothing to compute or store.
    Empty,
}

/// The model, layout and store that unit states are computed with and kept in.
pub struct UnitEncoder<'a> {
    model: &'a Model,
    layout: &'a SchemaLayout,
    mode: EncodeMode,
    bos: Option<u32>,
    /// Compressed states (`pmlc compile --keep F`): each unit keeps this fraction of its rows.
    keep: Option<KeepFraction>,
    store: &'a ModuleStore,
    known: HashMap<UnitId, Arc<KvBlock>>,
    /// What the store's tiers did with each unit put in this run.
    puts: HashMap<UnitId, Vec<TierPut>>,
    /// The last context's rows, so the next unit with the same context (union members, siblings
    /// right after their parent's text) does not gather them again.
    last_context: Option<(Vec<UnitRows>, Vec<KvBlock>)>,
    warnings: Vec<String>,
}

impl<'a> UnitEncoder<'a> {
    /// `bos`: the model's BOS token, if it uses one (the isolated mode's only context). The store
    /// must be the store of this model's KV layout.
    pub fn new(
        model: &'a Model,
        layout: &'a SchemaLayout,
        mode: EncodeMode,
        bos: Option<u32>,
        store: &'a ModuleStore,
    ) -> Result<Self, EncodeError> {
        validate_layout(layout)?;
        if store.spec().layout != model.kv_layout() {
            return Err(EncodeError::Store(StoreError::mismatch(
                "KV layout",
                format!("{:?}", model.kv_layout()),
                format!("{:?}", store.spec().layout),
            )));
        }
        Ok(Self {
            model,
            layout,
            mode,
            bos,
            keep: None,
            store,
            known: HashMap::new(),
            puts: HashMap::new(),
            last_context: None,
            warnings: Vec::new(),
        })
    }

    /// The same encoder for compressed states keeping `keep` of each unit's rows (`None`: every
    /// row). Their keys differ from whole states', so the two never meet in a store.
    pub fn with_keep(self, keep: Option<KeepFraction>) -> Self {
        Self { keep, ..self }
    }

    /// The fraction of its rows each module's state keeps (`None`: all).
    pub fn keep(&self) -> Option<KeepFraction> {
        self.keep
    }

    /// The fraction unit `unit_id`'s state keeps: modules [`Self::keep`], the root all its rows.
    /// The root is the text every prompt of the schema holds (the system prompt, the chat
    /// template's frame, the instructions around the modules): short, and where losing a row
    /// costs every answer (on HotpotQA, compressing it too left no answer in the asked form).
    pub fn unit_keep(&self, unit_id: UnitId) -> Option<KeepFraction> {
        self.keep.filter(|_| unit_id != UnitId::ROOT)
    }

    pub fn layout(&self) -> &'a SchemaLayout {
        self.layout
    }

    pub fn store(&self) -> &'a ModuleStore {
        self.store
    }

    /// Problems met and worked around (a stored state that was corrupt or did not match).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// What the tiers did with unit `unit_id`'s put, if it was encoded in this run.
    pub fn puts(&self, unit_id: UnitId) -> Option<&[TierPut]> {
        self.puts.get(&unit_id).map(Vec::as_slice)
    }

    /// The store key of unit `unit_id`.
    pub fn key(&self, unit_id: UnitId) -> Result<StoreKey, EncodeError> {
        let kind = self
            .unit_keep(unit_id)
            .map_or(StateKind::Kv, StateKind::KvKept);
        Ok(self.unit_key(unit_id)?.of(kind))
    }

    /// The store keys of unit `unit_id`'s layers kept one entry per layer
    /// ([`StateKind::KvLayer`]), layer 0 first: the same unit, tokens, positions and context as
    /// [`Self::key`], so a layer entry holds exactly that layer of the unit's state.
    pub fn layer_keys(&self, unit_id: UnitId) -> Result<Vec<StoreKey>, EncodeError> {
        let key = self.unit_key(unit_id)?;
        (0..self.model.config().n_layers)
            .map(|layer| {
                key.layer(layer, false).ok_or_else(|| {
                    EncodeError::InvalidLayout(format!("layer {layer} has no store key"))
                })
            })
            .collect()
    }

    /// What unit `unit_id`'s keys are made of: its tokens, positions and its context's hash.
    fn unit_key(&self, unit_id: UnitId) -> Result<UnitKey<'a>, EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let context = context_rows(self.layout, unit_id, self.mode, self.bos)?;
        let (context_tokens, context_positions) = context_tokens(self.layout, &context)?;
        Ok(UnitKey {
            model: self.model,
            store: self.store,
            encode_mode: self.mode,
            tokens: &layout_unit.tokens,
            positions: &layout_unit.positions,
            context: ContextHash::of(&context_tokens, &context_positions),
        })
    }

    /// Makes sure the store holds unit `unit_id`'s state, encoding it when it does not; a stored
    /// state is not read.
    pub fn ensure(&mut self, unit_id: UnitId) -> Result<StateOrigin, EncodeError> {
        self.ensure_noting_waits(unit_id, &mut |_| {})
    }

    /// [`Self::ensure`], calling `on_wait` with the unit when another process sharing the store
    /// is encoding it (this one then waits, and reuses what the other stored).
    pub fn ensure_noting_waits(
        &mut self,
        unit_id: UnitId,
        on_wait: &mut dyn FnMut(&LayoutUnit),
    ) -> Result<StateOrigin, EncodeError> {
        if unit(self.layout, unit_id)?.tokens.is_empty() {
            return Ok(StateOrigin::Empty);
        }
        let key = self.key(unit_id)?;
        if self.store.contains(&key)? {
            return Ok(StateOrigin::Store);
        }
        let (_, origin) = self.encode(unit_id, &key, on_wait)?;
        Ok(origin)
    }

    /// Unit `unit_id`'s KV: one row per token of the unit, at the unit's positions (with
    /// [`Self::keep`], the rows its compressed state holds, at theirs).
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
        match self.store.get(&key) {
            Ok(Some(hit)) if matches_unit(&hit.state, layout_unit, self.unit_keep(unit_id)) => {
                let block = Arc::new(hit.state.kv().clone());
                self.known.insert(unit_id, Arc::clone(&block));
                return Ok((block, StateOrigin::Store));
            }
            Ok(Some(_)) => self.warnings.push(format!(
                "the stored state of {} does not match its tokens and positions; re-encoded",
                describe(layout_unit)
            )),
            Ok(None) => {}
            Err(error @ StoreError::Corrupt { .. }) => self.warnings.push(format!(
                "{}; re-encoded {}",
                error.what_happened(),
                describe(layout_unit)
            )),
            Err(error) => return Err(error.into()),
        }
        self.encode(unit_id, &key, &mut |_| {})
    }

    /// Encodes unit `unit_id` after its context, puts it under `key` and keeps it in memory —
    /// holding `key`'s lock among the processes sharing the store, so that a unit is encoded
    /// once: when another process stored it meanwhile, its state is read instead.
    fn encode(
        &mut self,
        unit_id: UnitId,
        key: &StoreKey,
        on_wait: &mut dyn FnMut(&LayoutUnit),
    ) -> Result<(Arc<KvBlock>, StateOrigin), EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let lock = self.store.lock(key, &mut || on_wait(layout_unit))?;
        let stored_meanwhile = match &lock {
            Some(_) => match self.store.get(key) {
                Ok(Some(hit)) if matches_unit(&hit.state, layout_unit, self.unit_keep(unit_id)) => {
                    Some(hit)
                }
                _ => None,
            },
            None => None,
        };
        let (block, origin) = match stored_meanwhile {
            Some(hit) => {
                let block = Arc::new(hit.state.kv().clone());
                self.known.insert(unit_id, Arc::clone(&block));
                (block, StateOrigin::Store)
            }
            None => (self.compute(unit_id, key)?, StateOrigin::Encoded),
        };
        if let Some(lock) = lock {
            lock.release_stored();
        }
        Ok((block, origin))
    }

    /// Computes unit `unit_id` after its context, puts it under `key` and keeps it in memory.
    fn compute(&mut self, unit_id: UnitId, key: &StoreKey) -> Result<Arc<KvBlock>, EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let context = context_rows(self.layout, unit_id, self.mode, self.bos)?;
        let blocks = match self.last_context.take() {
            Some((last, blocks)) if last == context => blocks,
            _ => {
                let mut blocks = Vec::with_capacity(context.len());
                for part in &context {
                    let (block, _) = self.state(part.unit)?;
                    let part_unit = unit(self.layout, part.unit)?;
                    blocks.push(unit_rows(&block, part_unit, &part.rows)?);
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
        let (tokens, positions) = (&layout_unit.tokens, &layout_unit.positions);
        prefill_sorted(self.model, tokens, positions, &mut kv, false)?;
        let state = match self.unit_keep(unit_id) {
            None => ModuleState::new(kv.slice(context_len..kv.len())?, tokens.clone())?,
            Some(keep) => {
                // The second reading appends after the unit's rows; the kept ones are copied
                // out of the cache once, by slot.
                let scores = reread_scores(self.model, tokens, positions, &mut kv)?;
                let rows = heavy_rows(&scores, keep);
                let slots: Vec<usize> = rows.iter().map(|&row| context_len + row).collect();
                let kept_tokens = rows.iter().map(|&row| tokens[row]).collect();
                ModuleState::kv_kept(keep, kv.gather(&slots)?, kept_tokens)?
            }
        };
        self.last_context = Some((context, blocks));
        let state = state.to_dtype(self.store.spec().state_dtype)?;
        // From here on this run uses what the store keeps (f16-rounded by default), so a unit
        // encoded after this one sees the same context rows whether this state came from memory
        // or, in another run, from the store.
        let block = state.kv().clone();
        let puts = self.store.put(key, state)?;
        self.puts.insert(unit_id, puts);
        let block = Arc::new(block);
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

/// Whether a stored state is exactly this unit's (a guard against key collisions and bugs): all
/// its tokens at their positions, or with `keep` that fraction of them.
fn matches_unit(state: &ModuleState, layout_unit: &LayoutUnit, keep: Option<KeepFraction>) -> bool {
    let Some(keep) = keep else {
        return state.kind() == StateKind::Kv
            && state.tokens() == layout_unit.tokens.as_slice()
            && state.positions() == layout_unit.positions.as_slice();
    };
    let held = held_rows(&layout_unit.positions, state.positions().iter().copied());
    state.kind() == StateKind::KvKept(keep)
        && state.len() == keep.rows_of(layout_unit.tokens.len())
        && state.positions().windows(2).all(|pair| pair[0] < pair[1])
        && held
            .iter()
            .zip(state.tokens())
            .all(|(row, &token)| row.is_some_and(|row| layout_unit.tokens[row] == token))
}

/// `module `a/b`` or `the root`, for messages.
pub fn describe(layout_unit: &LayoutUnit) -> String {
    if layout_unit.path.is_empty() && layout_unit.name.is_empty() {
        "the root".to_string()
    } else if layout_unit.path.is_empty() {
        format!("module `{}`", layout_unit.name)
    } else {
        format!("module `{}`", layout_unit.path.join("/"))
    }
}
