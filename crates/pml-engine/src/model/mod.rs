//! Our own forward passes for the supported families (Qwen2, Gemma 3) on candle tensors:
//! explicit per-token positions, a position-based mask, a spliced KV cache, and a per-layer
//! step that runs any subset of tokens — what Prompt Cache, CacheBlend and HCache need and
//! stock model code does not allow.
//!
//! - [`config`]: hyper-parameters from GGUF metadata.
//! - [`weights`]: tensor sources and the weight format.
//! - [`transformer`]: RoPE, MLP, attention, block and [`Model`], top to bottom.
//! - [`batch`]: one token of each of several sequences in one pass (continuous batching).
//! - [`context`]: positions and slots of a call, options and output of a whole-model call.
//! - [`tiny`]: deterministic random models of both families for fast tests.

pub mod batch;
pub mod config;
pub mod context;
pub mod tiny;
pub mod transformer;
pub mod weights;

pub use batch::DecodeSlot;
pub use config::{Activation, Arch, LayerAttention, ModelConfig};
pub use context::{ForwardContext, ForwardOptions, ForwardOutput, LogitRows, MassWeighting};
pub use transformer::{ACTIVATION_DTYPE, Model};
pub use weights::{FEW_ROWS, Linear, MatrixRole, RmsNorm, TensorMap, TensorSource, WeightFormat};

use crate::gguf::GgufError;
use crate::kv_cache::KvCacheError;

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
    #[error("architecture `{0}` is not supported (supported: qwen2, gemma3)")]
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

impl EngineError {
    fn metadata(key: &str, reason: impl std::fmt::Display) -> Self {
        EngineError::Metadata {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }
}
