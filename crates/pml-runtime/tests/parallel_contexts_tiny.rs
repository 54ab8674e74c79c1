//! Mode `reuse` with APE's correction (parallel contexts) on the tiny random models of both
//! families: without correction it is plain `reuse`, with one it changes the answer's
//! distribution, and the decoding steps after the prefill keep attending the modules so.

mod cached_support;

use candle_core::Device;
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout};
use pml_engine::kv_cache::ParallelScaling;
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::encode::{EncodeOptions, UnitEncoder, encode_schema};
use pml_runtime::inference::{InferenceMode, Prefill, SplicePlan, prefill};
use pml_runtime::store::ModuleStore;

use cached_support::{assert_close, max_abs_diff, ram_store, reordered_members};

const SEED: u64 = 29;
const BOS: u32 = 1;

fn reuse(
    model: &Model,
    store: &ModuleStore,
    layout: &SchemaLayout,
    bound: &BoundPrompt,
    scaling: Option<ParallelScaling>,
) -> Prefill {
    let options = EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep: None,
    };
    encode_schema(model, layout, options, store, &mut |_| {}).expect("encodes");
    let plan = SplicePlan::new(layout, bound).expect("plan");
    let mut encoder = UnitEncoder::new(model, layout, options.mode, options.bos, store)
        .expect("layout is valid")
        .with_parallel_scaling(scaling);
    prefill(model, &mut encoder, &plan, InferenceMode::Reuse, 4).expect("prefill runs")
}

#[test]
fn parallel_contexts_without_correction_are_plain_reuse_and_with_one_change_every_step() {
    for arch in Arch::ALL {
        let model = random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("tiny model");
        let (store, _manifests) = ram_store(&model, &format!("tiny-{arch:?}-{SEED}"));
        let (layout, bound) = reordered_members(BOS);
        let plain = reuse(&model, &store, &layout, &bound, None);
        let uncorrected = reuse(&model, &store, &layout, &bound, Some(ParallelScaling::NONE));
        assert!(plain.kv.parallel_contexts().is_none());
        assert_close(
            &uncorrected.logits,
            &plain.logits,
            1e-5,
            &format!("{arch:?} T = S = 1"),
        );
        let scaling = ParallelScaling {
            temperature: 0.5,
            scale: 0.8,
        };
        let mut corrected = reuse(&model, &store, &layout, &bound, Some(scaling));
        assert!(
            max_abs_diff(&corrected.logits, &plain.logits) > 1e-3,
            "{arch:?}: the correction changes the answer"
        );
        // The members' rows are the contexts, the prefix's and the new tokens' are not.
        let contexts = corrected.kv.parallel_contexts().expect("set").clone();
        let plan = SplicePlan::new(&layout, &bound).expect("plan");
        for span in &plan.spans {
            let is_member = span.unit != pml_compiler::plan::UnitId::ROOT;
            assert!(
                span.positions
                    .iter()
                    .all(|&p| contexts.contains(p) == is_member)
            );
        }
        assert!(!plan.new_positions.iter().any(|&p| contexts.contains(p)));
        // A decoding step over the corrected cache attends with the correction too.
        let next = plan.positions_taken() as u32;
        let mut plain_kv = corrected.kv.clone();
        plain_kv.set_parallel_contexts(None);
        let step = model
            .forward(&[5], &[next], &mut corrected.kv)
            .expect("step");
        let plain_step = model
            .forward(&[5], &[next], &mut plain_kv)
            .expect("plain step");
        assert!(
            max_abs_diff(&step, &plain_step) > 1e-3,
            "{arch:?}: decoding keeps it"
        );
    }
}
