//! Drafts taken from the sequence itself (prompt lookup decoding; llama.cpp's `ngram` drafts):
//! the tokens that followed the latest earlier occurrence of the sequence's last n tokens. A
//! PML prompt holds its imported modules' tokens (documents, source files, examples), so an
//! answer that quotes or edits them finds its continuation there before the model computes it.

use std::collections::HashMap;

/// The longest n-gram looked up; longer matches are rarer and add little certainty.
pub const MAX_NGRAM: usize = 4;

/// A match found for the sequence's end: the tokens that followed an earlier occurrence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NgramDraft {
    /// How many of the sequence's last tokens matched (1..=[`MAX_NGRAM`]; in an earlier
    /// answer the sequence follows, up to [`super::earlier::MAX_FOLLOWED`]).
    pub matched: usize,
    pub tokens: Vec<u32>,
}

/// Every n-gram (n = 1..=[`MAX_NGRAM`]) of a growing token sequence, each mapped to the index of
/// the token after its latest occurrence whose continuation is known.
#[derive(Clone, Debug, Default)]
pub struct NgramIndex {
    tokens: Vec<u32>,
    /// `latest[n - 1]`: n-gram → index of the token that followed it last.
    latest: Vec<HashMap<u128, usize>>,
}

/// The n-gram ending at `tokens[end]` (inclusive), packed; `n` tokens of 32 bits fit in 128.
fn key(tokens: &[u32], end: usize, n: usize) -> u128 {
    tokens[end + 1 - n..=end]
        .iter()
        .fold(0u128, |packed, &token| (packed << 32) | u128::from(token))
}

/// Records `value` as what followed each n-gram of `tokens` that ends at `end`, in `latest`
/// (n-grams of length `n` at `n - 1`).
pub(super) fn insert_ngrams<V>(
    latest: &mut [HashMap<u128, V>],
    tokens: &[u32],
    end: usize,
    value: V,
) where
    V: Copy,
{
    for n in 1..=latest.len().min(end + 1) {
        latest[n - 1].insert(key(tokens, end, n), value);
    }
}

/// The longest n-gram, at least `min_ngram` long, that `tokens` ends with and `latest` holds:
/// its length, and what followed it.
pub(super) fn longest_match<V: Copy>(
    latest: &[HashMap<u128, V>],
    tokens: &[u32],
    min_ngram: usize,
) -> Option<(usize, V)> {
    let end = tokens.len().checked_sub(1)?;
    (min_ngram.max(1)..=latest.len().min(tokens.len()))
        .rev()
        .find_map(|n| {
            latest[n - 1]
                .get(&key(tokens, end, n))
                .map(|&value| (n, value))
        })
}

impl NgramIndex {
    /// The index of `tokens` (a prompt, every token in position order).
    pub fn new(tokens: &[u32]) -> Self {
        let mut index = NgramIndex {
            tokens: Vec::with_capacity(tokens.len()),
            latest: vec![HashMap::new(); MAX_NGRAM],
        };
        for &token in tokens {
            index.push(token);
        }
        index
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The sequence so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The sequence's last tokens, as many as a match may take.
    pub fn tail(&self) -> &[u32] {
        &self.tokens[self.tokens.len().saturating_sub(MAX_NGRAM)..]
    }

    /// Appends a token: the n-grams ending just before it now have a known continuation.
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
        let next = self.tokens.len() - 1;
        if let Some(end) = next.checked_sub(1) {
            insert_ngrams(&mut self.latest, &self.tokens, end, next);
        }
    }

    /// Up to `max_tokens` tokens that followed the latest earlier occurrence of the longest
    /// n-gram (at least `min_ngram` long) the sequence ends with; `None` when nothing matches.
    /// A continuation that reaches the sequence's end goes on as the lookup would over the
    /// sequence with its drafts appended: the last `p` tokens repeat, `p` the distance back to
    /// the occurrence (a run of one token, a repeated line), rather than ending the draft where
    /// the sequence ends.
    pub fn draft(&self, min_ngram: usize, max_tokens: usize) -> Option<NgramDraft> {
        if max_tokens == 0 {
            return None;
        }
        let (matched, start) = longest_match(&self.latest, &self.tokens, min_ngram)?;
        let period = self.tokens.len() - start;
        Some(NgramDraft {
            matched,
            tokens: (0..max_tokens)
                .map(|at| self.tokens[start + at % period])
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_drafts_what_followed_it_last() {
        // "1 2 3 4 9 | 7 2 3 5 | 2 3": the 3-gram "5 2 3" never occurred before the end, the
        // suffix "2 3" last continued with 5, so the 2-gram wins.
        let index = NgramIndex::new(&[1, 2, 3, 4, 9, 7, 2, 3, 5, 2, 3]);
        assert_eq!(
            index.draft(1, 3),
            Some(NgramDraft {
                matched: 2,
                tokens: vec![5, 2, 3]
            })
        );
        // A longer match beats a later shorter one.
        let index = NgramIndex::new(&[8, 1, 2, 3, 4, 5, 6, 2, 3, 7, 1, 2, 3]);
        let draft = index.draft(1, 2).expect("a match");
        assert_eq!((draft.matched, draft.tokens), (3, vec![4, 5]));
    }

    #[test]
    fn a_draft_past_the_sequence_end_repeats_it_and_needs_its_minimum_match() {
        let mut index = NgramIndex::new(&[5, 6, 5]);
        // "5" followed by 6 once; the draft runs into the sequence's own end, and the "6 5"
        // since the occurrence repeats.
        assert_eq!(
            index.draft(1, 5).map(|d| d.tokens),
            Some(vec![6, 5, 6, 5, 6])
        );
        assert_eq!(index.draft(2, 8), None);
        index.push(6);
        // "5 6" now matches at the start: its continuation is the last 5 and 6, repeated.
        assert_eq!(
            index.draft(2, 3),
            Some(NgramDraft {
                matched: 2,
                tokens: vec![5, 6, 5]
            })
        );
        // A run of one token drafts more of it.
        let index = NgramIndex::new(&[4, 9, 9, 9]);
        let draft = index.draft(1, 4).expect("a match");
        assert_eq!((draft.matched, draft.tokens), (2, vec![9, 9, 9, 9]));
        assert_eq!(index.draft(1, 0), None);
        assert_eq!(NgramIndex::new(&[]).draft(1, 4), None);
        assert_eq!(NgramIndex::new(&[1, 2, 3]).draft(1, 4), None);
    }

    #[test]
    fn large_token_ids_do_not_collide() {
        let index = NgramIndex::new(&[u32::MAX, 0, 1, 0, u32::MAX, 0]);
        // The 2-gram (MAX, 0) continued with 1; (0, MAX) is a different key.
        assert_eq!(index.draft(2, 1).map(|d| d.tokens), Some(vec![1]));
    }
}
