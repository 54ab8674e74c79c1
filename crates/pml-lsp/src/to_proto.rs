//! Diagnostics leaving the server: a compiler [`Diagnostic`] as an LSP diagnostic with the same
//! code and message as `pmlc check`; the primary label gives the range, the other labels and the
//! help text become related information so editors show them next to the message.

use crate::line_map::LineMap;
use lsp_types::{
    DiagnosticRelatedInformation, DiagnosticSeverity, Location, NumberOrString, Range, Uri,
};
use pml_syntax::{Diagnostic, Severity, Span};

/// An information diagnostic at the first diagnostic left out, saying how many were.
pub fn omitted_note(
    text: &str,
    lines: &LineMap,
    first_left_out: Option<Span>,
    note: String,
) -> lsp_types::Diagnostic {
    lsp_types::Diagnostic {
        range: lines.range(text, first_left_out.unwrap_or(Span::new(0, 0))),
        severity: Some(DiagnosticSeverity::INFORMATION),
        source: Some("pml".to_string()),
        message: format!(
            "{note}: fix the ones above first (`pmlc check --max-diagnostics 0` lists them all)"
        ),
        ..lsp_types::Diagnostic::default()
    }
}

pub fn diagnostic(
    uri: &Uri,
    text: &str,
    lines: &LineMap,
    diagnostic: &Diagnostic,
) -> lsp_types::Diagnostic {
    let primary = diagnostic.primary_span().unwrap_or(Span::new(0, 0));
    let range = lines.range(text, primary);
    let location = |range: Range| Location::new(uri.clone(), range);
    let mut related: Vec<DiagnosticRelatedInformation> = diagnostic
        .labels
        .iter()
        .filter(|label| !label.message.is_empty())
        .map(|label| DiagnosticRelatedInformation {
            location: location(lines.range(text, label.span)),
            message: label.message.clone(),
        })
        .collect();
    if let Some(help) = &diagnostic.help {
        related.push(DiagnosticRelatedInformation {
            location: location(range),
            message: format!("help: {help}"),
        });
    }
    lsp_types::Diagnostic {
        range,
        severity: Some(match diagnostic.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(diagnostic.code.to_string())),
        source: Some("pml".to_string()),
        message: diagnostic.message.clone(),
        related_information: (!related.is_empty()).then_some(related),
        ..lsp_types::Diagnostic::default()
    }
}
