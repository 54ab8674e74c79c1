//! An open document: its text, version and line map, and the incremental edits of
//! `textDocument/didChange` applied to it in order (each range is relative to the text left by
//! the previous edit, as the specification says).

use crate::line_map::LineMap;
use crate::location::Range;

/// One edit of a change: `range` is replaced by `text`; no range replaces all of the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextChange {
    pub range: Option<Range>,
    pub text: String,
}

#[derive(Clone, Debug)]
pub struct Document {
    text: String,
    version: i32,
    lines: LineMap,
}

impl Document {
    pub fn new(text: String, version: i32) -> Self {
        let lines = LineMap::new(&text);
        Document {
            text,
            version,
            lines,
        }
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn version(&self) -> i32 {
        self.version
    }

    pub fn lines(&self) -> &LineMap {
        &self.lines
    }

    /// Applies the edits of one `didChange` notification, in order.
    pub fn apply(&mut self, version: i32, changes: Vec<TextChange>) {
        for change in changes {
            match change.range {
                Some(range) => {
                    let span = self.lines.span(&self.text, range);
                    self.text.replace_range(span.start..span.end, &change.text);
                }
                None => self.text = change.text,
            }
            self.lines = LineMap::new(&self.text);
        }
        self.version = version;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::location::Position;

    fn edit(start: (u32, u32), end: (u32, u32), text: &str) -> TextChange {
        TextChange {
            range: Some(Range::new(
                Position::new(start.0, start.1),
                Position::new(end.0, end.1),
            )),
            text: text.to_string(),
        }
    }

    #[test]
    fn edits_apply_in_order_with_utf16_columns() {
        let mut document = Document::new("<a>é𝄞</a>\n".to_string(), 1);
        // Replace `𝄞` (columns 4..6) with `x`, then insert after the new `x`.
        document.apply(
            2,
            vec![edit((0, 4), (0, 6), "x"), edit((0, 5), (0, 5), "\ny")],
        );
        assert_eq!(document.text(), "<a>éx\ny</a>\n");
        assert_eq!(document.version(), 2);
        document.apply(
            3,
            vec![TextChange {
                range: None,
                text: "new".to_string(),
            }],
        );
        assert_eq!(document.text(), "new");
    }
}
