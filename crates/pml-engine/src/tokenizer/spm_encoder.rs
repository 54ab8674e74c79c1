//! SentencePiece BPE encoding as llama.cpp does it (`llm_tokenizer_spm`): start from the text's
//! characters and repeatedly join the adjacent pair whose joined piece is in the vocabulary with
//! the highest score (leftmost on ties); then emit each final piece's id, or, for a character
//! the vocabulary lacks, its UTF-8 bytes' `<0xNN>` pieces. (llama.cpp also keeps a map to split
//! a final piece back along its joins, but every join makes a vocabulary piece, so only single
//! characters ever miss the vocabulary: the map is never used, and is left out here.)
//!
//! It needs only the vocabulary and its scores: no merge table. Deriving one (every split of
//! every piece into two vocabulary pieces, ~500k for Gemma-3's 262k pieces) and building the
//! `tokenizers` crate's BPE over it took ~1 s of every load; this takes a hash map.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::TokenizerError;
use super::vocab::GgufVocab;

/// The scores and byte pieces of a SentencePiece vocabulary; piece → id lookups are the
/// caller's (`id_of`: the decoding tokenizer's own map, so the vocabulary is held once).
#[derive(Clone, Debug)]
pub struct SpmEncoder {
    scores: Vec<f32>,
    /// The `<0xNN>` piece of each byte, where the vocabulary has it.
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
}

/// A run of characters in the text: `start..start + len` bytes, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate join of symbols `left` and `right` into a vocabulary piece of `len` bytes.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The heap's greatest: the highest score, then the leftmost (llama.cpp's comparator).
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmEncoder {
    pub fn new(
        vocab: &GgufVocab,
        id_of: impl Fn(&str) -> Option<u32>,
    ) -> Result<Self, TokenizerError> {
        let scores = vocab.scores.clone().ok_or_else(|| {
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
        Ok(Self {
            scores,
            byte_ids: std::array::from_fn(|byte| id_of(&format!("<0x{byte:02X}>"))),
            unk: vocab.unk_id,
        })
    }

    /// The ids of `text`, whose spaces are already SentencePiece's `▁`.
    pub fn encode(&self, text: &str, id_of: impl Fn(&str) -> Option<u32>) -> Vec<u32> {
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = symbols.len();
        for (index, symbol) in symbols.iter_mut().enumerate() {
            symbol.prev = index.checked_sub(1);
            symbol.next = (index + 1 < n).then_some(index + 1);
        }
        let mut queue = BinaryHeap::new();
        let try_join = |symbols: &[Symbol],
                        queue: &mut BinaryHeap<Bigram>,
                        left: Option<usize>,
                        right: Option<usize>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let start = symbols[left].start;
            let len = symbols[left].len + symbols[right].len;
            if let Some(id) = id_of(&text[start..start + len]) {
                queue.push(Bigram {
                    score: self
                        .scores
                        .get(id as usize)
                        .copied()
                        .unwrap_or(f32::NEG_INFINITY),
                    left,
                    right,
                    len,
                });
            }
        };
        for right in 1..n {
            try_join(&symbols, &mut queue, Some(right - 1), Some(right));
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // Stale: one side was joined into something else since.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.len {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
            }
            try_join(&symbols, &mut queue, left.prev, Some(bigram.left));
            try_join(&symbols, &mut queue, Some(bigram.left), right.next);
        }
        let mut ids = Vec::with_capacity(n);
        let mut at = (n > 0).then_some(0);
        while let Some(index) = at {
            let symbol = symbols[index];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match id_of(piece) {
                Some(id) => ids.push(id),
                None => ids.extend(
                    piece
                        .bytes()
                        .filter_map(|byte| self.byte_ids[usize::from(byte)].or(self.unk)),
                ),
            }
            at = symbol.next;
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::tokenizer::vocab::TokenType;

    /// Encodes `text` with a vocabulary of `pieces` (ids in order) and two byte pieces after them.
    fn encode(pieces: &[(&str, f32)], text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut tokens: Vec<String> = pieces.iter().map(|(piece, _)| piece.to_string()).collect();
        let mut scores: Vec<f32> = pieces.iter().map(|(_, score)| *score).collect();
        for byte in [0xC3u8, 0xA9] {
            tokens.push(format!("<0x{byte:02X}>"));
            scores.push(0.0);
        }
        let ids: HashMap<String, u32> = (0u32..)
            .zip(&tokens)
            .map(|(id, t)| (t.clone(), id))
            .collect();
        let id_of = |piece: &str| ids.get(piece).copied();
        let encoder = SpmEncoder::new(
            &GgufVocab {
                model: "llama".into(),
                token_types: vec![TokenType::Normal; tokens.len()],
                tokens: tokens.clone(),
                scores: Some(scores),
                ..GgufVocab::default()
            },
            id_of,
        )?;
        Ok(encoder.encode(text, id_of))
    }

    #[test]
    fn the_best_scored_join_goes_first_and_ties_go_left() -> Result<(), TokenizerError> {
        // ids: a 0, b 1, c 2, ab 3, bc 4, abc 5
        let pieces = [
            ("a", 0.),
            ("b", 0.),
            ("c", 0.),
            ("ab", -2.),
            ("bc", -1.),
            ("abc", -3.),
        ];
        assert_eq!(encode(&pieces, "abc")?, [5]);
        // Without "abc": "bc" (-1) beats "ab" (-2), leaving "a" alone.
        assert_eq!(encode(&pieces[..5], "abc")?, [0, 4]);
        // Equal scores: the leftmost pair joins first.
        let tied = [("a", 0.), ("b", 0.), ("c", 0.), ("ab", -1.), ("bc", -1.)];
        assert_eq!(encode(&tied, "abc")?, [3, 2]);
        Ok(())
    }

    #[test]
    fn characters_outside_the_vocabulary_fall_back_to_their_bytes() -> Result<(), TokenizerError> {
        // "é" is C3 A9 in UTF-8: ids 1 and 2 are <0xC3> and <0xA9>.
        assert_eq!(encode(&[("a", 0.)], "aéa")?, [0, 1, 2, 0]);
        assert_eq!(encode(&[("a", 0.)], "")?, Vec::<u32>::new());
        Ok(())
    }
}
