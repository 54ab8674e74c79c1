//! The KV cache: for every layer, K (stored *after* RoPE) and V of each slot, plus the position
//! each slot was rotated at; and [`KvBlock`], a self-contained snapshot of some slots (a module's
//! KV computed elsewhere) that can be spliced into a cache.
//!
//! A slot is one row of the cache; slots are not positions: a spliced prompt has gaps and
//! repeats in its positions, and the attention mask is derived from the positions alone.
//! Storage is slot-major, `(capacity, kv_heads, head_dim)` per layer, with spare capacity so
//! that decoding appends in place instead of copying the whole cache every token. Views handed
//! out ([`LayerKv::keys`]) are never changed afterwards: appends write only beyond every view
//! ever taken of this buffer, overwrites and shared buffers copy first (copy-on-write).
//!
//! Blocks may hold another dtype than the cache (stored states are f16, the cache f32), and
//! may hold their rows in a file's mapped bytes: [`KvCache::from_blocks`] converts each block's
//! rows straight into the new buffers (see [`splice`]).

mod block;
mod layer;
mod parallel;
mod reserve;
#[cfg(test)]
mod shared_tests;
mod splice;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

pub use block::{KvBlock, SharedBytes};
pub use layer::{KvSegment, LayerKv};
use layer::{SharedBuffer, SharedRows, row_index};
pub use parallel::ParallelContexts;
pub use pml_kernels::ParallelScaling;

/// Most shared segments a cache starts with ([`KvCache::from_shared_blocks`]); the rest of the
/// blocks are copied. Attention cuts its work at every segment and merges the parts, so a
/// cache of many small segments would cost more to read than it saves.
const MAX_SHARED_SEGMENTS: usize = 8;

pub use crate::error::KvCacheError;

/// Shape of the cache of one model: what every layer's K and V rows look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
}

impl KvLayout {
    /// Bytes of one slot's K and V across every layer.
    pub fn slot_bytes(&self) -> usize {
        self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.dtype.size_in_bytes()
    }
}

/// The KV cache of one sequence: one [`LayerKv`] per layer.
///
/// Between whole-model calls every layer holds the same slots at the same positions; during a
/// layer-by-layer pass the layers already visited are ahead.
#[derive(Clone, Debug)]
pub struct KvCache {
    layout: KvLayout,
    device: Device,
    layers: Vec<LayerKv>,
    /// Rows attention re-weights as parallel contexts (APE); `None`: plain attention.
    parallel: Option<Arc<ParallelContexts>>,
}

impl KvCache {
    pub fn new(layout: KvLayout, device: &Device) -> Result<Self, KvCacheError> {
        let layers = (0..layout.n_layers)
            .map(|layer_idx| LayerKv::empty(&layout, device, layer_idx))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            layout,
            device: device.clone(),
            layers,
            parallel: None,
        })
    }

    /// An empty cache with room for `capacity` slots, so a prefill and the decoding after it
    /// append in place: an exactly sized prefill would copy the whole cache to grow it at the
    /// first decoded token.
    pub fn with_capacity(
        layout: KvLayout,
        device: &Device,
        capacity: usize,
    ) -> Result<Self, KvCacheError> {
        Self::from_blocks(layout, device, &[], capacity)
    }

    /// Splices blocks, in the order given, into a new cache: each value converted to the
    /// cache's dtype and copied once, with room for `reserve` more slots so the tokens that
    /// follow append in place.
    pub fn from_blocks(
        layout: KvLayout,
        device: &Device,
        blocks: &[&KvBlock],
        reserve: usize,
    ) -> Result<Self, KvCacheError> {
        Self::from_blocks_for(layout, device, blocks, reserve, None)
    }

    /// [`Self::from_blocks`] for a cache whose every later row (query) is at `horizon`'s
    /// position or later, with the blocks' rows in position order (stable) rather than block
    /// by block: a sliding-window layer then leaves out the leading slots none of those
    /// queries can see (Gemma-3's local layers keep 512 of a 4k-token prompt), so they are
    /// never copied nor allocated. The cache refuses, with [`KvCacheError::BeforeHorizon`], a row
    /// written before that position, and with [`KvCacheError::NotHeld`] any use of a slot
    /// left out.
    pub fn from_blocks_for(
        layout: KvLayout,
        device: &Device,
        blocks: &[&KvBlock],
        reserve: usize,
        horizon: Option<QueryHorizon<'_>>,
    ) -> Result<Self, KvCacheError> {
        if let Some(horizon) = &horizon
            && horizon.windows.iter().all(Option::is_none)
            && horizon.windows.len() == layout.n_layers
        {
            // No layer has a window, so no slot is left out and the rows' order is free: the
            // blocks in their order, those cut from spans read in place.
            let mut cache = Self::from_shared_blocks(layout, device, blocks, reserve)?;
            for layer in &mut cache.layers {
                layer.horizon = horizon.first_query;
            }
            return Ok(cache);
        }
        let mut cache = Self::new(layout, device)?;
        let total: usize = blocks.iter().map(|block| block.len()).sum();
        for block in blocks {
            cache.check_block(block)?;
        }
        let runs = match horizon {
            Some(_) => splice::Runs::by_position(blocks),
            None => splice::Runs::in_order(blocks),
        };
        let positions = runs.positions();
        let first_held: Vec<usize> = match &horizon {
            Some(horizon) => horizon.first_held(&positions, layout.n_layers)?,
            None => vec![0; layout.n_layers],
        };
        let buffers = splice::splice_buffers(&runs, total + reserve, &first_held, &layout, device)?;
        for ((layer, (key_buffer, value_buffer)), first_held) in
            cache.layers.iter_mut().zip(buffers).zip(first_held)
        {
            layer.key_buffer = key_buffer;
            layer.value_buffer = value_buffer;
            layer.positions = positions.clone();
            layer.first_held = first_held;
            layer.horizon = horizon.as_ref().map_or(0, |horizon| horizon.first_query);
        }
        Ok(cache)
    }

    /// [`Self::from_blocks`], except that the leading blocks cut from larger ones
    /// ([`KvBlock::view`]) in the cache's dtype and on its device are not copied: the cache
    /// reads their spans in place (each run of consecutive rows of one span as one
    /// [`KvSegment`], at most [`MAX_SHARED_SEGMENTS`] of them), sharing them with every other
    /// cache and block that does. Writing one of those slots later copies the cache's rows
    /// first.
    pub fn from_shared_blocks(
        layout: KvLayout,
        device: &Device,
        blocks: &[&KvBlock],
        reserve: usize,
    ) -> Result<Self, KvCacheError> {
        let mut runs: Vec<(&Arc<KvBlock>, Range<usize>)> = Vec::new();
        let mut used = 0;
        for block in blocks {
            let Some(within) = block.within() else { break };
            if !Self::readable_in_place(&layout, device, &within.span) {
                break;
            }
            let rows = within.start..within.start + block.len();
            match runs.last_mut() {
                Some((span, run)) if Arc::ptr_eq(span, &within.span) && run.end == rows.start => {
                    run.end = rows.end;
                }
                _ => runs.push((&within.span, rows)),
            }
            used += 1;
        }
        // The leading runs are read in place; the blocks of any past the most are copied.
        let worth = runs.len().min(MAX_SHARED_SEGMENTS);
        if worth < runs.len() {
            let shared_rows: usize = runs[..worth].iter().map(|(_, rows)| rows.len()).sum();
            used = 0;
            let mut rows = 0;
            while rows < shared_rows {
                rows += blocks[used].len();
                used += 1;
            }
            runs.truncate(worth);
        }
        let mut cache = Self::from_blocks(layout, device, &blocks[used..], reserve)?;
        if runs.is_empty() {
            return Ok(cache);
        }
        let positions: Vec<u32> = runs
            .iter()
            .flat_map(|(span, rows)| span.positions()[rows.clone()].iter().copied())
            .collect();
        for (layer_idx, layer) in cache.layers.iter_mut().enumerate() {
            let shared = runs
                .iter()
                .map(|(span, rows)| {
                    let (keys, values) = span.layer(layer_idx)?;
                    Ok(SharedRows {
                        segment: KvSegment {
                            keys: keys.narrow(0, rows.start, rows.len())?,
                            values: values.narrow(0, rows.start, rows.len())?,
                        },
                        buffer: SharedBuffer::of(keys, values),
                    })
                })
                .collect::<Result<Vec<_>, KvCacheError>>()?;
            layer.prepend_shared(shared, &positions)?;
        }
        Ok(cache)
    }

    /// Whether a cache of `layout` on `device` can read `span`'s rows where they are: tensors of
    /// its dtype, row shape and layers, contiguous, on its device.
    fn readable_in_place(layout: &KvLayout, device: &Device, span: &KvBlock) -> bool {
        span.holds_tensors()
            && span.n_layers() == layout.n_layers
            && span.row_shape() == Some((layout.n_kv_heads, layout.head_dim))
            && span.dtype() == Some(layout.dtype)
            && span.layers().is_ok_and(|layers| {
                layers.iter().all(|(keys, values)| {
                    keys.is_contiguous()
                        && values.is_contiguous()
                        && keys.device().same_device(device)
                })
            })
    }

    /// Makes the rows every layer holds now shared ones, so clones made afterwards (the choices
    /// of one prompt) read them without a copy each and append into buffers of their own.
    pub fn share_rows(&mut self) -> Result<(), KvCacheError> {
        self.check_consistent()?;
        for layer in &mut self.layers {
            layer.share_own_rows()?;
        }
        Ok(())
    }

    /// Slots held in rows shared with other caches (the first ones).
    pub fn shared_rows(&self) -> usize {
        self.layers.first().map_or(0, LayerKv::shared_rows)
    }

    /// Bytes of the buffers this cache reads that `seen` does not name yet, which it then
    /// names: summed over caches with one `seen`, the memory they hold together, each buffer
    /// counted once however many share it (spare rows included).
    pub fn resident_bytes(&self, seen: &mut HashSet<(usize, usize)>) -> usize {
        self.layers
            .iter()
            .flat_map(LayerKv::buffers)
            .filter(|buffer| seen.insert(buffer.id()))
            .map(|buffer| buffer.bytes)
            .sum()
    }

    fn check_block(&self, block: &KvBlock) -> Result<(), KvCacheError> {
        if block.n_layers() != self.layout.n_layers {
            return Err(KvCacheError::Shape(format!(
                "block has {} layers, the cache {}",
                block.n_layers(),
                self.layout.n_layers
            )));
        }
        if let Some((kv_heads, head_dim)) = block.row_shape()
            && (kv_heads, head_dim) != (self.layout.n_kv_heads, self.layout.head_dim)
        {
            return Err(KvCacheError::Shape(format!(
                "block rows are {kv_heads}x{head_dim}, the cache's {}x{}",
                self.layout.n_kv_heads, self.layout.head_dim
            )));
        }
        Ok(())
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Number of slots of layer 0 (all layers agree between whole-model calls).
    /// Attention over this cache, from now on (later prefill chunks and every decoding step),
    /// re-weights `contexts`' rows; `None` restores plain attention.
    pub fn set_parallel_contexts(&mut self, contexts: Option<ParallelContexts>) {
        self.parallel = contexts.map(Arc::new);
    }

    pub fn parallel_contexts(&self) -> Option<&ParallelContexts> {
        self.parallel.as_deref()
    }

    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerKv::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots every layer holds before an append has to copy it into a larger buffer.
    pub fn capacity(&self) -> usize {
        self.layers.iter().map(LayerKv::capacity).min().unwrap_or(0)
    }

    /// Bytes the cache's own buffers take, spare rows included (clones sharing a buffer each count
    /// it; shared rows are not counted: [`Self::resident_bytes`] counts both once).
    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(LayerKv::allocated_bytes).sum()
    }

    /// Appends never grow a layer past `slots` slots ahead of need (they grow geometrically
    /// otherwise): a server that reserved room for a sequence's prompt and answer keeps its
    /// cache within that.
    pub fn limit_rows(&mut self, slots: usize) {
        for layer in &mut self.layers {
            layer.limit_rows(slots);
        }
    }

    /// Positions of the slots of layer 0.
    pub fn positions(&self) -> &[u32] {
        self.layers.first().map_or(&[], |layer| layer.positions())
    }

    pub fn layer(&self, layer_idx: usize) -> Result<&LayerKv, KvCacheError> {
        self.layers
            .get(layer_idx)
            .ok_or(KvCacheError::LayerOutOfRange {
                layer_idx,
                n_layers: self.layers.len(),
            })
    }

    fn layer_mut(&mut self, layer_idx: usize) -> Result<&mut LayerKv, KvCacheError> {
        let n_layers = self.layers.len();
        self.layers
            .get_mut(layer_idx)
            .ok_or(KvCacheError::LayerOutOfRange {
                layer_idx,
                n_layers,
            })
    }

    /// Writes one layer's rows at `slots` (see [`LayerKv::write`]).
    pub fn write(
        &mut self,
        layer_idx: usize,
        slots: &[usize],
        keys: &Tensor,
        values: &Tensor,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        self.layer_mut(layer_idx)?
            .write(slots, keys, values, positions)
    }

    /// Checks that every layer holds the same slots at the same positions.
    pub fn check_consistent(&self) -> Result<(), KvCacheError> {
        let first = self.positions();
        for (layer_idx, layer) in self.layers.iter().enumerate() {
            if layer.positions() != first {
                return Err(KvCacheError::LayersDisagree(format!(
                    "layer {layer_idx} holds {} slots, layer 0 {}",
                    layer.len(),
                    first.len()
                )));
            }
        }
        Ok(())
    }

    /// Copies the given slots of every layer out as a block (e.g. a module's own tokens).
    pub fn gather(&self, slots: &[usize]) -> Result<KvBlock, KvCacheError> {
        self.gather_rows(slots, false)
    }

    /// [`Self::gather`] where a sliding-window layer may have left some of the slots out
    /// ([`Self::from_blocks_for`]): their rows in that layer are zeros. No query of this cache
    /// can see such a slot in that layer (it is outside the window of every query at or after
    /// the horizon, and masks go by position), so a cache rebuilt from the block at the same
    /// positions attends as this one does; moving the block to other positions would not.
    pub fn gather_visible(&self, slots: &[usize]) -> Result<KvBlock, KvCacheError> {
        self.gather_rows(slots, true)
    }

    fn gather_rows(&self, slots: &[usize], zero_not_held: bool) -> Result<KvBlock, KvCacheError> {
        self.check_consistent()?;
        let len = self.len();
        if let Some(&slot) = slots.iter().find(|&&slot| slot >= len) {
            return Err(KvCacheError::SlotOutOfRange { slot, len });
        }
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let (keys, values) = (layer.keys()?, layer.values()?);
                let missing = zero_not_held && slots.iter().any(|&slot| slot < layer.first_held());
                if !missing {
                    let rows = slots
                        .iter()
                        .map(|&slot| layer.held_row(slot))
                        .collect::<Result<Vec<_>, _>>()?;
                    let index = row_index(&rows, &self.device)?;
                    return Ok((
                        keys.index_select(&index, 0)?,
                        values.index_select(&index, 0)?,
                    ));
                }
                // One zero row after the held ones stands in for every slot left out.
                let held = keys.dim(0)?;
                let zero_row = |rows: &Tensor| -> Result<Tensor, KvCacheError> {
                    let (_, heads, dim) = rows.dims3()?;
                    let zero = Tensor::zeros((1, heads, dim), rows.dtype(), rows.device())?;
                    Ok(Tensor::cat(&[rows, &zero], 0)?)
                };
                let rows: Vec<usize> = slots
                    .iter()
                    .map(|&slot| slot.checked_sub(layer.first_held()).unwrap_or(held))
                    .collect();
                let index = row_index(&rows, &self.device)?;
                Ok((
                    zero_row(&keys)?.index_select(&index, 0)?,
                    zero_row(&values)?.index_select(&index, 0)?,
                ))
            })
            .collect::<Result<_, KvCacheError>>()?;
        let positions = slots.iter().map(|&slot| self.positions()[slot]).collect();
        KvBlock::new(layers, positions)
    }

    /// Copies a contiguous range of slots out as a block.
    pub fn slice(&self, slots: Range<usize>) -> Result<KvBlock, KvCacheError> {
        self.check_consistent()?;
        let len = self.len();
        if slots.end > len || slots.start > slots.end {
            return Err(KvCacheError::SlotOutOfRange {
                slot: slots.end,
                len,
            });
        }
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let rows = if slots.is_empty() {
                    0..0
                } else {
                    layer.held_row(slots.start)?..layer.held_row(slots.end)?
                };
                let (keys, values) = layer.held_rows(rows)?;
                // A copy of the rows alone: a view would keep the whole buffer it is cut from
                // alive, and candle's `Tensor::copy` clones that whole buffer.
                Ok((keys.force_contiguous()?, values.force_contiguous()?))
            })
            .collect::<Result<_, KvCacheError>>()?;
        KvBlock::new(layers, self.positions()[slots].to_vec())
    }

    /// Every slot as a block.
    pub fn to_block(&self) -> Result<KvBlock, KvCacheError> {
        self.slice(0..self.len())
    }

    /// Overwrites the given slots of every layer with a block's rows and positions.
    pub fn scatter(&mut self, slots: &[usize], block: &KvBlock) -> Result<(), KvCacheError> {
        self.check_block(block)?;
        if slots.len() != block.len() {
            return Err(KvCacheError::Shape(format!(
                "{} slots for a block of {}",
                slots.len(),
                block.len()
            )));
        }
        for (layer, (keys, values)) in self.layers.iter_mut().zip(block.layers()?) {
            layer.write(slots, keys, values, block.positions())?;
        }
        Ok(())
    }

    /// Appends a block's slots after the existing ones.
    pub fn append_block(&mut self, block: &KvBlock) -> Result<(), KvCacheError> {
        self.check_consistent()?;
        let slots: Vec<usize> = (self.len()..self.len() + block.len()).collect();
        self.scatter(&slots, block)
    }

    /// Drops every slot from `len` on, in every layer.
    pub fn truncate(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.truncate(len);
        }
    }

    /// [`Self::truncate`] of slots the last pass appended (a verification pass's rejected
    /// drafts), for a caller that holds no view of their rows: later appends write over them in
    /// place instead of copying every layer's buffer first.
    pub fn rollback(&mut self, len: usize) {
        for layer in &mut self.layers {
            layer.rollback(len);
        }
    }

    /// Bytes of the live K and V rows held.
    pub fn size_in_bytes(&self) -> usize {
        let row_bytes =
            2 * self.layout.n_kv_heads * self.layout.head_dim * self.layout.dtype.size_in_bytes();
        self.layers
            .iter()
            .map(|layer| layer.held_positions().len() * row_bytes)
            .sum()
    }
}

/// The earliest position any later query of a spliced cache will have, and each layer's
/// sliding window (`None`: the layer sees every earlier key): what a splice may leave out
/// ([`KvCache::from_blocks_for`]).
#[derive(Clone, Copy, Debug)]
pub struct QueryHorizon<'a> {
    pub first_query: u32,
    pub windows: &'a [Option<usize>],
}

impl QueryHorizon<'_> {
    /// Per layer, the first slot some query at `first_query` or later may see; a query at `q`
    /// sees a key at `k` when `k <= q` and `q - k < window` (the kernels' rule), so a key with
    /// `k + window <= first_query` is hidden from all of them.
    fn first_held(&self, positions: &[u32], n_layers: usize) -> Result<Vec<usize>, KvCacheError> {
        if self.windows.len() != n_layers {
            return Err(KvCacheError::Shape(format!(
                "{} sliding windows for a cache of {n_layers} layers",
                self.windows.len()
            )));
        }
        Ok(self
            .windows
            .iter()
            .map(|window| match window {
                Some(window) => positions
                    .iter()
                    .position(|&key| u64::from(key) + *window as u64 > u64::from(self.first_query))
                    .unwrap_or(positions.len()),
                None => 0,
            })
            .collect())
    }
}
