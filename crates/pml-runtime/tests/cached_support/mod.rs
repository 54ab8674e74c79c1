//! Shared helpers of the cached-inference tests: a builder that lays units out on positions the
//! way the compiler does (so tests need not wait for it), prompt binding by hand, and tensor
//! comparisons.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]
#![allow(dead_code)]

use candle_core::{DType, Tensor};
use pml_compiler::plan::{
    BoundPrompt, CachedSpan, LayoutUnit, NewTokenKind, ParamSlot, SchemaLayout, UnitId, UnitKind,
};
use pml_engine::model::Model;
use pml_runtime::inference::{BlendOptions, InferenceMode, Pipelining, Ratio};
use pml_runtime::store::{DEFAULT_STATE_DTYPE, ManifestStore, MemoryTier, ModuleStore, StateSpec};
use tempfile::TempDir;

/// Lays out units on consecutive positions: a cursor advances over every text run; modules
/// open at the cursor; union members rewind it to the union's start.
pub struct LayoutBuilder {
    units: Vec<LayoutUnit>,
    cursor: u32,
}

impl LayoutBuilder {
    pub fn new() -> Self {
        Self {
            units: vec![LayoutUnit::root()],
            cursor: 0,
        }
    }

    pub fn cursor(&self) -> u32 {
        self.cursor
    }

    pub fn set_cursor(&mut self, cursor: u32) {
        self.cursor = cursor;
    }

    /// Opens module `name` inside `parent` (the root for a top-level module) at the cursor.
    pub fn open(&mut self, name: &str, parent: UnitId) -> UnitId {
        let id = UnitId(self.units.len() as u32);
        let unit = LayoutUnit::child(
            &self.units[parent.index()],
            id,
            name.to_string(),
            UnitKind::Module,
            self.cursor,
        );
        self.units.push(unit);
        id
    }

    /// Appends `tokens` to `unit` at the cursor.
    pub fn text(&mut self, unit: UnitId, tokens: &[u32]) -> &mut Self {
        let layout_unit = &mut self.units[unit.index()];
        for &token in tokens {
            layout_unit.tokens.push(token);
            layout_unit.positions.push(self.cursor);
            self.cursor += 1;
        }
        self
    }

    /// Reserves `len` placeholder positions for parameter `name` of `unit`.
    pub fn param(&mut self, unit: UnitId, name: &str, len: u32, placeholder: u32) -> &mut Self {
        let start = self.cursor;
        let token_offset = self.units[unit.index()].tokens.len();
        self.text(unit, &vec![placeholder; len as usize]);
        self.units[unit.index()].params.push(ParamSlot {
            name: name.to_string(),
            start,
            len,
            token_offset,
        });
        self
    }

    /// Closes `unit` at the cursor.
    pub fn close(&mut self, unit: UnitId) {
        self.units[unit.index()].end = self.cursor;
    }

    pub fn build(mut self, schema_name: &str) -> SchemaLayout {
        self.units[0].end = self.cursor;
        SchemaLayout {
            schema_name: schema_name.to_string(),
            units: self.units,
            end_position: self.cursor,
        }
    }
}

/// A prompt bound by hand: `imports` are spliced whole (the root is always spliced), an argument
/// fills the first positions of its parameter (all the parameter's placeholder rows are dropped),
/// and `tail` follows the end of the schema.
pub struct Binding<'a> {
    pub layout: &'a SchemaLayout,
    pub imports: Vec<UnitId>,
    pub arguments: Vec<(UnitId, &'a str, Vec<u32>)>,
    pub placed: Vec<(UnitId, u32)>,
    pub tail: Vec<u32>,
    /// Where the tail starts; after the schema (and any placed unit) when `None`.
    pub tail_start: Option<u32>,
}

impl<'a> Binding<'a> {
    pub fn new(layout: &'a SchemaLayout, imports: &[UnitId], tail: &[u32]) -> Self {
        Self {
            layout,
            imports: imports.to_vec(),
            arguments: Vec::new(),
            placed: Vec::new(),
            tail: tail.to_vec(),
            tail_start: None,
        }
    }

    pub fn bind(&self) -> BoundPrompt {
        let mut cached = Vec::new();
        let mut new_tokens = Vec::new();
        let mut new_positions = Vec::new();
        let mut new_kinds = Vec::new();
        let units = std::iter::once(UnitId::ROOT).chain(self.imports.iter().copied());
        for unit_id in units {
            let unit = &self.layout.units[unit_id.index()];
            let mut dropped = vec![false; unit.tokens.len()];
            for (argument_unit, name, tokens) in &self.arguments {
                if *argument_unit != unit_id {
                    continue;
                }
                let slot = unit
                    .params
                    .iter()
                    .find(|slot| slot.name == *name)
                    .expect("the parameter exists");
                assert!(tokens.len() <= slot.len as usize, "argument fits");
                dropped[slot.token_offset..slot.token_offset + slot.len as usize].fill(true);
                for (offset, &token) in tokens.iter().enumerate() {
                    new_tokens.push(token);
                    new_positions.push(slot.start + offset as u32);
                    new_kinds.push(NewTokenKind::Argument);
                }
            }
            let placed_at = self
                .placed
                .iter()
                .find(|(placed_unit, _)| *placed_unit == unit_id)
                .map(|&(_, position)| position);
            cached.push(CachedSpan {
                unit: unit_id,
                rows: (0..unit.tokens.len())
                    .filter(|&row| !dropped[row])
                    .collect(),
                placed_at,
            });
        }
        cached.sort_by_key(|span| {
            let unit = &self.layout.units[span.unit.index()];
            span.placed_at.unwrap_or(unit.start)
        });
        let after_schema = self
            .placed
            .iter()
            .map(|&(unit, position)| {
                let unit = &self.layout.units[unit.index()];
                position + (unit.end - unit.start)
            })
            .chain([self.layout.end_position])
            .max()
            .unwrap_or(self.layout.end_position);
        let tail_start = self.tail_start.unwrap_or(after_schema);
        for (offset, &token) in self.tail.iter().enumerate() {
            new_tokens.push(token);
            new_positions.push(tail_start + offset as u32);
            new_kinds.push(NewTokenKind::Text);
        }
        BoundPrompt {
            schema_name: self.layout.schema_name.clone(),
            cached,
            new_tokens,
            new_positions,
            new_kinds,
        }
    }
}

pub use pml_engine::testing::max_abs_diff;

/// Blend recomputing every cached token (no shortcut): `full` of the rows it splices, up to
/// summation order; cached layers streamed as `pipelining` says.
pub fn blend_everything(pipelining: Pipelining) -> InferenceMode {
    InferenceMode::Blend(BlendOptions {
        recompute: Ratio::new(1.0).expect("a fraction"),
        shortcuts: false,
        pipelining,
        ..BlendOptions::default()
    })
}

pub fn max_abs(a: &Tensor) -> f32 {
    a.to_dtype(candle_core::DType::F32)
        .and_then(|a| a.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("max computes")
}

/// `a` equals `b` within `relative` of `b`'s largest magnitude (at least 1).
pub fn assert_close(a: &Tensor, b: &Tensor, relative: f32, what: &str) {
    let diff = max_abs_diff(a, b);
    let scale = max_abs(b).max(1.0);
    // Printed (with --nocapture) so the tolerances in the tests can be checked against what
    // the cases really need.
    eprintln!("{what}: relative deviation {:.3e}", diff / scale);
    assert!(
        diff <= relative * scale,
        "{what}: max abs diff {diff} > {relative} x {scale}"
    );
}

/// A RAM-only store for `model` keeping states in the default dtype (f16), with manifests in a
/// temporary directory.
pub fn ram_store(model: &Model, fingerprint: &str) -> (ModuleStore, TempDir) {
    ram_store_in(model, fingerprint, DEFAULT_STATE_DTYPE)
}

/// [`ram_store`] keeping states in `state_dtype`.
pub fn ram_store_in(
    model: &Model,
    fingerprint: &str,
    state_dtype: DType,
) -> (ModuleStore, TempDir) {
    let manifests = TempDir::new().expect("temporary directory");
    let spec = StateSpec::new(fingerprint, model.kv_layout()).with_state_dtype(state_dtype);
    let store = ModuleStore::with_tiers(
        spec,
        vec![Box::new(MemoryTier::new(1 << 30))],
        ManifestStore::new(manifests.path()),
    );
    (store, manifests)
}

/// `n` token ids starting from `first`, spread over a small vocabulary (ids 2..252).
pub fn spread_tokens(first: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 2 + (first + i * 37) % 250).collect()
}

/// A prefix (after `bos`), two members `a` and `b` of a collection, and a prompt that imports
/// `b` before `a` (both moved) and asks with new text after them.
pub fn reordered_members(bos: u32) -> (SchemaLayout, BoundPrompt) {
    let mut builder = LayoutBuilder::new();
    let mut prefix = vec![bos];
    prefix.extend(spread_tokens(3, 6));
    builder.text(UnitId::ROOT, &prefix);
    let a = builder.open("a", UnitId::ROOT);
    builder.text(a, &spread_tokens(40, 11));
    builder.close(a);
    let b = builder.open("b", UnitId::ROOT);
    builder.text(b, &spread_tokens(90, 9));
    builder.close(b);
    let layout = builder.build("docs");
    let start = layout.units[a.index()].start;
    let mut binding = Binding::new(&layout, &[b, a], &spread_tokens(150, 5));
    binding.placed.push((b, start));
    binding.placed.push((a, start + 9));
    let bound = binding.bind();
    (layout, bound)
}
