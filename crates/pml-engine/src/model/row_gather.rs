//! Rows of a GGML tensor taken out or reordered on the stored blocks themselves: a row of
//! blocks is self-contained, so no dequantization and no change to a single weight.

use std::borrow::Cow;

use super::EngineError;
use crate::stored_tensor::StoredTensor;

/// The rows `rows` of `tensor` (a matrix, or a vector whose entries are its rows), in that order.
pub(crate) fn gather_rows(
    tensor: &StoredTensor<'_>,
    rows: impl ExactSizeIterator<Item = usize>,
) -> Result<StoredTensor<'static>, EngineError> {
    let mut dims = tensor.dims().to_vec();
    let total = *dims
        .first()
        .ok_or_else(|| EngineError::InvalidWeights("a scalar where rows were expected".into()))?;
    let data = tensor.bytes();
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
    Ok(StoredTensor::new(
        Cow::Owned(gathered),
        tensor.dtype(),
        dims,
    )?)
}
