//! Incremental detokenization: turns generated tokens into text one token at a time without ever
//! showing a half character. Byte-level BPE and byte-fallback tokens can split a UTF-8 character
//! across tokens; decoding such a tail yields U+FFFD, so that text is held until the character is
//! complete. Decoding a window that starts a few tokens back (rather than each token alone) keeps
//! the leading spaces that SentencePiece-style decoders strip from the first token of a sequence.

use crate::tokenizer::{TokenizeError, Tokenizer};

const REPLACEMENT_CHARACTER: char = '\u{FFFD}';

/// How many prompt tokens seed the decoding window, so the first generated token is decoded in
/// context (its leading space survives).
const CONTEXT_TOKENS: usize = 4;

/// Decodes a growing token sequence into text pieces.
pub struct IncrementalDetokenizer<'t> {
    tokenizer: &'t dyn Tokenizer,
    /// Context tokens followed by every generated token.
    tokens: Vec<u32>,
    /// Start of the decoding window: the tokens whose text was released last, kept for context.
    prefix_offset: usize,
    /// First token whose text has not been released.
    read_offset: usize,
}

impl<'t> IncrementalDetokenizer<'t> {
    /// `context` is the text's preceding tokens (the end of the prompt); they are decoded for
    /// context only and never released.
    pub fn new(tokenizer: &'t dyn Tokenizer, context: &[u32]) -> Self {
        let context = &context[context.len().saturating_sub(CONTEXT_TOKENS)..];
        IncrementalDetokenizer {
            tokenizer,
            tokens: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Adds a token and returns the text it completes, possibly empty.
    pub fn push(&mut self, token_id: u32) -> Result<String, TokenizeError> {
        self.tokens.push(token_id);
        let text = self.unreleased_text()?;
        if text.is_empty() || text.ends_with(REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        self.mark_released();
        Ok(text)
    }

    /// Releases whatever is left at the end of generation, with U+FFFD for bytes that never
    /// became a whole character.
    pub fn finish(&mut self) -> Result<String, TokenizeError> {
        if self.read_offset == self.tokens.len() {
            return Ok(String::new());
        }
        let text = self.unreleased_text()?;
        self.mark_released();
        Ok(text)
    }

    /// Text of the unreleased tokens, decoded after the last released ones for context.
    fn unreleased_text(&self) -> Result<String, TokenizeError> {
        let window_text = self.tokenizer.decode(&self.tokens[self.prefix_offset..])?;
        let released_text = self
            .tokenizer
            .decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        match window_text.strip_prefix(released_text.as_str()) {
            Some(text) => Ok(text.to_owned()),
            // The decoder rewrote the earlier text once more tokens followed (space clean-up):
            // decode the unreleased tokens alone rather than cut the window at a wrong place.
            None => self.tokenizer.decode(&self.tokens[self.read_offset..]),
        }
    }

    /// The unreleased tokens become the context of the next window.
    fn mark_released(&mut self) {
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::test_tokenizer::ByteTokenizer;

    fn stream(tokenizer: &ByteTokenizer, context: &[u32], tokens: &[u32]) -> Vec<String> {
        let mut detokenizer = IncrementalDetokenizer::new(tokenizer, context);
        let mut pieces: Vec<String> = tokens
            .iter()
            .map(|&token| detokenizer.push(token).unwrap())
            .collect();
        pieces.push(detokenizer.finish().unwrap());
        pieces
    }

    #[test]
    fn split_characters_are_held_until_complete() {
        let tokenizer =
            ByteTokenizer::new(&[b"caf", &[0xC3], &[0xA9], b" ", &[0xE2, 0x82], &[0xAC]]);
        let pieces = stream(&tokenizer, &[], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(pieces, vec!["caf", "", "é", " ", "", "€", ""]);
    }

    #[test]
    fn pieces_concatenate_to_the_full_decode() {
        let tokenizer = ByteTokenizer::new(&[
            b"Hello",
            b",",
            b" wor",
            b"ld",
            &[0xF0, 0x9F],
            &[0x98, 0x80],
            b"!",
        ]);
        let tokens = [0, 1, 2, 3, 4, 5, 6, 0];
        let pieces = stream(&tokenizer, &[], &tokens);
        assert_eq!(pieces.concat(), tokenizer.decode(&tokens).unwrap());
        assert!(
            pieces
                .iter()
                .all(|piece| !piece.contains(REPLACEMENT_CHARACTER))
        );
    }

    #[test]
    fn a_character_never_completed_is_flushed_as_replacement() {
        let tokenizer = ByteTokenizer::new(&[b"ok", &[0xE2, 0x82]]);
        assert_eq!(stream(&tokenizer, &[], &[0, 1]), vec!["ok", "", "\u{FFFD}"]);
    }

    #[test]
    fn context_keeps_the_leading_space_a_sentencepiece_decoder_strips() {
        // Like SentencePiece's decoder, this one drops the space that starts a sequence.
        let tokenizer = ByteTokenizer::new(&[b" The", b" capital", b" is", b" Paris"])
            .stripping_leading_space();
        assert_eq!(stream(&tokenizer, &[], &[3]), vec!["Paris", ""]);
        assert_eq!(
            stream(&tokenizer, &[0, 1, 2], &[3, 3]),
            vec![" Paris", " Paris", ""]
        );
    }
}
