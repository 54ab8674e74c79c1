//! The tokenizer description stored in GGUF metadata (`tokenizer.ggml.*`), read into plain Rust
//! values so that tokenizer builders (and their tests) need no file.

use crate::gguf::{GgufError, GgufFile};

/// Kind of a vocabulary entry, as llama.cpp numbers them in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    /// Markup such as `<|im_start|>` or `<start_of_turn>`: only chat templates may produce it.
    Control,
    /// Text the tokenizer always keeps whole (Gemma's runs of spaces and newlines, `<tool_call>`).
    UserDefined,
    Unused,
    /// `<0xNN>` byte-fallback pieces.
    Byte,
}

impl TokenType {
    /// The type numbered `code`; unknown codes count as normal text, as in llama.cpp.
    pub fn from_code(code: i64) -> Self {
        match code {
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Normal,
        }
    }
}

/// Spellings llama.cpp's vocabulary loader turns into control tokens (its end-of-turn,
/// end-of-generation and fill-in-the-middle lists in `llama-vocab.cpp`).
const LLAMA_CPP_FORCED_CONTROL: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<\u{ff5c}fim\u{2581}begin\u{ff5c}>",
    "<PRE>",
    "\u{2581}<PRE>",
    "<|code_prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<\u{ff5c}fim\u{2581}hole\u{ff5c}>",
    "<SUF>",
    "\u{2581}<SUF>",
    "<|code_suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<\u{ff5c}fim\u{2581}end\u{ff5c}>",
    "<MID>",
    "\u{2581}<MID>",
    "<|code_middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<|file_sep|>",
    "<fim-sep>",
    "<fim_sep>",
];

/// Everything a tokenizer builder needs from the GGUF metadata.
#[derive(Clone, Debug, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE) or `llama` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: name of the pre-tokenizer (`qwen2`, `default`, ...).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Vec<TokenType>,
    /// SentencePiece scores (higher merges first); absent for byte-level BPE.
    pub scores: Option<Vec<f32>>,
    /// Byte-level BPE merges, `"left right"`, highest priority first.
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    pub add_space_prefix: Option<bool>,
}

impl GgufVocab {
    /// Reads the tokenizer metadata of `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, GgufError> {
        let tokens: Vec<String> = gguf
            .get_str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let token_types =
            match gguf.optional("tokenizer.ggml.token_type", GgufFile::get_i64_array)? {
                Some(codes) => codes.into_iter().map(TokenType::from_code).collect(),
                None => vec![TokenType::Normal; tokens.len()],
            };
        let merges = gguf
            .optional("tokenizer.ggml.merges", GgufFile::get_str_array)?
            .map(|merges| merges.into_iter().map(str::to_owned).collect());
        let token_id = |key: &str| -> Result<Option<u32>, GgufError> {
            match gguf.optional(key, GgufFile::get_u64)? {
                Some(id) => u32::try_from(id)
                    .map(Some)
                    .map_err(|_| GgufError::WrongType {
                        key: key.to_owned(),
                        expected: "a token id",
                        found: id.to_string(),
                    }),
                None => Ok(None),
            }
        };
        Ok(Self {
            model: gguf.get_str("tokenizer.ggml.model")?.to_owned(),
            pre: gguf
                .optional("tokenizer.ggml.pre", GgufFile::get_str)?
                .map(str::to_owned),
            scores: gguf.optional("tokenizer.ggml.scores", GgufFile::get_f32_array)?,
            merges,
            bos_id: token_id("tokenizer.ggml.bos_token_id")?,
            eos_id: token_id("tokenizer.ggml.eos_token_id")?,
            eot_id: token_id("tokenizer.ggml.eot_token_id")?,
            pad_id: token_id("tokenizer.ggml.padding_token_id")?,
            unk_id: token_id("tokenizer.ggml.unknown_token_id")?,
            add_bos_token: gguf.optional("tokenizer.ggml.add_bos_token", GgufFile::get_bool)?,
            add_space_prefix: gguf
                .optional("tokenizer.ggml.add_space_prefix", GgufFile::get_bool)?,
            tokens,
            token_types,
        })
    }

    /// Type of token `id` (normal when the file gives none).
    pub fn token_type(&self, id: usize) -> TokenType {
        self.token_types
            .get(id)
            .copied()
            .unwrap_or(TokenType::Normal)
    }

    /// A copy in which the spellings llama.cpp always treats as control tokens are control tokens.
    ///
    /// llama.cpp (our reference) forces end-of-generation and fill-in-the-middle spellings to the
    /// control type whatever the file says, so that, for instance, Gemma-3's user-defined `</s>` is
    /// not kept whole in plain text. Matching that keeps token ids identical to llama.cpp's.
    pub fn with_llama_cpp_control_overrides(self) -> Self {
        let mut vocab = self;
        for (token, token_type) in vocab.tokens.iter().zip(vocab.token_types.iter_mut()) {
            if matches!(token_type, TokenType::Normal | TokenType::UserDefined)
                && LLAMA_CPP_FORCED_CONTROL.contains(&token.as_str())
            {
                *token_type = TokenType::Control;
            }
        }
        vocab
    }

    /// Id of the token spelled exactly `text`, if any.
    pub fn find(&self, text: &str) -> Option<u32> {
        self.tokens
            .iter()
            .position(|token| token == text)
            .and_then(|index| u32::try_from(index).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_overrides_turn_end_of_turn_spellings_into_control_tokens() {
        let vocab = GgufVocab {
            tokens: ["</s>", "<eos>", "abc", "<|im_end|>"]
                .map(str::to_owned)
                .to_vec(),
            token_types: vec![
                TokenType::UserDefined,
                TokenType::Control,
                TokenType::Normal,
                TokenType::Byte,
            ],
            ..GgufVocab::default()
        };
        let overridden = vocab.clone().with_llama_cpp_control_overrides();
        assert_eq!(
            overridden.token_types,
            [
                TokenType::Control,
                TokenType::Control,
                TokenType::Normal,
                TokenType::Byte
            ]
        );
        assert_eq!(overridden.find("abc"), Some(2));
        assert_eq!(TokenType::from_code(6), TokenType::Byte);
        assert_eq!(TokenType::from_code(42), TokenType::Normal);
    }
}
