//! `GET /v1/models` (the one model this server runs, under each of its names), `POST /tokenize`
//! and `POST /detokenize` (vLLM's and llama.cpp's spellings of their fields both accepted).
//!
//! A completion's `model` may be any name: the one model answers it, and the answer echoes the
//! name asked for (as llama.cpp's server does; clients send their own defaults, `gpt-4o-mini`).
//! So `GET /v1/models/{id}` agrees with it: any id is that model's card, under the id asked,
//! its `root` the model's own name.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::AppState;
use super::completions::parse_json;
use super::error::ApiError;
use super::request::ChatRequest;
use crate::engine::{EngineRequest, PromptSource};

fn model_entry(state: &AppState, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": 0,
        "owned_by": "pml",
        "root": state.config.model_name,
        "max_model_len": state.engine.max_positions,
    })
}

pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let config = &state.config;
    let data: Vec<Value> = std::iter::once(&config.model_name)
        .chain(&config.model_aliases)
        .map(|id| model_entry(&state, id))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

pub async fn show(State(state): State<AppState>, Path(id): Path<String>) -> Json<Value> {
    Json(model_entry(&state, &id))
}

/// `POST /tokenize`: `prompt` (vLLM) or `content` (llama.cpp) text, or chat `messages` with
/// the `tools` offered (the prompt a chat request renders, as vLLM's tokenizer endpoint takes).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    prompt: Option<String>,
    content: Option<String>,
    messages: Option<Vec<Value>>,
    tools: Option<Vec<Value>>,
    /// vLLM's name; llama.cpp's is `add_special`. Default: BOS before plain text.
    add_special_tokens: Option<bool>,
    add_special: Option<bool>,
}

pub async fn tokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let request: TokenizeRequest = parse_json(&body?)?;
    let _ = request.model;
    let prompt = match (request.prompt.or(request.content), request.messages) {
        (Some(_), _) if request.tools.is_some() => {
            return Err(ApiError::bad_field(
                "tools",
                "tools are rendered with chat `messages`, not with plain text",
            ));
        }
        (Some(text), None) => PromptSource::Text(text),
        (None, Some(messages)) => {
            let chat = ChatRequest {
                messages,
                tools: request.tools,
                ..ChatRequest::default()
            };
            chat.prompt(state.engine.tool_format)?.source
        }
        _ => {
            return Err(ApiError::bad_field(
                "prompt",
                "give one of `prompt` (or `content`) and `messages`",
            ));
        }
    };
    let add_special = request
        .add_special_tokens
        .or(request.add_special)
        .unwrap_or(true);
    let (reply, answer) = oneshot::channel();
    state.engine.send(EngineRequest::Tokenize {
        prompt,
        add_special,
        reply,
    })?;
    let tokens = answer
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))??;
    Ok(Json(json!({
        "tokens": tokens,
        "count": tokens.len(),
        "max_model_len": state.engine.max_positions,
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `POST /detokenize`: the text as `prompt` (vLLM) and `content` (llama.cpp).
pub async fn detokenize(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let request: DetokenizeRequest = parse_json(&body?)?;
    let _ = request.model;
    let (reply, answer) = oneshot::channel();
    state.engine.send(EngineRequest::Detokenize {
        tokens: request.tokens,
        reply,
    })?;
    let text = answer
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))??;
    Ok(Json(json!({"prompt": text, "content": text})))
}
