//! A token-embedding table only read row by row (a file with a separate LM head), kept as GGML
//! stores it: a lookup dequantizes just the rows it asks for. The bytes are read in place from
//! the GGUF file's map (only the rows prompts ask for become resident: llama.cpp reads its
//! table the same way) or from the layout cache (`layout_cache`), or are a copy where the
//! tensor came from elsewhere.

use std::borrow::Cow;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use super::EngineError;
use super::row_gather::gather_rows;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::{MappedSlice, Slab};

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

    /// The matrix `(rows, columns)` of `dtype` blocks held by the mapped `bytes`.
    pub fn in_place(
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

    /// Refused unless `bytes` are exactly the whole-block rows of the shape (`StoredTensor`'s
    /// rule).
    fn checked(
        bytes: Slab<u8>,
        dtype: GgmlDType,
        rows: usize,
        columns: usize,
    ) -> Result<Self, EngineError> {
        let table = Self {
            bytes,
            dtype,
            rows,
            columns,
        };
        table.stored()?;
        Ok(table)
    }

    /// The table as a stored tensor borrowing its bytes.
    fn stored(&self) -> Result<StoredTensor<'_>, EngineError> {
        Ok(StoredTensor::new(
            Cow::Borrowed(&self.bytes),
            self.dtype,
            vec![self.rows, self.columns],
        )?)
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
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.rows) {
            return Err(EngineError::InvalidInput(format!(
                "row {id} of a matrix of {}",
                self.rows
            )));
        }
        let rows = gather_rows(&self.stored()?, ids.iter().map(|&id| id as usize))?;
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
