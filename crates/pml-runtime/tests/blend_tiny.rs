//! Mode `blend` (selective recompute) on the tiny random models of both families: `r = 1` is
//! mode `full`, `r = 0` is mode `reuse`, the recomputed set always holds the new tokens and the
//! last one, gradual filtering and V deviation keep those invariants, and re-rotating cached K
//! by a position delta equals computing it at the new positions. The prompt reorders two
//! collection-like members, so both are moved and attend across each other.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod cached_support;

use candle_core::{Device, Tensor};
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout, UnitId};
use pml_engine::model::tiny::{TINY_SLIDING_WINDOW, random_model};
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::encode::{EncodeOptions, UnitEncoder, encode_schema};
use pml_runtime::inference::{
    BlendOptions, Deviation, HEAD_ROWS, InferenceError, InferenceMode, Prefill, Ratio, Selection,
    Shortcut, SplicePlan, prefill,
};
use pml_runtime::store::ModuleStore;
use tempfile::TempDir;

use cached_support::{
    Binding, LayoutBuilder, assert_close, max_abs_diff, ram_store, spread_tokens,
};

const SEED: u64 = 23;
const ARCHES: [Arch; Arch::ALL.len()] = Arch::ALL;
const BOS: u32 = 1;
const RELATIVE_TOLERANCE: f32 = 1e-4;

struct Fixture {
    model: Model,
    store: ModuleStore,
    _manifests: TempDir,
}

impl Fixture {
    fn new(arch: Arch) -> Self {
        let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("tiny model");
        let (store, manifests) = ram_store(&model, &format!("tiny-{arch:?}-{SEED}"));
        Self {
            model,
            store,
            _manifests: manifests,
        }
    }

    fn try_prefill(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
    ) -> Result<Prefill, InferenceError> {
        let options = EncodeOptions {
            mode: EncodeMode::Scaffolded,
            bos: Some(BOS),
            keep: None,
        };
        encode_schema(&self.model, layout, options, &self.store, &mut |_| {}).expect("encodes");
        let plan = SplicePlan::new(layout, bound)?;
        let mut encoder =
            UnitEncoder::new(&self.model, layout, options.mode, options.bos, &self.store)
                .expect("layout is valid");
        prefill(&self.model, &mut encoder, &plan, mode, 0)
    }

    fn prefill(&self, layout: &SchemaLayout, bound: &BoundPrompt, mode: InferenceMode) -> Prefill {
        self.try_prefill(layout, bound, mode).expect("prefill runs")
    }
}

/// Exactly the fraction `recompute`: these tests are about what a ratio selects.
fn blend(recompute: f64) -> BlendOptions {
    BlendOptions {
        recompute: Ratio::new(recompute).expect("a fraction"),
        shortcuts: false,
        ..BlendOptions::default()
    }
}

/// The shared fixture prompt: two moved members that attend across each other.
fn reordered_members() -> (SchemaLayout, BoundPrompt) {
    cached_support::reordered_members(BOS)
}

#[test]
fn recomputing_everything_is_mode_full() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let full = fixture.prefill(&layout, &bound, InferenceMode::Full);
        let variants = [
            blend(1.0),
            BlendOptions {
                deviation: Deviation::Values,
                ..blend(1.0)
            },
            BlendOptions {
                gradual: true,
                check_layer: 0,
                ..blend(1.0)
            },
            BlendOptions {
                selection: Selection::Attention,
                ..blend(1.0)
            },
            BlendOptions {
                selection: Selection::Weighted,
                ..blend(1.0)
            },
            BlendOptions {
                selection: Selection::AttentionValue,
                ..blend(1.0)
            },
            BlendOptions {
                selection: Selection::Mixed,
                ..blend(1.0)
            },
            BlendOptions {
                selection: Selection::Heads,
                ..blend(1.0)
            },
        ];
        for options in variants {
            let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(options));
            assert_close(
                &blended.logits,
                &full.logits,
                RELATIVE_TOLERANCE,
                &format!("{arch:?} blend {options} vs full"),
            );
            assert_eq!(
                blended.stats.tokens_recomputed,
                SplicePlan::new(&layout, &bound).expect("plan").n_cached()
            );
            assert_eq!(blended.stats.tokens_reused, 0);
        }
    }
}

#[test]
fn recomputing_nothing_is_mode_reuse() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let reuse = fixture.prefill(&layout, &bound, InferenceMode::Reuse);
        let full = fixture.prefill(&layout, &bound, InferenceMode::Full);
        let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(blend(0.0)));
        assert_close(
            &blended.logits,
            &reuse.logits,
            RELATIVE_TOLERANCE,
            &format!("{arch:?} blend r=0 vs reuse"),
        );
        assert_eq!(blended.stats.tokens_recomputed, 0);
        assert_eq!(blended.stats.tokens_reused, reuse.stats.tokens_reused);
        // The reordering makes reuse an approximation here, so the equalities above are not
        // trivially those of a prompt where every mode agrees.
        let gap = max_abs_diff(&reuse.logits, &full.logits);
        eprintln!("{arch:?}: reuse vs full max |Δlogit| = {gap:.3e}");
        assert!(gap > RELATIVE_TOLERANCE * cached_support::max_abs(&full.logits).max(1.0));
    }
}

#[test]
fn the_selection_holds_the_new_tokens_the_last_one_and_r_of_the_cached() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let plan = SplicePlan::new(&layout, &bound).expect("plan");
        let cases = [
            (0.1, false, Selection::Deviation),
            (0.25, false, Selection::Attention),
            (0.5, true, Selection::Weighted),
            (0.75, false, Selection::Deviation),
            (0.1, false, Selection::Weighted),
            (0.25, true, Selection::AttentionValue),
            (0.25, false, Selection::Mixed),
            (0.1, false, Selection::Heads),
            (0.5, true, Selection::Heads),
        ];
        for (ratio, gradual, selection) in cases {
            let options = BlendOptions {
                gradual,
                selection,
                ..blend(ratio)
            };
            let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(options));
            let stats = &blended.stats;
            let expected = (ratio * plan.n_cached() as f64).round() as usize;
            assert_eq!(stats.tokens_recomputed, expected, "{arch:?} {options}");
            assert_eq!(stats.tokens_reused + expected, plan.n_cached());
            assert_eq!(stats.tokens_new, plan.new_tokens.len());
            assert_eq!(
                stats.recomputed_positions.len(),
                expected + plan.new_tokens.len()
            );
            for position in &plan.new_positions {
                assert!(
                    stats.recomputed_positions.contains(position),
                    "{arch:?} {options}: new position {position} not recomputed"
                );
            }
            let last = plan.all_positions.last().expect("a last token");
            assert_eq!(stats.recomputed_positions.iter().max(), Some(last));
            let answers = blended.logits.dims().to_vec();
            assert_eq!(answers, [fixture.model.config().vocab_size]);
        }
    }
}

/// The prefix is spliced where it was encoded, after the same tokens, so its K/V are already what
/// a full prefill computes: no ranking spends the budget on it while moved rows are left.
#[test]
fn no_ranking_recomputes_rows_spliced_exactly() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let plan = SplicePlan::new(&layout, &bound).expect("plan");
        let exact: Vec<u32> = plan
            .spans
            .iter()
            .filter(|span| !span.is_moved())
            .flat_map(|span| span.positions.iter().copied())
            .collect();
        let moved = plan.n_cached() - exact.len();
        assert!(!exact.is_empty() && moved > 0, "the fixture has both kinds");
        for selection in [
            Selection::Deviation,
            Selection::Attention,
            Selection::Weighted,
            Selection::AttentionValue,
            Selection::Mixed,
            Selection::Heads,
        ] {
            for ratio in [0.25, 0.5] {
                let options = BlendOptions {
                    selection,
                    ..blend(ratio)
                };
                let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(options));
                assert!(blended.stats.tokens_recomputed <= moved);
                let wasted: Vec<&u32> = blended
                    .stats
                    .recomputed_positions
                    .iter()
                    .filter(|position| exact.contains(position))
                    .collect();
                assert!(
                    wasted.is_empty(),
                    "{arch:?} {options}: recomputed exact {wasted:?}"
                );
            }
        }
    }
}

/// EPIC's LegoLink order: the first rows of every span after the prompt's start are recomputed
/// before anything the attention ranking adds, when the budget holds them all — except rows the probe finds spliced
/// exactly: with Gemma's sliding window of 8, a span's 8th row reads only its own span at the
/// check layer.
#[test]
fn heads_recompute_the_first_rows_of_every_later_span_first() {
    let not_exact = HEAD_ROWS.min(TINY_SLIDING_WINDOW - 1);
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let plan = SplicePlan::new(&layout, &bound).expect("plan");
        let later = || plan.spans.iter().filter(|span| span.positions[0] > 0);
        let n_heads: usize = later().map(|span| span.rows.len().min(HEAD_ROWS)).sum();
        let budget = n_heads as f64 / plan.n_cached() as f64;
        assert!(budget < 1.0, "the fixture leaves rows outside the heads");
        let options = BlendOptions {
            selection: Selection::Heads,
            ..blend(budget)
        };
        let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(options));
        assert_eq!(blended.stats.tokens_recomputed, n_heads, "{arch:?}");
        let recomputed = &blended.stats.recomputed_positions;
        for position in later().flat_map(|span| span.positions.iter().take(not_exact)) {
            assert!(
                recomputed.contains(position),
                "{arch:?}: head position {position} not recomputed: {recomputed:?}"
            );
        }
    }
}

/// K and V of the slots layer `layer_idx` holds with rows sorted by position, so caches whose
/// slots are in a different order (a splice puts cached rows first) compare row for row.
fn by_position(prefill: &Prefill, layer_idx: usize) -> (Tensor, Tensor) {
    let layer = prefill.kv.layer(layer_idx).expect("layer");
    let held = layer.held_positions();
    let mut order: Vec<u32> = (0..held.len() as u32).collect();
    order.sort_by_key(|&row| held[row as usize]);
    let ids = Tensor::new(order.as_slice(), &Device::Cpu).expect("ids");
    let pick = |t: Tensor| t.index_select(&ids, 0).expect("rows");
    (
        pick(layer.keys().expect("keys")),
        pick(layer.values().expect("values")),
    )
}

#[test]
fn layers_up_to_the_check_layer_hold_full_prefill_states_for_every_token() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let full = fixture.prefill(&layout, &bound, InferenceMode::Full);
        let reuse = fixture.prefill(&layout, &bound, InferenceMode::Reuse);
        let options = BlendOptions {
            check_layer: 1,
            ..blend(0.2)
        };
        let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(options));
        for layer_idx in 0..=options.check_layer {
            let what = format!("{arch:?} layer {layer_idx}");
            let (full_k, full_v) = by_position(&full, layer_idx);
            let (blend_k, blend_v) = by_position(&blended, layer_idx);
            assert_close(&blend_k, &full_k, RELATIVE_TOLERANCE, &format!("{what} K"));
            assert_close(&blend_v, &full_v, RELATIVE_TOLERANCE, &format!("{what} V"));
        }
        // Layer 1's V depends on layer 0's attention, which crosses the moved members, so a
        // splice's differs from a full prefill's: the probe's states were kept, not the splice's.
        // (Mode reuse's Gemma holds only the window of its local layer 1: the last rows.)
        let (_, reuse_v) = by_position(&reuse, 1);
        let (_, full_v) = by_position(&full, 1);
        let (n_full, n_reuse) = (full_v.dim(0).expect("rows"), reuse_v.dim(0).expect("rows"));
        let full_v = full_v.narrow(0, n_full - n_reuse, n_reuse).expect("rows");
        assert!(
            max_abs_diff(&reuse_v, &full_v) > RELATIVE_TOLERANCE,
            "{arch:?}"
        );
    }
}

#[test]
fn a_check_layer_past_the_model_is_an_error() {
    let fixture = Fixture::new(Arch::Qwen2);
    let (layout, bound) = reordered_members();
    let n_layers = fixture.model.config().n_layers;
    for options in [
        BlendOptions {
            check_layer: n_layers,
            ..blend(0.5)
        },
        BlendOptions {
            check_layer: n_layers - 1,
            gradual: true,
            ..blend(0.5)
        },
    ] {
        let result = fixture.try_prefill(&layout, &bound, InferenceMode::Blend(options));
        assert!(
            matches!(result, Err(InferenceError::InvalidOptions(_))),
            "{options}: {:?}",
            result.map(|prefill| prefill.stats)
        );
    }
}

#[test]
fn re_rotating_k_by_a_delta_equals_computing_it_at_the_new_positions() {
    for arch in ARCHES {
        let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("model");
        let text = spread_tokens(7, 12);
        let at = |first: u32| -> Vec<u32> { (first..first + text.len() as u32).collect() };
        let run = |positions: &[u32]| {
            let mut kv = model.new_kv_cache().expect("cache");
            model.forward(&text, positions, &mut kv).expect("forward");
            kv.to_block().expect("block")
        };
        let encoded = run(&at(3));
        for new_first in [0, 40, 517] {
            let moved = model
                .reposition(&encoded, &at(new_first))
                .expect("reposition");
            let computed = run(&at(new_first));
            for (layer, ((moved_k, moved_v), (k, v))) in moved
                .layers()
                .unwrap()
                .iter()
                .zip(computed.layers().unwrap())
                .enumerate()
            {
                let what = format!("{arch:?} layer {layer} moved to {new_first}");
                assert_close(moved_k, k, RELATIVE_TOLERANCE, &format!("{what}: K"));
                assert_close(moved_v, v, RELATIVE_TOLERANCE, &format!("{what}: V"));
            }
        }
    }
}

/// By default blend does the cheaper thing where its selective recompute cannot pay, and says
/// so: with many new tokens beside few cached ones it recomputes everything (= full); with no
/// cached row deviating it recomputes none (= reuse); otherwise it recomputes its fraction.
#[test]
fn blend_takes_the_cheaper_way_when_its_recompute_cannot_pay() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let default = InferenceMode::Blend(BlendOptions::default());

        // Selective: 27 cached tokens, 5 new, two moved members.
        let (layout, bound) = reordered_members();
        let blended = fixture.prefill(&layout, &bound, default);
        assert_eq!(blended.stats.shortcut, None, "{arch:?}");
        assert_eq!(blended.stats.tokens_recomputed, 4, "{arch:?}: 15% of 27");

        // Many new tokens: the probe's continuation for all of them is no dearer.
        let mut long = bound.clone();
        let last = *long.new_positions.last().expect("new tokens");
        long.new_tokens.extend(spread_tokens(200, 40));
        long.new_positions.extend(last + 1..last + 41);
        long.new_kinds
            .extend(vec![*long.new_kinds.last().expect("kinds"); 40]);
        let full = fixture.prefill(&layout, &long, InferenceMode::Full);
        let blended = fixture.prefill(&layout, &long, default);
        assert!(
            matches!(blended.stats.shortcut, Some(Shortcut::Full { .. })),
            "{arch:?}: {:?}",
            blended.stats.shortcut
        );
        assert_eq!(blended.stats.tokens_recomputed, 27);
        assert_close(
            &blended.logits,
            &full.logits,
            RELATIVE_TOLERANCE,
            &format!("{arch:?} blend → full"),
        );

        // A module right after the prefix it was encoded after: every cached row is exact.
        let mut builder = LayoutBuilder::new();
        let mut prefix = vec![BOS];
        prefix.extend(spread_tokens(3, 8));
        builder.text(UnitId::ROOT, &prefix);
        let doc = builder.open("doc", UnitId::ROOT);
        builder.text(doc, &spread_tokens(60, 30));
        builder.close(doc);
        let layout = builder.build("exact");
        let bound = Binding::new(&layout, &[doc], &spread_tokens(120, 4)).bind();
        let full = fixture.prefill(&layout, &bound, InferenceMode::Full);
        let blended = fixture.prefill(&layout, &bound, default);
        assert_eq!(blended.stats.shortcut, Some(Shortcut::Reuse), "{arch:?}");
        assert_eq!(blended.stats.tokens_recomputed, 0);
        // The stored states are f16: exact up to their rounding.
        assert_close(
            &blended.logits,
            &full.logits,
            1e-3,
            &format!("{arch:?} blend → reuse"),
        );
    }
}

#[test]
fn the_fidelity_guard_answers_in_full_below_its_floor_and_reports_the_estimate() {
    for arch in ARCHES {
        let fixture = Fixture::new(arch);
        let (layout, bound) = reordered_members();
        let full = fixture.prefill(&layout, &bound, InferenceMode::Full);
        let half = blend(0.5);
        let blended = fixture.prefill(&layout, &bound, InferenceMode::Blend(half));
        let estimate = blended
            .stats
            .fidelity
            .expect("the attention ranking estimates");
        // The moved members attend across each other: the repair moves the answer.
        assert!(
            estimate.deviation > 0.0 && estimate.deviation <= 1.0,
            "{arch:?}: {estimate:?}"
        );
        assert_eq!(blended.stats.guard, None);
        let everything = fixture.prefill(&layout, &bound, InferenceMode::Blend(blend(1.0)));
        assert_eq!(
            everything.stats.fidelity,
            Some(pml_runtime::inference::FidelityEstimate::EXACT)
        );

        // A floor of 1 lets through only an answer the repair did not move: full's answer.
        let strict = BlendOptions {
            min_fidelity: Some(Ratio::ONE),
            ..half
        };
        let guarded = fixture.prefill(&layout, &bound, InferenceMode::Blend(strict));
        let fired = guarded.stats.guard.expect("the guard fires");
        assert_eq!(fired.estimate, estimate, "{arch:?}");
        assert_eq!(guarded.stats.mode, InferenceMode::Full);
        assert_close(
            &guarded.logits,
            &full.logits,
            RELATIVE_TOLERANCE,
            &format!("{arch:?}: guarded answer vs full"),
        );

        // A floor of 0 keeps blend's answer unless the repair changed its first token.
        let lenient = BlendOptions {
            min_fidelity: Some(Ratio::ZERO),
            ..half
        };
        let kept = fixture.prefill(&layout, &bound, InferenceMode::Blend(lenient));
        assert_eq!(kept.stats.guard.is_some(), estimate.first_token_changed);
        if !estimate.first_token_changed {
            assert_close(
                &kept.logits,
                &blended.logits,
                RELATIVE_TOLERANCE,
                &format!("{arch:?}: let through"),
            );
        }

        // A ranking without the new tokens' own pass runs it for the guard only.
        let by_deviation = BlendOptions {
            selection: Selection::Deviation,
            ..half
        };
        let plain = fixture.prefill(&layout, &bound, InferenceMode::Blend(by_deviation));
        assert_eq!(plain.stats.fidelity, None);
        let watched = BlendOptions {
            min_fidelity: Some(Ratio::ZERO),
            ..by_deviation
        };
        let watched = fixture.prefill(&layout, &bound, InferenceMode::Blend(watched));
        assert!(
            watched.stats.fidelity.is_some() || watched.stats.guard.is_some(),
            "{arch:?}"
        );

        // Nothing recomputed, nothing to estimate from: refused.
        let nothing = BlendOptions {
            min_fidelity: Some(Ratio::new(0.9).expect("a fraction")),
            ..blend(0.0)
        };
        assert!(matches!(
            fixture.try_prefill(&layout, &bound, InferenceMode::Blend(nothing)),
            Err(InferenceError::InvalidOptions(_))
        ));
    }
}
