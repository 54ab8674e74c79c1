//! Renders diagnostics as text with miette's graphical handler, the one presentation shared by
//! the CLI and the snapshot tests. The output depends only on the arguments: fixed width, no
//! terminal detection, no hyperlinks, colour only when asked for. Each diagnostic is drawn
//! against an [`excerpt::Excerpt`] of the file, so its size does not grow with the file's lines.

mod excerpt;

use crate::diagnostic::{Diagnostic, Severity};
use crate::span::{LineIndex, Span};
use excerpt::Excerpt;
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, SourceCode};
use std::fmt;

/// Column at which reports wrap.
const WIDTH: usize = 100;

/// Renders every diagnostic against `source` (shown as `file_name`), each followed by a blank line.
pub fn render(diagnostics: &[Diagnostic], file_name: &str, source: &str, color: bool) -> String {
    let lines = LineIndex::new(source);
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
        let clamped = diagnostic
            .labels
            .iter()
            .map(|label| clamp(label.span, source.len()))
            .collect();
        let excerpt = Excerpt::new(file_name, source, &lines, clamped);
        let report = Report {
            diagnostic,
            source: &excerpt,
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

/// Spans from other stages might point past the end; miette would fail on them.
fn clamp(span: Span, source_len: usize) -> Span {
    let end = span.end.min(source_len);
    Span::new(span.start.min(end), end)
}

/// A [`Diagnostic`] with its excerpt attached, as miette wants it.
struct Report<'a> {
    diagnostic: &'a Diagnostic,
    source: &'a Excerpt,
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
                let span = self.source.labels[index];
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
