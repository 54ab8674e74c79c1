//! Unit tests of the checker: one test per rule and case, on small sources parsed by the real
//! parser. Helpers assert that the source parses cleanly, so a test cannot pass because of a
//! syntax error.

mod prompt_tests;
mod schema_tests;
mod source_tests;

use crate::source_loader::{MemorySourceLoader, SourceLoader};
use crate::testing::FnTokenizer;
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Prompt, Schema, SourceFile};

/// The file `source` parses to, which must parse without diagnostics.
fn parse_clean(source: &str) -> SourceFile {
    let parse = pml_syntax::parse(source);
    assert!(
        parse.diagnostics.is_empty(),
        "syntax diagnostics in test source: {:#?}",
        parse.diagnostics
    );
    parse.file
}

pub(crate) fn parse_schema(source: &str) -> Schema {
    match parse_clean(source) {
        SourceFile::Schema(schema) => schema,
        other => panic!("not a schema: {other:?}"),
    }
}

pub(crate) fn parse_prompt(source: &str) -> Prompt {
    match parse_clean(source) {
        SourceFile::Prompt(prompt) => prompt,
        other => panic!("not a prompt: {other:?}"),
    }
}

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

/// The travel schema of design §2, extended with a collection, a `<user>` block left open for
/// the prompt to close, and a module after the plan, for prompt tests.
pub(crate) const TRAVEL: &str = r#"<schema name="travel">
  <system>You plan trips.</system>
  <user>
    <module name="travel-plan">
      A trip of <param name="duration" len="3"/>.
      <union default="domestic">
        <module name="domestic">The city of <param name="city" len="2"/>.</module>
        <module name="overseas">
          <union>
            <module name="tokyo">Tokyo.</module>
            <module name="rome">Rome.</module>
          </union>
        </module>
      </union>
    </module>
    <collection name="notes">
      <module name="note-food">Food.</module>
      <module name="note-sleep">Sleep.</module>
    </collection>
    <module name="packing-list">Pack light.</module>
</schema>"#;
