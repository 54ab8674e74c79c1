//! Syntax of the Prompt Markup Language: lexer, error-recovering parser, typed AST with byte spans,
//! text dedenting and diagnostics.
//!
//! Architecture invariant: this crate knows nothing of models, tokenizers, tensors, LSP or HTTP.
//! Parsing never fails: [`parse`] always returns a tree plus the diagnostics found on the way.
//!
//! Pipeline: `lexer` (content mode / tag mode) → `tree` (generic elements, recovery, text runs)
//! → `lower` (typed [`ast`]). Every syntax code is documented in [`SYNTAX_RULES`].

pub mod ast;
pub mod diagnostic;
pub mod dump;
pub mod json;
mod lexer;
mod lower;
pub mod names;
mod parse;
pub mod render;
pub mod root_tag;
pub mod rules;
pub mod shown;
pub mod span;
pub mod text;
mod tree;

pub use diagnostic::{Diagnostic, Label, Rule, Severity};
pub use parse::{Parse, parse};
pub use render::render;
pub use rules::{SYNTAX_RULES, syntax_rule};
pub use shown::{DEFAULT_MAX_SHOWN, Omitted, first_shown, plural};
pub use span::{LineIndex, Span};
