//! The buffers of a cache made from blocks ([`super::KvCache::from_blocks`]): every layer's K and
//! V rows of the blocks one after another, zeros after them for the slots still to come.
//!
//! On the CPU all the buffers are one allocation (reserved ahead by the caller, see
//! [`super::reserve`], or fresh), advised onto huge pages (a fresh process
//! splicing a 4k-token state of the default model faults in ~95 MB: with 4 KiB pages that alone
//! took longer than the copy), and each value is converted straight from where the block holds
//! it (a tensor, or the mapped bytes of a state file) into the buffer: one pass per value, no
//! intermediate tensor, K and V of every layer in parallel.
//!
//! The blocks' rows are laid out as [`Runs`]: one after another, or sorted by position. A layer
//! may start at a later slot (`first_held`, see [`super::KvCache::from_blocks_for`]): its
//! buffer then holds only the slots from there on, and the rows before are never read,
//! converted nor allocated.

use std::ops::Range;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor, WithDType};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::block::{KvBlock, RowSource};
use super::layer::allocated_rows;
use super::reserve::{self, ReservedElement};
use super::{KvCacheError, KvLayout};

/// Per layer `(keys, values)` buffers of slots `first_held[layer]..capacity`; the caller
/// checked that every block has the layout's layers and row shape and that their rows fit.
pub(super) fn splice_buffers(
    blocks: &Runs<'_>,
    capacity: usize,
    first_held: &[usize],
    layout: &KvLayout,
    device: &Device,
) -> Result<Vec<(Tensor, Tensor)>, KvCacheError> {
    match (device, layout.dtype) {
        (Device::Cpu, DType::F32) => splice_on_cpu::<f32>(blocks, capacity, first_held, layout),
        (Device::Cpu, DType::F16) => splice_on_cpu::<f16>(blocks, capacity, first_held, layout),
        _ => (0..layout.n_layers)
            .map(|layer_idx| {
                let first_held = first_held.get(layer_idx).copied().unwrap_or(0);
                let buffer = |values: bool| {
                    let buffer = Tensor::zeros(
                        (
                            allocated_rows(capacity.saturating_sub(first_held), device),
                            layout.n_kv_heads,
                            layout.head_dim,
                        ),
                        layout.dtype,
                        device,
                    )?;
                    for held in blocks.held(first_held) {
                        let (keys, value_rows) = layer_sources(held.block, layer_idx)?;
                        let source = if values { value_rows } else { keys };
                        let rows = source
                            .to_tensor(block_shape(held.block, layout), &Device::Cpu)?
                            .narrow(0, held.rows.start, held.rows.len())?
                            .to_dtype(layout.dtype)?
                            .to_device(device)?;
                        buffer.slice_set(&rows, 0, held.buffer_row)?;
                    }
                    Ok::<_, KvCacheError>(buffer)
                };
                Ok((buffer(false)?, buffer(true)?))
            })
            .collect(),
    }
}

/// Where the blocks' rows go: runs of consecutive rows of one block, each to consecutive
/// slots, in slot order.
pub(super) struct Runs<'a> {
    runs: Vec<Run<'a>>,
}

/// Rows `rows` of `block` at slots `slot..`.
struct Run<'a> {
    block: &'a KvBlock,
    rows: Range<usize>,
    slot: usize,
}

/// The part of a run a layer holds: `rows` of `block`, written from buffer row `buffer_row`.
struct HeldRows<'a> {
    block: &'a KvBlock,
    rows: Range<usize>,
    buffer_row: usize,
}

impl<'a> Runs<'a> {
    /// Every block's rows after the previous block's.
    pub(super) fn in_order(blocks: &[&'a KvBlock]) -> Self {
        let mut slot = 0;
        let runs = blocks
            .iter()
            .filter(|block| !block.is_empty())
            .map(|&block| {
                let run = Run {
                    block,
                    rows: 0..block.len(),
                    slot,
                };
                slot += block.len();
                run
            })
            .collect();
        Self { runs }
    }

    /// Every row in position order (stable: rows at one position keep the blocks' order), so
    /// the rows a sliding window hides from later queries are the first slots.
    pub(super) fn by_position(blocks: &[&'a KvBlock]) -> Self {
        let mut rows: Vec<(u32, usize, usize)> = blocks
            .iter()
            .enumerate()
            .flat_map(|(block_idx, block)| {
                (block.positions().iter().enumerate())
                    .map(move |(row, &position)| (position, block_idx, row))
            })
            .collect();
        rows.sort_by_key(|&(position, _, _)| position);
        let mut runs: Vec<Run<'a>> = Vec::new();
        for (slot, (_, block_idx, row)) in rows.into_iter().enumerate() {
            match runs.last_mut() {
                Some(run) if std::ptr::eq(run.block, blocks[block_idx]) && run.rows.end == row => {
                    run.rows.end += 1;
                }
                _ => runs.push(Run {
                    block: blocks[block_idx],
                    rows: row..row + 1,
                    slot,
                }),
            }
        }
        Self { runs }
    }

    /// The position of every slot.
    pub(super) fn positions(&self) -> Vec<u32> {
        self.runs
            .iter()
            .flat_map(|run| run.block.positions()[run.rows.clone()].iter().copied())
            .collect()
    }

    /// The rows at slot `first_held` or later.
    fn held(&self, first_held: usize) -> impl Iterator<Item = HeldRows<'a>> + '_ {
        self.runs
            .iter()
            .filter(move |run| run.slot + run.rows.len() > first_held)
            .map(move |run| {
                let skip = first_held.saturating_sub(run.slot);
                HeldRows {
                    block: run.block,
                    rows: run.rows.start + skip..run.rows.end,
                    buffer_row: run.slot + skip - first_held,
                }
            })
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
    blocks: &Runs<'_>,
    capacity: usize,
    first_held: &[usize],
    layout: &KvLayout,
) -> Result<Vec<(Tensor, Tensor)>, KvCacheError> {
    let row_len = layout.n_kv_heads * layout.head_dim;
    // Buffer `2 i` is layer i's K, `2 i + 1` its V, each of the layer's held rows; one
    // allocation, so the windowed layers' few rows share huge pages instead of each faulting
    // in its own.
    let buffer_rows: Vec<usize> = (0..2 * layout.n_layers)
        .map(|buffer_idx| {
            let first_held = first_held.get(buffer_idx / 2).copied().unwrap_or(0);
            capacity.saturating_sub(first_held)
        })
        .collect();
    let total_rows: usize = buffer_rows.iter().sum();
    let mut data = reserve::take_or_zeroed::<T>(&buffer_rows, row_len);
    reserve::split_buffers(&mut data, &buffer_rows, row_len)
        .into_par_iter()
        .enumerate()
        .try_for_each(|(buffer_idx, target)| {
            let layer_idx = buffer_idx / 2;
            let first_held = first_held.get(layer_idx).copied().unwrap_or(0);
            for held in blocks.held(first_held) {
                let (keys, values) = layer_sources(held.block, layer_idx)?;
                let source = if buffer_idx % 2 == 0 { keys } else { values };
                let start = held.buffer_row * row_len;
                let len = held.rows.len() * row_len;
                let target = target.get_mut(start..start + len).ok_or_else(|| {
                    KvCacheError::Shape(format!(
                        "{} rows past a buffer of {capacity} rows",
                        held.rows.len()
                    ))
                })?;
                if !T::convert(&source, held.rows.start * row_len, target) {
                    let values = source
                        .to_tensor(block_shape(held.block, layout), &Device::Cpu)?
                        .narrow(0, held.rows.start, held.rows.len())?
                        .to_dtype(T::DTYPE)?
                        .flatten_all()?
                        .to_vec1::<T>()?;
                    target.copy_from_slice(&values);
                }
            }
            Ok::<_, KvCacheError>(())
        })?;
    let all = Tensor::from_vec(
        data,
        (total_rows, layout.n_kv_heads, layout.head_dim),
        &Device::Cpu,
    )?;
    let mut start = 0;
    buffer_rows
        .chunks_exact(2)
        .map(|rows| {
            let keys = all.narrow(0, start, rows[0])?;
            let values = all.narrow(0, start + rows[0], rows[1])?;
            start += rows[0] + rows[1];
            Ok((keys, values))
        })
        .collect()
}

/// Values of one stored dtype, borrowed from a tensor's storage or from mapped bytes.
enum Values<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
}

/// Calls `write` with `len` of `source`'s values from element `skip` on when they can be
/// borrowed as a slice (a contiguous CPU tensor, or aligned little-endian bytes); `false`
/// otherwise.
fn with_values(
    source: &RowSource<'_>,
    (skip, len): (usize, usize),
    write: impl FnOnce(Values<'_>) -> bool,
) -> bool {
    match source {
        RowSource::Tensor(tensor) => {
            let (storage, layout) = tensor.storage_and_layout();
            let Some((start, end)) = layout.contiguous_offsets() else {
                return false;
            };
            let (start, end) = (start + skip, end.min(start + skip + len));
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
        RowSource::Bytes(bytes, dtype) if cfg!(target_endian = "little") => {
            let size = dtype.size_in_bytes();
            let Some(bytes) = bytes.get(skip * size..(skip + len) * size) else {
                return false;
            };
            match dtype {
                DType::F32 => bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::F32(v))),
                DType::F16 => bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::F16(v))),
                DType::BF16 => {
                    bytemuck::try_cast_slice(bytes).is_ok_and(|v| write(Values::BF16(v)))
                }
                _ => false,
            }
        }
        RowSource::Bytes(..) => false,
    }
}

/// An element type the cache is kept in, with direct conversions from the stored dtypes.
trait CacheElement: WithDType + ReservedElement {
    /// Writes `target.len()` of `source`'s values from element `skip` on, converted, into
    /// `target`; `false` when there is no direct path (the caller goes through candle).
    fn convert(source: &RowSource<'_>, skip: usize, target: &mut [Self]) -> bool;
}

impl CacheElement for f32 {
    fn convert(source: &RowSource<'_>, skip: usize, target: &mut [Self]) -> bool {
        with_values(source, (skip, target.len()), |values| {
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
    fn convert(source: &RowSource<'_>, skip: usize, target: &mut [Self]) -> bool {
        with_values(source, (skip, target.len()), |values| {
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
