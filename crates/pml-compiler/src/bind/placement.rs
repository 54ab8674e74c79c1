//! Where a prompt's new tokens go (design §3, "Cached inference"): a cursor walks the prompt.
//! Text before the first import starts right after the last cached position below that import;
//! text after an import starts at the end of the import's extent, and text after the last import
//! at the end of the schema; consecutive pieces advance the cursor. Role blocks emit their
//! chat-template strings around their content, a close tag for a role the schema left open emits
//! the close string, and the generation prompt comes last when asked for. Arguments are emitted
//! with their import, at their parameter's positions.

use super::selection::{PlacedImport, Selection};
use crate::chat_template::ChatTemplate;
use crate::layout::{Follow, TextKind, encode, needs_separator};
use crate::plan::NewTokenKind;
use crate::tokenizer::Tokenizer;
use pml_syntax::ast::{PromptItem, Role, TextRun};
use pml_syntax::{Diagnostic, Span};

/// The new tokens of a bound prompt, parallel vectors.
#[derive(Default)]
pub(super) struct NewTokens {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub kinds: Vec<NewTokenKind>,
}

pub(super) struct Placer<'a> {
    pub source: &'a str,
    pub tokenizer: &'a dyn Tokenizer,
    pub template: &'a ChatTemplate,
    pub selection: &'a Selection,
    /// Where the schema ends: text after the last import goes there.
    pub end_position: u32,
}

struct PlacementState<'a> {
    imports: std::slice::Iter<'a, PlacedImport>,
    /// Where text after the last import starts: the end of the schema, or of a collection whose
    /// packed members ran past it.
    after_last_import: u32,
    cursor: u32,
    out: NewTokens,
    diagnostics: Vec<Diagnostic>,
}

impl Placer<'_> {
    /// The new tokens of a prompt whose top level is `items`; `prompt_span` labels a failure to
    /// tokenize the generation prompt.
    pub fn place(
        &self,
        items: &[PromptItem],
        prompt_span: Span,
        add_generation_prompt: bool,
    ) -> Result<NewTokens, Vec<Diagnostic>> {
        let imports = &self.selection.imports;
        let cursor = match imports.first() {
            Some(first) => self
                .selection
                .last_cached_below(first.start)
                .map_or(0, |last| last.saturating_add(1)),
            None => self.end_position,
        };
        let after_last_import = imports
            .iter()
            .map(|import| import.end)
            .fold(self.end_position, u32::max);
        let mut state = PlacementState {
            imports: imports.iter(),
            after_last_import,
            cursor,
            out: NewTokens::default(),
            diagnostics: Vec::new(),
        };
        self.items(items, Follow::End, &mut state);
        if add_generation_prompt {
            self.push_text(
                &self.template.generation_prompt,
                TextKind::Template,
                NewTokenKind::GenerationPrompt,
                prompt_span,
                &mut state,
            );
        }
        if state.diagnostics.is_empty() {
            Ok(state.out)
        } else {
            Err(state.diagnostics)
        }
    }

    fn items(&self, items: &[PromptItem], follow: Follow, state: &mut PlacementState) {
        for (position, item) in items.iter().enumerate() {
            let next = match items.get(position + 1) {
                None => follow,
                Some(PromptItem::RoleClose { .. }) => Follow::RoleClose,
                Some(_) => Follow::Content,
            };
            match item {
                PromptItem::Text(run) => self.text(run, next, state),
                PromptItem::Import(_) => self.import(state),
                PromptItem::Role(block) => {
                    let open_tag = block.open_tag;
                    self.marker(block.role, Marker::Open, open_tag, state);
                    self.items(&block.items, Follow::RoleClose, state);
                    let close_tag = block.close_tag.unwrap_or(block.span);
                    self.marker(block.role, Marker::Close, close_tag, state);
                }
                PromptItem::RoleClose { role, span } => {
                    self.marker(*role, Marker::Close, *span, state)
                }
            }
        }
    }

    fn text(&self, run: &TextRun, follow: Follow, state: &mut PlacementState) {
        let mut text = run.text.clone();
        if needs_separator(self.source, run.span, follow) {
            text.push('\n');
        }
        self.push_text(&text, TextKind::Plain, NewTokenKind::Text, run.span, state);
    }

    /// The next top-level import: its arguments, then the cursor moves past it.
    fn import(&self, state: &mut PlacementState) {
        let Some(placed) = state.imports.next() else {
            return;
        };
        for &(token, position) in &placed.arguments {
            state.out.tokens.push(token);
            state.out.positions.push(position);
            state.out.kinds.push(NewTokenKind::Argument);
        }
        state.cursor = if state.imports.as_slice().is_empty() {
            state.after_last_import
        } else {
            placed.end
        };
    }

    fn marker(&self, role: Role, marker: Marker, span: Span, state: &mut PlacementState) {
        let markers = self.template.markers(role);
        let text = match marker {
            Marker::Open => &markers.open,
            Marker::Close => &markers.close,
        };
        self.push_text(
            text,
            TextKind::Template,
            NewTokenKind::Template,
            span,
            state,
        );
    }

    fn push_text(
        &self,
        text: &str,
        text_kind: TextKind,
        kind: NewTokenKind,
        span: Span,
        state: &mut PlacementState,
    ) {
        let what = match kind {
            NewTokenKind::Text => "text",
            NewTokenKind::GenerationPrompt => "generation prompt",
            NewTokenKind::Template | NewTokenKind::Argument => "role string",
        };
        match encode(self.tokenizer, text, text_kind, span, what) {
            Ok(tokens) => {
                for token in tokens {
                    state.out.tokens.push(token);
                    state.out.positions.push(state.cursor);
                    state.out.kinds.push(kind);
                    state.cursor = state.cursor.saturating_add(1);
                }
            }
            Err(diagnostic) => state.diagnostics.push(diagnostic),
        }
    }
}

#[derive(Clone, Copy)]
enum Marker {
    Open,
    Close,
}
