//! A layer's cached K or V rows as the cache holds them (f32, f16 or bf16), borrowed from a
//! contiguous CPU tensor: what the attention kernels read, widening each element as they go,
//! one slice per segment of the layer; and the shapes of one attention call, checked once for
//! both kernels.

use std::ops::Deref;

use candle_core::{CpuStorage, Layout, Storage, Tensor};

use super::KernelError;
use super::KvSegment;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// `(n_queries, n_heads, head_dim, n_keys, n_kv_heads)` of one attention call: `queries`
/// `(n_queries, n_heads, head_dim)` at `query_positions` over the keys and values of
/// `segments` (each K and V of one shape, `(rows, n_kv_heads, head_dim)`; `n_keys` rows in
/// all) at `key_positions`; an error naming every shape when they do not fit together.
pub(super) fn attention_dims(
    queries: &Tensor,
    query_positions: &[u32],
    segments: &[KvSegment],
    key_positions: &[u32],
) -> Result<(usize, usize, usize, usize, usize), KernelError> {
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    let mut n_keys = 0;
    let mut n_kv_heads = None;
    let mut fits = n_queries == query_positions.len();
    for segment in segments {
        let (rows, kv_heads, dim) = segment.keys.dims3()?;
        fits &= segment.values.dims() == segment.keys.dims()
            && dim == head_dim
            && *n_kv_heads.get_or_insert(kv_heads) == kv_heads;
        n_keys += rows;
    }
    if !fits || n_keys != key_positions.len() {
        let shapes: Vec<_> = segments
            .iter()
            .map(|segment| (segment.keys.dims().to_vec(), segment.values.dims().to_vec()))
            .collect();
        return Err(KernelError::InvalidInput(format!(
            "attention of queries {:?} at {} positions over keys and values {shapes:?} at {} \
             positions",
            queries.dims(),
            query_positions.len(),
            key_positions.len()
        )));
    }
    Ok((
        n_queries,
        n_heads,
        head_dim,
        n_keys,
        n_kv_heads.unwrap_or(0),
    ))
}

/// Where each segment's rows start among all of them, and their end: `segments.len() + 1`
/// values.
pub(super) fn segment_starts(segments: &[KvSegment]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(segments.len() + 1);
    let mut at = 0;
    starts.push(at);
    for segment in segments {
        at += segment.len();
        starts.push(at);
    }
    starts
}

/// Calls `f` with every segment's K and V elements (each segment's rows in place, nothing
/// copied), or gives `None` where one of them is not a contiguous CPU tensor of f32, f16 or
/// bf16 or holds other than `row_len` elements a row.
pub(super) fn with_segments<R>(
    segments: &[KvSegment],
    row_len: usize,
    f: impl FnOnce(&[KvRows], &[KvRows]) -> R,
) -> Option<R> {
    let key_guards: Vec<_> = segments
        .iter()
        .map(|segment| segment.keys.storage_and_layout())
        .collect();
    let value_guards: Vec<_> = segments
        .iter()
        .map(|segment| segment.values.storage_and_layout())
        .collect();
    let keys = rows_of(&key_guards, segments, row_len)?;
    let values = rows_of(&value_guards, segments, row_len)?;
    Some(f(&keys, &values))
}

/// Each guarded storage's elements, when every one is readable and holds its segment's rows.
fn rows_of<'a, G: Deref<Target = Storage>>(
    guards: &'a [(G, &Layout)],
    segments: &[KvSegment],
    row_len: usize,
) -> Option<Vec<KvRows<'a>>> {
    guards
        .iter()
        .zip(segments)
        .map(|((storage, layout), segment)| {
            KvRows::of(storage, layout).filter(|rows| rows.len() == segment.len() * row_len)
        })
        .collect()
}

/// A contiguous CPU tensor's elements, `(n_keys, n_kv_heads, head_dim)` row-major.
#[derive(Clone, Copy)]
pub(super) enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Bf16(&'a [bf16]),
}

impl KvRows<'_> {
    /// Calls `f` with `tensor`'s elements, or gives `None` where it is not a contiguous CPU
    /// tensor of f32, f16 or bf16.
    pub(super) fn with<R>(tensor: &Tensor, f: impl FnOnce(KvRows) -> R) -> Option<R> {
        let (storage, layout) = tensor.storage_and_layout();
        Some(f(KvRows::of(&storage, layout)?))
    }

    /// A tensor's elements from its storage and layout, or `None` where they are not
    /// contiguous CPU f32, f16 or bf16 values.
    fn of<'a>(storage: &'a Storage, layout: &Layout) -> Option<KvRows<'a>> {
        let (start, end) = layout.contiguous_offsets()?;
        let Storage::Cpu(cpu) = storage else {
            return None;
        };
        Some(match cpu {
            CpuStorage::F32(all) => KvRows::F32(all.get(start..end)?),
            CpuStorage::F16(all) => KvRows::F16(all.get(start..end)?),
            CpuStorage::BF16(all) => KvRows::Bf16(all.get(start..end)?),
            _ => return None,
        })
    }

    /// Elements `start..start + out.len()` widened to f32 into `out` (bounds-checked).
    pub(super) fn widen_into(self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            KvRows::F32(all) => out.copy_from_slice(&all[start..end]),
            KvRows::F16(all) => all[start..end].convert_to_f32_slice(out),
            KvRows::Bf16(all) => all[start..end].convert_to_f32_slice(out),
        }
    }

    /// Asks the CPU to start loading elements `start..start + len` (a hint: nothing happens
    /// past the end, or off x86-64).
    #[inline]
    pub(super) fn prefetch(self, start: usize, len: usize) {
        match self {
            KvRows::F32(all) => prefetch(all, start, len),
            KvRows::F16(all) => prefetch(all, start, len),
            KvRows::Bf16(all) => prefetch(all, start, len),
        }
    }

    pub(super) fn len(self) -> usize {
        match self {
            KvRows::F32(all) => all.len(),
            KvRows::F16(all) => all.len(),
            KvRows::Bf16(all) => all.len(),
        }
    }
}

/// An element of the cache, read as f32.
pub(super) trait Element: Copy {
    fn f32(self) -> f32;
}

impl Element for f32 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self
    }
}

impl Element for f16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

impl Element for bf16 {
    #[inline(always)]
    fn f32(self) -> f32 {
        self.to_f32()
    }
}

/// Prefetches the cache lines of `data[start..start + len]` that lie within `data`.
#[inline]
fn prefetch<T>(data: &[T], start: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        const LINE: usize = 64;
        let size = std::mem::size_of::<T>().max(1);
        let end = data.len().min(start.saturating_add(len));
        let mut at = start;
        while at < end {
            // SAFETY: `at < data.len()`, so the pointer is within `data`; a prefetch reads
            // nothing architecturally and cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(at).cast()) };
            at += LINE / size;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, start, len);
}
