//! Deterministic stand-ins for a model's tokenizer, for tests and benchmarks of the compiler and
//! its callers, which need token counts but no model.

use crate::tokenizer::{TokenizeError, Tokenizer};

/// One token per whitespace-separated word; every word is token 1. Enough for argument-length
/// checks, whose only question is how many tokens a text takes.
pub struct WordTokenizer;

impl Tokenizer for WordTokenizer {
    fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok(text.split_whitespace().map(|_| 1).collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        Ok(vec!["word"; ids.len()].join(" "))
    }

    fn bos_token(&self) -> Option<u32> {
        None
    }

    fn eos_tokens(&self) -> Vec<u32> {
        Vec::new()
    }

    fn placeholder_token(&self) -> u32 {
        0
    }

    fn vocab_size(&self) -> usize {
        2
    }
}
