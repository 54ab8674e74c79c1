//! The language features through [`LanguageService`], on a schema on disk and prompts open in the
//! editor (and an open, unsaved schema taking precedence over the disk): diagnostics with the
//! `pmlc check` codes, hover, definition, references, completion respecting nesting and unions,
//! document symbols and folding ranges.

use pml_lsp::uri::from_path;
use pml_lsp::{
    CompletionItem, DiagnosticSeverity, DocumentUri, LanguageService, ModelAvailability, Position,
    Range, TextChange,
};
use std::path::Path;

const SCHEMA: &str = r#"<schema name="travel">
  <user>
    <module name="plan">
      A trip of <param name="duration" len="6">one week</param>.
      <union>
        <module name="domestic">City: <param name="city" len="10"/></module>
        <module name="overseas">
          Abroad.
          <union>
            <module name="tokyo">Tokyo.</module>
            <module name="rome">Rome.</module>
          </union>
        </module>
      </union>
      <collection name="notes">
        <module name="note">A note.</module>
      </collection>
    </module>
    <module name="extra">More.</module>
  </user>
</schema>
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    service: LanguageService,
    schema: DocumentUri,
    prompt: DocumentUri,
}

fn fixture(prompt: &str) -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema_path = dir.path().join("travel.pml");
    std::fs::write(&schema_path, SCHEMA).expect("write schema");
    let mut service = LanguageService::new(ModelAvailability::Unavailable {
        reason: "no model in this test".to_string(),
    });
    let prompt_uri = uri_of(&dir.path().join("trip.pml"));
    service.open(prompt_uri.clone(), prompt.to_string(), 1);
    Fixture {
        schema: uri_of(&schema_path),
        prompt: prompt_uri,
        service,
        _dir: dir,
    }
}

fn uri_of(path: &Path) -> DocumentUri {
    from_path(path).expect("absolute temp path")
}

fn codes(service: &LanguageService, uri: &DocumentUri) -> Vec<String> {
    let (diagnostics, _) = service.diagnostics(uri).expect("open document");
    diagnostics
        .into_iter()
        .filter_map(|diagnostic| diagnostic.code)
        .collect()
}

fn labels(items: &[CompletionItem]) -> Vec<&str> {
    items.iter().map(|item| item.label.as_str()).collect()
}

/// Line and UTF-16 column of the first `needle` in `text`, plus `delta` columns.
fn position_of(text: &str, needle: &str, delta: u32) -> Position {
    let offset = text.find(needle).expect("needle present");
    let line = text[..offset].matches('\n').count();
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..offset].encode_utf16().count();
    Position::new(line as u32, column as u32 + delta)
}

#[test]
fn diagnostics_come_from_the_schema_on_disk_then_from_the_open_document() {
    let prompt = "<prompt schema=\"travel\">\n  <plan><tokyo/></plan>\n</prompt>\n";
    let mut fx = fixture(prompt);
    // `tokyo` is nested in `overseas`.
    assert_eq!(codes(&fx.service, &fx.prompt), ["PML206"]);
    // Open the schema with `tokyo` moved up into `plan`: the open text wins over the disk.
    let edited = SCHEMA.replace(
        "<union>\n        <module name=\"domestic\">",
        "<module name=\"tokyo\">T.</module>\n      <union>\n        <module name=\"domestic\">",
    );
    fx.service.open(fx.schema.clone(), edited, 1);
    // The schema itself now declares `tokyo` twice, in different scopes: still clean.
    assert_eq!(codes(&fx.service, &fx.schema), Vec::<String>::new());
    assert_eq!(codes(&fx.service, &fx.prompt), Vec::<String>::new());
    fx.service.close(&fx.schema);
    assert_eq!(codes(&fx.service, &fx.prompt), ["PML206"]);
}

#[test]
fn a_prompt_finds_its_schema_in_an_xml_file() {
    // Prompt Cache's own files: `*.xml` schemas beside `*.xml` prompts.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("trips.xml"), SCHEMA).expect("write schema");
    let mut service = LanguageService::new(ModelAvailability::Unavailable {
        reason: "no model in this test".to_string(),
    });
    let prompt = uri_of(&dir.path().join("trip.xml"));
    service.open(
        prompt.clone(),
        "<prompt schema=\"travel\">\n  <plan><tokyo/></plan>\n</prompt>\n".to_string(),
        1,
    );
    assert_eq!(
        codes(&service, &prompt),
        ["PML206"],
        "checked against travel"
    );
}

#[test]
fn a_flood_of_diagnostics_is_capped_with_a_note() {
    let imports = "<plan></plan>".repeat(2_000);
    let fx = fixture(&format!("<prompt schema=\"travel\">{imports}</prompt>\n"));
    let (diagnostics, _) = fx.service.diagnostics(&fx.prompt).expect("open document");
    assert!(diagnostics.len() <= 201, "{}", diagnostics.len());
    let note = diagnostics.last().expect("a note");
    assert_eq!(note.severity, DiagnosticSeverity::Information);
    assert!(
        note.message.contains("more diagnostics"),
        "{}",
        note.message
    );
    assert!(note.message.contains("not shown"), "{}", note.message);
}

#[test]
fn hover_definition_and_references() {
    let prompt = "<prompt schema=\"travel\">\n  <plan duration=\"2 days\"><overseas><rome/></overseas></plan>\n</prompt>\n";
    let fx = fixture(prompt);
    let hover = fx
        .service
        .hover(&fx.prompt, position_of(prompt, "overseas>", 1))
        .expect("hover on an import");
    let markdown = hover.markdown;
    assert!(
        markdown.contains("**module `overseas`** — `plan › overseas`"),
        "{}",
        markdown
    );
    assert!(markdown.contains("no model in this test"), "{}", markdown);
    assert!(
        markdown.contains("I'm") || markdown.contains("Abroad."),
        "{}",
        markdown
    );

    let hover = fx
        .service
        .hover(&fx.prompt, position_of(prompt, "duration", 2))
        .expect("hover on an argument");
    let markdown = hover.markdown;
    assert!(markdown.contains("`len`: 6 tokens"), "{}", markdown);
    assert!(markdown.contains("one week"), "{}", markdown);

    let definition = fx
        .service
        .definition(&fx.prompt, position_of(prompt, "rome", 0))
        .expect("definition of an import");
    assert_eq!(definition.uri, fx.schema);
    let rome = position_of(SCHEMA, "rome\"", 0);
    assert_eq!(
        definition.range,
        Range::new(rome, Position::new(rome.line, rome.character + 4))
    );

    let definition = fx
        .service
        .definition(&fx.prompt, position_of(prompt, "travel", 0))
        .expect("definition of the schema name");
    assert_eq!(definition.uri, fx.schema);
    assert_eq!(definition.range.start, Position::new(0, 0));

    // References of `rome` from the prompt: its declaration and the import.
    let references = fx
        .service
        .references(&fx.prompt, position_of(prompt, "rome", 1), true);
    let found: Vec<(&str, u32)> = references
        .iter()
        .map(|location| (location.uri.as_str(), location.range.start.line))
        .collect();
    assert_eq!(
        found,
        [(fx.schema.as_str(), rome.line), (fx.prompt.as_str(), 1)]
    );
}

#[test]
fn completion_respects_nesting_unions_and_repeats() {
    let prompt = "<prompt schema=\"travel\">\n  <plan duration=\"x\" ><domestic/><note/>\n  </plan>\n  \n</prompt>\n";
    let fx = fixture(prompt);
    // Inside `plan`, after `<domestic/>`: the union is used (neither member again), `note` may
    // repeat (a collection member); top-level modules are not offered.
    let inside = position_of(prompt, "\n  </plan>", 0);
    let items = fx.service.completion(&fx.prompt, inside);
    assert_eq!(labels(&items), ["note"]);
    // At the top level, after `plan`: only `extra`.
    let top = position_of(prompt, "\n</prompt>", 0);
    let items = fx.service.completion(&fx.prompt, top);
    assert_eq!(labels(&items), ["extra"]);
    // Attributes of `plan`: `duration` is given already; `plan` has no other parameter.
    let attributes = position_of(prompt, " ><domestic", 1);
    assert_eq!(
        labels(&fx.service.completion(&fx.prompt, attributes)),
        Vec::<&str>::new()
    );
}

#[test]
fn completion_while_typing_a_tag_name() {
    let prompt = "<prompt schema=\"travel\">\n  <plan>\n  </plan>\n</prompt>\n";
    let mut fx = fixture(prompt);
    // Type `<o` inside `plan` (line 1, after `<plan>`).
    let change = TextChange {
        range: Some(Range::new(Position::new(1, 8), Position::new(1, 8))),
        text: "<o".to_string(),
    };
    assert!(fx.service.change(&fx.prompt, 2, vec![change]));
    let items = fx.service.completion(&fx.prompt, Position::new(1, 10));
    assert_eq!(labels(&items), ["domestic", "overseas", "note"]);
    assert_eq!(
        items[1].replace,
        Range::new(Position::new(1, 9), Position::new(1, 10))
    );
    assert_eq!(items[1].insert, "overseas");
}

#[test]
fn schema_completion_symbols_and_folding() {
    let prompt = "<prompt schema=\"travel\"/>\n";
    let mut fx = fixture(prompt);
    let text = SCHEMA.replace(
        "<module name=\"extra\">",
        "<union d><module name=\"extra\">",
    );
    fx.service.open(fx.schema.clone(), text.clone(), 1);
    let items = fx
        .service
        .completion(&fx.schema, position_of(&text, "d><module name=\"extra", 1));
    assert_eq!(labels(&items), ["default", "scaffold"]);
    let items = fx
        .service
        .completion(&fx.schema, position_of(&text, "nion d>", 0));
    assert!(
        labels(&items).contains(&"collection"),
        "{:?}",
        labels(&items)
    );

    fx.service.open(fx.schema.clone(), SCHEMA.to_string(), 2);
    let symbols = fx.service.document_symbols(&fx.schema);
    let names: Vec<&str> = symbols.iter().map(|symbol| symbol.name.as_str()).collect();
    assert_eq!(names, ["plan", "extra"]);
    let plan_children: Vec<&str> = symbols[0]
        .children
        .iter()
        .map(|symbol| symbol.name.as_str())
        .collect();
    assert_eq!(plan_children, ["duration", "union", "notes"]);
    let folds = fx.service.folding_ranges(&fx.schema);
    assert!(
        folds
            .iter()
            .any(|fold| fold.start_line == 2 && fold.end_line == 17),
        "{folds:?}"
    );
    let prompt_symbols = fx.service.document_symbols(&fx.prompt);
    assert!(prompt_symbols.is_empty());
}
