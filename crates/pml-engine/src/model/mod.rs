//! Our own forward passes for the supported families (Qwen2, Qwen3, Gemma 3, Llama, Phi-3) on candle
//! tensors:
//! explicit per-token positions, a position-based mask, a spliced KV cache, and a per-layer
//! step that runs any subset of tokens — what Prompt Cache, CacheBlend and HCache need and
//! stock model code does not allow.
//!
//! - [`config`]: hyper-parameters from GGUF metadata.
//! - [`weights`]: tensor sources and the weight format.
//! - [`rope_rows`]: Llama files' Q/K rows put back in the RoPE pairing every family uses.
//! - [`fused_rows`]: fused QKV and gate-up matrices (Phi-3) split into separate projections.
//! - `row_gather`: taking rows of stored blocks, which both of those do.
//! - [`transformer`]: RoPE, MLP, attention, block and [`Model`], top to bottom.
//! - [`batch`]: one token of each of several sequences in one pass (continuous batching).
//! - [`context`]: positions and slots of a call, options and output of a whole-model call.
//! - [`observer`]: the seam through which a caller watches a layer's attention.
//! - `tiny` (feature `tiny-models`): deterministic random models of every family for fast tests
//!   and the store benchmark.

pub mod batch;
pub mod config;
pub mod context;
pub mod fused_rows;
pub mod layout_cache;
mod layout_file;
pub mod observer;
mod rope;
pub mod rope_rows;
mod row_gather;
pub mod stored_rows;
#[cfg(feature = "tiny-models")]
pub mod tiny;
pub mod transformer;
pub mod weights;

pub use crate::device::KV_CACHE_DTYPE;
pub use batch::{BatchSlot, DecodeSlot};
pub use config::{Activation, Arch, LayerAttention, ModelConfig};
pub use context::{ForwardContext, ForwardOptions, ForwardOutput, LogitRows};
pub use observer::{AttentionObserver, AttentionView};
pub use transformer::{ACTIVATION_DTYPE, Model};
pub use weights::{
    FEW_ROWS, Linear, MatrixRole, Multiplier, RmsNorm, TensorMap, TensorSource, WeightFormat,
};

pub use crate::error::EngineError;

impl EngineError {
    fn metadata(key: &str, reason: impl std::fmt::Display) -> Self {
        EngineError::Metadata {
            key: key.to_string(),
            reason: reason.to_string(),
        }
    }
}
