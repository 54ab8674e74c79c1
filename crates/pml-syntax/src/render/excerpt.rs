//! The part of a file one diagnostic shows, with long lines clipped: a diagnostic on a 5 MB
//! one-line file must not print the line (nor make miette format a 5-million-column gutter). The
//! excerpt keeps the file's line structure from the first line shown to the last, so miette
//! numbers lines itself; lines it will not print are left empty, and a line longer than
//! [`MAX_LINE_BYTES`] keeps only windows around the label ends on it, joined by `…`.

use crate::span::{LineIndex, Span};
use miette::{MietteError, MietteSpanContents, SourceCode, SourceSpan, SpanContents};

/// Lines up to this long are shown whole.
const MAX_LINE_BYTES: usize = 160;
/// Bytes kept before and after a label end on a clipped line.
const WINDOW_BEFORE: usize = 40;
const WINDOW_AFTER: usize = 60;
/// A context line (no label end on it) that is too long shows only its start.
const CONTEXT_HEAD: usize = 80;
/// A label over more lines than this is cut to its first line: miette prints every line a label
/// covers.
const MAX_LABEL_LINES: usize = 8;
/// Lines miette shows around each label (its default).
const CONTEXT_LINES: usize = 1;
const ELLIPSIS: &str = "…";

/// The text one diagnostic is rendered against, and its labels placed in that text.
pub(super) struct Excerpt {
    name: String,
    text: String,
    /// The file's zero-based line number of the excerpt's first line.
    first_line: usize,
    /// Where the primary label starts in the excerpt, and its line and character column in the
    /// file (miette would count the column in the clipped line).
    primary: Option<(usize, usize, usize)>,
    pub labels: Vec<Span>,
}

/// One kept piece of a line: `source[real]` is at `excerpt_start` in the excerpt.
struct Segment {
    real: Span,
    excerpt_start: usize,
}

impl Excerpt {
    /// `labels` are already clamped to `source`.
    pub fn new(name: &str, source: &str, lines: &LineIndex, labels: Vec<Span>) -> Self {
        let labels: Vec<Span> = labels
            .into_iter()
            .map(|span| cut_to_first_line(source, lines, span))
            .collect();
        let last_line = lines.line_col(source.len()).0;
        let mut shown = std::collections::BTreeSet::new();
        for span in &labels {
            let start = lines.line_col(span.start).0;
            let end = lines.line_col(span.end).0;
            shown
                .extend(start.saturating_sub(CONTEXT_LINES)..=(end + CONTEXT_LINES).min(last_line));
        }
        let (Some(&first_line), Some(&last_shown)) = (shown.first(), shown.last()) else {
            return Excerpt {
                name: name.to_string(),
                text: String::new(),
                first_line: 0,
                primary: None,
                labels,
            };
        };
        let mut text = String::new();
        let mut segments: Vec<Segment> = Vec::new();
        for line in first_line..=last_shown {
            if line > first_line {
                text.push('\n');
            }
            if !shown.contains(&line) {
                continue;
            }
            let extent = line_extent(source, lines, line);
            let points: Vec<usize> = labels
                .iter()
                .flat_map(|span| [span.start, span.end])
                .filter(|&point| extent.start <= point && point <= extent.end)
                .collect();
            let mut kept_to = extent.start;
            for window in windows(source, extent, &points) {
                if window.start > kept_to {
                    text.push_str(ELLIPSIS);
                }
                segments.push(Segment {
                    real: window,
                    excerpt_start: text.len(),
                });
                text.push_str(&source[window.start..window.end]);
                kept_to = window.end;
            }
            if kept_to < extent.end {
                text.push_str(ELLIPSIS);
            }
        }
        let place = |offset: usize| place(&segments, offset);
        let primary = labels.first().map(|span| {
            let (line, byte_column) = lines.line_col(span.start);
            let column = source[span.start - byte_column..span.start].chars().count();
            (place(span.start), line, column)
        });
        let labels = labels
            .iter()
            .map(|span| Span::new(place(span.start), place(span.end).max(place(span.start))))
            .collect();
        Excerpt {
            name: name.to_string(),
            text,
            first_line,
            primary,
            labels,
        }
    }
}

/// A label spanning many lines ends at the end of its first line.
fn cut_to_first_line(source: &str, lines: &LineIndex, span: Span) -> Span {
    let (start_line, _) = lines.line_col(span.start);
    let (end_line, _) = lines.line_col(span.end);
    if end_line - start_line <= MAX_LABEL_LINES {
        return span;
    }
    Span::new(span.start, line_extent(source, lines, start_line).end)
}

/// The byte range of `line`, without its line ending.
fn line_extent(source: &str, lines: &LineIndex, line: usize) -> Span {
    let start = lines.line_start(line).unwrap_or(source.len());
    let mut end = lines
        .line_start(line + 1)
        .map_or(source.len(), |next| next - 1);
    if source[start..end].ends_with('\r') {
        end -= 1;
    }
    Span::new(start, end)
}

/// The parts of the line `extent` to keep: all of it when short, else windows around `points`
/// (or its head when there are none), merged where they overlap, on character boundaries.
fn windows(source: &str, extent: Span, points: &[usize]) -> Vec<Span> {
    if extent.len() <= MAX_LINE_BYTES {
        return vec![extent];
    }
    let mut wanted: Vec<Span> = points
        .iter()
        .map(|&point| {
            Span::new(
                point.saturating_sub(WINDOW_BEFORE).max(extent.start),
                (point + WINDOW_AFTER).min(extent.end),
            )
        })
        .collect();
    if wanted.is_empty() {
        wanted.push(Span::new(extent.start, extent.start + CONTEXT_HEAD));
    }
    wanted.sort_by_key(|window| window.start);
    let mut merged: Vec<Span> = Vec::new();
    for window in wanted {
        let window = Span::new(
            floor_boundary(source, window.start),
            ceil_boundary(source, window.end),
        );
        match merged.last_mut() {
            Some(last) if window.start <= last.end => last.end = last.end.max(window.end),
            _ => merged.push(window),
        }
    }
    merged
}

fn floor_boundary(source: &str, mut offset: usize) -> usize {
    while !source.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

fn ceil_boundary(source: &str, mut offset: usize) -> usize {
    while !source.is_char_boundary(offset) {
        offset += 1;
    }
    offset
}

/// Where the file offset `offset` is in the excerpt (the nearest kept byte when it was clipped).
fn place(segments: &[Segment], offset: usize) -> usize {
    let index = segments.partition_point(|segment| segment.real.end < offset);
    match segments.get(index) {
        Some(segment) if segment.real.start <= offset => {
            segment.excerpt_start + (offset - segment.real.start)
        }
        Some(segment) => segment.excerpt_start,
        None => segments
            .last()
            .map_or(0, |segment| segment.excerpt_start + segment.real.len()),
    }
}

impl SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self
            .text
            .read_span(span, context_lines_before, context_lines_after)?;
        let (line, column) = match self.primary {
            Some((offset, line, column))
                if span.offset() == offset
                    && context_lines_before == 0
                    && context_lines_after == 0 =>
            {
                (line, column)
            }
            _ => (inner.line() + self.first_line, inner.column()),
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            line,
            column,
            inner.line_count(),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excerpt(source: &str, spans: &[Span]) -> Excerpt {
        Excerpt::new("f.pml", source, &LineIndex::new(source), spans.to_vec())
    }

    #[test]
    fn short_lines_are_kept_and_others_emptied() {
        let source = "a\nb\nc <x>\nd\ne\nf\n";
        let at = source.find("<x>").expect("tag");
        let excerpt = excerpt(source, &[Span::new(at, at + 3)]);
        assert_eq!(excerpt.first_line, 1);
        assert_eq!(excerpt.text, "b\nc <x>\nd");
        assert_eq!(
            &excerpt.text[excerpt.labels[0].start..excerpt.labels[0].end],
            "<x>"
        );
        assert_eq!(excerpt.primary, Some((excerpt.labels[0].start, 2, 2)));
    }

    #[test]
    fn lines_between_distant_labels_stay_empty() {
        let source = format!("<a>\n{}</b>\n", "text\n".repeat(100));
        let close = source.find("</b>").expect("close");
        let excerpt = excerpt(&source, &[Span::new(0, 3), Span::new(close, close + 4)]);
        assert_eq!(excerpt.first_line, 0);
        assert_eq!(excerpt.text.split('\n').count(), 103);
        assert!(excerpt.text.len() < 103 + 20, "{:?}", excerpt.text);
        assert_eq!(
            &excerpt.text[excerpt.labels[1].start..excerpt.labels[1].end],
            "</b>"
        );
    }

    #[test]
    fn a_long_line_keeps_windows_around_the_labels() {
        let source = format!("<m>{}é<x>{}</m>", "é".repeat(5_000), "y".repeat(5_000));
        let at = source.find("<x>").expect("tag");
        let end = source.find("</m>").expect("close");
        let excerpt = excerpt(&source, &[Span::new(at, at + 3), Span::new(end, end + 4)]);
        assert!(excerpt.text.len() < 400, "{}", excerpt.text.len());
        assert!(excerpt.text.starts_with(ELLIPSIS), "{}", excerpt.text);
        assert_eq!(
            excerpt.text.matches(ELLIPSIS).count(),
            2,
            "one between the windows"
        );
        assert_eq!(
            &excerpt.text[excerpt.labels[0].start..excerpt.labels[0].end],
            "<x>"
        );
        assert_eq!(
            &excerpt.text[excerpt.labels[1].start..excerpt.labels[1].end],
            "</m>"
        );
        // The column is the file's, in characters.
        assert_eq!(
            excerpt.primary.map(|(_, line, column)| (line, column)),
            Some((0, 5_004))
        );
    }

    #[test]
    fn a_label_over_many_lines_is_cut_to_its_first() {
        let source = format!("<a>{}</a>", "\nline".repeat(50));
        let excerpt = excerpt(&source, &[Span::new(0, source.len())]);
        assert_eq!(
            &excerpt.text[excerpt.labels[0].start..excerpt.labels[0].end],
            "<a>"
        );
        assert!(excerpt.text.lines().count() <= 2);
    }
}
