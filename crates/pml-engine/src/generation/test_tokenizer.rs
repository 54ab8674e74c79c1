//! A tokenizer for tests: each token is a fixed byte string, so tests can split characters and
//! words across tokens exactly where they want. Decoding is lossy, like byte-level BPE decoders.

use crate::tokenizer::{TokenizeError, Tokenizer};

pub struct ByteTokenizer {
    token_bytes: Vec<Vec<u8>>,
    eos_tokens: Vec<u32>,
    strip_leading_space: bool,
}

impl ByteTokenizer {
    pub fn new(token_bytes: &[&[u8]]) -> Self {
        ByteTokenizer {
            token_bytes: token_bytes.iter().map(|bytes| bytes.to_vec()).collect(),
            eos_tokens: Vec::new(),
            strip_leading_space: false,
        }
    }

    /// Drops the space that starts a decoded sequence, as SentencePiece decoders do.
    pub fn stripping_leading_space(mut self) -> Self {
        self.strip_leading_space = true;
        self
    }

    pub fn with_eos_tokens(mut self, eos_tokens: &[u32]) -> Self {
        self.eos_tokens = eos_tokens.to_vec();
        self
    }
}

/// One ASCII letter per id of the tiny models' 256-token vocabulary, so every generated
/// sequence has readable text for stop strings.
pub fn letter_tokenizer() -> ByteTokenizer {
    let letters: Vec<[u8; 1]> = (0..256u32).map(|id| [b'a' + (id % 26) as u8]).collect();
    let token_bytes: Vec<&[u8]> = letters.iter().map(|letter| letter.as_slice()).collect();
    ByteTokenizer::new(&token_bytes)
}

/// The tiny seeded Qwen2 the generation tests decode with.
pub fn tiny_model() -> crate::model::Model {
    crate::model::tiny::random_model(
        crate::model::Arch::Qwen2,
        42,
        crate::model::WeightFormat::default(),
        &candle_core::Device::Cpu,
    )
    .expect("tiny model")
}

impl Tokenizer for ByteTokenizer {
    /// Greedy longest match; enough for tests that build their vocabulary to fit.
    fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        let mut rest = text.as_bytes();
        let mut ids = Vec::new();
        while !rest.is_empty() {
            let (id, bytes) = self
                .token_bytes
                .iter()
                .enumerate()
                .filter(|(_, bytes)| !bytes.is_empty() && rest.starts_with(bytes))
                .max_by_key(|(_, bytes)| bytes.len())
                .ok_or_else(|| TokenizeError(format!("no token for {rest:?}")))?;
            ids.push(id as u32);
            rest = &rest[bytes.len()..];
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let token = self
                .token_bytes
                .get(id as usize)
                .ok_or_else(|| TokenizeError(format!("unknown token {id}")))?;
            bytes.extend_from_slice(token);
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match text.strip_prefix(' ') {
            Some(stripped) if self.strip_leading_space => Ok(stripped.to_owned()),
            _ => Ok(text),
        }
    }

    fn bos_token(&self) -> Option<u32> {
        None
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.eos_tokens.clone()
    }

    fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    fn token_bytes(&self, id: u32) -> Option<crate::tokenizer::TokenBytes> {
        self.token_bytes
            .get(id as usize)
            .map(|bytes| crate::tokenizer::TokenBytes::Text(bytes.clone()))
    }
}
