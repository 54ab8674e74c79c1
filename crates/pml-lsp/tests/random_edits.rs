//! Property: random incremental edits — insertions and deletions of PML-ish fragments (tags,
//! half tags, quotes, entities, multi-byte and astral characters) at random UTF-16 positions,
//! including positions inside surrogate pairs and past line ends — never make the server panic,
//! and the document always equals a reference model that applies the same edits to UTF-16 code
//! units. After every edit, every feature runs at a random position.

use pml_lsp::testing::EDIT_FRAGMENTS as FRAGMENTS;
use pml_lsp::{DocumentUri, LanguageService, ModelAvailability, Position, Range, TextChange};
use proptest::prelude::*;

const SCHEMA: &str = "<schema name=\"s\">\n  <module name=\"m\">Text <param name=\"p\" len=\"3\"/>\n    <union><module name=\"a\">A</module><module name=\"b\">B</module></union>\n  </module>\n  <collection name=\"c\"><module name=\"c1\">é</module></collection>\n</schema>\n";
const PROMPT: &str = "<prompt schema=\"s\">\n  <m p=\"𝄞 x\"><a/></m>\n  <c1/><c1/>\n</prompt>\n";

#[derive(Clone, Debug)]
struct Edit {
    /// Target document: 0 the schema, 1 the prompt.
    document: usize,
    start: (u32, u32),
    end: (u32, u32),
    text: String,
}

fn edit() -> impl Strategy<Value = Edit> {
    (
        0..2usize,
        (0..8u32, 0..60u32),
        (0..3u32, 0..30u32),
        prop::collection::vec(prop::sample::select(FRAGMENTS), 0..4),
    )
        .prop_map(|(document, start, (lines, columns), fragments)| Edit {
            document,
            start,
            end: (
                start.0 + lines,
                if lines == 0 {
                    start.1 + columns
                } else {
                    columns
                },
            ),
            text: fragments.concat(),
        })
}

/// The reference model: lines of UTF-16 code units; positions clamp as LSP says (to the end of
/// the line, before `\r\n` or `\n`), and a position inside a surrogate pair moves to the pair's
/// start (as the server does).
fn offset_in(units: &[u16], (line, character): (u32, u32)) -> usize {
    let mut start = 0;
    for _ in 0..line {
        match units[start..]
            .iter()
            .position(|&unit| unit == u16::from(b'\n'))
        {
            Some(newline) => start += newline + 1,
            None => return units.len(),
        }
    }
    let mut end = units[start..]
        .iter()
        .position(|&unit| unit == u16::from(b'\n'))
        .map_or(units.len(), |newline| start + newline);
    if end > start && end < units.len() && units[end - 1] == u16::from(b'\r') {
        end -= 1;
    }
    let mut offset = (start + character as usize).min(end);
    if offset < units.len() && (0xDC00..0xE000).contains(&units[offset]) && offset > start {
        offset -= 1;
    }
    offset
}

fn apply_reference(text: &str, edit: &Edit) -> String {
    let mut units: Vec<u16> = text.encode_utf16().collect();
    let a = offset_in(&units, edit.start);
    let b = offset_in(&units, edit.end);
    let (a, b) = (a.min(b), a.max(b));
    units.splice(a..b, edit.text.encode_utf16());
    String::from_utf16(&units).expect("edits keep surrogate pairs whole")
}

fn exercise(service: &LanguageService, uri: &DocumentUri, position: Position) {
    let _ = service.diagnostics(uri).expect("open");
    let _ = service.hover(uri, position);
    let _ = service.definition(uri, position);
    let _ = service.references(uri, position, true);
    let _ = service.completion(uri, position);
    let _ = service.document_symbols(uri);
    let _ = service.folding_ranges(uri);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_edits_never_panic(edits in prop::collection::vec(edit(), 1..24), probe in (0..8u32, 0..60u32)) {
        let uris = [
            DocumentUri::new("untitled:schema.pml"),
            DocumentUri::new("untitled:prompt.pml"),
        ];
        let mut texts = [SCHEMA.to_string(), PROMPT.to_string()];
        let mut service = LanguageService::new(ModelAvailability::Unavailable { reason: "test".into() });
        for (uri, text) in uris.iter().zip(&texts) {
            service.open(uri.clone(), text.clone(), 0);
        }
        for (version, edit) in edits.iter().enumerate() {
            let uri = &uris[edit.document];
            let change = TextChange {
                range: Some(Range::new(
                    Position::new(edit.start.0, edit.start.1),
                    Position::new(edit.end.0, edit.end.1),
                )),
                text: edit.text.clone(),
            };
            prop_assert!(service.change(uri, version as i32 + 1, vec![change]));
            texts[edit.document] = apply_reference(&texts[edit.document], edit);
            prop_assert_eq!(service.text(uri), Some(texts[edit.document].as_str()));
            for uri in &uris {
                exercise(&service, uri, Position::new(probe.0, probe.1));
                exercise(&service, uri, Position::new(edit.start.0, edit.start.1));
            }
        }
    }
}
