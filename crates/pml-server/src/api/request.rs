//! Request bodies of the completion endpoints as OpenAI's clients send them, checked field by
//! field: what this server implements is parsed and validated, what it does not is refused with
//! a 400 naming the field (`param`), never ignored.

use pml_compiler::conversation::Conversation;
use pml_compiler::tool_calls::ToolCallFormat;
use pml_engine::generation::{SamplingParams, Speculation};
use pml_runtime::inference::{InferenceMode, Ratio};
use pml_runtime::kv_budget::{DEFAULT_SINKS, KvBudget};
use pml_syntax::ast::Role;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::tools::{ToolChoice, ToolUse, template_tool_calls, tool_request};
use crate::config::ServerConfig;
use crate::engine::PromptSource;
use crate::engine::structured::ResponseFormat;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 8;
/// Most alternatives per token (`top_logprobs`, OpenAI's limit for chat).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most alternatives per token of the completions endpoint (`logprobs`, OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: usize = 5;

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// How long an answer may run when its request names no `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnnamedMaxTokens {
    /// The server's `default_max_tokens` (16, OpenAI's legacy completions default).
    Default,
    /// Until the model ends its turn, within the server's `max_tokens_limit` and the context.
    ToTheEnd,
}

/// Fields both completion endpoints accept besides the prompt.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerationFields {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stop: Option<StopField>,
    pub seed: Option<u64>,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub response_format: Option<Value>,
    /// OpenAI's end-user identifier, for the operator's logs; it changes nothing in the answer.
    pub user: Option<String>,
    /// PML: how a PML prompt's prefill is computed (`reuse`, `blend`, `full`).
    pub mode: Option<String>,
    /// PML: fraction of cached tokens to recompute in mode `blend` (0 to 1).
    pub recompute: Option<f32>,
    /// PML: mode `blend`'s fidelity guard (0 to 1): a prompt whose estimated fidelity to mode
    /// `full` is lower, or whose first token the repair changed, is answered in mode `full`.
    pub min_fidelity: Option<f32>,
    /// PML: most KV slots this sequence keeps (H2O heavy hitters, half of them the newest);
    /// plain prompts and chats only.
    pub kv_budget: Option<usize>,
    /// PML: report a PML prompt's tokens and how each was obtained (reused, recomputed, new) in
    /// `usage.prompt_token_kinds`.
    pub prompt_token_kinds: Option<bool>,
    /// PML: `"off"` decodes one token per step; `"ngram"` verifies tokens drafted from the
    /// prompt, the answer and earlier answers; `"draft"` also asks the server's draft model
    /// (`--draft-model`). Without it, the server's `--speculative`.
    pub speculative: Option<SpeculativeField>,
    /// Everything else the body holds, refused unless null.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The request field `speculative`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeField {
    Ngram,
    Draft,
    Off,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// A PML prompt (`<prompt schema="…">…</prompt>`) or plain text.
    pub prompt: Value,
    /// How many alternatives to report per token (0 to 5): OpenAI's legacy integer form.
    pub logprobs: Option<usize>,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// OpenAI's: keep the completion for later retrieval. This server keeps no chat
    /// completions (there is no route to read one back), so either value answers the same; it
    /// is accepted because clients send it by default.
    pub store: Option<bool>,
    /// Up to 16 string pairs, repeated in the response.
    pub metadata: Option<Map<String, Value>>,
    /// `auto` or `default`: this server has one tier, reported as `default`.
    pub service_tier: Option<String>,
    #[serde(flatten)]
    pub fields: GenerationFields,
}

/// What a request asks of the engine, once checked.
#[derive(Clone, Debug)]
pub struct Generation {
    pub params: SamplingParams,
    pub mode: InferenceMode,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// `Some(k)`: report each token's log-probability and its `k` likeliest alternatives.
    pub logprobs: Option<usize>,
    /// The answer's required form (`response_format` other than `text`).
    pub format: Option<ResponseFormat>,
    /// `kv_budget`, when the request names one (the server's default applies otherwise).
    pub kv_budget: Option<KvBudget>,
    /// The request named no `max_tokens`, and its endpoint lets such an answer run to its end:
    /// `params.max_tokens` is then the server's limit, cut to the room the context (and the KV
    /// pool) leaves once the prompt is known, instead of a reason to refuse it.
    pub open_ended: bool,
    /// Report a PML prompt's tokens with how each was obtained.
    pub prompt_token_kinds: bool,
}

/// `kv_budget = slots`: the first [`DEFAULT_SINKS`] and the newest half always kept, the
/// heavy hitters in the rest (the budget `pml run --kv-budget` gives by default).
fn heavy_hitter_budget(slots: usize) -> Result<KvBudget, ApiError> {
    KvBudget::h2o(slots, None).map_err(|_| {
        ApiError::bad_field(
            "kv_budget",
            format!(
                "kv_budget = {slots} cannot hold {DEFAULT_SINKS} attention sinks, the newest half \
                 and a heavy hitter: ask for at least {}",
                2 * DEFAULT_SINKS + 1
            ),
        )
    })
}

/// `response_format`: `text` (no constraint), `json_object`, or `json_schema` with its
/// `json_schema.schema`.
fn response_format(format: &Value) -> Result<Option<ResponseFormat>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => match format
            .get("json_schema")
            .and_then(|spec| spec.get("schema"))
        {
            Some(schema) if schema.is_object() => {
                Ok(Some(ResponseFormat::JsonSchema(schema.clone())))
            }
            _ => Err(ApiError::bad_field(
                "response_format.json_schema.schema",
                "a json_schema response_format needs `json_schema.schema`, a JSON Schema object",
            )),
        },
        Some(other) => Err(ApiError::unsupported(
            "response_format.type",
            format!(
                "response_format of type `{other}` is not supported (text, json_object, json_schema)"
            ),
        )),
        None => Err(ApiError::bad_field(
            "response_format.type",
            "response_format needs a `type`",
        )),
    }
}

impl GenerationFields {
    /// Sampling parameters, mode and output options, checked against the server's limits. How
    /// far an answer runs when the request names no `max_tokens` is `unnamed`'s: the legacy
    /// completions endpoint's 16 tokens, or, for a chat, until the model ends its turn (within
    /// the server's limit and the context), as OpenAI, vLLM and llama.cpp's server do.
    pub fn check(
        &self,
        config: &ServerConfig,
        logprobs: Option<usize>,
        unnamed: UnnamedMaxTokens,
    ) -> Result<Generation, ApiError> {
        refuse_unknown(&self.other, "")?;
        for (name, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if value.is_some_and(|value| value != 0.0) {
                return Err(ApiError::unsupported(
                    name,
                    format!("`{name}` is not supported by this server (only 0)"),
                ));
            }
        }
        let format = match &self.response_format {
            Some(format) => response_format(format)?,
            None => None,
        };
        let max_tokens = match (self.max_tokens, self.max_completion_tokens) {
            (Some(old), Some(new)) if old != new => {
                return Err(ApiError::bad_field(
                    "max_completion_tokens",
                    format!("max_tokens ({old}) and max_completion_tokens ({new}) disagree"),
                ));
            }
            (old, new) => new.or(old).unwrap_or(match unnamed {
                UnnamedMaxTokens::Default => config.default_max_tokens,
                UnnamedMaxTokens::ToTheEnd => config.max_tokens_limit,
            }),
        };
        let open_ended = unnamed == UnnamedMaxTokens::ToTheEnd
            && self.max_tokens.is_none()
            && self.max_completion_tokens.is_none();
        if max_tokens > config.max_tokens_limit {
            return Err(ApiError::bad_field(
                "max_completion_tokens",
                format!(
                    "max_tokens {max_tokens} is above this server's limit of {}",
                    config.max_tokens_limit
                ),
            ));
        }
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::bad_field(
                "n",
                format!("n = {n}: this server answers 1 to {MAX_CHOICES} choices"),
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad_field(
                "stream_options",
                "stream_options applies to streamed requests only (`stream: true`)",
            ));
        }
        let defaults = SamplingParams {
            speculation: match (self.speculative, config.speculation) {
                (None, configured) => configured,
                (Some(SpeculativeField::Off), _) => Speculation::Off,
                (Some(SpeculativeField::Ngram), Speculation::Off) => Speculation::default(),
                (Some(SpeculativeField::Ngram), configured) => configured.lookup(),
                (Some(SpeculativeField::Draft), _) => {
                    config.draft_speculation.ok_or_else(|| {
                        ApiError::bad_field(
                            "speculative",
                            "this server has no draft model (`pml serve --draft-model MODEL`): \
                         `\"ngram\"` drafts without one",
                        )
                    })?
                }
            },
            ..SamplingParams::default()
        };
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
        Ok(Generation {
            params,
            mode: self.mode()?,
            n,
            stream: self.stream,
            include_usage: self
                .stream_options
                .as_ref()
                .is_some_and(|options| options.include_usage),
            logprobs,
            format,
            kv_budget: self.kv_budget.map(heavy_hitter_budget).transpose()?,
            open_ended,
            prompt_token_kinds: self.prompt_token_kinds.unwrap_or(false),
        })
    }

    fn mode(&self) -> Result<InferenceMode, ApiError> {
        let mut mode = match &self.mode {
            Some(mode) => mode
                .parse::<InferenceMode>()
                .map_err(|error| ApiError::bad_field("mode", error.to_string()))?,
            None => InferenceMode::default(),
        };
        if let Some(recompute) = self.recompute {
            let InferenceMode::Blend(options) = &mut mode else {
                return Err(ApiError::bad_field(
                    "recompute",
                    format!("recompute = {recompute} applies to mode `blend` only, not `{mode}`"),
                ));
            };
            options.recompute = Ratio::new(f64::from(recompute)).ok_or_else(|| {
                ApiError::bad_field(
                    "recompute",
                    format!("recompute = {recompute} is not within 0..=1"),
                )
            })?;
            // A fraction asked for is recomputed as asked; without one, blend may take the
            // cheaper way (recompute all or none) where its probe shows the fraction cannot pay.
            options.shortcuts = false;
        }
        if let Some(floor) = self.min_fidelity {
            let InferenceMode::Blend(options) = &mut mode else {
                return Err(ApiError::bad_field(
                    "min_fidelity",
                    format!("min_fidelity = {floor} applies to mode `blend` only, not `{mode}`"),
                ));
            };
            options.min_fidelity = Some(Ratio::new(f64::from(floor)).ok_or_else(|| {
                ApiError::bad_field(
                    "min_fidelity",
                    format!("min_fidelity = {floor} is not within 0..=1"),
                )
            })?);
            if options.recompute == Ratio::ZERO && !options.auto_ratio {
                return Err(ApiError::bad_field(
                    "min_fidelity",
                    "min_fidelity needs recompute above 0: blend estimates its fidelity from \
                     what the repair changed",
                ));
            }
        }
        Ok(mode)
    }
}

impl CompletionRequest {
    /// The prompt text: a string, or a list of one string (OpenAI's batch form with one entry).
    pub fn prompt_text(&self) -> Result<String, ApiError> {
        match &self.prompt {
            Value::String(text) => Ok(text.clone()),
            Value::Array(items) => match items.as_slice() {
                [Value::String(text)] => Ok(text.clone()),
                _ => Err(ApiError::unsupported(
                    "prompt",
                    "`prompt` must be one string (lists of several prompts and token ids are not \
                     supported by this server)",
                )),
            },
            _ => Err(ApiError::bad_field("prompt", "`prompt` must be a string")),
        }
    }

    pub fn check(&self, config: &ServerConfig) -> Result<Generation, ApiError> {
        if let Some(logprobs) = self.logprobs
            && logprobs > MAX_COMPLETION_LOGPROBS
        {
            return Err(ApiError::bad_field(
                "logprobs",
                format!("logprobs = {logprobs}: at most {MAX_COMPLETION_LOGPROBS}"),
            ));
        }
        self.fields
            .check(config, self.logprobs, UnnamedMaxTokens::Default)
    }
}

impl ChatRequest {
    pub fn check(&self, config: &ServerConfig) -> Result<Generation, ApiError> {
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(top)) if top > MAX_TOP_LOGPROBS => {
                return Err(ApiError::bad_field(
                    "top_logprobs",
                    format!("top_logprobs = {top}: at most {MAX_TOP_LOGPROBS}"),
                ));
            }
            (false, Some(_)) => {
                return Err(ApiError::bad_field(
                    "top_logprobs",
                    "top_logprobs needs `logprobs: true`",
                ));
            }
            (true, top) => Some(top.unwrap_or(0)),
            (false, None) => None,
        };
        self.fields
            .check(config, logprobs, UnnamedMaxTokens::ToTheEnd)
    }

    /// The fields the response repeats: `metadata` and `service_tier`, checked.
    pub fn echo(&self) -> Result<Map<String, Value>, ApiError> {
        let mut echo = Map::new();
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata)?;
            echo.insert("metadata".into(), Value::Object(metadata.clone()));
        }
        if let Some(tier) = &self.service_tier {
            echo.insert("service_tier".into(), json!(service_tier(tier)?));
        }
        Ok(echo)
    }

    /// The chat's prompt: turns wrapped in the template's role markers, or, when tools are
    /// offered or the messages hold tool calls or results, the conversation rendered whole by
    /// the template; and how the answer is read for calls in the model's tool-call `format`
    /// (`None`: its template teaches none).
    pub fn prompt(&self, format: Option<ToolCallFormat>) -> Result<ChatPrompt, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_field("messages", "`messages` is empty"));
        }
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(index, message)| chat_message(index, message))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = tool_request(
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        let offered = tools
            .as_ref()
            .filter(|tools| tools.choice != ToolChoice::None);
        let tool_use = match offered {
            Some(tools) => {
                let format = format.ok_or_else(|| {
                    ApiError::unsupported(
                        "tools",
                        "this model's chat template teaches no tool-call format this server \
                         reads (Hermes `<tool_call>` blocks or Llama 3 JSON calls)",
                    )
                })?;
                tools.tool_use(format)
            }
            None => None,
        };
        let whole = offered.is_some() || messages.iter().any(ChatMessage::is_tool_related);
        let source = if whole {
            PromptSource::Conversation(Conversation {
                messages: template_messages(&messages),
                tools: offered
                    .map(|tools| tools.definitions.clone())
                    .unwrap_or_default(),
            })
        } else {
            PromptSource::Chat(
                messages
                    .into_iter()
                    .map(|message| (message.role.turn(), message.text.unwrap_or_default()))
                    .collect(),
            )
        };
        Ok(ChatPrompt {
            source,
            tools: tool_use,
        })
    }
}

/// A chat request's prompt, and how its answer is read for tool calls.
#[derive(Clone, Debug)]
pub struct ChatPrompt {
    pub source: PromptSource,
    pub tools: Option<ToolUse>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MessageRole {
    System,
    User,
    Assistant,
    Tool,
}

impl MessageRole {
    fn name(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }

    /// The PML role of a plain turn (a tool result is never one).
    fn turn(self) -> Role {
        match self {
            Self::System => Role::System,
            Self::Assistant => Role::Assistant,
            Self::User | Self::Tool => Role::User,
        }
    }
}

/// One message, checked.
#[derive(Clone, Debug)]
struct ChatMessage {
    role: MessageRole,
    /// `None` only for an assistant turn that calls tools without text.
    text: Option<String>,
    /// An assistant's calls, as the template reads them.
    tool_calls: Option<Value>,
    /// A tool result's call id and function name.
    tool_call_id: Option<String>,
    name: Option<String>,
}

impl ChatMessage {
    fn is_tool_related(&self) -> bool {
        self.tool_calls.is_some() || self.role == MessageRole::Tool
    }
}

/// The messages as the template reads them; a tool result without a `name` gets the name of
/// the call it answers (templates that show it read `message.name`).
fn template_messages(messages: &[ChatMessage]) -> Vec<Value> {
    let mut called: Vec<(String, String)> = Vec::new();
    messages
        .iter()
        .map(|message| {
            let mut entry = Map::new();
            entry.insert("role".into(), json!(message.role.name()));
            entry.insert("content".into(), json!(message.text));
            if let Some(calls) = &message.tool_calls {
                for call in calls.as_array().into_iter().flatten() {
                    if let (Some(id), Some(name)) = (
                        call.get("id").and_then(Value::as_str),
                        call["function"]["name"].as_str(),
                    ) {
                        called.push((id.to_owned(), name.to_owned()));
                    }
                }
                entry.insert("tool_calls".into(), calls.clone());
            }
            if let Some(id) = &message.tool_call_id {
                entry.insert("tool_call_id".into(), json!(id));
                let name = message.name.clone().or_else(|| {
                    called
                        .iter()
                        .find(|(call, _)| call == id)
                        .map(|(_, name)| name.clone())
                });
                if let Some(name) = name {
                    entry.insert("name".into(), json!(name));
                }
            }
            Value::Object(entry)
        })
        .collect()
}

/// One message, checked; anything it holds that its role does not take is refused.
fn chat_message(index: usize, message: &Value) -> Result<ChatMessage, ApiError> {
    let param = format!("messages[{index}]");
    let Some(fields) = message.as_object() else {
        return Err(ApiError::bad_field(param, "a message must be an object"));
    };
    let role = match fields.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => MessageRole::System,
        Some("user") => MessageRole::User,
        Some("assistant") => MessageRole::Assistant,
        Some("tool") => MessageRole::Tool,
        Some("function") => {
            return Err(ApiError::unsupported(
                format!("{param}.role"),
                "`function` messages (OpenAI's deprecated functions API) are not supported; \
                 send `tool` messages",
            ));
        }
        Some(other) => {
            return Err(ApiError::bad_field(
                format!("{param}.role"),
                format!(
                    "unknown role `{other}` (expected system, developer, user, assistant or tool)"
                ),
            ));
        }
        None => {
            return Err(ApiError::bad_field(
                format!("{param}.role"),
                "a message needs a `role`",
            ));
        }
    };
    let mut rest = fields.clone();
    rest.remove("role");
    let content = rest.remove("content");
    let tool_calls = match role {
        MessageRole::Assistant => rest
            .remove("tool_calls")
            .filter(|calls| !calls.is_null())
            .map(|calls| template_tool_calls(&format!("{param}.tool_calls"), &calls))
            .transpose()?
            .filter(|calls| calls.as_array().is_some_and(|calls| !calls.is_empty())),
        _ => None,
    };
    let (tool_call_id, name) = match role {
        MessageRole::Tool => {
            let id = match rest.remove("tool_call_id") {
                Some(Value::String(id)) => id,
                _ => {
                    return Err(ApiError::bad_field(
                        format!("{param}.tool_call_id"),
                        "a tool message needs the `tool_call_id` it answers",
                    ));
                }
            };
            let name = rest
                .remove("name")
                .and_then(|name| name.as_str().map(str::to_owned));
            (Some(id), name)
        }
        _ => (None, None),
    };
    refuse_unknown(&rest, &format!("{param}."))?;
    let text = match content {
        Some(Value::String(text)) => Some(text),
        Some(Value::Array(parts)) => Some(content_parts(&param, &parts)?),
        Some(Value::Null) | None if tool_calls.is_some() => None,
        Some(Value::Null) | None => {
            return Err(ApiError::bad_field(
                format!("{param}.content"),
                "a message needs text `content`",
            ));
        }
        Some(_) => {
            return Err(ApiError::bad_field(
                format!("{param}.content"),
                "`content` must be a string or a list of content parts",
            ));
        }
    };
    Ok(ChatMessage {
        role,
        text,
        tool_calls,
        tool_call_id,
        name,
    })
}

/// The text parts of a content list, joined; other part types are refused.
fn content_parts(param: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut text = String::new();
    for (index, part) in parts.iter().enumerate() {
        let at = format!("{param}.content[{index}]");
        match part.get("type").and_then(Value::as_str) {
            Some("text") => match part.get("text").and_then(Value::as_str) {
                Some(piece) => text.push_str(piece),
                None => {
                    return Err(ApiError::bad_field(
                        format!("{at}.text"),
                        "a text part needs a `text` string",
                    ));
                }
            },
            Some(other) => {
                return Err(ApiError::unsupported(
                    format!("{at}.type"),
                    format!("content parts of type `{other}` are not supported (text only)"),
                ));
            }
            None => {
                return Err(ApiError::bad_field(
                    format!("{at}.type"),
                    "a content part needs a `type`",
                ));
            }
        }
    }
    Ok(text)
}

/// Refuses the first non-null field of `fields` (prefixed by `prefix` in the error's `param`).
fn refuse_unknown(fields: &Map<String, Value>, prefix: &str) -> Result<(), ApiError> {
    refuse_first(
        fields,
        prefix,
        |_, _| false,
        |name| match name {
            "tools" | "tool_choice" | "parallel_tool_calls" => {
                "tools are offered through the chat endpoint only"
            }
            "functions" | "function_call" => {
                "OpenAI's deprecated functions API is not supported; send `tools` and `tool_choice`"
            }
            "tool_calls" | "tool_call_id" => {
                "only assistant messages call tools and tool messages answer them"
            }
            "logit_bias" => "logit_bias is not supported by this server",
            "echo" | "best_of" | "suffix" => {
                "this completions option is not supported by this server"
            }
            "audio" | "modalities" => "audio is not supported by this server (text only)",
            _ => "this field is not supported by this server",
        },
    )
}

/// Most `metadata` pairs, and the longest key and value (OpenAI's limits).
const METADATA_PAIRS: usize = 16;
const METADATA_KEY_CHARS: usize = 64;
const METADATA_VALUE_CHARS: usize = 512;

/// `metadata` as OpenAI takes it: at most 16 pairs of strings, keys up to 64 characters, values
/// up to 512.
pub(super) fn check_metadata(metadata: &Map<String, Value>) -> Result<(), ApiError> {
    if metadata.len() > METADATA_PAIRS {
        return Err(ApiError::bad_field(
            "metadata",
            format!(
                "metadata has {} pairs: at most {METADATA_PAIRS}",
                metadata.len()
            ),
        ));
    }
    for (key, value) in metadata {
        let fits = key.chars().count() <= METADATA_KEY_CHARS
            && value
                .as_str()
                .is_some_and(|text| text.chars().count() <= METADATA_VALUE_CHARS);
        if !fits {
            return Err(ApiError::bad_field(
                format!("metadata.{key}"),
                format!(
                    "metadata holds strings: keys up to {METADATA_KEY_CHARS} characters, values \
                     up to {METADATA_VALUE_CHARS}"
                ),
            ));
        }
    }
    Ok(())
}

/// `service_tier`: `auto` and `default` are this server's one tier, reported as `default`;
/// the others (`flex`, `priority`, `scale`) are OpenAI's own.
pub(super) fn service_tier(tier: &str) -> Result<&'static str, ApiError> {
    match tier {
        "auto" | "default" => Ok("default"),
        other => Err(ApiError::unsupported(
            "service_tier",
            format!("service_tier `{other}` is not offered: this server has one tier (`default`)"),
        )),
    }
}

/// Refuses the first field of `fields` by name that asks for something — not null, and not a
/// value `asks_nothing` accepts as the default — with `why` it cannot be served (`prefix`
/// before the name in the error's `param`): a server never ignores a field.
pub(super) fn refuse_first(
    fields: &Map<String, Value>,
    prefix: &str,
    asks_nothing: impl Fn(&str, &Value) -> bool,
    why: impl Fn(&str) -> &'static str,
) -> Result<(), ApiError> {
    let first = fields
        .iter()
        .filter(|(name, value)| !value.is_null() && !asks_nothing(name, value))
        .map(|(name, _)| name)
        .min();
    match first {
        None => Ok(()),
        Some(name) => Err(ApiError::unsupported(
            format!("{prefix}{name}"),
            format!("`{prefix}{name}`: {}", why(name)),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(body: Value) -> Result<(Generation, Vec<(Role, String)>), ApiError> {
        let request: ChatRequest = serde_json::from_value(body).expect("parses");
        let generation = request.check(&ServerConfig::default())?;
        match request.prompt(Some(ToolCallFormat::Hermes))?.source {
            PromptSource::Chat(turns) => Ok((generation, turns)),
            other => panic!("not plain turns: {other:?}"),
        }
    }

    #[test]
    fn content_parts_are_joined_and_other_parts_refused_by_name() {
        let (_, turns) = chat(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]}]}))
        .expect("text parts");
        assert_eq!(turns, vec![(Role::User, "Hello, world".to_string())]);
        let error = chat(json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x"}}]}]}))
        .expect_err("image part");
        assert_eq!(error.param.as_deref(), Some("messages[0].content[1].type"));
        assert_eq!(error.code, Some("unsupported_parameter"));
    }

    #[test]
    fn unsupported_fields_are_refused_never_ignored() {
        for (body, param) in [
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"logit_bias": {"1": 5}}), "logit_bias"),
            (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
            (
                json!({"response_format": {"type": "grammar"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema.schema",
            ),
            (json!({"something_new": 1}), "something_new"),
        ] {
            let mut body = body;
            body["messages"] = json!([{"role": "user", "content": "hi"}]);
            let error = chat(body).expect_err(param);
            assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
            assert_eq!(error.status, 400);
        }
        let error = chat(json!({"messages": [{"role": "user", "content": "hi", "name": "x"}]}))
            .expect_err("name");
        assert_eq!(error.param.as_deref(), Some("messages[0].name"));
        let schema = json!({"type": "object"});
        let (generation, _) = chat(json!({"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}))
        .expect("json_schema");
        assert_eq!(generation.format, Some(ResponseFormat::JsonSchema(schema)));
        // Null means unset, as clients send it.
        chat(json!({"messages": [{"role": "user", "content": "hi"}], "tools": null, "user": "u"}))
            .expect("nulls and user are fine");
    }

    #[test]
    fn token_limits_choices_logprobs_and_usage_options() {
        let messages = json!([{"role": "user", "content": "hi"}]);
        let (generation, _) = chat(json!({"messages": messages, "max_completion_tokens": 7,
            "n": 2, "logprobs": true, "top_logprobs": 3, "stream": true,
            "stream_options": {"include_usage": true}}))
        .expect("valid");
        assert_eq!(generation.params.max_tokens, 7);
        assert!(!generation.open_ended, "a named limit is the request's");
        assert!(generation.stream && generation.include_usage);
        assert_eq!((generation.n, generation.logprobs), (2, Some(3)));
        // A chat without a limit answers until it is done, within the server's limit.
        let (generation, _) = chat(json!({"messages": messages})).expect("no limit");
        let config = ServerConfig::default();
        assert_eq!(generation.params.max_tokens, config.max_tokens_limit);
        assert!(generation.open_ended);
        // The legacy completions endpoint keeps OpenAI's 16.
        let request: CompletionRequest =
            serde_json::from_value(json!({"prompt": "hi"})).expect("parses");
        let generation = request.check(&config).expect("valid");
        assert_eq!(generation.params.max_tokens, config.default_max_tokens);
        assert!(!generation.open_ended);
        for (body, param) in [
            (
                json!({"max_tokens": 5, "max_completion_tokens": 6}),
                "max_completion_tokens",
            ),
            (json!({"n": 0}), "n"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"stream_options": {"include_usage": true}}),
                "stream_options",
            ),
        ] {
            let mut body = body;
            body["messages"] = messages.clone();
            let error = chat(body).expect_err(param);
            assert_eq!(error.param.as_deref(), Some(param), "{}", error.message);
        }
    }
}
