//! `POST /v1/responses`, the API OpenAI's current SDKs and Agents SDK default to: `input` (text,
//! or items: messages, `function_call`, `function_call_output`), `instructions`, `function`
//! tools, `text.format`, `previous_response_id` (responses are kept in memory for the server's
//! lifetime, the most recent [`RESPONSE_LOG_CAPACITY`]). A request is translated into a chat
//! request and answered by the same engine path; [`super::responses_output`] shapes the answer.

use std::collections::VecDeque;
use std::sync::Mutex;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use pml_engine::generation::SamplingParams;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::AppState;
use super::completions::{chat_job, parse_json, start};
use super::error::ApiError;
use super::request::{ChatRequest, check_metadata, refuse_first};
use super::request_log::TokenCounts;
use super::responses_output::{ResponseEcho, answer_response};

/// Responses kept for `previous_response_id`.
pub const RESPONSE_LOG_CAPACITY: usize = 1024;

/// Conversations of earlier responses (their input and output as chat messages, instructions
/// left out: OpenAI does not carry them over), newest last.
#[derive(Debug, Default)]
pub struct ResponseLog {
    entries: Mutex<VecDeque<(String, Vec<Value>)>>,
}

impl ResponseLog {
    pub fn keep(&self, id: String, messages: Vec<Value>) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() == RESPONSE_LOG_CAPACITY {
                entries.pop_front();
            }
            entries.push_back((id, messages));
        }
    }

    fn get(&self, id: &str) -> Option<Vec<Value>> {
        let entries = self.entries.lock().ok()?;
        entries
            .iter()
            .rev()
            .find(|(kept, _)| kept == id)
            .map(|(_, messages)| messages.clone())
    }
}

/// The request body; fields the server does not implement are refused unless null.
#[derive(Clone, Debug, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Value,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub previous_response_id: Option<String>,
    pub store: Option<bool>,
    pub text: Option<Value>,
    pub metadata: Option<Map<String, Value>>,
    pub user: Option<String>,
    pub truncation: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

pub async fn create(
    State(state): State<AppState>,
    tokens: Option<Extension<TokenCounts>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ResponsesRequest = parse_json(&body?)?;
    request.refuse_unsupported()?;
    let history = match &request.previous_response_id {
        Some(id) => state.responses.get(id).ok_or_else(|| {
            ApiError::bad_field(
                "previous_response_id",
                format!("no response `{id}` is kept by this server (they live until it restarts)"),
            )
            .with_code("previous_response_not_found")
        })?,
        None => Vec::new(),
    };
    let input = input_messages(&request.input)?;
    let chat = request.chat_request(&history, &input)?;
    let (generation, prompt) = chat_job(&state, &chat).map_err(to_responses_param)?;
    let tokens = tokens.map(|Extension(tokens)| tokens).unwrap_or_default();
    let (usage, receiver) = start(&state, prompt.source, &generation, tokens).await?;
    let mut conversation = history;
    conversation.extend(input);
    let echo = ResponseEcho {
        model: request
            .model
            .clone()
            .unwrap_or_else(|| state.config.model_name.clone()),
        request: request.echo(),
        keep: request.store.unwrap_or(true).then_some(conversation),
    };
    answer_response(state, echo, prompt.tools, usage, receiver, request.stream).await
}

impl ResponsesRequest {
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata)?;
        }
        if let Some(text) = &self.text
            && !text.is_object()
            && !text.is_null()
        {
            return Err(ApiError::bad_field(
                "text",
                "`text` is an object: `{\"format\": {\"type\": \"text\"}}`, `json_object` or \
                 `json_schema`",
            ));
        }
        refuse_first(
            &self.other,
            "",
            // Empty lists and the default service tier ask for nothing.
            |name, value| {
                name == "include" && value.as_array().is_some_and(Vec::is_empty)
                    || name == "service_tier" && matches!(value.as_str(), Some("auto" | "default"))
            },
            |name| match name {
                "reasoning" => "reasoning options are not supported (the model does not reason)",
                "background" => "background responses are not supported",
                "conversation" => "conversations are not supported; use previous_response_id",
                "prompt" => "stored prompt templates are not supported",
                _ => "this field is not supported by this server",
            },
        )?;
        if let Some(truncation) = &self.truncation
            && truncation != "disabled"
        {
            return Err(ApiError::unsupported(
                "truncation",
                format!(
                    "truncation `{truncation}` is not supported: a prompt past the context is refused"
                ),
            ));
        }
        Ok(())
    }

    /// The chat request this response is answered as.
    fn chat_request(&self, history: &[Value], input: &[Value]) -> Result<ChatRequest, ApiError> {
        let mut messages = Vec::new();
        if let Some(instructions) = &self.instructions {
            messages.push(json!({"role": "system", "content": instructions}));
        }
        messages.extend(history.iter().cloned());
        messages.extend(input.iter().cloned());
        let tools = self
            .tools
            .as_ref()
            .map(|tools| {
                tools
                    .iter()
                    .enumerate()
                    .map(|(index, tool)| chat_tool(index, tool))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let tool_choice = match &self.tool_choice {
            Some(Value::Object(choice)) => match choice.get("name") {
                Some(name) => Some(json!({"type": "function", "function": {"name": name}})),
                None => Some(Value::Object(choice.clone())),
            },
            other => other.clone(),
        };
        let response_format = self
            .text
            .as_ref()
            .and_then(|text| text.get("format"))
            .map(chat_format)
            .transpose()?;
        let body = json!({
            "messages": messages,
            "tools": tools,
            "tool_choice": tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stream": self.stream,
            "response_format": response_format,
            "user": self.user,
        });
        serde_json::from_value(body)
            .map_err(|error| ApiError::bad_request(format!("invalid request body: {error}")))
    }

    /// The request's settings as the response repeats them.
    fn echo(&self) -> Map<String, Value> {
        let mut echo = Map::new();
        echo.insert("instructions".into(), json!(self.instructions));
        echo.insert(
            "tools".into(),
            json!(self.tools.clone().unwrap_or_default()),
        );
        echo.insert(
            "tool_choice".into(),
            self.tool_choice.clone().unwrap_or(json!("auto")),
        );
        echo.insert(
            "parallel_tool_calls".into(),
            json!(self.parallel_tool_calls.unwrap_or(true)),
        );
        echo.insert("max_output_tokens".into(), json!(self.max_output_tokens));
        // The values the answer was sampled with (this server's defaults: greedy).
        let defaults = SamplingParams::default();
        echo.insert(
            "temperature".into(),
            json!(self.temperature.unwrap_or(defaults.temperature)),
        );
        echo.insert("top_p".into(), json!(self.top_p.unwrap_or(defaults.top_p)));
        echo.insert(
            "previous_response_id".into(),
            json!(self.previous_response_id),
        );
        echo.insert("store".into(), json!(self.store.unwrap_or(true)));
        echo.insert(
            "text".into(),
            self.text
                .clone()
                .unwrap_or_else(|| json!({"format": {"type": "text"}})),
        );
        echo.insert(
            "metadata".into(),
            json!(self.metadata.clone().unwrap_or_default()),
        );
        echo.insert("user".into(), json!(self.user));
        echo.insert("service_tier".into(), json!("default"));
        echo.insert("truncation".into(), json!("disabled"));
        echo.insert("reasoning".into(), json!({"effort": null, "summary": null}));
        echo
    }
}

/// `input` as chat messages: a string is one user message; items are messages (text parts
/// joined), `function_call` (an assistant turn's calls, consecutive ones merged into it) and
/// `function_call_output` (a tool message).
fn input_messages(input: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![json!({"role": "user", "content": text})]),
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::bad_field(
                "input",
                "`input` must be a string or a non-empty list of items",
            ));
        }
    };
    let mut messages: Vec<Value> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = format!("input[{index}]");
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
        match kind {
            "message" => {
                let role = text("role").unwrap_or_default();
                if !matches!(role.as_str(), "user" | "system" | "developer" | "assistant") {
                    return Err(ApiError::bad_field(
                        format!("{at}.role"),
                        format!("unknown role `{role}` (user, system, developer, assistant)"),
                    ));
                }
                let content = message_text(&at, item.get("content"))?;
                messages.push(json!({"role": role, "content": content}));
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (text("call_id"), text("name")) else {
                    return Err(ApiError::bad_field(
                        at,
                        "a function_call item needs `call_id` and `name`",
                    ));
                };
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": text("arguments").unwrap_or_default()}});
                match messages.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => messages
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let Some(call_id) = text("call_id") else {
                    return Err(ApiError::bad_field(
                        format!("{at}.call_id"),
                        "a function_call_output item needs the `call_id` it answers",
                    ));
                };
                let output = match item.get("output") {
                    Some(Value::String(output)) => output.clone(),
                    Some(Value::Array(_)) => message_text(&at, item.get("output"))?,
                    _ => {
                        return Err(ApiError::bad_field(
                            format!("{at}.output"),
                            "a function_call_output item needs a text `output`",
                        ));
                    }
                };
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            other => {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!(
                        "input items of type `{other}` are not supported (message, function_call, \
                         function_call_output)"
                    ),
                ));
            }
        }
    }
    Ok(messages)
}

/// A message item's text: a string, or its text parts joined.
fn message_text(at: &str, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (index, part) in parts.iter().enumerate() {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    other => {
                        return Err(ApiError::unsupported(
                            format!("{at}.content[{index}].type"),
                            format!(
                                "content parts of type `{}` are not supported (text only)",
                                other.unwrap_or("?")
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::bad_field(
            format!("{at}.content"),
            "a message needs text `content`",
        )),
    }
}

/// A Responses tool (`{type: function, name, description, parameters, strict}`) in the chat
/// API's shape.
fn chat_tool(index: usize, tool: &Value) -> Result<Value, ApiError> {
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {
            let mut function = tool.as_object().cloned().unwrap_or_default();
            function.remove("type");
            Ok(json!({"type": "function", "function": function}))
        }
        other => Err(ApiError::unsupported(
            format!("tools[{index}].type"),
            format!(
                "tools of type `{}` are not supported (function only)",
                other.unwrap_or("?")
            ),
        )),
    }
}

/// `text.format` as the chat API's `response_format`.
fn chat_format(format: &Value) -> Result<Value, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => Ok(json!({"type": "json_schema", "json_schema": {
            "name": format.get("name"), "schema": format.get("schema")}})),
        Some(_) => Ok(format.clone()),
        None => Err(ApiError::bad_field(
            "text.format.type",
            "text.format needs a `type`",
        )),
    }
}

/// A chat-shaped error's `param` in the Responses API's names.
fn to_responses_param(mut error: ApiError) -> ApiError {
    if let Some(param) = &error.param {
        let renamed = if param == "max_completion_tokens" {
            Some("max_output_tokens".to_owned())
        } else if let Some(rest) = param.strip_prefix("response_format") {
            Some(format!("text.format{rest}"))
        } else if param.starts_with("messages") {
            Some("input".to_owned())
        } else if let Some(rest) = param.strip_prefix("tools[")
            && let Some((index, rest)) = rest.split_once(']')
        {
            Some(format!(
                "tools[{index}]{}",
                rest.strip_prefix(".function").unwrap_or(rest)
            ))
        } else {
            None
        };
        if let Some(renamed) = renamed {
            error.param = Some(renamed);
        }
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_chat_messages() {
        let input = json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in "},
                                         {"type": "input_text", "text": "Paris?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "22 C"},
        ]);
        let messages = input_messages(&input).expect("valid");
        assert_eq!(messages.len(), 3);
        assert_eq!(
            messages[0],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(messages[1]["tool_calls"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            messages[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "22 C"})
        );
        let error = input_messages(&json!([{"role": "user", "content": [
            {"type": "input_image", "image_url": "x"}]}]))
        .expect_err("image");
        assert_eq!(error.param.as_deref(), Some("input[0].content[0].type"));
        assert!(input_messages(&json!([])).is_err());
    }

    #[test]
    fn tools_and_formats_take_the_chat_shape() {
        let tool = json!({"type": "function", "name": "f", "parameters": {"type": "object"}});
        assert_eq!(
            chat_tool(0, &tool).expect("function"),
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})
        );
        let error = chat_tool(1, &json!({"type": "web_search"})).expect_err("web search");
        assert_eq!(error.param.as_deref(), Some("tools[1].type"));
        let format = json!({"type": "json_schema", "name": "p", "schema": {"type": "object"}});
        assert_eq!(
            chat_format(&format).expect("schema")["json_schema"]["schema"],
            json!({"type": "object"})
        );
        let renamed = to_responses_param(ApiError::bad_field("tools[2].function.name", "x"));
        assert_eq!(renamed.param.as_deref(), Some("tools[2].name"));
    }

    #[test]
    fn the_log_keeps_the_newest() {
        let log = ResponseLog::default();
        for index in 0..=RESPONSE_LOG_CAPACITY {
            log.keep(format!("resp_{index}"), vec![json!(index)]);
        }
        assert!(log.get("resp_0").is_none(), "the oldest is dropped");
        assert_eq!(log.get("resp_1"), Some(vec![json!(1)]));
    }
}
