//! Byte-level BPE tokenizers (`tokenizer.ggml.model = gpt2`: Qwen2, Llama 3, SmolLM, GPT-2, …):
//! vocabulary and merges from the GGUF, the pre-tokenizer named by `tokenizer.ggml.pre` (the
//! regex splits of [`pre_split`] followed by the GPT-2 byte-to-character mapping), and the
//! byte-level decoder.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::TokenizerError;
use super::pre_split;
use super::vocab::GgufVocab;

/// Builds the byte-level BPE tokenizer described by `vocab`.
pub fn build(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let pre = vocab.pre.as_deref().unwrap_or("default");
    let (expressions, ignore_merges) = pre_split::split_expressions(pre).ok_or_else(|| {
        TokenizerError::Unsupported(format!(
            "byte-level BPE pre-tokenizer {pre:?} (tokenizer.ggml.pre; supported: {})",
            pre_split::KNOWN
        ))
    })?;
    let merges = vocab.merges.as_ref().ok_or_else(|| {
        TokenizerError::Unsupported("byte-level BPE without tokenizer.ggml.merges".to_owned())
    })?;
    // The merge pairs and the token map are independent: built side by side.
    let (merges, vocab_map) = rayon::join(
        || {
            merges
                .iter()
                .map(|merge| {
                    merge
                        .split_once(' ')
                        .map(|(left, right)| (left.to_owned(), right.to_owned()))
                        .ok_or_else(|| TokenizerError::Build(format!("malformed merge {merge:?}")))
                })
                .collect::<Result<Vec<_>, _>>()
        },
        || super::vocab_map(vocab),
    );
    let model = BPE::builder()
        .vocab_and_merges(vocab_map?, merges?)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|error| TokenizerError::Build(format!("BPE model: {error}")))?;

    let mut steps = Vec::with_capacity(expressions.len() + 1);
    for expression in expressions {
        let split = Split::new(
            SplitPattern::Regex(expression.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|error| TokenizerError::Build(format!("pre-tokenizer regex: {error}")))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    let pre_tokenizer = Sequence::new(steps);

    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}
