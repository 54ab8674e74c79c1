//! Tool calls when the model may call or answer (`tool_choice: auto`, every agent framework's
//! default), as llama.cpp's server does them: the answer is free until it begins a call, and from
//! that point on a grammar holds the call to the offered tools' schemas. A call begins at a
//! Hermes `<tool_call>` anywhere, or, at the answer's start, at a bare or fenced object naming
//! its function (`{"name":`, ```` ```json\n{"name": ````), which small models write instead of
//! the tags. The grammar takes the text from the trigger's first byte on, so the call's text the
//! model wrote before the trigger was recognised is held to it as well.

use crate::tool_calls::{HERMES_CLOSE, HERMES_OPEN, ToolCallFormat, ToolSpec};

/// The grammars a lazily constrained answer switches to, by the trigger met.
#[derive(Clone, Debug, PartialEq)]
pub struct LazyToolGrammar {
    /// From a `<tool_call>` on (Hermes): one tagged call, or several when parallel.
    tagged: Option<String>,
    /// From the answer's bare or fenced call object on.
    bare: String,
}

/// Where an answer's text began a call, and the grammar that holds it from there.
#[derive(Debug, PartialEq, Eq)]
pub struct Trigger<'a> {
    /// Byte offset in the answer of the call's first byte.
    pub at: usize,
    /// The Lark grammar (llguidance's dialect) the text from `at` on must match.
    pub grammar: &'a str,
}

/// Whether an answer's start is a call object's start.
#[derive(Debug, PartialEq, Eq)]
enum Opening {
    /// It is: the object (or its fence) begins at this byte.
    At(usize),
    /// Too little text to tell.
    Undecided,
    /// It is not.
    No,
}

impl LazyToolGrammar {
    /// The grammars of `tools` in `format` (`parallel`: several tagged calls may follow).
    pub fn new(format: ToolCallFormat, tools: &[ToolSpec], parallel: bool) -> Self {
        let schema = format.call_schema(tools);
        let tagged = (format == ToolCallFormat::Hermes).then(|| {
            let more = if parallel { " (WS call)*" } else { "" };
            format!(
                "start: call{more} WS?\ncall: \"{HERMES_OPEN}\" WS? body WS? \"{HERMES_CLOSE}\"\n\
                 body: %json {schema}\nWS: /[ \\t\\r\\n]+/\n"
            )
        });
        let bare = format!(
            "start: FENCE? body TAIL?\nbody: %json {schema}\nFENCE: /```[A-Za-z]*[ \\t\\r\\n]*/\n\
             TAIL: /[ \\t\\r\\n]+(```[ \\t\\r\\n]*)?|```[ \\t\\r\\n]*/\n"
        );
        Self { tagged, bare }
    }

    /// Every grammar a call may switch to (compiled up front, so a schema they cannot take is
    /// refused before the answer starts).
    pub fn grammars(&self) -> impl Iterator<Item = &str> {
        self.tagged
            .as_deref()
            .into_iter()
            .chain([self.bare.as_str()])
    }

    /// Whether a call may begin anywhere in an answer (a tag), not only at its start.
    pub fn has_tags(&self) -> bool {
        self.tagged.is_some()
    }

    /// The call `answer` has begun, if any; `scanned`: how far an earlier look at the same
    /// (growing) answer found no tag, so a look costs the new text only.
    pub fn trigger<'a>(&'a self, answer: &str, scanned: usize) -> Option<Trigger<'a>> {
        if let Opening::At(at) = opening(answer) {
            return Some(Trigger {
                at,
                grammar: &self.bare,
            });
        }
        let tagged = self.tagged.as_deref()?;
        let mut from = scanned.saturating_sub(HERMES_OPEN.len()).min(answer.len());
        while !answer.is_char_boundary(from) {
            from -= 1;
        }
        answer[from..].find(HERMES_OPEN).map(|found| Trigger {
            at: from + found,
            grammar: tagged,
        })
    }

    /// Whether `answer` may still begin a bare call (or is too short to tell): while it may, a
    /// later look must check its start again.
    pub fn may_open(&self, answer: &str) -> bool {
        opening(answer) == Opening::Undecided
    }
}

/// Whether `answer` starts (after whitespace) with a call object, `{` `"name"` `:` with
/// whitespace between, bare or after a Markdown fence (```` ``` ```` and a language name).
fn opening(answer: &str) -> Opening {
    let start = answer.len() - answer.trim_start().len();
    let mut rest = &answer[start..];
    if rest.is_empty() {
        return Opening::Undecided;
    }
    if rest.starts_with('`') {
        let Some(after) = rest.strip_prefix("```") else {
            return if "```".starts_with(rest) {
                Opening::Undecided
            } else {
                Opening::No
            };
        };
        let after = after.trim_start_matches(|c: char| c.is_ascii_alphabetic());
        let after = after.trim_start();
        if after.is_empty() {
            return Opening::Undecided;
        }
        rest = after;
    }
    // `{`, then `"name"`, then `:`, whitespace allowed between.
    let mut expected = ["{", "\"name\"", ":"].into_iter();
    let mut piece = expected.next();
    let mut text = rest;
    while let Some(want) = piece {
        text = text.trim_start();
        if text.is_empty() {
            return Opening::Undecided;
        }
        if let Some(after) = text.strip_prefix(want) {
            text = after;
            piece = expected.next();
        } else if want.starts_with(text) {
            return Opening::Undecided;
        } else {
            return Opening::No;
        }
    }
    Opening::At(start)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn grammar() -> LazyToolGrammar {
        let weather = ToolSpec {
            name: "get_weather".to_string(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        };
        LazyToolGrammar::new(ToolCallFormat::Hermes, &[weather], true)
    }

    #[test]
    fn bare_and_fenced_objects_naming_a_function_open_a_call() {
        let lazy = grammar();
        for (answer, at) in [
            ("{\"name\":", 0),
            ("\n  { \"name\" :", 3),
            ("```json\n{\n  \"name\":", 0),
            ("  ```\n{\"name\":", 2),
        ] {
            let trigger = lazy.trigger(answer, 0).expect(answer);
            assert_eq!(trigger.at, at, "{answer:?}");
            assert!(trigger.grammar.contains("FENCE"), "{answer:?}");
        }
        for undecided in ["", "  ", "`", "```json", "```json\n", "{", "{ \"na"] {
            assert!(lazy.trigger(undecided, 0).is_none(), "{undecided:?}");
            assert!(lazy.may_open(undecided), "{undecided:?}");
        }
        for text in ["The weather", "```python\nprint()", "{\"city\":", "``x"] {
            assert!(lazy.trigger(text, 0).is_none(), "{text:?}");
            assert!(!lazy.may_open(text), "{text:?}");
        }
    }

    #[test]
    fn a_tag_anywhere_opens_a_tagged_call_and_scans_only_new_text() {
        let lazy = grammar();
        let answer = "Let me check. <tool_call>";
        let trigger = lazy.trigger(answer, 0).expect("a tag");
        assert_eq!(trigger.at, 14);
        assert!(trigger.grammar.contains(HERMES_CLOSE));
        // The tag split across two looks is still found.
        assert_eq!(lazy.trigger(answer, 20).map(|t| t.at), Some(14));
        assert!(lazy.trigger("Let me check. <tool_", 0).is_none());
        let llama = LazyToolGrammar::new(ToolCallFormat::Llama3Json, &[], false);
        assert!(llama.trigger(answer, 0).is_none(), "Llama 3 has no tags");
    }
}
