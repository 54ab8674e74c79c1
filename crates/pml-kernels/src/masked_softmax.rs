//! Softmax of attention scores under the position mask, in one pass over the scores: no mask
//! tensor is built or added, and masked scores are never exponentiated. Rows are independent
//! and spread over rayon's threads when there are enough of them. On CUDA the same operation
//! runs as one kernel (`masked_softmax_cuda`), in the scores' dtype.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::KernelError;
use super::exp_kernel::exp_shifted_sum;

/// Fewest scores worth handing to rayon: a decode step's few thousand take microseconds, less
/// than waking rayon's threads, which on a small machine also compete with candle's spinning
/// workers for the cores.
const PARALLEL_MIN_SCORES: usize = 1 << 16;

/// Independent running maxima, so the maximum of a row is not one serial chain.
const LANES: usize = 8;

/// Which keys a query may see: a query at position `query` sees a key at `key` when `key <=
/// query`, and `query - key < window` in local layers. The window is resolved once, so loops
/// over keys have no branch on it and the softmax's masking loop vectorizes; no window is the
/// widest one (positions stay far below `u32::MAX`).
#[derive(Clone, Copy)]
pub(super) struct Visibility {
    window: u32,
}

impl Visibility {
    pub(super) fn new(window: Option<usize>) -> Self {
        let window = window.map_or(u32::MAX, |window| u32::try_from(window).unwrap_or(u32::MAX));
        Self { window }
    }

    /// The window as the CUDA kernels take it: `u32::MAX` for none.
    #[cfg(feature = "cuda")]
    pub(super) fn limit(self) -> u32 {
        self.window
    }

    #[inline]
    pub(super) fn sees(self, query: u32, key: u32) -> bool {
        key <= query && query - key < self.window
    }
}

/// Scores `(heads, rows, n_keys)` where row `r` belongs to the query at
/// `query_positions[r % query_positions.len()]` and column `k` to the key at `key_positions[k]`.
struct MaskedSoftmax<'a> {
    query_positions: &'a [u32],
    key_positions: &'a [u32],
    window: Option<usize>,
}

/// `softmax(scores)` over the keys each row's query may see (see [`Visibility`]), 0 for the
/// others; a row that sees no key is all zeros. `scores`: `(heads, rows, key_positions.len())`
/// with `rows` a multiple of `query_positions.len()`; f32 on the CPU, f32, f16 or bf16 on CUDA.
pub(super) fn masked_softmax(
    scores: &Tensor,
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Tensor, KernelError> {
    let (_, rows, n_keys) = scores.dims3()?;
    check_shapes(rows, n_keys, query_positions, key_positions)?;
    let op = MaskedSoftmax {
        query_positions,
        key_positions,
        window,
    };
    Ok(scores.contiguous()?.apply_op1_no_bwd(&op)?)
}

/// Scores of `rows` rows of `n_keys` fit the positions: one column per key, rows a multiple
/// of the queries. Both masked softmaxes (native and candle's) take their scores so.
pub(super) fn check_shapes(
    rows: usize,
    n_keys: usize,
    query_positions: &[u32],
    key_positions: &[u32],
) -> Result<(), KernelError> {
    let n_queries = query_positions.len();
    if n_keys != key_positions.len() || n_queries == 0 || !rows.is_multiple_of(n_queries) {
        return Err(KernelError::InvalidInput(format!(
            "masked softmax of {rows}×{n_keys} scores for {n_queries} queries and {} keys",
            key_positions.len()
        )));
    }
    Ok(())
}

impl CustomOp1 for MaskedSoftmax<'_> {
    fn name(&self) -> &'static str {
        "masked-softmax"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("masked softmax needs contiguous scores")
        };
        let scores = &storage.as_slice::<f32>()?[start..end];
        let n_keys = self.key_positions.len();
        let n_queries = self.query_positions.len();
        let mut out = vec![0f32; scores.len()];
        // No branch per key: the masked copy and its maximum vectorize, and the exponentials
        // take the SIMD kernel (a masked `-inf` becomes 0 there).
        let visibility = Visibility::new(self.window);
        let softmax_row = |row: usize, out: &mut [f32], scores: &[f32]| {
            let query = self.query_positions[row % n_queries];
            let mut maxima = [f32::NEG_INFINITY; LANES];
            for ((out, scores), keys) in out
                .chunks_mut(LANES)
                .zip(scores.chunks(LANES))
                .zip(self.key_positions.chunks(LANES))
            {
                for (lane, ((out, &score), &key)) in
                    out.iter_mut().zip(scores).zip(keys).enumerate()
                {
                    *out = if visibility.sees(query, key) {
                        score
                    } else {
                        f32::NEG_INFINITY
                    };
                    maxima[lane] = maxima[lane].max(*out);
                }
            }
            let max = maxima.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                out.fill(0.0);
                return;
            }
            let inverse = exp_shifted_sum(out, max).recip();
            out.iter_mut().for_each(|out| *out *= inverse);
        };
        if scores.len() < PARALLEL_MIN_SCORES {
            out.chunks_mut(n_keys)
                .zip(scores.chunks(n_keys))
                .enumerate()
                .for_each(|(row, (out, scores))| softmax_row(row, out, scores));
        } else {
            out.par_chunks_mut(n_keys)
                .zip(scores.par_chunks(n_keys))
                .enumerate()
                .for_each(|(row, (out, scores))| softmax_row(row, out, scores));
        }
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }

    /// f32, f16 or bf16 scores, in one kernel (`masked_softmax_cuda`).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        super::masked_softmax_cuda::forward(
            storage,
            layout,
            self.query_positions,
            self.key_positions,
            Visibility::new(self.window).limit(),
        )
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn matches_an_additive_mask_then_softmax() -> Result<(), KernelError> {
        let device = Device::Cpu;
        let scores = Tensor::arange(0f32, 24.0, &device)?
            .affine(0.37, -2.0)?
            .sin()?
            .reshape((2, 3, 4))?;
        let (queries, keys, window) = ([7u32, 9, 8], [6u32, 7, 8, 9], Some(2));
        let ours = masked_softmax(&scores, &queries, &keys, window)?;
        let mask: Vec<f32> = queries
            .iter()
            .flat_map(|&q| {
                keys.iter().map(move |&k| {
                    if Visibility::new(window).sees(q, k) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (3, 4), &device)?;
        let reference = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
        let difference = (ours - reference)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(difference < 1e-6, "difference {difference}");
        Ok(())
    }

    #[test]
    fn a_row_that_sees_nothing_is_zero() -> Result<(), KernelError> {
        let scores = Tensor::ones((1, 1, 2), candle_core::DType::F32, &Device::Cpu)?;
        let out = masked_softmax(&scores, &[0], &[1, 2], None)?;
        assert_eq!(out.flatten_all()?.to_vec1::<f32>()?, vec![0.0, 0.0]);
        Ok(())
    }
}
