//! Pipelined `blend` on the tiny random models of both families, with the module store on disk:
//! streaming the cached layers from their per-layer entries gives exactly the logits of splicing
//! the whole states first; the first pipelined run stores the units per layer and the next one
//! streams them; a damaged or missing layer entry falls back to the unit's whole state (or a
//! re-encode) with a warning, never a wrong answer; `--recompute auto` reports the controller's
//! choice and recomputes exactly the fraction it reports, at every ratio it can pick.

mod cached_support;

use std::path::PathBuf;
use std::time::Duration;

use candle_core::Device;
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout, UnitId};
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::encode::{EncodeOptions, UnitEncoder, encode_schema};
use pml_runtime::inference::{
    BlendOptions, DeclaredCosts, InferenceMode, Pipelining, Prefill, Ratio, Selection, Shortcut,
    SplicePlan, prefill,
};
use pml_runtime::store::{DiskTier, ManifestStore, ModuleStore, StateSpec};
use tempfile::TempDir;

use cached_support::{max_abs_diff, reordered_members};

const SEED: u64 = 29;
const ARCHES: [Arch; Arch::ALL.len()] = Arch::ALL;
const BOS: u32 = 1;
const ENCODING: EncodeOptions = EncodeOptions {
    mode: EncodeMode::Scaffolded,
    bos: Some(BOS),
    keep: None,
};

/// A tiny model with a disk-only store, so every state is read (and verified) from its file.
struct DiskFixture {
    model: Model,
    store: ModuleStore,
    spec: StateSpec,
    dir: TempDir,
}

impl DiskFixture {
    fn new(arch: Arch) -> Self {
        let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("tiny model");
        let dir = TempDir::new().expect("temporary directory");
        let spec = StateSpec::new(format!("tiny-{arch:?}-{SEED}"), model.kv_layout());
        let disk = DiskTier::open(dir.path().join("store"), spec.clone()).expect("disk tier");
        let store = ModuleStore::with_tiers(
            spec.clone(),
            vec![Box::new(disk)],
            ManifestStore::new(&dir.path().join("store")),
        );
        Self {
            model,
            store,
            spec,
            dir,
        }
    }

    fn encoder<'a>(&'a self, layout: &'a SchemaLayout) -> UnitEncoder<'a> {
        UnitEncoder::new(
            &self.model,
            layout,
            ENCODING.mode,
            ENCODING.bos,
            &self.store,
        )
        .expect("layout is valid")
    }

    fn prefill(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        options: BlendOptions,
    ) -> Prefill {
        encode_schema(&self.model, layout, ENCODING, &self.store, &mut |_| {}).expect("encodes");
        let plan = SplicePlan::new(layout, bound).expect("plan");
        let mut encoder = self.encoder(layout);
        prefill(
            &self.model,
            &mut encoder,
            &plan,
            InferenceMode::Blend(options),
            0,
        )
        .expect("prefill runs")
    }

    /// The file of unit `unit`'s layer `layer` entry.
    fn layer_file(&self, layout: &SchemaLayout, unit: UnitId, layer: usize) -> PathBuf {
        let keys = self.encoder(layout).layer_keys(unit).expect("keys");
        let disk = DiskTier::open(self.dir.path().join("store"), self.spec.clone()).expect("disk");
        disk.path_of(&keys[layer])
    }

    /// The file of unit `unit`'s whole state.
    fn whole_file(&self, layout: &SchemaLayout, unit: UnitId) -> PathBuf {
        let key = self.encoder(layout).key(unit).expect("key");
        let disk = DiskTier::open(self.dir.path().join("store"), self.spec.clone()).expect("disk");
        disk.path_of(&key)
    }
}

fn options(recompute: f64, pipelining: Pipelining) -> BlendOptions {
    BlendOptions {
        recompute: Ratio::new(recompute).expect("a fraction"),
        pipelining,
        ..BlendOptions::default()
    }
}

fn flip_a_byte_in_the_middle(path: &PathBuf) {
    let mut bytes = std::fs::read(path).expect("layer file");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(path, bytes).expect("write");
}

fn assert_same_logits(a: &Prefill, b: &Prefill, what: &str) {
    let diff = max_abs_diff(&a.logits, &b.logits);
    assert!(diff == 0.0, "{what}: max |Δlogit| = {diff:e}");
}

#[test]
fn streamed_layers_give_the_logits_of_the_whole_splice() {
    for arch in ARCHES {
        let fixture = DiskFixture::new(arch);
        let (layout, bound) = reordered_members(BOS);
        let n_layers = fixture.model.config().n_layers;
        let variants = [
            options(0.0, Pipelining::Never),
            options(0.25, Pipelining::Never),
            BlendOptions {
                gradual: true,
                check_layer: 0,
                ..options(0.5, Pipelining::Never)
            },
        ];
        for whole in variants {
            let reference = fixture.prefill(&layout, &bound, whole);
            assert_eq!(reference.stats.pipeline, None);
            let streamed = BlendOptions {
                pipelining: Pipelining::Always,
                ..whole
            };
            // First pipelined run: no per-layer entries yet, so both units are spliced whole and
            // stored per layer (unless an earlier variant did).
            let first = fixture.prefill(&layout, &bound, streamed);
            assert_same_logits(&first, &reference, &format!("{arch:?} {whole}: first"));
            // Then they stream, every layer, and auto pipelining on a disk store streams too.
            for pipelining in [Pipelining::Always, Pipelining::Auto] {
                let again = fixture.prefill(
                    &layout,
                    &bound,
                    BlendOptions {
                        pipelining,
                        ..whole
                    },
                );
                let what = format!("{arch:?} {whole} {pipelining:?}");
                assert_same_logits(&again, &reference, &what);
                let pipeline = again.stats.pipeline.as_ref().expect("pipelined");
                // The root's prefix, `b` and `a`.
                assert_eq!(pipeline.units_streamed, 3, "{what}");
                // The probe (none at r = 0) overwrites the layers before the check layer: never
                // loaded.
                let first_layer = match whole.recompute {
                    Ratio::ZERO => 0,
                    _ => whole.check_layer,
                };
                assert_eq!(pipeline.layers_streamed, n_layers - first_layer, "{what}");
                assert_eq!(pipeline.units_layered, 0, "{what}");
                assert!(
                    again.stats.warnings.is_empty(),
                    "{what}: {:?}",
                    again.stats.warnings
                );
                assert_eq!(
                    again.stats.tokens_recomputed,
                    reference.stats.tokens_recomputed
                );
            }
        }
        // The first pipelined run stored the units per layer.
        let layered = (0..n_layers)
            .filter(|&layer| fixture.layer_file(&layout, UnitId(1), layer).exists())
            .count();
        assert_eq!(layered, n_layers);
    }
}

#[test]
fn the_first_pipelined_run_stores_the_units_per_layer() {
    let fixture = DiskFixture::new(Arch::Qwen2);
    let (layout, bound) = reordered_members(BOS);
    let first = fixture.prefill(&layout, &bound, options(0.25, Pipelining::Always));
    let pipeline = first.stats.pipeline.as_ref().expect("pipelined");
    // The root's prefix, `b` and `a`.
    assert_eq!(pipeline.units_streamed, 0);
    assert_eq!(pipeline.units_layered, 3);
    let second = fixture.prefill(&layout, &bound, options(0.25, Pipelining::Always));
    let pipeline = second.stats.pipeline.as_ref().expect("pipelined");
    assert_eq!((pipeline.units_streamed, pipeline.units_layered), (3, 0));
}

#[test]
fn a_damaged_or_missing_layer_entry_falls_back_to_the_whole_state() {
    for arch in ARCHES {
        let fixture = DiskFixture::new(arch);
        let (layout, bound) = reordered_members(BOS);
        let (a, b) = (UnitId(1), UnitId(2));
        let reference = fixture.prefill(&layout, &bound, options(0.3, Pipelining::Never));
        let streamed = options(0.3, Pipelining::Always);
        fixture.prefill(&layout, &bound, streamed);

        // Layer 1 of `a` and the last layer of the root corrupt (both found mid-stream); the
        // last layer of `b` gone (found before streaming starts).
        let n_layers = fixture.model.config().n_layers;
        let corrupt = fixture.layer_file(&layout, a, 1);
        flip_a_byte_in_the_middle(&corrupt);
        flip_a_byte_in_the_middle(&fixture.layer_file(&layout, UnitId::ROOT, n_layers - 1));
        std::fs::remove_file(fixture.layer_file(&layout, b, n_layers - 1)).expect("remove");
        let damaged = fixture.prefill(&layout, &bound, streamed);
        let what = format!("{arch:?} damaged");
        assert_same_logits(&damaged, &reference, &what);
        let warnings = damaged.stats.warnings.join("\n");
        assert_eq!(
            warnings.matches("could not be streamed").count(),
            2,
            "{what}: {warnings}"
        );
        assert!(
            warnings.contains("module `a` could not be streamed")
                && warnings.contains("the root could not be streamed"),
            "{what}: {warnings}"
        );
        // The tier removed the corrupt entries; the fallback stored them afresh.
        assert!(warnings.contains("it was removed"), "{what}: {warnings}");
        assert!(corrupt.exists(), "{what}: layer 1 of `a` stored again");
        let pipeline = damaged.stats.pipeline.as_ref().expect("pipelined");
        // The root and `a` streamed until a layer failed, then were stored per layer again;
        // `b` lacked its last layer, so it was spliced whole and stored per layer again.
        assert_eq!(pipeline.units_streamed, 2, "{what}");
        assert_eq!(pipeline.units_layered, 3, "{what}");

        // Then everything streams, without a warning.
        let streaming = fixture.prefill(&layout, &bound, streamed);
        assert_same_logits(&streaming, &reference, &format!("{arch:?} healed"));
        let pipeline = streaming.stats.pipeline.as_ref().expect("pipelined");
        assert_eq!((pipeline.units_streamed, pipeline.units_layered), (3, 0));
        assert!(
            streaming.stats.warnings.is_empty(),
            "{:?}",
            streaming.stats.warnings
        );

        // A damaged layer whose unit's whole state is damaged too: the unit is encoded again.
        flip_a_byte_in_the_middle(&fixture.layer_file(&layout, a, 2));
        flip_a_byte_in_the_middle(&fixture.whole_file(&layout, a));
        let reencoded = fixture.prefill(&layout, &bound, streamed);
        assert_same_logits(&reencoded, &reference, &format!("{arch:?} re-encoded"));
        assert_eq!(reencoded.stats.units_encoded_on_the_fly.len(), 1);
    }
}

/// Costs declared to the controller: loading a layer takes `load_ms`, recomputing every cached
/// token through it `recompute_ms`, so it picks `load_ms / recompute_ms` (at least the floor).
fn declared(load_ms: u64, recompute_ms: u64) -> Option<DeclaredCosts> {
    Some(DeclaredCosts {
        load_per_layer: Duration::from_millis(load_ms),
        recompute_per_layer: Duration::from_millis(recompute_ms),
    })
}

fn auto(floor: f64, declared_costs: Option<DeclaredCosts>, pipelining: Pipelining) -> BlendOptions {
    BlendOptions {
        auto_ratio: true,
        declared_costs,
        ..options(floor, pipelining)
    }
}

#[test]
fn auto_ratio_recomputes_the_controllers_choice_and_reports_it() {
    let fixture = DiskFixture::new(Arch::Qwen2);
    let (layout, bound) = reordered_members(BOS);
    let n_cached = SplicePlan::new(&layout, &bound).expect("plan").n_cached();
    assert_eq!(n_cached, 27);
    let ratio = |value: f64| Ratio::new(value).expect("a fraction");
    // (floor, load ms, recompute ms) → the ratio picked and the tokens recomputed: 10 of 27 fit;
    // loads faster than the floor's recompute keep the floor (round(0.15 × 27) = 4 tokens); a
    // floor of 1 recomputes everything however fast the load.
    let cases = [
        ((0.15, 10, 27), ratio(10.0 / 27.0), 10),
        ((0.15, 1, 27), ratio(0.15), 4),
        ((1.0, 1, 27), Ratio::ONE, 27),
    ];
    for ((floor, load_ms, recompute_ms), expected, n_recomputed) in cases {
        for pipelining in [Pipelining::Always, Pipelining::Never] {
            let options = auto(floor, declared(load_ms, recompute_ms), pipelining);
            let blended = fixture.prefill(&layout, &bound, options);
            let what = format!("{options}");
            let choice = blended.stats.ratio_choice.expect("the controller chose");
            assert_eq!(choice.floor, options.recompute, "{what}");
            assert_eq!(choice.ratio, expected, "{what}");
            assert_eq!(blended.stats.tokens_recomputed, n_recomputed, "{what}");
            assert_eq!(choice.ratio.of(n_cached), n_recomputed, "{what}");
            assert_eq!(
                choice.load_per_layer,
                Duration::from_millis(load_ms),
                "{what}"
            );
        }
    }
    // 25 of 27 fit, but then the selective recompute (the new tokens' ranking pass, then 25
    // cached and 5 new tokens a layer) costs more than recomputing all 32: every cached token
    // is recomputed, and the choice reports r = 1 beside the controller's pick.
    for pipelining in [Pipelining::Always, Pipelining::Never] {
        let blended = fixture.prefill(&layout, &bound, auto(0.15, declared(25, 27), pipelining));
        let choice = blended.stats.ratio_choice.expect("the controller chose");
        assert!(
            matches!(blended.stats.shortcut, Some(Shortcut::Full { .. })),
            "{:?}",
            blended.stats.shortcut
        );
        assert_eq!(
            (choice.ratio, choice.picked),
            (Ratio::ONE, ratio(25.0 / 27.0))
        );
        assert_eq!(blended.stats.tokens_recomputed, 27);
        assert_eq!(
            choice.to_string(),
            "r=1.000 (auto: load 25.00 ms/layer, recompute 4.05 ms/layer at r=0.15, picked \
             r=0.926 before the shortcut)"
        );
        // Without shortcuts the pick is what is recomputed.
        let exact = BlendOptions {
            shortcuts: false,
            ..auto(0.15, declared(25, 27), pipelining)
        };
        let blended = fixture.prefill(&layout, &bound, exact);
        let choice = blended.stats.ratio_choice.expect("the controller chose");
        assert_eq!(
            (choice.ratio, choice.picked),
            (ratio(25.0 / 27.0), ratio(25.0 / 27.0))
        );
        assert_eq!(blended.stats.tokens_recomputed, 25);
    }
    let choice = fixture
        .prefill(
            &layout,
            &bound,
            auto(0.15, declared(10, 27), Pipelining::Never),
        )
        .stats
        .ratio_choice
        .expect("the controller chose");
    assert_eq!(
        choice.to_string(),
        "r=0.370 (auto: load 10.00 ms/layer, recompute 4.05 ms/layer at r=0.15)"
    );
    // Measured rather than declared: a choice at or above the floor, with its figures.
    let measured = fixture.prefill(&layout, &bound, auto(0.15, None, Pipelining::Always));
    let choice = measured.stats.ratio_choice.expect("the controller chose");
    assert!(choice.picked >= choice.floor, "{choice}");
    assert_eq!(measured.stats.tokens_recomputed, choice.ratio.of(n_cached));
    assert!(choice.to_string().contains("(auto: load"), "{choice}");
    let fixed = fixture.prefill(&layout, &bound, options(0.15, Pipelining::Never));
    assert_eq!(fixed.stats.ratio_choice, None);
}

#[test]
fn every_ratio_the_controller_picks_is_the_fraction_recomputed() {
    let fixture = DiskFixture::new(Arch::Qwen2);
    let (layout, bound) = reordered_members(BOS);
    let n_cached = SplicePlan::new(&layout, &bound).expect("plan").n_cached();
    let n_new = bound.new_tokens.len();
    let variants = [
        auto(0.15, None, Pipelining::Never),
        auto(0.15, None, Pipelining::Always),
        BlendOptions {
            gradual: true,
            ..auto(0.15, None, Pipelining::Never)
        },
        BlendOptions {
            selection: Selection::Deviation,
            ..auto(0.15, None, Pipelining::Never)
        },
        BlendOptions {
            shortcuts: false,
            ..auto(0.15, None, Pipelining::Never)
        },
    ];
    let ratio = |value: f64| Ratio::new(value).expect("a fraction");
    let mut shortcuts_taken = 0;
    // Loading a layer takes `load_ms`, recomputing it for every cached token `n_cached` ms: the
    // controller picks every count of tokens from the floor's to all of them.
    for variant in variants {
        for load_ms in 0..=n_cached as u64 + 1 {
            let options = BlendOptions {
                declared_costs: declared(load_ms, n_cached as u64),
                ..variant
            };
            let blended = fixture.prefill(&layout, &bound, options);
            let stats = &blended.stats;
            let what = format!("{options}");
            let choice = stats.ratio_choice.expect("the controller chose");
            let fitted = (load_ms as f64 / n_cached as f64).clamp(0.15, 1.0);
            assert_eq!(choice.picked, ratio(fitted), "{what}");
            assert_eq!(
                choice.ratio,
                stats.shortcut.map_or(choice.picked, Shortcut::ratio),
                "{what}: {choice}"
            );
            assert_eq!(
                stats.tokens_recomputed,
                choice.ratio.of(n_cached),
                "{what}: {choice}"
            );
            assert_eq!(
                stats.recomputed_positions.len(),
                stats.tokens_recomputed + n_new,
                "{what}"
            );
            shortcuts_taken += usize::from(stats.shortcut.is_some());
        }
    }
    // The default ranking's new-token pass makes the selective recompute dearer than `full`
    // from 22 of the 27 tokens on: those picks were replaced by full recompute.
    assert!(shortcuts_taken > 0);
}
