//! The parser's entry point: lex, build the element tree with recovery, lower it to the typed
//! AST. It never fails and never panics; problems come back as diagnostics next to the tree.

use crate::ast::SourceFile;
use crate::diagnostic::Diagnostic;
use crate::{lower, tree};

/// The result of parsing one file: always a tree, plus the syntax diagnostics in source order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parse {
    pub file: SourceFile,
    pub diagnostics: Vec<Diagnostic>,
}

impl Parse {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

pub fn parse(source: &str) -> Parse {
    let mut diagnostics = Vec::new();
    let document = tree::build(source, &mut diagnostics);
    let file = lower::lower(document, &mut diagnostics);
    // Stable: diagnostics at the same place keep the order in which they were found.
    diagnostics.sort_by_key(|diagnostic| {
        diagnostic
            .primary_span()
            .map_or(usize::MAX, |span| span.start)
    });
    Parse { file, diagnostics }
}
