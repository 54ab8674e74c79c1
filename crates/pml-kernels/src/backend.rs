//! Which implementation of the kernels runs a model: ours on the CPU, or candle's operations on
//! any device.

use std::str::FromStr;

use candle_core::Device;

/// Which implementation of the kernels seam runs the model (`--kernels`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kernels {
    /// Our CPU kernels: quantized matmuls on GGML's blocks, few-query attention loops, the fused
    /// masked softmax; candle's CPU ops for the rest. CPU only.
    #[default]
    Native,
    /// candle's operations alone (`QMatMul`, `matmul`, `softmax_last_dim`, `rope_thd`,
    /// `rms_norm`, copies), on whatever device the tensors are on.
    Candle,
}

impl Kernels {
    /// The kernels used on `device` when none are asked for.
    pub fn default_for(device: &Device) -> Self {
        if device.is_cpu() {
            Kernels::Native
        } else {
            Kernels::Candle
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernels::Native => "native",
            Kernels::Candle => "candle",
        }
    }
}

/// A `--kernels` value that names no implementation.
#[derive(Debug, thiserror::Error)]
#[error("unknown kernels `{0}` (expected native or candle)")]
pub struct UnknownKernels(pub String);

impl FromStr for Kernels {
    type Err = UnknownKernels;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(Kernels::Native),
            "candle" => Ok(Kernels::Candle),
            other => Err(UnknownKernels(other.to_string())),
        }
    }
}
