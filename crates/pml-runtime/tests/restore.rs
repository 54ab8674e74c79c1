//! Hidden-state restore (HCache) on the tiny random models of both families (f32 weights) and on
//! one real model: a unit saved per layer as KV, hidden states, recomputed prefixes or the
//! planner's mixes restores to the K/V it was computed with (within float tolerance), through RAM
//! and through disk; a missing layer falls back to recomputing; and a saved two-turn
//! conversation, resumed from the store, answers its second turn as one that never left memory;
//! and the cost probe (overlap efficiency included) leaves the tier as it found it.
//!
//! The models run on `$PML_DEVICE` with `$PML_KERNELS` (default: the CPU's native kernels), so
//! scripts/test.sh runs these again on the candle path and scripts/gpu-check.sh on a GPU.
// The test reports what it measured or skipped.
#![allow(clippy::print_stdout)]

use candle_core::{DType, Tensor};
use pml_compiler::chat_template::{ChatTemplate, RoleMarkers, SystemStyle};
use pml_engine::device::{Backend, BackendChoice, select_backend};
use pml_engine::generation::SamplingParams;
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::tiny::random_model_on;
use pml_engine::model::{Arch, ForwardContext, ForwardOptions, LogitRows, Model, WeightFormat};
use pml_engine::testing::max_abs_diff;
use pml_runtime::conversation::{ChatParts, Conversation};
use pml_runtime::restore::{
    LayerForm, RestorePlan, SavedUnit, measure_costs, plan_restore, restore_unit, save_unit,
};
use pml_runtime::store::{
    ContextHash, DiskTier, ManifestStore, MemoryTier, ModuleStore, StateSpec, Tier,
};
use pml_runtime::testing::ByteTokenizer;
use pml_testkit::fetched_model;
use tempfile::TempDir;

const ARCHES: [Arch; Arch::ALL.len()] = Arch::ALL;

/// Where the models of these tests run: `$PML_DEVICE` with `$PML_KERNELS`.
fn backend() -> Backend {
    select_backend(BackendChoice::resolve(None, None).expect("PML_DEVICE / PML_KERNELS parse"))
        .expect("the device opens")
}

/// The tiny model of `arch` from `seed`, f32 weights, on [`backend`].
fn tiny(arch: Arch, seed: u64) -> Model {
    random_model_on(arch, seed, WeightFormat::F32, &backend()).expect("tiny model")
}
/// Restores through f32 states: only float reassociation in recomputed or projected layers.
const TOLERANCE: f32 = 1e-4;
/// KV stored in f16 and copied back: each value rounded once, at most 2^-11 of its magnitude,
/// so at most 2^-11 of the largest value (what [`restored_deviation`] divides by).
const F16_KV_BOUND: f32 = 1.0 / 2048.0;
/// Hidden states stored in f16 and projected (norm, projections, RoPE), or mixed with f16 KV
/// layers: measured at most 3.3e-4 (all hidden) and 3.6e-4 (hidden + KV) on these models (Qwen2
/// and Gemma3 tiny, seed 5, every plan of [`plans`]); 1e-3 leaves room for another seed while
/// staying far below what a wrong layer gives (order 1).
const F16_TOLERANCE: f32 = 1e-3;

/// A spec storing f32 states, so restores are exact up to float reassociation.
fn spec(model: &Model, fingerprint: &str) -> StateSpec {
    spec_in(model, fingerprint, DType::F32)
}

fn spec_in(model: &Model, fingerprint: &str, state_dtype: DType) -> StateSpec {
    StateSpec::new(fingerprint, model.kv_layout()).with_state_dtype(state_dtype)
}

fn store_with(model: &Model, tier: Box<dyn Tier>, manifests: &TempDir) -> ModuleStore {
    store_in(model, tier, manifests, DType::F32)
}

fn store_in(
    model: &Model,
    tier: Box<dyn Tier>,
    manifests: &TempDir,
    state_dtype: DType,
) -> ModuleStore {
    ModuleStore::with_tiers(
        spec_in(model, "restore-test", state_dtype),
        vec![tier],
        ManifestStore::new(manifests.path()),
    )
}

/// A context of `n_context` tokens in `kv`, then the unit's tokens computed after it: the unit,
/// its rows and every layer's input. Positions leave a gap, as a module after an unused one does.
struct Computed {
    context: KvCache,
    unit: SavedUnit,
    rows: KvBlock,
    layer_inputs: Vec<Tensor>,
}

fn compute(model: &Model, n_context: usize, n_unit: usize) -> Computed {
    let context_tokens: Vec<u32> = (0..n_context as u32).map(|i| 30 + i * 11 % 200).collect();
    let context_positions: Vec<u32> = (0..n_context as u32).collect();
    let mut kv = model.new_kv_cache().expect("cache");
    if n_context > 0 {
        model
            .forward(&context_tokens, &context_positions, &mut kv)
            .expect("context");
    }
    let context = kv.clone();
    let tokens: Vec<u32> = (0..n_unit as u32).map(|i| (i * 37 + 5) % 256).collect();
    let positions: Vec<u32> = (0..n_unit as u32)
        .map(|i| n_context as u32 + 3 + i)
        .collect();
    let options = ForwardOptions {
        logits: LogitRows::None,
        keep_layer_inputs: true,
    };
    let forward = ForwardContext::appending(positions.clone(), &kv);
    let output = model
        .forward_with(&tokens, &forward, &mut kv, &options)
        .expect("unit");
    let rows = kv.slice(n_context..kv.len()).expect("rows");
    Computed {
        context,
        unit: SavedUnit {
            tokens,
            positions,
            context: ContextHash::of(&context_tokens, &context_positions),
            plan: RestorePlan::uniform(LayerForm::Kv, model.config().n_layers),
        },
        rows,
        layer_inputs: output.layer_inputs,
    }
}

/// Largest difference between the rows restored after the context and the computed rows, over
/// every layer's K and V, relative to the largest value.
fn restored_deviation(restored: &KvCache, computed: &Computed) -> f32 {
    let start = computed.context.len();
    let rows = restored
        .slice(start..restored.len())
        .expect("restored rows");
    assert_eq!(rows.positions(), computed.rows.positions());
    let mut worst: f32 = 0.0;
    for (layer, ((k, v), (k0, v0))) in rows
        .layers()
        .unwrap()
        .iter()
        .zip(computed.rows.layers().unwrap())
        .enumerate()
    {
        for (restored, expected) in [(k, k0), (v, v0)] {
            let scale = max_abs_diff(expected, &expected.zeros_like().expect("zeros")).max(1.0);
            let diff = max_abs_diff(restored, expected) / scale;
            assert!(diff.is_finite(), "layer {layer}");
            worst = worst.max(diff);
        }
    }
    worst
}

fn plans(n_layers: usize) -> Vec<RestorePlan> {
    vec![
        RestorePlan::uniform(LayerForm::Kv, n_layers),
        RestorePlan::uniform(LayerForm::Hidden, n_layers),
        RestorePlan::uniform(LayerForm::Recompute, n_layers),
        RestorePlan::split(LayerForm::Recompute, 1, LayerForm::Hidden, n_layers),
        RestorePlan::split(LayerForm::Hidden, 2, LayerForm::Kv, n_layers),
    ]
}

#[test]
fn every_plan_restores_the_computed_kv_in_both_families() {
    for (arch, state_dtype) in ARCHES
        .into_iter()
        .flat_map(|arch| [(arch, DType::F32), (arch, DType::F16)])
    {
        let model = tiny(arch, 5);
        let computed = compute(&model, 6, 11);
        for plan in plans(model.config().n_layers) {
            let manifests = TempDir::new().expect("tempdir");
            let tier = Box::new(MemoryTier::new(1 << 30));
            let store = store_in(&model, tier, &manifests, state_dtype);
            let unit = SavedUnit {
                plan: plan.clone(),
                ..computed.unit.clone()
            };
            let saved = save_unit(
                &model,
                &store,
                &unit,
                &computed.rows,
                &computed.layer_inputs,
            )
            .expect("save");
            assert_eq!(
                saved.entries,
                plan.count(LayerForm::Kv) + plan.count(LayerForm::Hidden)
            );
            let mut kv = computed.context.clone();
            let report = restore_unit(&model, &store, &unit, &mut kv).expect("restore");
            assert_eq!(report.fallback, None, "{arch:?} {plan}");
            assert_eq!(
                (
                    report.kv_layers,
                    report.hidden_layers,
                    report.recomputed_layers
                ),
                (
                    plan.count(LayerForm::Kv),
                    plan.count(LayerForm::Hidden),
                    plan.count(LayerForm::Recompute)
                )
            );
            let deviation = restored_deviation(&kv, &computed);
            println!("{arch:?} {state_dtype:?} {plan}: relative deviation {deviation:.2e}");
            let all_kv = plan.count(LayerForm::Kv) == plan.layers.len();
            match state_dtype {
                DType::F32 => {
                    assert!(deviation < TOLERANCE, "{arch:?} {plan}: {deviation}");
                    if all_kv {
                        assert_eq!(deviation, 0.0, "KV layers are copied, not recomputed");
                    }
                }
                _ if all_kv => assert!(
                    deviation <= F16_KV_BOUND,
                    "{arch:?} {plan}: {deviation} beyond one f16 rounding"
                ),
                _ => assert!(deviation < F16_TOLERANCE, "{arch:?} {plan}: {deviation}"),
            }
        }
    }
}

#[test]
fn the_cost_probe_measures_an_overlap_in_range_and_cleans_up() {
    let model = tiny(Arch::Qwen2, 5);
    let manifests = TempDir::new().expect("tempdir");
    let tier = MemoryTier::new(1 << 30);
    let store = store_with(&model, Box::new(MemoryTier::new(1 << 30)), &manifests);
    let costs = measure_costs(&model, &store, &tier, 16).expect("costs");
    assert!((0.0..=1.0).contains(&costs.overlap), "{costs:?}");
    for cost in [
        costs.io_kv,
        costs.io_hidden,
        costs.compute_hidden,
        costs.compute_token,
    ] {
        assert!(cost.is_finite() && cost > 0.0, "{costs:?}");
    }
    // The probe's layers (both forms, and the mixed plan timed for the overlap) are gone.
    assert!(tier.is_empty(), "{} probe entries left", tier.len());
    assert!(plan_restore(&costs, model.config().n_layers).is_valid());
}

#[test]
fn hidden_layers_survive_the_disk_and_a_missing_layer_is_recomputed() {
    for arch in ARCHES {
        let model = tiny(arch, 9);
        let computed = compute(&model, 4, 7);
        let n_layers = model.config().n_layers;
        let unit = SavedUnit {
            plan: RestorePlan::split(LayerForm::Hidden, 2, LayerForm::Kv, n_layers),
            ..computed.unit.clone()
        };
        let root = TempDir::new().expect("tempdir");
        let disk =
            || Box::new(DiskTier::open(root.path(), spec(&model, "restore-test")).expect("disk"));
        save_unit(
            &model,
            &store_with(&model, disk(), &root),
            &unit,
            &computed.rows,
            &computed.layer_inputs,
        )
        .expect("save");

        // Another store on the same folder: what a new process sees.
        let store = store_with(&model, disk(), &root);
        let mut kv = computed.context.clone();
        let report = restore_unit(&model, &store, &unit, &mut kv).expect("restore");
        assert_eq!(report.fallback, None);
        assert_eq!(report.hidden_layers, 2);
        assert!(restored_deviation(&kv, &computed) < TOLERANCE);

        let key = unit
            .layer_key(&model, &store, 1, LayerForm::Hidden)
            .expect("key");
        assert!(store.remove(&key).expect("remove"));
        let mut kv = computed.context.clone();
        let report = restore_unit(&model, &store, &unit, &mut kv).expect("restore");
        let reason = report.fallback.expect("a missing layer falls back");
        assert!(reason.contains("layer 1"), "{reason}");
        assert_eq!(report.recomputed_layers, n_layers);
        assert!(restored_deviation(&kv, &computed) < TOLERANCE);
    }
}

#[test]
fn hidden_restore_matches_on_a_real_model() {
    let Some(path) = fetched_model("gemma3-270m") else {
        return;
    };
    let gguf = pml_engine::gguf::GgufFile::open(&path).expect("opens");
    let config = pml_engine::model::ModelConfig::from_gguf(&gguf).expect("config");
    let model = Model::from_source_on(config, &mut &gguf, WeightFormat::default(), &backend())
        .expect("model loads");
    let computed = compute(&model, 5, 12);
    let manifests = TempDir::new().expect("tempdir");
    let store = store_with(&model, Box::new(MemoryTier::new(1 << 30)), &manifests);
    let unit = SavedUnit {
        plan: RestorePlan::uniform(LayerForm::Hidden, model.config().n_layers),
        ..computed.unit.clone()
    };
    save_unit(
        &model,
        &store,
        &unit,
        &computed.rows,
        &computed.layer_inputs,
    )
    .expect("save");
    let mut kv = computed.context.clone();
    let report = restore_unit(&model, &store, &unit, &mut kv).expect("restore");
    assert_eq!(report.fallback, None);
    let deviation = restored_deviation(&kv, &computed);
    println!("gemma3-270m, hidden states: relative deviation {deviation:.2e}");
    assert!(deviation < 1e-3, "{deviation}");
}

fn chat_template() -> ChatTemplate {
    let markers = |open: &str, close: &str| RoleMarkers {
        open: open.to_string(),
        close: close.to_string(),
    };
    ChatTemplate {
        system: markers("[s]", "[/s]"),
        user: markers("[u]", "[/u]"),
        assistant: markers("[a]", "[/a]"),
        generation_prompt: "[a]".to_string(),
        emits_bos: false,
        system_style: SystemStyle::Native,
        default_preamble: String::new(),
        source: String::new(),
        tokens: Default::default(),
    }
}

fn chat_parts<'a>(
    model: &'a Model,
    template: &'a ChatTemplate,
    store: &'a ModuleStore,
) -> ChatParts<'a> {
    ChatParts {
        model,
        tokenizer: &ByteTokenizer,
        template,
        store,
        max_positions: 256,
        draft: None,
    }
}

#[test]
fn a_resumed_conversation_answers_like_one_kept_in_memory() {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 10,
        ..SamplingParams::default()
    };
    let template = chat_template();
    for arch in ARCHES {
        let model = tiny(arch, 13);
        let n_layers = model.config().n_layers;
        let root = TempDir::new().expect("tempdir");
        let open_store = || {
            let disk = DiskTier::open(root.path(), spec(&model, "chat-test")).expect("disk");
            ModuleStore::with_tiers(
                spec(&model, "chat-test"),
                vec![Box::new(MemoryTier::new(1 << 30)), Box::new(disk)],
                ManifestStore::new(root.path()),
            )
        };
        let reference_store = open_store();
        let mut in_memory = Conversation::new(Some("be brief".into()));
        let mut ignore = |_: &str| {};
        let first = in_memory
            .turn(
                &chat_parts(&model, &template, &reference_store),
                "hello there",
                &params,
                None,
                &mut ignore,
            )
            .expect("turn 1");
        let second = in_memory
            .turn(
                &chat_parts(&model, &template, &reference_store),
                "and then?",
                &params,
                None,
                &mut ignore,
            )
            .expect("turn 2");
        assert!(second.restored.is_empty());

        for plan in plans(n_layers) {
            let saving_store = open_store();
            let mut saved = Conversation::new(Some("be brief".into()));
            let turn = saved
                .turn(
                    &chat_parts(&model, &template, &saving_store),
                    "hello there",
                    &params,
                    Some(&plan),
                    &mut ignore,
                )
                .expect("turn 1");
            assert_eq!(turn.generation.token_ids, first.generation.token_ids);
            let session = saved.session("chat-test");

            // A new store over the same folder, with an empty RAM tier: a resumed process.
            let resumed_store = open_store();
            let mut resumed = Conversation::resume(&session);
            let turn = resumed
                .turn(
                    &chat_parts(&model, &template, &resumed_store),
                    "and then?",
                    &params,
                    Some(&plan),
                    &mut ignore,
                )
                .expect("turn 2");
            assert_eq!(turn.restored.len(), 1, "{arch:?} {plan}");
            assert_eq!(turn.restored[0].fallback, None, "{arch:?} {plan}");
            assert_eq!(turn.history_tokens, second.history_tokens);
            assert_eq!(
                turn.generation.token_ids, second.generation.token_ids,
                "{arch:?} {plan}: the resumed answer differs"
            );
        }
    }
}
