//! The buffers of a cache made from blocks ([`super::KvCache::from_blocks`]): every layer's K and
//! V rows of the blocks one after another, zeros after them for the slots still to come.
//!
//! On the CPU all the buffers are one allocation, advised onto huge pages (a fresh process
//! splicing a 4k-token state of the default model faults in ~95 MB: with 4 KiB pages that alone
//! took longer than the copy), and each value is converted straight from where the block holds
//! it (a tensor, or the mapped bytes of a state file) into the buffer: one pass per value, no
//! intermediate tensor, K and V of every layer in parallel.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor, WithDType};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::block::{KvBlock, RowSource};
use super::layer::allocated_rows;
use super::{KvCacheError, KvLayout};
use crate::kernels::huge_pages;

/// Per layer `(keys, values)` buffers of `capacity` rows; the caller checked that every block
/// has the layout's layers and row shape and that their rows fit.
pub(super) fn splice_buffers(
    blocks: &[&KvBlock],
    capacity: usize,
    layout: &KvLayout,
    device: &Device,
) -> Result<Vec<(Tensor, Tensor)>, KvCacheError> {
    match (device, layout.dtype) {
        (Device::Cpu, DType::F32) => splice_on_cpu::<f32>(blocks, capacity, layout),
        (Device::Cpu, DType::F16) => splice_on_cpu::<f16>(blocks, capacity, layout),
        _ => (0..layout.n_layers)
            .map(|layer_idx| {
                let buffer = |values: bool| {
                    let buffer = Tensor::zeros(
                        (
                            allocated_rows(capacity, device),
                            layout.n_kv_heads,
                            layout.head_dim,
                        ),
                        layout.dtype,
                        device,
                    )?;
                    let mut offset = 0;
                    for block in blocks.iter().filter(|block| !block.is_empty()) {
                        let (keys, value_rows) = layer_sources(block, layer_idx)?;
                        let source = if values { value_rows } else { keys };
                        let rows = source
                            .to_tensor(block_shape(block, layout), &Device::Cpu)?
                            .to_dtype(layout.dtype)?
                            .to_device(device)?;
                        buffer.slice_set(&rows, 0, offset)?;
                        offset += block.len();
                    }
                    Ok::<_, KvCacheError>(buffer)
                };
                Ok((buffer(false)?, buffer(true)?))
            })
            .collect(),
    }
}

fn block_shape(block: &KvBlock, layout: &KvLayout) -> (usize, usize, usize) {
    (block.len(), layout.n_kv_heads, layout.head_dim)
}

fn layer_sources(
    block: &KvBlock,
    layer_idx: usize,
) -> Result<(RowSource<'_>, RowSource<'_>), KvCacheError> {
    block
        .sources(layer_idx)
        .ok_or(KvCacheError::LayerOutOfRange {
            layer_idx,
            n_layers: block.n_layers(),
        })
}

fn splice_on_cpu<T: CacheElement>(
    blocks: &[&KvBlock],
    capacity: usize,
    layout: &KvLayout,
) -> Result<Vec<(Tensor, Tensor)>, KvCacheError> {
    let buffer_len = capacity * layout.n_kv_heads * layout.head_dim;
    let n_buffers = 2 * layout.n_layers;
    let mut data = huge_pages::zeroed_vec::<T>(n_buffers * buffer_len);
    if buffer_len > 0 {
        // Buffer `2 i` is layer i's K, `2 i + 1` its V.
        data.par_chunks_mut(buffer_len)
            .enumerate()
            .try_for_each(|(buffer_idx, target)| {
                let mut offset = 0;
                for block in blocks {
                    let (keys, values) = layer_sources(block, buffer_idx / 2)?;
                    let source = if buffer_idx % 2 == 0 { keys } else { values };
                    let len = block.len() * layout.n_kv_heads * layout.head_dim;
                    let target = target.get_mut(offset..offset + len).ok_or_else(|| {
                        KvCacheError::Shape(format!(
                            "{} rows past a buffer of {capacity} rows",
                            block.len()
                        ))
                    })?;
                    if !T::convert(&source, target) {
                        let values = source
                            .to_tensor(block_shape(block, layout), &Device::Cpu)?
                            .to_dtype(T::DTYPE)?
                            .flatten_all()?
                            .to_vec1::<T>()?;
                        target.copy_from_slice(&values);
                    }
                    offset += len;
                }
                Ok::<_, KvCacheError>(())
            })?;
    }
    let all = Tensor::from_vec(
        data,
        (n_buffers * capacity, layout.n_kv_heads, layout.head_dim),
        &Device::Cpu,
    )?;
    (0..layout.n_layers)
        .map(|layer_idx| {
            Ok((
                all.narrow(0, 2 * layer_idx * capacity, capacity)?,
                all.narrow(0, (2 * layer_idx + 1) * capacity, capacity)?,
            ))
        })
        .collect()
}

/// Values of one stored dtype, borrowed from a tensor's storage or from mapped bytes.
enum Values<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// Calls `write` with `source`'s values when they can be borrowed as a slice (a contiguous CPU
/// tensor, or aligned little-endian bytes); `false` otherwise.
fn with_values(source: &RowSource<'_>, write: impl FnOnce(Values<'_>) -> bool) -> bool {
    match source {
        RowSource::Tensor(tensor) => {
            let (storage, layout) = tensor.storage_and_layout();
            let Some((start, end)) = layout.contiguous_offsets() else {
                return false;
            };
            match &*storage {
                Storage::Cpu(CpuStorage::F32(values)) => values
                    .get(start..end)
                    .is_some_and(|v| write(Values::F32(v))),
                Storage::Cpu(CpuStorage::F16(values)) => values
                    .get(start..end)
                    .is_some_and(|v| write(Values::F16(v))),
                Storage::Cpu(CpuStorage::BF16(values)) => values
                    .get(start..end)
                    .is_some_and(|v| write(Values::BF16(v))),
                _ => false,
            }
        }
        // Stored states are little-endian; elsewhere candle's byte conversion takes them.
        RowSource::Bytes(bytes, dtype) if cfg!(target_endian = "little") => match dtype {
            DType::F32 => bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::F32(v))),
            DType::F16 => bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::F16(v))),
            DType::BF16 => bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::BF16(v))),
            _ => false,
        },
        RowSource::Bytes(..) => false,
    }
}

/// An element type the cache is kept in, with direct conversions from the stored dtypes.
trait CacheElement: WithDType + bytemuck::Zeroable {
    /// Writes `source`'s values, converted, into `target` (of the same length); `false` when
    /// there is no direct path (the caller goes through candle).
    fn convert(source: &RowSource<'_>, target: &mut [Self]) -> bool;
}

impl CacheElement for f32 {
    fn convert(source: &RowSource<'_>, target: &mut [Self]) -> bool {
        with_values(source, |values| {
            // half's slice conversions use F16C where the CPU has it.
            match values {
                Values::F32(values) if values.len() == target.len() => {
                    target.copy_from_slice(values)
                }
                Values::F16(values) if values.len() == target.len() => {
                    values.convert_to_f32_slice(target)
                }
                Values::BF16(values) if values.len() == target.len() => {
                    values.convert_to_f32_slice(target)
                }
                _ => return false,
            }
            true
        })
    }
}

impl CacheElement for f16 {
    fn convert(source: &RowSource<'_>, target: &mut [Self]) -> bool {
        with_values(source, |values| {
            match values {
                Values::F16(values) if values.len() == target.len() => {
                    target.copy_from_slice(values)
                }
                Values::F32(values) if values.len() == target.len() => {
                    target.convert_from_f32_slice(values)
                }
                _ => return false,
            }
            true
        })
    }
}
