//! Compressed module states (`pmlc compile --keep F`) on the tiny random models of every family,
//! f32 states: a schema encoded keeping half of each module's rows stores that many rows per
//! module (its first rows and its heaviest), under keys of their own, and the root whole, with the fraction
//! in the manifest; `reuse` over them equals a prefill of the new tokens over exactly the kept
//! rows, `blend` recomputing every cached row equals a full prefill of the kept tokens alone, a
//! parameter's rows are left out of the kept ones as of whole states, and per-layer streaming is
//! refused.

mod cached_support;

use candle_core::{DType, Device};
use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::encode::chunked::prefill_sorted;
use pml_runtime::encode::{EncodeOptions, UnitEncoder, encode_schema};
use pml_runtime::inference::{InferenceError, InferenceMode, Pipelining, SplicePlan, prefill};
use pml_runtime::store::{KeepFraction, ModuleStore, StateKind};

use cached_support::{
    Binding, LayoutBuilder, assert_close, blend_everything, ram_store_in, spread_tokens,
};

const SEED: u64 = 5;
const BOS: u32 = 1;
const TOLERANCE: f32 = 1e-4;

/// Root [BOS, 8 tokens], `doc` (40 tokens, a 4-token parameter at 10), `notes` (30), root tail.
fn layout() -> (SchemaLayout, UnitId, UnitId) {
    let mut builder = LayoutBuilder::new();
    builder
        .text(UnitId::ROOT, &[BOS])
        .text(UnitId::ROOT, &spread_tokens(3, 8));
    let doc = builder.open("doc", UnitId::ROOT);
    builder
        .text(doc, &spread_tokens(40, 10))
        .param(doc, "topic", 4, 0)
        .text(doc, &spread_tokens(80, 26));
    builder.close(doc);
    let notes = builder.open("notes", UnitId::ROOT);
    builder.text(notes, &spread_tokens(120, 30));
    builder.close(notes);
    builder.text(UnitId::ROOT, &spread_tokens(200, 3));
    (builder.build("kept"), doc, notes)
}

fn half() -> KeepFraction {
    KeepFraction::new(0.5).expect("a fraction")
}

fn encoder<'a>(
    model: &'a Model,
    layout: &'a SchemaLayout,
    store: &'a ModuleStore,
    keep: Option<KeepFraction>,
) -> UnitEncoder<'a> {
    UnitEncoder::new(model, layout, EncodeMode::Scaffolded, Some(BOS), store)
        .expect("encoder")
        .with_keep(keep)
}

#[test]
fn compressed_states_keep_their_fraction_and_splice_exactly_what_they_hold() {
    for arch in Arch::ALL {
        let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("model");
        let (store, _manifests) = ram_store_in(&model, "kept-test", DType::F32);
        let (layout, doc, notes) = layout();
        let options = EncodeOptions {
            mode: EncodeMode::Scaffolded,
            bos: Some(BOS),
            keep: Some(half()),
        };
        let report = encode_schema(&model, &layout, options, &store, &mut |_| {}).expect("encode");
        assert_eq!(report.keep, Some(half()));
        let manifest = store.read_manifest("kept").found().expect("manifest");
        assert_eq!(
            manifest.keep,
            Some(half()),
            "{arch:?}: the manifest records F"
        );

        let mut kept = encoder(&model, &layout, &store, Some(half()));
        let whole = encoder(&model, &layout, &store, None);
        // The root (the text every prompt holds) is kept whole, under its usual key.
        assert_eq!(
            kept.key(UnitId::ROOT).unwrap(),
            whole.key(UnitId::ROOT).unwrap()
        );
        let root = kept.state(UnitId::ROOT).expect("root").0;
        assert_eq!(root.len(), layout.units[0].tokens.len());
        let mut states: Vec<KvBlock> = vec![(*root).clone()];
        for unit in [doc, notes] {
            assert_ne!(kept.key(unit).unwrap(), whole.key(unit).unwrap());
            let stored = store
                .get(&kept.key(unit).unwrap())
                .unwrap()
                .expect("stored");
            assert_eq!(stored.state.kind(), StateKind::KvKept(half()));
            let layout_unit = &layout.units[unit.index()];
            let n = layout_unit.tokens.len();
            let state = kept.state(unit).expect("state").0;
            assert_eq!(state.len(), n.div_ceil(2), "{arch:?} unit {}", unit.0);
            // Its first rows (attention sinks) are always kept.
            let positions = state.positions();
            assert!(positions.starts_with(&layout_unit.positions[..4]));
            assert!(positions.windows(2).all(|pair| pair[0] < pair[1]));
            states.push((*state).clone());
        }
        assert!(
            !store.contains(&whole.key(doc).unwrap()).unwrap(),
            "no whole state was stored"
        );

        let tail = spread_tokens(230, 5);
        let mut binding = Binding::new(&layout, &[doc, notes], &tail);
        binding.arguments.push((doc, "topic", spread_tokens(9, 3)));
        let bound = binding.bind();
        let plan = SplicePlan::new(&layout, &bound).expect("plan");
        let reused = prefill(&model, &mut kept, &plan, InferenceMode::Reuse, 0).expect("reuse");

        // The reference: the kept rows, less the parameter's, spliced by hand, then the new
        // tokens.
        let doc_unit = &layout.units[doc.index()];
        let slot = &doc_unit.params[0];
        let parameter = slot.start..slot.start + slot.len;
        let blocks: Vec<KvBlock> = states
            .iter()
            .map(|block| {
                let rows: Vec<usize> = (0..block.len())
                    .filter(|&row| !parameter.contains(&block.positions()[row]))
                    .collect();
                pml_runtime::encode::context::select_rows(block, &rows).unwrap()
            })
            .collect();
        let held: usize = blocks.iter().map(KvBlock::len).sum();
        let refs: Vec<&KvBlock> = blocks.iter().collect();
        let mut kv = KvCache::from_blocks(model.kv_layout(), model.device(), &refs, 16).unwrap();
        let expected = prefill_sorted(&model, &plan.new_tokens, &plan.new_positions, &mut kv, true)
            .unwrap()
            .expect("logits");
        assert_close(
            &reused.logits,
            &expected,
            TOLERANCE,
            &format!("{arch:?} reuse"),
        );
        assert_eq!(reused.stats.tokens_reused, held);
        assert_eq!(reused.stats.tokens_dropped, plan.n_cached() - held);

        // Blend recomputing every kept row: a full prefill of the kept tokens and the new ones.
        let blended = prefill(
            &model,
            &mut kept,
            &plan,
            blend_everything(Pipelining::Auto),
            0,
        )
        .expect("blend");
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for block in &blocks {
            for &position in block.positions() {
                let (unit, row) = layout
                    .units
                    .iter()
                    .find_map(|unit| {
                        let row = unit.positions.iter().position(|&p| p == position)?;
                        Some((unit, row))
                    })
                    .expect("a unit holds the position");
                pairs.push((unit.tokens[row], position));
            }
        }
        pairs.extend(
            plan.new_tokens
                .iter()
                .copied()
                .zip(plan.new_positions.iter().copied()),
        );
        pairs.sort_by_key(|&(_, position)| position);
        let (tokens, positions): (Vec<u32>, Vec<u32>) = pairs.into_iter().unzip();
        let mut fresh = model.new_kv_cache().unwrap();
        let full_of_kept = prefill_sorted(&model, &tokens, &positions, &mut fresh, true)
            .unwrap()
            .expect("logits");
        assert_close(
            &blended.logits,
            &full_of_kept,
            TOLERANCE,
            &format!("{arch:?} blend"),
        );
        assert_eq!(blended.stats.tokens_dropped, plan.n_cached() - held);

        let streamed = prefill(
            &model,
            &mut kept,
            &plan,
            blend_everything(Pipelining::Always),
            0,
        );
        assert!(
            matches!(streamed, Err(InferenceError::InvalidOptions(_))),
            "{arch:?}: streaming compressed states is refused"
        );
    }
}

/// Whole and compressed states live side by side: each encoder reads its own, and encodes what
/// the store lacks of its kind.
#[test]
fn whole_and_compressed_states_do_not_meet() {
    let model = random_model(Arch::Qwen2, SEED, WeightFormat::F32, &Device::Cpu).expect("model");
    let (store, _manifests) = ram_store_in(&model, "kept-test", DType::F32);
    let (layout, doc, _) = layout();
    let options = |keep| EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep,
    };
    encode_schema(&model, &layout, options(None), &store, &mut |_| {}).expect("whole");
    let third = KeepFraction::new(0.3).expect("a fraction");
    let report =
        encode_schema(&model, &layout, options(Some(third)), &store, &mut |_| {}).expect("kept");
    assert_eq!(
        report.n_encoded(),
        2,
        "every module encoded again, compressed (the root is whole)"
    );
    let manifest = store.read_manifest("kept").found().expect("manifest");
    assert_eq!(manifest.keep, Some(third));
    let whole = encoder(&model, &layout, &store, None).state(doc).unwrap().0;
    let kept = encoder(&model, &layout, &store, Some(third))
        .state(doc)
        .unwrap()
        .0;
    assert_eq!(whole.len(), 40);
    assert_eq!(kept.len(), 12);
    let report = encode_schema(&model, &layout, options(None), &store, &mut |_| {}).unwrap();
    assert_eq!(report.n_encoded(), 0, "the whole states are still there");
    assert_eq!(store.read_manifest("kept").found().unwrap().keep, None);
}
