//! Rows of a GGML tensor taken out or reordered on the stored blocks themselves: a row of
//! blocks is self-contained, so no dequantization and no change to a single weight.

use std::borrow::Cow;

use candle_core::Device;
use candle_core::quantized::{QStorage, QTensor};

use super::EngineError;

/// The rows `rows` of `tensor` (a matrix, or a vector whose entries are its rows), in that order.
pub(crate) fn gather_rows(
    tensor: &QTensor,
    rows: impl ExactSizeIterator<Item = usize>,
    device: &Device,
) -> Result<QTensor, EngineError> {
    let mut dims = tensor.shape().dims().to_vec();
    let total = *dims
        .first()
        .ok_or_else(|| EngineError::InvalidWeights("a scalar where rows were expected".into()))?;
    let data = tensor.data()?;
    if total == 0 || !data.len().is_multiple_of(total) {
        return Err(EngineError::InvalidWeights(format!(
            "{} bytes are not {total} whole rows",
            data.len()
        )));
    }
    let row_bytes = data.len() / total;
    dims[0] = rows.len();
    let mut gathered = Vec::with_capacity(rows.len() * row_bytes);
    for row in rows {
        if row >= total {
            return Err(EngineError::InvalidWeights(format!(
                "row {row} of a tensor of {total} rows"
            )));
        }
        gathered.extend_from_slice(&data[row * row_bytes..(row + 1) * row_bytes]);
    }
    let storage = QStorage::from_data(Cow::Owned(gathered), device, tensor.dtype())?;
    Ok(QTensor::new(storage, dims)?)
}
