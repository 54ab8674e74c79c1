//! Rotary position embedding: a RoPE's frequencies and the cos/sin tables of one call's
//! positions (made once per call and RoPE, `super::context::ForwardContext::rope_tables`).

use candle_core::{Device, Tensor};

use super::EngineError;
use super::config::LayerAttention;
use pml_kernels as kernels;

/// Rotary position embedding in the NEOX layout (dimension `i` pairs with `i + head_dim / 2`),
/// as llama.cpp applies it to Qwen and Gemma (Llama files are brought to it at load,
/// [`super::rope_rows`]). Angles come from the positions in hand, so any
/// position costs the same and nothing is precomputed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RotaryEmbedding {
    inverse_frequencies: Vec<f64>,
    position_scale: f64,
}

/// cos and sin of one call's rows, `(n_tokens, head_dim / 2)` each.
#[derive(Clone, Debug)]
pub(crate) struct RotaryTables {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryEmbedding {
    /// `factors` divide the frequencies one by one (Llama 3.1's `rope_freqs.weight`).
    pub(crate) fn new(head_dim: usize, layer: &LayerAttention, factors: Option<&[f64]>) -> Self {
        let inverse_frequencies = (0..head_dim / 2)
            .map(|pair| {
                let frequency = layer.rope_base.powf(-((2 * pair) as f64) / head_dim as f64);
                frequency / factors.map_or(1.0, |factors| factors[pair])
            })
            .collect();
        Self {
            inverse_frequencies,
            position_scale: layer.rope_position_scale,
        }
    }

    /// Tables rotating row `i` by `offsets[i]` (a position, or a signed position delta).
    pub(crate) fn tables(
        &self,
        offsets: &[f64],
        device: &Device,
    ) -> Result<RotaryTables, EngineError> {
        let half = self.inverse_frequencies.len();
        let mut cos = Vec::with_capacity(offsets.len() * half);
        let mut sin = Vec::with_capacity(offsets.len() * half);
        for &offset in offsets {
            let scaled = offset * self.position_scale;
            for &frequency in &self.inverse_frequencies {
                let (s, c) = (scaled * frequency).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        Ok(RotaryTables {
            cos: Tensor::from_vec(cos, (offsets.len(), half), device)?,
            sin: Tensor::from_vec(sin, (offsets.len(), half), device)?,
        })
    }

    /// Rotates `x` `(n_tokens, heads, head_dim)`.
    pub(crate) fn apply(x: &Tensor, tables: &RotaryTables) -> Result<Tensor, EngineError> {
        let x = x.unsqueeze(0)?.contiguous()?;
        Ok(kernels::rope(&x, &tables.cos, &tables.sin)?.squeeze(0)?)
    }
}

impl RotaryTables {
    /// The device the tables are on.
    pub(crate) fn device(&self) -> &Device {
        self.cos.device()
    }

    #[cfg(test)]
    pub(crate) fn cos(&self) -> &Tensor {
        &self.cos
    }
}

#[cfg(test)]
impl RotaryEmbedding {
    pub(crate) fn for_test(inverse_frequencies: &[f64], position_scale: f64) -> Self {
        Self {
            inverse_frequencies: inverse_frequencies.to_vec(),
            position_scale,
        }
    }
}

pub(crate) fn positions_as_offsets(positions: &[u32]) -> Vec<f64> {
    positions
        .iter()
        .map(|&position| f64::from(position))
        .collect()
}
