//! Response bodies and stream chunks of the OpenAI-compatible endpoints, text and chat flavours:
//! choices by index, log-probabilities in each flavour's shape, and usage with PML's counts of
//! where the prompt tokens came from.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pml_engine::generation::FinishReason;
use serde::Serialize;
use serde_json::{Map, Value, json};

use pml_runtime::inference::Ratio;

use crate::engine::prompt_rows::PromptToken;
use crate::engine::{DraftCounts, JobEnd, PromptUsage, TokenLogprob, TokenText};

/// `usage`: OpenAI's counts plus where the prompt tokens came from.
#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
    /// Prompt tokens spliced from stored modules.
    pub cached_tokens: usize,
    pub recomputed_tokens: usize,
    /// Prompt tokens computed for this request.
    pub new_tokens: usize,
    /// With `n` > 1: prompt tokens the other choices took from the first one's prefill instead
    /// of computing them, `(n - 1) × prompt_tokens` (OpenAI counts the prompt once, so
    /// `prompt_tokens_details.cached_tokens`, a share of it, cannot hold them).
    pub shared_tokens: usize,
    /// Mode `blend`: its estimated fidelity to mode `full` (one minus the distance between the
    /// first token's distributions before and after the repair; 1 where computed exactly).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_fidelity: Option<f64>,
    /// The request's `min_fidelity` sent the prompt to mode `full` (the estimate above is the
    /// replaced answer's).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fidelity_guard_fired: bool,
    /// A PML prompt's tokens as `[text, kind]` pairs in position order, kind `reused`,
    /// `recomputed` or `new`, when the request set `prompt_token_kinds`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_shared"
    )]
    pub prompt_token_kinds: Option<Arc<[PromptToken]>>,
}

/// A list the engine shares rather than copies, written as the list.
fn serialize_shared<S: serde::Serializer>(
    tokens: &Option<Arc<[PromptToken]>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&tokens.as_deref(), serializer)
}

#[derive(Clone, Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

/// OpenAI's counts of predicted tokens, here the drafted ones of speculative decoding: those
/// the answer kept, and those verified and dropped (which, unlike OpenAI's, `completion_tokens`
/// does not count).
#[derive(Clone, Debug, Serialize)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

impl Usage {
    /// The prompt's counts (once, however many `choices`) and every choice's tokens and drafts.
    pub fn new(
        prompt: PromptUsage,
        choices: usize,
        completion_tokens: usize,
        drafts: DraftCounts,
    ) -> Self {
        Self {
            prompt_tokens: prompt.prompt_tokens,
            completion_tokens,
            total_tokens: prompt.prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: prompt.cached_tokens,
            },
            completion_tokens_details: CompletionTokensDetails {
                accepted_prediction_tokens: drafts.accepted,
                rejected_prediction_tokens: drafts.drafted - drafts.accepted,
            },
            cached_tokens: prompt.cached_tokens,
            recomputed_tokens: prompt.recomputed_tokens,
            new_tokens: prompt.new_tokens,
            shared_tokens: prompt.prompt_tokens * choices.saturating_sub(1),
            estimated_fidelity: prompt.estimated_fidelity.map(Ratio::get),
            fidelity_guard_fired: prompt.fidelity_guard_fired,
            prompt_token_kinds: prompt.prompt_token_kinds,
        }
    }
}

/// Which endpoint's shapes to answer in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    Text,
    Chat,
}

/// One choice of a whole (non-streamed) answer.
#[derive(Clone, Debug, Default)]
pub struct ChoiceText {
    pub text: String,
    /// One entry per generated token, when log-probabilities were asked for.
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub end: Option<JobEnd>,
    /// The calls the answer made (chat with tools), as the message shows them.
    pub tool_calls: Vec<Value>,
}

/// What one streamed chunk of a choice carries.
#[derive(Clone, Debug)]
pub enum ChunkPiece<'a> {
    Text(&'a str),
    /// A whole tool call (as [`super::tools::call_json`] writes it) and its index in the choice.
    Call {
        index: usize,
        call: Value,
    },
    /// The choice's end; `called`: it made tool calls.
    End {
        end: JobEnd,
        called: bool,
    },
}

/// What every response and chunk of one request repeats.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub flavor: Flavor,
    /// Request fields every response and chunk repeats (`metadata`, `service_tier`).
    pub echo: Map<String, Value>,
}

impl ResponseMeta {
    pub fn new(flavor: Flavor, model: &str, echo: Map<String, Value>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let prefix = match flavor {
            Flavor::Text => "cmpl",
            Flavor::Chat => "chatcmpl",
        };
        Self {
            id: format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            model: model.to_string(),
            flavor,
            echo,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.flavor, chunk) {
            (Flavor::Text, _) => "text_completion",
            (Flavor::Chat, false) => "chat.completion",
            (Flavor::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Value>) -> Map<String, Value> {
        let mut body = Map::new();
        body.insert("id".into(), json!(self.id));
        body.insert("object".into(), json!(self.object(chunk)));
        body.insert("created".into(), json!(self.created));
        body.insert("model".into(), json!(self.model));
        body.insert("choices".into(), Value::Array(choices));
        body.extend(self.echo.clone());
        body
    }

    /// The whole answer of a non-streamed request.
    pub fn response(&self, choices: &[ChoiceText], usage: &Usage) -> Value {
        let choices = choices
            .iter()
            .enumerate()
            .map(|(index, choice)| {
                let logprobs = choice
                    .logprobs
                    .as_deref()
                    .map(|tokens| self.logprobs(tokens, 0));
                let called = !choice.tool_calls.is_empty();
                let finish = choice.end.map(|end| finish_reason(end, called));
                match self.flavor {
                    Flavor::Text => json!({
                        "index": index, "text": choice.text, "logprobs": logprobs,
                        "finish_reason": finish
                    }),
                    Flavor::Chat => {
                        // A call's message has no text unless the model wrote some.
                        let content = (!called || !choice.text.trim().is_empty())
                            .then_some(choice.text.as_str());
                        let mut message =
                            json!({"role": "assistant", "content": content, "refusal": null});
                        if called {
                            message["tool_calls"] = json!(choice.tool_calls);
                        }
                        json!({
                            "index": index,
                            "message": message,
                            "logprobs": logprobs,
                            "finish_reason": finish
                        })
                    }
                }
            })
            .collect();
        let mut body = self.envelope(false, choices);
        body.insert("usage".into(), json!(usage));
        Value::Object(body)
    }

    /// One streamed piece of choice `index`, with the log-probabilities of the tokens it
    /// releases (none: `null`). `offset` is the choice's text length before this piece (the text
    /// flavour's `text_offset`).
    pub fn chunk(
        &self,
        index: usize,
        piece: ChunkPiece,
        logprobs: &[TokenLogprob],
        offset: usize,
    ) -> Value {
        let logprobs = (!logprobs.is_empty()).then(|| self.logprobs(logprobs, offset));
        let (text, finish) = match &piece {
            ChunkPiece::Text(text) => (*text, None),
            ChunkPiece::Call { .. } => ("", None),
            ChunkPiece::End { end, called } => ("", Some(finish_reason(*end, *called))),
        };
        let choice = match self.flavor {
            Flavor::Text => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish
            }),
            Flavor::Chat => {
                let delta = match piece {
                    ChunkPiece::Text(text) => json!({"role": "assistant", "content": text}),
                    ChunkPiece::Call { index, mut call } => {
                        call["index"] = json!(index);
                        json!({"role": "assistant", "content": null, "tool_calls": [call]})
                    }
                    ChunkPiece::End { .. } => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        Value::Object(self.envelope(true, vec![choice]))
    }

    /// An id for the `index`-th tool call of `choice`, unique to this response.
    pub fn call_id(&self, choice: usize, index: usize) -> String {
        format!("call_{}_{}_{choice}_{index}", self.created, self.id)
    }

    /// The chunk `stream_options.include_usage` asks for: no choices, the whole usage.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        let mut body = self.envelope(true, Vec::new());
        body.insert("usage".into(), json!(usage));
        Value::Object(body)
    }

    /// Log-probabilities of `tokens` in this flavour's shape: chat's `content` list, or the
    /// completions endpoint's parallel lists (`text_offset` counted from `offset`, in bytes).
    fn logprobs(&self, tokens: &[TokenLogprob], offset: usize) -> Value {
        match self.flavor {
            Flavor::Chat => json!({
                "content": tokens.iter().map(|token| {
                    let mut entry = chat_entry(&token.token, token.logprob);
                    entry["top_logprobs"] = token.top.iter()
                        .map(|(text, logprob)| chat_entry(text, *logprob))
                        .collect();
                    entry
                }).collect::<Vec<_>>(),
                "refusal": null,
            }),
            Flavor::Text => {
                let mut offsets = Vec::with_capacity(tokens.len());
                let mut at = offset;
                for token in tokens {
                    offsets.push(at);
                    at += token.token.text.len();
                }
                json!({
                    "tokens": tokens.iter().map(|token| &token.token.text).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|token| token.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter().map(|token| {
                        token.top.iter()
                            .map(|(text, logprob)| (text.text.clone(), json!(logprob)))
                            .collect::<Map<String, Value>>()
                    }).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }
}

fn chat_entry(token: &TokenText, logprob: f32) -> Value {
    json!({"token": token.text, "logprob": logprob, "bytes": token.bytes})
}

/// OpenAI's finish reasons: `stop` for an end-of-turn token or a stop string (`tool_calls` when
/// the answer `called` tools), `length` for the token limit; a request that ran past its
/// deadline ends with `timeout`.
pub fn finish_reason(end: JobEnd, called: bool) -> &'static str {
    match end {
        JobEnd::Finished(FinishReason::Eos | FinishReason::Stop) if called => "tool_calls",
        JobEnd::Finished(FinishReason::Eos | FinishReason::Stop) => "stop",
        JobEnd::Finished(FinishReason::Length) => "length",
        JobEnd::TimedOut => "timeout",
    }
}

/// Whether a completion prompt is a PML prompt rather than plain text: `<prompt …>` first, after
/// any comments (files often open with one).
pub fn is_pml_prompt(prompt: &str) -> bool {
    pml_syntax::root_tag::is_prompt(prompt)
}
