//! Llama-family GGUFs store `attn_q` / `attn_k` with their output rows permuted: llama.cpp's
//! converter reorders each head's rows from Hugging Face's half-split RoPE pairing (dimension `i`
//! with `i + head_dim / 2`, "NEOX") to GGML's adjacent pairing (`2i` with `2i + 1`, "normal"),
//! which its Llama graph then applies. The engine applies the NEOX pairing to every family, so
//! the loader undoes that permutation, row for row, on the quantized blocks themselves (a row
//! of blocks is self-contained): no dequantization, the same bytes in another order.
//!
//! After it, the model's keys are exactly Hugging Face's, and everything downstream of the
//! projections (cached states, RoPE re-rotation of spliced modules, blend, HCache) needs no
//! case for the family.

use super::EngineError;
use super::row_gather::gather_rows;
use super::weights::TensorSource;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::MappedSlice;

/// Hands out the tensors of `inner`, with the rows of every `attn_q.weight` / `attn_k.weight`
/// (and their biases) put back in NEOX order.
pub struct NeoxRows<'a> {
    pub inner: &'a mut dyn TensorSource,
    pub n_heads: usize,
    pub n_kv_heads: usize,
}

impl TensorSource for NeoxRows<'_> {
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError> {
        let (n_heads, n_kv_heads) = (self.n_heads, self.n_kv_heads);
        let tensor = self.inner.stored(name)?;
        let heads = if name.ends_with(".attn_q.weight") || name.ends_with(".attn_q.bias") {
            n_heads
        } else if name.ends_with(".attn_k.weight") || name.ends_with(".attn_k.bias") {
            n_kv_heads
        } else {
            return Ok(tensor);
        };
        neox_rows(&tensor, heads)
            .map_err(|error| EngineError::InvalidWeights(format!("{name}: {error}")))
    }

    fn release(&mut self, name: &str) {
        self.inner.release(name);
    }

    /// Only the tensors this source passes on unchanged.
    fn mapped(&mut self, name: &str) -> Option<MappedSlice> {
        let reordered = [
            ".attn_q.weight",
            ".attn_q.bias",
            ".attn_k.weight",
            ".attn_k.bias",
        ]
        .iter()
        .any(|suffix| name.ends_with(suffix));
        if reordered {
            None
        } else {
            self.inner.mapped(name)
        }
    }
}

/// Row `r` of the result for a head of `head_dim` rows: the converter sent Hugging Face's row
/// `h·d + j·d/2 + i` (pair member `j` of pair `i`) to `h·d + 2i + j`; this reads it back.
pub fn neox_source_row(row: usize, head_dim: usize) -> usize {
    let (head, within) = (row / head_dim, row % head_dim);
    let half = head_dim / 2;
    let (member, pair) = (within / half, within % half);
    head * head_dim + 2 * pair + member
}

/// `tensor` (rows × …, or a vector of rows) with its rows reordered by [`neox_source_row`] for
/// `heads` heads.
fn neox_rows(
    tensor: &StoredTensor<'_>,
    heads: usize,
) -> Result<StoredTensor<'static>, EngineError> {
    let rows = tensor.dims().first().copied().unwrap_or(0);
    if heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(EngineError::InvalidWeights(format!(
            "{rows} rows do not split into {heads} heads of an even size"
        )));
    }
    let head_dim = rows / heads;
    gather_rows(tensor, (0..rows).map(|row| neox_source_row(row, head_dim)))
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    /// What llama.cpp's converter does to Hugging Face's rows (`permute` in
    /// `convert_hf_to_gguf.py`): reshape to (heads, 2, head_dim / 2, …), swap the middle axes.
    fn converter_permutation(rows: usize, heads: usize) -> Vec<usize> {
        let head_dim = rows / heads;
        let half = head_dim / 2;
        let mut gguf_to_hf = vec![0; rows];
        for head in 0..heads {
            for member in 0..2 {
                for pair in 0..half {
                    let hf = head * head_dim + member * half + pair;
                    let gguf = head * head_dim + 2 * pair + member;
                    gguf_to_hf[gguf] = hf;
                }
            }
        }
        gguf_to_hf
    }

    #[test]
    fn undoes_the_converters_permutation_on_quantized_rows() -> Result<(), EngineError> {
        let (rows, columns, heads) = (16, 32, 2);
        let device = Device::Cpu;
        // Row r of the Hugging Face matrix holds the value r everywhere (exact in Q8_0).
        let hf: Vec<f32> = (0..rows)
            .flat_map(|row| std::iter::repeat_n(row as f32, columns))
            .collect();
        let gguf_to_hf = converter_permutation(rows, heads);
        let gguf: Vec<f32> = gguf_to_hf
            .iter()
            .flat_map(|&row| std::iter::repeat_n(row as f32, columns))
            .collect();
        for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
            let stored = QTensor::quantize(
                &Tensor::from_vec(gguf.clone(), (rows, columns), &device)?,
                dtype,
            )?;
            let stored = StoredTensor::from_qtensor(&stored)?;
            let back = neox_rows(&stored, heads)?.dequantize(&device)?;
            let expected = Tensor::from_vec(hf.clone(), (rows, columns), &device)?;
            let diff = (back - expected)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-3, "{dtype:?}: {diff}");
        }
        Ok(())
    }

    #[test]
    fn a_bias_vector_is_reordered_too() -> Result<(), EngineError> {
        let device = Device::Cpu;
        let gguf_to_hf = converter_permutation(8, 2);
        let stored: Vec<f32> = gguf_to_hf.iter().map(|&row| row as f32).collect();
        let stored = QTensor::quantize(&Tensor::from_vec(stored, 8, &device)?, GgmlDType::F32)?;
        let stored = StoredTensor::from_qtensor(&stored)?;
        let back = neox_rows(&stored, 2)?.dequantize(&device)?;
        assert_eq!(
            back.to_vec1::<f32>()?,
            (0..8).map(|r| r as f32).collect::<Vec<_>>()
        );
        Ok(())
    }
}
