//! Bodies of the OpenAI-compatible endpoints: requests (with PML's `mode` and `recompute`) and
//! the responses and stream chunks of the text and chat flavours.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use pml_engine::generation::{FinishReason, SamplingParams};
use pml_runtime::inference::{InferenceMode, Ratio};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::ApiError;
use crate::config::ServerConfig;
use crate::engine::{JobEnd, PromptUsage};

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// Fields both completion endpoints accept besides the prompt. Unknown fields are ignored, as
/// OpenAI clients send many.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerationFields {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stop: Option<StopField>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    /// PML: how a PML prompt's prefill is computed (`reuse`, `blend`, `full`).
    pub mode: Option<String>,
    /// PML: fraction of cached tokens to recompute in mode `blend` (0 to 1).
    pub recompute: Option<f32>,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// A PML prompt (`<prompt schema="…">…</prompt>`) or plain text.
    pub prompt: String,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

/// One message of a chat.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

impl GenerationFields {
    /// Sampling parameters and mode, checked against the server's limits.
    pub fn to_params(
        &self,
        config: &ServerConfig,
    ) -> Result<(SamplingParams, InferenceMode), ApiError> {
        let max_tokens = self.max_tokens.unwrap_or(config.default_max_tokens);
        if max_tokens > config.max_tokens_limit {
            return Err(ApiError::bad_request(format!(
                "max_tokens {max_tokens} is above this server's limit of {}",
                config.max_tokens_limit
            )));
        }
        let defaults = SamplingParams::default();
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            seed: self.seed.unwrap_or(defaults.seed),
            max_tokens,
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopField::One(stop)) => vec![stop.clone()],
                Some(StopField::Many(stops)) => stops.clone(),
            },
            ..defaults
        };
        params
            .validate()
            .map_err(|error| ApiError::bad_request(error.to_string()))?;
        let mut mode = match &self.mode {
            Some(mode) => mode
                .parse::<InferenceMode>()
                .map_err(ApiError::bad_request)?,
            None => InferenceMode::default(),
        };
        if let Some(recompute) = self.recompute {
            let InferenceMode::Blend(options) = &mut mode else {
                return Err(ApiError::bad_request(format!(
                    "recompute = {recompute} applies to mode `blend` only, not `{mode}`"
                )));
            };
            options.recompute = Ratio::new(f64::from(recompute)).ok_or_else(|| {
                ApiError::bad_request(format!("recompute = {recompute} is not within 0..=1"))
            })?;
        }
        Ok((params, mode))
    }
}

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

    /// The whole answer of a non-streamed request.
    pub fn response(&self, text: &str, end: JobEnd, usage: &Usage) -> Value {
        let choice = match self.flavor {
            Flavor::Text => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(end)
            }),
            Flavor::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason(end)
            }),
        };
        json!({
            "id": self.id,
            "object": match self.flavor { Flavor::Text => "text_completion", Flavor::Chat => "chat.completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        })
    }

    /// One streamed piece; the last chunk has the finish reason and the usage.
    pub fn chunk(&self, text: &str, end: Option<JobEnd>, usage: Option<&Usage>) -> Value {
        let finish = end.map(finish_reason);
        let choice = match self.flavor {
            Flavor::Text => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish
            }),
            Flavor::Chat => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"role": "assistant", "content": text})
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
        };
        let mut chunk = json!({
            "id": self.id,
            "object": match self.flavor { Flavor::Text => "text_completion", Flavor::Chat => "chat.completion.chunk" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let (Some(usage), Some(object)) = (usage, chunk.as_object_mut()) {
            object.insert("usage".to_string(), json!(usage));
        }
        chunk
    }
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
