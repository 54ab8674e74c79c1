//! Sources the unit tests of more than one module share, and parsing them with no syntax
//! errors. Here rather than in one module's tests so that another module's tests need not reach
//! into it.

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
