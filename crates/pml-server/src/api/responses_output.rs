//! The answer of `POST /v1/responses`: output items (an assistant `message` with `output_text`,
//! `function_call`s) and usage in the `response` object, or, streamed, the typed events OpenAI's
//! SDKs accumulate (`response.created`, `response.output_item.added`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`, …,
//! `response.completed`), each numbered by `sequence_number`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use pml_engine::generation::FinishReason;
use serde_json::{Map, Value, json};

use super::AppState;
use super::completions::{Answers, ended_early, engine_gone};
use super::error::ApiError;
use super::tools::{AnswerPiece, ToolReader, ToolUse};
use crate::engine::{JobEnd, JobEvent, PromptUsage};

/// What the response repeats of its request, and the conversation to keep for a later
/// `previous_response_id` (`None`: `store: false`).
#[derive(Debug)]
pub struct ResponseEcho {
    pub model: String,
    pub request: Map<String, Value>,
    pub keep: Option<Vec<Value>>,
}

/// One answer being read into output items.
struct ResponseRun {
    state: AppState,
    echo: ResponseEcho,
    id: String,
    created_at: u64,
    answers: Answers,
    reader: ToolReader,
    usage: PromptUsage,
    output_tokens: usize,
    items: Vec<Value>,
    /// The message item being written: its id and text.
    text: Option<(String, String)>,
    /// Events not yet sent (streaming) and the next event's number.
    events: VecDeque<Value>,
    sequence: u64,
    end: Option<JobEnd>,
}

pub async fn answer_response(
    state: AppState,
    echo: ResponseEcho,
    tools: Option<ToolUse>,
    usage: PromptUsage,
    answers: Answers,
    stream: bool,
) -> Result<Response, ApiError> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let created_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let mut run = ResponseRun {
        state,
        echo,
        id: format!(
            "resp_{created_at:x}{:06x}",
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ),
        created_at,
        answers,
        reader: ToolReader::new(tools.as_ref()),
        usage,
        output_tokens: 0,
        items: Vec::new(),
        text: None,
        events: VecDeque::new(),
        sequence: 0,
        end: None,
    };
    if stream {
        let response = run.response("in_progress");
        run.event("response.created", json!({"response": response}));
        run.event("response.in_progress", json!({"response": response}));
        return Ok(stream_response(run).into_response());
    }
    while run.end.is_none() {
        run.step().await?;
    }
    Ok(Json(run.finish()).into_response())
}

fn stream_response(
    run: ResponseRun,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold((run, false), |(mut run, mut over)| async move {
        loop {
            if let Some(event) = run.events.pop_front() {
                let kind = event["type"].as_str().unwrap_or("error").to_owned();
                let sse = Event::default().event(kind).data(event.to_string());
                return Some((Ok(sse), (run, over)));
            }
            if over {
                return None;
            }
            if run.end.is_some() {
                run.finish();
                over = true;
                continue;
            }
            if let Err(error) = run.step().await {
                run.event(
                    "error",
                    json!({"code": error.code, "message": error.message, "param": error.param}),
                );
                over = true;
            }
        }
    });
    Sse::new(events)
}

impl ResponseRun {
    /// Reads the engine's next event into items (and events).
    async fn step(&mut self) -> Result<(), ApiError> {
        match self.answers.next().await {
            Some((_, JobEvent::Token { text, .. })) => {
                let pieces = self.reader.feed(&text);
                self.pieces(pieces);
                Ok(())
            }
            Some((
                _,
                JobEvent::Done {
                    end,
                    completion_tokens,
                    ..
                },
            )) => {
                if end == JobEnd::TimedOut {
                    return Err(ended_early(end));
                }
                let pieces = self.reader.finish();
                self.pieces(pieces);
                // An answer of no text is an empty message, as OpenAI answers it: clients read
                // `output: []` as no answer at all and ask again.
                if self.items.is_empty() && self.text.is_none() {
                    self.open_text();
                }
                self.close_text();
                self.output_tokens = completion_tokens;
                self.end = Some(end);
                Ok(())
            }
            Some((_, JobEvent::Failed(error))) => Err(error.into()),
            Some((_, JobEvent::Started(_))) | None => Err(engine_gone()),
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.events.push_back(body);
    }

    fn pieces(&mut self, pieces: Vec<AnswerPiece>) {
        for piece in pieces {
            match piece {
                AnswerPiece::Text(delta) => self.text(&delta),
                AnswerPiece::Call { index, call } => {
                    self.close_text();
                    let arguments = match &call.arguments {
                        Value::String(text) => text.clone(),
                        other => other.to_string(),
                    };
                    let output_index = self.items.len();
                    let id = format!("fc_{}_{index}", self.id);
                    let item = |status: &str, arguments: &str| {
                        json!({"type": "function_call", "id": id,
                            "call_id": format!("call_{}_{index}", self.id), "name": call.name,
                            "arguments": arguments, "status": status})
                    };
                    let (open, done) = (item("in_progress", ""), item("completed", &arguments));
                    self.event(
                        "response.output_item.added",
                        json!({"output_index": output_index, "item": open}),
                    );
                    self.event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": output_index, "delta": arguments}),
                    );
                    self.event(
                        "response.function_call_arguments.done",
                        json!({"item_id": id, "output_index": output_index,
                            "name": call.name, "arguments": arguments}),
                    );
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": output_index, "item": done}),
                    );
                    self.items.push(done);
                }
            }
        }
    }

    /// Opens a message item (its events) and returns its id.
    fn open_text(&mut self) -> String {
        let output_index = self.items.len();
        let id = format!("msg_{}_{output_index}", self.id);
        self.text = Some((id.clone(), String::new()));
        self.event(
            "response.output_item.added",
            json!({"output_index": output_index, "item": {"type": "message", "id": id,
                "status": "in_progress", "role": "assistant", "content": []}}),
        );
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "part": output_text("")}),
        );
        id
    }

    /// Appends to the message item being written, opening one first.
    fn text(&mut self, delta: &str) {
        let output_index = self.items.len();
        if self.text.is_none() {
            self.open_text();
        }
        let id = match &mut self.text {
            Some((id, text)) => {
                text.push_str(delta);
                id.clone()
            }
            None => return,
        };
        self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "delta": delta, "logprobs": []}),
        );
    }

    /// Finishes the message item being written, if any.
    fn close_text(&mut self) {
        let Some((id, text)) = self.text.take() else {
            return;
        };
        let output_index = self.items.len();
        self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "text": text, "logprobs": []}),
        );
        self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "part": output_text(&text)}),
        );
        let item = json!({"type": "message", "id": id, "status": "completed",
            "role": "assistant", "content": [output_text(&text)]});
        self.event(
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        );
        self.items.push(item);
    }

    /// The `response` object as it stands.
    fn response(&self, status: &str) -> Value {
        let mut response = self.echo.request.clone();
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        let prompt = self.usage.prompt_tokens;
        for (key, value) in [
            ("id", json!(self.id)),
            ("object", json!("response")),
            ("created_at", json!(self.created_at)),
            ("status", json!(status)),
            ("error", Value::Null),
            ("incomplete_details", incomplete.unwrap_or(Value::Null)),
            ("model", json!(self.echo.model)),
            ("output", json!(self.items)),
            (
                "usage",
                match status {
                    "in_progress" => Value::Null,
                    _ => json!({
                        "input_tokens": prompt,
                        "input_tokens_details": {"cached_tokens": self.usage.cached_tokens},
                        "output_tokens": self.output_tokens,
                        "output_tokens_details": {"reasoning_tokens": 0},
                        "total_tokens": prompt + self.output_tokens,
                    }),
                },
            ),
        ] {
            response.insert(key.into(), value);
        }
        Value::Object(response)
    }

    /// The finished response: its last event queued, its conversation kept.
    fn finish(&mut self) -> Value {
        let status = match self.end {
            Some(JobEnd::Finished(FinishReason::Length)) => "incomplete",
            _ => "completed",
        };
        let response = self.response(status);
        self.event(&format!("response.{status}"), json!({"response": response}));
        if let Some(mut conversation) = self.echo.keep.take() {
            conversation.push(assistant_message(&self.items));
            self.state.responses.keep(self.id.clone(), conversation);
        }
        response
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The output items as the chat message a later turn sees.
fn assistant_message(items: &[Value]) -> Value {
    let text: String = items
        .iter()
        .filter(|item| item["type"] == "message")
        .filter_map(|item| item["content"][0]["text"].as_str())
        .collect();
    let calls: Vec<Value> = items
        .iter()
        .filter(|item| item["type"] == "function_call")
        .map(|item| {
            json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": text});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
        if text.trim().is_empty() {
            message["content"] = Value::Null;
        }
    }
    message
}
