//! SentencePiece BPE tokenizers (`tokenizer.ggml.model = llama`) such as Gemma-3's, rebuilt as a
//! `tokenizers` BPE model: merges are derived from the vocabulary and scores the way HF
//! transformers' SentencePiece/GGUF converters do (every split of a piece into two vocabulary
//! pieces, ordered by the piece's score), spaces become `▁`, and bytes missing from the vocabulary
//! fall back to `<0xNN>` pieces.
//!
//! Why merges ordered by score reproduce SentencePiece: SentencePiece BPE repeatedly joins the
//! adjacent pair whose joined piece has the highest score (leftmost on ties), which is exactly BPE
//! with merge ranks sorted by that score.

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

/// Builds the SentencePiece BPE tokenizer described by `vocab`.
pub fn build(vocab: &GgufVocab) -> Result<Tokenizer, TokenizerError> {
    let scores = vocab.scores.as_ref().ok_or_else(|| {
        TokenizerError::Unsupported(
            "SentencePiece vocabulary without tokenizer.ggml.scores".to_owned(),
        )
    })?;
    if scores.len() != vocab.tokens.len() {
        return Err(TokenizerError::Build(format!(
            "{} scores for {} tokens",
            scores.len(),
            vocab.tokens.len()
        )));
    }
    let vocab_map = super::vocab_map(vocab)?;
    let merges = derive_merges(&vocab.tokens, scores, |token| vocab_map.get(token).copied());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab_map, merges)
        .byte_fallback(true);
    if let Some(unk) = vocab.unk_id.and_then(|id| vocab.tokens.get(id as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let model = builder
        .build()
        .map_err(|error| TokenizerError::Build(format!("BPE model: {error}")))?;

    let normalizer = Replace::new(" ", SPACE_MARK)
        .map_err(|error| TokenizerError::Build(format!("normalizer: {error}")))?;
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
    tokenizer.with_normalizer(Some(normalizer));
    tokenizer.with_decoder(Some(decoder));
    Ok(tokenizer)
}

/// Merges implied by a SentencePiece vocabulary: for every piece, each split into two pieces that
/// are themselves in the vocabulary, ordered by the joined piece's score (highest first).
///
/// Ties keep HF transformers' `generate_merges` order: by score, then longer left part, then longer
/// right part (lengths in characters), then the vocabulary order of the piece and of its parts.
pub fn derive_merges(
    tokens: &[String],
    scores: &[f32],
    id_of: impl Fn(&str) -> Option<u32>,
) -> Vec<(String, String)> {
    // Strings are materialised only at the end: half a million candidates are sorted first.
    struct Merge {
        piece_index: usize,
        split_at: usize,
        score: f32,
        left_chars: usize,
        right_chars: usize,
    }
    let mut merges: Vec<Merge> = Vec::new();
    let mut local: Vec<(u32, u32, Merge)> = Vec::new();
    for (piece_index, (piece, score)) in tokens.iter().zip(scores).enumerate() {
        local.clear();
        for (left_chars, (split_at, _)) in piece.char_indices().enumerate().skip(1) {
            let (left, right) = piece.split_at(split_at);
            let Some(left_id) = id_of(left) else { continue };
            if let Some(right_id) = id_of(right) {
                let merge = Merge {
                    piece_index,
                    split_at,
                    score: *score,
                    left_chars,
                    right_chars: right.chars().count(),
                };
                local.push((left_id, right_id, merge));
            }
        }
        local.sort_by_key(|(left_id, right_id, _)| (*left_id, *right_id));
        merges.extend(local.drain(..).map(|(_, _, merge)| merge));
    }
    // A stable sort, descending, as Python's `sorted(..., reverse=True)`.
    merges.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| b.left_chars.cmp(&a.left_chars))
            .then_with(|| b.right_chars.cmp(&a.right_chars))
    });
    merges
        .into_iter()
        .map(|merge| {
            let (left, right) = tokens[merge.piece_index].split_at(merge.split_at);
            (left.to_owned(), right.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_the_joined_piece_score() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .map(str::to_owned)
            .to_vec();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let id_of = |text: &str| {
            tokens
                .iter()
                .position(|token| token == text)
                .map(|index| index as u32)
        };
        let merges = derive_merges(&tokens, &scores, id_of);
        let merges: Vec<(&str, &str)> = merges
            .iter()
            .map(|(l, r)| (l.as_str(), r.as_str()))
            .collect();
        // "bc" (-1) before "ab" (-2) before "abc" (-3); for "abc" the longer left part comes first.
        assert_eq!(merges, [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }
}
