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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use candle_core::Tensor;
use pml_compiler::plan::{EncodeMode, LayoutUnit, SchemaLayout, UnitId};

use crate::store::{
    ContextHash, KeepFraction, ModuleState, ModuleStore, StateKind, StoreError, StoreKey, TierPut,
    UnitLock,
};
use pml_engine::kv_cache::{KvBlock, KvCache, ParallelScaling};
use pml_engine::model::{ForwardContext, ForwardOptions, LogitRows, Model};

use crate::unit_key::UnitKey;

use super::EncodeError;
use super::chunked::{MAX_CHUNK_TOKENS, chunk_len};
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

/// How [`UnitEncoder::begin_unit`] found a unit.
#[derive(Debug)]
pub enum UnitStart {
    Done(StateOrigin),
    /// Boxed: a partial unit holds a whole KV cache, far larger than the other variant.
    Computing(Box<PartialUnit>),
}

enum Begun {
    Stored(Arc<KvBlock>),
    Computing(PartialUnit),
}

/// A unit being computed, its context's rows in the cache before its own: the chunks done so
/// far, and the store lock held until it is stored.
#[derive(Debug)]
pub struct PartialUnit {
    unit_id: UnitId,
    key: StoreKey,
    lock: Option<UnitLock>,
    kv: KvCache,
    context_len: usize,
    chunk_len: usize,
    /// The unit's tokens computed.
    done: usize,
    context: Vec<UnitRows>,
    blocks: Vec<KvBlock>,
}

impl PartialUnit {
    /// Whether every token of the unit is computed (it is then ready for
    /// [`UnitEncoder::finish_unit`]).
    pub fn is_computed(&self, layout: &SchemaLayout) -> bool {
        unit(layout, self.unit_id).is_ok_and(|layout_unit| self.done >= layout_unit.tokens.len())
    }

    /// The unit's next `max_tokens` tokens (one at least) not computed yet, for a pass the
    /// caller runs; `None` once all are.
    pub fn next_chunk<'a>(
        &'a mut self,
        layout: &'a SchemaLayout,
        max_tokens: usize,
    ) -> Option<UnitChunk<'a>> {
        let layout_unit = unit(layout, self.unit_id).ok()?;
        let n_tokens = layout_unit.tokens.len();
        if self.done >= n_tokens {
            return None;
        }
        let range = self.done..(self.done + max_tokens.max(1)).min(n_tokens);
        Some(UnitChunk {
            tokens: &layout_unit.tokens[range.clone()],
            positions: &layout_unit.positions[range],
            kv: &mut self.kv,
        })
    }

    /// A pass appended the chunk [`Self::next_chunk`] gave to the unit's cache.
    pub fn chunk_computed(&mut self) {
        self.done = self.kv.len().saturating_sub(self.context_len);
    }
}

/// A unit's next tokens, their positions and the cache a pass appends them to (after the unit's
/// context and the tokens computed before).
pub struct UnitChunk<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub kv: &'a mut KvCache,
}

/// The states a [`UnitEncoder`] holds in memory, carried from one encoder to the next.
#[derive(Debug, Default)]
pub struct UnitMemory {
    known: HashMap<UnitId, Arc<KvBlock>>,
    last_context: Option<(Vec<UnitRows>, Vec<KvBlock>)>,
    store_unwritable: bool,
    unstored: HashSet<UnitId>,
}

/// The model, layout and store that unit states are computed with and kept in.
pub struct UnitEncoder<'a> {
    model: &'a Model,
    layout: &'a SchemaLayout,
    mode: EncodeMode,
    bos: Option<u32>,
    /// Compressed states (`pmlc compile --keep F`): each unit keeps this fraction of its rows.
    keep: Option<KeepFraction>,
    /// Mode `reuse` re-weights the attention paid to spliced modules (APE's correction).
    parallel_scaling: Option<ParallelScaling>,
    store: &'a ModuleStore,
    known: HashMap<UnitId, Arc<KvBlock>>,
    /// What the store's tiers did with each unit put in this run.
    puts: HashMap<UnitId, Vec<TierPut>>,
    /// The last context's rows, so the next unit with the same context (union members, siblings
    /// right after their parent's text) does not gather them again.
    last_context: Option<(Vec<UnitRows>, Vec<KvBlock>)>,
    warnings: Vec<String>,
    /// Whether a write to the store failed (said once among the warnings).
    store_unwritable: bool,
    /// Units computed in this run whose state the store could not take.
    unstored: HashSet<UnitId>,
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
            parallel_scaling: None,
            store,
            known: HashMap::new(),
            puts: HashMap::new(),
            last_context: None,
            warnings: Vec::new(),
            store_unwritable: false,
            unstored: HashSet::new(),
        })
    }

    /// The same encoder for compressed states keeping `keep` of each unit's rows (`None`: every
    /// row). Their keys differ from whole states', so the two never meet in a store.
    pub fn with_keep(self, keep: Option<KeepFraction>) -> Self {
        Self { keep, ..self }
    }

    /// The same encoder whose states mode `reuse` attends as parallel contexts with APE's
    /// correction (`None`: plain attention).
    pub fn with_parallel_scaling(self, parallel_scaling: Option<ParallelScaling>) -> Self {
        Self {
            parallel_scaling,
            ..self
        }
    }

    pub fn parallel_scaling(&self) -> Option<ParallelScaling> {
        self.parallel_scaling
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

    /// Whether unit `unit_id`, if computed in this run, is in the store now (`false`: the
    /// store could not take its state, or could not lock its key to write it).
    pub fn stored(&self, unit_id: UnitId) -> bool {
        !self.unstored.contains(&unit_id)
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
        match self.begin_unit(unit_id, MAX_CHUNK_TOKENS, on_wait)? {
            UnitStart::Done(origin) => Ok(origin),
            UnitStart::Computing(mut partial) => {
                self.compute_chunks(&mut partial, usize::MAX)?;
                self.finish_unit(*partial)?;
                Ok(StateOrigin::Encoded)
            }
        }
    }

    /// The start of [`Self::ensure`] for a caller that computes a unit in steps: done when the
    /// store holds the unit's state (or it has no tokens), else the unit with its context's
    /// rows, to compute in chunks of at most `max_chunk` tokens ([`Self::compute_chunks`]) and
    /// then store ([`Self::finish_unit`]).
    pub fn begin_unit(
        &mut self,
        unit_id: UnitId,
        max_chunk: usize,
        on_wait: &mut dyn FnMut(&LayoutUnit),
    ) -> Result<UnitStart, EncodeError> {
        if unit(self.layout, unit_id)?.tokens.is_empty() {
            return Ok(UnitStart::Done(StateOrigin::Empty));
        }
        let key = self.key(unit_id)?;
        if self.store.contains(&key)? {
            return Ok(UnitStart::Done(StateOrigin::Store));
        }
        Ok(
            match self.begin_compute(unit_id, key, max_chunk, on_wait)? {
                Begun::Stored(_) => UnitStart::Done(StateOrigin::Store),
                Begun::Computing(partial) => UnitStart::Computing(Box::new(partial)),
            },
        )
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
        match self.begin_compute(unit_id, key.clone(), MAX_CHUNK_TOKENS, on_wait)? {
            Begun::Stored(block) => Ok((block, StateOrigin::Store)),
            Begun::Computing(mut partial) => {
                self.compute_chunks(&mut partial, usize::MAX)?;
                Ok((self.finish_unit(partial)?, StateOrigin::Encoded))
            }
        }
    }

    /// Takes `key`'s lock; then either the state another process stored meanwhile, or the unit
    /// after its context's rows, ready to compute.
    fn begin_compute(
        &mut self,
        unit_id: UnitId,
        key: StoreKey,
        max_chunk: usize,
        on_wait: &mut dyn FnMut(&LayoutUnit),
    ) -> Result<Begun, EncodeError> {
        let layout_unit = unit(self.layout, unit_id)?;
        let lock = match self.store.lock(&key, &mut || on_wait(layout_unit)) {
            Ok(lock) => lock,
            Err(error @ StoreError::Io { .. }) => {
                self.note_unwritable(unit_id, &error);
                None
            }
            Err(error) => return Err(error.into()),
        };
        if lock.is_some()
            && let Ok(Some(hit)) = self.store.get(&key)
            && matches_unit(&hit.state, layout_unit, self.unit_keep(unit_id))
        {
            let block = Arc::new(hit.state.kv().clone());
            self.known.insert(unit_id, Arc::clone(&block));
            if let Some(lock) = lock {
                lock.release_stored();
            }
            return Ok(Begun::Stored(block));
        }
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
        let kv = KvCache::from_blocks(
            self.model.kv_layout(),
            self.model.device(),
            &block_refs,
            layout_unit.tokens.len(),
        )?;
        Ok(Begun::Computing(PartialUnit {
            unit_id,
            key,
            lock,
            context_len: kv.len(),
            kv,
            chunk_len: chunk_len(layout_unit.tokens.len(), max_chunk),
            done: 0,
            context,
            blocks,
        }))
    }

    /// Computes `partial`'s next chunks, as many as fit in `max_tokens` (one at least), until
    /// the unit is done; returns the tokens computed. Chunks are equal in size and in position
    /// order, as [`super::chunked::prefill_sorted`] computes them.
    pub fn compute_chunks(
        &self,
        partial: &mut PartialUnit,
        max_tokens: usize,
    ) -> Result<usize, EncodeError> {
        let layout_unit = unit(self.layout, partial.unit_id)?;
        let mut computed = 0;
        while partial.done < layout_unit.tokens.len()
            && (computed == 0 || computed + partial.chunk_len <= max_tokens)
        {
            let end = (partial.done + partial.chunk_len).min(layout_unit.tokens.len());
            let range = partial.done..end;
            let context = ForwardContext::appending(
                layout_unit.positions[range.clone()].to_vec(),
                &partial.kv,
            );
            let options = ForwardOptions {
                logits: LogitRows::None,
                keep_layer_inputs: false,
            };
            self.model.forward_with(
                &layout_unit.tokens[range],
                &context,
                &mut partial.kv,
                &options,
            )?;
            computed += end - partial.done;
            partial.done = end;
        }
        Ok(computed)
    }

    /// Stores a unit [`Self::compute_chunks`] has computed whole, keeps it in memory and
    /// releases its lock.
    pub fn finish_unit(&mut self, partial: PartialUnit) -> Result<Arc<KvBlock>, EncodeError> {
        let PartialUnit {
            unit_id,
            key,
            lock,
            mut kv,
            context_len,
            done,
            context,
            blocks,
            ..
        } = partial;
        let layout_unit = unit(self.layout, unit_id)?;
        let (tokens, positions) = (&layout_unit.tokens, &layout_unit.positions);
        if done < tokens.len() {
            return Err(EncodeError::InvalidLayout(format!(
                "{} is stored after {done} of its {} tokens",
                describe(layout_unit),
                tokens.len()
            )));
        }
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
        match self.store.put(&key, state) {
            Ok(puts) => {
                self.unstored.remove(&unit_id);
                self.puts.insert(unit_id, puts);
            }
            Err(error @ StoreError::Io { .. }) => self.note_unwritable(unit_id, &error),
            Err(error) => return Err(error.into()),
        }
        let block = Arc::new(block);
        self.known.insert(unit_id, Arc::clone(&block));
        if let Some(lock) = lock {
            lock.release_stored();
        }
        Ok(block)
    }

    /// What this encoder holds in memory, for the next encoder of the same layout and store
    /// ([`Self::with_memory`]): an encoding in steps keeps its states between them.
    pub fn into_memory(self) -> UnitMemory {
        UnitMemory {
            known: self.known,
            last_context: self.last_context,
            store_unwritable: self.store_unwritable,
            unstored: self.unstored,
        }
    }

    /// The same encoder, holding what an earlier one of the same layout and store held.
    pub fn with_memory(self, memory: UnitMemory) -> Self {
        Self {
            known: memory.known,
            last_context: memory.last_context,
            store_unwritable: memory.store_unwritable,
            unstored: memory.unstored,
            ..self
        }
    }

    /// A store that cannot be written (a read-only folder, a full disk) costs the states' reuse
    /// in later runs, not this run: the states computed now are used from memory, and the
    /// first such failure is reported once.
    fn note_unwritable(&mut self, unit_id: UnitId, error: &StoreError) {
        self.unstored.insert(unit_id);
        if !self.store_unwritable {
            self.store_unwritable = true;
            self.warnings.push(format!(
                "the module store cannot be written ({error}): the states computed now are \
                 used for this run only"
            ));
        }
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
