//! Why a kernel refused its input: the engine maps these onto its own errors.

/// Why a kernel could not run.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("invalid weights: {0}")]
    InvalidWeights(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
}
