//! Context-sensitive lexer. In content mode ([`ContentToken`]) it finds text, comments, CDATA
//! sections, processing instructions and the `<` / `</` that may start a tag; at such a `<` it
//! switches to tag mode ([`TagToken`]) and reads the whole tag. A tag that turns out to be
//! malformed is not a tag: its `<` becomes text (so `0 <= x < n` in embedded code survives),
//! unless the tag names a PML element, which is then recovered as a tag with an error.
//! Both modes are logos lexers run on the rest of the source, which makes the backtracking
//! after a failed tag a matter of starting the content lexer again one byte further.

use crate::ast::Name;
use crate::names;
use crate::span::Span;
use logos::Logos;

#[derive(Logos, Clone, Copy, Debug, PartialEq, Eq)]
enum ContentToken {
    #[regex(r"[^<]+")]
    Text,
    #[token("<!--")]
    CommentOpen,
    #[token("<![CDATA[")]
    CDataOpen,
    #[token("<?")]
    ProcessingInstructionOpen,
    #[token("</")]
    CloseTagOpen,
    #[token("<")]
    TagOpen,
}

#[derive(Logos, Clone, Copy, Debug, PartialEq, Eq)]
#[logos(skip r"[ \t\r\n]+")]
enum TagToken {
    #[regex(r"[\p{L}_][\p{L}\p{N}_.:\-]*", priority = 3)]
    Name,
    #[token("=")]
    Equals,
    #[regex(r#""[^"<]*""#)]
    #[regex(r#"'[^'<]*'"#)]
    Quoted,
    #[regex(r#""[^"<]*"#)]
    #[regex(r#"'[^'<]*"#)]
    UnterminatedQuoted,
    /// An unquoted value that does not start like a name (`len=10`); those that do are `Name`s.
    #[regex(r#"[^ \t\r\n"'<>=`/\p{L}_][^ \t\r\n"'<>=`/]*"#)]
    Bare,
    #[token(">")]
    End,
    #[token("/>")]
    SelfClosingEnd,
}

/// An attribute as written; its value is decoded when the tag becomes an element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawAttribute {
    pub name: Name,
    /// The value's source, without quotes.
    pub value_span: Span,
    pub quoted: bool,
    pub span: Span,
}

/// Why a tag of a PML element could not be read; the tag was recovered around the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TagError {
    pub span: Span,
    pub message: String,
    /// No `>` was found: the tag ends where reading stopped.
    pub cut_off: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawTag {
    pub is_close: bool,
    pub name: Name,
    pub attributes: Vec<RawAttribute>,
    pub self_closing: bool,
    pub span: Span,
    pub error: Option<TagError>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    /// Text, possibly with entity references (decoded later).
    Text(Span),
    /// `<![CDATA[ ... ]]>`: `content` is the verbatim text between the markers.
    CData {
        span: Span,
        content: Span,
    },
    Comment(Span),
    /// `<? ... ?>`: the prolog `<?xml ...?>` and friends.
    ProcessingInstruction(Span),
    /// A `<` (span: that one byte) that does not start a tag; it is text.
    StrayLessThan {
        span: Span,
        reason: String,
    },
    /// `<!--` without `-->`: the opener is kept as text.
    UnterminatedComment(Span),
    /// `<![CDATA[` without `]]>`: the opener is kept as text.
    UnterminatedCData(Span),
    Tag(RawTag),
}

/// U+FEFF at the very start of a file: a byte-order mark, not content.
pub(crate) const BYTE_ORDER_MARK: char = '\u{feff}';

/// A construct that runs from an opener to a closer, with anything between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Delimited {
    Comment,
    CData,
    ProcessingInstruction,
}

impl Delimited {
    const COUNT: usize = 3;

    fn opener(self) -> &'static str {
        match self {
            Delimited::Comment => "<!--",
            Delimited::CData => "<![CDATA[",
            Delimited::ProcessingInstruction => "<?",
        }
    }

    fn closer(self) -> &'static str {
        match self {
            Delimited::Comment => "-->",
            Delimited::CData => "]]>",
            Delimited::ProcessingInstruction => "?>",
        }
    }
}

/// Iterator over the tokens of a source text.
pub(crate) struct Lexer<'s> {
    source: &'s str,
    position: usize,
    /// For each [`Delimited`] kind (indexed by `kind as usize`), the offset from which a search
    /// for its closer found none. Every later search would look at a suffix of that text and fail
    /// too, so it is not repeated: without this, a file of `<!--` repeated searches the rest of
    /// the file once per opener, quadratic in the file's length.
    no_closer_from: [Option<usize>; Delimited::COUNT],
    /// Bytes searched for closers, which tests compare with the source's length.
    #[cfg(test)]
    searched_bytes: usize,
}

impl<'s> Lexer<'s> {
    /// A UTF-8 byte-order mark (as Windows editors write) is skipped, not read as text: spans
    /// still count from the start of `source`.
    pub fn new(source: &'s str) -> Self {
        let position = if source.starts_with(BYTE_ORDER_MARK) {
            BYTE_ORDER_MARK.len_utf8()
        } else {
            0
        };
        Lexer {
            source,
            position,
            no_closer_from: [None; Delimited::COUNT],
            #[cfg(test)]
            searched_bytes: 0,
        }
    }

    /// Reads the construct of `kind` starting at `start` (its whole span, and its content between
    /// opener and closer); `None` if it is unterminated. Linear over a whole file: a successful
    /// search ends where the next token starts, and a failed one is made at most once per kind.
    fn delimited(&mut self, start: usize, kind: Delimited) -> Option<(Span, Span)> {
        let kind_index = kind as usize;
        let content_start = start + kind.opener().len();
        if self.no_closer_from[kind_index].is_some_and(|failed_from| content_start >= failed_from) {
            return None;
        }
        let rest = self.source.get(content_start..)?;
        let found = rest.find(kind.closer());
        #[cfg(test)]
        {
            self.searched_bytes += found.map_or(rest.len(), |offset| offset + kind.closer().len());
        }
        let Some(content_len) = found else {
            self.no_closer_from[kind_index] = Some(content_start);
            return None;
        };
        let content = Span::new(content_start, content_start + content_len);
        Some((Span::new(start, content.end + kind.closer().len()), content))
    }

    fn lex_tag(&self, start: usize, is_close: bool) -> TagOutcome {
        let name_start = start + if is_close { 2 } else { 1 };
        TagReader::new(self.source, start, name_start, is_close).read()
    }
}

impl Iterator for Lexer<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        let start = self.position;
        let rest = &self.source[start..];
        let mut content = ContentToken::lexer(rest);
        // Every byte of the source matches some content token, so an error cannot happen; if it
        // did, the byte (the whole char) is taken as text and lexing goes on.
        let kind = content.next()?.unwrap_or(ContentToken::Text);
        let end = start
            + content
                .span()
                .end
                .max(rest.chars().next().map_or(1, char::len_utf8));
        let (token, next_position) = match kind {
            ContentToken::Text => (Token::Text(Span::new(start, end)), end),
            ContentToken::CommentOpen => match self.delimited(start, Delimited::Comment) {
                Some((span, _)) => (Token::Comment(span), span.end),
                None => (Token::UnterminatedComment(Span::new(start, end)), end),
            },
            ContentToken::CDataOpen => match self.delimited(start, Delimited::CData) {
                Some((span, content)) => (Token::CData { span, content }, span.end),
                None => (Token::UnterminatedCData(Span::new(start, end)), end),
            },
            ContentToken::ProcessingInstructionOpen => {
                match self.delimited(start, Delimited::ProcessingInstruction) {
                    Some((span, _)) => (Token::ProcessingInstruction(span), span.end),
                    None => (
                        Token::StrayLessThan {
                            span: Span::new(start, start + 1),
                            reason: "`<?` has no closing `?>`".to_owned(),
                        },
                        start + 1,
                    ),
                }
            }
            ContentToken::CloseTagOpen | ContentToken::TagOpen => {
                match self.lex_tag(start, kind == ContentToken::CloseTagOpen) {
                    TagOutcome::Tag(tag) => {
                        let next = tag.span.end;
                        (Token::Tag(tag), next)
                    }
                    TagOutcome::NotATag { reason } => (
                        Token::StrayLessThan {
                            span: Span::new(start, start + 1),
                            reason,
                        },
                        start + 1,
                    ),
                }
            }
        };
        self.position = next_position;
        Some(token)
    }
}

enum TagOutcome {
    Tag(RawTag),
    NotATag { reason: String },
}

/// Reads one tag in tag mode, starting after `<` or `</`.
struct TagReader<'s> {
    source: &'s str,
    tag_start: usize,
    name_start: usize,
    is_close: bool,
}

/// Where reading a tag failed: the offending span and what was expected.
struct Failure {
    span: Span,
    message: String,
}

impl<'s> TagReader<'s> {
    fn new(source: &'s str, tag_start: usize, name_start: usize, is_close: bool) -> Self {
        TagReader {
            source,
            tag_start,
            name_start,
            is_close,
        }
    }

    fn read(self) -> TagOutcome {
        let mut lexer = TagToken::lexer(&self.source[self.name_start..]);
        let name = match lexer.next() {
            Some(Ok(TagToken::Name)) if lexer.span().start == 0 => self.name_at(lexer.span()),
            _ => {
                let opener = if self.is_close { "</" } else { "<" };
                return TagOutcome::NotATag {
                    reason: format!("`{opener}` is not followed by a tag name"),
                };
            }
        };
        let mut tag = RawTag {
            is_close: self.is_close,
            name,
            attributes: Vec::new(),
            self_closing: false,
            span: Span::new(self.tag_start, self.tag_start),
            error: None,
        };
        let mut last_good_end = tag.name.span.end;
        let failure = loop {
            let Some(token) = lexer.next() else {
                break Failure {
                    span: Span::new(self.tag_start, last_good_end),
                    message: "the file ends before the tag is closed with `>`".to_owned(),
                };
            };
            let span = self.absolute(lexer.span());
            match token {
                Ok(TagToken::End) => {
                    tag.span.end = span.end;
                    return TagOutcome::Tag(tag);
                }
                Ok(TagToken::SelfClosingEnd) if !self.is_close => {
                    tag.self_closing = true;
                    tag.span.end = span.end;
                    return TagOutcome::Tag(tag);
                }
                Ok(TagToken::SelfClosingEnd) => {
                    break Failure {
                        span,
                        message: "a close tag cannot end with `/>`".to_owned(),
                    };
                }
                Ok(TagToken::Name) if self.is_close => {
                    break Failure {
                        span,
                        message: "a close tag cannot have attributes".to_owned(),
                    };
                }
                Ok(TagToken::Name) => match self.read_attribute(&mut lexer, span) {
                    Ok(attribute) => {
                        last_good_end = attribute.span.end;
                        tag.attributes.push(attribute);
                    }
                    Err(failure) => break failure,
                },
                Ok(_) | Err(()) => {
                    let found = &self.source[span.start..span.end];
                    let expected = if self.is_close {
                        "`>`"
                    } else {
                        "an attribute name, `>` or `/>`"
                    };
                    break Failure {
                        span,
                        message: format!("expected {expected}, found `{found}`"),
                    };
                }
            }
        };
        if !names::is_structural(&tag.name.text) {
            return TagOutcome::NotATag {
                reason: format!("not a tag: {}", failure.message),
            };
        }
        tag.span.end = self.recovered_end(&failure, last_good_end, &mut tag.self_closing);
        tag.error = Some(TagError {
            span: failure.span,
            message: failure.message,
            cut_off: !self.source[..tag.span.end].ends_with('>'),
        });
        TagOutcome::Tag(tag)
    }

    /// After an attribute name: `=` and a value.
    fn read_attribute(
        &self,
        lexer: &mut logos::Lexer<'s, TagToken>,
        name_span: Span,
    ) -> Result<RawAttribute, Failure> {
        let name = Name {
            text: self.source[name_span.start..name_span.end].to_owned(),
            span: name_span,
        };
        let missing_value = |name: &Name| Failure {
            span: name.span,
            message: format!("attribute `{}` has no value", name.text),
        };
        match lexer.next() {
            Some(Ok(TagToken::Equals)) => {}
            _ => return Err(missing_value(&name)),
        }
        let (token, span) = match lexer.next() {
            Some(token) => (token, self.absolute(lexer.span())),
            None => return Err(missing_value(&name)),
        };
        let (value_span, quoted) = match token {
            Ok(TagToken::Quoted) => (Span::new(span.start + 1, span.end - 1), true),
            Ok(TagToken::Name | TagToken::Bare) => (span, false),
            Ok(TagToken::UnterminatedQuoted) => {
                let line_end = self.source[span.start..span.end]
                    .find('\n')
                    .map_or(span.end, |offset| span.start + offset);
                return Err(Failure {
                    span: Span::new(span.start, line_end),
                    message: format!("the value of `{}` has no closing quote", name.text),
                });
            }
            _ => return Err(missing_value(&name)),
        };
        Ok(RawAttribute {
            span: name.span.cover(span),
            name,
            value_span,
            quoted,
        })
    }

    /// Where a recovered tag ends: at a `>` on the failure's line before any other `<`, or else
    /// just after the last part that could be read.
    fn recovered_end(
        &self,
        failure: &Failure,
        last_good_end: usize,
        self_closing: &mut bool,
    ) -> usize {
        let rest = &self.source[failure.span.start..];
        let stop = rest.find(['<', '\n']).unwrap_or(rest.len());
        match rest[..stop].find('>') {
            Some(offset) => {
                let end = failure.span.start + offset + 1;
                *self_closing = !self.is_close && self.source[..end].ends_with("/>");
                end
            }
            None => last_good_end,
        }
    }

    fn absolute(&self, relative: std::ops::Range<usize>) -> Span {
        Span::new(
            self.name_start + relative.start,
            self.name_start + relative.end,
        )
    }

    fn name_at(&self, relative: std::ops::Range<usize>) -> Name {
        let span = self.absolute(relative);
        Name {
            text: self.source[span.start..span.end].to_owned(),
            span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(source: &str) -> Vec<String> {
        Lexer::new(source)
            .map(|token| match token {
                Token::Text(span) => format!("text {:?}", &source[span.start..span.end]),
                Token::CData { content, .. } => {
                    format!("cdata {:?}", &source[content.start..content.end])
                }
                Token::Comment(_) => "comment".to_owned(),
                Token::ProcessingInstruction(_) => "pi".to_owned(),
                Token::StrayLessThan { reason, .. } => format!("stray ({reason})"),
                Token::UnterminatedComment(_) => "unterminated comment".to_owned(),
                Token::UnterminatedCData(_) => "unterminated cdata".to_owned(),
                Token::Tag(tag) => {
                    let attributes: Vec<String> = tag
                        .attributes
                        .iter()
                        .map(|attribute| {
                            format!(
                                "{}={:?}",
                                attribute.name.text,
                                &source[attribute.value_span.start..attribute.value_span.end]
                            )
                        })
                        .collect();
                    format!(
                        "{}{} [{}]{}{}",
                        if tag.is_close { "/" } else { "" },
                        tag.name.text,
                        attributes.join(" "),
                        if tag.self_closing {
                            " self-closing"
                        } else {
                            ""
                        },
                        tag.error
                            .map(|error| format!(" error: {}", error.message))
                            .unwrap_or_default()
                    )
                }
            })
            .collect()
    }

    #[test]
    fn lexes_tags_with_quoted_and_unquoted_attributes() {
        assert_eq!(
            kinds(r#"<module name="a" src='f.txt' len=10 x=y/>"#),
            [r#"module [name="a" src="f.txt" len="10" x="y"] self-closing"#]
        );
        assert_eq!(kinds("</user >"), ["/user []"]);
        assert_eq!(kinds("<unit.py>"), ["unit.py []"]);
        assert_eq!(kinds("<doc-en-US a:b=\"1\">"), ["doc-en-US [a:b=\"1\"]"]);
    }

    #[test]
    fn a_less_than_that_starts_no_tag_is_text() {
        assert_eq!(
            kinds("0 <= x < n"),
            [
                "text \"0 \"",
                "stray (`<` is not followed by a tag name)",
                "text \"= x \"",
                "stray (`<` is not followed by a tag name)",
                "text \" n\""
            ]
        );
        assert_eq!(
            kinds("a<b and c>d")[1],
            "stray (not a tag: attribute `and` has no value)"
        );
        assert_eq!(kinds("<"), ["stray (`<` is not followed by a tag name)"]);
        assert_eq!(
            kinds("x</ y"),
            [
                "text \"x\"",
                "stray (`</` is not followed by a tag name)",
                "text \"/ y\""
            ]
        );
    }

    #[test]
    fn comments_cdata_and_prolog() {
        assert_eq!(
            kinds("<?xml version=\"1.0\"?><!-- c --><![CDATA[a < b]]>"),
            ["pi", "comment", "cdata \"a < b\""]
        );
        assert_eq!(
            kinds("<!-- open"),
            ["unterminated comment", "text \" open\""]
        );
        assert_eq!(kinds("<![CDATA[x"), ["unterminated cdata", "text \"x\""]);
        assert_eq!(
            kinds("<![CD"),
            ["stray (`<` is not followed by a tag name)", "text \"![CD\""]
        );
    }

    #[test]
    fn a_missing_closer_is_searched_for_once_per_kind() {
        // Each unterminated opener used to search the rest of the file again: for these 20 kB of
        // `<!--`, 5·10^7 bytes (for a megabyte, 10^11). Now a failed search is never repeated.
        let openers = ["<!--", "<?", "<![CDATA["];
        for opener in openers {
            let source = opener.repeat(20_000 / opener.len());
            let mut lexer = Lexer::new(&source);
            let tokens = lexer.by_ref().count();
            assert!(
                tokens >= source.len() / opener.len(),
                "{opener}: {tokens} tokens"
            );
            assert!(
                lexer.searched_bytes <= source.len(),
                "{opener}: {} bytes searched in a source of {}",
                lexer.searched_bytes,
                source.len()
            );
        }
        let mixed = openers.concat().repeat(2_000);
        let mut lexer = Lexer::new(&mixed);
        lexer.by_ref().for_each(drop);
        assert!(lexer.searched_bytes <= openers.len() * mixed.len());
        // A closed construct after the failed searches of other kinds is still found.
        let source = format!("{}<!-- c -->", "<?".repeat(10));
        assert_eq!(kinds(&source).last().map(String::as_str), Some("comment"));
    }

    #[test]
    fn malformed_tags_of_pml_elements_are_recovered() {
        assert_eq!(
            kinds("<module name=\"m>text"),
            [
                "module [] error: the value of `name` has no closing quote",
                "text \"text\""
            ]
        );
        assert_eq!(
            kinds("<module name>x"),
            [
                "module [] error: attribute `name` has no value",
                "text \"x\""
            ]
        );
        assert_eq!(
            kinds("<param name=\"a\"\n<b/>"),
            [
                "param [name=\"a\"] error: expected an attribute name, `>` or `/>`, found `<`",
                "text \"\\n\"",
                "b [] self-closing"
            ]
        );
        assert_eq!(
            kinds("</module x>")[0],
            "/module [] error: a close tag cannot have attributes"
        );
        assert_eq!(
            kinds("<param name=\"a\" 3/>"),
            [
                "param [name=\"a\"] self-closing error: expected an attribute name, `>` or `/>`, found `3`"
            ]
        );
        assert_eq!(
            kinds("<module"),
            ["module [] error: the file ends before the tag is closed with `>`"]
        );
    }

    #[test]
    fn malformed_tags_of_other_names_are_text() {
        assert_eq!(
            kinds("<foo bar>")[0],
            "stray (not a tag: attribute `bar` has no value)"
        );
        assert_eq!(
            kinds("<foo"),
            [
                "stray (not a tag: the file ends before the tag is closed with `>`)",
                "text \"foo\""
            ]
        );
    }

    #[test]
    fn non_ascii_text_and_names() {
        assert_eq!(kinds("é<été>ü"), ["text \"é\"", "été []", "text \"ü\""]);
    }
}
