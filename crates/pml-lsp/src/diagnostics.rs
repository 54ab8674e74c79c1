//! A document's diagnostics as the editor shows them: each compiler [`pml_syntax::Diagnostic`]
//! with the same code and message as `pmlc check`; the primary label gives the range, the other
//! labels and the help text become related information so editors show them next to the
//! message. A flood is capped, with a note saying how many were left out.

use crate::document::Document;
use crate::location::{Location, Range};
use crate::uri::DocumentUri;
use pml_syntax::{Severity, Span};

/// Diagnostics published per document: a file with 50,000 of them would be tens of megabytes of
/// JSON on every keystroke, and a problems panel of 50,000 entries helps no one.
const MAX_PUBLISHED: usize = 4 * pml_syntax::DEFAULT_MAX_SHOWN;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiagnosticSeverity {
    Error,
    Warning,
    /// Only the note about diagnostics left out: the compiler has no such severity.
    Information,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub range: Range,
    pub severity: DiagnosticSeverity,
    /// `PML0xx`..`PML2xx`; `None` for the note about diagnostics left out.
    pub code: Option<String>,
    pub message: String,
    pub related: Vec<RelatedInformation>,
}

/// A secondary label, or the help text at the primary range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelatedInformation {
    pub location: Location,
    pub message: String,
}

/// The first [`MAX_PUBLISHED`] of `diagnostics` (the compiler's, for the open document at
/// `uri`), then a note if any were left out.
pub fn for_document(
    uri: &DocumentUri,
    document: &Document,
    diagnostics: &[pml_syntax::Diagnostic],
) -> Vec<Diagnostic> {
    let (shown, omitted) = pml_syntax::first_shown(diagnostics, MAX_PUBLISHED);
    let mut published: Vec<Diagnostic> = shown
        .iter()
        .map(|diagnostic| convert(uri, document, diagnostic))
        .collect();
    if let Some(note) = omitted.describe() {
        let first_left_out = diagnostics[shown.len()].primary_span();
        published.push(omitted_note(document, first_left_out, note));
    }
    published
}

fn convert(
    uri: &DocumentUri,
    document: &Document,
    diagnostic: &pml_syntax::Diagnostic,
) -> Diagnostic {
    let range_of = |span| document.lines().range(document.text(), span);
    let range = range_of(diagnostic.primary_span().unwrap_or(Span::new(0, 0)));
    let related_at = |range, message| RelatedInformation {
        location: Location {
            uri: uri.clone(),
            range,
        },
        message,
    };
    let mut related: Vec<RelatedInformation> = diagnostic
        .labels
        .iter()
        .filter(|label| !label.message.is_empty())
        .map(|label| related_at(range_of(label.span), label.message.clone()))
        .collect();
    if let Some(help) = &diagnostic.help {
        related.push(related_at(range, format!("help: {help}")));
    }
    Diagnostic {
        range,
        severity: match diagnostic.severity {
            Severity::Error => DiagnosticSeverity::Error,
            Severity::Warning => DiagnosticSeverity::Warning,
        },
        code: Some(diagnostic.code.to_string()),
        message: diagnostic.message.clone(),
        related,
    }
}

/// An information diagnostic at the first diagnostic left out, saying how many were.
fn omitted_note(document: &Document, first_left_out: Option<Span>, note: String) -> Diagnostic {
    Diagnostic {
        range: document
            .lines()
            .range(document.text(), first_left_out.unwrap_or(Span::new(0, 0))),
        severity: DiagnosticSeverity::Information,
        code: None,
        message: format!(
            "{note}: fix the ones above first (`pmlc check --max-diagnostics 0` lists them all)"
        ),
        related: Vec::new(),
    }
}
