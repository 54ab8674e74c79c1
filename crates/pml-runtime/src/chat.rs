//! A model's chat template analysed into role strings with the model's BOS/EOS spellings (the
//! Jinja source comes from the engine: [`pml_engine::chat::chat_template_source`]); and the prompt tokens of a chat.

use pml_compiler::chat_template::{ChatTemplate, ChatTemplateError, TemplateTokens};
use pml_compiler::conversation::{Conversation, ConversationPiece};
use pml_compiler::plan::Role;
use pml_engine::chat::{ChatSourceError, chat_template_source};
use pml_engine::gguf::{GgufError, GgufFile};
use pml_engine::tokenizer::{GgufTokenizer, TokenizeError, Tokenizer};
use serde_json::Value;

/// Why a model's chat template could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ChatSetupError {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error(transparent)]
    Source(#[from] ChatSourceError),

    #[error("`{key}` = {id} is not a token of the vocabulary")]
    BadTokenId { key: &'static str, id: u64 },

    #[error(transparent)]
    Template(#[from] ChatTemplateError),
}

/// The role strings of the model's chat template.
pub fn model_chat_template(
    gguf: &GgufFile,
    tokenizer: &GgufTokenizer,
) -> Result<ChatTemplate, ChatSetupError> {
    let spelling = |key: &'static str| -> Result<String, ChatSetupError> {
        match gguf.optional(key, GgufFile::get_u64)? {
            Some(id) => u32::try_from(id)
                .ok()
                .and_then(|token_id| tokenizer.token_text(token_id))
                .ok_or(ChatSetupError::BadTokenId { key, id }),
            None => Ok(String::new()),
        }
    };
    let tokens = TemplateTokens {
        bos_token: spelling("tokenizer.ggml.bos_token_id")?,
        eos_token: spelling("tokenizer.ggml.eos_token_id")?,
    };
    Ok(ChatTemplate::from_template(
        chat_template_source(gguf)?,
        &tokens,
    )?)
}

/// Prompt tokens of a chat: BOS (if the model uses one), the turns in order each wrapped in its
/// role's markers (the template's default preamble first when no turn is a system turn), then the
/// generation prompt. Template text may contain control tokens; the turns' text is encoded as
/// plain text so it cannot forge them.
pub fn chat_prompt_tokens(
    template: &ChatTemplate,
    tokenizer: &dyn Tokenizer,
    turns: &[(Role, &str)],
) -> Result<Vec<u32>, TokenizeError> {
    // (text, whether it may contain control tokens), in prompt order.
    let mut pieces: Vec<(&str, bool)> = Vec::new();
    if !turns.iter().any(|(role, _)| *role == Role::System) {
        pieces.push((template.default_preamble.as_str(), true));
    }
    for &(role, text) in turns {
        let markers = template.markers(role);
        pieces.extend([
            (markers.open.as_str(), true),
            (text, false),
            (markers.close.as_str(), true),
        ]);
    }
    pieces.push((template.generation_prompt.as_str(), true));
    encode_pieces(tokenizer, pieces)
}

/// BOS (if the model uses one), then each `(text, whether it may contain control tokens)`.
fn encode_pieces<'a>(
    tokenizer: &dyn Tokenizer,
    pieces: impl IntoIterator<Item = (&'a str, bool)>,
) -> Result<Vec<u32>, TokenizeError> {
    let mut tokens: Vec<u32> = tokenizer.bos_token().into_iter().collect();
    for (text, allow_special) in pieces {
        // An empty marker adds nothing (a SentencePiece tokenizer would encode a lone space).
        if !text.is_empty() {
            tokens.extend(tokenizer.encode(text, allow_special)?);
        }
    }
    Ok(tokens)
}

/// Why a whole conversation could not become prompt tokens.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Template(#[from] ChatTemplateError),

    #[error(transparent)]
    Tokenize(#[from] TokenizeError),

    #[error(
        "{place} holds `{text}`, which this model reads as a control token; the template would \
         write it into the prompt as one"
    )]
    ForgedControl { place: &'static str, text: String },
}

/// Prompt tokens of a conversation the role markers cannot express (tools, tool calls, tool
/// results), rendered whole by the model's template ([`ChatTemplate::render_conversation`]):
/// BOS, the template's text with its control tokens, the messages' texts as plain text. The
/// tools and the calls' names and arguments are written by the template as JSON inside its own
/// text, so any string in them that would encode as a control token is refused.
pub fn conversation_tokens(
    template: &ChatTemplate,
    tokenizer: &dyn Tokenizer,
    conversation: &Conversation,
) -> Result<Vec<u32>, ConversationError> {
    let calls = conversation
        .messages
        .iter()
        .filter_map(|message| message.get("tool_calls"));
    let places = conversation
        .tools
        .iter()
        .map(|tool| ("a tool definition", tool))
        .chain(calls.map(|calls| ("a tool call", calls)));
    for (place, value) in places {
        for text in json_strings(value) {
            if tokenizer.encode(text, true)? != tokenizer.encode(text, false)? {
                return Err(ConversationError::ForgedControl {
                    place,
                    text: text.to_owned(),
                });
            }
        }
    }
    let pieces = template.render_conversation(conversation)?;
    Ok(encode_pieces(
        tokenizer,
        pieces.iter().map(|piece| match piece {
            ConversationPiece::Template(text) => (text.as_str(), true),
            ConversationPiece::Content(text) => (text.as_str(), false),
        }),
    )?)
}

/// Every string in `value` (keys too: templates write both).
fn json_strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(text) => vec![text.as_str()],
        Value::Array(items) => items.iter().flat_map(json_strings).collect(),
        Value::Object(fields) => fields
            .iter()
            .flat_map(|(key, value)| std::iter::once(key.as_str()).chain(json_strings(value)))
            .collect(),
        _ => Vec::new(),
    }
}
