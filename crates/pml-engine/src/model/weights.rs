//! Read-only weights: where tensors come from ([`TensorSource`]: a GGUF file or an in-memory
//! map), the one place that decides how matrices are held ([`WeightFormat`]), and the layers
//! built from them ([`Linear`], [`RmsNorm`]).

use std::collections::HashMap;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::EngineError;
use super::stored_rows::StoredRows;
use crate::device::{Backend, Kernels};
use crate::gguf::GgufFile;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::MappedSlice;
use pml_kernels::quant::QuantMatrix;
use pml_kernels::{self as kernels, cpu_features, dense_matmul};

/// How weight matrices are held in memory and multiplied.
///
/// Our quantized kernels (`pml_kernels::quant`: Q8_0, Q5_0, Q4_K, Q6_K, every projection of both
/// default models) multiply GGML's blocks as stored: up to [`pml_kernels::quant::PANEL_MIN_ROWS`]
/// rows with quantized activations, unpacking each weight block once per tile of activation
/// rows; from there by dequantizing panels of the matrix into a per-worker scratch buffer for
/// the f32 gemm. So the default, [`WeightFormat::Quantized`], holds no dense copy and runs a
/// prefill as fast as the copies did (`examples/kernel_probe.rs`, docs/results/history.md,
/// "Engine"); the `QuantizedAnd*` formats remain for comparison.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    /// GGML blocks as stored in the file, multiplied with quantized kernels for every row
    /// count (blocks no fast kernel covers are requantized to Q8_0): the least memory.
    #[default]
    Quantized,
    F32,
    F16,
    Bf16,
    /// Projections: F16 copies for calls of more than [`FEW_ROWS`] rows (prefill, recompute)
    /// and quantized blocks with a fast kernel (requantized to Q8_0 where the stored type has
    /// none) for fewer (decode). Vocabulary matrices: quantized blocks only, since they see few
    /// rows (the LM head computes the rows that need logits) or none (embedding lookup).
    QuantizedAndF16,
    /// As [`WeightFormat::QuantizedAndF16`] with F32 copies: the fastest prefill on CPUs
    /// without f16 arithmetic, for twice the dense bytes.
    QuantizedAndF32,
}

/// Row count up to which the `QuantizedAnd*` formats use the quantized kernels.
pub const FEW_ROWS: usize = 8;

/// What a matrix is used for, which decides the copies the `QuantizedAnd*` formats keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixRole {
    /// Multiplied by the activations of every token (attention and MLP projections).
    Projection,
    /// Vocabulary-sized, multiplied only for the rows that need logits (the LM head).
    OutputHead,
    /// Only read row by row (token embeddings when the file has a separate LM head).
    Lookup,
}

impl WeightFormat {
    /// The format's stable name: part of every store key and cost file, so it never changes.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Quantized => "quantized",
            WeightFormat::F32 => "f32",
            WeightFormat::F16 => "f16",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::QuantizedAndF16 => "quantized+f16",
            WeightFormat::QuantizedAndF32 => "quantized+f32",
        }
    }

    /// The dense dtype the format keeps for `role`, if it keeps one.
    fn dense_dtype(self, role: MatrixRole) -> Option<DType> {
        match self {
            WeightFormat::Quantized => None,
            WeightFormat::F32 => Some(DType::F32),
            WeightFormat::F16 => Some(DType::F16),
            WeightFormat::Bf16 => Some(DType::BF16),
            WeightFormat::QuantizedAndF16 => (role == MatrixRole::Projection).then_some(DType::F16),
            WeightFormat::QuantizedAndF32 => (role == MatrixRole::Projection).then_some(DType::F32),
        }
    }

    /// Whether projections keep quantized blocks beside their dense copy.
    fn keeps_both(self) -> bool {
        matches!(
            self,
            WeightFormat::QuantizedAndF16 | WeightFormat::QuantizedAndF32
        )
    }
}

/// Whether candle multiplies blocks of `dtype` with SIMD on x86-64 (AVX2): its other block
/// types fall back to scalar code many times slower.
fn has_fast_cpu_kernel(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q4_0
            | GgmlDType::Q8_0
            | GgmlDType::Q2K
            | GgmlDType::Q3K
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K
            | GgmlDType::Q8K
    )
}

/// Somewhere tensors can be read from by GGUF name.
pub trait TensorSource {
    fn contains(&self, name: &str) -> bool;
    /// Tensor `name` as stored; the loader asks for each once.
    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError>;
    /// Matrix `name` in the layout the loader would build from it, where a cache of an
    /// earlier load holds it (`layout_cache`); the loader asks before [`Self::stored`].
    fn cached_layout(&mut self, _name: &str) -> Option<CachedLayout> {
        None
    }
    /// Hands a cache the layout the loader built for `name` from a tensor stored as
    /// `stored_dtype`.
    fn built_layout(&mut self, _name: &str, _stored_dtype: GgmlDType, _layout: CachedLayout) {}
    /// Says that `name`'s stored bytes will not be read again: the loader has its own copy, so
    /// a mapped file may drop its pages from the process (they stay in the page cache).
    fn release(&mut self, _name: &str) {}
    /// Tensor `name`'s bytes, as stored, in a mapped file that outlives the load, where the
    /// source has them so (a lookup table then reads its rows in place).
    fn mapped(&mut self, _name: &str) -> Option<MappedSlice> {
        None
    }
}

/// A matrix layout the layout cache keeps: our kernels' blocks, or a lookup table's rows.
#[derive(Clone, Debug)]
pub enum CachedLayout {
    Quant(Arc<QuantMatrix>),
    Rows(Arc<StoredRows>),
}

/// Whether matrices get our kernels' layouts: the native kernels on a CPU with AVX2. Without
/// AVX2 (an ARM CPU, an old x86) our kernels would run their scalar loops, and candle's run its
/// own SIMD (NEON on aarch64).
pub(crate) fn native_layouts(backend: &Backend) -> bool {
    backend.kernels == Kernels::Native && backend.device.is_cpu() && cpu_features::avx2()
}

/// A file is read through a shared reference (reading needs no `&mut`), so the weights can load
/// from it while another thread builds the tokenizer from its metadata.
impl TensorSource for &GgufFile {
    fn contains(&self, name: &str) -> bool {
        self.tensor_info(name).is_some()
    }

    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError> {
        Ok(GgufFile::stored(self, name)?)
    }

    fn release(&mut self, name: &str) {
        GgufFile::release(self, name);
    }

    fn mapped(&mut self, name: &str) -> Option<MappedSlice> {
        GgufFile::mapped(self, name)
    }
}

/// Tensors held in memory (the tiny test models); each can be taken once.
#[derive(Default)]
pub struct TensorMap(pub HashMap<String, QTensor>);

impl TensorSource for TensorMap {
    fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Hands the tensor's blocks over (each is read once).
    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError> {
        let tensor = self
            .0
            .remove(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_string()))?;
        Ok(StoredTensor::from_qtensor(&tensor)?)
    }
}

/// A weight matrix `(out_features, in_features)` in the chosen format.
#[derive(Clone, Debug)]
enum Matrix {
    Quantized(Quantized),
    Dense(Tensor),
    Both {
        quantized: Quantized,
        dense: Tensor,
    },
    /// A lookup table read by rows only, as stored (native kernels).
    Rows(Arc<StoredRows>),
}

impl Matrix {
    fn out_features(&self) -> Result<usize, EngineError> {
        Ok(match self {
            Matrix::Quantized(Quantized::Own(matrix))
            | Matrix::Both {
                quantized: Quantized::Own(matrix),
                ..
            } => matrix.out_features(),
            Matrix::Quantized(Quantized::Candle(qtensor))
            | Matrix::Both {
                quantized: Quantized::Candle(qtensor),
                ..
            } => qtensor.shape().dims2()?.0,
            Matrix::Dense(dense) => dense.dims2()?.0,
            Matrix::Rows(rows) => rows.dims().0,
        })
    }
}

/// Quantized blocks and the kernel that multiplies them: ours (`quant`) for the types it
/// covers, candle's for the rest (the K-quants).
#[derive(Clone, Debug)]
enum Quantized {
    Own(Arc<QuantMatrix>),
    Candle(Arc<QTensor>),
}

impl Quantized {
    /// Blocks as stored when a kernel reads them fast (ours copy them from the file straight
    /// into their own layout; off the CPU, candle's kernels cover every type), else requantized
    /// to Q8_0 (finer than the types it replaces, so the weights barely move).
    fn new(stored: &StoredTensor<'_>, backend: &Backend) -> Result<Self, EngineError> {
        let (out_features, in_features) = stored.dims2()?;
        let device = &backend.device;
        let native = native_layouts(backend);
        if native && QuantMatrix::supports_layout(stored.dtype(), in_features) {
            return Ok(Quantized::Own(Arc::new(QuantMatrix::from_bytes(
                stored.bytes(),
                stored.dtype(),
                out_features,
                in_features,
            )?)));
        }
        let qtensor = stored.to_qtensor(device)?;
        if !device.is_cpu() || has_fast_cpu_kernel(qtensor.dtype()) {
            return Ok(Quantized::Candle(Arc::new(qtensor)));
        }
        let requantized = QTensor::quantize(&qtensor.dequantize(device)?, GgmlDType::Q8_0)?;
        if native && QuantMatrix::supports(&requantized) {
            Ok(Quantized::Own(Arc::new(QuantMatrix::from_qtensor(
                &requantized,
            )?)))
        } else {
            Ok(Quantized::Candle(Arc::new(requantized)))
        }
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        match self {
            Quantized::Own(matrix) => Ok(matrix.forward(x)?),
            Quantized::Candle(qtensor) => {
                Ok(QMatMul::QTensor(qtensor.clone()).forward(&x.contiguous()?)?)
            }
        }
    }

    fn size_in_bytes(&self) -> usize {
        match self {
            Quantized::Own(matrix) => matrix.size_in_bytes(),
            Quantized::Candle(qtensor) => qtensor.storage_size_in_bytes(),
        }
    }
}

/// Whose kernels multiply a matrix ([`Linear::multiplied_by`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Multiplier {
    /// Our quantized kernels, on their own layouts of GGML's blocks.
    Ours,
    /// candle's quantized matmul (its SIMD: AVX2 on x86-64, NEON on aarch64; CUDA on a GPU).
    Candle,
    /// A dense matmul of float weights.
    Dense,
    /// None: a lookup table, read by rows.
    NotMultiplied,
}

/// One input several matrices multiply (q, k and v; gate and up): where they multiply dense
/// copies in another dtype (f16 on a GPU), the rows are cast once for all of them instead of
/// once per product — on a GPU a launch over every row each, 90 of a 4k-token prefill's casts
/// on SmolLM2.
pub(crate) struct SharedInput<'a> {
    x: &'a Tensor,
    cast: std::cell::RefCell<Option<Tensor>>,
}

impl<'a> SharedInput<'a> {
    pub(crate) fn new(x: &'a Tensor) -> Self {
        Self {
            x,
            cast: std::cell::RefCell::new(None),
        }
    }

    /// The rows, `(n_rows, in_features)`.
    pub(crate) fn rows(&self) -> &'a Tensor {
        self.x
    }

    /// The rows in `dtype`, cast at most once per dtype in a row.
    fn in_dtype(&self, dtype: DType) -> Result<Tensor, EngineError> {
        if self.x.dtype() == dtype {
            return Ok(self.x.clone());
        }
        let mut cast = self.cast.borrow_mut();
        match cast.as_ref() {
            Some(done) if done.dtype() == dtype => Ok(done.clone()),
            _ => {
                let done = self.x.to_dtype(dtype)?;
                *cast = Some(done.clone());
                Ok(done)
            }
        }
    }
}

/// `y = x W^T (+ b)` for `x` of shape `(n_rows, in_features)` in f32.
#[derive(Clone, Debug)]
pub struct Linear {
    weight: Matrix,
    bias: Option<Tensor>,
    out_features: usize,
}

impl Linear {
    /// Loads `name` (and `bias_name`, if given) onto the backend's device and holds it as
    /// `format` prescribes for `role`, for the backend's kernels.
    pub fn load(
        source: &mut dyn TensorSource,
        name: &str,
        bias_name: Option<&str>,
        role: MatrixRole,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        let device = &backend.device;
        let weight = Self::load_matrix(source, name, role, format, backend)?;
        let out_features = weight.out_features()?;
        let bias = bias_name
            .map(|bias_name| -> Result<Tensor, EngineError> {
                let bias = source.stored(bias_name)?.dequantize(device)?;
                if bias.dims1()? != out_features {
                    return Err(EngineError::InvalidWeights(format!(
                        "{bias_name} has {} entries for {out_features} outputs",
                        bias.dims1()?
                    )));
                }
                Ok(bias)
            })
            .transpose()?;
        Ok(Self {
            weight,
            bias,
            out_features,
        })
    }

    /// Matrix `name` from the source's layout cache, else built from the stored tensor (and
    /// handed to the cache when it is one of our layouts made from the stored blocks).
    fn load_matrix(
        source: &mut dyn TensorSource,
        name: &str,
        role: MatrixRole,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Matrix, EngineError> {
        match source.cached_layout(name) {
            Some(CachedLayout::Quant(matrix)) => {
                return Ok(Matrix::Quantized(Quantized::Own(matrix)));
            }
            Some(CachedLayout::Rows(rows)) => return Ok(Matrix::Rows(rows)),
            None => {}
        }
        let device = &backend.device;
        let in_place = (role == MatrixRole::Lookup)
            .then(|| source.mapped(name))
            .flatten();
        let keeps_pages = in_place.is_some();
        let stored = source.stored(name)?;
        let (stored_dtype, (_, in_features)) = (stored.dtype(), stored.dims2()?);
        let stored_dense = matches!(
            stored_dtype,
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16
        );
        let weight = match format.dense_dtype(role) {
            // Plain float tensors gain nothing from the quantized kernels.
            None if stored_dense => Matrix::Dense(stored.dequantize(device)?),
            // Lookups only read rows: kept as stored (in place where the file is mapped), and on
            // other devices as candle's blocks.
            None if role == MatrixRole::Lookup && native_layouts(backend) => {
                let (rows, columns) = stored.dims2()?;
                let table = match in_place {
                    Some(bytes) => StoredRows::in_place(bytes, stored_dtype, rows, columns)?,
                    None => StoredRows::copy_of(&stored)?,
                };
                Matrix::Rows(Arc::new(table))
            }
            None if role == MatrixRole::Lookup => {
                Matrix::Quantized(Quantized::Candle(Arc::new(stored.to_qtensor(device)?)))
            }
            None => Matrix::Quantized(Quantized::new(&stored, backend)?),
            Some(dtype) => {
                let dense = stored.dequantize(device)?.to_dtype(dtype)?;
                if format.keeps_both() && !stored_dense {
                    Matrix::Both {
                        quantized: Quantized::new(&stored, backend)?,
                        dense,
                    }
                } else {
                    Matrix::Dense(dense)
                }
            }
        };
        drop(stored);
        if !keeps_pages {
            source.release(name);
        }
        // Only layouts made from the stored blocks as they are (not requantized ones): the
        // cache checks its files by building some of them again that way.
        let built = match &weight {
            Matrix::Quantized(Quantized::Own(matrix))
                if QuantMatrix::supports_layout(stored_dtype, in_features) =>
            {
                Some(CachedLayout::Quant(matrix.clone()))
            }
            Matrix::Rows(rows) => Some(CachedLayout::Rows(rows.clone())),
            _ => None,
        };
        if let Some(layout) = built {
            source.built_layout(name, stored_dtype, layout);
        }
        Ok(weight)
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Whose kernels multiply this matrix by a few rows (a decode step's).
    pub fn multiplied_by(&self) -> Multiplier {
        match &self.weight {
            Matrix::Quantized(Quantized::Own(_)) | Matrix::Both { .. } => Multiplier::Ours,
            Matrix::Quantized(Quantized::Candle(_)) => Multiplier::Candle,
            Matrix::Dense(_) => Multiplier::Dense,
            Matrix::Rows(_) => Multiplier::NotMultiplied,
        }
    }

    /// `x`: `(n_rows, in_features)` f32 → `(n_rows, out_features)` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        self.forward_shared(&SharedInput::new(x))
    }

    /// [`Self::forward`] of an input other matrices multiply too.
    pub(crate) fn forward_shared(&self, input: &SharedInput<'_>) -> Result<Tensor, EngineError> {
        let x = input.x;
        let n_rows = x.dim(0)?;
        let y = match &self.weight {
            Matrix::Quantized(quantized) => quantized.forward(x)?,
            Matrix::Both { quantized, .. } if n_rows <= FEW_ROWS => quantized.forward(x)?,
            Matrix::Dense(dense) | Matrix::Both { dense, .. } => {
                dense_matmul(dense, &input.in_dtype(dense.dtype())?)?
            }
            Matrix::Rows(_) => {
                return Err(EngineError::InvalidInput(
                    "a lookup table is read by rows, never multiplied".to_string(),
                ));
            }
        };
        Ok(match &self.bias {
            Some(bias) => y.broadcast_add(bias)?,
            None => y,
        })
    }

    /// Rows `ids` of the matrix as f32 `(n_ids, in_features)`: the embedding lookup of a
    /// token-embedding table.
    pub fn rows(&self, ids: &Tensor) -> Result<Tensor, EngineError> {
        Ok(match &self.weight {
            Matrix::Dense(dense) | Matrix::Both { dense, .. } => {
                dense.index_select(ids, 0)?.to_dtype(DType::F32)?
            }
            Matrix::Quantized(Quantized::Candle(quantized)) => quantized.embedding(ids)?,
            Matrix::Quantized(Quantized::Own(matrix)) => {
                matrix.dequantize_rows(&ids.to_vec1::<u32>()?, ids.device())?
            }
            Matrix::Rows(rows) => rows.rows(&ids.to_vec1::<u32>()?, ids.device())?,
        })
    }

    /// Bytes of this matrix read in place from a mapped file (the layout cache, or the GGUF
    /// file for a lookup table).
    pub fn in_place_bytes(&self) -> usize {
        match &self.weight {
            Matrix::Quantized(Quantized::Own(matrix)) if matrix.is_mapped() => {
                matrix.size_in_bytes()
            }
            Matrix::Rows(rows) if rows.is_mapped() => rows.size_in_bytes(),
            _ => 0,
        }
    }

    /// Bytes held for this matrix (all copies) and its bias.
    pub fn size_in_bytes(&self) -> usize {
        let dense_bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        let weight = match &self.weight {
            Matrix::Quantized(quantized) => quantized.size_in_bytes(),
            Matrix::Dense(dense) => dense_bytes(dense),
            Matrix::Both { quantized, dense } => quantized.size_in_bytes() + dense_bytes(dense),
            Matrix::Rows(rows) => rows.size_in_bytes(),
        };
        weight + self.bias.as_ref().map_or(0, dense_bytes)
    }
}

/// RMSNorm over the last dimension: `x / rms(x) * weight`.
///
/// Gemma multiplies by `1 + weight`; llama.cpp's converter already added the 1 to every
/// `*norm.weight` it writes for Gemma 3 (`norm_shift`), so GGUF weights are used as they are.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn load(
        source: &mut dyn TensorSource,
        name: &str,
        expected_len: usize,
        eps: f64,
        device: &Device,
    ) -> Result<Self, EngineError> {
        let weight = source
            .stored(name)?
            .dequantize(device)?
            .to_dtype(DType::F32)?;
        if weight.dims1()? != expected_len {
            return Err(EngineError::InvalidWeights(format!(
                "{name} has {} entries, expected {expected_len}",
                weight.dims1()?
            )));
        }
        Ok(Self {
            weight,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        Ok(kernels::rms_norm(x, &self.weight, self.eps)?)
    }
}
