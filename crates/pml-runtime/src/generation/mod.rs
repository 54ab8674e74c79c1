//! Text generation: sampling the next token ([`sampling`]), incremental detokenization
//! ([`detokenizer`]), stop strings ([`stop`]), and the prefill-then-decode loop that streams text
//! and measures time to first token ([`generate`]).

pub mod detokenizer;
pub mod generate;
pub mod sampling;
pub mod stop;
#[cfg(test)]
mod test_tokenizer;

pub use detokenizer::IncrementalDetokenizer;
pub use generate::{
    FinishReason, GenerateError, Generation, GenerationTimings, Generator, PromptInput,
};
pub use sampling::{Sampler, SamplingError, SamplingParams};
pub use stop::{StopScan, StopStringMatcher};
