//! A token-embedding table only read row by row (a file with a separate LM head), kept as GGML
//! stores it: a lookup dequantizes just the rows it asks for. The bytes are a copy of the
//! file's, or read in place from the layout cache (`layout_cache`).

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::EngineError;
use crate::kernels::mapped::{MappedSlice, Slab};
use crate::stored_tensor::StoredTensor;

#[derive(Debug)]
pub struct StoredRows {
    bytes: Slab<u8>,
    dtype: GgmlDType,
    rows: usize,
    columns: usize,
}

impl StoredRows {
    /// A copy of the matrix `stored`.
    pub fn copy_of(stored: &StoredTensor<'_>) -> Result<Self, EngineError> {
        let (rows, columns) = stored.dims2()?;
        Self::checked(
            stored.bytes().to_vec().into(),
            stored.dtype(),
            rows,
            columns,
        )
    }

    /// The matrix `(rows, columns)` of `dtype` blocks held by `bytes`.
    pub fn from_layout(
        bytes: MappedSlice,
        dtype: GgmlDType,
        rows: usize,
        columns: usize,
    ) -> Result<Self, EngineError> {
        let bytes = Slab::mapped(bytes).ok_or_else(|| {
            EngineError::InvalidWeights("cached rows are not plain bytes".to_string())
        })?;
        Self::checked(bytes, dtype, rows, columns)
    }

    fn checked(
        bytes: Slab<u8>,
        dtype: GgmlDType,
        rows: usize,
        columns: usize,
    ) -> Result<Self, EngineError> {
        let whole_blocks = columns.is_multiple_of(dtype.block_size());
        if !whole_blocks || bytes.len() != rows * row_bytes(dtype, columns) {
            return Err(EngineError::InvalidWeights(format!(
                "{} bytes are not {rows} rows of {columns} {dtype:?} weights",
                bytes.len()
            )));
        }
        Ok(Self {
            bytes,
            dtype,
            rows,
            columns,
        })
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.columns)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Rows `ids` in f32, `(ids.len(), columns)` on `device`.
    pub fn rows(&self, ids: &[u32], device: &Device) -> Result<Tensor, EngineError> {
        let row_bytes = row_bytes(self.dtype, self.columns);
        // candle reads the bytes in place as blocks, which must be aligned for their scales.
        let mut words = vec![0u32; (ids.len() * row_bytes).div_ceil(4)];
        let gathered =
            &mut bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..ids.len() * row_bytes];
        for (&id, out) in ids.iter().zip(gathered.chunks_exact_mut(row_bytes.max(1))) {
            let row = id as usize;
            if row >= self.rows {
                return Err(EngineError::InvalidInput(format!(
                    "row {row} of a matrix of {}",
                    self.rows
                )));
            }
            out.copy_from_slice(&self.bytes[row * row_bytes..][..row_bytes]);
        }
        let storage = QStorage::from_data(Cow::Borrowed(gathered), &Device::Cpu, self.dtype)?;
        let rows = QTensor::new(storage, (ids.len(), self.columns))?;
        Ok(rows.dequantize(device)?)
    }

    pub fn size_in_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the rows are read in place from a mapped file.
    pub fn is_mapped(&self) -> bool {
        self.bytes.is_mapped()
    }
}

fn row_bytes(dtype: GgmlDType, columns: usize) -> usize {
    columns / dtype.block_size() * dtype.type_size()
}
