//! What the engine needs of a tokenizer: text to ids and back, and the special tokens that start a
//! sequence and end generation. [`super::GgufTokenizer`] implements it from a model's GGUF; tests
//! use small deterministic tokenizers. Layers above the engine that need more of a tokenizer (PML's
//! placeholder token) wrap one of these.

use std::fmt;

use super::TokenBytes;

/// Why a text could not be tokenized, or ids could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeError(pub String);

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tokenizer error: {}", self.0)
    }
}

impl std::error::Error for TokenizeError {}

/// A model's tokenizer as the engine uses it.
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`, with no BOS/EOS added. Control-token strings in `text` (such as
    /// `<|im_start|>`) become control tokens only when `allow_special` is true, as for chat-template
    /// text; user text is encoded with `allow_special = false` so it cannot forge control tokens.
    fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TokenizeError>;

    /// Text of `ids`; control tokens are rendered as their strings.
    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError>;

    /// Number of tokens `text` takes (plain text, no special tokens).
    fn count_tokens(&self, text: &str) -> Result<usize, TokenizeError> {
        Ok(self.encode(text, false)?.len())
    }

    /// The token placed first in every sequence, if the model uses one.
    fn bos_token(&self) -> Option<u32>;

    /// Tokens that end generation (EOS and end-of-turn tokens).
    fn eos_tokens(&self) -> Vec<u32>;

    fn vocab_size(&self) -> usize;

    /// What token `id` decodes to, byte for byte (a constrained decoder matches grammars over
    /// bytes); `None` for an id outside the vocabulary.
    fn token_bytes(&self, id: u32) -> Option<TokenBytes>;

    /// The most bytes of text one token can cover (at least 1): a text of `n` bytes takes at
    /// least `n / longest_token_bytes()` tokens, so one longer than a context of `c` tokens times
    /// this can never fit in it, whatever its content. By default the longest of
    /// [`Self::token_bytes`] over the vocabulary, computed on each call.
    fn longest_token_bytes(&self) -> usize {
        (0..self.vocab_size())
            .filter_map(|id| u32::try_from(id).ok())
            .filter_map(|id| self.token_bytes(id))
            .map(|bytes| bytes.len())
            .max()
            .unwrap_or(0)
            .max(1)
    }
}
