//! [`KvBlock`]: K and V of some slots, every layer, with their positions — held either as
//! tensors (computed here) or as rows inside a shared byte buffer (a memory-mapped state file),
//! which [`super::KvCache::from_blocks`] converts straight into the cache without first copying
//! them into tensors of their own.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device, Tensor};

use super::KvCacheError;

/// Bytes shared by whoever reads rows out of them: a file map or a buffer read from a network.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// K/V of some slots, all layers, with their positions: what a module store keeps and splices.
#[derive(Clone, Debug)]
pub struct KvBlock {
    rows: BlockRows,
    positions: Vec<u32>,
    /// Where this block's rows lie in a larger block whose buffers it shares ([`Self::view`]).
    within: Option<Within>,
}

/// Rows `start..` of `span`, which this block's tensors are views of.
#[derive(Clone, Debug)]
pub(super) struct Within {
    pub(super) span: Arc<KvBlock>,
    pub(super) start: usize,
}

#[derive(Clone, Debug)]
enum BlockRows {
    /// Per layer `(keys, values)`, each `(n_slots, kv_heads, head_dim)`, K after RoPE.
    Tensors(Vec<(Tensor, Tensor)>),
    Mapped(MappedRows),
}

/// Every layer's K and V as little-endian rows of one dtype inside shared bytes.
#[derive(Clone)]
struct MappedRows {
    bytes: SharedBytes,
    dtype: DType,
    row_shape: (usize, usize),
    /// Per layer, the byte ranges of K and of V.
    ranges: Vec<(Range<usize>, Range<usize>)>,
    /// The tensors, built on first request by a caller that needs tensors (not the splice).
    tensors: OnceLock<Vec<(Tensor, Tensor)>>,
}

impl fmt::Debug for MappedRows {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("MappedRows")
            .field("dtype", &self.dtype)
            .field("row_shape", &self.row_shape)
            .field("ranges", &self.ranges)
            .finish_non_exhaustive()
    }
}

/// Where one layer's K or V rows come from, for the splice.
pub(super) enum RowSource<'a> {
    Tensor(&'a Tensor),
    /// Little-endian values of `dtype`.
    Bytes(&'a [u8], DType),
}

impl RowSource<'_> {
    /// The rows as a tensor on `device` (the path without a direct conversion).
    pub(super) fn to_tensor(
        &self,
        shape: (usize, usize, usize),
        device: &Device,
    ) -> Result<Tensor, KvCacheError> {
        Ok(match self {
            Self::Tensor(tensor) => (*tensor).clone(),
            Self::Bytes(bytes, dtype) => {
                Tensor::from_raw_buffer(bytes, *dtype, &[shape.0, shape.1, shape.2], device)?
            }
        })
    }
}

impl KvBlock {
    /// Checks that every layer has one row per position and the same row shape (dtypes may
    /// differ: a pipelined splice re-rotates keys in f32 beside values still as stored).
    pub fn new(layers: Vec<(Tensor, Tensor)>, positions: Vec<u32>) -> Result<Self, KvCacheError> {
        let mut row_shape = None;
        for (layer_idx, (keys, values)) in layers.iter().enumerate() {
            let (n_keys, kv_heads, head_dim) = keys.dims3()?;
            if keys.dims() != values.dims() || n_keys != positions.len() {
                return Err(KvCacheError::Shape(format!(
                    "layer {layer_idx}: keys {:?}, values {:?}, {} positions",
                    keys.dims(),
                    values.dims(),
                    positions.len()
                )));
            }
            if *row_shape.get_or_insert((kv_heads, head_dim)) != (kv_heads, head_dim) {
                return Err(KvCacheError::Shape(format!(
                    "layer {layer_idx} has rows of {kv_heads}x{head_dim}, layer 0 differs"
                )));
            }
        }
        Ok(Self {
            rows: BlockRows::Tensors(layers),
            positions,
            within: None,
        })
    }

    /// Rows `rows` of `span` as a block of its own that shares `span`'s buffers (views: nothing
    /// is copied). Blocks cut from one span are spliced back as one run of its rows
    /// ([`super::KvCache::from_shared_blocks`]), so a prefix cache can keep and evict small
    /// blocks while a cache reads their span whole.
    pub fn view(span: &Arc<KvBlock>, rows: Range<usize>) -> Result<Self, KvCacheError> {
        if rows.start > rows.end || rows.end > span.len() {
            return Err(KvCacheError::Shape(format!(
                "rows {rows:?} of a block of {}",
                span.len()
            )));
        }
        let layers = span
            .layers()?
            .iter()
            .map(|(keys, values)| {
                Ok((
                    keys.narrow(0, rows.start, rows.len())?,
                    values.narrow(0, rows.start, rows.len())?,
                ))
            })
            .collect::<Result<Vec<_>, KvCacheError>>()?;
        Ok(Self {
            rows: BlockRows::Tensors(layers),
            positions: span.positions[rows.clone()].to_vec(),
            within: Some(Within {
                span: Arc::clone(span),
                start: rows.start,
            }),
        })
    }

    /// Whether the rows are held as tensors (computed here, or read and kept in memory) rather
    /// than as bytes of a file map: only those are read in place by caches, since tensors of
    /// mapped rows would be a second copy of them.
    pub fn holds_tensors(&self) -> bool {
        matches!(self.rows, BlockRows::Tensors(_))
    }

    /// The span this block is a view of, and where in it ([`Self::view`]).
    pub(super) fn within(&self) -> Option<&Within> {
        self.within.as_ref()
    }

    /// A block whose layer `i` has its K rows at `ranges[i].0` and its V rows at `ranges[i].1`
    /// of `bytes`, little-endian `dtype` values of shape `(positions.len(), kv_heads,
    /// head_dim)`: nothing is copied until the block is spliced (or its tensors are asked for).
    pub fn from_bytes(
        bytes: SharedBytes,
        dtype: DType,
        (kv_heads, head_dim): (usize, usize),
        ranges: Vec<(Range<usize>, Range<usize>)>,
        positions: Vec<u32>,
    ) -> Result<Self, KvCacheError> {
        if !matches!(dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(KvCacheError::Shape(format!(
                "rows of {dtype:?}: K and V are f16, bf16 or f32"
            )));
        }
        let expected = positions.len() * kv_heads * head_dim * dtype.size_in_bytes();
        let available = (*bytes).as_ref().len();
        for (layer_idx, (keys, values)) in ranges.iter().enumerate() {
            for range in [keys, values] {
                if range.len() != expected || range.end > available || range.start > range.end {
                    return Err(KvCacheError::Shape(format!(
                        "layer {layer_idx}: bytes {range:?} of {available} for {} rows of \
                         {kv_heads}x{head_dim} {dtype:?} ({expected} bytes)",
                        positions.len()
                    )));
                }
            }
        }
        Ok(Self {
            rows: BlockRows::Mapped(MappedRows {
                bytes,
                dtype,
                row_shape: (kv_heads, head_dim),
                ranges,
                tensors: OnceLock::new(),
            }),
            positions,
            within: None,
        })
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn n_layers(&self) -> usize {
        match &self.rows {
            BlockRows::Tensors(layers) => layers.len(),
            BlockRows::Mapped(mapped) => mapped.ranges.len(),
        }
    }

    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// The dtype all of K and V are held in; `None` for a block of no layers or of several
    /// dtypes.
    pub fn dtype(&self) -> Option<DType> {
        match &self.rows {
            BlockRows::Tensors(layers) => {
                let first = layers.first()?.0.dtype();
                layers
                    .iter()
                    .all(|(keys, values)| keys.dtype() == first && values.dtype() == first)
                    .then_some(first)
            }
            BlockRows::Mapped(mapped) => (!mapped.ranges.is_empty()).then_some(mapped.dtype),
        }
    }

    /// `(kv_heads, head_dim)` of every row, `None` for a block of no layers.
    pub fn row_shape(&self) -> Option<(usize, usize)> {
        match &self.rows {
            BlockRows::Tensors(layers) => layers
                .first()
                .and_then(|(keys, _)| keys.dims3().ok())
                .map(|(_, heads, dim)| (heads, dim)),
            BlockRows::Mapped(mapped) => (!mapped.ranges.is_empty()).then_some(mapped.row_shape),
        }
    }

    /// `(keys, values)` of one layer, each `(n_slots, kv_heads, head_dim)`.
    pub fn layer(&self, layer_idx: usize) -> Result<&(Tensor, Tensor), KvCacheError> {
        let n_layers = self.n_layers();
        self.layers()?
            .get(layer_idx)
            .ok_or(KvCacheError::LayerOutOfRange {
                layer_idx,
                n_layers,
            })
    }

    /// Every layer's `(keys, values)`; a block on shared bytes builds its tensors (one copy) on
    /// the first call.
    pub fn layers(&self) -> Result<&[(Tensor, Tensor)], KvCacheError> {
        match &self.rows {
            BlockRows::Tensors(layers) => Ok(layers),
            BlockRows::Mapped(mapped) => {
                if let Some(tensors) = mapped.tensors.get() {
                    return Ok(tensors);
                }
                let shape = (self.len(), mapped.row_shape.0, mapped.row_shape.1);
                let tensors = (0..mapped.ranges.len())
                    .map(|layer_idx| {
                        let (keys, values) = mapped.sources(layer_idx).ok_or_else(|| {
                            KvCacheError::Shape(format!("layer {layer_idx} past the bytes"))
                        })?;
                        Ok((
                            keys.to_tensor(shape, &Device::Cpu)?,
                            values.to_tensor(shape, &Device::Cpu)?,
                        ))
                    })
                    .collect::<Result<Vec<_>, KvCacheError>>()?;
                Ok(mapped.tensors.get_or_init(|| tensors))
            }
        }
    }

    /// Where layer `layer_idx`'s K and V rows are, for the splice.
    pub(super) fn sources(&self, layer_idx: usize) -> Option<(RowSource<'_>, RowSource<'_>)> {
        match &self.rows {
            BlockRows::Tensors(layers) => layers
                .get(layer_idx)
                .map(|(keys, values)| (RowSource::Tensor(keys), RowSource::Tensor(values))),
            BlockRows::Mapped(mapped) => mapped.sources(layer_idx),
        }
    }

    /// Bytes of K and V together.
    pub fn size_in_bytes(&self) -> usize {
        match &self.rows {
            BlockRows::Tensors(layers) => layers
                .iter()
                .map(|(k, v)| {
                    k.elem_count() * k.dtype().size_in_bytes()
                        + v.elem_count() * v.dtype().size_in_bytes()
                })
                .sum(),
            BlockRows::Mapped(mapped) => mapped
                .ranges
                .iter()
                .map(|(keys, values)| keys.len() + values.len())
                .sum(),
        }
    }
}

impl MappedRows {
    /// Ranges were checked against the bytes when the block was made.
    fn sources(&self, layer_idx: usize) -> Option<(RowSource<'_>, RowSource<'_>)> {
        let bytes = (*self.bytes).as_ref();
        let (keys, values) = self.ranges.get(layer_idx)?;
        Some((
            RowSource::Bytes(bytes.get(keys.clone())?, self.dtype),
            RowSource::Bytes(bytes.get(values.clone())?, self.dtype),
        ))
    }
}
