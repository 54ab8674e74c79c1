//! Reading a pass's logits into plain `f32` values, for the loop and the draft model alike.

use candle_core::{DType, Tensor};

use super::error::GenerateError;

/// The logits of one token as f32 values.
pub fn logits_to_vec(logits: &Tensor) -> Result<Vec<f32>, GenerateError> {
    Ok(logits
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?)
}
