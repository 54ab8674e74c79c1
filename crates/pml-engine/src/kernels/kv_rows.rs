//! A layer's cached K or V rows as the cache holds them (f32, f16 or bf16), borrowed from a
//! contiguous CPU tensor: what the attention kernels read, widening each element as they go;
//! and the shapes of one attention call, checked once for both kernels.

use candle_core::{CpuStorage, Storage, Tensor};

use super::EngineError;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// `(n_queries, n_heads, head_dim, n_keys, n_kv_heads)` of one attention call: `queries`
/// `(n_queries, n_heads, head_dim)` at `query_positions` over `keys` and `values` (one shape,
/// `(n_keys, n_kv_heads, head_dim)`) at `key_positions`; an error naming every shape when they
/// do not fit together.
pub(super) fn attention_dims(
    queries: &Tensor,
    query_positions: &[u32],
    (keys, values, key_positions): (&Tensor, &Tensor, &[u32]),
) -> Result<(usize, usize, usize, usize, usize), EngineError> {
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    let (n_keys, n_kv_heads, _) = keys.dims3()?;
    if values.dims() != keys.dims()
        || keys.dim(2)? != head_dim
        || n_keys != key_positions.len()
        || n_queries != query_positions.len()
    {
        return Err(EngineError::InvalidInput(format!(
            "attention of queries {:?} at {} positions over keys {:?} and values {:?} at {} \
             positions",
            queries.dims(),
            query_positions.len(),
            keys.dims(),
            values.dims(),
            key_positions.len()
        )));
    }
    Ok((n_queries, n_heads, head_dim, n_keys, n_kv_heads))
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
        let (start, end) = layout.contiguous_offsets()?;
        let Storage::Cpu(cpu) = &*storage else {
            return None;
        };
        let rows = match cpu {
            CpuStorage::F32(all) => KvRows::F32(all.get(start..end)?),
            CpuStorage::F16(all) => KvRows::F16(all.get(start..end)?),
            CpuStorage::BF16(all) => KvRows::Bf16(all.get(start..end)?),
            _ => return None,
        };
        Some(f(rows))
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
