//! Megabyte inputs built to make the parser slow or its diagnostics huge: a file of unterminated
//! `<!--`, `<?` or `<![CDATA[` once took minutes (each opener searched the rest of the file for its
//! closer) and gave one diagnostic per opener. These parse in a debug build in well under a second
//! now; a quadratic parser would take minutes on them. The tests assert what is reported, and
//! that it stays a handful of diagnostics whatever the input's length.

use pml_syntax::{Diagnostic, parse};

const MEGABYTE: usize = 1_000_000;

fn repeated(opener: &str) -> String {
    opener.repeat(MEGABYTE / opener.len())
}

fn codes(diagnostics: &[Diagnostic]) -> Vec<&str> {
    diagnostics
        .iter()
        .map(|diagnostic| diagnostic.code)
        .collect()
}

#[test]
fn unterminated_comments_are_reported_once() {
    let source = repeated("<!--");
    let parsed = parse(&source);
    assert_eq!(codes(&parsed.diagnostics), ["PML006", "PML012"]);
    assert_eq!(
        parsed.diagnostics[0].message,
        format!(
            "comment is never closed, nor are the {} `<!--` after it",
            source.len() / 4 - 1
        )
    );
    assert_eq!(
        parsed.diagnostics[0].primary_span(),
        Some(pml_syntax::Span::new(0, 4))
    );
}

#[test]
fn unterminated_cdata_sections_are_reported_once() {
    let source = repeated("<![CDATA[");
    let parsed = parse(&source);
    assert_eq!(codes(&parsed.diagnostics), ["PML007", "PML012"]);
    assert!(
        parsed.diagnostics[0]
            .message
            .starts_with("CDATA section is never closed, nor are the ")
    );
}

#[test]
fn unterminated_processing_instructions_are_one_run_of_text() {
    let source = repeated("<?");
    let parsed = parse(&source);
    assert_eq!(codes(&parsed.diagnostics), ["PML014", "PML012"]);
}

#[test]
fn inside_the_root_the_diagnostics_stay_few() {
    for opener in ["<!--", "<?", "<![CDATA["] {
        let source = format!("<prompt schema=\"s\">{}", repeated(opener));
        let parsed = parse(&source);
        assert!(
            parsed.diagnostics.len() <= 3,
            "{opener}: {:?}",
            codes(&parsed.diagnostics)
        );
        // A run of stray `<` is one warning whose labels are the first few, not one per `<`.
        assert!(
            parsed
                .diagnostics
                .iter()
                .all(|diagnostic| diagnostic.labels.len() <= 8),
            "{opener}"
        );
    }
}

#[test]
fn a_closed_comment_after_unterminated_openers_of_other_kinds_is_a_comment() {
    let source = format!(
        "<prompt schema=\"s\">{}<!-- kept out -->text</prompt>",
        "<?".repeat(1000)
    );
    let parsed = parse(&source);
    assert!(!codes(&parsed.diagnostics).contains(&"PML006"));
}
