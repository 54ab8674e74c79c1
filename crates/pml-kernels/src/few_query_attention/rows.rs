//! The portable item kernel (the fallback of the AVX2 one, and its reference in the tests).

use super::ItemShape;
use super::KvRows;
use crate::kv_rows::Element;

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
