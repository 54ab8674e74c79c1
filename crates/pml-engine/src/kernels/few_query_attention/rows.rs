//! The cached K or V rows one call reads, in the cache's own dtype, and the portable item
//! kernel over them (the fallback of the AVX2 one, and its reference in the tests).

use candle_core::{CpuStorage, Storage, Tensor};
use half::{bf16, f16};

use super::ItemShape;

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

    pub(super) fn len(self) -> usize {
        match self {
            KvRows::F32(all) => all.len(),
            KvRows::F16(all) => all.len(),
            KvRows::Bf16(all) => all.len(),
        }
    }
}

/// An element of the cache, read as f32.
trait Element: Copy {
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

/// One item in plain loops: see [`super::ItemShape`] for what `out` receives.
pub(super) fn attend_item_portable(
    shape: &ItemShape,
    queries: &[f32],
    (keys, values): (KvRows, KvRows),
    visible: &[u32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    fill_scores(shape, queries, keys, visible, scores);
    shape.softmax_numerators(scores, visible.len(), out);
    match values {
        KvRows::F32(v) => accumulate(shape, v, visible, scores, out),
        KvRows::F16(v) => accumulate(shape, v, visible, scores, out),
        KvRows::Bf16(v) => accumulate(shape, v, visible, scores, out),
    }
}

fn fill_scores(
    shape: &ItemShape,
    queries: &[f32],
    keys: KvRows,
    visible: &[u32],
    scores: &mut Vec<f32>,
) {
    match keys {
        KvRows::F32(k) => scores_of(shape, queries, k, visible, scores),
        KvRows::F16(k) => scores_of(shape, queries, k, visible, scores),
        KvRows::Bf16(k) => scores_of(shape, queries, k, visible, scores),
    }
}

fn scores_of<T: Element>(
    shape: &ItemShape,
    queries: &[f32],
    keys: &[T],
    visible: &[u32],
    scores: &mut Vec<f32>,
) {
    let n = visible.len();
    scores.clear();
    scores.resize(shape.group * n, 0.0);
    let queries = &queries[..shape.group * shape.head_dim];
    for (j, &key) in visible.iter().enumerate() {
        let key = shape.row(keys, key);
        for (h, query) in queries.chunks_exact(shape.head_dim).enumerate() {
            scores[h * n + j] = query.iter().zip(key).map(|(q, k)| q * k.f32()).sum();
        }
    }
}

fn accumulate<T: Element>(
    shape: &ItemShape,
    values: &[T],
    visible: &[u32],
    weights: &[f32],
    out: &mut [f32],
) {
    let n = visible.len();
    for (h, head_out) in out.chunks_exact_mut(shape.item_stride()).enumerate() {
        let head_out = &mut head_out[2..];
        head_out.fill(0.0);
        for (j, &key) in visible.iter().enumerate() {
            let weight = weights[h * n + j];
            for (o, v) in head_out.iter_mut().zip(shape.row(values, key)) {
                *o += weight * v.f32();
            }
        }
    }
}
