//! The kernels under the engine's forward pass, and all of the workspace's `unsafe` but one
//! mapped-file read in `pml-store` (each block with its SAFETY comment):
//!
//! - matrix × held weights: [`quant::QuantMatrix`] (our quantized kernels) and [`dense_matmul`]
//!   (dense matrices), chosen per matrix by the engine's `model::weights::Linear`;
//! - attention of some queries over a layer's KV slots by per-token positions: [`attend`] (and
//!   [`masked_softmax`], the attention weights alone, for attention mass);
//! - norms, RoPE and the MLP's activation: [`rms_norm`], [`rope`], [`gated_activation`];
//! - the OS memory plumbing the weights and caches sit on ([`memory`]: the allocator's
//!   treatment of freed buffers, huge pages, mapped files).
//!
//! KV gather and scatter stay with the engine's KV cache, which owns the storage. This crate
//! knows nothing of models, tokenizers or caches: it sees tensors, blocks and rows.
//!
//! Two implementations ([`Kernels`], chosen by the engine's `device`): the native one (our AVX2
//! and AVX-512 kernels with scalar fallbacks, and candle's CPU ops), CPU only; and candle's
//! operations alone ([`Kernels::Candle`]: candle's `QMatMul` for quantized blocks,
//! [`position_mask`]'s masked softmax from a mask tensor), which run on any candle device — CUDA,
//! and the CPU, where every test run checks them against the native ones.

// The one crate whose code may be `unsafe` (the workspace lints deny it everywhere else).
#![allow(unsafe_code)]

mod activation;
#[cfg(test)]
mod attention_reference;
mod backend;
pub mod cpu_features;
mod error;
mod exp_kernel;
mod few_query_attention;
#[cfg(feature = "cuda")]
mod flash_attention_cuda;
mod kv_rows;
mod kv_segment;
mod masked_softmax;
#[cfg(feature = "cuda")]
mod masked_softmax_cuda;
pub mod memory;
#[cfg(feature = "cuda")]
mod nvrtc;
mod parallel_attention;
mod partial_softmax;
mod position_mask;
pub mod quant;
mod tiled_attention;

use candle_core::{CpuStorage, DType, Storage, Tensor};
use half::slice::HalfFloatSliceExt;

pub use activation::Activation;
pub use backend::{Kernels, UnknownKernels};
pub use error::KernelError;
pub use kv_segment::KvSegment;
pub use parallel_attention::ParallelScaling;

/// Most queries attended in plain loops ([`few_query_attention::attend_few`]) instead of matmuls.
const FEW_QUERIES: usize = 8;

/// `x · denseᵀ` for a dense weight matrix `(out_features, in_features)`, computed in the
/// matrix's dtype; the result is f32.
pub fn dense_matmul(dense: &Tensor, x: &Tensor) -> Result<Tensor, KernelError> {
    let x = x.to_dtype(dense.dtype())?.contiguous()?;
    Ok(x.matmul(&dense.t()?)?.to_dtype(DType::F32)?)
}

/// Whether [`attend`] of `queries` over `keys` materialises no scores (CUDA's flash-attention
/// kernel), so a long prefill need not go in chunks of queries.
pub fn attends_without_scores(queries: &Tensor, segments: &[KvSegment], kernels: Kernels) -> bool {
    #[cfg(feature = "cuda")]
    {
        kernels == Kernels::Candle
            && segments
                .first()
                .is_some_and(|segment| flash_attention_cuda::applies(queries, &segment.keys))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (queries, segments, kernels);
        false
    }
}

pub use position_mask::AttentionCall;
#[cfg(any(test, feature = "test-support"))]
pub use position_mask::flash_and_ops;

/// `softmax(q k^T under the position mask) v` for `queries` `(n, n_heads, head_dim)` (already
/// scaled) at `query_positions` over a layer's keys and values, the rows of `segments` one after
/// another (`(rows, n_kv_heads, head_dim)` each) at `key_positions`, with an optional sliding
/// `window`; `(n, n_heads * head_dim)`. Natively, a few queries (a decode step) go through plain
/// loops over the cache ([`few_query_attention`]), more through register tiles over runs of keys
/// ([`tiled_attention`]), both reading each segment in place. The candle path
/// ([`position_mask::attend_by_ops`]) takes one tensor: a layer of several segments is joined
/// for the call.
pub fn attend(
    queries: &Tensor,
    query_positions: &[u32],
    segments: &[KvSegment],
    key_positions: &[u32],
    window: Option<usize>,
    kernels: Kernels,
) -> Result<Tensor, KernelError> {
    if kernels == Kernels::Native {
        if queries.dim(0)? <= FEW_QUERIES {
            let few = few_query_attention::attend_few(
                queries,
                query_positions,
                segments,
                key_positions,
                window,
            )?;
            if let Some(attended) = few {
                return Ok(attended);
            }
        }
        let tiled = tiled_attention::attend_tiled(
            queries,
            query_positions,
            segments,
            key_positions,
            window,
        )?;
        if let Some(attended) = tiled {
            return Ok(attended);
        }
    }
    // The candle path, and tensors the native kernels do not read (not contiguous, another
    // dtype): candle's ops.
    let Some((keys, values)) = KvSegment::joined(segments)? else {
        return seeing_nothing(queries);
    };
    position_mask::attend_by_ops(AttentionCall {
        queries,
        query_positions,
        keys: &keys,
        values: &values,
        key_positions,
        window,
    })
}

/// [`attend`] with APE's correction over the keys `in_context` marks (one flag per key of
/// `segments`, in order; see [`parallel_attention`]), on every device and kernel choice.
pub fn attend_parallel(
    queries: &Tensor,
    query_positions: &[u32],
    segments: &[KvSegment],
    key_positions: &[u32],
    window: Option<usize>,
    in_context: &[bool],
    scaling: ParallelScaling,
) -> Result<Tensor, KernelError> {
    let Some((keys, values)) = KvSegment::joined(segments)? else {
        return seeing_nothing(queries);
    };
    parallel_attention::attend_parallel(
        queries,
        query_positions,
        &keys,
        &values,
        key_positions,
        window,
        in_context,
        scaling,
    )
}

/// `queries` `(n, n_heads, head_dim)` as `(n_kv_heads, group * n, head_dim)`: per KV head, the
/// queries of the heads sharing it stacked head by head (row `r` is query `r % n`), so one
/// product per KV head serves them all and K and V are never repeated.
pub fn queries_by_kv_head(queries: &Tensor, n_kv_heads: usize) -> Result<Tensor, KernelError> {
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    let group = n_heads / n_kv_heads;
    Ok(queries
        .reshape((n_queries, n_kv_heads, group, head_dim))?
        .permute((1, 2, 0, 3))?
        .contiguous()?
        .reshape((n_kv_heads, group * n_queries, head_dim))?)
}

/// The inverse of [`queries_by_kv_head`] for an attention output `(n_kv_heads, group * n,
/// head_dim)`: `(n, n_heads * head_dim)`, heads in the model's order.
pub fn outputs_by_query(attended: &Tensor, n_queries: usize) -> Result<Tensor, KernelError> {
    let (n_kv_heads, rows, head_dim) = attended.dims3()?;
    let group = rows / n_queries.max(1);
    Ok(attended
        .reshape((n_kv_heads, group, n_queries, head_dim))?
        .permute((2, 0, 1, 3))?
        .contiguous()?
        .reshape((n_queries, n_kv_heads * group * head_dim))?)
}

/// The attention of `queries` `(n, n_heads, head_dim)` over no key at all: zeros, as
/// `masked_softmax` gives a row that sees nothing.
fn seeing_nothing(queries: &Tensor) -> Result<Tensor, KernelError> {
    let (n_queries, n_heads, head_dim) = queries.dims3()?;
    Ok(Tensor::zeros(
        (n_queries, n_heads * head_dim),
        queries.dtype(),
        queries.device(),
    )?)
}

/// A layer's cached rows `(n_keys, n_kv_heads, head_dim)`, in the cache's dtype, as f32
/// `(n_kv_heads, n_keys, head_dim)`: the operand of the attention observer's matrix products
/// (`Attention::for_each_weights`). f32
/// rows are only viewed transposed (the gemm takes the strides; a copy of a long layer per call
/// cost a cached prompt ~20 ms); an f16 cache on the CPU is widened by `half`'s slice
/// conversion (F16C where the CPU has it), head by head, in the same pass as the transpose.
pub fn heads_major(rows: &Tensor) -> Result<Tensor, KernelError> {
    let (n_keys, n_kv_heads, head_dim) = rows.dims3()?;
    if rows.dtype() == DType::F16 && rows.device().is_cpu() {
        let widened = {
            let (storage, layout) = rows.storage_and_layout();
            match (&*storage, layout.contiguous_offsets()) {
                (Storage::Cpu(CpuStorage::F16(all)), Some((start, end))) => {
                    let all = &all[start..end];
                    let mut out = vec![0f32; all.len()];
                    for (head, out) in out.chunks_mut(n_keys * head_dim).enumerate() {
                        for (key, out) in out.chunks_exact_mut(head_dim).enumerate() {
                            let at = (key * n_kv_heads + head) * head_dim;
                            all[at..at + head_dim].convert_to_f32_slice(out);
                        }
                    }
                    Some(out)
                }
                _ => None,
            }
        };
        if let Some(widened) = widened {
            return Ok(Tensor::from_vec(
                widened,
                (n_kv_heads, n_keys, head_dim),
                rows.device(),
            )?);
        }
    }
    Ok(rows.to_dtype(DType::F32)?.transpose(0, 1)?)
}

/// Attention weights under the position mask (see [`masked_softmax::masked_softmax`], which is
/// one kernel on CUDA too; the candle path on the CPU computes the same from a mask tensor,
/// [`position_mask::masked_softmax_by_ops`]).
pub fn masked_softmax(
    scores: &Tensor,
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
    kernels: Kernels,
) -> Result<Tensor, KernelError> {
    let native = kernels == Kernels::Native && scores.device().is_cpu();
    if native || scores.device().is_cuda() {
        masked_softmax::masked_softmax(scores, query_positions, key_positions, window)
    } else {
        position_mask::masked_softmax_by_ops(scores, query_positions, key_positions, window)
    }
}

/// RMSNorm of `x` over its last dimension: `x / rms(x) * weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor, KernelError> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps)?)
}

/// Rotary embedding in the NEOX layout of `x` `(1, n_tokens, heads, head_dim)` (contiguous) by
/// per-row `cos`/`sin` tables `(n_tokens, head_dim / 2)`.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor, KernelError> {
    Ok(candle_nn::rotary_emb::rope_thd(x, cos, sin)?)
}

/// The gated MLP's `act(gate) · up`: natively in one pass ([`activation::gated`]), else by
/// candle's ops.
pub fn gated_activation(
    gate: &Tensor,
    up: &Tensor,
    activation: Activation,
    kernels: Kernels,
) -> Result<Tensor, KernelError> {
    if kernels == Kernels::Native
        && let Some(out) = activation::gated(gate, up, activation)?
    {
        return Ok(out);
    }
    let activated = match activation {
        Activation::Silu => candle_nn::ops::silu(gate)?,
        Activation::GeluTanh => gate.gelu()?,
    };
    Ok((activated * up)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn heads_major_widens_and_transposes_every_dtype_alike() -> Result<(), KernelError> {
        let rows = Tensor::arange(0f32, 5.0 * 3.0 * 8.0, &Device::Cpu)?.reshape((5, 3, 8))?;
        let expected = rows.transpose(0, 1)?.contiguous()?.to_vec3::<f32>()?;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let stored = rows.to_dtype(dtype)?;
            assert_eq!(
                heads_major(&stored)?.to_vec3::<f32>()?,
                expected,
                "{dtype:?}"
            );
            // A cache layer is a leading slice of a larger buffer.
            let buffer = Tensor::cat(&[&stored, &stored], 0)?;
            let slice = buffer.narrow(0, 5, 5)?;
            assert_eq!(
                heads_major(&slice)?.to_vec3::<f32>()?,
                expected,
                "{dtype:?} slice"
            );
        }
        Ok(())
    }
}
