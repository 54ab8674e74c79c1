//! Tokenizing one piece of schema or prompt text, with the failure as a diagnostic at the piece's
//! source span (shared by layout and binding).

use crate::rules::{self, diagnostic};
use crate::tokenizer::Tokenizer;
use pml_syntax::{Diagnostic, Span};

/// Whether control-token spellings in the text become control tokens: only in chat-template
/// strings, never in user text (which must not forge them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TextKind {
    /// Schema or prompt text, scaffolds and arguments.
    Plain,
    /// Role open/close strings and the generation prompt.
    Template,
}

/// Tokens of `text`; `what` names the piece in the error message ("text", "argument `city`").
pub(crate) fn encode(
    tokenizer: &dyn Tokenizer,
    text: &str,
    kind: TextKind,
    span: Span,
    what: &str,
) -> Result<Vec<u32>, Diagnostic> {
    tokenizer
        .encode(text, kind == TextKind::Template)
        .map_err(|error| {
            diagnostic(
                &rules::TOKENIZER_FAILED,
                format!("the tokenizer cannot encode this {what}: {}", error.0),
            )
            .with_label(span, "not tokenized")
            .with_help(
                "check that the model file is intact (fetch it again with `pml models fetch`)",
            )
        })
}
