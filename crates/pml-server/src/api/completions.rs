//! `POST /v1/completions` and `POST /v1/chat/completions`: submit one engine job per choice
//! (503 with Retry-After when the queue is full), wait for every prefill's verdict (400/404 for a
//! bad prompt), then either collect the answers or stream them as server-sent events ending in
//! `[DONE]`. Dropping the response (the client went away) drops the event receiver, which tells
//! the engine to drop the sequences.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::de::DeserializeOwned;
use serde_json::Map;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::AppState;
use super::error::ApiError;
use super::openai::{ChoiceText, ChunkPiece, Flavor, ResponseMeta, Usage, is_pml_prompt};
use super::prompt_schema::prompt_schema;
use super::request::{ChatPrompt, ChatRequest, CompletionRequest, Generation};
use super::request_log::TokenCounts;
use super::tools::{AnswerPiece, ToolReader, ToolUse, call_json};
use crate::engine::structured::ResponseFormat;
use crate::engine::{
    CompletionJob, DraftCounts, EventSink, JobEnd, JobEvent, PromptSource, PromptUsage, Sibling,
    TokenLogprob,
};

pub async fn completion(
    State(state): State<AppState>,
    tokens: Option<Extension<TokenCounts>>,
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
    let model = request.fields.model.as_deref();
    let meta = ResponseMeta::new(
        Flavor::Text,
        model.unwrap_or(&state.config.model_name),
        Map::new(),
    );
    let tokens = tokens.map(|Extension(tokens)| tokens).unwrap_or_default();
    answer(state, meta, prompt, generation, None, tokens).await
}

pub async fn chat_completion(
    State(state): State<AppState>,
    tokens: Option<Extension<TokenCounts>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse_json(&body?)?;
    let (generation, prompt) = chat_job(&state, &request)?;
    let model = request.fields.model.as_deref();
    let meta = ResponseMeta::new(
        Flavor::Chat,
        model.unwrap_or(&state.config.model_name),
        request.echo()?,
    );
    let tokens = tokens.map(|Extension(tokens)| tokens).unwrap_or_default();
    answer(state, meta, prompt.source, generation, prompt.tools, tokens).await
}

/// A chat request's generation options and prompt, checked; a required tool call becomes the
/// answer's grammar.
pub fn chat_job(
    state: &AppState,
    request: &ChatRequest,
) -> Result<(Generation, ChatPrompt), ApiError> {
    let mut generation = request.check(&state.config)?;
    let prompt = request.prompt(state.engine.tool_format)?;
    match (
        prompt
            .tools
            .as_ref()
            .and_then(|tools| tools.grammar.clone()),
        &generation.format,
    ) {
        (Some(ResponseFormat::LazyToolCall(_)), Some(_)) => {
            // The model may answer without calling: `response_format` shapes that answer.
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_field(
                "response_format",
                "a required tool call and `response_format` cannot both shape the answer",
            ));
        }
        (Some(grammar), None) => generation.format = Some(grammar),
        (None, _) => {}
    }
    Ok((generation, prompt))
}

pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request(format!("invalid request body: {error}")))
}

async fn answer(
    state: AppState,
    meta: ResponseMeta,
    prompt: PromptSource,
    generation: Generation,
    tools: Option<ToolUse>,
    tokens: TokenCounts,
) -> Result<Response, ApiError> {
    let (usage, receiver) = start(&state, prompt, &generation, tokens).await?;
    let with_logprobs = generation.logprobs.is_some();
    let readers = (0..generation.n)
        .map(|_| ToolReader::new(tools.as_ref()))
        .collect();
    if generation.stream {
        let stream = StreamState {
            answers: receiver,
            choices: (0..generation.n).map(|_| StreamChoice::default()).collect(),
            readers,
            running: generation.n,
            ready: VecDeque::new(),
            phase: StreamPhase::Open,
            usage: generation.include_usage.then_some(usage),
        };
        Ok(stream_answer(meta, stream).into_response())
    } else {
        collect_answer(meta, usage, receiver, readers, with_logprobs).await
    }
}

/// The channel a request's choices report on, counting the tokens they answer for the request's
/// log line.
pub struct Answers {
    receiver: UnboundedReceiver<(usize, JobEvent)>,
    tokens: TokenCounts,
    completion_tokens: usize,
    drafts: DraftCounts,
}

impl Answers {
    /// Every finished choice's tokens and drafts.
    fn counted(&self) -> (usize, DraftCounts) {
        (self.completion_tokens, self.drafts)
    }

    /// The next event that is not another choice's `Started` (only the first one's counts).
    pub async fn next(&mut self) -> Option<(usize, JobEvent)> {
        loop {
            match self.receiver.recv().await? {
                (_, JobEvent::Started(_)) => continue,
                event => {
                    if let (
                        _,
                        JobEvent::Done {
                            completion_tokens,
                            drafts,
                            ..
                        },
                    ) = &event
                    {
                        self.completion_tokens += completion_tokens;
                        self.drafts += *drafts;
                        self.tokens.completion(self.completion_tokens, self.drafts);
                    }
                    return Some(event);
                }
            }
        }
    }
}

/// Submits a request's job (with a sibling per further choice) and waits for its prefill's
/// verdict: the prompt's usage and the channel its choices report on, or the error to answer.
pub async fn start(
    state: &AppState,
    prompt: PromptSource,
    generation: &Generation,
    tokens: TokenCounts,
) -> Result<(PromptUsage, Answers), ApiError> {
    let kv_budget = match (&prompt, generation.kv_budget) {
        (PromptSource::Pml { .. }, Some(_)) => {
            return Err(ApiError::bad_field(
                "kv_budget",
                "kv_budget applies to plain prompts and chats: a PML prompt's cached modules are \
                 spliced whole",
            ));
        }
        (PromptSource::Pml { .. }, None) => None,
        (_, asked) => asked.or(state.config.kv_budget),
    };
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
        kv_budget,
        open_ended: generation.open_ended,
        prompt_token_kinds: generation.prompt_token_kinds,
    })?;
    drop(sender);
    // The first choice's verdict decides the status (its prefill is every choice's); a later
    // failure of one still reaches the client (in the body or as a stream event).
    let usage = match receiver.recv().await {
        Some((_, JobEvent::Started(usage))) => {
            tokens.prompt(usage.prompt_tokens, usage.cached_tokens);
            usage
        }
        Some((_, JobEvent::Failed(error))) => return Err(error.into()),
        Some((_, JobEvent::Done { end, .. })) => return Err(ended_early(end)),
        Some((_, JobEvent::Token { .. })) | None => return Err(engine_gone()),
    };
    let answers = Answers {
        receiver,
        tokens,
        completion_tokens: 0,
        drafts: DraftCounts::default(),
    };
    Ok((usage, answers))
}

async fn collect_answer(
    meta: ResponseMeta,
    usage: PromptUsage,
    mut answers: Answers,
    mut readers: Vec<ToolReader>,
    with_logprobs: bool,
) -> Result<Response, ApiError> {
    let n = readers.len();
    let mut choices = vec![
        ChoiceText {
            logprobs: with_logprobs.then(Vec::new),
            ..ChoiceText::default()
        };
        n
    ];
    let mut running = n;
    while running > 0 {
        let Some((index, event)) = answers.next().await else {
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
            JobEvent::Done { end, .. } => {
                choice.end = Some(end);
                running -= 1;
            }
            JobEvent::Failed(error) => return Err(error.into()),
            JobEvent::Started(_) => {}
        }
    }
    for (index, (choice, reader)) in choices.iter_mut().zip(&mut readers).enumerate() {
        let mut pieces = reader.feed(&std::mem::take(&mut choice.text));
        pieces.extend(reader.finish());
        for piece in pieces {
            match piece {
                AnswerPiece::Text(text) => choice.text.push_str(&text),
                AnswerPiece::Call {
                    index: call,
                    call: tool_call,
                } => choice
                    .tool_calls
                    .push(call_json(meta.call_id(index, call), &tool_call)),
            }
        }
    }
    let (completion_tokens, drafts) = answers.counted();
    let usage = Usage::new(usage, n, completion_tokens, drafts);
    Ok(Json(meta.response(&choices, &usage)).into_response())
}

/// A stream between events: what each choice has sent, and events ready to go.
struct StreamState {
    answers: Answers,
    choices: Vec<StreamChoice>,
    readers: Vec<ToolReader>,
    running: usize,
    /// Events made from one engine event, sent one by one.
    ready: VecDeque<Event>,
    phase: StreamPhase,
    /// The prompt's counts for the usage chunk (`include_usage`), taken when it is sent.
    usage: Option<PromptUsage>,
}

#[derive(Default)]
struct StreamChoice {
    /// Bytes of text sent (the text flavour's `text_offset`).
    offset: usize,
    /// Log-probabilities of tokens whose text the tool reader still holds.
    logprobs: Vec<TokenLogprob>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamPhase {
    /// Choices still run.
    Open,
    /// Every choice has ended; the usage chunk (when asked for) and `[DONE]` follow.
    Finishing,
    Closed,
}

impl StreamState {
    /// Queues a chunk per piece of choice `index`'s answer, each with the log-probabilities of
    /// the tokens held until it.
    fn queue(&mut self, meta: &ResponseMeta, index: usize, pieces: Vec<AnswerPiece>) {
        let Some(choice) = self.choices.get_mut(index) else {
            return;
        };
        for piece in pieces {
            let logprobs = std::mem::take(&mut choice.logprobs);
            let chunk = match piece {
                AnswerPiece::Text(text) => {
                    let chunk =
                        meta.chunk(index, ChunkPiece::Text(&text), &logprobs, choice.offset);
                    choice.offset += text.len();
                    chunk
                }
                AnswerPiece::Call {
                    index: call,
                    call: tool_call,
                } => {
                    let call_json = call_json(meta.call_id(index, call), &tool_call);
                    meta.chunk(
                        index,
                        ChunkPiece::Call {
                            index: call,
                            call: call_json,
                        },
                        &logprobs,
                        choice.offset,
                    )
                }
            };
            self.ready.push_back(json_event(&chunk));
        }
    }

    /// Turns the next engine event into queued chunks.
    fn take(&mut self, meta: &ResponseMeta, event: Option<(usize, JobEvent)>) {
        match event {
            Some((index, JobEvent::Token { text, logprob })) => {
                if let (Some(choice), Some(logprob)) = (self.choices.get_mut(index), logprob) {
                    choice.logprobs.push(logprob);
                }
                let pieces = match self.readers.get_mut(index) {
                    Some(reader) => reader.feed(&text),
                    None => Vec::new(),
                };
                self.queue(meta, index, pieces);
            }
            Some((index, JobEvent::Done { end, .. })) => {
                let (pieces, called) = match self.readers.get_mut(index) {
                    Some(reader) => (reader.finish(), reader.called()),
                    None => (Vec::new(), false),
                };
                self.queue(meta, index, pieces);
                let logprobs = self
                    .choices
                    .get_mut(index)
                    .map(|choice| std::mem::take(&mut choice.logprobs))
                    .unwrap_or_default();
                let chunk = meta.chunk(index, ChunkPiece::End { end, called }, &logprobs, 0);
                self.ready.push_back(json_event(&chunk));
                self.running -= 1;
                if self.running == 0 {
                    self.phase = StreamPhase::Finishing;
                }
            }
            Some((_, JobEvent::Failed(error))) => {
                self.ready.push_back(error_event(&error.into()));
                self.finish_with_done();
            }
            Some((_, JobEvent::Started(_))) | None => {
                self.ready.push_back(error_event(&engine_gone()));
                self.finish_with_done();
            }
        }
    }

    fn finish_with_done(&mut self) {
        self.ready.push_back(Event::default().data("[DONE]"));
        self.phase = StreamPhase::Closed;
    }
}

fn stream_answer(
    meta: ResponseMeta,
    state: StreamState,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let events = stream::unfold(state, move |mut state| {
        let meta = meta.clone();
        async move {
            loop {
                if let Some(event) = state.ready.pop_front() {
                    return Some((Ok(event), state));
                }
                match state.phase {
                    StreamPhase::Closed => return None,
                    StreamPhase::Finishing => {
                        if let Some(usage) = state.usage.take() {
                            let (completion_tokens, drafts) = state.answers.counted();
                            let usage =
                                Usage::new(usage, state.choices.len(), completion_tokens, drafts);
                            state.ready.push_back(json_event(&meta.usage_chunk(&usage)));
                        }
                        state.finish_with_done();
                    }
                    StreamPhase::Open => {
                        let event = state.answers.next().await;
                        state.take(&meta, event);
                    }
                }
            }
        }
    });
    Sse::new(events)
}

pub fn json_event(value: &serde_json::Value) -> Event {
    Event::default().data(value.to_string())
}

/// An error after the stream began: the status line is sent, so the error travels as an event.
pub fn error_event(error: &ApiError) -> Event {
    json_event(&error.body())
}

pub fn ended_early(end: JobEnd) -> ApiError {
    match end {
        JobEnd::TimedOut => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout_error",
            "the request ran past the server's time limit",
        ),
        JobEnd::Finished(_) => ApiError::internal("the answer ended before it started"),
    }
}

pub fn engine_gone() -> ApiError {
    ApiError::internal("the engine stopped before answering")
}
