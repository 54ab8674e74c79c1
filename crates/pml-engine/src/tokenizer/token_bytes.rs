//! The bytes each token stands for, as a constrained decoder needs them (it matches grammars
//! over bytes, not over ids): GPT-2's byte-level alphabet mapped back to bytes for `gpt2` vocabs,
//! SentencePiece's `▁` as a space and `<0xNN>` pieces as their byte for `llama` vocabs. Markup
//! and unused tokens are not text: they come out as [`TokenBytes::Special`]. Also the most bytes
//! of text one token can stand for ([`longest_token_bytes`]), which bounds how few tokens a text
//! can take.

use super::vocab::{GgufVocab, TokenType};

/// What one token decodes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenBytes {
    Text(Vec<u8>),
    /// A control, unknown or unused token, by its spelling: never part of generated text.
    Special(String),
}

impl TokenBytes {
    /// The bytes the token decodes to, or for a special token its spelling's.
    pub fn len(&self) -> usize {
        match self {
            TokenBytes::Text(bytes) => bytes.len(),
            TokenBytes::Special(spelling) => spelling.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The most bytes of input text one token of `vocab` can cover (at least 1), given its tokens'
/// bytes (`token_bytes`, from [`vocab_token_bytes`]): what an ordinary token decodes to, and the
/// spelling of a token matched whole on the raw text (user-defined, control and unknown ones).
/// Every byte of a text is covered by some token (byte-level BPE has a token for each byte,
/// SentencePiece falls back to byte pieces or the unknown token), so a text of `n` bytes takes at
/// least `n / longest` tokens.
pub fn longest_token_bytes(vocab: &GgufVocab, token_bytes: &[TokenBytes]) -> usize {
    token_bytes
        .iter()
        .enumerate()
        .map(|(id, bytes)| match vocab.token_type(id) {
            TokenType::Normal | TokenType::Byte => bytes.len(),
            TokenType::UserDefined
            | TokenType::Control
            | TokenType::Unknown
            | TokenType::Unused => {
                let spelling = vocab.tokens.get(id).map_or(0, String::len);
                bytes.len().max(spelling)
            }
        })
        .max()
        .unwrap_or(0)
        .max(1)
}

/// Every token of `vocab`, in id order.
pub fn vocab_token_bytes(vocab: &GgufVocab) -> Vec<TokenBytes> {
    let byte_of = byte_level_decoder();
    vocab
        .tokens
        .iter()
        .zip(&vocab.token_types)
        .map(|(piece, kind)| match kind {
            TokenType::Control | TokenType::Unknown | TokenType::Unused => {
                TokenBytes::Special(piece.clone())
            }
            TokenType::Byte => match parse_byte_piece(piece) {
                Some(byte) => TokenBytes::Text(vec![byte]),
                None => TokenBytes::Special(piece.clone()),
            },
            TokenType::Normal | TokenType::UserDefined if vocab.model == "gpt2" => {
                // User-defined pieces (added tokens) are plain text; the others are spelled in
                // GPT-2's alphabet of printable stand-ins for bytes.
                match kind {
                    TokenType::UserDefined => TokenBytes::Text(piece.as_bytes().to_vec()),
                    _ => match piece.chars().map(&byte_of).collect::<Option<Vec<u8>>>() {
                        Some(bytes) => TokenBytes::Text(bytes),
                        None => TokenBytes::Text(piece.as_bytes().to_vec()),
                    },
                }
            }
            TokenType::Normal | TokenType::UserDefined => {
                TokenBytes::Text(piece.replace('\u{2581}', " ").into_bytes())
            }
        })
        .collect()
}

/// `<0xNN>` → NN.
fn parse_byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// The inverse of GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others
/// (controls, space, 127–160, 173) for the code points from 256 up, in byte order.
fn byte_level_decoder() -> impl Fn(char) -> Option<u8> {
    let printable = |byte: u8| matches!(byte, 33..=126 | 161..=172 | 174..=255);
    let mut table = std::collections::HashMap::with_capacity(256);
    let mut next = 256u32;
    for byte in 0..=255u8 {
        let stand_in = if printable(byte) {
            u32::from(byte)
        } else {
            next += 1;
            next - 1
        };
        if let Some(c) = char::from_u32(stand_in) {
            table.insert(c, byte);
        }
    }
    move |c| table.get(&c).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_stand_ins_map_back_to_bytes() {
        let byte_of = byte_level_decoder();
        assert_eq!(byte_of('a'), Some(b'a'));
        assert_eq!(byte_of('Ġ'), Some(b' '));
        assert_eq!(byte_of('Ċ'), Some(b'\n'));
        assert_eq!(byte_of('ĉ'), Some(b'\t'));
        assert_eq!(byte_of('\u{2581}'), None);
        // All 256 bytes have exactly one stand-in.
        let stand_ins: std::collections::HashSet<u8> = (0..600u32)
            .filter_map(char::from_u32)
            .filter_map(&byte_of)
            .collect();
        assert_eq!(stand_ins.len(), 256);
    }

    /// An ordinary token counts its decoded bytes (a GPT-2 stand-in such as `Ġ` is one byte);
    /// a token matched on the raw text counts its spelling.
    #[test]
    fn longest_token_bytes_counts_what_a_token_covers_of_the_text() {
        let vocab = GgufVocab {
            model: "gpt2".to_owned(),
            tokens: ["a", "ĠĠĠĠ", "<|im_start|>", "abc"]
                .map(str::to_owned)
                .to_vec(),
            token_types: vec![
                TokenType::Normal,
                TokenType::Normal,
                TokenType::Control,
                TokenType::Normal,
            ],
            ..GgufVocab::default()
        };
        let bytes = vocab_token_bytes(&vocab);
        assert_eq!(bytes[1], TokenBytes::Text(b"    ".to_vec()));
        assert_eq!(longest_token_bytes(&vocab, &bytes), "<|im_start|>".len());
        let plain = GgufVocab {
            tokens: vec!["ĠĠĠĠ".to_owned(), "abc".to_owned()],
            token_types: vec![TokenType::Normal; 2],
            ..vocab
        };
        assert_eq!(longest_token_bytes(&plain, &vocab_token_bytes(&plain)), 4);
    }

    #[test]
    fn byte_pieces_parse() {
        assert_eq!(parse_byte_piece("<0x0A>"), Some(b'\n'));
        assert_eq!(parse_byte_piece("<0xFF>"), Some(255));
        assert_eq!(parse_byte_piece("<0xZZ>"), None);
        assert_eq!(parse_byte_piece("0x0A"), None);
    }
}
