//! Diagnostics leaving the CLI: the JSON shape of `pmlc check --format json` (defined in
//! `pml_syntax::json`, shared with the server's error responses) and the summary line.

pub use pml_syntax::json::{JsonDiagnostic, JsonLabel};
use pml_syntax::{Diagnostic, Severity, plural};

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

#[cfg(test)]
mod tests {
    use pml_syntax::Span;
    use pml_syntax::json::Positions;

    use super::*;

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
        let json = JsonDiagnostic::new("p.pml", &mut Positions::new(source), &diagnostic);
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
