//! Diagnostics shared by every stage (parser, checker, binder, language server): a stable code,
//! a severity, a message, labelled spans and a help text. Rendering with miette lives in `render`.

use crate::span::Span;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// A span with a short message drawn under it. The first label is the primary one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// Stable code, e.g. `PML101`; documented in `docs/diagnostics.md` and by `pmlc explain`.
    pub code: &'static str,
    pub severity: Severity,
    /// What is wrong, one sentence, no trailing period.
    pub message: String,
    pub labels: Vec<Label>,
    /// What to do about it.
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            labels: Vec::new(),
            help: None,
        }
    }

    pub fn warning(code: &'static str, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Warning,
            message: message.into(),
            labels: Vec::new(),
            help: None,
        }
    }

    pub fn with_label(mut self, span: Span, message: impl Into<String>) -> Self {
        self.labels.push(Label {
            span,
            message: message.into(),
        });
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Span of the primary label, if any.
    pub fn primary_span(&self) -> Option<Span> {
        self.labels.first().map(|label| label.span)
    }
}

/// One documented rule: the registry from which `docs/diagnostics.md` is checked and
/// `pmlc explain CODE` prints. Every code a stage emits must appear in its stage's rule table.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub code: &'static str,
    /// kebab-case name, e.g. `unclosed-tag`.
    pub name: &'static str,
    pub severity: Severity,
    /// What it does (one line).
    pub summary: &'static str,
    /// Why is this bad?
    pub why: &'static str,
    /// A minimal PML example that triggers it.
    pub example: &'static str,
}
