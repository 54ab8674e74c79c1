//! Byte offsets ↔ positions. Positions count columns in UTF-16 code units (LSP's default
//! `positionEncoding`, and the only one every client supports); the parser's spans are UTF-8 byte
//! offsets. Out-of-range positions are clamped as the specification asks (a character past the
//! end of its line means the end of the line, before its `\n` or `\r\n`), and a position inside
//! a surrogate pair rounds down to the character's start, so no request can make the server slice
//! a string off a boundary.

use crate::location::{Position, Range};
use pml_syntax::{LineIndex, Span};

/// Line starts of one text (the parser's [`LineIndex`]), built once per version of a document.
#[derive(Clone, Debug)]
pub struct LineMap {
    index: LineIndex,
}

impl LineMap {
    pub fn new(text: &str) -> Self {
        LineMap {
            index: LineIndex::new(text),
        }
    }

    /// The position of byte `offset` (clamped to the text and to a character boundary).
    pub fn position(&self, text: &str, offset: usize) -> Position {
        let offset = floor_char_boundary(text, offset.min(text.len()));
        let (line, byte_column) = self.index.line_col(offset);
        let character = text[offset - byte_column..offset].encode_utf16().count();
        Position::new(to_u32(line), to_u32(character))
    }

    /// The byte offset of a position, clamped to the end of its line and of the text.
    pub fn offset(&self, text: &str, position: Position) -> usize {
        let line = position.line as usize;
        let Some(start) = self.index.line_start(line) else {
            return text.len();
        };
        // The line's content ends before its terminator, `\n` or `\r\n`.
        let mut end = self
            .index
            .line_start(line + 1)
            .map_or(text.len(), |next| next - 1);
        if end > start && text.as_bytes()[end - 1] == b'\r' && end < text.len() {
            end -= 1;
        }
        let mut units = 0usize;
        for (index, character) in text[start..end].char_indices() {
            let width = character.len_utf16();
            if units + width > position.character as usize {
                return start + index;
            }
            units += width;
        }
        end
    }

    pub fn range(&self, text: &str, span: Span) -> Range {
        Range::new(
            self.position(text, span.start),
            self.position(text, span.end),
        )
    }

    /// The byte span of a range (its ends ordered).
    pub fn span(&self, text: &str, range: Range) -> Span {
        let start = self.offset(text, range.start);
        let end = self.offset(text, range.end);
        Span::new(start.min(end), start.max(end))
    }
}

fn floor_char_boundary(text: &str, mut offset: usize) -> usize {
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// Positions are `u32`, as in LSP: a longer document cannot be addressed past that anyway.
fn to_u32(value: usize) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_columns_round_trip() {
        // `é` is 2 bytes / 1 unit, `𝄞` 4 bytes / 2 units.
        let text = "aé𝄞b\nx\r\n";
        let map = LineMap::new(text);
        assert_eq!(map.position(text, 0), Position::new(0, 0));
        assert_eq!(map.position(text, 3), Position::new(0, 2));
        assert_eq!(map.position(text, 7), Position::new(0, 4));
        assert_eq!(map.offset(text, Position::new(0, 4)), 7);
        // Inside the surrogate pair: the character's start.
        assert_eq!(map.offset(text, Position::new(0, 3)), 3);
        // Past the line's end: the end of the line (before `\n`).
        assert_eq!(map.offset(text, Position::new(0, 99)), 8);
        assert_eq!(map.offset(text, Position::new(1, 0)), 9);
        // Past the end of a `\r\n` line: before the `\r`.
        assert_eq!(map.offset(text, Position::new(1, 5)), 10);
        assert_eq!(map.offset(text, Position::new(9, 0)), text.len());
        // A byte offset inside `é` rounds down.
        assert_eq!(map.position(text, 2), Position::new(0, 1));
        assert_eq!(map.position(text, 999), Position::new(2, 0));
    }
}
