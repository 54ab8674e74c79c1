//! The attention kernels' reference in the tests: straightforward f64 attention, every head,
//! every visible key.

use candle_core::{DType, Device, Tensor};

use super::KernelError;
use super::KvSegment;
use super::masked_softmax::Visibility;

/// Straightforward f64 attention: every head, every visible key.
pub(super) fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: (usize, usize, usize, usize, usize),
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> Vec<f32> {
    let (n_queries, n_heads, n_kv_heads, n_keys, d) = dims;
    let mut out = vec![0f32; n_queries * n_heads * d];
    for row in 0..n_queries {
        for head in 0..n_heads {
            let kv = head / (n_heads / n_kv_heads);
            let q = &q[(row * n_heads + head) * d..][..d];
            let seen: Vec<usize> = (0..n_keys)
                .filter(|&key| {
                    Visibility::new(window).sees(query_positions[row], key_positions[key])
                })
                .collect();
            let scores: Vec<f64> = seen
                .iter()
                .map(|&key| {
                    let k = &k[(key * n_kv_heads + kv) * d..][..d];
                    q.iter()
                        .zip(k)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for (&key, score) in seen.iter().zip(&scores) {
                let weight = (score - max).exp() / total;
                let v = &v[(key * n_kv_heads + kv) * d..][..d];
                for (o, &v) in out[(row * n_heads + head) * d..][..d].iter_mut().zip(v) {
                    *o += (weight * f64::from(v)) as f32;
                }
            }
        }
    }
    out
}

pub(super) fn values(n: usize, phase: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37 + phase).sin()).collect()
}

/// Cache rows `(n_keys, n_kv_heads, d)` of `dtype` from [`values`], and the same rows read back
/// as f32: the reference reads the rows as the cache holds them, rounded to the dtype.
pub(super) fn stored_rows(
    (n_keys, n_kv_heads, d): (usize, usize, usize),
    dtype: DType,
    phase: f32,
) -> Result<(Tensor, Vec<f32>), KernelError> {
    let rows = Tensor::from_vec(
        values(n_keys * n_kv_heads * d, phase),
        (n_keys, n_kv_heads, d),
        &Device::Cpu,
    )?
    .to_dtype(dtype)?;
    let read = rows.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    Ok((rows, read))
}

/// `keys` and `values` cut before each row of `cuts` into segments (views), as a layer whose
/// first rows are shared holds them.
pub(super) fn segments_cut_at(
    keys: &Tensor,
    values: &Tensor,
    cuts: &[usize],
) -> Result<Vec<KvSegment>, KernelError> {
    let n = keys.dim(0)?;
    let mut bounds: Vec<usize> = cuts.iter().copied().filter(|&cut| cut < n).collect();
    bounds.insert(0, 0);
    bounds.push(n);
    bounds
        .windows(2)
        .filter(|pair| pair[0] < pair[1])
        .map(|pair| {
            Ok(KvSegment {
                keys: keys.narrow(0, pair[0], pair[1] - pair[0])?,
                values: values.narrow(0, pair[0], pair[1] - pair[0])?,
            })
        })
        .collect()
}

/// Ways to cut `n` keys into segments for the kernels' tests: whole; a few rows, then the rest;
/// three uneven parts.
pub(super) fn segment_cuts(n: usize) -> Vec<Vec<usize>> {
    vec![vec![], vec![3.min(n)], vec![n / 3, n / 3 + n / 4 + 1]]
}
