//! Unit tests of the checker: one test per rule and case, on small sources parsed by the real
//! parser. Helpers assert that the source parses cleanly, so a test cannot pass because of a
//! syntax error.

mod prompt_tests;
mod schema_tests;
mod source_tests;

use crate::source_loader::{MemorySourceLoader, SourceLoader};
use crate::test_sources::parse_schema;
use crate::testing::FnTokenizer;
use pml_syntax::Diagnostic;

/// Diagnostics of a schema whose `src` files come from `loader`.
pub(crate) fn schema_diagnostics_with(source: &str, loader: &dyn SourceLoader) -> Vec<Diagnostic> {
    super::check_schema(&parse_schema(source), loader).diagnostics
}

pub(crate) fn schema_diagnostics(source: &str) -> Vec<Diagnostic> {
    schema_diagnostics_with(source, &MemorySourceLoader::new())
}

pub(crate) fn codes(diagnostics: &[Diagnostic]) -> Vec<&'static str> {
    diagnostics
        .iter()
        .map(|diagnostic| diagnostic.code)
        .collect()
}

/// The text under a diagnostic's primary label.
pub(crate) fn primary_text<'a>(source: &'a str, diagnostic: &Diagnostic) -> &'a str {
    let span = diagnostic.primary_span().expect("diagnostic has a label");
    &source[span.start..span.end]
}

/// One token per whitespace-separated word, the word's length as its id: lengths easy to count by
/// eye.
pub(crate) const WORD_LENGTH_TOKENIZER: FnTokenizer = FnTokenizer::new(
    |text| {
        text.split_whitespace()
            .map(|word| word.len() as u32)
            .collect()
    },
    |ids| {
        ids.iter()
            .map(|id| "x".repeat(*id as usize))
            .collect::<Vec<_>>()
            .join(" ")
    },
    1,
);
