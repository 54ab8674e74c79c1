//! Reuse of an edited module's cached state (`inference::edit`) on the tiny random models of
//! every family, f32 states: the original module is encoded, then a prompt of the edited module
//! (one token replaced by two, so every row after the edit moves by one) runs bound to the
//! original layout. Reusing the rows before the change alone is exact; `blend` recomputing
//! every cached token is `full`; splicing the moved rows without recompute deviates (those rows
//! attended to the old token).
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod cached_support;

use candle_core::{DType, Device};
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout, UnitId};
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::encode::{EncodeOptions, UnitEncoder, encode_schema};
use pml_runtime::inference::edit::rebind_edited;
use pml_runtime::inference::previous_layout::previous_layout;
use pml_runtime::inference::{InferenceMode, Pipelining, Prefill, SplicePlan, prefill};
use pml_runtime::store::ModuleStore;

use cached_support::{
    Binding, LayoutBuilder, assert_close, blend_everything, max_abs_diff, ram_store_in,
};

const SEED: u64 = 11;
const BOS: u32 = 1;
/// f32 states: summation-order noise only.
const TOLERANCE: f32 = 1e-4;

fn tokens(first: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 2 + (first + i * 37) % 250).collect()
}

/// Root [BOS, prefix], module `doc`, then root text after it; `doc` holds `text`.
fn layout(text: &[u32]) -> (SchemaLayout, UnitId) {
    let mut builder = LayoutBuilder::new();
    builder
        .text(UnitId::ROOT, &[BOS])
        .text(UnitId::ROOT, &tokens(3, 8));
    let doc = builder.open("doc", UnitId::ROOT);
    builder.text(doc, text);
    builder.close(doc);
    builder.text(UnitId::ROOT, &tokens(120, 3));
    (builder.build("edited"), doc)
}

fn run(
    model: &Model,
    store: &ModuleStore,
    layout: &SchemaLayout,
    bound: &BoundPrompt,
    mode: InferenceMode,
) -> Prefill {
    let plan = SplicePlan::new(layout, bound).expect("plan");
    let mut encoder =
        UnitEncoder::new(model, layout, EncodeMode::Scaffolded, Some(BOS), store).expect("encoder");
    prefill(model, &mut encoder, &plan, mode, 0).expect("prefill")
}

/// The original module's layout encoded (f32 states) and the edited one's: 24 tokens, the
/// eleventh replaced by two.
struct Encoded {
    model: Model,
    store: ModuleStore,
    _manifests: tempfile::TempDir,
    old: SchemaLayout,
    new: SchemaLayout,
    doc: UnitId,
}

fn encoded(arch: Arch) -> Encoded {
    let original = tokens(50, 24);
    let mut edited = original.clone();
    edited.splice(10..11, [7, 9]);
    let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("model");
    let (store, manifests) = ram_store_in(&model, "edit-test", DType::F32);
    let (old, doc) = layout(&original);
    let (new, _) = layout(&edited);
    let options = EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep: None,
    };
    encode_schema(&model, &old, options, &store, &mut |_| {}).expect("encode");
    Encoded {
        model,
        store,
        _manifests: manifests,
        old,
        new,
        doc,
    }
}

#[test]
fn an_edited_module_reuses_its_unchanged_rows() {
    for arch in Arch::ALL {
        let Encoded {
            model,
            store,
            old,
            new,
            doc,
            ..
        } = encoded(arch);
        let bound = Binding::new(&new, &[doc], &tokens(90, 5)).bind();
        let full = run(&model, &store, &new, &bound, InferenceMode::Full);

        // The rows before the change, where they were: exact.
        let prefix = rebind_edited(&old, &new, &bound, true).expect("rebind");
        let reused = run(&model, &store, &old, &prefix, InferenceMode::Reuse);
        assert_eq!(
            reused.stats.tokens_reused,
            9 + 10,
            "{arch:?}: root prefix, doc prefix"
        );
        assert_close(
            &reused.logits,
            &full.logits,
            TOLERANCE,
            &format!("{arch:?} prefix"),
        );

        // Every unchanged row, the moved ones re-rotated: the doc's 23, the root's 12.
        let edit = rebind_edited(&old, &new, &bound, false).expect("rebind");
        let spliced = run(&model, &store, &old, &edit, InferenceMode::Reuse);
        assert_eq!(spliced.stats.tokens_reused, 9 + 23 + 3, "{arch:?}");
        assert_eq!(spliced.stats.tokens_new, 2 + 5, "{arch:?}");
        // Cached rows first in the cache, the new ones after: the same positions in all.
        let mut positions = spliced.kv.positions().to_vec();
        positions.sort_unstable();
        assert_eq!(positions, full.kv.positions(), "{arch:?}");
        let deviation = max_abs_diff(&spliced.logits, &full.logits);
        eprintln!("{arch:?}: moved rows spliced without recompute: max |Δlogit| {deviation:.3e}");
        assert!(
            deviation > 10.0 * TOLERANCE,
            "{arch:?}: the edit should matter"
        );

        // Blend recomputing every cached token is full.
        let blended = run(
            &model,
            &store,
            &old,
            &edit,
            blend_everything(Pipelining::Auto),
        );
        assert_close(
            &blended.logits,
            &full.logits,
            TOLERANCE,
            &format!("{arch:?} blend"),
        );
    }
}

/// A module the prompt places elsewhere (as a collection member is) keeps its placement when
/// it is edit-reused: blend recomputing everything is `full` of the placed, edited prompt.
#[test]
fn a_placed_module_is_edit_reused_where_the_prompt_puts_it() {
    let Encoded {
        model,
        store,
        old,
        new,
        doc,
        ..
    } = encoded(Arch::Qwen2);
    let mut binding = Binding::new(&new, &[doc], &tokens(90, 5));
    binding.placed.push((doc, 45));
    binding.tail_start = Some(80);
    let bound = binding.bind();
    let full = run(&model, &store, &new, &bound, InferenceMode::Full);
    let edit = rebind_edited(&old, &new, &bound, false).expect("rebind");
    let blended = run(
        &model,
        &store,
        &old,
        &edit,
        blend_everything(Pipelining::Auto),
    );
    let mut positions = blended.kv.positions().to_vec();
    positions.sort_unstable();
    assert_eq!(positions, full.kv.positions());
    assert!(positions.contains(&45) && !positions.contains(&20));
    assert_close(&blended.logits, &full.logits, TOLERANCE, "placed");
}

/// Root [BOS, prefix], `doc` holding `text`, `after`, then root text: an edit of `doc` moves
/// everything after it.
fn layout_with_tail(text: &[u32]) -> SchemaLayout {
    let mut builder = LayoutBuilder::new();
    builder
        .text(UnitId::ROOT, &[BOS])
        .text(UnitId::ROOT, &tokens(3, 8));
    let doc = builder.open("doc", UnitId::ROOT);
    builder.text(doc, text);
    builder.close(doc);
    let after = builder.open("after", UnitId::ROOT);
    builder.text(after, &tokens(170, 6));
    builder.close(after);
    builder.text(UnitId::ROOT, &tokens(120, 3));
    builder.build("edited")
}

/// After an edit, the layout the stored states were computed under is rebuilt from the last
/// manifest and those states, exactly; with nothing changed there is none to rebuild.
#[test]
fn the_previous_layout_is_rebuilt_from_the_stored_states() {
    let original = tokens(50, 24);
    let mut edited = original.clone();
    edited.splice(10..11, [7, 9]);
    let model = random_model(Arch::Qwen2, SEED, WeightFormat::F32, &Device::Cpu).expect("model");
    let (store, _manifests) = ram_store_in(&model, "edit-test", DType::F32);
    let old = layout_with_tail(&original);
    let options = EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep: None,
    };
    encode_schema(&model, &old, options, &store, &mut |_| {}).expect("encode");
    let find = |layout: &SchemaLayout| {
        previous_layout(&model, &store, EncodeMode::Scaffolded, Some(BOS), layout)
            .expect("previous layout")
    };
    assert_eq!(find(&old), None, "nothing changed");
    let previous = find(&layout_with_tail(&edited)).expect("a previous layout");
    assert_eq!(previous.layout, old);
    assert_eq!(
        previous.changed,
        ["the root", "module `doc`", "module `after`"]
    );
}

/// A layout whose structure changed (another module at the unit's id) is refused.
#[test]
fn another_structure_is_refused() {
    let (old, doc) = layout(&tokens(50, 4));
    let mut builder = LayoutBuilder::new();
    builder.text(UnitId::ROOT, &[BOS]);
    let other = builder.open("other", UnitId::ROOT);
    builder.text(other, &tokens(50, 4));
    builder.close(other);
    let new = builder.build("edited");
    let bound = Binding::new(&new, &[doc], &tokens(90, 2)).bind();
    let error = rebind_edited(&old, &new, &bound, false).expect_err("refused");
    assert!(error.to_string().contains("`doc`"), "{error}");
}
