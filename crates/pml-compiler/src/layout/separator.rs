//! The separator rule between text pieces. Text runs are dedented and never end in a newline, and
//! each is tokenized on its own, so two pieces written on separate lines would otherwise be glued
//! together ("…follow.This time…"). A run gets a `"\n"` appended when the source has a line break
//! after its last character of text (inside the run's span, or after it among whitespace, comments
//! and close tags of modules, unions and collections), unless a role's close string comes next
//! (the chat template owns that whitespace) or nothing does (the end of the schema or prompt).
//! The same rule serves schema text (layout) and prompt text (binding).

use pml_syntax::Span;

/// What the model reads right after a piece of text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Follow {
    /// More text: a run, a module, a parameter, a role's open string, or — after a role the
    /// schema leaves open — the prompt's own text.
    Content,
    /// A role's close string.
    RoleClose,
    /// Nothing: the end of the schema (outside a role left open) or of the prompt.
    End,
}

/// Whether the text run at `span` of `source` gets a `"\n"` appended.
pub(crate) fn needs_separator(source: &str, span: Span, follow: Follow) -> bool {
    follow == Follow::Content && line_break_after(source, span)
}

/// Whether the raw text `raw` (a `src` file) ends with a line break after its last character of
/// text, or, failing that, the source after `element_end` does (see [`needs_separator`]).
pub(crate) fn file_needs_separator(
    raw: &str,
    source: &str,
    element_end: usize,
    follow: Follow,
) -> bool {
    follow == Follow::Content
        && (raw[raw.trim_end().len()..].contains('\n') || break_in_tail(source, element_end))
}

/// Whether a line break follows the last character of text of the run at `span`.
fn line_break_after(source: &str, span: Span) -> bool {
    let Some(mut raw) = source.get(span.start..span.end) else {
        return false;
    };
    // The span is trimmed, but a run may end in comments, which hold no text.
    loop {
        let trimmed = raw.trim_end();
        if raw[trimmed.len()..].contains('\n') {
            return !trimmed.trim().is_empty();
        }
        raw = trimmed;
        match raw.strip_suffix("-->").and_then(|body| body.rfind("<!--")) {
            Some(comment_start) => raw = &raw[..comment_start],
            None => break,
        }
    }
    !raw.trim().is_empty() && break_in_tail(source, span.end)
}

/// Whether the source from `offset` holds a line break before the next text or opening tag,
/// skipping whitespace, comments and close tags.
fn break_in_tail(source: &str, offset: usize) -> bool {
    let mut tail = source.get(offset..).unwrap_or("");
    loop {
        let trimmed = tail.trim_start();
        if tail[..tail.len() - trimmed.len()].contains('\n') {
            return true;
        }
        tail = trimmed;
        let skipped = if let Some(comment) = tail.strip_prefix("<!--") {
            comment.find("-->").map(|end| &comment[end + 3..])
        } else if tail.starts_with("</") {
            tail.find('>').map(|end| &tail[end + 1..])
        } else {
            None
        };
        match skipped {
            Some(rest) => tail = rest,
            None => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_span(source: &str, text: &str) -> Span {
        let start = source.find(text).expect("text in source");
        Span::new(start, start + text.len())
    }

    #[test]
    fn line_break_inside_or_after_close_tags() {
        let source = "<module name=\"a\">Line one.</module>\n<module name=\"b\">x</module>";
        let span = run_span(source, "Line one.");
        assert!(needs_separator(source, span, Follow::Content));
        assert!(!needs_separator(source, span, Follow::RoleClose));
        assert!(!needs_separator(source, span, Follow::End));

        let inline = "<module name=\"a\">A trip of <param name=\"d\" len=\"2\"/></module>";
        assert!(!needs_separator(
            inline,
            run_span(inline, "A trip of"),
            Follow::Content
        ));

        let before_open = "Intro text\n  <module name=\"b\">x</module>";
        assert!(needs_separator(
            before_open,
            run_span(before_open, "Intro text"),
            Follow::Content
        ));
    }

    #[test]
    fn comments_hold_no_text() {
        let trailing = "Text\n<!-- note --></module> <module name=\"b\"/>";
        assert!(needs_separator(
            trailing,
            run_span(trailing, "Text\n<!-- note -->"),
            Follow::Content
        ));
        let after = "Text</module><!-- a\nb --> <module name=\"b\"/>";
        assert!(!needs_separator(
            after,
            run_span(after, "Text"),
            Follow::Content
        ));
        let spaces = "a <b/>";
        assert!(!needs_separator(spaces, Span::new(1, 2), Follow::Content));
    }

    #[test]
    fn files_end_with_their_own_line_break() {
        let source = "<module name=\"u\" src=\"u.py\"/><module name=\"v\">x</module>";
        assert!(file_needs_separator("x = 1\n", source, 29, Follow::Content));
        assert!(!file_needs_separator("x = 1", source, 29, Follow::Content));
        assert!(!file_needs_separator("x = 1\n", source, 29, Follow::End));
    }
}
