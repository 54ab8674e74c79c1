//! Diagnostics leaving the CLI: the JSON shape of `pmlc check --format json` (one place for the
//! conversion, like rust-analyzer's `to_proto`) and the summary line.

use pml_syntax::{Diagnostic, LineIndex, Severity, Span};
use serde::Serialize;

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

/// Error and warning totals over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub files: usize,
    pub errors: usize,
    pub warnings: usize,
}

impl Totals {
    pub fn add(&mut self, diagnostics: &[Diagnostic]) {
        self.files += 1;
        for diagnostic in diagnostics {
            match diagnostic.severity {
                Severity::Error => self.errors += 1,
                Severity::Warning => self.warnings += 1,
            }
        }
    }

    /// `checked 3 files: 0 errors, 1 warning`.
    pub fn summary(&self) -> String {
        format!(
            "checked {}: {}, {}",
            plural(self.files, "file"),
            plural(self.errors, "error"),
            plural(self.warnings, "warning")
        )
    }
}

fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("1 {noun}")
    } else {
        format!("{count} {noun}s")
    }
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

    #[test]
    fn summary_pluralises() {
        let mut totals = Totals::default();
        assert_eq!(totals.summary(), "checked 0 files: 0 errors, 0 warnings");
        totals.add(&[Diagnostic::warning("PML105", "w")]);
        assert_eq!(totals.summary(), "checked 1 file: 0 errors, 1 warning");
        totals.add(&[
            Diagnostic::error("PML101", "e"),
            Diagnostic::error("PML102", "e"),
        ]);
        assert_eq!(totals.summary(), "checked 2 files: 2 errors, 1 warning");
    }

    #[test]
    fn json_shape() {
        let source = "<prompt>\n  <x/>\n</prompt>";
        let diagnostic = Diagnostic::error("PML205", "unknown")
            .with_label(Span::new(12, 13), "here")
            .with_help("fix");
        let json = JsonDiagnostic::new("p.pml", source, &LineIndex::new(source), &diagnostic);
        let text = serde_json::to_string(&json).expect("serialise");
        assert!(
            text.starts_with(r#"{"file":"p.pml","code":"PML205","severity":"error""#),
            "fields in a stable order: {text}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).expect("parse back");
        assert_eq!(
            value,
            serde_json::json!({
                "file": "p.pml", "code": "PML205", "severity": "error", "message": "unknown", "help": "fix",
                "labels": [{"message": "here", "span": {"start": 12, "end": 13},
                            "line": 2, "column": 4, "end_line": 2, "end_column": 5}]
            })
        );
    }
}
