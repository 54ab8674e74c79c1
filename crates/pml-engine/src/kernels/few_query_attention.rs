//! Attention of a few queries (a decode step) over a layer's cached K/V, in plain loops over
//! the cache's own `(n_keys, n_kv_heads, head_dim)` rows: no transposed copies of K and V, no
//! score tensor, no trip through candle's matmul and rayon, which for one query cost more than
//! the arithmetic. The query heads of one KV head read each cached row together; the (query,
//! KV head) items are split over candle's worker pool.

use std::sync::Mutex;

use candle_core::{DType, Storage, Tensor};

use super::EngineError;
use super::exp_kernel::exp_shifted_sum;
use super::masked_softmax::Visibility;

/// Lanes of the dot-product accumulators, so the compiler can keep them in SIMD registers
/// (a single running sum would be a serial dependency chain).
const LANES: usize = 8;

/// Most query heads per KV head this path takes (Qwen2.5-0.5B has 7, Gemma-3-270M 4); larger
/// groups take the general path.
const MAX_GROUP: usize = 16;

/// The global head index (`row * n_heads + head`) of the first head of output chunk `item`,
/// when each group of `group` heads is cut into chunks of `heads_per_item` (the last one of a
/// group shorter), groups in order.
fn item_first_head(item: usize, heads_per_item: usize, group: usize) -> usize {
    let items_per_group = group.div_ceil(heads_per_item);
    let (group_idx, slice) = (item / items_per_group, item % items_per_group);
    group_idx * group + slice * heads_per_item
}

/// The f32 rows of a contiguous CPU tensor, or `None` for any other.
fn with_f32_slice<R>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if tensor.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = tensor.storage_and_layout();
    let (start, end) = layout.contiguous_offsets()?;
    match &*storage {
        Storage::Cpu(cpu) => cpu.as_slice::<f32>().ok().map(|all| f(&all[start..end])),
        _ => None,
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    for (a, b) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for lane in 0..LANES {
            lanes[lane] += a[lane] * b[lane];
        }
    }
    let tail = a.len() - a.len() % LANES;
    let tail: f32 = a[tail..].iter().zip(&b[tail..]).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

/// `softmax(q k^T under the position mask) v` for `queries` `(n, n_heads, head_dim)` (already
/// scaled) over `keys`/`values` `(n_keys, n_kv_heads, head_dim)`; `(n, n_heads * head_dim)`, or
/// `None` when the tensors are not contiguous f32 on the CPU (the caller then takes the
/// general path). A query that sees no key gets zeros, as `masked_softmax` gives.
pub(super) fn attend_few(
    queries: &Tensor,
    query_positions: &[u32],
    keys: &Tensor,
    values: &Tensor,
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Option<Tensor>, EngineError> {
    attend_sliced(
        queries,
        query_positions,
        (keys, values, key_positions),
        window,
        None,
    )
}

/// [`attend_few`] with each group's query heads cut into items of `heads_per_item` (chosen from
/// the pool's size when `None`).
fn attend_sliced(
    queries: &Tensor,
    query_positions: &[u32],
    (keys, values, key_positions): (&Tensor, &Tensor, &[u32]),
    window: Option<usize>,
    heads_per_item: Option<usize>,
) -> Result<Option<Tensor>, EngineError> {
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    let (n_keys, n_kv_heads, _) = keys.dims3()?;
    if values.dims() != keys.dims() || keys.dim(2)? != head_dim || n_keys != key_positions.len() {
        return Err(EngineError::InvalidInput(format!(
            "attention of queries {:?} over keys {:?} and values {:?} at {} positions",
            queries.dims(),
            keys.dims(),
            values.dims(),
            key_positions.len()
        )));
    }
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || n_heads / n_kv_heads > MAX_GROUP {
        return Ok(None);
    }
    let group = n_heads / n_kv_heads;
    let queries = queries.contiguous()?;
    let mut out = vec![0f32; n_queries * n_heads * head_dim];
    // Which keys each query sees, once for all its heads.
    let visibility = Visibility::new(window);
    let seen: Vec<Vec<bool>> = query_positions
        .iter()
        .map(|&query| {
            key_positions
                .iter()
                .map(|&key| visibility.sees(query, key))
                .collect()
        })
        .collect();
    // One item per (query, KV head, slice of that KV head's query heads), each writing its own
    // heads' outputs (consecutive, as the heads of a group are). The heads of an item share every
    // K and V row they read, which a decode step's long cache makes the dominant memory traffic;
    // groups are only sliced further when there are too few items to keep the pool busy.
    let heads_per_item = heads_per_item.unwrap_or_else(|| {
        let pool_threads = candle_core::utils::get_num_threads().max(1);
        let slices = pool_threads
            .div_ceil(n_queries * n_kv_heads)
            .clamp(1, group);
        group.div_ceil(slices)
    });
    let heads_per_item = heads_per_item.clamp(1, group);
    let items: Vec<Mutex<&mut [f32]>> = out
        .chunks_mut(group * head_dim)
        .flat_map(|group_out| group_out.chunks_mut(heads_per_item * head_dim))
        .map(Mutex::new)
        .collect();
    let done = with_f32_slice(&queries, |q| {
        with_f32_slice(keys, |k| {
            with_f32_slice(values, |v| {
                let shape = ItemShape {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    group,
                    heads_per_item,
                    n_keys,
                };
                let run_item = |item: usize, weights: &mut Vec<f32>| {
                    let mut output = match items[item].lock() {
                        Ok(output) => output,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                    let rows = ItemRows {
                        q,
                        k,
                        v,
                        seen: &seen,
                    };
                    attend_item(&shape, &rows, item, &mut output, weights);
                };
                // Items are independent: candle's worker pool (the one the matrix products
                // use, already awake) splits them.
                candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
                    let mut weights = Vec::with_capacity(heads_per_item * n_keys);
                    range.for_each(|item| run_item(item, &mut weights));
                });
            })
        })
    });
    drop(items);
    if !matches!(done, Some(Some(Some(())))) {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(
        out,
        (n_queries, n_heads * head_dim),
        queries.device(),
    )?))
}

/// The shape of one call, shared by its items.
#[derive(Clone, Copy)]
struct ItemShape {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    group: usize,
    heads_per_item: usize,
    n_keys: usize,
}

/// The rows one call reads: queries, keys, values, and which keys each query sees.
#[derive(Clone, Copy)]
struct ItemRows<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    seen: &'a [Vec<bool>],
}

/// One item's heads into `output`, with the loops compiled for AVX2 and FMA where the CPU has
/// them: the crate's baseline target is SSE2, whose 4-lane products left the decode of a model
/// with three query heads per KV head (SmolLM2) at 2.8× llama.cpp's time per token.
fn attend_item(
    shape: &ItemShape,
    rows: &ItemRows,
    item: usize,
    output: &mut [f32],
    weights: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if super::cpu_features::avx2() {
        // SAFETY: `cpu_features::avx2` is true only where avx2 and fma were detected at run time.
        return unsafe { attend_item_avx2(shape, rows, item, output, weights) };
    }
    attend_item_body(shape, rows, item, output, weights);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn attend_item_avx2(
    shape: &ItemShape,
    rows: &ItemRows,
    item: usize,
    output: &mut [f32],
    weights: &mut Vec<f32>,
) {
    attend_item_body(shape, rows, item, output, weights);
}

/// softmax(q kᵀ) v of one item's heads (consecutive heads of one KV head, one query row).
#[inline(always)]
fn attend_item_body(
    shape: &ItemShape,
    rows: &ItemRows,
    item: usize,
    output: &mut [f32],
    weights: &mut Vec<f32>,
) {
    let ItemShape {
        n_heads,
        n_kv_heads,
        head_dim,
        group,
        heads_per_item,
        n_keys,
    } = *shape;
    let ItemRows { q, k, v, seen } = *rows;
    let row_len = n_kv_heads * head_dim;
    let first_head_global = item_first_head(item, heads_per_item, group);
    let row = first_head_global / n_heads;
    let first_head = first_head_global % n_heads;
    let n_item_heads = output.len() / head_dim;
    let kv_head = first_head / group;
    let kv_start = kv_head * head_dim;
    let query = &q[first_head_global * head_dim..][..n_item_heads * head_dim];
    weights.clear();
    weights.resize(n_item_heads * n_keys, f32::NEG_INFINITY);
    let mut maxima = [f32::NEG_INFINITY; MAX_GROUP];
    for (key_idx, (sees, key)) in seen[row].iter().zip(k.chunks_exact(row_len)).enumerate() {
        if !*sees {
            continue;
        }
        let key = &key[kv_start..kv_start + head_dim];
        for (h, query) in query.chunks_exact(head_dim).enumerate() {
            let weight = dot(query, key);
            weights[h * n_keys + key_idx] = weight;
            maxima[h] = maxima[h].max(weight);
        }
    }
    if maxima[0] == f32::NEG_INFINITY {
        return;
    }
    let mut inverses = [0f32; MAX_GROUP];
    for (h, weights) in weights.chunks_exact_mut(n_keys).enumerate() {
        inverses[h] = exp_shifted_sum(weights, maxima[h]).recip();
    }
    for (key_idx, (sees, value)) in seen[row].iter().zip(v.chunks_exact(row_len)).enumerate() {
        if !*sees {
            continue;
        }
        let value = &value[kv_start..kv_start + head_dim];
        for (h, output) in output.chunks_exact_mut(head_dim).enumerate() {
            let weight = weights[h * n_keys + key_idx] * inverses[h];
            for (output, &value) in output.iter_mut().zip(value) {
                *output += weight * value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// Straightforward f64 attention: every head, every visible key.
    fn reference(
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

    fn values(n: usize, phase: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + phase).sin()).collect()
    }

    #[test]
    fn matches_plain_attention_under_the_mask() -> Result<(), EngineError> {
        let device = Device::Cpu;
        // 6 heads over 2 KV heads, head size 20 (not a multiple of the 8 lanes).
        let (n_queries, n_heads, n_kv_heads, n_keys, d) = (2, 6, 2, 9, 20);
        let (q, k, v) = (
            values(n_queries * n_heads * d, 0.1),
            values(n_keys * n_kv_heads * d, 1.3),
            values(n_keys * n_kv_heads * d, 2.9),
        );
        // Keys out of order with a gap, queries at the end, a window that hides the oldest.
        let key_positions = [0u32, 1, 2, 3, 7, 4, 5, 8, 9];
        let query_positions = [8u32, 9];
        let k_tensor = Tensor::from_slice(&k, (n_keys, n_kv_heads, d), &device)?;
        let v_tensor = Tensor::from_slice(&v, (n_keys, n_kv_heads, d), &device)?;
        // Every way of cutting the 3 heads of a group into items, and the pool's own choice.
        let slicings = [None, Some(1), Some(2), Some(3)];
        for (window, heads_per_item) in [None, Some(4)]
            .into_iter()
            .flat_map(|window| slicings.map(|slicing| (window, slicing)))
        {
            let ours = attend_sliced(
                &Tensor::from_slice(&q, (n_queries, n_heads, d), &device)?,
                &query_positions,
                (&k_tensor, &v_tensor, &key_positions),
                window,
                heads_per_item,
            )?
            .ok_or_else(|| EngineError::InvalidInput("no fast path".into()))?;
            assert_eq!(ours.dims(), [n_queries, n_heads * d]);
            let dims = (n_queries, n_heads, n_kv_heads, n_keys, d);
            let expected = reference(&q, &k, &v, dims, &query_positions, &key_positions, window);
            for (a, b) in ours.flatten_all()?.to_vec1::<f32>()?.iter().zip(&expected) {
                assert!(
                    (a - b).abs() < 1e-5,
                    "{window:?} {heads_per_item:?}: {a} vs {b}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn a_query_that_sees_nothing_gets_zeros() -> Result<(), EngineError> {
        let device = Device::Cpu;
        let kv = Tensor::ones((2, 1, 8), DType::F32, &device)?;
        let q = Tensor::ones((1, 1, 8), DType::F32, &device)?;
        let out = attend_few(&q, &[0], &kv, &kv, &[1, 2], None)?;
        let out = out.ok_or_else(|| EngineError::InvalidInput("no fast path".into()))?;
        assert_eq!(out.flatten_all()?.to_vec1::<f32>()?, vec![0.0; 8]);
        Ok(())
    }
}
