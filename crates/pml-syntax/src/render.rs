//! Renders diagnostics as text with miette's graphical handler, the one presentation shared by
//! the CLI and the snapshot tests. The output depends only on the arguments: fixed width, no
//! terminal detection, no hyperlinks, colour only when asked for.

use crate::diagnostic::{Diagnostic, Severity};
use crate::span::Span;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceCode};
use std::fmt;

/// Column at which reports wrap.
const WIDTH: usize = 100;

/// Renders every diagnostic against `source` (shown as `file_name`), each followed by a blank line.
pub fn render(diagnostics: &[Diagnostic], file_name: &str, source: &str, color: bool) -> String {
    let named_source = NamedSource::new(file_name, source.to_owned());
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    // Wrap at spaces only: the default Unicode rules break inside `<![CDATA[` and similar.
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(WIDTH)
        .with_links(false)
        .with_word_separator(textwrap::WordSeparator::AsciiSpace)
        .with_word_splitter(textwrap::WordSplitter::NoHyphenation);
    let mut rendered = String::new();
    for diagnostic in diagnostics {
        let report = Report {
            diagnostic,
            source: &named_source,
            source_len: source.len(),
        };
        if handler.render_report(&mut rendered, &report).is_err() {
            // miette refuses spans it cannot place; say what we can rather than nothing.
            rendered.push_str(&format!(
                "{}[{}]: {}\n",
                severity_word(diagnostic.severity),
                diagnostic.code,
                diagnostic.message
            ));
        }
        rendered.push('\n');
    }
    rendered
}

fn severity_word(severity: Severity) -> &'static str {
    match severity {
        Severity::Warning => "warning",
        Severity::Error => "error",
    }
}

/// A [`Diagnostic`] with its source attached, as miette wants it.
struct Report<'a> {
    diagnostic: &'a Diagnostic,
    source: &'a NamedSource<String>,
    source_len: usize,
}

impl Report<'_> {
    /// Spans from other stages might point past the end; miette would fail on them.
    fn clamp(&self, span: Span) -> Span {
        let end = span.end.min(self.source_len);
        Span::new(span.start.min(end), end)
    }
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.diagnostic, formatter)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.diagnostic.message)
    }
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diagnostic.code))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diagnostic.severity {
            Severity::Warning => miette::Severity::Warning,
            Severity::Error => miette::Severity::Error,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diagnostic
            .help
            .as_ref()
            .map(|help| Box::new(help) as Box<dyn fmt::Display + 'a>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        Some(self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.diagnostic.labels.is_empty() {
            return None;
        }
        Some(Box::new(self.diagnostic.labels.iter().enumerate().map(
            |(index, label)| {
                let span = self.clamp(label.span);
                let message = Some(label.message.clone());
                if index == 0 {
                    LabeledSpan::new_primary_with_span(message, span)
                } else {
                    LabeledSpan::new_with_span(message, span)
                }
            },
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_code_message_labels_and_help_without_colour() {
        let source = "<schema>\n  <modle/>\n</schema>\n";
        let diagnostic = Diagnostic::error("PML011", "unknown tag")
            .with_label(Span::new(12, 17), "did you mean `module`?")
            .with_help("rename it");
        let rendered = render(&[diagnostic], "s.pml", source, false);
        for expected in [
            "PML011",
            "unknown tag",
            "s.pml:2:4",
            "did you mean `module`?",
            "rename it",
        ] {
            assert!(
                rendered.contains(expected),
                "{expected:?} missing from:\n{rendered}"
            );
        }
        assert!(
            !rendered.contains('\u{1b}'),
            "no escape codes without colour:\n{rendered}"
        );
    }

    #[test]
    fn spans_past_the_end_are_clamped() {
        let diagnostic =
            Diagnostic::warning("PML001", "late").with_label(Span::new(50, 60), "here");
        let rendered = render(&[diagnostic], "x.pml", "short", false);
        assert!(rendered.contains("late"), "{rendered}");
    }
}
