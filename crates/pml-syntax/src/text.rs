//! Text handling shared by text runs and attribute values: entity and character reference
//! decoding (`&lt;`, `&#60;`, `&#x3C;`), CRLF normalisation, and the dedent of design §2 that
//! lets prose and embedded code keep their shape once the file's indentation is removed.

use crate::diagnostic::Diagnostic;
use crate::rules;
use crate::span::Span;

/// Decodes the references in `raw` (which starts at byte `offset` of the source) and turns CRLF
/// into LF. Unknown or malformed references are kept literally and reported as warnings.
pub fn decode_entities(raw: &str, offset: usize) -> (String, Vec<Diagnostic>) {
    let mut decoded = String::with_capacity(raw.len());
    let mut diagnostics = Vec::new();
    decode_entities_into(raw, offset, &mut decoded, &mut diagnostics);
    (decoded, diagnostics)
}

/// [`decode_entities`] appending to `out`, so a text run of many pieces builds one string.
pub(crate) fn decode_entities_into(
    raw: &str,
    offset: usize,
    out: &mut String,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let mut copied_to = 0;
    while let Some(found) = raw[copied_to..].find(['&', '\r']) {
        let at = copied_to + found;
        out.push_str(&raw[copied_to..at]);
        if raw[at..].starts_with('\r') {
            if !raw[at..].starts_with("\r\n") {
                out.push('\r');
            }
            copied_to = at + 1;
            continue;
        }
        match scan_reference(&raw[at..]) {
            Reference::Decoded { len, character } => {
                out.push(character);
                copied_to = at + len;
            }
            Reference::Bad { len, problem } => {
                let span = Span::new(offset + at, offset + at + len);
                diagnostics.push(problem.diagnostic(&raw[at..at + len], span));
                out.push_str(&raw[at..at + len]);
                copied_to = at + len;
            }
            Reference::Plain => {
                out.push('&');
                copied_to = at + 1;
            }
        }
    }
    out.push_str(&raw[copied_to..]);
}

/// Normalises CRLF to LF in text that is not entity-decoded (CDATA).
pub(crate) fn push_normalising_newlines(raw: &str, out: &mut String) {
    let mut pieces = raw.split("\r\n");
    if let Some(first) = pieces.next() {
        out.push_str(first);
    }
    for piece in pieces {
        out.push('\n');
        out.push_str(piece);
    }
}

enum Reference {
    /// A well-formed reference of `len` bytes.
    Decoded { len: usize, character: char },
    /// Looks like a reference but is not a valid one; its first `len` bytes are kept as written.
    Bad {
        len: usize,
        problem: ReferenceProblem,
    },
    /// A lone `&` (as in `a && b` or `&mut x`): plain text, not worth a warning.
    Plain,
}

enum ReferenceProblem {
    UnknownName,
    MissingSemicolon,
    InvalidCharacter,
    MalformedCharacterReference,
}

impl ReferenceProblem {
    fn diagnostic(&self, written: &str, span: Span) -> Diagnostic {
        let (message, label, help) = match self {
            ReferenceProblem::UnknownName => (
                format!("unknown entity `{written}` is kept as written"),
                "unknown entity",
                "PML knows only `&lt;`, `&gt;`, `&amp;`, `&quot;` and `&apos;`: use a numeric \
                 reference such as `&#160;` for other characters, or write `&amp;` for a literal `&`",
            ),
            ReferenceProblem::MissingSemicolon => (
                format!("entity `{written}` has no closing `;` and is kept as written"),
                "missing `;`",
                "add `;` after the entity name, or write `&amp;` for a literal `&`",
            ),
            ReferenceProblem::InvalidCharacter => (
                format!(
                    "character reference `{written}` is not a valid character and is kept as written"
                ),
                "not a Unicode scalar value",
                "use the code point of a valid character, e.g. `&#60;` or `&#x3C;` for `<`",
            ),
            ReferenceProblem::MalformedCharacterReference => (
                format!("malformed character reference `{written}` is kept as written"),
                "expected digits and `;`",
                "write `&#` with decimal digits or `&#x` with hex digits, then `;`; or write \
                 `&amp;#` for a literal `&#`",
            ),
        };
        Diagnostic::warning(rules::BAD_ENTITY, message)
            .with_label(span, label)
            .with_help(help)
    }
}

/// Reads the reference at the start of `text`, which begins with `&`.
fn scan_reference(text: &str) -> Reference {
    let after_ampersand = &text[1..];
    if let Some(after_hash) = after_ampersand.strip_prefix('#') {
        let (digits_text, radix, prefix_len) = match after_hash.strip_prefix('x') {
            Some(hex) => (hex, 16, 3),
            None => (after_hash, 10, 2),
        };
        let digits_len = digits_text
            .bytes()
            .take_while(|byte| (*byte as char).is_digit(radix))
            .count();
        let end = prefix_len + digits_len;
        if digits_len == 0 || !text[end..].starts_with(';') {
            return Reference::Bad {
                len: end,
                problem: ReferenceProblem::MalformedCharacterReference,
            };
        }
        let character = u32::from_str_radix(&digits_text[..digits_len], radix)
            .ok()
            .filter(|code| *code != 0)
            .and_then(char::from_u32);
        return match character {
            Some(character) => Reference::Decoded {
                len: end + 1,
                character,
            },
            None => Reference::Bad {
                len: end + 1,
                problem: ReferenceProblem::InvalidCharacter,
            },
        };
    }
    let name_len = after_ampersand
        .bytes()
        .enumerate()
        .take_while(|(index, byte)| {
            if *index == 0 {
                byte.is_ascii_alphabetic()
            } else {
                byte.is_ascii_alphanumeric()
            }
        })
        .count();
    if name_len == 0 {
        return Reference::Plain;
    }
    let name = &after_ampersand[..name_len];
    let known = named_entity(name);
    if after_ampersand[name_len..].starts_with(';') {
        return match known {
            Some(character) => Reference::Decoded {
                len: name_len + 2,
                character,
            },
            None => Reference::Bad {
                len: name_len + 2,
                problem: ReferenceProblem::UnknownName,
            },
        };
    }
    match known {
        Some(_) => Reference::Bad {
            len: name_len + 1,
            problem: ReferenceProblem::MissingSemicolon,
        },
        None => Reference::Plain,
    }
}

fn named_entity(name: &str) -> Option<char> {
    match name {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        _ => None,
    }
}

/// Dedents a text run (design §2):
/// 1. a run with no newline is kept verbatim, even if it is only whitespace;
/// 2. otherwise, split on `\n`: a whitespace-only first line is dropped with the blank lines after
///    it; a first line with content is kept verbatim (it continues the line of the preceding tag)
///    and takes no part in the indentation; trailing whitespace-only lines are dropped; the common
///    leading spaces/tabs of the remaining non-blank lines are removed; whitespace-only lines in
///    the middle become empty.
pub fn dedent(text: &str) -> String {
    dedent_dropping_comment_lines(text, &[])
}

/// [`dedent`], where lines after the first that held only comments (their positions in `text`
/// are `comment_offsets`, where each removed comment stood) vanish instead of leaving an empty
/// line behind.
pub(crate) fn dedent_dropping_comment_lines(text: &str, comment_offsets: &[usize]) -> String {
    if !text.contains('\n') {
        return text.to_owned();
    }
    let mut lines = Vec::new();
    let mut line_start = 0;
    for (index, line) in text.split('\n').enumerate() {
        let line_end = line_start + line.len();
        let held_a_comment = comment_offsets
            .iter()
            .any(|offset| (line_start..=line_end).contains(offset));
        if index == 0 || !(held_a_comment && is_blank(line)) {
            lines.push(line);
        }
        line_start = line_end + 1;
    }
    while lines.last().is_some_and(|line| is_blank(line)) {
        lines.pop();
    }
    let Some(first_line) = lines.first() else {
        return String::new();
    };
    let first_verbatim = (!is_blank(first_line)).then_some(*first_line);
    let body: Vec<&str> = lines[1..]
        .iter()
        .copied()
        .skip_while(|line| first_verbatim.is_none() && is_blank(line))
        .collect();
    let indent = common_indent(&body);
    let mut result = String::with_capacity(text.len());
    let mut pieces = first_verbatim.into_iter().chain(body.iter().map(|line| {
        if is_blank(line) {
            ""
        } else {
            &line[indent.len()..]
        }
    }));
    if let Some(first) = pieces.next() {
        result.push_str(first);
    }
    for piece in pieces {
        result.push('\n');
        result.push_str(piece);
    }
    result
}

fn is_blank(line: &str) -> bool {
    line.trim().is_empty()
}

/// The longest string of spaces and tabs that starts every non-blank line.
fn common_indent<'a>(lines: &[&'a str]) -> &'a str {
    let mut indents = lines.iter().filter(|line| !is_blank(line)).map(|line| {
        let indent_len = line
            .bytes()
            .take_while(|byte| *byte == b' ' || *byte == b'\t')
            .count();
        &line[..indent_len]
    });
    let Some(mut common) = indents.next() else {
        return "";
    };
    for indent in indents {
        let shared = common
            .bytes()
            .zip(indent.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        common = &common[..shared];
    }
    common
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedent_keeps_a_run_without_newline_verbatim() {
        assert_eq!(dedent("  hello  "), "  hello  ");
        assert_eq!(dedent("   "), "   ");
        assert_eq!(dedent(""), "");
    }

    #[test]
    fn dedent_removes_common_indentation_and_blank_edges() {
        assert_eq!(
            dedent("\n    line one\n      indented\n    line three\n  "),
            "line one\n  indented\nline three"
        );
    }

    #[test]
    fn dedent_drops_all_leading_blank_lines_after_a_blank_first_line() {
        assert_eq!(dedent("  \n\n \t\n    text\n"), "text");
    }

    #[test]
    fn dedent_keeps_a_first_line_with_content_and_ignores_it_for_indentation() {
        assert_eq!(
            dedent("I'm going\n    to Rome\n    today\n  "),
            "I'm going\nto Rome\ntoday"
        );
        assert_eq!(dedent("  first\n\n        second"), "  first\n\nsecond");
    }

    #[test]
    fn dedent_turns_blank_middle_lines_into_empty_lines() {
        assert_eq!(dedent("\n    a\n      \n    b\n"), "a\n\nb");
    }

    #[test]
    fn dedent_of_only_blank_lines_is_empty() {
        assert_eq!(dedent("\n   \n\t\n"), "");
        assert_eq!(dedent("\n"), "");
    }

    #[test]
    fn dedent_uses_a_common_prefix_string_not_a_width() {
        assert_eq!(dedent("\n\t\tx\n\t  y\n"), "\tx\n  y");
        assert_eq!(dedent("\n    x\n\ty\n"), "    x\n\ty");
    }

    #[test]
    fn dedent_keeps_code_shape() {
        let code = "\n        def f(x):\n            if 0 <= x < 3:\n                return x\n\n            return -x\n    ";
        assert_eq!(
            dedent(code),
            "def f(x):\n    if 0 <= x < 3:\n        return x\n\n    return -x"
        );
    }

    #[test]
    fn dedent_keeps_trailing_spaces_of_kept_lines() {
        assert_eq!(dedent("\n  a  \n  b\t\n"), "a  \nb\t");
    }

    #[test]
    fn comment_only_lines_vanish_but_the_first_line_stays_in_charge() {
        // "\n  a\n  <!-- c -->\n  b\n" with the comment removed.
        let text = "\n  a\n  \n  b\n";
        assert_eq!(dedent_dropping_comment_lines(text, &[7]), "a\nb");
        // A blank first line holding a comment is still dropped as a blank first line.
        assert_eq!(dedent_dropping_comment_lines("  \n    x", &[2]), "x");
        // Removing the only other line must not turn the run into a verbatim whitespace run.
        assert_eq!(dedent_dropping_comment_lines("  \n  ", &[5]), "");
        // A line with text next to the comment stays.
        assert_eq!(dedent_dropping_comment_lines("\n  a\n  b\n", &[4]), "a\nb");
    }

    #[test]
    fn decodes_named_and_numeric_references() {
        let (text, diagnostics) =
            decode_entities("&lt;&gt;&amp;&quot;&apos; &#60;&#x3c;&#x1F600;", 0);
        assert_eq!(text, "<>&\"' <<😀");
        assert!(diagnostics.is_empty());
    }

    #[test]
    fn lone_ampersands_are_plain_text() {
        let (text, diagnostics) = decode_entities("a && b; &mut x; & y; &", 0);
        assert_eq!(text, "a && b; &mut x; & y; &");
        assert!(diagnostics.is_empty());
    }

    #[test]
    fn bad_references_are_kept_and_reported_with_exact_spans() {
        let raw = "x &nbsp; &lt y &#xZZ; &#; &#0; &#1114112; &#xD800; z";
        let (text, diagnostics) = decode_entities(raw, 100);
        assert_eq!(text, raw);
        let spans: Vec<&str> = diagnostics
            .iter()
            .filter_map(|diagnostic| diagnostic.primary_span())
            .map(|span| &raw[span.start - 100..span.end - 100])
            .collect();
        assert_eq!(
            spans,
            [
                "&nbsp;",
                "&lt",
                "&#x",
                "&#",
                "&#0;",
                "&#1114112;",
                "&#xD800;"
            ]
        );
        assert!(
            diagnostics
                .iter()
                .all(|diagnostic| diagnostic.code == rules::BAD_ENTITY)
        );
    }

    #[test]
    fn huge_character_references_do_not_overflow() {
        let (text, diagnostics) = decode_entities("&#99999999999999999999999;", 0);
        assert_eq!(text, "&#99999999999999999999999;");
        assert_eq!(diagnostics.len(), 1);
    }

    #[test]
    fn crlf_becomes_lf_but_lone_cr_stays() {
        assert_eq!(decode_entities("a\r\nb\rc\r", 0).0, "a\nb\rc\r");
        let mut out = String::new();
        push_normalising_newlines("a\r\nb\r", &mut out);
        assert_eq!(out, "a\nb\r");
    }
}
