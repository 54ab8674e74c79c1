//! SentencePiece BPE tokenizers (`tokenizer.ggml.model = llama`) such as Gemma-3's and Llama 2's:
//! the `tokenizers` side that decodes (`▁` back to spaces, `<0xNN>` pieces back to bytes) and looks
//! pieces up. Encoding is [`super::spm_encoder`]'s, by score as llama.cpp does.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::{DecoderWrapper, Tokenizer};

use super::TokenizerError;
use super::vocab::GgufVocab;

/// SentencePiece's visible space.
pub const SPACE_MARK: &str = "\u{2581}";

/// The `tokenizers` tokenizer of the SentencePiece vocabulary `vocab`, for decoding and piece
/// lookups: text is encoded by [`super::spm_encoder::SpmEncoder`], so it holds no merges.
pub fn build(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let mut builder = BPE::builder()
        .vocab_and_merges(super::vocab_map(vocab)?, Vec::new())
        .byte_fallback(true);
    if let Some(unk) = vocab.unk_id.and_then(|id| vocab.tokens.get(id as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let model = builder
        .build()
        .map_err(|error| TokenizerError::Build(format!("BPE model: {error}")))?;

    let space_decoder = tokenizers::decoders::DecoderWrapper::Replace(
        Replace::new(SPACE_MARK, " ")
            .map_err(|error| TokenizerError::Build(format!("decoder: {error}")))?,
    );
    let decoder = Sequence::new(vec![
        space_decoder,
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ]);

    let mut tokenizer = Tokenizer::new(model);
    tokenizer.with_decoder(Some(decoder));
    Ok(tokenizer)
}
