//! Tokenizers rebuilt from GGUF metadata: byte-level BPE ([`byte_bpe`], split by [`pre_split`]) and
//! SentencePiece BPE with byte fallback ([`spm_encoder`] encodes by score as llama.cpp does,
//! [`sentencepiece`] decodes), wrapped in [`GgufTokenizer`], which implements the engine's
//! [`Tokenizer`] with llama.cpp's rules for special tokens: user-defined tokens are always kept
//! whole, control tokens only in text that may contain them (chat-template text).

pub mod byte_bpe;
pub mod control;
mod interface;
pub mod pre_split;
pub mod sentencepiece;
pub mod spm_encoder;
pub mod token_bytes;
pub mod vocab;

use std::collections::HashSet;

use tokenizers::{AddedToken, Model as _, Tokenizer as HfTokenizer};

use crate::gguf::{GgufError, GgufFile};
use control::{ControlTokens, Fragment};
pub use interface::{TokenizeError, Tokenizer};
use sentencepiece::SPACE_MARK;
use spm_encoder::SpmEncoder;
pub use token_bytes::TokenBytes;
pub use vocab::{GgufVocab, TokenType};

/// Why a tokenizer could not be built from a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error("unsupported tokenizer: {0}")]
    Unsupported(String),

    #[error("cannot build the tokenizer: {0}")]
    Build(String),
}

/// Spellings of end-of-turn tokens that end generation besides the declared EOS.
const END_OF_TURN_SPELLINGS: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<eos>",
    "<|eot_id|>",
    "<|end|>",
];

/// A model's tokenizer, built from its GGUF metadata.
#[derive(Clone)]
pub struct GgufTokenizer {
    /// Never parses control tokens (they are split out by `control` first when allowed).
    inner: HfTokenizer,
    control: ControlTokens,
    /// SentencePiece vocabularies encode text through this, with their user-defined tokens
    /// split out first; byte-level BPE ones through `inner`.
    spm: Option<(SpmEncoder, ControlTokens)>,
    bos: Option<u32>,
    eos: Vec<u32>,
    pad: u32,
    vocab_size: usize,
    add_space_prefix: bool,
    /// What each token decodes to, byte for byte (for constrained decoding).
    token_bytes: Vec<TokenBytes>,
    /// The most bytes of text one token covers ([`token_bytes::longest_token_bytes`]).
    longest_token_bytes: usize,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .finish_non_exhaustive()
    }
}

impl GgufTokenizer {
    /// The tokenizer of the model in `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_vocab(GgufVocab::from_gguf(gguf)?)
    }

    /// The tokenizer described by `vocab`, with llama.cpp's control-token overrides applied.
    pub fn from_vocab(vocab: GgufVocab) -> Result<Self, TokenizerError> {
        let vocab = &vocab.with_llama_cpp_control_overrides();
        if vocab.token_types.len() != vocab.tokens.len() {
            return Err(TokenizerError::Build(format!(
                "{} token types for {} tokens",
                vocab.token_types.len(),
                vocab.tokens.len()
            )));
        }
        // llama.cpp's defaults when the file does not say: SentencePiece adds BOS and a space
        // before the text, byte-level BPE neither.
        // Each token's bytes (for decoding) are independent of the model built beside them: a
        // second worker takes them (Qwen's 151k tokens: ~35 ms of a ~300 ms build).
        let (built, token_bytes) = rayon::join(
            || match vocab.model.as_str() {
                "gpt2" => byte_bpe::build(vocab).map(|inner| (inner, false, false)),
                "llama" => sentencepiece::build(vocab).map(|inner| (inner, true, true)),
                other => Err(TokenizerError::Unsupported(format!(
                    "tokenizer.ggml.model = {other:?}"
                ))),
            },
            || token_bytes::vocab_token_bytes(vocab),
        );
        let (mut inner, default_add_bos, default_space_prefix) = built?;
        register_added_tokens(&mut inner, vocab)?;
        let spm = match vocab.model.as_str() {
            "llama" => Some((
                SpmEncoder::new(vocab, |piece| inner.get_model().token_to_id(piece))?,
                ControlTokens::of_types(vocab, &[TokenType::UserDefined])?,
            )),
            _ => None,
        };

        let add_bos = vocab.add_bos_token.unwrap_or(default_add_bos);
        let bos = if add_bos { vocab.bos_id } else { None };
        let vocab_size = vocab.tokens.len();
        let mut eos: Vec<u32> = vocab.eos_id.into_iter().chain(vocab.eot_id).collect();
        eos.extend(
            END_OF_TURN_SPELLINGS
                .iter()
                .filter_map(|spelling| vocab.find(spelling)),
        );
        let mut seen = HashSet::new();
        eos.retain(|id| (*id as usize) < vocab_size && seen.insert(*id));
        let pad = vocab
            .pad_id
            .or(vocab.unk_id)
            .or(vocab.eos_id)
            .filter(|id| (*id as usize) < vocab_size)
            .ok_or_else(|| {
                TokenizerError::Build("no pad, unk or eos token to pad with".to_owned())
            })?;
        let longest_token_bytes = token_bytes::longest_token_bytes(vocab, &token_bytes);
        Ok(Self {
            inner,
            control: ControlTokens::new(vocab)?,
            spm,
            bos,
            eos,
            pad,
            vocab_size,
            add_space_prefix: vocab.add_space_prefix.unwrap_or(default_space_prefix),
            token_bytes,
            longest_token_bytes,
        })
    }

    /// [`Tokenizer::longest_token_bytes`] of the tokenizer in `gguf`, from its vocabulary alone:
    /// without building the tokenizer (a fraction of its cost), for a bound on a text's size
    /// before the model loads.
    pub fn longest_token_bytes_of(gguf: &GgufFile) -> Result<usize, GgufError> {
        let vocab = GgufVocab::from_gguf(gguf)?.with_llama_cpp_control_overrides();
        Ok(token_bytes::longest_token_bytes(
            &vocab,
            &token_bytes::vocab_token_bytes(&vocab),
        ))
    }

    /// The underlying `tokenizers` tokenizer (control tokens registered but never parsed).
    pub fn inner(&self) -> &HfTokenizer {
        &self.inner
    }

    /// Id of the token spelled `text` (including control tokens).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The token to pad with: the vocabulary's pad token, else its unknown token, else its EOS.
    pub fn pad_token(&self) -> u32 {
        self.pad
    }

    /// Spelling of token `id`.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    fn encode_text(&self, text: &str, after_control: bool) -> Result<Vec<u32>, TokenizeError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        // llama.cpp adds the SentencePiece prefix space at the start and after each control token.
        let prefixed;
        let text = if self.add_space_prefix && after_control {
            prefixed = format!(" {text}");
            prefixed.as_str()
        } else {
            text
        };
        if let Some((encoder, user_defined)) = &self.spm {
            let mut ids = Vec::new();
            for fragment in user_defined.split(text) {
                match fragment {
                    Fragment::Text(piece) => {
                        ids.extend(encoder.encode(&piece.replace(' ', SPACE_MARK), |piece| {
                            self.inner.get_model().token_to_id(piece)
                        }))
                    }
                    Fragment::Control(id) => ids.push(id),
                }
            }
            return Ok(ids);
        }
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|error| TokenizeError(error.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }
}

impl Tokenizer for GgufTokenizer {
    fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        if !allow_special {
            return self.encode_text(text, true);
        }
        let mut ids = Vec::new();
        let mut after_control = true;
        for fragment in self.control.split(text) {
            match fragment {
                Fragment::Text(piece) => {
                    ids.extend(self.encode_text(piece, after_control)?);
                    after_control = false;
                }
                Fragment::Control(id) => {
                    ids.push(id);
                    after_control = true;
                }
            }
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.inner
            .decode(ids, false)
            .map_err(|error| TokenizeError(error.to_string()))
    }

    fn bos_token(&self) -> Option<u32> {
        self.bos
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
        self.token_bytes.get(id as usize).cloned()
    }

    fn longest_token_bytes(&self) -> usize {
        self.longest_token_bytes
    }
}

/// Token string → id for the BPE model. Duplicate spellings keep their first id.
fn vocab_map(vocab: &GgufVocab) -> Result<tokenizers::models::bpe::Vocab, TokenizerError> {
    let mut map = tokenizers::models::bpe::Vocab::default();
    map.reserve(vocab.tokens.len());
    for (index, token) in vocab.tokens.iter().enumerate() {
        let id = u32::try_from(index)
            .map_err(|_| TokenizerError::Build("vocabulary too large".to_owned()))?;
        map.entry(token.clone()).or_insert(id);
    }
    Ok(map)
}

/// Registers control tokens as special added tokens (decoded as their spelling, never produced
/// from text by `inner`) and user-defined tokens as ordinary added tokens (always kept whole, as
/// llama.cpp does), both matched on the raw text.
fn register_added_tokens(
    tokenizer: &mut HfTokenizer,
    vocab: &GgufVocab,
) -> Result<(), TokenizerError> {
    let mut special = Vec::new();
    let mut user_defined = Vec::new();
    for (index, token) in vocab.tokens.iter().enumerate() {
        match vocab.token_type(index) {
            TokenType::Control | TokenType::Unknown => {
                special.push(AddedToken::from(token.clone(), true).normalized(false))
            }
            TokenType::UserDefined => {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false))
            }
            TokenType::Normal | TokenType::Unused | TokenType::Byte => {}
        }
    }
    let build = |error: tokenizers::Error| TokenizerError::Build(error.to_string());
    tokenizer.add_special_tokens(special).map_err(build)?;
    tokenizer.add_tokens(user_defined).map_err(build)?;
    tokenizer.set_encode_special_tokens(true);
    Ok(())
}
