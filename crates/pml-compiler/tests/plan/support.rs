//! Shared helpers of the layout and binding tests: a small deterministic tokenizer, the real chat
//! templates, parsing helpers and readable renderings of layouts and bound prompts for snapshots.

use pml_compiler::chat_template::{ChatTemplate, TemplateTokens};
use pml_compiler::plan::{BoundPrompt, NewTokenKind, SchemaLayout, UnitKind};
use pml_compiler::{
    MemorySourceLoader, SchemaIndex, SourceLoader, TokenizeError, Tokenizer, bind_prompt,
    layout_schema,
};
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Prompt, Schema, SourceFile};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Control-token spellings, single tokens when `allow_special` is set; `<pad>` is the placeholder.
const SPECIALS: &[&str] = &[
    "<pad>",
    "<bos>",
    "<eos>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<end_of_turn>",
];

/// One token per word (a run of letters and digits), per whitespace character and per other
/// character; control strings are single tokens only when allowed. The vocabulary grows as
/// pieces are first seen, so ids are deterministic for a given sequence of calls.
pub struct PieceTokenizer {
    bos: bool,
    vocab: Mutex<Vocab>,
}

#[derive(Default)]
struct Vocab {
    ids: HashMap<String, u32>,
    pieces: Vec<String>,
}

impl PieceTokenizer {
    /// Without BOS, like Qwen2.5.
    pub fn new() -> Self {
        Self::build(false)
    }

    /// With `<bos>` first in every sequence, like Gemma-3.
    pub fn with_bos() -> Self {
        Self::build(true)
    }

    fn build(bos: bool) -> Self {
        let tokenizer = PieceTokenizer {
            bos,
            vocab: Mutex::new(Vocab::default()),
        };
        for special in SPECIALS {
            tokenizer.id(special);
        }
        tokenizer
    }

    fn id(&self, piece: &str) -> u32 {
        let mut vocab = self
            .vocab
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(&id) = vocab.ids.get(piece) {
            return id;
        }
        let id = vocab.pieces.len() as u32;
        vocab.pieces.push(piece.to_string());
        vocab.ids.insert(piece.to_string(), id);
        id
    }

    /// The pieces `text` splits into.
    pub fn pieces(text: &str, allow_special: bool) -> Vec<String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while let Some(first) = rest.chars().next() {
            let special = SPECIALS
                .iter()
                .find(|special| allow_special && rest.starts_with(**special));
            let len = match special {
                Some(special) => special.len(),
                None if first.is_alphanumeric() => rest
                    .find(|c: char| !c.is_alphanumeric())
                    .unwrap_or(rest.len()),
                None => first.len_utf8(),
            };
            pieces.push(rest[..len].to_string());
            rest = &rest[len..];
        }
        pieces
    }
}

impl Tokenizer for PieceTokenizer {
    fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok(Self::pieces(text, allow_special)
            .iter()
            .map(|piece| self.id(piece))
            .collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        let vocab = self
            .vocab
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        ids.iter()
            .map(|&id| {
                vocab
                    .pieces
                    .get(id as usize)
                    .map(String::as_str)
                    .ok_or_else(|| TokenizeError(format!("unknown id {id}")))
            })
            .collect()
    }

    fn bos_token(&self) -> Option<u32> {
        self.bos.then(|| self.id("<bos>"))
    }

    fn eos_tokens(&self) -> Vec<u32> {
        vec![self.id("<eos>")]
    }

    fn placeholder_token(&self) -> u32 {
        self.id("<pad>")
    }

    fn vocab_size(&self) -> usize {
        self.vocab
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .pieces
            .len()
    }
}

/// Qwen2.5's ChatML template (from the model's GGUF), as the runtime derives it.
pub fn chatml() -> ChatTemplate {
    let source = include_str!("../data/chat_templates/qwen2.5-coder-0.5b-instruct.jinja");
    let tokens = TemplateTokens {
        bos_token: "<|endoftext|>".to_owned(),
        eos_token: "<|im_end|>".to_owned(),
    };
    ChatTemplate::from_template(source, &tokens).expect("Qwen template analyses")
}

/// Gemma-3's built-in template (a copy of the engine's, checked by the runtime's
/// `chat_template_models` test): no system turn, so `<system>` becomes a user turn.
pub fn gemma() -> ChatTemplate {
    let source = include_str!("../data/chat_templates/gemma3.jinja");
    let tokens = TemplateTokens {
        bos_token: "<bos>".to_owned(),
        eos_token: "<eos>".to_owned(),
    };
    ChatTemplate::from_template(source, &tokens).expect("Gemma template analyses")
}

pub fn parse_schema(source: &str) -> Schema {
    let parse = pml_syntax::parse(source);
    let errors: Vec<&Diagnostic> = parse.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert!(
        errors.is_empty(),
        "syntax errors in test schema: {errors:#?}"
    );
    match parse.file {
        SourceFile::Schema(schema) => schema,
        other => panic!("not a schema: {other:?}"),
    }
}

pub fn parse_prompt(source: &str) -> Prompt {
    let parse = pml_syntax::parse(source);
    let errors: Vec<&Diagnostic> = parse.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert!(
        errors.is_empty(),
        "syntax errors in test prompt: {errors:#?}"
    );
    match parse.file {
        SourceFile::Prompt(prompt) => prompt,
        other => panic!("not a prompt: {other:?}"),
    }
}

/// A schema, parsed and indexed, with its source.
pub struct Compiled {
    pub source: String,
    pub schema: Schema,
    pub index: SchemaIndex,
}

impl Compiled {
    pub fn new(source: &str) -> Self {
        let schema = parse_schema(source);
        let index = SchemaIndex::build(&schema);
        Compiled {
            source: source.to_string(),
            schema,
            index,
        }
    }

    pub fn try_layout_with(
        &self,
        tokenizer: &dyn Tokenizer,
        template: &ChatTemplate,
        loader: &dyn SourceLoader,
        max_positions: u32,
    ) -> Result<SchemaLayout, Vec<Diagnostic>> {
        layout_schema(
            &self.schema,
            &self.index,
            &self.source,
            tokenizer,
            template,
            loader,
            max_positions,
        )
    }

    pub fn layout(&self, tokenizer: &dyn Tokenizer, template: &ChatTemplate) -> SchemaLayout {
        self.try_layout_with(tokenizer, template, &MemorySourceLoader::new(), 32_768)
            .unwrap_or_else(|diagnostics| panic!("layout fails: {diagnostics:#?}"))
    }

    pub fn try_bind(
        &self,
        layout: &SchemaLayout,
        prompt_source: &str,
        tokenizer: &dyn Tokenizer,
        template: &ChatTemplate,
        add_generation_prompt: bool,
    ) -> Result<BoundPrompt, Vec<Diagnostic>> {
        let prompt = parse_prompt(prompt_source);
        bind_prompt(
            &prompt,
            &self.index,
            layout,
            prompt_source,
            tokenizer,
            template,
            add_generation_prompt,
        )
    }

    pub fn bind(
        &self,
        layout: &SchemaLayout,
        prompt_source: &str,
        tokenizer: &dyn Tokenizer,
        template: &ChatTemplate,
    ) -> BoundPrompt {
        self.try_bind(layout, prompt_source, tokenizer, template, true)
            .unwrap_or_else(|diagnostics| panic!("binding fails: {diagnostics:#?}"))
    }
}

pub fn codes(diagnostics: &[Diagnostic]) -> Vec<&'static str> {
    diagnostics
        .iter()
        .map(|diagnostic| diagnostic.code)
        .collect()
}

fn decoded(tokenizer: &dyn Tokenizer, tokens: &[u32]) -> String {
    format!(
        "{:?}",
        tokenizer.decode(tokens).expect("test tokens decode")
    )
}

/// `start..end` of consecutive numbers, `a..b, c..d` for several runs.
pub fn ranges(values: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &value in values {
        match runs.last_mut() {
            Some((_, end)) if *end == value => *end += 1,
            _ => runs.push((value, value + 1)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|(start, end)| format!("{start}..{end}"))
        .collect();
    parts.join(", ")
}

/// A layout as a table: one block per unit with its extent and scaffold, then its tokens in runs
/// of consecutive positions (parameter slots on lines of their own), decoded.
pub fn render_layout(layout: &SchemaLayout, tokenizer: &dyn Tokenizer) -> String {
    let mut out = format!(
        "schema {}: end_position {}\n",
        layout.schema_name, layout.end_position
    );
    for unit in &layout.units {
        let kind = match &unit.kind {
            UnitKind::Root => "root".to_string(),
            UnitKind::Module => "module".to_string(),
            UnitKind::CollectionMember { collection } => format!("member of {collection}"),
        };
        let path = if unit.path.is_empty() {
            "(root)".to_string()
        } else {
            unit.path.join("/")
        };
        let scaffold: Vec<String> = unit
            .scaffold
            .iter()
            .map(|id| format!("#{}", id.0))
            .collect();
        let _ = writeln!(
            out,
            "#{} {path} [{kind}] {}..{} scaffold [{}]",
            unit.id.0,
            unit.start,
            unit.end,
            scaffold.join(" ")
        );
        let mut row = 0;
        while row < unit.tokens.len() {
            let slot = unit.params.iter().find(|slot| slot.token_offset == row);
            let mut end = row + 1;
            match slot {
                Some(slot) => end = row + slot.len as usize,
                None => {
                    while end < unit.tokens.len()
                        && unit.positions[end] == unit.positions[end - 1] + 1
                        && !unit.params.iter().any(|slot| slot.token_offset == end)
                    {
                        end += 1;
                    }
                }
            }
            let label = match slot {
                Some(slot) => format!(
                    "param {} (len {}, rows {}..{})",
                    slot.name,
                    slot.len,
                    slot.token_offset,
                    slot.token_offset + slot.len as usize
                ),
                None => "text".to_string(),
            };
            let _ = writeln!(
                out,
                "    {}..{} {label}: {}",
                unit.positions[row],
                unit.positions[end - 1] + 1,
                decoded(tokenizer, &unit.tokens[row..end])
            );
            row = end;
        }
    }
    out
}

/// A bound prompt: its cached spans, then everything the model sees in position order, in runs
/// of consecutive positions from one source.
pub fn render_bound(
    bound: &BoundPrompt,
    layout: &SchemaLayout,
    tokenizer: &dyn Tokenizer,
) -> String {
    let mut out = format!("prompt for schema {}\ncached spans:\n", bound.schema_name);
    let mut sequence: Vec<(u32, String, u32)> = Vec::new();
    for span in &bound.cached {
        let unit = &layout.units[span.unit.index()];
        let path = if unit.path.is_empty() {
            "(root)".to_string()
        } else {
            unit.path.join("/")
        };
        let placed = span
            .placed_at
            .map_or_else(String::new, |at| format!(" placed_at {at}"));
        let _ = writeln!(
            out,
            "    #{} {path} rows {}{placed}",
            unit.id.0,
            ranges(&span.rows)
        );
        let delta = span
            .placed_at
            .map_or(0, |at| i64::from(at) - i64::from(unit.positions[0]));
        for &row in &span.rows {
            let position = u32::try_from(i64::from(unit.positions[row]) + delta).expect("placed");
            sequence.push((position, format!("cached #{}", unit.id.0), unit.tokens[row]));
        }
    }
    for ((&token, &position), kind) in bound
        .new_tokens
        .iter()
        .zip(&bound.new_positions)
        .zip(&bound.new_kinds)
    {
        let kind = match kind {
            NewTokenKind::Argument => "new argument",
            NewTokenKind::Text => "new text",
            NewTokenKind::Template => "new template",
            NewTokenKind::GenerationPrompt => "new generation prompt",
        };
        sequence.push((position, kind.to_string(), token));
    }
    sequence.sort_by_key(|(position, _, _)| *position);
    out.push_str("sequence:\n");
    let mut start = 0;
    while start < sequence.len() {
        let mut end = start + 1;
        while end < sequence.len()
            && sequence[end].1 == sequence[start].1
            && sequence[end].0 == sequence[end - 1].0 + 1
        {
            end += 1;
        }
        let tokens: Vec<u32> = sequence[start..end].iter().map(|entry| entry.2).collect();
        let _ = writeln!(
            out,
            "    {}..{} {}: {}",
            sequence[start].0,
            sequence[end - 1].0 + 1,
            sequence[start].1,
            decoded(tokenizer, &tokens)
        );
        start = end;
    }
    out
}
