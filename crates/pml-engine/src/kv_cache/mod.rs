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
mod splice;
#[cfg(test)]
mod tests;

use std::ops::Range;

use candle_core::{DType, Device, IndexOp, Tensor};

pub use block::{KvBlock, SharedBytes};
pub use layer::LayerKv;
use layer::row_index;

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

    /// Bytes the cache's buffers take, spare rows included (clones sharing a buffer each count
    /// it: an upper bound).
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
        self.check_consistent()?;
        let len = self.len();
        if let Some(&slot) = slots.iter().find(|&&slot| slot >= len) {
            return Err(KvCacheError::SlotOutOfRange { slot, len });
        }
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let rows = slots
                    .iter()
                    .map(|&slot| layer.held_row(slot))
                    .collect::<Result<Vec<_>, _>>()?;
                let index = row_index(&rows, &self.device)?;
                Ok((
                    layer.keys()?.index_select(&index, 0)?,
                    layer.values()?.index_select(&index, 0)?,
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
                Ok((
                    layer.key_buffer.i(rows.clone())?.contiguous()?,
                    layer.value_buffer.i(rows)?.contiguous()?,
                ))
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
