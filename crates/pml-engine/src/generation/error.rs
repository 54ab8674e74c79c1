//! How generation fails, the sampler's own failures included. Its own module, depending on no
//! sibling, because the per-token state ([`super::step`]), the loop driving it
//! ([`super::generate`]), the sampler and the drafters all return these.

use crate::model::EngineError;
use crate::tokenizer::TokenizeError;

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

/// Why no token could be chosen.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("invalid sampling parameters: {0}")]
    InvalidParams(String),
    #[error("the logits vector is empty")]
    EmptyLogits,
    /// A NaN or +inf logit means the forward pass went wrong; sampling from it would hide that.
    #[error("logit of token {token_id} is {value}, not a finite number")]
    NonFiniteLogit { token_id: usize, value: f32 },
    #[error("token {token_id} in the repetition window is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange { token_id: u32, vocab_size: usize },
    /// Every token was masked out (-inf): a constraint allows nothing next.
    #[error("every token is masked out: nothing may come next")]
    EverythingMasked,
}
