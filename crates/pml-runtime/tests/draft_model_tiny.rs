//! `pml run --draft-model` on the tiny random models of every family: a draft model attached
//! to the runtime, compiled into its own module states, drafts for the answer and leaves its
//! tokens unchanged in every mode; a draft of the same weights has drafts accepted.

use pml_engine::generation::speculative::DEFAULT_DRAFT_P_MIN;
use pml_engine::generation::{Generation, SamplingParams, Speculation};
use pml_engine::model::Arch;
use pml_runtime::inference::{BlendOptions, InferenceMode, LaidOutSchema, Ratio, Runtime};
use pml_runtime::testing::tiny_runtime;

const SCHEMA: &str = r#"<schema name="notes">
  You answer questions about the notes below.
  <module name="notes">The meeting moved to Tuesday; bring the slides and the budget.</module>
  <module name="more">Lunch is at noon in the small room on the second floor.</module>
</schema>"#;

const PROMPT: &str =
    r#"<prompt schema="notes"><more/><notes/>When is the meeting, and where is lunch?</prompt>"#;

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

fn run(
    runtime: &Runtime,
    schema: &LaidOutSchema,
    mode: InferenceMode,
    speculation: Speculation,
) -> Generation {
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 24,
        speculation,
        ..SamplingParams::default()
    };
    runtime
        .run(schema, PROMPT, mode, &params, &mut |_| {})
        .expect("runs")
        .0
}

#[test]
fn a_draft_model_leaves_every_modes_answer_unchanged() {
    let drafting = Speculation::Draft {
        max_draft: 5,
        p_min: 0.0,
    };
    for arch in Arch::ALL {
        for (draft_seed, same_weights) in [(7, true), (8, false)] {
            let (mut runtime, _manifests) = tiny_runtime(arch, 7);
            let (draft, _draft_manifests) = tiny_runtime(arch, draft_seed);
            runtime.attach_draft_model(draft).expect("same vocabulary");
            let loader = pml_compiler::MemorySourceLoader::new();
            let (schema, _) = runtime
                .compile(SCHEMA, &loader, &mut |_| {})
                .expect("compiles");
            let draft = runtime.draft_model().expect("attached");
            let report = draft
                .encode(&schema.layout, &mut |_| {})
                .expect("the draft model's states");
            assert!(report.n_encoded() > 0, "{arch:?}: the draft's own states");
            assert!(
                draft
                    .unit_tiers(&schema.layout)
                    .expect("tiers")
                    .iter()
                    .all(Option::is_some),
                "{arch:?}: every unit stored for the draft model"
            );
            for mode in modes() {
                let plain = run(&runtime, &schema, mode, Speculation::Off);
                let drafted = run(&runtime, &schema, mode, drafting);
                let what = format!("{arch:?} seed {draft_seed} {mode}");
                assert_eq!(drafted.token_ids, plain.token_ids, "{what}");
                let stats = drafted.speculation;
                assert!(stats.drafted > 0, "{what}: {stats}");
                if same_weights {
                    assert!(stats.accepted > 0, "{what}: {stats}");
                }
                // A confident draft model or none: the same answer.
                let confident = Speculation::Draft {
                    max_draft: 3,
                    p_min: DEFAULT_DRAFT_P_MIN,
                };
                assert_eq!(
                    run(&runtime, &schema, mode, confident).token_ids,
                    plain.token_ids,
                    "{what}"
                );
            }
        }
    }
}
