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
//! Blocks may hold another dtype than the cache (stored states are f16, the cache f32):
//! [`KvCache::from_blocks`] converts each block's rows straight into the new buffers, one pass
//! per value and no intermediate tensor, layers in parallel.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{CpuStorage, DType, Device, IndexOp, Storage, Tensor, WithDType};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Why a cache operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum KvCacheError {
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("layer {layer_idx} out of range: the cache has {n_layers} layers")]
    LayerOutOfRange { layer_idx: usize, n_layers: usize },
    #[error("slot {slot} out of range: the layer holds {len} slots")]
    SlotOutOfRange { slot: usize, len: usize },
    #[error(
        "slot {slot} is neither an existing slot nor the next free one ({next_free}); new slots \
         must be appended in order"
    )]
    SlotNotContiguous { slot: usize, next_free: usize },
    #[error("slot {slot} is written twice in one call")]
    DuplicateSlot { slot: usize },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("layers hold different slots ({0}); finish the layer-by-layer pass first")]
    LayersDisagree(String),
}

/// Shape of the cache of one model: what every layer's K and V rows look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
}

/// K/V of some slots, all layers, with their positions: what a module store keeps and splices.
#[derive(Clone, Debug)]
pub struct KvBlock {
    /// Per layer `(keys, values)`, each `(n_slots, kv_heads, head_dim)`, K after RoPE.
    layers: Vec<(Tensor, Tensor)>,
    positions: Vec<u32>,
}

impl KvBlock {
    /// Checks that every layer has one row per position and the same row shape.
    pub fn new(layers: Vec<(Tensor, Tensor)>, positions: Vec<u32>) -> Result<Self, KvCacheError> {
        let mut row_shape = None;
        for (layer_idx, (keys, values)) in layers.iter().enumerate() {
            let (n_keys, kv_heads, head_dim) = keys.dims3()?;
            if keys.dims() != values.dims() || n_keys != positions.len() {
                return Err(KvCacheError::Shape(format!(
                    "layer {layer_idx}: keys {:?}, values {:?}, {} positions",
                    keys.dims(),
                    values.dims(),
                    positions.len()
                )));
            }
            if *row_shape.get_or_insert((kv_heads, head_dim)) != (kv_heads, head_dim) {
                return Err(KvCacheError::Shape(format!(
                    "layer {layer_idx} has rows of {kv_heads}x{head_dim}, layer 0 differs"
                )));
            }
        }
        Ok(Self { layers, positions })
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// `(keys, values)` of one layer, each `(n_slots, kv_heads, head_dim)`.
    pub fn layer(&self, layer_idx: usize) -> Result<&(Tensor, Tensor), KvCacheError> {
        self.layers
            .get(layer_idx)
            .ok_or(KvCacheError::LayerOutOfRange {
                layer_idx,
                n_layers: self.layers.len(),
            })
    }

    pub fn layers(&self) -> &[(Tensor, Tensor)] {
        &self.layers
    }

    /// Bytes of K and V together.
    pub fn size_in_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| {
                k.elem_count() * k.dtype().size_in_bytes()
                    + v.elem_count() * v.dtype().size_in_bytes()
            })
            .sum()
    }
}

/// One layer of the cache.
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// `(capacity, kv_heads, head_dim)`; rows `0..positions.len()` are live.
    key_buffer: Tensor,
    value_buffer: Tensor,
    positions: Vec<u32>,
    /// Rows below this may be visible through views taken before a truncation, so they are
    /// never written in place. Views of live rows need no such guard: appends write past them.
    exposed_rows: usize,
    /// Shared by clones of this layer; a clone must not append into a buffer another owns.
    owner: Arc<()>,
}

impl LayerKv {
    fn empty(layout: &KvLayout, device: &Device) -> Result<Self, KvCacheError> {
        let buffer = Tensor::zeros(
            (0, layout.n_kv_heads, layout.head_dim),
            layout.dtype,
            device,
        )?;
        Ok(Self {
            key_buffer: buffer.clone(),
            value_buffer: buffer,
            positions: Vec::new(),
            exposed_rows: 0,
            owner: Arc::new(()),
        })
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Position of every live slot.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// K of every live slot, `(n_slots, kv_heads, head_dim)`, after RoPE. The view keeps its
    /// contents whatever is written later, so K before and after a recompute can be compared.
    pub fn keys(&self) -> Result<Tensor, KvCacheError> {
        Ok(self.key_buffer.narrow(0, 0, self.len())?)
    }

    /// V of every live slot, `(n_slots, kv_heads, head_dim)`.
    pub fn values(&self) -> Result<Tensor, KvCacheError> {
        Ok(self.value_buffer.narrow(0, 0, self.len())?)
    }

    fn capacity(&self) -> usize {
        self.key_buffer.dims()[0]
    }

    /// Writes `keys`/`values` rows (`(n, kv_heads, head_dim)`) at `slots`: a slot below `len()`
    /// is overwritten, the others must be `len()`, `len() + 1`, ... in order and are appended.
    pub fn write(
        &mut self,
        slots: &[usize],
        keys: &Tensor,
        values: &Tensor,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        let (n_rows, kv_heads, head_dim) = keys.dims3()?;
        let (_, buffer_heads, buffer_dim) = self.key_buffer.dims3()?;
        if keys.dims() != values.dims()
            || n_rows != slots.len()
            || n_rows != positions.len()
            || (kv_heads, head_dim) != (buffer_heads, buffer_dim)
        {
            return Err(KvCacheError::Shape(format!(
                "write of keys {:?}, values {:?} at {} slots with {} positions into rows of \
                 {buffer_heads}x{buffer_dim}",
                keys.dims(),
                values.dims(),
                slots.len(),
                positions.len()
            )));
        }
        let old_len = self.len();
        let mut overwrite_rows = Vec::new();
        let mut append_rows = Vec::new();
        let mut seen = vec![false; old_len + n_rows];
        for (row, &slot) in slots.iter().enumerate() {
            if slot < old_len {
                overwrite_rows.push(row);
            } else if slot == old_len + append_rows.len() {
                append_rows.push(row);
            } else {
                return Err(KvCacheError::SlotNotContiguous {
                    slot,
                    next_free: old_len + append_rows.len(),
                });
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(KvCacheError::DuplicateSlot { slot });
            }
        }
        let keys = keys.to_dtype(self.key_buffer.dtype())?;
        let values = values.to_dtype(self.value_buffer.dtype())?;
        if !append_rows.is_empty() {
            let (new_keys, new_values) = if overwrite_rows.is_empty() {
                (keys.clone(), values.clone())
            } else {
                let rows = row_index(&append_rows, keys.device())?;
                (keys.index_select(&rows, 0)?, values.index_select(&rows, 0)?)
            };
            let new_positions: Vec<u32> = append_rows.iter().map(|&row| positions[row]).collect();
            self.append(&new_keys, &new_values, &new_positions)?;
        }
        if !overwrite_rows.is_empty() {
            let target_slots: Vec<usize> = overwrite_rows.iter().map(|&row| slots[row]).collect();
            let rows = row_index(&overwrite_rows, keys.device())?;
            let new_keys = keys.index_select(&rows, 0)?;
            let new_values = values.index_select(&rows, 0)?;
            self.overwrite(&target_slots, &new_keys, &new_values)?;
            for (&row, &slot) in overwrite_rows.iter().zip(&target_slots) {
                self.positions[slot] = positions[row];
            }
        }
        Ok(())
    }

    fn append(
        &mut self,
        keys: &Tensor,
        values: &Tensor,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        let old_len = self.len();
        let needed = old_len + positions.len();
        let shared = Arc::strong_count(&self.owner) > 1;
        if needed > self.capacity() || shared || self.exposed_rows > old_len {
            // Grow geometrically so decoding costs amortised O(1) copies per token.
            let capacity = needed.max(2 * self.capacity()).max(64);
            self.key_buffer = reallocate(&self.key_buffer, old_len, capacity)?;
            self.value_buffer = reallocate(&self.value_buffer, old_len, capacity)?;
            self.owner = Arc::new(());
            self.exposed_rows = 0;
        }
        self.key_buffer.slice_set(&keys.contiguous()?, 0, old_len)?;
        self.value_buffer
            .slice_set(&values.contiguous()?, 0, old_len)?;
        self.positions.extend_from_slice(positions);
        Ok(())
    }

    /// Copy-on-write: earlier views of these slots keep their old contents.
    fn overwrite(
        &mut self,
        slots: &[usize],
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<(), KvCacheError> {
        let (n_rows, kv_heads, head_dim) = keys.dims3()?;
        let slot_ids: Vec<u32> = slots.iter().map(|&slot| slot as u32).collect();
        let index = Tensor::from_vec(slot_ids, (n_rows, 1, 1), keys.device())?
            .broadcast_as((n_rows, kv_heads, head_dim))?
            .contiguous()?;
        self.key_buffer = self.key_buffer.scatter(&index, keys, 0)?;
        self.value_buffer = self.value_buffer.scatter(&index, values, 0)?;
        self.owner = Arc::new(());
        self.exposed_rows = 0;
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        if len < self.len() {
            // Views of the dropped rows may still be alive; never append over them in place.
            self.exposed_rows = self.exposed_rows.max(self.len());
            self.positions.truncate(len);
        }
    }
}

fn row_index(rows: &[usize], device: &Device) -> Result<Tensor, KvCacheError> {
    let rows: Vec<u32> = rows.iter().map(|&row| row as u32).collect();
    let n_rows = rows.len();
    Ok(Tensor::from_vec(rows, n_rows, device)?)
}

/// `parts` (each `(n, kv_heads, head_dim)`, of any stored dtype) one after another in a new
/// buffer of `capacity` rows of the cache's dtype, zeros after them. On the CPU each value is
/// converted straight into the buffer (half's slice conversions use F16C where the CPU has it);
/// elsewhere, or for a dtype without a direct path, through candle.
fn splice_rows(
    parts: &[&Tensor],
    capacity: usize,
    layout: &KvLayout,
    device: &Device,
) -> Result<Tensor, KvCacheError> {
    let shape = (capacity, layout.n_kv_heads, layout.head_dim);
    match (device, layout.dtype) {
        (Device::Cpu, DType::F32) => Ok(Tensor::from_vec(
            fill_rows::<f32>(parts, shape)?,
            shape,
            device,
        )?),
        (Device::Cpu, DType::F16) => Ok(Tensor::from_vec(
            fill_rows::<f16>(parts, shape)?,
            shape,
            device,
        )?),
        _ => {
            let buffer = Tensor::zeros(shape, layout.dtype, device)?;
            let mut offset = 0;
            for part in parts
                .iter()
                .filter(|part| part.dim(0).is_ok_and(|rows| rows > 0))
            {
                buffer.slice_set(&part.to_dtype(layout.dtype)?.contiguous()?, 0, offset)?;
                offset += part.dim(0)?;
            }
            Ok(buffer)
        }
    }
}

/// The values of [`splice_rows`]'s buffer, for a cache of element type `T`.
fn fill_rows<T: CacheElement>(
    parts: &[&Tensor],
    (capacity, kv_heads, head_dim): (usize, usize, usize),
) -> Result<Vec<T>, KvCacheError> {
    // Zeroed allocation: fresh pages from the OS, not a pass over the buffer.
    let mut data = vec![T::from_f64(0.0); capacity * kv_heads * head_dim];
    let mut offset = 0;
    for part in parts {
        let len = part.elem_count();
        let target = data.get_mut(offset..offset + len).ok_or_else(|| {
            KvCacheError::Shape(format!(
                "rows of {:?} past a buffer of {capacity} rows",
                part.dims()
            ))
        })?;
        let (storage, tensor_layout) = part.storage_and_layout();
        let converted = match (&*storage, tensor_layout.contiguous_offsets()) {
            (Storage::Cpu(values), Some((start, end))) => T::convert(values, start..end, target),
            _ => false,
        };
        drop(storage);
        if !converted {
            let values = part.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1::<T>()?;
            target.copy_from_slice(&values);
        }
        offset += len;
    }
    Ok(data)
}

/// An element type the cache is kept in, with direct conversions from the stored dtypes.
trait CacheElement: WithDType {
    /// Writes `source[range]`, converted, into `target` (of the same length); `false` when
    /// there is no direct path for `source`'s dtype (the caller goes through candle).
    fn convert(source: &CpuStorage, range: Range<usize>, target: &mut [Self]) -> bool;
}

impl CacheElement for f32 {
    fn convert(source: &CpuStorage, range: Range<usize>, target: &mut [Self]) -> bool {
        match source {
            CpuStorage::F32(values) => values
                .get(range)
                .map(|values| target.copy_from_slice(values)),
            CpuStorage::F16(values) => values
                .get(range)
                .map(|values| values.convert_to_f32_slice(target)),
            CpuStorage::BF16(values) => values
                .get(range)
                .map(|values| values.convert_to_f32_slice(target)),
            _ => None,
        }
        .is_some()
    }
}

impl CacheElement for f16 {
    fn convert(source: &CpuStorage, range: Range<usize>, target: &mut [Self]) -> bool {
        match source {
            CpuStorage::F16(values) => values
                .get(range)
                .map(|values| target.copy_from_slice(values)),
            CpuStorage::F32(values) => values
                .get(range)
                .map(|values| target.convert_from_f32_slice(values)),
            _ => None,
        }
        .is_some()
    }
}

/// A new buffer of `capacity` rows holding the first `live_rows` rows of `buffer`.
fn reallocate(buffer: &Tensor, live_rows: usize, capacity: usize) -> Result<Tensor, KvCacheError> {
    let (_, kv_heads, head_dim) = buffer.dims3()?;
    let fresh = Tensor::zeros(
        (capacity, kv_heads, head_dim),
        buffer.dtype(),
        buffer.device(),
    )?;
    if live_rows > 0 {
        fresh.slice_set(&buffer.narrow(0, 0, live_rows)?.contiguous()?, 0, 0)?;
    }
    Ok(fresh)
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
            .map(|_| LayerKv::empty(&layout, device))
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
        let mut cache = Self::new(layout, device)?;
        let total: usize = blocks.iter().map(|block| block.len()).sum();
        for block in blocks {
            cache.check_block(block)?;
        }
        let capacity = total + reserve;
        // Layers are independent and the work is memory traffic: on every core.
        let buffers = (0..layout.n_layers)
            .into_par_iter()
            .map(|layer_idx| {
                let keys: Vec<&Tensor> = blocks
                    .iter()
                    .map(|block| &block.layers[layer_idx].0)
                    .collect();
                let values: Vec<&Tensor> = blocks
                    .iter()
                    .map(|block| &block.layers[layer_idx].1)
                    .collect();
                Ok((
                    splice_rows(&keys, capacity, &layout, device)?,
                    splice_rows(&values, capacity, &layout, device)?,
                ))
            })
            .collect::<Result<Vec<_>, KvCacheError>>()?;
        let positions: Vec<u32> = blocks
            .iter()
            .flat_map(|block| block.positions.iter().copied())
            .collect();
        for (layer, (key_buffer, value_buffer)) in cache.layers.iter_mut().zip(buffers) {
            layer.key_buffer = key_buffer;
            layer.value_buffer = value_buffer;
            layer.positions = positions.clone();
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
        if let Some((keys, _)) = block.layers.first() {
            let (_, kv_heads, head_dim) = keys.dims3()?;
            if (kv_heads, head_dim) != (self.layout.n_kv_heads, self.layout.head_dim) {
                return Err(KvCacheError::Shape(format!(
                    "block rows are {kv_heads}x{head_dim}, the cache's {}x{}",
                    self.layout.n_kv_heads, self.layout.head_dim
                )));
            }
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
        let index = row_index(slots, &self.device)?;
        let layers = self
            .layers
            .iter()
            .map(|layer| {
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
                Ok((
                    layer.key_buffer.i(slots.clone())?.contiguous()?,
                    layer.value_buffer.i(slots.clone())?.contiguous()?,
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
        for (layer, (keys, values)) in self.layers.iter_mut().zip(&block.layers) {
            layer.write(slots, keys, values, &block.positions)?;
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

    /// Bytes of the live K and V rows.
    pub fn size_in_bytes(&self) -> usize {
        let row_bytes =
            2 * self.layout.n_kv_heads * self.layout.head_dim * self.layout.dtype.size_in_bytes();
        self.layers
            .iter()
            .map(|layer| layer.len() * row_bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYOUT: KvLayout = KvLayout {
        n_layers: 2,
        n_kv_heads: 2,
        head_dim: 3,
        dtype: DType::F32,
    };

    /// Rows whose every entry is `first_value + row`, `(n_rows, 2, 3)`.
    fn rows(first_value: f32, n_rows: usize) -> Tensor {
        let values: Vec<f32> = (0..n_rows)
            .flat_map(|row| std::iter::repeat_n(first_value + row as f32, 6))
            .collect();
        Tensor::from_vec(values, (n_rows, 2, 3), &Device::Cpu).unwrap()
    }

    /// First entry of every row of a `(n, heads, dim)` tensor.
    fn row_values(tensor: &Tensor) -> Vec<f32> {
        tensor
            .narrow(1, 0, 1)
            .and_then(|t| t.narrow(2, 0, 1))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .unwrap()
    }

    fn cache_with(n_rows: usize) -> KvCache {
        let mut cache = KvCache::new(LAYOUT, &Device::Cpu).unwrap();
        let slots: Vec<usize> = (0..n_rows).collect();
        let positions: Vec<u32> = (0..n_rows as u32).map(|p| p * 10).collect();
        for layer_idx in 0..LAYOUT.n_layers {
            let keys = rows(0.0, n_rows);
            let values = rows(100.0, n_rows);
            cache
                .write(layer_idx, &slots, &keys, &values, &positions)
                .unwrap();
        }
        cache
    }

    #[test]
    fn appends_and_overwrites_by_slot() {
        let mut cache = cache_with(3);
        cache
            .write(0, &[1, 3, 4], &rows(50.0, 3), &rows(150.0, 3), &[7, 8, 9])
            .unwrap();
        let layer = cache.layer(0).unwrap();
        assert_eq!(
            row_values(&layer.keys().unwrap()),
            vec![0.0, 50.0, 2.0, 51.0, 52.0]
        );
        assert_eq!(
            row_values(&layer.values().unwrap()),
            vec![100.0, 150.0, 102.0, 151.0, 152.0]
        );
        assert_eq!(layer.positions(), &[0, 7, 20, 8, 9]);
        assert_eq!(cache.layer(1).unwrap().len(), 3, "other layers untouched");
        assert!(cache.check_consistent().is_err());
    }

    #[test]
    fn a_cache_with_room_appends_in_place_until_full() {
        let mut cache = KvCache::with_capacity(LAYOUT, &Device::Cpu, 4).unwrap();
        assert_eq!((cache.len(), cache.capacity()), (0, 4));
        for slot in 0..4 {
            for layer_idx in 0..LAYOUT.n_layers {
                cache
                    .write(
                        layer_idx,
                        &[slot],
                        &rows(slot as f32, 1),
                        &rows(100.0 + slot as f32, 1),
                        &[slot as u32],
                    )
                    .unwrap();
            }
            assert_eq!(cache.capacity(), 4, "slot {slot} appended in place");
        }
        assert_eq!(
            row_values(&cache.layer(1).unwrap().keys().unwrap()),
            vec![0.0, 1.0, 2.0, 3.0]
        );
        for layer_idx in 0..LAYOUT.n_layers {
            cache
                .write(layer_idx, &[4], &rows(4.0, 1), &rows(104.0, 1), &[4])
                .unwrap();
        }
        assert!(cache.capacity() > 4, "a full cache grows");
        assert_eq!(cache.positions(), &[0, 1, 2, 3, 4]);
    }

    #[test]
    fn refuses_gaps_duplicates_and_bad_shapes() {
        let mut cache = cache_with(2);
        let gap = cache.write(0, &[3], &rows(0.0, 1), &rows(0.0, 1), &[1]);
        assert!(matches!(
            gap,
            Err(KvCacheError::SlotNotContiguous {
                slot: 3,
                next_free: 2
            })
        ));
        let duplicate = cache.write(0, &[1, 1], &rows(0.0, 2), &rows(0.0, 2), &[1, 2]);
        assert!(matches!(
            duplicate,
            Err(KvCacheError::DuplicateSlot { slot: 1 })
        ));
        let short = cache.write(0, &[2, 3], &rows(0.0, 1), &rows(0.0, 1), &[1, 2]);
        assert!(matches!(short, Err(KvCacheError::Shape(_))));
        assert!(matches!(
            cache.gather(&[5]),
            Err(KvCacheError::SlotOutOfRange { slot: 5, len: 2 })
        ));
        assert_eq!(cache.len(), 2, "failed writes change nothing");
    }

    #[test]
    fn views_never_change_after_they_are_taken() {
        let mut cache = cache_with(3);
        let keys_before = cache.layer(0).unwrap().keys().unwrap();
        cache
            .write(0, &[0, 3], &rows(70.0, 2), &rows(170.0, 2), &[1, 2])
            .unwrap();
        assert_eq!(row_values(&keys_before), vec![0.0, 1.0, 2.0]);

        // Truncation then append: the append must not land in the old view's rows.
        let view = cache.layer(1).unwrap().keys().unwrap();
        cache.truncate(1);
        cache
            .write(1, &[1, 2], &rows(90.0, 2), &rows(190.0, 2), &[5, 6])
            .unwrap();
        assert_eq!(row_values(&view), vec![0.0, 1.0, 2.0]);
        assert_eq!(
            row_values(&cache.layer(1).unwrap().keys().unwrap()),
            vec![0.0, 90.0, 91.0]
        );
    }

    #[test]
    fn clones_append_independently() {
        let original = cache_with(2);
        let mut first = original.clone();
        let mut second = original.clone();
        first
            .write(0, &[2], &rows(10.0, 1), &rows(10.0, 1), &[1])
            .unwrap();
        second
            .write(0, &[2], &rows(20.0, 1), &rows(20.0, 1), &[1])
            .unwrap();
        let keys = |cache: &KvCache| row_values(&cache.layer(0).unwrap().keys().unwrap());
        assert_eq!(keys(&first), vec![0.0, 1.0, 10.0]);
        assert_eq!(keys(&second), vec![0.0, 1.0, 20.0]);
        assert_eq!(keys(&original), vec![0.0, 1.0]);
    }

    #[test]
    fn gather_scatter_and_splice_round_trip() {
        let cache = cache_with(4);
        let block = cache.gather(&[3, 1]).unwrap();
        assert_eq!(block.positions(), &[30, 10]);
        assert_eq!(row_values(&block.layer(0).unwrap().0), vec![3.0, 1.0]);

        let mut target = cache_with(4);
        target.scatter(&[0, 4], &block).unwrap();
        assert_eq!(target.positions(), &[30, 10, 20, 30, 10]);
        assert_eq!(
            row_values(&target.layer(1).unwrap().values().unwrap()),
            vec![103.0, 101.0, 102.0, 103.0, 101.0]
        );

        let head = cache.slice(0..2).unwrap();
        let spliced = KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&head, &block], 8).unwrap();
        assert_eq!(spliced.positions(), &[0, 10, 30, 10]);
        assert_eq!(
            row_values(&spliced.layer(0).unwrap().keys().unwrap()),
            vec![0.0, 1.0, 3.0, 1.0]
        );
        assert_eq!(spliced.size_in_bytes(), 4 * 2 * 2 * 6 * 4);
        let wrong_layers = KvBlock::new(vec![], vec![]).unwrap();
        assert!(KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&wrong_layers], 0).is_err());
    }

    #[test]
    fn blocks_of_stored_dtypes_are_widened_straight_into_the_cache() {
        // Values exact in f16, so widening must give them back bit for bit.
        let f16_rows =
            |first: f32, n_rows: usize| rows(first, n_rows).to_dtype(DType::F16).unwrap();
        let stored = KvBlock::new(
            vec![(f16_rows(0.5, 3), f16_rows(100.25, 3)); 2],
            vec![0, 1, 2],
        )
        .unwrap();
        let computed = KvBlock::new(vec![(rows(7.0, 2), rows(107.0, 2)); 2], vec![3, 4]).unwrap();
        // A view that is not contiguous (every other row of a larger tensor) takes the slow
        // path and must land in the same place.
        let strided = rows(20.0, 4)
            .reshape((2, 2, 2, 3))
            .and_then(|t| t.narrow(1, 0, 1))
            .and_then(|t| t.squeeze(1))
            .unwrap();
        assert!(!strided.is_contiguous());
        let sparse = KvBlock::new(vec![(strided.clone(), strided); 2], vec![5, 6]).unwrap();
        let spliced =
            KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&stored, &computed, &sparse], 3).unwrap();
        let layer = spliced.layer(1).unwrap();
        assert_eq!(layer.keys().unwrap().dtype(), DType::F32);
        assert_eq!(
            row_values(&layer.keys().unwrap()),
            vec![0.5, 1.5, 2.5, 7.0, 8.0, 20.0, 22.0]
        );
        assert_eq!(
            row_values(&layer.values().unwrap()),
            vec![100.25, 101.25, 102.25, 107.0, 108.0, 20.0, 22.0]
        );
        assert_eq!(layer.capacity(), 7 + 3);
        // Every value of every row, not only the first: the whole row was converted.
        let all = layer
            .keys()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(&all[..6], &[0.5; 6]);
        // The spare rows are zeros.
        let spare = layer.key_buffer.narrow(0, 7, 3).unwrap();
        assert_eq!(
            spare
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap(),
            0.0
        );
    }
}
