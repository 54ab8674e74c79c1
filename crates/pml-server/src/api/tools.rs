//! Tool calling as OpenAI's chat API spells it: `tools`, `tool_choice`, `parallel_tool_calls` in
//! the request; assistant `tool_calls` and `tool` results among the messages; calls in the
//! answer (`message.tool_calls`, or `delta.tool_calls` when streamed) parsed from the model's
//! text in the format its template teaches ([`ToolCallFormat`]).

use pml_compiler::lazy_tool_grammar::LazyToolGrammar;
use pml_compiler::tool_calls::{ToolCall, ToolCallFormat, ToolCallParser, ToolOutput, ToolSpec};
use serde_json::{Value, json};

use super::error::ApiError;
use crate::engine::structured::ResponseFormat;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model answers in text; the tools are not shown to it.
    None,
    /// The model decides.
    Auto,
    /// The model must call one tool or more.
    Required,
    /// The model must call this function.
    Named(String),
}

/// The tools a request offers, checked.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// As the template renders them (`{"type": "function", "function": {…}}`).
    pub definitions: Vec<Value>,
    pub specs: Vec<ToolSpec>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// How the answer of a request with tools is read and constrained.
#[derive(Clone, Debug)]
pub struct ToolUse {
    pub format: ToolCallFormat,
    /// The offered functions' names.
    pub names: Vec<String>,
    pub parallel: bool,
    /// The grammar that forces a call (`tool_choice` `required` or a named function), or that
    /// holds a call to the tools' schemas once the model begins one (`auto`).
    pub grammar: Option<ResponseFormat>,
}

/// OpenAI's rule for function names.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls`, checked; `None` when there are no tools.
pub fn tool_request(
    tools: Option<&[Value]>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolRequest>, ApiError> {
    let tools = tools.unwrap_or_default();
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(choice) => Some(tool_choice(choice)?),
    };
    if tools.is_empty() {
        return match choice {
            None | Some(ToolChoice::None) if parallel.is_none() => Ok(None),
            _ => Err(ApiError::bad_field(
                if parallel.is_some() {
                    "parallel_tool_calls"
                } else {
                    "tool_choice"
                },
                "`tool_choice` and `parallel_tool_calls` need `tools`",
            )),
        };
    }
    let mut definitions = Vec::with_capacity(tools.len());
    let mut specs: Vec<ToolSpec> = Vec::with_capacity(tools.len());
    for (index, tool) in tools.iter().enumerate() {
        let at = format!("tools[{index}]");
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("tools of type `{other}` are not supported (function only)"),
                ));
            }
            None => {
                return Err(ApiError::bad_field(
                    format!("{at}.type"),
                    "a tool needs a `type`",
                ));
            }
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(ApiError::bad_field(
                format!("{at}.function"),
                "a function tool needs a `function` object",
            ));
        };
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        if !valid_name(name) {
            return Err(ApiError::bad_field(
                format!("{at}.function.name"),
                format!("function name `{name}`: 1 to 64 letters, digits, underscores or dashes"),
            ));
        }
        if specs.iter().any(|spec| spec.name == name) {
            return Err(ApiError::bad_field(
                format!("{at}.function.name"),
                format!("two tools are named `{name}`"),
            ));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(parameters) if parameters.is_object() => parameters.clone(),
            Some(_) => {
                return Err(ApiError::bad_field(
                    format!("{at}.function.parameters"),
                    "`parameters` must be a JSON Schema object",
                ));
            }
        };
        for key in function.keys() {
            if !matches!(
                key.as_str(),
                "name" | "description" | "parameters" | "strict"
            ) {
                return Err(ApiError::bad_field(
                    format!("{at}.function.{key}"),
                    format!("unknown function field `{key}`"),
                ));
            }
        }
        specs.push(ToolSpec {
            name: name.to_owned(),
            parameters,
        });
        definitions.push(tool.clone());
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(name) = &choice
        && !specs.iter().any(|spec| &spec.name == name)
    {
        return Err(ApiError::bad_field(
            "tool_choice",
            format!("tool_choice names `{name}`, which is not among `tools`"),
        ));
    }
    Ok(Some(ToolRequest {
        definitions,
        specs,
        choice,
        parallel: parallel.unwrap_or(true),
    }))
}

fn tool_choice(choice: &Value) -> Result<ToolChoice, ApiError> {
    match choice {
        Value::String(word) => match word.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::bad_field(
                "tool_choice",
                format!("tool_choice `{other}`: expected none, auto, required or a function"),
            )),
        },
        Value::Object(fields) => {
            let name = fields
                .get("function")
                .and_then(|function| function.get("name"))
                .and_then(Value::as_str);
            match (fields.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Ok(ToolChoice::Named(name.to_owned())),
                _ => Err(ApiError::bad_field(
                    "tool_choice",
                    "a tool_choice object is `{\"type\": \"function\", \"function\": {\"name\": …}}`",
                )),
            }
        }
        _ => Err(ApiError::bad_field(
            "tool_choice",
            "tool_choice must be a string or an object",
        )),
    }
}

impl ToolRequest {
    /// How to read the answer in the model's `format`; `None` for `tool_choice: none`.
    pub fn tool_use(&self, format: ToolCallFormat) -> Option<ToolUse> {
        let (specs, parallel): (Vec<ToolSpec>, bool) = match &self.choice {
            ToolChoice::None => return None,
            ToolChoice::Auto => (Vec::new(), self.parallel),
            ToolChoice::Required => (self.specs.clone(), self.parallel),
            ToolChoice::Named(name) => (
                self.specs
                    .iter()
                    .filter(|spec| &spec.name == name)
                    .cloned()
                    .collect(),
                false,
            ),
        };
        // Llama 3's format has one call per answer.
        let parallel = parallel && format == ToolCallFormat::Hermes;
        let grammar = match self.choice {
            ToolChoice::Auto if !self.specs.is_empty() => Some(ResponseFormat::LazyToolCall(
                LazyToolGrammar::new(format, &self.specs, parallel),
            )),
            _ if !specs.is_empty() => {
                Some(ResponseFormat::ToolCall(format.grammar(&specs, parallel)))
            }
            _ => None,
        };
        Some(ToolUse {
            format,
            names: self.specs.iter().map(|spec| spec.name.clone()).collect(),
            parallel,
            grammar,
        })
    }
}

/// An assistant message's `tool_calls` as the template reads them: each call's `arguments`
/// string parsed into its JSON value (templates `tojson` it; llama.cpp's server does the same).
pub fn template_tool_calls(at: &str, calls: &Value) -> Result<Value, ApiError> {
    let Some(calls) = calls.as_array() else {
        return Err(ApiError::bad_field(at, "`tool_calls` must be a list"));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (index, call) in calls.iter().enumerate() {
        let at = format!("{at}[{index}]");
        let function = call.get("function").and_then(Value::as_object);
        let name = function
            .and_then(|function| function.get("name"))
            .and_then(Value::as_str)
            .filter(|name| valid_name(name));
        let (Some(function), Some(name)) = (function, name) else {
            return Err(ApiError::bad_field(
                format!("{at}.function"),
                "a tool call needs a `function` with a valid `name`",
            ));
        };
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|error| {
                ApiError::bad_field(
                    format!("{at}.function.arguments"),
                    format!("the arguments are not JSON: {error}"),
                )
            })?,
            None | Some(Value::Null) => json!({}),
            Some(other) => other.clone(),
        };
        let mut entry = json!({
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        });
        if let Some(id) = call.get("id").filter(|id| !id.is_null()) {
            entry["id"] = id.clone();
        }
        out.push(entry);
    }
    Ok(Value::Array(out))
}

/// One choice's answer read for tool calls, as it streams.
#[derive(Debug)]
pub struct ToolReader {
    parser: Option<ToolCallParser>,
    parallel: bool,
    /// Calls released so far.
    calls: usize,
}

/// A piece of a choice's answer, once read.
#[derive(Clone, Debug, PartialEq)]
pub enum AnswerPiece {
    Text(String),
    /// The `index`-th call of the choice.
    Call {
        index: usize,
        call: ToolCall,
    },
}

impl ToolReader {
    pub fn new(tools: Option<&ToolUse>) -> Self {
        Self {
            parser: tools.map(|tools| ToolCallParser::new(tools.format, tools.names.clone())),
            parallel: tools.is_some_and(|tools| tools.parallel),
            calls: 0,
        }
    }

    pub fn feed(&mut self, text: &str) -> Vec<AnswerPiece> {
        match &mut self.parser {
            Some(parser) => {
                let outputs = parser.feed(text);
                self.pieces(outputs)
            }
            None => vec![AnswerPiece::Text(text.to_owned())],
        }
    }

    pub fn finish(&mut self) -> Vec<AnswerPiece> {
        match self.parser.take() {
            Some(parser) => self.pieces(parser.finish()),
            None => Vec::new(),
        }
    }

    /// Whether the answer made a call (its finish reason is then `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    fn pieces(&mut self, outputs: Vec<ToolOutput>) -> Vec<AnswerPiece> {
        let mut pieces = Vec::new();
        for output in outputs {
            match output {
                // Whitespace between calls is not an answer.
                ToolOutput::Content(text) if self.calls > 0 && text.trim().is_empty() => {}
                ToolOutput::Content(text) => pieces.push(AnswerPiece::Text(text)),
                // Without parallel calls the first is the answer.
                ToolOutput::Call(_) if self.calls > 0 && !self.parallel => {}
                ToolOutput::Call(call) => {
                    pieces.push(AnswerPiece::Call {
                        index: self.calls,
                        call,
                    });
                    self.calls += 1;
                }
            }
        }
        pieces
    }
}

/// A call as the answer shows it: `arguments` as a JSON string, an id unique to the call.
pub fn call_json(id: String, call: &ToolCall) -> Value {
    let arguments = match &call.arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    json!({"id": id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn choices_and_their_errors() {
        let tools = [weather()];
        let request = tool_request(Some(&tools), None, None)
            .expect("valid")
            .expect("tools");
        assert_eq!(request.choice, ToolChoice::Auto);
        assert!(request.parallel);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let request = tool_request(Some(&tools), Some(&named), Some(true))
            .expect("valid")
            .expect("tools");
        let tool_use = request.tool_use(ToolCallFormat::Hermes).expect("calls");
        assert!(!tool_use.parallel, "a named function is called once");
        assert!(tool_use.grammar.is_some());
        let none = tool_request(Some(&tools), Some(&json!("none")), None)
            .expect("valid")
            .expect("tools");
        assert!(none.tool_use(ToolCallFormat::Hermes).is_none());
        for (tools, choice, param) in [
            (
                vec![weather()],
                json!({"type": "function", "function": {"name": "x"}}),
                "tool_choice",
            ),
            (vec![weather()], json!("sometimes"), "tool_choice"),
            (vec![], json!("required"), "tool_choice"),
            (
                vec![json!({"type": "retrieval"})],
                Value::Null,
                "tools[0].type",
            ),
            (
                vec![json!({"type": "function", "function": {"name": "a b"}})],
                Value::Null,
                "tools[0].function.name",
            ),
            (
                vec![weather(), weather()],
                Value::Null,
                "tools[1].function.name",
            ),
        ] {
            let error = tool_request(Some(&tools), Some(&choice), None).expect_err(param);
            assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
        }
    }

    #[test]
    fn arguments_strings_become_values_for_the_template() {
        let calls = json!([{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]);
        let rendered = template_tool_calls("messages[1].tool_calls", &calls).expect("valid");
        assert_eq!(
            rendered[0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(rendered[0]["id"], json!("call_1"));
        let bad = json!([{"function": {"name": "f", "arguments": "{oops"}}]);
        let error = template_tool_calls("messages[1].tool_calls", &bad).expect_err("not JSON");
        assert_eq!(
            error.param.as_deref(),
            Some("messages[1].tool_calls[0].function.arguments")
        );
    }

    #[test]
    fn a_reader_without_parallel_calls_keeps_the_first() {
        let tool_use = ToolUse {
            format: ToolCallFormat::Hermes,
            names: vec!["a".to_owned(), "b".to_owned()],
            parallel: false,
            grammar: None,
        };
        let mut reader = ToolReader::new(Some(&tool_use));
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
        let mut pieces = reader.feed(text);
        pieces.extend(reader.finish());
        assert_eq!(
            pieces,
            [AnswerPiece::Call {
                index: 0,
                call: ToolCall {
                    name: "a".to_owned(),
                    arguments: json!({})
                }
            }]
        );
        assert!(reader.called());
        let mut plain = ToolReader::new(None);
        assert_eq!(
            plain.feed("<tool_call>"),
            [AnswerPiece::Text("<tool_call>".to_owned())]
        );
    }
}
