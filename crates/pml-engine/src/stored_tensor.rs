//! A tensor as a GGUF file stores it: its bytes (borrowed from the mapped file, or owned where
//! the loader reordered or split rows), its GGML type and its shape. The loader hands these to
//! the weight layouts, which copy the bytes once into their own form; a candle `QTensor` is
//! built only for the matrices candle multiplies.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

/// The largest alignment candle's block types need (f32 entries; blocks hold f16 scales).
const BLOCK_ALIGN: usize = std::mem::align_of::<f32>();

#[derive(Clone, Debug)]
pub struct StoredTensor<'a> {
    bytes: Cow<'a, [u8]>,
    dtype: GgmlDType,
    dims: Vec<usize>,
}

impl<'a> StoredTensor<'a> {
    /// Checks that `bytes` are exactly the blocks of a `dims` tensor of `dtype`, each row whole
    /// blocks (GGML's own rule: a row never shares a block with the next).
    pub fn new(
        bytes: Cow<'a, [u8]>,
        dtype: GgmlDType,
        dims: Vec<usize>,
    ) -> candle_core::Result<Self> {
        let row = dims.last().copied().unwrap_or(1);
        if !row.is_multiple_of(dtype.block_size()) {
            candle_core::bail!(
                "rows of {row} entries are not whole {dtype:?} blocks of {}",
                dtype.block_size()
            );
        }
        let expected = Self::byte_len(dtype, &dims);
        if bytes.len() != expected {
            candle_core::bail!(
                "{} bytes for a {dims:?} {dtype:?} tensor of {expected} bytes",
                bytes.len()
            );
        }
        Ok(Self { bytes, dtype, dims })
    }

    /// Bytes of a `dims` tensor of `dtype` whose rows are whole blocks.
    pub fn byte_len(dtype: GgmlDType, dims: &[usize]) -> usize {
        dims.iter().product::<usize>() / dtype.block_size() * dtype.type_size()
    }

    /// A copy of `qtensor`'s blocks.
    pub fn from_qtensor(qtensor: &QTensor) -> candle_core::Result<StoredTensor<'static>> {
        StoredTensor::new(
            Cow::Owned(qtensor.data()?.into_owned()),
            qtensor.dtype(),
            qtensor.shape().dims().to_vec(),
        )
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// `(rows, columns)` of a matrix.
    pub fn dims2(&self) -> candle_core::Result<(usize, usize)> {
        match self.dims[..] {
            [rows, columns] => Ok((rows, columns)),
            _ => candle_core::bail!("a {:?} tensor where a matrix was expected", self.dims),
        }
    }

    /// The blocks as a candle tensor on `device` (one copy).
    pub fn to_qtensor(&self, device: &Device) -> candle_core::Result<QTensor> {
        // candle reads the bytes in place as blocks and panics on a misaligned start; a mapped
        // file's tensors are aligned (GGUF pads to 32 bytes), owned bytes are copied if need be.
        let storage = if (self.bytes.as_ptr() as usize).is_multiple_of(BLOCK_ALIGN) {
            QStorage::from_data(Cow::Borrowed(&self.bytes), device, self.dtype)?
        } else {
            let mut aligned = vec![0u32; self.bytes.len().div_ceil(BLOCK_ALIGN)];
            let aligned_bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut aligned);
            aligned_bytes[..self.bytes.len()].copy_from_slice(&self.bytes);
            QStorage::from_data(
                Cow::Borrowed(&aligned_bytes[..self.bytes.len()]),
                device,
                self.dtype,
            )?
        };
        QTensor::new(storage, self.dims.clone())
    }

    /// The entries as an f32 tensor on `device`.
    pub fn dequantize(&self, device: &Device) -> candle_core::Result<Tensor> {
        self.to_qtensor(device)?.dequantize(device)
    }

    /// The same tensor owning its bytes.
    pub fn into_owned(self) -> StoredTensor<'static> {
        StoredTensor {
            bytes: Cow::Owned(self.bytes.into_owned()),
            dtype: self.dtype,
            dims: self.dims,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_and_misaligned_bytes_still_load() -> candle_core::Result<()> {
        let device = Device::Cpu;
        let values = Tensor::arange(0f32, 64., &device)?.reshape((2, 32))?;
        let q8 = QTensor::quantize(&values, GgmlDType::Q8_0)?;
        let stored = StoredTensor::from_qtensor(&q8)?;
        assert_eq!(stored.bytes().len(), 2 * 34);
        assert!(
            StoredTensor::new(
                Cow::Borrowed(&stored.bytes()[1..]),
                GgmlDType::Q8_0,
                vec![2, 32]
            )
            .is_err()
        );
        assert!(
            StoredTensor::new(Cow::Borrowed(stored.bytes()), GgmlDType::Q8_0, vec![4, 16]).is_err()
        );
        // The same blocks one byte into a buffer: not aligned for candle's block slices.
        let mut shifted = vec![0u8; stored.bytes().len() + 1];
        shifted[1..].copy_from_slice(stored.bytes());
        let misaligned =
            StoredTensor::new(Cow::Borrowed(&shifted[1..]), GgmlDType::Q8_0, vec![2, 32])?;
        let back = misaligned.dequantize(&device)?;
        let expected = q8.dequantize(&device)?;
        let diff = (back - expected)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert_eq!(diff, 0.0);
        Ok(())
    }
}
