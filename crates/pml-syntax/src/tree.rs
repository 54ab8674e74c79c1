//! Builds a generic element tree from the token stream, with error recovery: mismatched close
//! tags close up to their open element, EOF closes everything, content outside the one root is
//! reported and dropped. It also decides what is text: in a schema the element set is closed, so
//! unknown tags stay text (with a warning, or an error when they look like a misspelled element);
//! in a prompt every other tag is an import. Text pieces between tags are collected into runs,
//! decoded and dedented here; `lower` then maps elements to the typed AST by name.

use crate::ast::{Attribute, Name, Role, TextRun};
use crate::diagnostic::Diagnostic;
use crate::lexer::{Lexer, RawTag, Token};
use crate::names;
use crate::rules;
use crate::span::Span;
use crate::text;
use std::collections::HashMap;

/// At most this many `<` or unknown tags are labelled in one diagnostic; the message counts all.
const MAX_LABELS_PER_RUN: usize = 8;

/// Elements deeper than this are kept as text: every later stage walks the tree recursively, and
/// a file of nested tags must not be able to overflow their stacks.
pub(crate) const MAX_NESTING_DEPTH: usize = 32;

#[derive(Clone, Debug)]
pub(crate) struct Element {
    pub name: Name,
    /// Decoded, duplicates removed (the first one wins).
    pub attributes: Vec<Attribute>,
    pub children: Vec<Node>,
    pub span: Span,
    pub open_tag: Span,
    /// `None` when the element was closed implicitly (by its parent or the end of the file);
    /// the open tag itself for a self-closing element.
    pub close_tag: Option<Span>,
    pub self_closing: bool,
    /// The open tag lost its `>` (see [`Builder::close_implicitly`]).
    cut_off: bool,
    /// See [`crate::ast::Import::looks_like_code`].
    pub looks_like_code: bool,
}

#[derive(Clone, Debug)]
pub(crate) enum Node {
    Element(Element),
    Text(TextRun),
    /// A role close tag in a prompt with no matching open tag.
    RoleClose {
        role: Role,
        span: Span,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Undecided,
    Schema,
    Prompt,
}

pub(crate) struct Document {
    /// The first `<schema>` or `<prompt>` element.
    pub root: Option<Element>,
}

pub(crate) fn build(source: &str, diagnostics: &mut Vec<Diagnostic>) -> Document {
    let mut builder = Builder {
        source,
        kind: FileKind::Undecided,
        stack: Vec::new(),
        root: None,
        first_root_tag: None,
        bottom_is_root: false,
        pending: PendingRun::default(),
        misspelled_open_names: HashMap::new(),
        unterminated_comments: Unterminated::default(),
        unterminated_cdata: Unterminated::default(),
        reported_too_deep: false,
        too_deep_open: 0,
        diagnostics,
    };
    for token in Lexer::new(source) {
        builder.token(token);
    }
    builder.finish_file();
    Document { root: builder.root }
}

enum Piece {
    /// Source text whose entity references are decoded.
    Raw,
    /// Source text taken as is (CDATA content, a processing instruction inside an element).
    Verbatim,
    Comment,
}

/// Text pieces seen since the last tag that ended a run.
#[derive(Default)]
struct PendingRun {
    pieces: Vec<(Piece, Span)>,
    /// Source range of every piece, comments included.
    range: Option<Span>,
    /// `<` kept as text, with the reason each is not a tag.
    stray_less_thans: Labelled,
    /// Tags kept as text in a schema because they are not PML elements, as written.
    unknown_tags: Labelled,
}

/// Things one diagnostic reports: all are counted, the first few kept for its labels, so that a
/// run of a million `<` holds eight labels and not a million.
#[derive(Default)]
struct Labelled {
    first: Vec<(Span, String)>,
    count: usize,
}

impl Labelled {
    fn push(&mut self, span: Span, text: String) {
        if self.first.len() < MAX_LABELS_PER_RUN {
            self.first.push((span, text));
        }
        self.count += 1;
    }
}

/// The openers of one kind (`<!--` or `<![CDATA[`) that are never closed. When one is not, none
/// after it is either (no closer follows it), so one diagnostic reports them all.
#[derive(Default)]
struct Unterminated {
    first: Option<Span>,
    count: usize,
}

impl Unterminated {
    fn push(&mut self, span: Span) {
        self.first.get_or_insert(span);
        self.count += 1;
    }

    /// `, nor are the 3 `<!--` after it` for the message, or nothing when there is one.
    fn later_ones(&self, opener: &str) -> String {
        match self.count {
            0 | 1 => String::new(),
            2 => format!(", nor is the `{opener}` after it"),
            n => format!(", nor are the {} `{opener}` after it", n - 1),
        }
    }
}

impl PendingRun {
    fn push(&mut self, piece: Piece, span: Span) {
        self.range = Some(self.range.map_or(span, |range| range.cover(span)));
        self.pieces.push((piece, span));
    }
}

struct Builder<'s, 'd> {
    source: &'s str,
    kind: FileKind,
    stack: Vec<Element>,
    root: Option<Element>,
    first_root_tag: Option<Span>,
    /// Whether `stack[0]` is the root (rather than content outside it, which is dropped).
    bottom_is_root: bool,
    pending: PendingRun,
    /// Open tags reported as misspelled elements, by name with how many are open: their close
    /// tags need no second diagnostic.
    misspelled_open_names: HashMap<String, usize>,
    reported_too_deep: bool,
    /// Open tags beyond [`MAX_NESTING_DEPTH`] kept as text; their close tags are text too.
    too_deep_open: usize,
    /// Reported once each, when the file ends.
    unterminated_comments: Unterminated,
    unterminated_cdata: Unterminated,
    diagnostics: &'d mut Vec<Diagnostic>,
}

impl Builder<'_, '_> {
    fn token(&mut self, token: Token) {
        match token {
            Token::Text(span) => self.pending.push(Piece::Raw, span),
            Token::CData { span, content } => {
                self.pending.push(Piece::Verbatim, content);
                self.pending.range = self.pending.range.map(|range| range.cover(span));
            }
            Token::Comment(span) => self.pending.push(Piece::Comment, span),
            Token::ProcessingInstruction(span) => {
                if !self.stack.is_empty() {
                    let less_than = Span::new(span.start, span.start + 1);
                    let reason =
                        "`<?` is only read as a processing instruction before the root".to_owned();
                    self.pending.stray_less_thans.push(less_than, reason);
                    self.pending.push(Piece::Verbatim, span);
                }
            }
            Token::StrayLessThan { span, reason } => {
                self.pending.stray_less_thans.push(span, reason);
                self.pending.push(Piece::Raw, span);
            }
            Token::UnterminatedComment(span) => {
                self.unterminated_comments.push(span);
                self.push_unless_outside_root(span);
            }
            Token::UnterminatedCData(span) => {
                self.unterminated_cdata.push(span);
                self.push_unless_outside_root(span);
            }
            Token::Tag(tag) => self.tag(tag),
        }
    }

    fn push_unless_outside_root(&mut self, span: Span) {
        if !self.stack.is_empty() {
            self.pending.push(Piece::Raw, span);
        }
    }

    fn tag(&mut self, tag: RawTag) {
        if let Some(error) = &tag.error {
            let what = if tag.is_close {
                format!("</{}>", tag.name.text)
            } else {
                format!("<{}>", tag.name.text)
            };
            self.diagnostics.push(
                Diagnostic::error(rules::MALFORMED_TAG, format!("malformed `{what}` tag: {}", error.message))
                    .with_label(error.span, error.message.clone())
                    .with_help(
                        "write attributes as name=\"value\" separated by spaces and end the tag with `>` \
                         or `/>`; the tag was read up to the problem",
                    ),
            );
        }
        if tag.is_close {
            self.close_tag(tag);
        } else {
            self.open_tag(tag);
        }
    }

    /// In a schema's root (not in content outside it) the element set is closed.
    fn is_schema_text_tag(&self, name: &str) -> bool {
        self.kind == FileKind::Schema
            && self.bottom_is_root
            && !self.stack.is_empty()
            && !names::is_schema_element(name)
            && !names::is_root(name)
    }

    fn open_tag(&mut self, tag: RawTag) {
        if self.is_schema_text_tag(&tag.name.text) {
            if !self.report_misspelled(&tag) {
                self.pending
                    .unknown_tags
                    .push(tag.span, format!("<{}>", tag.name.text));
            } else if !tag.self_closing {
                *self
                    .misspelled_open_names
                    .entry(tag.name.text.clone())
                    .or_default() += 1;
            }
            self.keep_tag_as_text(tag);
            return;
        }
        if self.stack.len() >= MAX_NESTING_DEPTH {
            self.keep_too_deep_tag_as_text(tag);
            return;
        }
        self.flush_run();
        if self.stack.is_empty() {
            self.open_top_level(&tag);
        } else if Role::from_tag(&tag.name.text).is_some() {
            self.check_role_nesting(&tag);
        }
        let attributes = self.attributes(&tag);
        let looks_like_code = looks_like_code(self.source, &tag);
        let element = Element {
            name: tag.name,
            attributes,
            children: Vec::new(),
            span: tag.span,
            open_tag: tag.span,
            close_tag: tag.self_closing.then_some(tag.span),
            self_closing: tag.self_closing,
            cut_off: tag.error.as_ref().is_some_and(|error| error.cut_off),
            looks_like_code,
        };
        if tag.self_closing {
            self.finish_element(element);
        } else {
            self.stack.push(element);
        }
    }

    fn open_top_level(&mut self, tag: &RawTag) {
        let name = &tag.name.text;
        self.bottom_is_root = false;
        if !names::is_root(name) {
            self.diagnostics.push(
                Diagnostic::error(
                    rules::CONTENT_OUTSIDE_ROOT,
                    format!("`<{name}>` is outside the root element and is ignored"),
                )
                .with_label(tag.span, "outside `<schema>` / `<prompt>`")
                .with_help(
                    "move it inside the `<schema>` or `<prompt>` element, or wrap the file in one",
                ),
            );
            return;
        }
        match self.first_root_tag {
            Some(first) => self.diagnostics.push(
                Diagnostic::error(
                    rules::MULTIPLE_ROOTS,
                    format!("second root element `<{name}>` is ignored"),
                )
                .with_label(tag.span, "second root")
                .with_label(first, "the file's root")
                .with_help(
                    "a file holds one schema or one prompt: move this one into a file of its own",
                ),
            ),
            None => {
                self.kind = if name == "schema" {
                    FileKind::Schema
                } else {
                    FileKind::Prompt
                };
                self.first_root_tag = Some(tag.span);
                self.bottom_is_root = true;
            }
        }
    }

    fn check_role_nesting(&mut self, tag: &RawTag) {
        let enclosing_role = self
            .stack
            .iter()
            .rev()
            .find(|element| Role::from_tag(&element.name.text).is_some());
        if let Some(enclosing) = enclosing_role {
            self.diagnostics.push(
                Diagnostic::error(
                    rules::NESTED_ROLE,
                    format!(
                        "role block `<{}>` is inside role block `<{}>`",
                        tag.name.text, enclosing.name.text
                    ),
                )
                .with_label(tag.span, "nested role")
                .with_label(enclosing.open_tag, "inside this role block")
                .with_help(format!(
                    "close `<{}>` before opening `<{}>`",
                    enclosing.name.text, tag.name.text
                )),
            );
        }
    }

    /// Reports an unknown schema tag as misspelled if it is close to an element name.
    fn report_misspelled(&mut self, tag: &RawTag) -> bool {
        let Some(suggestion) = names::suggest_schema_element(&tag.name.text) else {
            return false;
        };
        let written = if tag.is_close {
            format!("</{}>", tag.name.text)
        } else {
            format!("<{}>", tag.name.text)
        };
        self.diagnostics.push(
            Diagnostic::error(
                rules::MISSPELLED_ELEMENT,
                format!("`{written}` is not a schema element; did you mean `{suggestion}`?"),
            )
            .with_label(tag.name.span, format!("did you mean `{suggestion}`?"))
            .with_help(format!(
                "rename the tag to `{suggestion}`; if it is text, write `&lt;` for `<` or wrap it in `<![CDATA[ ... ]]>`"
            )),
        );
        true
    }

    fn keep_tag_as_text(&mut self, tag: RawTag) {
        self.pending.push(Piece::Raw, tag.span);
    }

    /// Reported once per file: a generated file nested thousands deep would otherwise bury
    /// everything else under one diagnostic per tag.
    fn keep_too_deep_tag_as_text(&mut self, tag: RawTag) {
        if !self.reported_too_deep {
            self.reported_too_deep = true;
            self.diagnostics.push(
                Diagnostic::error(
                    rules::NESTING_TOO_DEEP,
                    format!("elements nest deeper than {MAX_NESTING_DEPTH} levels"),
                )
                .with_label(tag.span, "this tag and every deeper one are kept as text")
                .with_help("flatten the structure: modules rarely need more than a few levels"),
            );
        }
        if !tag.self_closing {
            self.too_deep_open += 1;
        }
        self.keep_tag_as_text(tag);
    }

    fn close_tag(&mut self, tag: RawTag) {
        if self.too_deep_open > 0 {
            self.too_deep_open -= 1;
            self.keep_tag_as_text(tag);
            return;
        }
        let name = tag.name.text.as_str();
        if let Some(index) = self
            .stack
            .iter()
            .rposition(|element| element.name.text == name)
        {
            self.flush_run();
            while self.stack.len() > index + 1 {
                if let Some(unclosed) = self.stack.pop() {
                    self.close_implicitly(unclosed, tag.span.start, Some(&tag));
                }
            }
            if let Some(mut element) = self.stack.pop() {
                element.span.end = tag.span.end;
                element.close_tag = Some(tag.span);
                self.finish_element(element);
            }
            return;
        }
        if self.is_schema_text_tag(name) {
            if let Some(open) = self
                .misspelled_open_names
                .get_mut(name)
                .filter(|open| **open > 0)
            {
                *open -= 1;
            } else if !self.report_misspelled(&tag) {
                self.pending
                    .unknown_tags
                    .push(tag.span, format!("</{name}>"));
            }
            self.keep_tag_as_text(tag);
            return;
        }
        self.flush_run();
        if let (FileKind::Prompt, Some(role), Some(parent)) =
            (self.kind, Role::from_tag(name), self.stack.last_mut())
        {
            parent.children.push(Node::RoleClose {
                role,
                span: tag.span,
            });
            return;
        }
        self.diagnostics.push(
            Diagnostic::error(
                rules::UNMATCHED_CLOSE_TAG,
                format!("`</{name}>` has no matching open tag and is ignored"),
            )
            .with_label(tag.span, format!("no open `<{name}>` here"))
            .with_help(format!(
                "remove it, or add the matching `<{name}>` before it"
            )),
        );
    }

    /// Closes an element whose close tag is missing, at `end`. An element whose open tag lost
    /// its `>` (already reported) was most likely meant to be self-closing, like a
    /// `<param ... />`: it keeps only its tag, and what was read as its content goes back to its
    /// parent, so one missing `>` does not swallow the rest of the parent.
    fn close_implicitly(&mut self, mut element: Element, end: usize, closed_by: Option<&RawTag>) {
        if element.cut_off && !self.stack.is_empty() {
            let children = std::mem::take(&mut element.children);
            element.span = element.open_tag;
            element.close_tag = Some(element.open_tag);
            element.self_closing = true;
            self.finish_element(element);
            if let Some(parent) = self.stack.last_mut() {
                parent.children.extend(children);
            }
            return;
        }
        element.span.end = end;
        self.report_unclosed(&element, closed_by);
        self.finish_element(element);
    }

    fn report_unclosed(&mut self, element: &Element, closed_by: Option<&RawTag>) {
        let name = &element.name.text;
        let is_schema_role = self.kind == FileKind::Schema && Role::from_tag(name).is_some();
        if is_schema_role {
            return;
        }
        let diagnostic = match closed_by {
            Some(tag) => Diagnostic::error(
                rules::UNCLOSED_ELEMENT,
                format!("`<{name}>` is not closed before `</{}>`", tag.name.text),
            )
            .with_label(element.open_tag, "opened here")
            .with_label(tag.span, format!("this closes `<{name}>` too")),
            None => Diagnostic::error(
                rules::UNCLOSED_ELEMENT,
                format!("`<{name}>` is never closed"),
            )
            .with_label(element.open_tag, "opened here"),
        };
        let help = if element.looks_like_code {
            format!(
                "`<{name}>` looks like code (a generic type, as in `Vec<u8>` or `<T>`), not an element: \
                 if it is text, write `&lt;` for `<` or wrap the text in `<![CDATA[ ... ]]>`; if it \
                 is an element, add `</{name}>` where it ends"
            )
        } else {
            format!(
                "add `</{name}>` where the element ends, or write `<{name} ... />` if it has no content"
            )
        };
        self.diagnostics.push(diagnostic.with_help(help));
    }

    fn finish_element(&mut self, element: Element) {
        match self.stack.last_mut() {
            Some(parent) => parent.children.push(Node::Element(element)),
            None if self.bottom_is_root && self.root.is_none() => self.root = Some(element),
            None => {}
        }
    }

    fn finish_file(&mut self) {
        self.flush_run();
        let end = self.source.len();
        while let Some(element) = self.stack.pop() {
            self.close_implicitly(element, end, None);
        }
        if let Some(first) = self.unterminated_comments.first {
            let later = self.unterminated_comments.later_ones("<!--");
            self.diagnostics.push(
                Diagnostic::error(
                    rules::UNTERMINATED_COMMENT,
                    format!("comment is never closed{later}"),
                )
                .with_label(first, "no `-->` after this")
                .with_help("add `-->` where the comment ends; until then `<!--` is read as text"),
            );
        }
        if let Some(first) = self.unterminated_cdata.first {
            let later = self.unterminated_cdata.later_ones("<![CDATA[");
            self.diagnostics.push(
                Diagnostic::error(
                    rules::UNTERMINATED_CDATA,
                    format!("CDATA section is never closed{later}"),
                )
                .with_label(first, "no `]]>` after this")
                .with_help("add `]]>` where the verbatim text ends"),
            );
        }
        if self.first_root_tag.is_none() {
            self.diagnostics.push(
                Diagnostic::error(rules::MISSING_ROOT, "the file has no `<schema>` or `<prompt>` root element")
                    .with_help("wrap the file in `<schema name=\"...\">…</schema>` or `<prompt schema=\"...\">…</prompt>`"),
            );
        }
    }

    fn attributes(&mut self, tag: &RawTag) -> Vec<Attribute> {
        let mut attributes: Vec<Attribute> = Vec::with_capacity(tag.attributes.len());
        for raw in &tag.attributes {
            if let Some(first) = attributes
                .iter()
                .find(|attribute| attribute.name.text == raw.name.text)
            {
                self.diagnostics.push(
                    Diagnostic::error(
                        rules::DUPLICATE_ATTRIBUTE,
                        format!(
                            "attribute `{}` is given twice; the second value is ignored",
                            raw.name.text
                        ),
                    )
                    .with_label(raw.span, "given again here")
                    .with_label(first.span, "first given here")
                    .with_help("remove one of the two"),
                );
                continue;
            }
            if !raw.quoted {
                self.diagnostics.push(
                    Diagnostic::warning(
                        rules::UNQUOTED_ATTRIBUTE,
                        format!("the value of `{}` is not quoted", raw.name.text),
                    )
                    .with_label(raw.value_span, "unquoted value")
                    .with_help(format!(
                        "write {}=\"{}\"",
                        raw.name.text,
                        &self.source[raw.value_span.start..raw.value_span.end]
                    )),
                );
            }
            let (value, problems) = text::decode_entities(
                &self.source[raw.value_span.start..raw.value_span.end],
                raw.value_span.start,
            );
            self.diagnostics.extend(problems);
            attributes.push(Attribute {
                name: raw.name.clone(),
                value,
                value_span: raw.value_span,
                span: raw.span,
            });
        }
        attributes
    }

    /// Ends the pending text run: inside an element it becomes a `TextRun` child; outside the
    /// root anything but whitespace and comments is reported.
    fn flush_run(&mut self) {
        let run = std::mem::take(&mut self.pending);
        let Some(range) = run.range else {
            return;
        };
        let Some(parent_index) = self.stack.len().checked_sub(1) else {
            self.report_outside_root(&run, range);
            return;
        };
        let mut decoded = String::new();
        let mut comment_offsets = Vec::new();
        for (piece, span) in &run.pieces {
            let raw = &self.source[span.start..span.end];
            match piece {
                Piece::Raw => {
                    text::decode_entities_into(raw, span.start, &mut decoded, self.diagnostics)
                }
                Piece::Verbatim => text::push_normalising_newlines(raw, &mut decoded),
                Piece::Comment => comment_offsets.push(decoded.len()),
            }
        }
        self.report_text_markup(&run);
        let text = text::dedent_dropping_comment_lines(&decoded, &comment_offsets);
        if !text.is_empty() {
            let span = trim_span(self.source, range);
            self.stack[parent_index]
                .children
                .push(Node::Text(TextRun { text, span }));
        }
    }

    fn report_outside_root(&mut self, run: &PendingRun, range: Span) {
        let has_content = run.pieces.iter().any(|(piece, span)| match piece {
            Piece::Raw => !self.source[span.start..span.end].trim().is_empty(),
            Piece::Verbatim => true,
            Piece::Comment => false,
        });
        if has_content {
            self.diagnostics.push(
                Diagnostic::error(rules::CONTENT_OUTSIDE_ROOT, "text outside the root element is ignored")
                    .with_label(trim_span(self.source, range), "outside `<schema>` / `<prompt>`")
                    .with_help("move the text inside the root element, or turn it into a comment `<!-- ... -->`"),
            );
        }
    }

    /// One warning per run for the `<` and the unknown tags it keeps as text.
    fn report_text_markup(&mut self, run: &PendingRun) {
        if run.stray_less_thans.count > 0 {
            let count = run.stray_less_thans.count;
            let message = if count == 1 {
                "`<` does not start a tag and is kept as text".to_owned()
            } else {
                format!("{count} `<` characters do not start tags and are kept as text")
            };
            let mut diagnostic = Diagnostic::warning(rules::STRAY_LESS_THAN, message).with_help(
                "if this is text, write `&lt;` for `<` or wrap the text in `<![CDATA[ ... ]]>`; if it is meant \
                 as a tag, fix the tag",
            );
            for (span, reason) in &run.stray_less_thans.first {
                diagnostic = diagnostic.with_label(*span, reason.clone());
            }
            self.diagnostics.push(diagnostic);
        }
        if run.unknown_tags.count > 0 {
            let message = match run.unknown_tags.first.as_slice() {
                [(_, one)] if run.unknown_tags.count == 1 => {
                    format!("`{one}` is not a schema element and is kept as text")
                }
                _ => format!(
                    "{} tags that are not schema elements are kept as text",
                    run.unknown_tags.count
                ),
            };
            let mut diagnostic = Diagnostic::warning(rules::UNKNOWN_SCHEMA_TAG, message).with_help(
                "schemas know only module, union, collection, param, parameter and the role tags; wrap text \
                 with tags in `<![CDATA[ ... ]]>` or write `&lt;` for `<`",
            );
            for (span, _) in &run.unknown_tags.first {
                diagnostic = diagnostic.with_label(*span, "not a schema element");
            }
            self.diagnostics.push(diagnostic);
        }
    }
}

/// `span` without surrounding whitespace, or all of it if it is only whitespace.
fn trim_span(source: &str, span: Span) -> Span {
    let raw = &source[span.start..span.end];
    let trimmed_start = raw.trim_start();
    if trimmed_start.is_empty() {
        return span;
    }
    let start = span.start + (raw.len() - trimmed_start.len());
    Span::new(start, start + trimmed_start.trim_end().len())
}

/// Whether an open tag reads as code rather than markup: its `<` follows a word character with no
/// space between (`Vec<u8>`, `List<String>`, `std::vector<int>`), or its name is capitalised as
/// types are (`<T>`, `<String>`) where module names are lower-case by convention.
fn looks_like_code(source: &str, tag: &RawTag) -> bool {
    let glued_to_word = source[..tag.span.start]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_');
    let capitalised = tag.name.text.starts_with(|c: char| c.is_uppercase());
    glued_to_word || capitalised
}
