//! `POST /v1/completions` and `POST /v1/chat/completions`: submit to the engine (503 with
//! Retry-After when its queue is full), wait for the prefill's verdict (400/404 for a bad prompt),
//! then either collect the answer or stream it as server-sent events ending in `[DONE]`. Dropping
//! the response (the client went away) drops the event receiver, which tells the engine to drop
//! the sequence.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use pml_syntax::ast::Role;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::AppState;
use super::error::ApiError;
use super::openai::{
    ChatRequest, CompletionRequest, Flavor, GenerationFields, ResponseMeta, Usage, is_pml_prompt,
};
use crate::engine::{CompletionJob, JobEnd, JobEvent, PromptSource, PromptUsage};

pub async fn completion(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse_json(&body)?;
    let prompt = if is_pml_prompt(&request.prompt) {
        PromptSource::Pml(request.prompt)
    } else {
        PromptSource::Text(request.prompt)
    };
    answer(state, Flavor::Text, prompt, &request.fields).await
}

pub async fn chat_completion(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse_json(&body)?;
    if request.messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty"));
    }
    let turns = request
        .messages
        .into_iter()
        .map(|message| {
            let role = match message.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown role `{other}` (expected system, user or assistant)"
                    )));
                }
            };
            Ok((role, message.content))
        })
        .collect::<Result<_, _>>()?;
    answer(
        state,
        Flavor::Chat,
        PromptSource::Chat(turns),
        &request.fields,
    )
    .await
}

fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid request body: {error}")))
}

async fn answer(
    state: AppState,
    flavor: Flavor,
    prompt: PromptSource,
    fields: &GenerationFields,
) -> Result<Response, ApiError> {
    let (params, mode) = fields.to_params(&state.config)?;
    let (events, mut receiver) = unbounded_channel();
    let arrived = Instant::now();
    state.engine.submit(CompletionJob {
        prompt,
        mode,
        params,
        arrived,
        deadline: arrived + state.config.request_timeout,
        events,
    })?;
    let usage = match receiver.recv().await {
        Some(JobEvent::Started(usage)) => usage,
        Some(JobEvent::Failed(error)) => return Err(error.into()),
        Some(JobEvent::Done { end, .. }) => return Err(ended_early(end)),
        Some(JobEvent::Text(_)) | None => return Err(engine_gone()),
    };
    let model = fields.model.as_deref().unwrap_or(&state.config.model_name);
    let meta = ResponseMeta::new(flavor, model);
    if fields.stream {
        Ok(stream_answer(meta, usage, receiver).into_response())
    } else {
        collect_answer(meta, usage, receiver).await
    }
}

async fn collect_answer(
    meta: ResponseMeta,
    usage: PromptUsage,
    mut receiver: UnboundedReceiver<JobEvent>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match receiver.recv().await {
            Some(JobEvent::Text(piece)) => text.push_str(&piece),
            Some(JobEvent::Done {
                end: JobEnd::TimedOut,
                ..
            }) => return Err(ended_early(JobEnd::TimedOut)),
            Some(JobEvent::Done {
                end,
                completion_tokens,
            }) => {
                let usage = Usage::new(usage, completion_tokens);
                return Ok(Json(meta.response(&text, end, &usage)).into_response());
            }
            Some(JobEvent::Failed(error)) => return Err(error.into()),
            Some(JobEvent::Started(_)) | None => return Err(engine_gone()),
        }
    }
}

/// Where a stream stands between events.
enum StreamState {
    Open(UnboundedReceiver<JobEvent>),
    /// The last chunk went out; `[DONE]` follows.
    Closing,
    Closed,
}

fn stream_answer(
    meta: ResponseMeta,
    usage: PromptUsage,
    receiver: UnboundedReceiver<JobEvent>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold(StreamState::Open(receiver), move |state| {
        let meta = meta.clone();
        async move {
            let (event, next) = match state {
                StreamState::Closed => return None,
                StreamState::Closing => (Event::default().data("[DONE]"), StreamState::Closed),
                StreamState::Open(mut receiver) => match receiver.recv().await {
                    Some(JobEvent::Text(piece)) => (
                        json_event(&meta.chunk(&piece, None, None)),
                        StreamState::Open(receiver),
                    ),
                    Some(JobEvent::Done {
                        end,
                        completion_tokens,
                    }) => {
                        let usage = Usage::new(usage, completion_tokens);
                        (
                            json_event(&meta.chunk("", Some(end), Some(&usage))),
                            StreamState::Closing,
                        )
                    }
                    Some(JobEvent::Failed(error)) => {
                        (error_event(&error.into()), StreamState::Closing)
                    }
                    Some(JobEvent::Started(_)) | None => {
                        (error_event(&engine_gone()), StreamState::Closing)
                    }
                },
            };
            Some((Ok(event), next))
        }
    });
    Sse::new(events)
}

fn json_event(value: &serde_json::Value) -> Event {
    Event::default().data(value.to_string())
}

/// An error after the stream began: the status line is sent, so the error travels as an event.
fn error_event(error: &ApiError) -> Event {
    json_event(&json!({"error": {
        "message": error.message, "type": error.kind, "code": error.status.as_u16()
    }}))
}

fn ended_early(end: JobEnd) -> ApiError {
    match end {
        JobEnd::TimedOut => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            "the request ran past the server's time limit",
        ),
        JobEnd::Finished(_) => ApiError::internal("the answer ended before it started"),
    }
}

fn engine_gone() -> ApiError {
    ApiError::internal("the engine stopped before answering")
}
