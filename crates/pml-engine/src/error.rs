//! The engine's errors: their own module, below the kernels, the KV cache and the model, so that
//! each of them can fail with them without depending on another.

use std::path::PathBuf;

use pml_kernels::KernelError;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
    /// Boxed: GGUF errors carry paths and names, and every result of the engine pays for the
    /// largest variant.
    #[error(transparent)]
    Gguf(Box<GgufError>),
    #[error("architecture `{0}` is not supported (supported: llama, qwen2, qwen3, gemma3, phi3)")]
    UnsupportedArch(String),
    #[error("GGUF metadata lacks `{0}`")]
    MissingMetadata(String),
    #[error("GGUF metadata `{key}` is unusable: {reason}")]
    Metadata { key: String, reason: String },
    #[error("tensor `{0}` is missing")]
    MissingTensor(String),
    #[error("invalid weights: {0}")]
    InvalidWeights(String),
    #[error("invalid model configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

impl From<GgufError> for EngineError {
    fn from(error: GgufError) -> Self {
        EngineError::Gguf(Box::new(error))
    }
}

/// A kernel's refusal as the engine's own error, variant for variant.
impl From<KernelError> for EngineError {
    fn from(error: KernelError) -> Self {
        match error {
            KernelError::Tensor(error) => EngineError::Tensor(error),
            KernelError::InvalidWeights(reason) => EngineError::InvalidWeights(reason),
            KernelError::InvalidInput(reason) => EngineError::InvalidInput(reason),
        }
    }
}

/// Why a cache operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum KvCacheError {
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("layer {layer_idx} out of range: the cache has {n_layers} layers")]
    LayerOutOfRange { layer_idx: usize, n_layers: usize },
    #[error("slot {slot} out of range: the layer holds {len} slots")]
    SlotOutOfRange { slot: usize, len: usize },
    #[error(
        "slot {slot} is neither an existing slot nor the next free one ({next_free}); new slots \
         must be appended in order"
    )]
    SlotNotContiguous { slot: usize, next_free: usize },
    #[error("slot {slot} is written twice in one call")]
    DuplicateSlot { slot: usize },
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error("layers hold different slots ({0}); finish the layer-by-layer pass first")]
    LayersDisagree(String),
    /// The cache was spliced for queries at or after a position, and a sliding-window layer
    /// left out the rows none of them can see (see `KvCache::from_blocks_for`).
    #[error(
        "slot {slot} of layer {layer_idx} is not held: this cache was spliced for queries at \
         position {horizon} or later, and the layer's sliding window hides slots below \
         {first_held} from all of them"
    )]
    NotHeld {
        slot: usize,
        layer_idx: usize,
        first_held: usize,
        horizon: u32,
    },
    #[error(
        "a row at position {position} written to layer {layer_idx}, whose cache was spliced for \
         queries at position {horizon} or later: it would attend rows the splice left out"
    )]
    BeforeHorizon {
        position: u32,
        layer_idx: usize,
        horizon: u32,
    },
}

/// A kernel's refusal under a cache operation: the kernels the cache calls only join and read
/// rows, so anything but a tensor error is a shape the cache handed them.
impl From<KernelError> for KvCacheError {
    fn from(error: KernelError) -> Self {
        match error {
            KernelError::Tensor(error) => KvCacheError::Tensor(error),
            KernelError::InvalidWeights(reason) | KernelError::InvalidInput(reason) => {
                KvCacheError::Shape(reason)
            }
        }
    }
}

/// Why a GGUF file or one of its entries could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    #[error("{path} is not a readable GGUF file: {source}")]
    Parse {
        path: PathBuf,
        source: Box<candle_core::Error>,
    },

    #[error("GGUF metadata has no key `{key}`")]
    MissingKey { key: String },

    #[error("GGUF metadata `{key}` is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("GGUF file has no tensor `{name}`")]
    MissingTensor { name: String },

    #[error("cannot load tensor `{name}` from {path}: {source}")]
    Tensor {
        name: String,
        path: PathBuf,
        source: Box<candle_core::Error>,
    },
}
