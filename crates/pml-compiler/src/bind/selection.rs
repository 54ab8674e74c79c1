//! Which cached units a prompt uses and where: the root, every imported module (through nested
//! selections), and the `default` member of each union whose parent is present but none of whose
//! members is selected (recursively inside the default). Rows of parameter slots that receive an
//! argument are left out, and the argument's tokens take the slot's first positions. Collection
//! members are packed one after another from the collection's start, in prompt order, repeats
//! allowed; a packed copy may run past the collection's reserved extent.

use super::Shift;
use crate::layout::{TextKind, encode, unit_of};
use crate::plan::{CachedSpan, LayoutUnit, SchemaLayout, UnitId};
use crate::rules::{self, diagnostic};
use crate::schema_index::{CollectionId, ModuleId, SchemaIndex, Scope};
use crate::tokenizer::Tokenizer;
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Import, PromptItem};
use std::collections::{HashMap, HashSet};

/// A top-level import placed in this prompt.
pub(super) struct PlacedImport {
    /// Its extent, nested modules included, at the positions it has in this prompt.
    pub start: u32,
    pub end: u32,
    /// Argument tokens of this import and of the imports nested in it, with their positions.
    pub arguments: Vec<(u32, u32)>,
}

/// The cached part of a bound prompt.
pub(super) struct Selection {
    /// In position order (by the first row used).
    pub cached: Vec<CachedSpan>,
    /// The prompt's top-level imports, in prompt order.
    pub imports: Vec<PlacedImport>,
    /// Positions of every cached row used, ascending.
    pub cached_positions: Vec<u32>,
}

impl Selection {
    /// The highest cached position below `position`.
    pub fn last_cached_below(&self, position: u32) -> Option<u32> {
        let below = self.cached_positions.partition_point(|&p| p < position);
        below.checked_sub(1).map(|last| self.cached_positions[last])
    }
}

pub(super) struct Selector<'a> {
    pub index: &'a SchemaIndex,
    pub layout: &'a SchemaLayout,
    pub tokenizer: &'a dyn Tokenizer,
}

/// A unit used by the prompt, before it becomes a [`CachedSpan`].
struct Included {
    unit: UnitId,
    rows: Vec<usize>,
    shift: Shift,
}

struct SelectionState {
    included: Vec<Included>,
    imports: Vec<PlacedImport>,
    /// Where the next copy of a member of each collection goes.
    collection_cursors: HashMap<CollectionId, u32>,
    diagnostics: Vec<Diagnostic>,
}

impl Selector<'_> {
    pub fn select(&self, items: &[PromptItem]) -> Result<Selection, Vec<Diagnostic>> {
        let mut state = SelectionState {
            included: vec![Included {
                unit: UnitId::ROOT,
                rows: (0..self.layout.units[UnitId::ROOT.index()].tokens.len()).collect(),
                shift: Shift::NONE,
            }],
            imports: Vec::new(),
            collection_cursors: HashMap::new(),
            diagnostics: Vec::new(),
        };
        let mut selected = HashSet::new();
        self.top_level(items, &mut state, &mut selected);
        self.defaults(Scope::Root, &selected, Shift::NONE, &mut state);
        if !state.diagnostics.is_empty() {
            return Err(state.diagnostics);
        }
        Ok(self.finish(state))
    }

    /// The prompt's top level: role blocks are transparent for imports.
    fn top_level(
        &self,
        items: &[PromptItem],
        state: &mut SelectionState,
        selected: &mut HashSet<ModuleId>,
    ) {
        for item in items {
            match item {
                PromptItem::Import(import) => {
                    let mut arguments = Vec::new();
                    let placed =
                        self.import(import, Scope::Root, Shift::NONE, &mut arguments, state);
                    let (start, end) = match placed {
                        Some((id, start, end)) => {
                            selected.insert(id);
                            (start, end)
                        }
                        None => (0, 0),
                    };
                    state.imports.push(PlacedImport {
                        start,
                        end,
                        arguments,
                    });
                }
                PromptItem::Role(block) => self.top_level(&block.items, state, selected),
                PromptItem::Text(_) | PromptItem::RoleClose { .. } => {}
            }
        }
    }

    /// Includes the module `import` names in `scope`, its arguments and its nested imports;
    /// returns the module and its placed extent.
    fn import(
        &self,
        import: &Import,
        scope: Scope,
        shift: Shift,
        arguments: &mut Vec<(u32, u32)>,
        state: &mut SelectionState,
    ) -> Option<(ModuleId, u32, u32)> {
        let Some(id) = self.index.lookup(scope, &import.name.text) else {
            state.diagnostics.push(
                diagnostic(
                    &rules::UNKNOWN_MODULE,
                    format!("no module `{}` here", import.name.text),
                )
                .with_label(import.name.span, "unknown here")
                .with_help("check the prompt with `pmlc check` first"),
            );
            return None;
        };
        let unit = self.unit(id);
        let shift = match self.index.module(id).collection {
            Some(collection) => self.pack(collection, unit, shift, state),
            None => shift,
        };
        let mut dropped = HashSet::new();
        for argument in &import.arguments {
            let Some(slot) = unit
                .params
                .iter()
                .find(|slot| slot.name == argument.name.text)
            else {
                state.diagnostics.push(
                    diagnostic(
                        &rules::UNKNOWN_ARGUMENT,
                        format!("`{}` has no parameter `{}`", unit.name, argument.name.text),
                    )
                    .with_label(argument.name.span, "unknown argument")
                    .with_help("check the prompt with `pmlc check` first"),
                );
                continue;
            };
            let what = format!("argument `{}`", slot.name);
            let tokens = match encode(
                self.tokenizer,
                &argument.value,
                TextKind::Plain,
                argument.value_span,
                &what,
            ) {
                Ok(tokens) => tokens,
                Err(error) => {
                    state.diagnostics.push(error);
                    continue;
                }
            };
            if tokens.len() > slot.len as usize {
                state.diagnostics.push(
                    diagnostic(
                        &rules::ARGUMENT_TOO_LONG,
                        format!(
                            "argument `{}` takes {} tokens but the parameter holds {}",
                            slot.name,
                            tokens.len(),
                            slot.len
                        ),
                    )
                    .with_label(argument.value_span, format!("{} tokens", tokens.len()))
                    .with_help(format!("shorten it to at most {} tokens", slot.len)),
                );
                continue;
            }
            dropped.extend(slot.token_offset..slot.token_offset + slot.len as usize);
            arguments.extend(
                tokens
                    .iter()
                    .zip(slot.start..)
                    .map(|(&token, position)| (token, shift.apply(position))),
            );
        }
        state.included.push(Included {
            unit: unit.id,
            rows: (0..unit.tokens.len())
                .filter(|row| !dropped.contains(row))
                .collect(),
            shift,
        });
        let mut selected = HashSet::new();
        for item in &import.items {
            // The checker allows only nested imports inside an import.
            if let PromptItem::Import(child) = item
                && let Some((child_id, _, _)) =
                    self.import(child, Scope::Module(id), shift, arguments, state)
            {
                selected.insert(child_id);
            }
        }
        self.defaults(Scope::Module(id), &selected, shift, state);
        Some((id, shift.apply(unit.start), shift.apply(unit.end)))
    }

    /// The shift that places the next copy of a member of `collection` (laid out as `unit`).
    fn pack(
        &self,
        collection: CollectionId,
        unit: &LayoutUnit,
        outer: Shift,
        state: &mut SelectionState,
    ) -> Shift {
        let collection_start = self
            .index
            .collection(collection)
            .members
            .first()
            .map_or(unit.start, |&first| self.unit(first).start);
        let copy_start = *state
            .collection_cursors
            .entry(collection)
            .or_insert_with(|| outer.apply(collection_start));
        state
            .collection_cursors
            .insert(collection, copy_start.saturating_add(unit.end - unit.start));
        Shift {
            delta: i64::from(copy_start) - i64::from(unit.start),
            moved: true,
        }
    }

    /// Includes the default member of each union of `scope` none of whose members is selected.
    fn defaults(
        &self,
        scope: Scope,
        selected: &HashSet<ModuleId>,
        shift: Shift,
        state: &mut SelectionState,
    ) {
        for (_, union) in self.index.unions() {
            if union.scope != scope || union.members.iter().any(|m| selected.contains(m)) {
                continue;
            }
            if let Some(default) = union.default_member(self.index) {
                let unit = self.unit(default);
                state.included.push(Included {
                    unit: unit.id,
                    rows: (0..unit.tokens.len()).collect(),
                    shift,
                });
                self.defaults(Scope::Module(default), &HashSet::new(), shift, state);
            }
        }
    }

    fn unit(&self, module: ModuleId) -> &LayoutUnit {
        // `bind_prompt` checked that the layout has a unit for every module of the index.
        &self.layout.units[unit_of(module).index()]
    }

    fn finish(&self, state: SelectionState) -> Selection {
        let mut spans: Vec<(u32, CachedSpan)> = Vec::new();
        let mut cached_positions = Vec::new();
        for included in state.included {
            let unit = &self.layout.units[included.unit.index()];
            let Some(&first_row) = included.rows.first() else {
                continue;
            };
            cached_positions.extend(
                included
                    .rows
                    .iter()
                    .map(|&row| included.shift.apply(unit.positions[row])),
            );
            let placed_at = included
                .shift
                .moved
                .then(|| unit.positions.first().map(|&p| included.shift.apply(p)))
                .flatten();
            spans.push((
                included.shift.apply(unit.positions[first_row]),
                CachedSpan {
                    unit: included.unit,
                    rows: included.rows,
                    placed_at,
                },
            ));
        }
        spans.sort_by_key(|(first, _)| *first);
        cached_positions.sort_unstable();
        Selection {
            cached: spans.into_iter().map(|(_, span)| span).collect(),
            imports: state.imports,
            cached_positions,
        }
    }
}
