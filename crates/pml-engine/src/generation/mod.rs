//! Text generation: sampling the next token ([`sampling`]), incremental detokenization
//! ([`detokenizer`]), stop strings ([`stop`]), and the prefill-then-decode loop that streams text
//! and measures time to first token ([`generate`]), drafting tokens ahead of the model
//! ([`speculative`]), built on one sequence's per-token state
//! ([`step`]), which a server's batched scheduler drives as well.

pub mod detokenizer;
mod error;
pub mod generate;
mod logits;
pub mod sampling;
pub mod speculative;
pub mod step;
pub mod stop;
#[cfg(test)]
mod test_tokenizer;

pub use detokenizer::IncrementalDetokenizer;
pub use error::{GenerateError, SamplingError};
pub use generate::{Generation, GenerationTimings, Generator, PromptInput};
pub use logits::logits_to_vec;
pub use sampling::{Sampler, SamplingParams};
pub use speculative::{Speculation, SpeculationStats};
pub use step::{DecodeState, DecodeStep, FinishReason, Verified};
pub use stop::{StopScan, StopStringMatcher};
