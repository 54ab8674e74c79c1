//! Structured output (`response_format` `json_object` / `json_schema`) and tool calls by
//! constrained decoding with llguidance, the library llama.cpp and vLLM use: before each token is
//! sampled, the tokens that cannot continue text the grammar accepts get -inf; the sampled token
//! is fed to the grammar. A call the model may or may not make (`tool_choice: auto`) is held to
//! its grammar lazily, from the token that begins it on ([`LazyToolGrammar`]). It acts on the
//! decode loop only, so it works alike for plain and PML prompts.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use pml_compiler::decoding_schema::decoding_schema;
use pml_compiler::lazy_tool_grammar::LazyToolGrammar;
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
    /// Free text, or calls held to these grammars once one begins (`tool_choice: auto`).
    LazyToolCall(LazyToolGrammar),
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
        let tools = "the tools' parameter schemas are";
        let grammar = match format {
            ResponseFormat::JsonObject => {
                TopLevelGrammar::from_json_schema(json!({"type": "object"}))
            }
            ResponseFormat::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(decoding_schema(schema))
            }
            ResponseFormat::ToolCall(lark) => TopLevelGrammar::from_lark(lark.clone()),
            ResponseFormat::LazyToolCall(lazy) => {
                // Both grammars compiled now, and kept for the trigger: a schema they cannot take
                // is the request's 400, not a failure in the middle of its answer.
                let compiled = lazy
                    .grammars()
                    .map(|grammar| {
                        let lark = TopLevelGrammar::from_lark(grammar.to_owned());
                        Ok((grammar.to_owned(), self.matcher(lark, tools)?))
                    })
                    .collect::<Result<Vec<_>, JobError>>()?;
                return Ok(Constraint {
                    state: State::Waiting(Box::new(Waiting {
                        lazy: lazy.clone(),
                        compiled,
                        factory: Arc::clone(&self.factory),
                        text: String::new(),
                        pending: Vec::new(),
                        scanned: 0,
                    })),
                });
            }
        };
        let what = match format {
            ResponseFormat::ToolCall(_) => tools,
            _ => "the response_format schema is",
        };
        let matcher = self.matcher(grammar, what)?;
        Ok(Constraint {
            state: State::Active(Box::new(matcher)),
        })
    }

    fn matcher(&self, grammar: TopLevelGrammar, what: &str) -> Result<Matcher, JobError> {
        new_matcher(&self.factory, grammar)
            .map_err(|error| JobError::BadRequest(format!("{what} not usable: {error:#}")))
    }
}

/// A matcher of `grammar`, its first mask computed: some schemas the parser takes fail only there
/// (`{"$ref": "#"}` refers to itself without end).
fn new_matcher(factory: &ParserFactory, grammar: TopLevelGrammar) -> anyhow::Result<Matcher> {
    let parser = factory.create_parser(grammar)?;
    let mut matcher = Matcher::new(Ok(parser));
    matcher.compute_mask_or_eos()?;
    Ok(matcher)
}

/// One answer's grammar state.
pub struct Constraint {
    state: State,
}

enum State {
    /// Every token is held to this grammar.
    Active(Box<Matcher>),
    /// No call has begun: the answer is free, and watched for one.
    Waiting(Box<Waiting>),
    /// No call can begin any more (or one could not be held to its grammar): free to its end.
    Free,
}

/// A lazily constrained answer before its call begins.
struct Waiting {
    lazy: LazyToolGrammar,
    /// Each of `lazy`'s grammars and its matcher, not fed yet.
    compiled: Vec<(String, Matcher)>,
    factory: Arc<ParserFactory>,
    /// The answer's text so far, and the bytes of a character not yet complete.
    text: String,
    pending: Vec<u8>,
    /// How far `text` was looked through for a tag.
    scanned: usize,
}

impl Waiting {
    /// Takes `token`'s bytes; the next state when they begin a call or rule any out.
    fn accept(&mut self, token: TokenId) -> Option<State> {
        let trie = self.factory.tok_env().tok_trie();
        let bytes = trie.token(token);
        // Markup tokens (end of turn and the like) are no text.
        if bytes.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
            self.pending.extend_from_slice(bytes);
            let valid = match std::str::from_utf8(&self.pending) {
                Ok(valid) => valid.len(),
                Err(error) => error.valid_up_to(),
            };
            if let Ok(complete) = std::str::from_utf8(&self.pending[..valid]) {
                self.text.push_str(complete);
            }
            self.pending.drain(..valid);
        }
        let found = self.lazy.trigger(&self.text, self.scanned);
        self.scanned = self.text.len();
        let Some(trigger) = found else {
            let can_begin = self.lazy.has_tags() || self.lazy.may_open(&self.text);
            return (!can_begin).then_some(State::Free);
        };
        let mut call = self.text.as_bytes()[trigger.at..].to_vec();
        call.extend_from_slice(&self.pending);
        let at = self
            .compiled
            .iter()
            .position(|(grammar, _)| grammar == trigger.grammar);
        let started = match at {
            Some(at) => {
                let (_, mut matcher) = self.compiled.swap_remove(at);
                let tokens = self.factory.tok_env().tokenize_bytes(&call);
                matcher.consume_tokens(&tokens).map(|_| matcher)
            }
            None => Err(anyhow::anyhow!("the trigger's grammar was not compiled")),
        };
        Some(match started {
            Ok(matcher) => State::Active(Box::new(matcher)),
            Err(error) => {
                // The model's own text is not the call the grammar describes: left as it is,
                // the answer is read as text.
                tracing::debug!("a tool call began but does not match its grammar: {error:#}");
                State::Free
            }
        })
    }
}

impl Constraint {
    /// Sets every token the grammar does not allow next to -inf (only end-of-text once the
    /// value is complete); nothing while no grammar holds the answer.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), JobError> {
        let State::Active(matcher) = &mut self.state else {
            return Ok(());
        };
        let allowed = matcher.compute_mask_or_eos().map_err(grammar_failure)?;
        for (id, logit) in logits.iter_mut().enumerate() {
            if !allowed.is_allowed(id as TokenId) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances the grammar past the sampled `token`.
    pub fn accept(&mut self, token: u32) -> Result<(), JobError> {
        match &mut self.state {
            State::Active(matcher) => matcher.consume_token(token).map_err(grammar_failure),
            State::Waiting(waiting) => {
                if let Some(next) = waiting.accept(token) {
                    self.state = next;
                }
                Ok(())
            }
            State::Free => Ok(()),
        }
    }
}

/// The grammar library's errors carry their causes under `{:#}` (anyhow's chain).
fn grammar_failure(error: impl std::fmt::Display) -> JobError {
    JobError::Internal(Incident::report(format_args!(
        "constrained decoding: {error:#}"
    )))
}

#[cfg(test)]
mod tests {
    use pml_compiler::tool_calls::{ToolCallFormat, ToolSpec};
    use pml_engine::TokenizeError;

    use super::*;

    /// One token per ASCII byte, and token 128 the end of text.
    struct Bytes;

    const EOS: u32 = 128;

    impl Tokenizer for Bytes {
        fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
            Ok(text.bytes().map(u32::from).collect())
        }

        fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
            Ok(ids
                .iter()
                .filter(|&&id| id < EOS)
                .map(|&id| id as u8 as char)
                .collect())
        }

        fn bos_token(&self) -> Option<u32> {
            None
        }

        fn eos_tokens(&self) -> Vec<u32> {
            vec![EOS]
        }

        fn vocab_size(&self) -> usize {
            EOS as usize + 1
        }

        fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
            Some(match id {
                EOS => TokenBytes::Special("<|endoftext|>".to_string()),
                _ => TokenBytes::Text(vec![id as u8]),
            })
        }
    }

    /// Feeds `text` byte by byte, each byte masked first: `Err` with the text so far at the
    /// first byte the grammar refuses.
    fn write(constraint: &mut Constraint, text: &str) -> Result<(), String> {
        for (at, byte) in text.bytes().enumerate() {
            let mut logits = vec![0.0; EOS as usize + 1];
            constraint.mask(&mut logits).expect("a mask");
            if logits[usize::from(byte)] == f32::NEG_INFINITY {
                return Err(text[..at].to_string());
            }
            constraint.accept(u32::from(byte)).expect("accepted");
        }
        Ok(())
    }

    fn allows(constraint: &mut Constraint, byte: u8) -> bool {
        let mut logits = vec![0.0; EOS as usize + 1];
        constraint.mask(&mut logits).expect("a mask");
        logits[usize::from(byte)] != f32::NEG_INFINITY
    }

    fn lazy_weather() -> ResponseFormat {
        let weather = ToolSpec {
            name: "get_weather".to_string(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}),
        };
        ResponseFormat::LazyToolCall(LazyToolGrammar::new(
            ToolCallFormat::Hermes,
            &[weather],
            false,
        ))
    }

    #[test]
    fn an_auto_call_is_free_until_it_begins_and_held_to_its_schema_after() {
        let grammars = Grammars::new(&Bytes).expect("grammars");
        let format = lazy_weather();
        // Text that begins no call is never masked, code fences included.
        let mut text = grammars.constraint(&format).expect("a constraint");
        write(
            &mut text,
            "It is sunny. ```python\nprint(1)\n``` {\"x\": 1}",
        )
        .expect("free");
        // A fenced call object: from `"name":` on, only the offered function and its arguments.
        let mut fenced = grammars.constraint(&format).expect("a constraint");
        write(&mut fenced, "```json\n{\n  \"name\": \"").expect("the call's start");
        assert!(allows(&mut fenced, b'g') && !allows(&mut fenced, b'x'));
        write(&mut fenced, "get_weather\", \"arguments\": {\"").expect("the name");
        assert!(allows(&mut fenced, b'c') && !allows(&mut fenced, b'p'));
        write(&mut fenced, "city\": \"Paris\"}}\n```").expect("the call");
        // A tag after some text opens a tagged call, held alike.
        let mut tagged = grammars.constraint(&format).expect("a constraint");
        let refused = write(
            &mut tagged,
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"town\"",
        );
        assert_eq!(
            refused,
            Err("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"".into())
        );
    }

    /// `llm -T llm_version`: a tool without parameters takes `{}` and nothing under a key of
    /// the model's own.
    #[test]
    fn a_tool_without_parameters_takes_no_arguments() {
        let grammars = Grammars::new(&Bytes).expect("grammars");
        let version = ToolSpec {
            name: "llm_version".to_string(),
            parameters: json!({"type": "object", "properties": {}}),
        };
        let format = ResponseFormat::LazyToolCall(LazyToolGrammar::new(
            ToolCallFormat::Hermes,
            &[version],
            false,
        ));
        let mut call = grammars.constraint(&format).expect("a constraint");
        write(
            &mut call,
            "<tool_call>\n{\"name\": \"llm_version\", \"arguments\": {",
        )
        .expect("the call's start");
        assert!(!allows(&mut call, b'"'), "a key of the model's own");
        write(&mut call, "}}").expect("no arguments");
    }

    #[test]
    fn schema_numbers_stop_at_fifteen_digits_and_eight_decimals() {
        let grammars = Grammars::new(&Bytes).expect("grammars");
        let schema = json!({"type": "object", "properties": {"population": {"type": "number"},
            "rank": {"type": "integer"}}, "required": ["population", "rank"]});
        let mut number = grammars
            .constraint(&ResponseFormat::JsonSchema(schema))
            .expect("a constraint");
        write(&mut number, "{\"population\": ").expect("the key");
        write(&mut number, &"6".repeat(15)).expect("fifteen digits");
        assert!(!allows(&mut number, b'6'), "a sixteenth digit");
        assert!(!allows(&mut number, b'e'), "an exponent");
        write(&mut number, &format!(".{}", "5".repeat(8))).expect("eight decimals");
        assert!(!allows(&mut number, b'5'), "a ninth decimal");
        write(&mut number, ", \"rank\": ").expect("the next key");
        write(&mut number, &"1".repeat(15)).expect("fifteen digits");
        assert!(!allows(&mut number, b'1') && !allows(&mut number, b'.'));
        write(&mut number, "}").expect("the end");
    }
}
