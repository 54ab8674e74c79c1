//! Response bodies and stream chunks of the OpenAI-compatible endpoints, text and chat flavours:
//! choices by index, log-probabilities in each flavour's shape, and usage with PML's counts of
//! where the prompt tokens came from.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pml_engine::generation::FinishReason;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::engine::{JobEnd, PromptUsage, TokenLogprob, TokenText};

/// `usage`: OpenAI's counts plus where the prompt tokens came from.
#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Prompt tokens spliced from stored modules.
    pub cached_tokens: usize,
    pub recomputed_tokens: usize,
    /// Prompt tokens computed for this request.
    pub new_tokens: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    /// The prompt's counts (once, however many choices) and every choice's tokens.
    pub fn new(prompt: PromptUsage, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens: prompt.prompt_tokens,
            completion_tokens,
            total_tokens: prompt.prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: prompt.cached_tokens,
            },
            cached_tokens: prompt.cached_tokens,
            recomputed_tokens: prompt.recomputed_tokens,
            new_tokens: prompt.new_tokens,
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
}

/// What every response and chunk of one request repeats.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub flavor: Flavor,
}

impl ResponseMeta {
    pub fn new(flavor: Flavor, model: &str) -> Self {
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
                let finish = choice.end.map(finish_reason);
                match self.flavor {
                    Flavor::Text => json!({
                        "index": index, "text": choice.text, "logprobs": logprobs,
                        "finish_reason": finish
                    }),
                    Flavor::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": choice.text, "refusal": null},
                        "logprobs": logprobs,
                        "finish_reason": finish
                    }),
                }
            })
            .collect();
        let mut body = self.envelope(false, choices);
        body.insert("usage".into(), json!(usage));
        Value::Object(body)
    }

    /// One streamed piece of choice `index`: text (with its token's log-probability), or the
    /// choice's end. `offset` is the choice's text length before this piece (the text flavour's
    /// `text_offset`).
    pub fn chunk(
        &self,
        index: usize,
        text: &str,
        logprob: Option<&TokenLogprob>,
        offset: usize,
        end: Option<JobEnd>,
    ) -> Value {
        let finish = end.map(finish_reason);
        let logprobs = logprob.map(|token| self.logprobs(std::slice::from_ref(token), offset));
        let choice = match self.flavor {
            Flavor::Text => json!({
                "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish
            }),
            Flavor::Chat => {
                let delta = if end.is_some() {
                    json!({})
                } else {
                    json!({"role": "assistant", "content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        };
        Value::Object(self.envelope(true, vec![choice]))
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

/// OpenAI's finish reasons: `stop` for an end-of-turn token or a stop string, `length` for the
/// token limit; a request that ran past its deadline ends with `timeout`.
pub fn finish_reason(end: JobEnd) -> &'static str {
    match end {
        JobEnd::Finished(FinishReason::Eos | FinishReason::Stop) => "stop",
        JobEnd::Finished(FinishReason::Length) => "length",
        JobEnd::TimedOut => "timeout",
    }
}

/// Whether a completion prompt is a PML prompt rather than plain text.
pub fn is_pml_prompt(prompt: &str) -> bool {
    prompt.trim_start().starts_with("<prompt")
}
