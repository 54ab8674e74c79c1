//! Syntax of the Prompt Markup Language: lexer, error-recovering parser, typed AST with byte spans,
//! text dedenting and diagnostics.
//!
//! Architecture invariant: this crate knows nothing of models, tokenizers, tensors, LSP or HTTP.
//! Parsing never fails: [`parse`] always returns a tree plus the diagnostics found on the way.

pub mod ast;
pub mod diagnostic;
pub mod span;

pub use diagnostic::{Diagnostic, Label, Rule, Severity};
pub use span::{LineIndex, Span};
