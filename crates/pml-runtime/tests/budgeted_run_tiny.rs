//! `pml run --kv-budget` on the tiny random models of every family: in every mode the answer is
//! decoded within the budget — the cache cut to it after the prefill and held there, every token
//! run either held or evicted — and a budget the prompt and answer never reach changes nothing.

use pml_engine::generation::{FinishReason, Generation, SamplingParams};
use pml_engine::model::Arch;
use pml_runtime::inference::{
    BlendOptions, InferenceMode, LaidOutSchema, Ratio, RunStats, Runtime,
};
use pml_runtime::kv_budget::KvBudget;
use pml_runtime::testing::tiny_runtime;

const SCHEMA: &str = r#"<schema name="notes">
  You answer questions about the notes below.
  <module name="notes">The meeting moved to Tuesday; bring the slides and the budget.</module>
  <module name="more">Lunch is at noon in the small room on the second floor.</module>
</schema>"#;

const PROMPT: &str =
    r#"<prompt schema="notes"><more/><notes/>When is the meeting, and where is lunch?</prompt>"#;

const MAX_TOKENS: usize = 24;
const BUDGET: usize = 40;

fn modes() -> [InferenceMode; 3] {
    let blend = BlendOptions {
        recompute: Ratio::new(0.3).expect("a ratio"),
        shortcuts: false,
        ..BlendOptions::default()
    };
    [
        InferenceMode::Reuse,
        InferenceMode::Blend(blend),
        InferenceMode::Full,
    ]
}

fn run(runtime: &Runtime, schema: &LaidOutSchema, mode: InferenceMode) -> (Generation, RunStats) {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: MAX_TOKENS,
        ..SamplingParams::default()
    };
    runtime
        .run(schema, PROMPT, mode, &params, &mut |_| {})
        .expect("runs")
}

#[test]
fn answers_decode_within_the_budget_in_every_mode() {
    for arch in Arch::ALL {
        let (mut runtime, _manifests) = tiny_runtime(arch, 7);
        let loader = pml_compiler::MemorySourceLoader::new();
        let (schema, _) = runtime
            .compile(SCHEMA, &loader, &mut |_| {})
            .expect("compiles");
        let budget = KvBudget::h2o(BUDGET, None).expect("budget");
        for mode in modes() {
            runtime.set_kv_budget(None);
            let (unbounded, unbounded_stats) = run(&runtime, &schema, mode);
            assert_eq!(unbounded_stats.kv_budget, None);
            let prefill = &unbounded_stats.prefill;
            let prompt = prefill.tokens_reused + prefill.tokens_recomputed + prefill.tokens_new;
            assert!(
                prompt > BUDGET,
                "{arch:?}: the prompt alone overflows the budget"
            );

            runtime.set_kv_budget(Some(budget));
            let (bounded, stats) = run(&runtime, &schema, mode);
            let report = stats
                .kv_budget
                .expect("a budget the prompt exceeds applies");
            assert!(report.held <= BUDGET, "{arch:?} {mode}: {report:?}");
            // Every prompt and answer token ran but the last one sampled (when the length
            // ended the answer, it never ran).
            let generated = bounded.token_ids.len();
            let ran =
                prompt + generated - usize::from(bounded.finish_reason == FinishReason::Length);
            assert_eq!(
                report.held + report.evicted,
                ran,
                "{arch:?} {mode}: {report:?}"
            );
            // The prompt's first token's logits are the mode's: the budget acts after them.
            assert_eq!(
                bounded.token_ids.first(),
                unbounded.token_ids.first(),
                "{arch:?} {mode}"
            );

            let roomy = KvBudget::h2o(prompt + MAX_TOKENS + 1, None).expect("budget");
            runtime.set_kv_budget(Some(roomy));
            let (same, stats) = run(&runtime, &schema, mode);
            assert_eq!(stats.kv_budget, None, "{arch:?} {mode}: never reached");
            assert_eq!(same.token_ids, unbounded.token_ids, "{arch:?} {mode}");
        }
    }
}
