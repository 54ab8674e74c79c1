//! `POST /v1/completions` and `POST /v1/chat/completions`: submit one engine job per choice
//! (503 with Retry-After when the queue is full), wait for every prefill's verdict (400/404 for a
//! bad prompt), then either collect the answers or stream them as server-sent events ending in
//! `[DONE]`. Dropping the response (the client went away) drops the event receiver, which tells
//! the engine to drop the sequences.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::AppState;
use super::error::ApiError;
use super::openai::{ChoiceText, Flavor, ResponseMeta, Usage, is_pml_prompt};
use super::prompt_schema::prompt_schema;
use super::request::{ChatRequest, CompletionRequest, Generation};
use crate::engine::{
    CompletionJob, EventSink, JobEnd, JobEvent, PromptSource, PromptUsage, Sibling,
};

pub async fn completion(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse_json(&body?)?;
    let generation = request.check(&state.config)?;
    let text = request.prompt_text()?;
    let prompt = if is_pml_prompt(&text) {
        let schema = prompt_schema(&text, &state.engine.schemas)?;
        PromptSource::Pml {
            source: text,
            schema,
        }
    } else {
        PromptSource::Text(text)
    };
    let model = request.fields.model.clone();
    answer(state, Flavor::Text, prompt, generation, model).await
}

pub async fn chat_completion(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse_json(&body?)?;
    let generation = request.check(&state.config)?;
    let turns = request.turns()?;
    let model = request.fields.model.clone();
    answer(
        state,
        Flavor::Chat,
        PromptSource::Chat(turns),
        generation,
        model,
    )
    .await
}

pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid request body: {error}")))
}

async fn answer(
    state: AppState,
    flavor: Flavor,
    prompt: PromptSource,
    generation: Generation,
    model: Option<String>,
) -> Result<Response, ApiError> {
    let (sender, mut receiver) = unbounded_channel();
    let arrived = Instant::now();
    // Each choice its own draw, reproducibly (greedy choices are alike); one prefill for all.
    let choice_params = |choice: usize| {
        let mut params = generation.params.clone();
        params.seed = params.seed.wrapping_add(choice as u64);
        params
    };
    let siblings = (1..generation.n)
        .map(|choice| Sibling {
            params: choice_params(choice),
            events: EventSink {
                choice,
                sender: sender.clone(),
            },
        })
        .collect();
    state.engine.submit(CompletionJob {
        prompt,
        mode: generation.mode,
        params: choice_params(0),
        arrived,
        deadline: arrived + state.config.request_timeout,
        logprobs: generation.logprobs,
        format: generation.format.clone(),
        events: EventSink {
            choice: 0,
            sender: sender.clone(),
        },
        siblings,
    })?;
    drop(sender);
    // The first choice's verdict decides the status (its prefill is every choice's); a later
    // failure of one still reaches the client (in the body or as a stream event).
    let usage = match receiver.recv().await {
        Some((_, JobEvent::Started(usage))) => usage,
        Some((_, JobEvent::Failed(error))) => return Err(error.into()),
        Some((_, JobEvent::Done { end, .. })) => return Err(ended_early(end)),
        Some((_, JobEvent::Token { .. })) | None => return Err(engine_gone()),
    };
    let model = model.as_deref().unwrap_or(&state.config.model_name);
    let meta = ResponseMeta::new(flavor, model);
    let with_logprobs = generation.logprobs.is_some();
    if generation.stream {
        let stream = StreamState::Open {
            receiver,
            offsets: vec![0; generation.n],
            running: generation.n,
            completion_tokens: 0,
        };
        let include_usage = generation.include_usage.then_some(usage);
        Ok(stream_answer(meta, include_usage, stream).into_response())
    } else {
        collect_answer(meta, usage, receiver, generation.n, with_logprobs).await
    }
}

async fn collect_answer(
    meta: ResponseMeta,
    usage: PromptUsage,
    mut receiver: UnboundedReceiver<(usize, JobEvent)>,
    n: usize,
    with_logprobs: bool,
) -> Result<Response, ApiError> {
    let mut choices = vec![
        ChoiceText {
            logprobs: with_logprobs.then(Vec::new),
            ..ChoiceText::default()
        };
        n
    ];
    let mut running = n;
    let mut completion_tokens = 0;
    while running > 0 {
        let Some((index, event)) = next_event(&mut receiver).await else {
            return Err(engine_gone());
        };
        let choice = choices.get_mut(index).ok_or_else(engine_gone)?;
        match event {
            JobEvent::Token { text, logprob } => {
                choice.text.push_str(&text);
                if let (Some(list), Some(logprob)) = (&mut choice.logprobs, logprob) {
                    list.push(logprob);
                }
            }
            JobEvent::Done {
                end: JobEnd::TimedOut,
                ..
            } => return Err(ended_early(JobEnd::TimedOut)),
            JobEvent::Done {
                end,
                completion_tokens: tokens,
            } => {
                choice.end = Some(end);
                completion_tokens += tokens;
                running -= 1;
            }
            JobEvent::Failed(error) => return Err(error.into()),
            JobEvent::Started(_) => {}
        }
    }
    let usage = Usage::new(usage, completion_tokens);
    Ok(Json(meta.response(&choices, &usage)).into_response())
}

/// Where a stream stands between events.
enum StreamState {
    Open {
        receiver: UnboundedReceiver<(usize, JobEvent)>,
        /// Bytes of text each choice has sent (the text flavour's `text_offset`).
        offsets: Vec<usize>,
        running: usize,
        completion_tokens: usize,
    },
    /// Every choice has ended; the usage chunk (when asked for) and `[DONE]` follow.
    Finishing {
        completion_tokens: usize,
    },
    /// The last chunk went out; `[DONE]` follows.
    Closing,
    Closed,
}

fn stream_answer(
    meta: ResponseMeta,
    include_usage: Option<PromptUsage>,
    state: StreamState,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold(state, move |state| {
        let meta = meta.clone();
        async move {
            let (event, next) = match state {
                StreamState::Closed => return None,
                StreamState::Closing => (Event::default().data("[DONE]"), StreamState::Closed),
                StreamState::Finishing { completion_tokens } => match include_usage {
                    Some(usage) => (
                        json_event(&meta.usage_chunk(&Usage::new(usage, completion_tokens))),
                        StreamState::Closing,
                    ),
                    None => (Event::default().data("[DONE]"), StreamState::Closed),
                },
                StreamState::Open {
                    mut receiver,
                    mut offsets,
                    mut running,
                    mut completion_tokens,
                } => match next_event(&mut receiver).await {
                    Some((index, JobEvent::Token { text, logprob })) => {
                        let offset = offsets.get(index).copied().unwrap_or(0);
                        if let Some(sent) = offsets.get_mut(index) {
                            *sent += text.len();
                        }
                        let chunk = meta.chunk(index, &text, logprob.as_ref(), offset, None);
                        let next = StreamState::Open {
                            receiver,
                            offsets,
                            running,
                            completion_tokens,
                        };
                        (json_event(&chunk), next)
                    }
                    Some((
                        index,
                        JobEvent::Done {
                            end,
                            completion_tokens: tokens,
                        },
                    )) => {
                        running -= 1;
                        completion_tokens += tokens;
                        let chunk = meta.chunk(index, "", None, 0, Some(end));
                        let next = if running == 0 {
                            StreamState::Finishing { completion_tokens }
                        } else {
                            StreamState::Open {
                                receiver,
                                offsets,
                                running,
                                completion_tokens,
                            }
                        };
                        (json_event(&chunk), next)
                    }
                    Some((_, JobEvent::Failed(error))) => {
                        (error_event(&error.into()), StreamState::Closing)
                    }
                    Some((_, JobEvent::Started(_))) | None => {
                        (error_event(&engine_gone()), StreamState::Closing)
                    }
                },
            };
            Some((Ok(event), next))
        }
    });
    Sse::new(events)
}

/// The next event that is not another choice's `Started` (only the first one's counts).
async fn next_event(
    receiver: &mut UnboundedReceiver<(usize, JobEvent)>,
) -> Option<(usize, JobEvent)> {
    loop {
        match receiver.recv().await? {
            (_, JobEvent::Started(_)) => continue,
            event => return Some(event),
        }
    }
}

fn json_event(value: &serde_json::Value) -> Event {
    Event::default().data(value.to_string())
}

/// An error after the stream began: the status line is sent, so the error travels as an event.
fn error_event(error: &ApiError) -> Event {
    json_event(&error.body())
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
