//! Byte-level BPE tokenizers (`tokenizer.ggml.model = gpt2`) such as Qwen2's: vocabulary and merges
//! from the GGUF, the pre-tokenizer named by `tokenizer.ggml.pre` (a regex split followed by the
//! GPT-2 byte-to-character mapping), and the byte-level decoder.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::TokenizerError;
use super::vocab::GgufVocab;

/// The Qwen2 pre-tokenizer regex (as in Qwen2's `tokenizer.json` and llama.cpp's `qwen2` pre-type):
/// contractions, letter runs with one optional leading non-letter, single digits, punctuation runs,
/// newlines, and whitespace.
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Builds the byte-level BPE tokenizer described by `vocab`.
pub fn build(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let regex = match vocab.pre.as_deref() {
        Some("qwen2") => QWEN2_SPLIT_REGEX,
        other => {
            return Err(TokenizerError::Unsupported(format!(
                "byte-level BPE pre-tokenizer {other:?} (supported: \"qwen2\")"
            )));
        }
    };
    let merges = vocab.merges.as_ref().ok_or_else(|| {
        TokenizerError::Unsupported("byte-level BPE without tokenizer.ggml.merges".to_owned())
    })?;
    let merges = merges
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(left, right)| (left.to_owned(), right.to_owned()))
                .ok_or_else(|| TokenizerError::Build(format!("malformed merge {merge:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let model = BPE::builder()
        .vocab_and_merges(super::vocab_map(vocab)?, merges)
        .build()
        .map_err(|error| TokenizerError::Build(format!("BPE model: {error}")))?;

    let split = Split::new(
        SplitPattern::Regex(regex.to_owned()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|error| TokenizerError::Build(format!("pre-tokenizer regex: {error}")))?;
    let pre_tokenizer = Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ]);

    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}
