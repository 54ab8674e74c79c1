//! The JSON shape of a diagnostic: what `pmlc check --format json` prints and what the server
//! answers a bad schema or prompt with (one place for the conversion, like rust-analyzer's
//! `to_proto`). Byte spans plus 1-based lines and character columns, so both machines and
//! editors can place it.

use serde::Serialize;

use crate::{Diagnostic, LineIndex, Severity, Span};

/// One diagnostic of one file, as printed by `--format json`.
#[derive(Debug, Serialize)]
pub struct JsonDiagnostic {
    pub file: String,
    pub code: &'static str,
    pub severity: Severity,
    pub message: String,
    pub help: Option<String>,
    pub labels: Vec<JsonLabel>,
}

/// A label: byte span, and 1-based line and column (in characters) of both ends.
#[derive(Debug, Serialize)]
pub struct JsonLabel {
    pub message: String,
    pub span: Span,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
}

impl JsonDiagnostic {
    pub fn new(file: &str, positions: &mut Positions<'_>, diagnostic: &Diagnostic) -> Self {
        let labels = diagnostic
            .labels
            .iter()
            .map(|label| {
                let (line, column) = positions.position(label.span.start);
                let (end_line, end_column) = positions.position(label.span.end);
                JsonLabel {
                    message: label.message.clone(),
                    span: label.span,
                    line,
                    column,
                    end_line,
                    end_column,
                }
            })
            .collect();
        JsonDiagnostic {
            file: file.to_string(),
            code: diagnostic.code,
            severity: diagnostic.severity,
            message: diagnostic.message.clone(),
            help: diagnostic.help.clone(),
            labels,
        }
    }

    /// Each of `diagnostics` of `source`, in order.
    pub fn all(file: &str, source: &str, diagnostics: &[Diagnostic]) -> Vec<Self> {
        let mut positions = Positions::new(source);
        diagnostics
            .iter()
            .map(|diagnostic| Self::new(file, &mut positions, diagnostic))
            .collect()
    }
}

/// 1-based lines and character columns of byte offsets in one text. Offsets asked in increasing
/// order on a line (a file's diagnostics, in source order) count the characters between them
/// only, so a file's positions take time linear in its size even when it is one long line.
pub struct Positions<'a> {
    source: &'a str,
    lines: LineIndex,
    /// The last offset asked for and its zero-based line and character column.
    last: Option<(usize, usize, usize)>,
}

impl<'a> Positions<'a> {
    pub fn new(source: &'a str) -> Self {
        Self {
            source,
            lines: LineIndex::new(source),
            last: None,
        }
    }

    /// 1-based line and character column of a byte offset.
    pub fn position(&mut self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.source.len());
        let (line, byte_column) = self.lines.line_col(offset);
        let (from, column_there) = match self.last {
            Some((last, last_line, column)) if last_line == line && last <= offset => {
                (last, column)
            }
            _ => (offset - byte_column, 0),
        };
        // An offset inside a multi-byte character (never produced by the parser) counts in bytes.
        let column = column_there
            + self
                .source
                .get(from..offset)
                .map_or(offset - from, |between| between.chars().count());
        self.last = Some((offset, line, column));
        (line + 1, column + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let source = "ab\nçé<x>\n";
        let mut positions = Positions::new(source);
        assert_eq!(positions.position(0), (1, 1));
        assert_eq!(positions.position(3), (2, 1));
        // `<` follows two 2-byte characters: byte 7, column 3.
        assert_eq!(positions.position(7), (2, 3));
        assert_eq!(positions.position(8), (2, 4));
        // Backwards on the same line: counted from the line's start again.
        assert_eq!(positions.position(5), (2, 2));
        assert_eq!(positions.position(999), (3, 1));
    }

    #[test]
    fn positions_on_one_long_line_take_linear_time() {
        // 200,000 offsets on one line of 2 MB: counted from the line's start each time, this
        // would count 2e11 characters.
        let source = "é".repeat(1_000_000);
        let mut positions = Positions::new(&source);
        let mut columns = 0;
        for offset in (0..source.len()).step_by(10) {
            columns += positions.position(offset).1;
        }
        assert_eq!(
            columns,
            (0..source.len()).step_by(10).map(|o| o / 2 + 1).sum()
        );
    }
}
