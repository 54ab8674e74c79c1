//! Finding control-token strings (`<|im_start|>`, `<start_of_turn>`, ...) in text that is allowed
//! to contain them (chat-template text): leftmost-longest matches, like llama.cpp's special-token
//! partitioning. User text never goes through here, so it cannot forge control tokens.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::TokenizerError;
use super::vocab::{GgufVocab, TokenType};

/// A piece of text split at control tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment<'a> {
    Text(&'a str),
    Control(u32),
}

/// The control tokens of a vocabulary and a matcher for their spellings.
#[derive(Clone, Debug)]
pub struct ControlTokens {
    matcher: Option<AhoCorasick>,
    ids: Vec<u32>,
}

impl ControlTokens {
    /// Control and unknown-type tokens of `vocab` (the ones llama.cpp parses only on request).
    pub fn new(vocab: &GgufVocab) -> Result<Self, TokenizerError> {
        Self::of_types(vocab, &[TokenType::Control, TokenType::Unknown])
    }

    /// A matcher of the tokens of `types` instead (user-defined tokens, which llama.cpp keeps
    /// whole in any text).
    pub fn of_types(vocab: &GgufVocab, types: &[TokenType]) -> Result<Self, TokenizerError> {
        let mut spellings = Vec::new();
        let mut ids = Vec::new();
        for (index, token) in vocab.tokens.iter().enumerate() {
            if types.contains(&vocab.token_type(index)) && !token.is_empty() {
                spellings.push(token.as_str());
                ids.push(
                    u32::try_from(index)
                        .map_err(|_| TokenizerError::Build("vocabulary too large".to_owned()))?,
                );
            }
        }
        let matcher = if spellings.is_empty() {
            None
        } else {
            let matcher = AhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&spellings)
                .map_err(|error| {
                    TokenizerError::Build(format!("control-token matcher: {error}"))
                })?;
            Some(matcher)
        };
        Ok(Self { matcher, ids })
    }

    /// Splits `text` into plain text and control tokens, in order; empty text pieces are omitted.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let Some(matcher) = &self.matcher else {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Fragment::Text(text)]
            };
        };
        let mut fragments = Vec::new();
        let mut text_start = 0;
        for found in matcher.find_iter(text) {
            if found.start() > text_start {
                fragments.push(Fragment::Text(&text[text_start..found.start()]));
            }
            fragments.push(Fragment::Control(self.ids[found.pattern().as_usize()]));
            text_start = found.end();
        }
        if text_start < text.len() {
            fragments.push(Fragment::Text(&text[text_start..]));
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_leftmost_longest_and_ignores_other_types() -> Result<(), TokenizerError> {
        let vocab = GgufVocab {
            tokens: ["<s>", "<start>", "<start_of_turn>", "x", "<tool_call>"]
                .map(str::to_owned)
                .to_vec(),
            token_types: vec![
                TokenType::Control,
                TokenType::Control,
                TokenType::Control,
                TokenType::Normal,
                TokenType::UserDefined,
            ],
            ..GgufVocab::default()
        };
        let control = ControlTokens::new(&vocab)?;
        assert_eq!(
            control.split("a<start_of_turn>b<s><start><tool_call>"),
            [
                Fragment::Text("a"),
                Fragment::Control(2),
                Fragment::Text("b"),
                Fragment::Control(0),
                Fragment::Control(1),
                Fragment::Text("<tool_call>"),
            ]
        );
        assert_eq!(control.split(""), []);
        assert_eq!(control.split("plain"), [Fragment::Text("plain")]);
        Ok(())
    }
}
