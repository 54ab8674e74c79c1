//! How generation fails. Its own module because the per-token state ([`super::step`]) and the
//! loop driving it ([`super::generate`]) both return it, and the loop depends on the state.

use crate::model::EngineError;
use crate::tokenizer::TokenizeError;

use super::sampling::SamplingError;

/// Why generation failed. Engine and tensor errors are boxed: they are large and rare, and a
/// small error keeps every `Result` of the loop small.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Engine(Box<EngineError>),
    /// A caller-supplied prefill
    /// ([`Generator::generate_after`](super::Generator::generate_after)) failed for a reason of
    /// its own.
    #[error("prefill failed: {0}")]
    Prefill(Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error("cannot decode the generated tokens: {0}")]
    Detokenize(#[from] TokenizeError),
    #[error("cannot read the logits: {0}")]
    Logits(Box<candle_core::Error>),
    #[error("invalid prompt: {0}")]
    InvalidPrompt(String),
}

impl From<EngineError> for GenerateError {
    fn from(error: EngineError) -> Self {
        GenerateError::Engine(Box::new(error))
    }
}

impl From<candle_core::Error> for GenerateError {
    fn from(error: candle_core::Error) -> Self {
        GenerateError::Logits(Box::new(error))
    }
}
