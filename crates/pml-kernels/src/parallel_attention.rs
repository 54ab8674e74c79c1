//! Attention over parallel contexts with APE's correction (Yang, Chen and Chen, "APE: Faster and
//! Longer Context-Augmented Generation via Adaptive Parallel Encoding", ICLR 2025).
//!
//! Contexts encoded apart (collection members spliced side by side) each carry the attention
//! mass a single context would: together they draw more than one long context encoded in
//! sequence would, and the mass within them is flatter. APE re-weights, with no training and no
//! recompute, the attention of the tokens computed over such a cache: within the context keys
//! the scores are divided by a temperature `T`, and the context block as a whole weighs
//! `exp(S · T · lse_C)` against the other keys' `exp(lse_O)`, where `lse_C` is the log-sum-exp of
//! the tempered context scores and `S` a scaling factor (the reference code combines the two
//! blocks' outputs by those log-sum-exps). Per context key that is one added constant:
//!
//! `l_j = s_j / T + (S·T − 1) · lse_C` for context keys, `l_j = s_j` for the others,
//!
//! then the usual softmax over every visible key. `T = S = 1` is plain attention.
//!
//! The weights are computed on the host in f32 from one product per KV head: a correction for
//! the few new tokens of a cached prompt and its decoding steps, not a prefill kernel.

use candle_core::{DType, Tensor};

use super::KernelError;
use super::exp_kernel::exp_shifted_sum;
use super::masked_softmax::{Visibility, check_shapes};

/// APE's two factors: the temperature within the contexts and the scale of their block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParallelScaling {
    pub temperature: f32,
    pub scale: f32,
}

impl ParallelScaling {
    /// Plain attention.
    pub const NONE: Self = Self {
        temperature: 1.0,
        scale: 1.0,
    };
}

/// `softmax(l) v` as the module describes, for `queries` `(n, n_heads, head_dim)` (already
/// scaled) at `query_positions` over `keys`/`values` `(n_keys, n_kv_heads, head_dim)` at
/// `key_positions`, `in_context[k]` telling whether key `k` is a context row; `(n, n_heads *
/// head_dim)` in the queries' dtype. A query that sees no key gets zeros.
#[allow(clippy::too_many_arguments)]
pub fn attend_parallel(
    queries: &Tensor,
    query_positions: &[u32],
    keys: &Tensor,
    values: &Tensor,
    key_positions: &[u32],
    window: Option<usize>,
    in_context: &[bool],
    scaling: ParallelScaling,
) -> Result<Tensor, KernelError> {
    let (n_queries, n_heads, _) = queries.dims3()?;
    let (n_keys, n_kv_heads, _) = keys.dims3()?;
    check_shapes(n_queries, n_keys, query_positions, key_positions)?;
    if in_context.len() != n_keys {
        return Err(KernelError::InvalidInput(format!(
            "{} context flags for {n_keys} keys",
            in_context.len()
        )));
    }
    let valid = |factor: f32| factor.is_finite() && factor > 0.0;
    if !valid(scaling.temperature) || !valid(scaling.scale) {
        return Err(KernelError::InvalidInput(format!(
            "parallel attention's temperature {} and scale {} must be positive",
            scaling.temperature, scaling.scale
        )));
    }
    let out_dtype = queries.dtype();
    let rows = n_heads / n_kv_heads * n_queries;
    // Row `r` of a KV head is query `r % n_queries`.
    let grouped = super::queries_by_kv_head(&queries.to_dtype(DType::F32)?, n_kv_heads)?;
    let keys = keys.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
    let values = values.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?;
    let scores = grouped.matmul(&keys.t()?)?;
    let mut weights = scores.flatten_all()?.to_vec1::<f32>()?;
    let visibility = Visibility::new(window);
    for (row, scores) in weights.chunks_exact_mut(n_keys).enumerate() {
        let query = query_positions[row % n_queries];
        corrected_softmax(
            scores,
            |key| visibility.sees(query, key_positions[key]),
            in_context,
            scaling,
        );
    }
    let weights = Tensor::from_vec(weights, (n_kv_heads, rows, n_keys), queries.device())?;
    Ok(super::outputs_by_query(&weights.matmul(&values)?, n_queries)?.to_dtype(out_dtype)?)
}

/// One row: `scores` replaced by APE's weights over the keys `sees` admits, 0 elsewhere (all 0
/// where it admits none).
fn corrected_softmax(
    scores: &mut [f32],
    sees: impl Fn(usize) -> bool,
    in_context: &[bool],
    scaling: ParallelScaling,
) {
    let ParallelScaling { temperature, scale } = scaling;
    // The tempered context scores and their log-sum-exp.
    let mut context_max = f32::NEG_INFINITY;
    for (key, score) in scores.iter_mut().enumerate() {
        if !sees(key) {
            *score = f32::NEG_INFINITY;
        } else if in_context[key] {
            *score /= temperature;
            context_max = context_max.max(*score);
        }
    }
    if context_max.is_finite() {
        let sum: f32 = scores
            .iter()
            .zip(in_context)
            .filter(|(score, context)| **context && score.is_finite())
            .map(|(score, _)| (score - context_max).exp())
            .sum();
        let shift = (scale * temperature - 1.0) * (context_max + sum.ln());
        for (score, &context) in scores.iter_mut().zip(in_context) {
            if context && score.is_finite() {
                *score += shift;
            }
        }
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        scores.fill(0.0);
        return;
    }
    let total = exp_shifted_sum(scores, max);
    for score in scores.iter_mut() {
        *score /= total;
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::{self as kernels, Kernels, KvSegment};

    fn seeded(shape: (usize, usize, usize), seed: u64) -> Tensor {
        let len = shape.0 * shape.1 * shape.2;
        let mut state = seed;
        let data: Vec<f32> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn without_correction_it_is_every_kernel_s_attention() -> Result<(), KernelError> {
        // Qwen2.5-1.5B's heads: 12 query heads over 2 KV heads of 128; a cached prompt's new
        // tokens (tiled kernel) and a decoding step (few-query kernel), with and without a
        // window. Row 0 a sink: its scores an order of magnitude above the rest.
        let keys = seeded((600, 2, 128), 6).affine(2.0, 0.0)?;
        let sink = Tensor::ones((1, 2, 128), DType::F32, &Device::Cpu)?.affine(8.0, 0.0)?;
        let keys = Tensor::cat(&[&sink, &keys.narrow(0, 1, 599)?], 0)?;
        let values = seeded((600, 2, 128), 7);
        let key_positions: Vec<u32> = (0..600).collect();
        let in_context: Vec<bool> = (0..600).map(|key| (20..560).contains(&key)).collect();
        for (n_queries, dtype, window) in [
            (24, DType::F32, None),
            (1, DType::F32, None),
            (24, DType::F16, Some(64)),
            (1, DType::F16, None),
        ] {
            let queries = seeded((n_queries, 12, 128), 8).affine(0.3, 0.1)?;
            let query_positions: Vec<u32> = (600 - n_queries as u32..600).collect();
            let (keys, values) = (keys.to_dtype(dtype)?, values.to_dtype(dtype)?);
            // A cache whose first rows are shared with others: two segments.
            let segments: Vec<KvSegment> = [0..500, 500..600]
                .into_iter()
                .map(|rows| -> Result<_, KernelError> {
                    Ok(KvSegment {
                        keys: keys.narrow(0, rows.start, rows.len())?,
                        values: values.narrow(0, rows.start, rows.len())?,
                    })
                })
                .collect::<Result<_, _>>()?;
            let call = (
                &queries,
                &query_positions[..],
                &segments[..],
                &key_positions[..],
            );
            let ape = kernels::attend_parallel(
                call.0,
                call.1,
                call.2,
                call.3,
                window,
                &in_context,
                ParallelScaling::NONE,
            )?;
            for choice in [Kernels::Native, Kernels::Candle] {
                let plain = kernels::attend(call.0, call.1, call.2, call.3, window, choice)?;
                let gap = (plain - &ape)?.abs()?.max_all()?.to_scalar::<f32>()?;
                assert!(
                    gap < 1e-4,
                    "{n_queries} queries, {dtype:?}, {choice:?}: {gap}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn the_context_block_weighs_its_scaled_log_sum_exp() {
        // Two context keys with scores 1 and 2, one other key with score 0.5; T = 0.5, S = 0.8.
        let scaling = ParallelScaling {
            temperature: 0.5,
            scale: 0.8,
        };
        let mut scores = [1.0f32, 2.0, 0.5];
        corrected_softmax(&mut scores, |_| true, &[true, true, false], scaling);
        let lse_context = (2.0f32.exp() + 4.0f32.exp()).ln();
        let context_mass = (scaling.scale * scaling.temperature * lse_context).exp();
        let other_mass = 0.5f32.exp();
        let total = context_mass + other_mass;
        let expected_other = other_mass / total;
        // Within the block, the tempered scores' softmax.
        let within = 4.0f32.exp() / (2.0f32.exp() + 4.0f32.exp());
        assert!((scores[2] - expected_other).abs() < 1e-6, "{scores:?}");
        assert!(
            (scores[1] - within * context_mass / total).abs() < 1e-6,
            "{scores:?}"
        );
        assert!((scores.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn a_query_that_sees_nothing_gets_zeros_and_bad_factors_are_refused() {
        let mut scores = [1.0f32, 2.0];
        corrected_softmax(
            &mut scores,
            |_| false,
            &[true, false],
            ParallelScaling::NONE,
        );
        assert_eq!(scores, [0.0, 0.0]);
        let (queries, keys) = (seeded((1, 2, 4), 4), seeded((2, 1, 4), 5));
        let bad = ParallelScaling {
            temperature: 0.0,
            scale: 1.0,
        };
        let refused = |flags: &[bool], scaling| {
            attend_parallel(&queries, &[5], &keys, &keys, &[0, 1], None, flags, scaling).is_err()
        };
        assert!(refused(&[true, true], bad));
        assert!(refused(&[true], ParallelScaling::NONE));
    }
}
