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
    pub fn new(file: &str, source: &str, line_index: &LineIndex, diagnostic: &Diagnostic) -> Self {
        let labels = diagnostic
            .labels
            .iter()
            .map(|label| {
                let (line, column) = position(source, line_index, label.span.start);
                let (end_line, end_column) = position(source, line_index, label.span.end);
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
}

/// 1-based line and character column of a byte offset.
fn position(source: &str, line_index: &LineIndex, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let (line, byte_column) = line_index.line_col(offset);
    let line_start = offset - byte_column;
    // An offset inside a multi-byte character (never produced by the parser) counts in bytes.
    let column = source
        .get(line_start..offset)
        .map_or(byte_column, |prefix| prefix.chars().count());
    (line + 1, column + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based_and_count_characters() {
        let source = "ab\nçé<x>\n";
        let index = LineIndex::new(source);
        assert_eq!(position(source, &index, 0), (1, 1));
        assert_eq!(position(source, &index, 3), (2, 1));
        // `<` follows two 2-byte characters: byte 7, column 3.
        assert_eq!(position(source, &index, 7), (2, 3));
        assert_eq!(position(source, &index, 999), (3, 1));
    }
}
