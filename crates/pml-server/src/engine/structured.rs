//! Structured output (`response_format` `json_object` / `json_schema`) by constrained decoding
//! with llguidance, the library llama.cpp and vLLM use: before each token is sampled, the tokens
//! that cannot continue text the grammar accepts get -inf; the sampled token is fed to the
//! grammar. It acts on the decode loop only, so it works alike for plain and PML prompts.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use pml_engine::Tokenizer;
use pml_engine::tokenizer::TokenBytes;
use serde_json::{Value, json};

use super::JobError;
use crate::incident::Incident;

/// What the answer must be.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this JSON Schema.
    JsonSchema(Value),
    /// Text of this Lark grammar (llguidance's dialect): a required tool call.
    ToolCall(String),
}

/// The model's vocabulary as llguidance sees it: each token's bytes in a trie, markup tokens
/// as `0xFF`-prefixed specials (never part of the text), tokenizing greedily over the trie.
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(bytes)
    }

    /// Greedy is not the model's own tokenization: llguidance must not force tokens from it.
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// Grammar parsers for one model's vocabulary (built once: the vocabulary's trie and slices).
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    pub fn new(tokenizer: &dyn Tokenizer) -> Result<Self, JobError> {
        let unavailable = |why: String| {
            JobError::BadRequest(format!(
                "structured output is not available with this model's tokenizer: {why}"
            ))
        };
        let vocab_size = tokenizer.vocab_size();
        let eos = *tokenizer
            .eos_tokens()
            .first()
            .ok_or_else(|| unavailable("it has no end-of-text token".to_string()))?;
        let words = (0..vocab_size as u32)
            .map(|id| match tokenizer.token_bytes(id) {
                Some(TokenBytes::Text(bytes)) => Ok(bytes),
                Some(TokenBytes::Special(name)) => {
                    let mut bytes = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    bytes.extend(name.into_bytes());
                    Ok(bytes)
                }
                None => Err(unavailable(format!("token {id} has no bytes"))),
            })
            .collect::<Result<Vec<Vec<u8>>, JobError>>()?;
        let info = TokRxInfo::new(vocab_size as u32, eos);
        let env: TokEnv = Arc::new(VocabEnv {
            trie: TokTrie::from(&info, &words),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|error| unavailable(error.to_string()))?;
        // Quiet: grammar warnings reach the client as errors instead.
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
        })
    }

    /// A fresh constraint for one answer.
    pub fn constraint(&self, format: &ResponseFormat) -> Result<Constraint, JobError> {
        let (grammar, what) = match format {
            ResponseFormat::JsonObject => (
                TopLevelGrammar::from_json_schema(json!({"type": "object"})),
                "the response_format schema is",
            ),
            ResponseFormat::JsonSchema(schema) => (
                TopLevelGrammar::from_json_schema(schema.clone()),
                "the response_format schema is",
            ),
            ResponseFormat::ToolCall(lark) => (
                TopLevelGrammar::from_lark(lark.clone()),
                "the tools' parameter schemas are",
            ),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|error| JobError::BadRequest(format!("{what} not usable: {error}")))?;
        let mut matcher = Matcher::new(Ok(parser));
        // Some schemas the parser takes fail only at the first mask (`{"$ref": "#"}` refers to
        // itself without end): asked here, before the answer starts, it is the request's 400
        // rather than an incident in the middle of an answer.
        matcher
            .compute_mask_or_eos()
            .map_err(|error| JobError::BadRequest(format!("{what} not usable: {error:#}")))?;
        Ok(Constraint { matcher })
    }
}

/// One answer's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Sets every token the grammar does not allow next to -inf (only end-of-text once the
    /// value is complete).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), JobError> {
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(grammar_failure)?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar past the sampled `token`.
    pub fn accept(&mut self, token: u32) -> Result<(), JobError> {
        self.matcher.consume_token(token).map_err(grammar_failure)
    }
}

/// The grammar library's errors carry their causes under `{:#}` (anyhow's chain).
fn grammar_failure(error: impl std::fmt::Display) -> JobError {
    JobError::Internal(Incident::report(format_args!(
        "constrained decoding: {error:#}"
    )))
}
