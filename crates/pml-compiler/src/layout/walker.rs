//! The layout walk: one pass over a checked schema's items with a position cursor, building the
//! root unit and one unit per module (design §3, "Layout"). Text takes as many positions as it has
//! tokens, role tags their chat-template strings, a parameter exactly `len`; union members all
//! start at the union's start and the union takes its longest member; collection members follow
//! one another. Problems (scaffold too long, tokenizer failures) are collected and the walk goes
//! on, so one run reports all of them.

use super::encode::{TextKind, encode};
use super::separator::{Follow, file_needs_separator, needs_separator};
use crate::chat_template::ChatTemplate;
use crate::plan::{LayoutUnit, ParamSlot, UnitId, UnitKind};
use crate::rules::{self, diagnostic};
use crate::schema_index::{ModuleId, SchemaIndex, parse_len};
use crate::tokenizer::Tokenizer;
use pml_syntax::ast::{Collection, Module, Param, RoleBlock, SchemaItem, TextRun, Union};
use pml_syntax::{Diagnostic, Span};
use std::collections::BTreeMap;

/// What the walk reads besides the schema's items.
pub(super) struct WalkInput<'a> {
    pub source: &'a str,
    pub index: &'a SchemaIndex,
    pub tokenizer: &'a dyn Tokenizer,
    pub template: &'a ChatTemplate,
    /// Text of each `src` module's file, as the checker loaded it.
    pub sources: &'a BTreeMap<ModuleId, String>,
}

pub(super) struct Walker<'a> {
    input: WalkInput<'a>,
    /// The index's module ids in schema order: the walk meets modules in the same (pre-)order.
    module_ids: Vec<ModuleId>,
    units: Vec<LayoutUnit>,
    cursor: u32,
    diagnostics: Vec<Diagnostic>,
}

/// The units of a finished walk, and where the schema ends.
pub(super) struct Walked {
    pub units: Vec<LayoutUnit>,
    pub end_position: u32,
    pub diagnostics: Vec<Diagnostic>,
}

impl<'a> Walker<'a> {
    pub(super) fn new(input: WalkInput<'a>) -> Self {
        let module_ids = input.index.modules().map(|(id, _)| id).collect();
        let mut walker = Walker {
            input,
            module_ids,
            units: Vec::new(),
            cursor: 0,
            diagnostics: Vec::new(),
        };
        walker.units.push(LayoutUnit::root());
        if let Some(bos) = walker.input.tokenizer.bos_token() {
            walker.push(UnitId::ROOT, &[bos]);
        }
        walker
    }

    /// Lays out the schema's items and finishes the root unit.
    pub(super) fn walk(mut self, items: &[SchemaItem]) -> Walked {
        self.items(items, UnitId::ROOT, Follow::End);
        let end_position = self.cursor;
        self.units[UnitId::ROOT.index()].end = end_position;
        Walked {
            units: self.units,
            end_position,
            diagnostics: self.diagnostics,
        }
    }

    fn items(&mut self, items: &[SchemaItem], unit: UnitId, follow: Follow) {
        for (position, item) in items.iter().enumerate() {
            let next = follow_after(&items[position + 1..], follow);
            match item {
                SchemaItem::Text(run) => self.text(run, unit, next),
                SchemaItem::Module(module) => self.module(module, unit, UnitKind::Module, next),
                SchemaItem::Union(union) => self.union(union, unit, next),
                SchemaItem::Collection(collection) => self.collection(collection, unit, next),
                SchemaItem::Param(param) => self.param(param, unit),
                SchemaItem::Role(block) => self.role(block, unit, next),
            }
        }
    }

    fn text(&mut self, run: &TextRun, unit: UnitId, follow: Follow) {
        let mut text = run.text.clone();
        if needs_separator(self.input.source, run.span, follow) {
            text.push('\n');
        }
        self.push_text(unit, &text, TextKind::Plain, run.span, "text");
    }

    fn module(&mut self, module: &Module, parent: UnitId, kind: UnitKind, follow: Follow) {
        let module_number = self.units.len() - 1;
        let name = module
            .name
            .as_ref()
            .map_or_else(String::new, |name| name.text.clone());
        let Some(&module_id) = self.module_ids.get(module_number) else {
            self.mismatch(module.open_tag);
            return;
        };
        if self.input.index.module(module_id).name_text() != name {
            self.mismatch(module.open_tag);
        }
        let id = UnitId(u32::try_from(self.units.len()).unwrap_or(u32::MAX));
        let unit = LayoutUnit::child(&self.units[parent.index()], id, name, kind, self.cursor);
        self.units.push(unit);
        match &module.src {
            Some(src) => self.src_text(module, module_id, &src.value, id, follow),
            None => self.items(&module.items, id, follow),
        }
        self.units[id.index()].end = self.cursor;
    }

    /// A `src` module's text: the file verbatim, less one trailing newline (put back by the
    /// separator rule when more text follows).
    fn src_text(
        &mut self,
        module: &Module,
        module_id: ModuleId,
        path: &str,
        id: UnitId,
        follow: Follow,
    ) {
        let Some(raw) = self.input.sources.get(&module_id) else {
            self.diagnostics.push(
                diagnostic(&rules::SRC_UNREADABLE, format!("`{path}` was not loaded"))
                    .with_label(module.open_tag, "its text is missing")
                    .with_help("lay the schema out with a source loader that can read its folder"),
            );
            return;
        };
        let mut text = raw
            .strip_suffix("\r\n")
            .or_else(|| raw.strip_suffix('\n'))
            .unwrap_or(raw)
            .to_string();
        if file_needs_separator(raw, self.input.source, module.span.end, follow)
            && !text.ends_with('\n')
        {
            text.push('\n');
        }
        self.push_text(id, &text, TextKind::Plain, module.open_tag, "file");
    }

    fn union(&mut self, union: &Union, unit: UnitId, follow: Follow) {
        let start = self.cursor;
        let mut end = start;
        // Members are alternatives: what follows each of them is what follows the union.
        for item in &union.items {
            if let SchemaItem::Module(member) = item {
                self.cursor = start;
                self.module(member, unit, UnitKind::Module, follow);
                end = end.max(self.cursor);
            }
        }
        self.cursor = end;
    }

    fn collection(&mut self, collection: &Collection, unit: UnitId, follow: Follow) {
        let name = collection
            .name
            .as_ref()
            .map_or_else(String::new, |name| name.text.clone());
        let members: Vec<&Module> = collection
            .items
            .iter()
            .filter_map(|item| match item {
                SchemaItem::Module(member) => Some(member),
                _ => None,
            })
            .collect();
        for (position, member) in members.iter().enumerate() {
            let next = if position + 1 < members.len() {
                Follow::Content
            } else {
                follow
            };
            let kind = UnitKind::CollectionMember {
                collection: name.clone(),
            };
            self.module(member, unit, kind, next);
        }
    }

    fn param(&mut self, param: &Param, unit: UnitId) {
        // The checker refuses parameters without a valid `len` or outside a module.
        let Some(len) = param
            .len
            .as_ref()
            .and_then(|len| parse_len(&len.value).ok())
        else {
            return;
        };
        if unit == UnitId::ROOT {
            return;
        }
        let name = param
            .name
            .as_ref()
            .map_or_else(String::new, |name| name.text.clone());
        let mut tokens = match &param.scaffold {
            Some(scaffold) => self
                .encode(
                    &scaffold.text,
                    TextKind::Plain,
                    scaffold.span,
                    "scaffold text",
                )
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let len_tokens = len as usize;
        if tokens.len() > len_tokens {
            let span = param.scaffold.as_ref().map_or(param.span, |run| run.span);
            self.diagnostics.push(
                diagnostic(
                    &rules::SCAFFOLD_TOO_LONG,
                    format!(
                        "the scaffold text of parameter `{name}` takes {} tokens but the parameter holds {len}",
                        tokens.len()
                    ),
                )
                .with_label(span, format!("{} tokens, {} too many", tokens.len(), tokens.len() - len_tokens))
                .with_help(format!(
                    "shorten the scaffold text to at most {len} tokens, or raise `len` of `{name}` to {}",
                    tokens.len()
                )),
            );
            tokens.truncate(len_tokens);
        }
        tokens.resize(len_tokens, self.input.tokenizer.placeholder_token());
        let slot = ParamSlot {
            name,
            start: self.cursor,
            len,
            token_offset: self.units[unit.index()].tokens.len(),
        };
        self.units[unit.index()].params.push(slot);
        self.push(unit, &tokens);
    }

    fn role(&mut self, block: &RoleBlock<SchemaItem>, unit: UnitId, follow: Follow) {
        let markers = self.input.template.markers(block.role);
        let (open, close) = (markers.open.clone(), markers.close.clone());
        self.push_text(
            unit,
            &open,
            TextKind::Template,
            block.open_tag,
            "role string",
        );
        let inner = match block.close_tag {
            Some(_) => Follow::RoleClose,
            // A role left open continues in the prompt: its text follows the schema's end.
            None if follow == Follow::End => Follow::Content,
            None => follow,
        };
        self.items(&block.items, unit, inner);
        if let Some(close_tag) = block.close_tag {
            self.push_text(unit, &close, TextKind::Template, close_tag, "role string");
        }
    }

    fn push_text(&mut self, unit: UnitId, text: &str, kind: TextKind, span: Span, what: &str) {
        if let Some(tokens) = self.encode(text, kind, span, what) {
            self.push(unit, &tokens);
        }
    }

    fn encode(&mut self, text: &str, kind: TextKind, span: Span, what: &str) -> Option<Vec<u32>> {
        match encode(self.input.tokenizer, text, kind, span, what) {
            Ok(tokens) => Some(tokens),
            Err(diagnostic) => {
                self.diagnostics.push(diagnostic);
                None
            }
        }
    }

    /// Appends `tokens` to `unit` at the cursor. The cursor saturates instead of wrapping; a
    /// schema that long fails the context-length check.
    fn push(&mut self, unit: UnitId, tokens: &[u32]) {
        let target = &mut self.units[unit.index()];
        for &token in tokens {
            target.tokens.push(token);
            target.positions.push(self.cursor);
            self.cursor = self.cursor.saturating_add(1);
        }
    }

    fn mismatch(&mut self, span: Span) {
        self.diagnostics.push(
            diagnostic(
                &rules::LAYOUT_MISMATCH,
                "the schema index given for the layout was built from another schema",
            )
            .with_label(span, "this module is not the index's module at this place")
            .with_help(
                "build the index from the same schema (`SchemaIndex::build` or `check_schema`)",
            ),
        );
    }
}

/// What follows an item given the items after it in its list and what follows the list.
fn follow_after(rest: &[SchemaItem], follow: Follow) -> Follow {
    if rest.is_empty() {
        follow
    } else {
        // The tree builder drops empty runs, so every remaining item is content.
        Follow::Content
    }
}
