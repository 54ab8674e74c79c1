//! Host memory for the next cache a splice builds, faulted in before that cache is needed.
//!
//! A fresh buffer's pages are backed by the OS when first touched, and on a virtual machine
//! whose host takes back the memory a guest frees (free page reporting, as Firecracker and
//! cloud VMs use it) that first touch is slow: splicing a 4k-token state of Qwen2.5-1.5B (230 MB
//! of f32 rows) took 230–300 ms where the same copy into pages already backed took 20–35 ms.
//! llama.cpp pays the same cost when it creates a context (it clears the context's KV buffers
//! there), not when a prompt arrives. [`KvCache::reserve_host_memory`] lets a caller that
//! knows its next prompt's size do the same: the memory is allocated, advised onto huge pages
//! and touched where the prompt's rows will go, and the splice whose buffers have exactly that
//! shape takes it instead of allocating. One reservation is held per process; a splice of
//! another shape or dtype leaves it alone.

use std::sync::Mutex;

use candle_core::DType;
use half::f16;
use rayon::prelude::*;

use super::{KvCache, KvLayout};
use pml_kernels::memory::huge_pages;

/// Bytes between touches: the smallest page, so every page of the touched rows is backed.
const PAGE_BYTES: usize = 4096;

static RESERVED: Mutex<Option<Reserved>> = Mutex::new(None);

/// Zeroed buffers for a splice of `buffer_rows` rows of `row_len` values per buffer.
struct Reserved {
    buffer_rows: Vec<usize>,
    row_len: usize,
    values: ReservedValues,
}

pub(super) enum ReservedValues {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A dtype the cache's host buffers are reserved in.
pub(super) trait ReservedElement: bytemuck::Zeroable + Clone + Send + Sized {
    fn wrap(values: Vec<Self>) -> ReservedValues;
    /// The values, if they are of this dtype; else `values` back.
    fn unwrap(values: ReservedValues) -> Result<Vec<Self>, ReservedValues>;
}

macro_rules! reserved_element {
    ($type:ty, $variant:ident) => {
        impl ReservedElement for $type {
            fn wrap(values: Vec<Self>) -> ReservedValues {
                ReservedValues::$variant(values)
            }
            fn unwrap(values: ReservedValues) -> Result<Vec<Self>, ReservedValues> {
                match values {
                    ReservedValues::$variant(values) => Ok(values),
                    other => Err(other),
                }
            }
        }
    };
}

reserved_element!(f32, F32);
reserved_element!(f16, F16);

impl KvCache {
    /// Allocates the host memory of the next cache spliced with `capacity` slots in every
    /// layer (a prompt of models without sliding windows: [`Self::from_blocks`] and
    /// [`Self::with_capacity`]) and faults in its first `rows` slots, where the prompt's rows
    /// will be written; the splice takes it instead of allocating. Replaces any earlier
    /// reservation; does nothing for a dtype the splice converts through candle (bf16).
    pub fn reserve_host_memory(layout: &KvLayout, capacity: usize, rows: usize) {
        let buffer_rows = vec![capacity; 2 * layout.n_layers];
        let row_len = layout.n_kv_heads * layout.head_dim;
        let rows = rows.min(capacity);
        let values = match layout.dtype {
            DType::F32 => f32::wrap(touched(&buffer_rows, row_len, rows)),
            DType::F16 => f16::wrap(touched(&buffer_rows, row_len, rows)),
            _ => return,
        };
        let reserved = Reserved {
            buffer_rows,
            row_len,
            values,
        };
        if let Ok(mut slot) = RESERVED.lock() {
            *slot = Some(reserved);
        }
    }

    /// Whether a reservation is waiting for its splice.
    pub fn host_memory_reserved() -> bool {
        RESERVED.lock().is_ok_and(|slot| slot.is_some())
    }
}

/// The reserved zeros for buffers of `buffer_rows` rows of `row_len` values, if the reservation
/// has exactly that shape and dtype (it is then used up); else fresh zeros.
pub(super) fn take_or_zeroed<T: ReservedElement>(buffer_rows: &[usize], row_len: usize) -> Vec<T> {
    let len = buffer_rows.iter().sum::<usize>() * row_len;
    if let Ok(mut slot) = RESERVED.lock()
        && let Some(held) = slot.take()
    {
        if held.buffer_rows != buffer_rows || held.row_len != row_len {
            *slot = Some(held);
        } else {
            // Of the same shape, it has the same length (both made by this module).
            match T::unwrap(held.values) {
                Ok(values) => return values,
                Err(values) => *slot = Some(Reserved { values, ..held }),
            }
        }
    }
    huge_pages::zeroed_vec(len)
}

/// Zeros for every buffer, the first `rows` rows of each faulted in (on every core).
fn touched<T: ReservedElement>(buffer_rows: &[usize], row_len: usize, rows: usize) -> Vec<T> {
    let len = buffer_rows.iter().sum::<usize>() * row_len;
    let mut values = huge_pages::zeroed_vec::<T>(len);
    let stride = (PAGE_BYTES / std::mem::size_of::<T>()).max(1);
    split_buffers(&mut values, buffer_rows, row_len)
        .into_par_iter()
        .for_each(|buffer| {
            // The allocation is known to be zeroed, so a plain store of zero could be dropped by
            // the optimiser; through `black_box` it cannot tell, and every page is written.
            let buffer = std::hint::black_box(buffer);
            for value in buffer.iter_mut().take(rows * row_len).step_by(stride) {
                *value = T::zeroed();
            }
        });
    values
}

/// `data` cut into consecutive buffers of `buffer_rows[i]` rows of `row_len` values each (one
/// allocation for every layer's K and V, as the splice lays them out).
pub(super) fn split_buffers<'a, T>(
    data: &'a mut [T],
    buffer_rows: &[usize],
    row_len: usize,
) -> Vec<&'a mut [T]> {
    let mut buffers = Vec::with_capacity(buffer_rows.len());
    let mut rest = data;
    for &rows in buffer_rows {
        let (buffer, tail) = rest.split_at_mut(rows * row_len);
        buffers.push(buffer);
        rest = tail;
    }
    buffers
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kv_cache::{KvBlock, tests};

    fn layout(dtype: DType) -> KvLayout {
        KvLayout {
            n_layers: 3,
            n_kv_heads: 2,
            head_dim: 8,
            dtype,
        }
    }

    /// One test touches the process-wide reservation, so the cases run in order.
    #[test]
    fn a_reservation_serves_one_splice_of_its_shape_and_dtype() {
        let f32_layout = layout(DType::F32);
        KvCache::reserve_host_memory(&f32_layout, 40, 30);
        // Another shape, then another dtype, leave it.
        let other: Vec<f32> = take_or_zeroed(&[41; 6], 16);
        assert_eq!(other.len(), 41 * 6 * 16);
        let other: Vec<f16> = take_or_zeroed(&[40; 6], 16);
        assert_eq!(other.len(), 40 * 6 * 16);
        assert!(RESERVED.lock().unwrap().is_some());
        // Its own shape takes it, zeroed, and uses it up.
        let taken: Vec<f32> = take_or_zeroed(&[40; 6], 16);
        assert_eq!(taken.len(), 40 * 6 * 16);
        assert!(taken.iter().all(|&value| value == 0.0));
        assert!(RESERVED.lock().unwrap().is_none());

        // A splice through the cache reads the blocks' rows into it, zeros after them. (37
        // slots: a shape no other test splices, as the reservation is the process's.)
        let rows = 34;
        let block = KvBlock::new(
            vec![(tests::rows(0.0, rows), tests::rows(100.0, rows)); tests::LAYOUT.n_layers],
            (0..rows as u32).collect(),
        )
        .unwrap();
        KvCache::reserve_host_memory(&tests::LAYOUT, rows + 3, rows);
        let cache = KvCache::from_blocks(tests::LAYOUT, &Device::Cpu, &[&block], 3).unwrap();
        assert!(RESERVED.lock().unwrap().is_none(), "the splice took it");
        let layer = cache.layer(1).unwrap();
        assert_eq!(layer.capacity(), rows + 3);
        let expected: Vec<f32> = (0..rows).map(|row| 100.0 + row as f32).collect();
        assert_eq!(tests::row_values(&layer.values().unwrap()), expected);
        let spare = layer.value_buffer.narrow(0, rows, 3).unwrap();
        assert_eq!(tests::abs_sum(&spare), 0.0, "the spare rows are zeros");
    }
}
