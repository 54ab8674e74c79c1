//! A schema encoded in bounded steps (as the server encodes between completions) stores what one
//! call encodes: each step stays within its units and tokens (a unit longer than a step is
//! computed over several, in equal chunks), and every unit's stored state matches; so does one
//! whose chunks are rows of another sequence's decoding passes.

mod cached_support;

use candle_core::{DType, Device};
use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};
use pml_engine::kv_cache::KvCache;
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, BatchSlot, Model, WeightFormat};
use pml_runtime::encode::{
    EncodeOptions, EncodeReport, EncodeRun, EncodeStep, UnitOutcome, encode_schema,
};
use pml_runtime::store::ModuleStore;

use cached_support::{LayoutBuilder, assert_close, ram_store_in, spread_tokens};

const BOS: u32 = 1;

/// A root, four short modules, one long one and a nested one after it.
fn layout() -> SchemaLayout {
    let mut builder = LayoutBuilder::new();
    builder.text(UnitId::ROOT, &[BOS]);
    builder.text(UnitId::ROOT, &spread_tokens(3, 5));
    for (index, length) in [(0, 12), (1, 9), (2, 100), (3, 7)] {
        let module = builder.open(&format!("m{index}"), UnitId::ROOT);
        builder.text(module, &spread_tokens(index * 31, length));
        if index == 2 {
            let nested = builder.open("inner", module);
            builder.text(nested, &spread_tokens(77, 6));
            builder.close(nested);
        }
        builder.close(module);
    }
    builder.build("stepped")
}

/// The tiny model, the layout and scaffolded encoding after BOS.
fn setup() -> (Model, SchemaLayout, EncodeOptions) {
    let model = random_model(Arch::Qwen2, 3, WeightFormat::F32, &Device::Cpu).expect("model");
    let options = EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep: None,
    };
    (model, layout(), options)
}

#[test]
fn encoding_in_steps_stores_what_one_call_stores() {
    let (model, layout, options) = setup();
    let (whole_store, _whole_manifests) = ram_store_in(&model, "tiny-steps", DType::F32);
    let whole = encode_schema(&model, &layout, options, &whole_store, &mut |_| {}).expect("whole");

    let (store, _manifests) = ram_store_in(&model, "tiny-steps", DType::F32);
    let step = EncodeStep {
        max_tokens: 16,
        max_units: 2,
        pass_tokens: 0,
    };
    let mut run = EncodeRun::new(&layout, &store, &mut |_| {});
    let mut steps = 0;
    let report = loop {
        let before = run.units_done();
        let done = run
            .advance(&model, &layout, options, &store, step, &mut |_| {})
            .expect("a step");
        steps += 1;
        assert!(run.units_done() - before <= step.max_units);
        if let Some(report) = done {
            break report;
        }
    };
    // The 100-token module alone takes seven steps: chunks of 15 tokens, one per step.
    assert!(steps >= 7, "{steps} steps");
    assert_eq!(report.units.len(), layout.units.len());
    assert_eq!(report.units, whole.units, "same outcomes and keys");
    assert!(
        report
            .units
            .iter()
            .all(|unit| unit.outcome == UnitOutcome::Encoded)
    );
    assert_same_states(&model, &report, &store, &whole_store);
    // The manifest is written once, at the end, and names every unit.
    let manifest = store.read_manifest("stepped").found().expect("a manifest");
    assert_eq!(manifest.units.len(), layout.units.len());
}

/// Every unit of `report` holds the same state in `store` as in `reference`.
fn assert_same_states(
    model: &Model,
    report: &EncodeReport,
    store: &ModuleStore,
    reference: &ModuleStore,
) {
    for unit in &report.units {
        let key = unit.key.as_ref().expect("stored");
        let stepped = store.get(key).expect("read").expect("stored").state;
        let at_once = reference.get(key).expect("read").expect("stored").state;
        assert_eq!(stepped.tokens(), at_once.tokens());
        for layer in 0..model.config().n_layers {
            let (stepped_k, stepped_v) = stepped.kv().layer(layer).expect("layer");
            let (k, v) = at_once.kv().layer(layer).expect("layer");
            let what = format!("{} layer {layer}", unit.path);
            assert_close(stepped_k, k, 1e-4, &format!("{what} keys"));
            assert_close(stepped_v, v, 1e-4, &format!("{what} values"));
        }
    }
}

/// As a server encodes beside the completions it decodes: no pass of the encoding's own, its
/// chunks (of varying sizes) rows of a batched pass with another sequence's decoding token.
#[test]
fn chunks_joining_another_sequences_passes_store_what_one_call_stores() {
    let (model, layout, options) = setup();
    let (whole_store, _whole_manifests) = ram_store_in(&model, "tiny-steps", DType::F32);
    let whole = encode_schema(&model, &layout, options, &whole_store, &mut |_| {}).expect("whole");

    let (store, _manifests) = ram_store_in(&model, "tiny-steps", DType::F32);
    let mut run = EncodeRun::new(&layout, &store, &mut |_| {});
    let mut decoding = KvCache::new(model.kv_layout(), model.device()).expect("a cache");
    let (mut steps, mut token) = (0_usize, BOS);
    let report = loop {
        if let Some(report) = run
            .advance_to_chunk(&model, &layout, options, &store, 2, &mut |_| {})
            .expect("visits")
        {
            break report;
        }
        let rows = 1 + steps % 5;
        let chunk = run.pending_chunk(&layout, rows).expect("a unit to compute");
        assert!(chunk.tokens.len() <= rows);
        let position = [decoding.len() as u32];
        let mut slots = [
            BatchSlot {
                tokens: &[token],
                positions: &position,
                kv: &mut decoding,
            },
            BatchSlot {
                tokens: chunk.tokens,
                positions: chunk.positions,
                kv: chunk.kv,
            },
        ];
        let logits = model.forward_batch(&mut slots).expect("the pass");
        token = logits
            .get(0)
            .and_then(|row| row.argmax(0))
            .and_then(|index| index.to_scalar::<u32>())
            .expect("a token");
        run.chunk_computed();
        steps += 1;
        assert!(steps < 500, "the encoding never ends");
    };
    assert!(steps > 40, "{steps} steps");
    assert_eq!(report.units, whole.units, "same outcomes and keys");
    assert_same_states(&model, &report, &store, &whole_store);
}

#[test]
fn a_step_counts_each_pass_as_its_floor_of_tokens() {
    let (model, layout, options) = setup();
    let (store, _manifests) = ram_store_in(&model, "tiny-steps", DType::F32);
    // The root (6 tokens) and `m0` (12) would fit 64 tokens; counted as 32 each, two passes do.
    let step = EncodeStep {
        max_tokens: 64,
        max_units: 64,
        pass_tokens: 32,
    };
    let mut run = EncodeRun::new(&layout, &store, &mut |_| {});
    let done = run
        .advance(&model, &layout, options, &store, step, &mut |_| {})
        .expect("a step");
    assert!(done.is_none());
    assert_eq!(run.units_done(), 2);
}
