//! Text as editors and tools write it: a UTF-8 byte-order mark is skipped (spans still count from
//! the file's first byte), NUL characters are reported once with their count.

use pml_syntax::parse;

#[test]
fn a_byte_order_mark_is_skipped() {
    let source = "\u{feff}<schema name=\"s\"><module name=\"m\">text</module></schema>";
    let parsed = parse(source);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    // Without the mark, the same tree; and a diagnostic's span is an offset into the file as
    // given, mark included.
    let broken = parse("\u{feff}<schema name=\"s\"><module name=\"m\">text</schema>");
    let span = broken.diagnostics[0].primary_span().expect("a span");
    assert!(span.start >= '\u{feff}'.len_utf8(), "{span:?}");
    // A mark anywhere else is text, as before.
    let inside = parse("<schema name=\"s\">\u{feff}<module name=\"m\">text</module></schema>");
    assert!(inside.diagnostics.iter().all(|d| d.code != "PML018"));
}

#[test]
fn nul_characters_are_reported_once_with_their_count() {
    let source = "<schema name=\"s\"><module name=\"m\">a\0b\0c\0</module></schema>";
    let parsed = parse(source);
    let nul: Vec<_> = parsed
        .diagnostics
        .iter()
        .filter(|diagnostic| diagnostic.code == "PML018")
        .collect();
    assert_eq!(nul.len(), 1, "{:?}", parsed.diagnostics);
    assert!(nul[0].message.contains("3 NUL"), "{}", nul[0].message);
    assert_eq!(
        nul[0].primary_span().map(|span| span.start),
        source.find('\0')
    );
    assert!(!parsed.has_errors());
    assert!(parse("<schema name=\"s\"/>").diagnostics.is_empty());
}
