//! The candle path's attention. On the CPU: the position mask built from the two position
//! vectors, added to the scores, then candle's `softmax_last_dim`. On CUDA with a half-precision
//! cache, heads of 64 or 128 and an sm_80+ GPU: one flash-attention kernel
//! (`flash_attention_cuda`); otherwise on CUDA the products in the cache's dtype (tensor cores)
//! and the weights from one masked-softmax kernel (`masked_softmax_cuda`) that reads the
//! positions, no mask. Same contract as the native [`super::masked_softmax`] and
//! [`super::attend`], which never build the mask.
//!
//! Shapes of the mask path were chosen for candle's CUDA kernels before that kernel existed
//! (Nsight Compute on an H200, SmolLM2, 4096-token prefill): a binary op whose operands are not
//! both contiguous and of one shape takes a strided path several times slower than memory
//! bandwidth, so a long call adds a mask of the scores' own shape, one KV head at a time, and
//! multiplies rows that see nothing only when there are any (the broadcast add and multiply
//! were 61% of that prefill's GPU time, the softmax 11% more: what the kernel replaced).

use candle_core::{DType, Device, Tensor};

use super::KernelError;
use super::masked_softmax::check_shapes;

/// Added to the scores of keys a query may not see. Finite, so a row that sees nothing stays
/// free of NaN (its uniform weights are zeroed afterwards); far below any real score, so its
/// exponential is 0 next to a visible key's.
const HIDDEN: f64 = 1e30;

/// Scores per KV head from which attention goes one KV head at a time: below, one batched call
/// costs fewer kernel launches (a decode step); above, the contiguous adds win.
const PER_HEAD_MIN_SCORES: usize = 1 << 16;

/// The mask of one call: which keys each query sees (`key <= query`, and `query - key < window`
/// in local layers).
struct PositionMask {
    /// `(n_queries, n_keys)`: 0 where the query sees the key, `-HIDDEN` elsewhere.
    additive: Tensor,
    /// `(n_queries, 1)` of 1 and 0, when some query sees no key at all (else `None`).
    rows_seeing: Option<Tensor>,
}

impl PositionMask {
    fn new(
        query_positions: &[u32],
        key_positions: &[u32],
        window: Option<usize>,
        device: &Device,
    ) -> Result<Self, KernelError> {
        let (n_queries, n_keys) = (query_positions.len(), key_positions.len());
        // Distances in f32: positions stay far below 2^24, where f32 counts exactly.
        let as_f32 = |positions: &[u32]| -> Vec<f32> {
            positions.iter().map(|&position| position as f32).collect()
        };
        let queries = Tensor::from_vec(as_f32(query_positions), (n_queries, 1), device)?;
        let keys = Tensor::from_vec(as_f32(key_positions), (1, n_keys), device)?;
        let distance = queries.broadcast_sub(&keys)?;
        let mut visible = distance.ge(0f64)?.to_dtype(DType::F32)?;
        if let Some(window) = window {
            visible = (visible * distance.lt(window as f64)?.to_dtype(DType::F32)?)?;
        }
        let rows_seeing = if every_query_sees_a_key(query_positions, key_positions, window) {
            None
        } else {
            Some(visible.max_keepdim(1)?)
        };
        Ok(Self {
            // 1 → 0, 0 → -HIDDEN.
            additive: visible.affine(HIDDEN, -HIDDEN)?,
            rows_seeing,
        })
    }

    /// The mask repeated `times` along the queries: `(times * n_queries, n_keys)`, for rows
    /// that stack several query heads' queries.
    fn repeated(&self, times: usize) -> Result<Self, KernelError> {
        let repeat = |tensor: &Tensor| -> Result<Tensor, KernelError> {
            Ok(match times {
                1 => tensor.clone(),
                _ => Tensor::cat(&vec![tensor; times], 0)?,
            })
        };
        Ok(Self {
            additive: repeat(&self.additive)?,
            rows_seeing: self.rows_seeing.as_ref().map(repeat).transpose()?,
        })
    }

    /// Softmax of `scores` (any leading dimensions over rows shaped as the mask's) under the
    /// mask, computed in f32 and returned in the scores' dtype.
    fn softmax(&self, scores: &Tensor) -> Result<Tensor, KernelError> {
        let dtype = scores.dtype();
        let scores = &scores.to_dtype(DType::F32)?;
        let masked = if scores.dims() == self.additive.dims() {
            (scores + &self.additive)?
        } else {
            scores.broadcast_add(&self.additive)?
        };
        let weights = candle_nn::ops::softmax_last_dim(&masked.contiguous()?)?;
        let weights = match &self.rows_seeing {
            Some(rows) => weights.broadcast_mul(rows)?,
            None => weights,
        };
        Ok(weights.to_dtype(dtype)?)
    }
}

/// Whether every query sees at least one key: the nearest key at or before a query is the one
/// a window keeps longest.
fn every_query_sees_a_key(
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> bool {
    let mut keys = key_positions.to_vec();
    keys.sort_unstable();
    query_positions.iter().all(|&query| {
        let at_or_before = keys.partition_point(|&key| key <= query);
        at_or_before > 0
            && window.is_none_or(|window| ((query - keys[at_or_before - 1]) as usize) < window)
    })
}

/// `softmax(scores)` over the keys each row's query may see, 0 for the others; a row that
/// sees no key is all zeros. `scores`: f32 `(heads, rows, key_positions.len())` with `rows` a
/// multiple of `query_positions.len()`, row `r` belonging to the query
/// `query_positions[r % n_queries]`.
pub(super) fn masked_softmax_by_ops(
    scores: &Tensor,
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Tensor, KernelError> {
    let (heads, rows, n_keys) = scores.dims3()?;
    check_shapes(rows, n_keys, query_positions, key_positions)?;
    let n_queries = query_positions.len();
    let mask = PositionMask::new(query_positions, key_positions, window, scores.device())?;
    let grouped =
        scores
            .to_dtype(DType::F32)?
            .reshape((heads, rows / n_queries, n_queries, n_keys))?;
    Ok(mask.softmax(&grouped)?.reshape((heads, rows, n_keys))?)
}

/// The dtype attention's products run in: the cache's where it is half precision and the device
/// multiplies that on tensor cores (CUDA), as PyTorch's and vLLM's attention do; else the
/// queries' (f32), so the CPU's candle path stays within [`super::attend`]'s f32 tolerance.
pub(super) fn attention_dtype(device: &Device, queries: DType, cache: DType) -> DType {
    if device.is_cuda() && matches!(cache, DType::F16 | DType::BF16) {
        cache
    } else {
        queries
    }
}

/// `softmax(q kᵀ under the position mask) v` for `queries` `(n, n_heads, head_dim)` (already
/// scaled) over `keys`/`values` `(n_keys, n_kv_heads, head_dim)`; `(n, n_heads * head_dim)` in
/// the queries' dtype. The products run in [`attention_dtype`]. The query heads sharing a KV
/// head are stacked, so K and V are never repeated per head. On CUDA with a half-precision
/// cache, one flash-attention kernel does it all (`flash_attention_cuda`); else on CUDA the
/// weights come from one masked-softmax kernel over all heads' scores; elsewhere from a mask
/// tensor.
pub fn attend_by_ops(call: AttentionCall<'_>) -> Result<Tensor, KernelError> {
    match flash(call)? {
        Some(attended) => Ok(attended),
        None => by_ops(call),
    }
}

/// One attention call's operands on the candle path: `queries` `(n, n_heads, head_dim)` (already
/// scaled) at `query_positions` over `keys` and `values` `(n_keys, n_kv_heads, head_dim)` at
/// `key_positions`, within an optional sliding `window`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionCall<'a> {
    pub queries: &'a Tensor,
    pub query_positions: &'a [u32],
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
    pub key_positions: &'a [u32],
    pub window: Option<usize>,
}

/// The flash-attention kernel's result, `None` where it does not apply (off CUDA, an f32
/// cache, another head size; any build without `cuda`).
fn flash(call: AttentionCall<'_>) -> Result<Option<Tensor>, KernelError> {
    #[cfg(feature = "cuda")]
    {
        super::flash_attention_cuda::attend(
            call.queries,
            call.query_positions,
            call.keys,
            call.values,
            call.key_positions,
            call.window,
        )
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = call;
        Ok(None)
    }
}

/// The ops path: products in [`attention_dtype`], weights from the masked softmax.
fn by_ops(call: AttentionCall<'_>) -> Result<Tensor, KernelError> {
    let dtype = attention_dtype(
        call.queries.device(),
        call.queries.dtype(),
        call.keys.dtype(),
    );
    attend_in(dtype, call)
}

/// One call's attention both ways on the candle path, for tests: the flash-attention kernel's
/// (`None` where it does not apply) and the ops path's.
#[cfg(any(test, feature = "test-support"))]
pub fn flash_and_ops(call: AttentionCall<'_>) -> Result<(Option<Tensor>, Tensor), KernelError> {
    Ok((flash(call)?, by_ops(call)?))
}

/// [`attend_by_ops`] with its products in `dtype`.
fn attend_in(dtype: DType, call: AttentionCall<'_>) -> Result<Tensor, KernelError> {
    let AttentionCall {
        queries,
        query_positions,
        keys,
        values,
        key_positions,
        window,
    } = call;
    let (n_queries, n_heads, _) = queries.dims3()?;
    let (n_keys, n_kv_heads, _) = keys.dims3()?;
    check_shapes(n_queries, n_keys, query_positions, key_positions)?;
    let out_dtype = queries.dtype();
    let keys = &keys.to_dtype(dtype)?;
    let values = &values.to_dtype(dtype)?;
    let group = n_heads / n_kv_heads;
    let queries = super::queries_by_kv_head(&queries.to_dtype(dtype)?, n_kv_heads)?;
    // cuBLAS takes a batch of matrices only with rows `head_dim` apart, and the cache's
    // slot-major rows are `n_kv_heads * head_dim` apart: K and V are copied once per call.
    let fused = queries.device().is_cuda();
    let attended = if fused || group * n_queries * n_keys < PER_HEAD_MIN_SCORES {
        let keys = keys.transpose(0, 1)?.contiguous()?; // (n_kv_heads, n_keys, head_dim)
        let values = values.transpose(0, 1)?.contiguous()?;
        let scores = queries.matmul(&keys.t()?)?;
        let weights = if fused {
            super::masked_softmax::masked_softmax(&scores, query_positions, key_positions, window)?
        } else {
            let mask = PositionMask::new(query_positions, key_positions, window, scores.device())?;
            mask.softmax(&scores.reshape((n_kv_heads, group, n_queries, n_keys))?)?
                .reshape((n_kv_heads, group * n_queries, n_keys))?
        };
        weights.matmul(&values)?
    } else {
        let mask = PositionMask::new(query_positions, key_positions, window, queries.device())?
            .repeated(group)?;
        let per_head = (0..n_kv_heads)
            .map(|head| -> Result<Tensor, KernelError> {
                let keys = keys.narrow(1, head, 1)?.squeeze(1)?.contiguous()?;
                let values = values.narrow(1, head, 1)?.squeeze(1)?.contiguous()?;
                let scores = queries.get(head)?.matmul(&keys.t()?)?; // (group * n_queries, n_keys)
                Ok(mask.softmax(&scores)?.matmul(&values)?)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Tensor::stack(&per_head, 0)?
    };
    Ok(super::outputs_by_query(&attended, n_queries)?.to_dtype(out_dtype)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::Kernels;
    use crate::attention_reference::segments_cut_at;

    /// The same weights as the native kernel, for windows, gaps, repeated positions and a row
    /// that sees nothing.
    #[test]
    fn matches_the_native_masked_softmax() -> Result<(), KernelError> {
        let device = Device::Cpu;
        let scores = Tensor::arange(0f32, 2.0 * 6.0 * 5.0, &device)?
            .affine(0.41, -3.0)?
            .sin()?
            .affine(9.0, 0.0)?
            .reshape((2, 6, 5))?;
        let keys = [3u32, 4, 4, 7, 9];
        for (queries, window) in [
            ([9u32, 4, 2], None),
            ([9, 8, 7], Some(3)),
            ([1, 9, 4], Some(1)),
        ] {
            let native =
                super::super::masked_softmax::masked_softmax(&scores, &queries, &keys, window)?;
            let by_ops = masked_softmax_by_ops(&scores, &queries, &keys, window)?;
            let difference = (native - by_ops)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(difference < 1e-6, "{queries:?} {window:?}: {difference}");
        }
        Ok(())
    }

    /// Both of `attend_by_ops`'s shapes (one batched call, one KV head at a time) give the
    /// native attention's output, with a window, gaps and repeats in the positions, and a query
    /// that sees no key.
    #[test]
    fn attention_by_ops_matches_the_native_attention() -> Result<(), KernelError> {
        let device = Device::Cpu;
        let (n_heads, n_kv_heads, head_dim) = (4, 2, 8);
        for (n_queries, n_keys, window) in [(5, 40, None), (300, 320, None), (300, 320, Some(50))] {
            let tensor = |rows: usize, heads: usize, seed: f64| {
                Tensor::arange(0f32, (rows * heads * head_dim) as f32, &device)?
                    .affine(0.013 * seed, seed)?
                    .sin()?
                    .reshape((rows, heads, head_dim))
            };
            let queries = tensor(n_queries, n_heads, 1.0)?;
            let keys = tensor(n_keys, n_kv_heads, 2.0)?;
            let values = tensor(n_keys, n_kv_heads, 3.0)?;
            // Keys at 10, 11, ... with one repeat; the first query precedes them all.
            let key_positions: Vec<u32> = (0..n_keys as u32)
                .map(|k| 10 + k - u32::from(k == 7))
                .collect();
            let query_positions: Vec<u32> = (0..n_queries as u32)
                .map(|q| if q == 0 { 3 } else { 20 + q })
                .collect();
            let by_ops = attend_by_ops(AttentionCall {
                queries: &queries,
                query_positions: &query_positions,
                keys: &keys,
                values: &values,
                key_positions: &key_positions,
                window,
            })?;
            // Whole, and in segments (a layer whose first rows are shared): the native kernels
            // read each in place, the candle path joins them.
            for cuts in [vec![], vec![3, 17]] {
                let segments = segments_cut_at(&keys, &values, &cuts)?;
                for kernels in [Kernels::Native, Kernels::Candle] {
                    let attended = super::super::attend(
                        &queries,
                        &query_positions,
                        &segments,
                        &key_positions,
                        window,
                        kernels,
                    )?;
                    let difference = (attended - &by_ops)?.abs()?.max_all()?.to_scalar::<f32>()?;
                    assert!(
                        difference < 1e-5,
                        "{n_queries}×{n_keys} {window:?} {kernels:?} cut at {cuts:?}: \
                         {difference}"
                    );
                }
            }
        }
        Ok(())
    }

    /// The products in f16 and bf16 (CUDA's with a half-precision cache, run here through the
    /// same function) stay within the dtypes' rounding of the f32 attention, through both the
    /// batched and the per-head shapes; the output keeps the queries' dtype.
    #[test]
    fn half_precision_products_stay_near_f32() -> Result<(), KernelError> {
        let device = Device::Cpu;
        let (n_heads, n_kv_heads, head_dim) = (4, 2, 16);
        for n in [6, 300] {
            let tensor = |heads: usize, seed: f64| {
                Tensor::arange(0f32, (n * heads * head_dim) as f32, &device)?
                    .affine(0.017 * seed, seed)?
                    .sin()?
                    .reshape((n, heads, head_dim))
            };
            let queries = tensor(n_heads, 1.0)?;
            let keys = tensor(n_kv_heads, 2.0)?;
            let values = tensor(n_kv_heads, 3.0)?;
            let positions: Vec<u32> = (0..n as u32).collect();
            let exact = attend_in(
                DType::F32,
                AttentionCall {
                    queries: &queries,
                    query_positions: &positions,
                    keys: &keys,
                    values: &values,
                    key_positions: &positions,
                    window: None,
                },
            )?;
            // Unit roundoff 2^-11 and 2^-8, a few roundings deep; outputs are at most 1.
            for (dtype, tolerance) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
                let half = attend_in(
                    dtype,
                    AttentionCall {
                        queries: &queries,
                        query_positions: &positions,
                        keys: &keys.to_dtype(dtype)?,
                        values: &values.to_dtype(dtype)?,
                        key_positions: &positions,
                        window: None,
                    },
                )?;
                assert_eq!(half.dtype(), DType::F32);
                let difference = (&exact - half)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(difference < tolerance, "{n} {dtype:?}: {difference}");
            }
        }
        Ok(())
    }

    #[test]
    fn attention_runs_in_half_precision_only_on_cuda() {
        let cpu = Device::Cpu;
        for cache in [DType::F32, DType::F16, DType::BF16] {
            assert_eq!(attention_dtype(&cpu, DType::F32, cache), DType::F32);
        }
    }

    #[test]
    fn every_query_sees_a_key_only_within_its_window() {
        assert!(every_query_sees_a_key(&[5, 9], &[9, 1], None));
        assert!(!every_query_sees_a_key(&[0, 9], &[9, 1], None));
        assert!(every_query_sees_a_key(&[9], &[1, 7], Some(3)));
        assert!(!every_query_sees_a_key(&[9], &[1, 6], Some(3)));
    }

    #[test]
    fn mismatched_positions_are_refused() {
        let scores = Tensor::zeros((1, 3, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(masked_softmax_by_ops(&scores, &[1, 2], &[0, 1], None).is_err());
        assert!(masked_softmax_by_ops(&scores, &[1], &[0], None).is_err());
    }
}
