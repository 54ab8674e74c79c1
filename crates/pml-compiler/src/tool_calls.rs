//! How a chat template's model writes tool calls: which format its template teaches (Hermes'
//! `<tool_call>{…}</tool_call>` blocks for Qwen2.5/Qwen3 and Hermes fine-tunes, Llama 3.x's bare
//! `{"name": …, "parameters": …}`), the grammar that forces a call when one is required, and a
//! parser that splits the model's text, as it streams, into content and calls (as llama.cpp's
//! `common/chat.cpp` parses each format).

use serde_json::{Map, Value, json};

use crate::chat_template::ChatTemplate;
use crate::decoding_schema::decoding_schema;

/// The tool-call syntax a template teaches its model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one block per call.
    Hermes,
    /// The whole answer is `{"name": …, "parameters": {…}}` (after `<|python_tag|>` at times).
    Llama3Json,
}

/// A function the model may call: its name and the JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub parameters: Value,
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON value (an object for every well-formed call).
    pub arguments: Value,
}

/// What the model's text turns out to be, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolOutput {
    Content(String),
    Call(ToolCall),
}

pub(crate) const HERMES_OPEN: &str = "<tool_call>";
pub(crate) const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

impl ToolCallFormat {
    /// The format `template` teaches, or `None` when it does not render tools in a known way.
    pub fn of(template: &ChatTemplate) -> Option<Self> {
        let source = template.source.as_str();
        if source.contains(HERMES_OPEN) {
            Some(Self::Hermes)
        } else if source.contains(PYTHON_TAG) || source.contains("\"parameters\": ") {
            Some(Self::Llama3Json)
        } else {
            None
        }
    }

    /// The key under which this format writes a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            Self::Hermes => "arguments",
            Self::Llama3Json => "parameters",
        }
    }

    /// The JSON Schema of one call object of one of `tools` in this format (its arguments' as
    /// constrained decoding takes it, [`decoding_schema`]).
    pub(crate) fn call_schema(self, tools: &[ToolSpec]) -> Value {
        let key = self.arguments_key();
        let alternatives: Vec<Value> = tools
            .iter()
            .map(|tool| {
                let mut properties = Map::new();
                properties.insert("name".into(), json!({"const": tool.name}));
                properties.insert(key.into(), decoding_schema(&tool.parameters));
                json!({
                    "type": "object",
                    "properties": properties,
                    "required": ["name", key],
                    "additionalProperties": false,
                })
            })
            .collect();
        json!({"anyOf": alternatives})
    }

    /// A Lark grammar (llguidance's dialect) whose texts are exactly: one call of one of `tools`
    /// in this format, or (`parallel`, Hermes only) one or more calls.
    pub fn grammar(self, tools: &[ToolSpec], parallel: bool) -> String {
        let schema = self.call_schema(tools);
        match self {
            Self::Hermes => {
                let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
                format!(
                    "start: call{repeat}\ncall: \"{HERMES_OPEN}\\n\" body \"\\n{HERMES_CLOSE}\"\nbody: %json {schema}\n"
                )
            }
            Self::Llama3Json => format!("start: %json {schema}\n"),
        }
    }
}

/// Splits the model's text into content and calls as it arrives: content is released as soon as
/// it cannot be the start of a call; a call once it is complete. A call that does not parse
/// stays content, verbatim.
///
/// Small Hermes-trained models often drop the tags and answer with the bare call object; an
/// answer that starts with a JSON object naming an offered function (`known`) is read as that
/// call, as Llama 3's format is, and so is each such object right after it; whatever else follows
/// the calls is dropped, as llama.cpp's parsers drop it (models echo a schema's `title` there).
/// An answer starting with `{` is held until its first object closes: then it is a call, or text
/// released at once.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    known: Vec<String>,
    /// Text not yet released.
    held: String,
    state: ParseState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParseState {
    /// Nothing but whitespace so far (here it is decided whether the answer is a bare call).
    Start,
    Text,
    /// Inside a Hermes block, after its opening tag.
    InCall,
    /// The answer may be a bare call object; held until its first object closes.
    WholeCall,
    /// After a bare call: more call objects, or the rest of the answer, dropped.
    AfterCalls,
    /// Past the calls: nothing more is released.
    Dropped,
}

impl ToolCallParser {
    /// A parser for `format`'s calls; `known`: the offered functions' names.
    pub fn new(format: ToolCallFormat, known: Vec<String>) -> Self {
        Self {
            format,
            known,
            held: String::new(),
            state: ParseState::Start,
        }
    }

    /// Takes the next piece of the model's text; returns what is now certain.
    pub fn feed(&mut self, text: &str) -> Vec<ToolOutput> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match (self.format, self.state) {
                (_, ParseState::Dropped) => {
                    self.held.clear();
                    return out;
                }
                (_, ParseState::WholeCall | ParseState::AfterCalls) => {
                    let trimmed = self.held.trim_start();
                    let body = trimmed.strip_prefix(PYTHON_TAG).unwrap_or(trimmed);
                    let body = match after_fence(body.trim_start()) {
                        Fence::Open => return out,
                        Fence::After(body) => body,
                    };
                    let start = self.held.len() - body.len();
                    let first_object = match json_object_end(body) {
                        JsonEnd::At(end) => Some(end),
                        JsonEnd::Open => return out,
                        JsonEnd::NotAnObject => None,
                    };
                    let call = first_object
                        .and_then(|end| parse_call(&body[..end], self.format.arguments_key()))
                        .filter(|call| self.known.contains(&call.name));
                    match (call, first_object, self.state) {
                        (Some(call), Some(end), _) => {
                            out.push(ToolOutput::Call(call));
                            self.held.drain(..start + end);
                            self.state = ParseState::AfterCalls;
                        }
                        (_, _, ParseState::AfterCalls) => self.state = ParseState::Dropped,
                        _ => {
                            // Not a call: the answer is text, released from here on.
                            push_content(&mut out, std::mem::take(&mut self.held));
                            self.state = ParseState::Text;
                        }
                    }
                }
                (ToolCallFormat::Llama3Json, ParseState::Start) => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() || PYTHON_TAG.starts_with(trimmed) {
                        return out;
                    }
                    self.state =
                        if trimmed.starts_with(['{', '`']) || trimmed.starts_with(PYTHON_TAG) {
                            ParseState::WholeCall
                        } else {
                            ParseState::Text
                        };
                }
                (ToolCallFormat::Llama3Json, _) => {
                    push_content(&mut out, std::mem::take(&mut self.held));
                    return out;
                }
                (ToolCallFormat::Hermes, ParseState::Start)
                    if self.held.trim_start().starts_with(['{', '`']) =>
                {
                    self.state = ParseState::WholeCall;
                }
                (ToolCallFormat::Hermes, ParseState::Start)
                    if self.held.trim_start().is_empty() =>
                {
                    return out;
                }
                (ToolCallFormat::Hermes, ParseState::Start | ParseState::Text) => {
                    if let Some(at) = self.held.find(HERMES_OPEN) {
                        push_content(&mut out, self.held[..at].to_owned());
                        self.held.drain(..at + HERMES_OPEN.len());
                        self.state = ParseState::InCall;
                    } else {
                        // Keep back a tail that may be the opening tag's start.
                        let keep = partial_suffix(&self.held, HERMES_OPEN);
                        let release = self.held.len() - keep;
                        push_content(&mut out, self.held[..release].to_owned());
                        self.held.drain(..release);
                        if release > 0 {
                            self.state = ParseState::Text;
                        }
                        return out;
                    }
                }
                (ToolCallFormat::Hermes, ParseState::InCall) => {
                    let Some(at) = self.held.find(HERMES_CLOSE) else {
                        return out;
                    };
                    let body = self.held[..at].to_owned();
                    self.held.drain(..at + HERMES_CLOSE.len());
                    out.push(match parse_call(&body, "arguments") {
                        Some(call) => ToolOutput::Call(call),
                        None => ToolOutput::Content(format!("{HERMES_OPEN}{body}{HERMES_CLOSE}")),
                    });
                    self.state = ParseState::Text;
                }
            }
        }
    }

    /// The end of the answer: whatever is held, resolved.
    pub fn finish(mut self) -> Vec<ToolOutput> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.state {
            ParseState::WholeCall => {
                let body = held.trim_start();
                let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
                let body = match after_fence(body.trim_start()) {
                    Fence::After(body) => body.trim_end().trim_end_matches("```"),
                    Fence::Open => body,
                };
                match parse_call(body, self.format.arguments_key()) {
                    Some(call) if self.known.contains(&call.name) => {
                        out.push(ToolOutput::Call(call));
                    }
                    _ => push_content(&mut out, held),
                }
            }
            // A block cut off by the token limit may still hold a whole call.
            ParseState::InCall => match parse_call(&held, "arguments") {
                Some(call) => out.push(ToolOutput::Call(call)),
                None => push_content(&mut out, format!("{HERMES_OPEN}{held}")),
            },
            ParseState::Start | ParseState::Text => push_content(&mut out, held),
            ParseState::AfterCalls | ParseState::Dropped => {}
        }
        out
    }
}

/// A Markdown fence a call object may sit in (```` ```json ````), at the start of a text.
#[derive(Debug, PartialEq, Eq)]
enum Fence<'a> {
    /// The text after the fence and its language name (the whole text when it has none).
    After(&'a str),
    /// A fence's start, or a fence whose language name may go on: too little text to tell.
    Open,
}

fn after_fence(text: &str) -> Fence<'_> {
    let Some(after) = text.strip_prefix("```") else {
        return if !text.is_empty() && "```".starts_with(text) {
            Fence::Open
        } else {
            Fence::After(text)
        };
    };
    let rest = after.trim_start_matches(|c: char| c.is_ascii_alphabetic());
    if rest.is_empty() {
        return Fence::Open;
    }
    Fence::After(rest.trim_start())
}

/// Where the JSON object at the start of `text` ends.
#[derive(Debug, PartialEq, Eq)]
enum JsonEnd {
    /// Just past its closing brace.
    At(usize),
    /// Not closed yet (`text` empty or whitespace included: it may still start one).
    Open,
    /// `text` starts with something else.
    NotAnObject,
}

/// Finds the end of the object `text` starts with by its braces, outside strings: the object's
/// text is then parsed as JSON by whoever asked.
fn json_object_end(text: &str) -> JsonEnd {
    if text.is_empty() || PYTHON_TAG.starts_with(text) {
        return JsonEnd::Open;
    }
    if !text.starts_with('{') {
        return JsonEnd::NotAnObject;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, byte) in text.bytes().enumerate() {
        match (in_string, escaped, byte) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'{' | b'[') => depth += 1,
            (false, _, b'}' | b']') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return JsonEnd::At(at + 1);
                }
            }
            (false, _, _) => {}
        }
    }
    JsonEnd::Open
}

fn push_content(out: &mut Vec<ToolOutput>, text: String) {
    if !text.is_empty() {
        out.push(ToolOutput::Content(text));
    }
}

/// The length of the longest end of `text` that is a proper start of `tag`.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len().min(text.len() + 1))
        .rev()
        .find(|&length| {
            text.is_char_boundary(text.len() - length) && text.ends_with(&tag[..length])
        })
        .unwrap_or(0)
}

/// `{"name": …, <key>: {…}}` (either key accepted: models mix them up), whitespace around.
fn parse_call(body: &str, key: &str) -> Option<ToolCall> {
    let Value::Object(mut object) = serde_json::from_str::<Value>(body.trim()).ok()? else {
        return None;
    };
    let name = object.remove("name")?.as_str()?.to_owned();
    let other = if key == "arguments" {
        "parameters"
    } else {
        "arguments"
    };
    let arguments = object
        .remove(key)
        .or_else(|| object.remove(other))
        .unwrap_or_else(|| json!({}));
    // Some models write the arguments as a JSON string.
    let arguments = match arguments {
        Value::String(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        other => other,
    };
    Some(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ToolOutput {
        ToolOutput::Call(ToolCall {
            name: name.to_owned(),
            arguments,
        })
    }

    fn content(text: &str) -> ToolOutput {
        ToolOutput::Content(text.to_owned())
    }

    /// Feeds `pieces` one by one and returns everything released, finish included.
    fn parse(format: ToolCallFormat, pieces: &[&str]) -> Vec<ToolOutput> {
        let known = ["get_weather", "get_time", "f"].map(str::to_owned).to_vec();
        let mut parser = ToolCallParser::new(format, known);
        let mut out: Vec<ToolOutput> = pieces.iter().flat_map(|piece| parser.feed(piece)).collect();
        out.extend(parser.finish());
        out
    }

    #[test]
    fn hermes_calls_split_across_pieces() {
        let pieces = [
            "Let me check.\n<tool",
            "_call>\n{\"name\": \"get_weather\", \"argu",
            "ments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n",
            "{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        ];
        assert_eq!(
            parse(ToolCallFormat::Hermes, &pieces),
            [
                content("Let me check.\n"),
                call("get_weather", json!({"city": "Paris"})),
                content("\n"),
                call("get_time", json!({})),
            ]
        );
    }

    #[test]
    fn a_bare_call_object_naming_an_offered_function_is_a_call() {
        assert_eq!(
            parse(
                ToolCallFormat::Hermes,
                &[
                    "\n{\"name\": \"get_weather\", ",
                    "\"arguments\": {\"city\": \"Paris\"}}"
                ]
            ),
            [call("get_weather", json!({"city": "Paris"}))]
        );
        let other = "{\"name\": \"Ada\", \"arguments\": {}}";
        assert_eq!(parse(ToolCallFormat::Hermes, &[other]), [content(other)]);
        assert_eq!(
            parse(ToolCallFormat::Llama3Json, &[other]),
            [content(other)],
            "Llama 3's bare calls must name an offered function too"
        );
    }

    #[test]
    fn a_fenced_call_object_is_a_call_and_fenced_code_stays_text() {
        let fenced = [
            "``",
            "`json\n{\n  \"name\": \"get_weather\",\n",
            "  \"arguments\": {\"city\": \"Paris\"}\n}\n``",
            "`",
        ];
        for format in [ToolCallFormat::Hermes, ToolCallFormat::Llama3Json] {
            let key = if format == ToolCallFormat::Hermes {
                "arguments"
            } else {
                "parameters"
            };
            let pieces: Vec<String> = fenced.iter().map(|p| p.replace("arguments", key)).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(
                parse(format, &pieces),
                [call("get_weather", json!({"city": "Paris"}))],
                "{format:?}"
            );
        }
        // Cut off before its closing fence: still the call.
        assert_eq!(
            parse(
                ToolCallFormat::Hermes,
                &["```json\n{\"name\": \"f\", \"arguments\": {}}"]
            ),
            [call("f", json!({}))]
        );
        let code = "```python\nprint({\"name\": 1})\n```";
        assert_eq!(parse(ToolCallFormat::Hermes, &[code]), [content(code)]);
    }

    #[test]
    fn a_leading_bare_call_is_read_and_what_follows_dropped() {
        // The Agents SDK's strict schemas carry a `title` the model echoes after the call.
        let echoed = [
            "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "\n{\"name\": \"get_weather_args\", \"title\": \"{\"}\nDone.",
        ];
        assert_eq!(
            parse(ToolCallFormat::Hermes, &echoed),
            [call("get_weather", json!({"city": "Paris"}))]
        );
        let two = [
            "{\"name\": \"get_time\", \"arguments\": {}}\n",
            "{\"name\": \"f\"}",
        ];
        assert_eq!(
            parse(ToolCallFormat::Hermes, &two),
            [call("get_time", json!({})), call("f", json!({}))]
        );
        assert_eq!(
            parse(
                ToolCallFormat::Llama3Json,
                &["{\"name\": \"f\", \"parameters\": {}} and then some"]
            ),
            [call("f", json!({}))]
        );
    }

    #[test]
    fn an_object_that_is_no_call_is_released_once_it_closes() {
        let mut parser = ToolCallParser::new(ToolCallFormat::Hermes, vec!["f".to_owned()]);
        assert_eq!(parser.feed("{\"answer\": \"}{\""), []);
        assert_eq!(
            parser.feed(", \"n\": [1]} and more"),
            [content("{\"answer\": \"}{\", \"n\": [1]} and more")]
        );
        assert_eq!(parser.feed(" text"), [content(" text")]);
        assert_eq!(parser.finish(), []);
        assert_eq!(json_object_end("{\"a\": \"\\\"}\"}x"), JsonEnd::At(12));
        assert_eq!(json_object_end("[1]"), JsonEnd::NotAnObject);
        assert_eq!(json_object_end("{\"a\": {"), JsonEnd::Open);
    }

    #[test]
    fn hermes_releases_text_that_cannot_open_a_call() {
        let mut parser = ToolCallParser::new(ToolCallFormat::Hermes, Vec::new());
        assert_eq!(parser.feed("a < b <to"), [content("a < b ")]);
        assert_eq!(parser.feed("ast>"), [content("<toast>")]);
        assert_eq!(parser.finish(), []);
    }

    #[test]
    fn broken_calls_stay_content() {
        assert_eq!(
            parse(ToolCallFormat::Hermes, &["<tool_call>not json</tool_call>"]),
            [content("<tool_call>not json</tool_call>")]
        );
        assert_eq!(
            parse(ToolCallFormat::Hermes, &["<tool_call>\n{\"name\": \"f\""]),
            [content("<tool_call>\n{\"name\": \"f\"")]
        );
        assert_eq!(
            parse(ToolCallFormat::Llama3Json, &["{not a call}"]),
            [content("{not a call}")]
        );
    }

    #[test]
    fn a_block_cut_off_before_its_closing_tag_is_still_a_call() {
        assert_eq!(
            parse(
                ToolCallFormat::Hermes,
                &["<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}"]
            ),
            [call("f", json!({"x": 1}))]
        );
    }

    #[test]
    fn llama3_answers_are_calls_or_text() {
        assert_eq!(
            parse(
                ToolCallFormat::Llama3Json,
                &[
                    " {\"name\": \"get_weather\", ",
                    "\"parameters\": {\"city\": \"Oslo\"}}"
                ]
            ),
            [call("get_weather", json!({"city": "Oslo"}))]
        );
        assert_eq!(
            parse(
                ToolCallFormat::Llama3Json,
                &["<|python", "_tag|>{\"name\": \"f\", \"parameters\": {}}"]
            ),
            [call("f", json!({}))]
        );
        assert_eq!(
            parse(ToolCallFormat::Llama3Json, &["It is ", "sunny."]),
            [content("It is "), content("sunny.")]
        );
    }

    #[test]
    fn partial_suffixes_respect_characters() {
        assert_eq!(partial_suffix("ab<tool_", HERMES_OPEN), 6);
        assert_eq!(partial_suffix("é", HERMES_OPEN), 0);
        assert_eq!(partial_suffix("<tool_call>", HERMES_OPEN), 0);
        assert_eq!(partial_suffix("", HERMES_OPEN), 0);
    }

    #[test]
    fn grammars_name_each_tool() {
        let tools = [ToolSpec {
            name: "get_weather".to_owned(),
            parameters: json!({"type": "object"}),
        }];
        let hermes = ToolCallFormat::Hermes.grammar(&tools, true);
        assert!(
            hermes.starts_with("start: call (\"\\n\" call)*\n"),
            "{hermes}"
        );
        assert!(hermes.contains("\"const\":\"get_weather\""), "{hermes}");
        let llama = ToolCallFormat::Llama3Json.grammar(&tools, true);
        assert!(llama.starts_with("start: %json {"), "{llama}");
        assert!(
            llama.contains("\"required\":[\"name\",\"parameters\"]"),
            "{llama}"
        );
    }
}
