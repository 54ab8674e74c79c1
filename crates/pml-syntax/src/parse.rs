//! The parser's entry point: lex, build the element tree with recovery, lower it to the typed
//! AST. It never fails and never panics; problems come back as diagnostics next to the tree.

use crate::ast::SourceFile;
use crate::diagnostic::Diagnostic;
use crate::span::Span;
use crate::{lower, rules, tree};

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

/// One warning for the NUL characters of `source`: where the first is, how many there are.
fn warn_of_nul_characters(source: &str, diagnostics: &mut Vec<Diagnostic>) {
    let mut nuls = source.match_indices('\0').map(|(offset, _)| offset);
    let Some(first) = nuls.next() else {
        return;
    };
    let count = 1 + nuls.count();
    let message = match count {
        1 => "the text contains a NUL character (U+0000)".to_string(),
        n => format!("the text contains {n} NUL characters (U+0000)"),
    };
    diagnostics.push(
        Diagnostic::warning(rules::NUL_CHARACTER, message)
            .with_label(Span::new(first, first + 1), "the first one")
            .with_help(
                "remove it: NULs usually come from a binary file or a broken conversion, and the \
                 model would see them",
            ),
    );
}

pub fn parse(source: &str) -> Parse {
    let mut diagnostics = Vec::new();
    let document = tree::build(source, &mut diagnostics);
    let file = lower::lower(document, &mut diagnostics);
    warn_of_nul_characters(source, &mut diagnostics);
    // Stable: diagnostics at the same place keep the order in which they were found.
    diagnostics.sort_by_key(|diagnostic| {
        diagnostic
            .primary_span()
            .map_or(usize::MAX, |span| span.start)
    });
    Parse { file, diagnostics }
}
