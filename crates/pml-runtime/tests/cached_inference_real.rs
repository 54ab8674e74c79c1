//! Cached inference on the real models (skipped when they are not fetched, unless
//! `PML_REQUIRE_MODELS=1`): a chat system prompt in the root, a module of a few sentences right
//! after it and the question as new text give the same logits in mode `reuse` as in mode `full`
//! (f32 weights and f32 states, so only summation order differs; with the default f16 states,
//! within a measured tolerance), and the same greedy answer; the maximum logit difference is
//! printed. A schema compiled from PML source, where the user turn's closing
//! string follows the module, is reuse's approximation: its deviation is printed too.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod cached_support;

use candle_core::DType;
use pml_compiler::MemorySourceLoader;
use pml_compiler::plan::Role;
use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};
use pml_engine::Tokenizer;
use pml_engine::device::BackendChoice;
use pml_engine::generation::SamplingParams;
use pml_engine::model::WeightFormat;
use pml_runtime::inference::{InferenceMode, Runtime, RuntimeOptions};
use pml_runtime::store::StoreConfig;
use pml_testkit::fetched_model;
use tempfile::TempDir;

use cached_support::{Binding, LayoutBuilder, assert_close, max_abs_diff};

const QWEN: &str = "qwen2.5-0.5b";
const GEMMA: &str = "gemma3-270m";
const SMOLLM: &str = "smollm2-135m";
/// f32 weights and f32 states: the two modes differ in summation order only (24 layers of it).
const RELATIVE_TOLERANCE: f32 = 1e-4;
/// f16 states (the store's default): each cached K/V value rounded once. Measured 3.5e-4 of the
/// largest logit on both models (max |Δlogit| 7.1e-3 on Qwen2.5-0.5B, 6.0e-3 on Gemma-3-270M,
/// with f32 states 0), and the same 24-token greedy answer; the tiny models' tolerance.
const F16_RELATIVE_TOLERANCE: f32 = 1e-3;

const SYSTEM: &str = "You are a concise assistant. Answer from the document.";
const DOCUMENT: &str = "The Hollow Pines observatory sits on a ridge above the town of Marlow. \
    It was founded in 1921 by the astronomer Edith Caldwell, who ground its first mirror by hand. \
    The main telescope was rebuilt in 1987 after a storm cracked the dome. \
    Today the observatory opens to visitors every second Saturday of the month.";
const QUESTION: &str = "Who founded the observatory, and when?";

fn runtime(id: &str, weight_format: WeightFormat) -> Option<(Runtime, TempDir)> {
    runtime_storing(id, weight_format, DType::F16)
}

/// A runtime whose store keeps states in `state_dtype`.
fn runtime_storing(
    id: &str,
    weight_format: WeightFormat,
    state_dtype: DType,
) -> Option<(Runtime, TempDir)> {
    let path = fetched_model(id)?;
    let store_root = TempDir::new().expect("temporary directory");
    let options = RuntimeOptions {
        // `$PML_DEVICE` / `$PML_KERNELS`: CI runs these tests again on the candle path.
        backend: BackendChoice::resolve(None, None).expect("PML_DEVICE / PML_KERNELS parse"),
        weight_format,
        encode_mode: EncodeMode::Scaffolded,
        store: StoreConfig::local(store_root.path().to_path_buf(), 1 << 30)
            .with_state_dtype(state_dtype),
    };
    let runtime = Runtime::load(&path, &options).expect("model loads");
    Some((runtime, store_root))
}

/// Root: BOS (if any), the system turn and the user turn's opening; module `doc` right after;
/// the question, the user turn's close and the generation prompt as new text.
fn chat_layout(runtime: &Runtime) -> (SchemaLayout, UnitId, Vec<u32>) {
    let tokenizer = runtime.tokenizer();
    let template = runtime.template();
    let encode = |text: &str, special: bool| tokenizer.encode(text, special).expect("encodes");
    let mut builder = LayoutBuilder::new();
    if let Some(bos) = tokenizer.bos_token() {
        builder.text(UnitId::ROOT, &[bos]);
    }
    let system = template.markers(Role::System);
    let user = template.markers(Role::User);
    builder
        .text(UnitId::ROOT, &encode(&system.open, true))
        .text(UnitId::ROOT, &encode(SYSTEM, false))
        .text(UnitId::ROOT, &encode(&system.close, true))
        .text(UnitId::ROOT, &encode(&user.open, true));
    let doc = builder.open("doc", UnitId::ROOT);
    builder.text(doc, &encode(DOCUMENT, false));
    builder.close(doc);
    let mut tail = encode(&format!("\n{QUESTION}"), false);
    tail.extend(encode(&user.close, true));
    tail.extend(encode(&template.generation_prompt, true));
    (builder.build("observatory"), doc, tail)
}

fn reuse_equals_full(id: &str) {
    for (state_dtype, tolerance) in [
        (DType::F32, RELATIVE_TOLERANCE),
        (DType::F16, F16_RELATIVE_TOLERANCE),
    ] {
        reuse_equals_full_storing(id, state_dtype, tolerance);
    }
}

fn reuse_equals_full_storing(id: &str, state_dtype: DType, tolerance: f32) {
    let Some((runtime, _store)) = runtime_storing(id, WeightFormat::F32, state_dtype) else {
        return;
    };
    let id = &format!("{id}, {state_dtype:?} states");
    let (layout, doc, tail) = chat_layout(&runtime);
    let report = runtime.encode(&layout, &mut |_| {}).expect("encodes");
    assert_eq!(report.n_encoded(), 2);
    let bound = Binding::new(&layout, &[doc], &tail).bind();
    let reuse = runtime
        .prefill(&layout, &bound, InferenceMode::Reuse)
        .expect("reuse");
    let full = runtime
        .prefill(&layout, &bound, InferenceMode::Full)
        .expect("full");
    let diff = max_abs_diff(&reuse.logits, &full.logits);
    let scale = cached_support::max_abs(&full.logits);
    eprintln!(
        "{id}: reuse vs full, {} cached + {} new tokens: max |Δlogit| = {diff:.3e} (max |logit| \
         {scale:.1})",
        reuse.stats.tokens_reused, reuse.stats.tokens_new
    );
    assert_close(&reuse.logits, &full.logits, tolerance, id);

    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 24,
        ..SamplingParams::default()
    };
    let (reuse_answer, _) = runtime
        .run_bound(&layout, &bound, InferenceMode::Reuse, &params, &mut |_| {})
        .expect("reuse generates");
    let (full_answer, _) = runtime
        .run_bound(&layout, &bound, InferenceMode::Full, &params, &mut |_| {})
        .expect("full generates");
    eprintln!("{id} answered {:?}", reuse_answer.text);
    assert_eq!(reuse_answer.token_ids, full_answer.token_ids);
    assert!(
        reuse_answer.text.contains("Caldwell"),
        "{:?}",
        reuse_answer.text
    );
}

#[test]
fn qwen_reuse_equals_full_after_the_system_prompt() {
    reuse_equals_full(QWEN);
}

#[test]
fn gemma_reuse_equals_full_after_the_system_prompt() {
    reuse_equals_full(GEMMA);
}

/// The same conversation written as PML: the user turn's closing string is root text after the
/// module, encoded without seeing it.
#[test]
fn qwen_compiled_schema_deviation_is_reported() {
    let Some((runtime, _store)) = runtime(QWEN, WeightFormat::default()) else {
        return;
    };
    let schema_source = format!(
        "<schema name=\"observatory\">\n<system>{SYSTEM}</system>\n<user>\n\
         <module name=\"doc\">{DOCUMENT}</module>\n</user>\n</schema>"
    );
    let prompt_source =
        format!("<prompt schema=\"observatory\"><doc/><user>{QUESTION}</user></prompt>");
    let loader = MemorySourceLoader::new();
    let (schema, report) = runtime
        .compile(&schema_source, &loader, &mut |_| {})
        .expect("compiles");
    assert_eq!(report.n_encoded(), 2);
    let bound = runtime.bind(&schema, &prompt_source).expect("binds");
    let reuse = runtime
        .prefill(&schema.layout, &bound, InferenceMode::Reuse)
        .expect("reuse");
    let full = runtime
        .prefill(&schema.layout, &bound, InferenceMode::Full)
        .expect("full");
    eprintln!(
        "{QWEN} (default weights) compiled schema: reuse vs full max |Δlogit| = {:.3e}",
        max_abs_diff(&reuse.logits, &full.logits)
    );
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 24,
        ..SamplingParams::default()
    };
    let (answer, stats) = runtime
        .run(
            &schema,
            &prompt_source,
            InferenceMode::Reuse,
            &params,
            &mut |_| {},
        )
        .expect("runs");
    eprintln!("{QWEN} answered {:?}; {stats}", answer.text);
    assert!(answer.text.contains("Caldwell"), "{:?}", answer.text);
}

/// Every prompt of the travel and tutoring examples, compiled and run on Gemma in both modes:
/// recompiling stores nothing new, and each prompt's reuse-vs-full fidelity is printed (argmax
/// agreement and max logit difference; reuse is an approximation wherever a prompt imports
/// more than a prefix).
#[test]
fn gemma_runs_the_example_prompts_in_both_modes() {
    let Some((runtime, _store)) = runtime(GEMMA, WeightFormat::default()) else {
        return;
    };
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    for name in ["travel", "tutoring"] {
        let dir = examples.join(name);
        let loader = pml_compiler::FsSourceLoader::new(&dir);
        let schema_source =
            std::fs::read_to_string(dir.join(format!("{name}.pml"))).expect("schema reads");
        let (schema, report) = runtime
            .compile(&schema_source, &loader, &mut |_| {})
            .expect("compiles");
        let (_, again) = runtime
            .compile(&schema_source, &loader, &mut |_| {})
            .expect("recompiles");
        assert_eq!(again.n_encoded(), 0, "{name}: nothing changed");
        assert_eq!(again.n_reused(), report.n_encoded() + report.n_reused());
        let mut prompts: Vec<_> = std::fs::read_dir(&dir)
            .expect("example directory")
            .map(|entry| entry.expect("entry").path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("prompt-"))
            })
            .collect();
        prompts.sort();
        assert!(!prompts.is_empty());
        for path in prompts {
            let source = std::fs::read_to_string(&path).expect("prompt reads");
            let bound = runtime.bind(&schema, &source).expect("binds");
            let reuse = runtime
                .prefill(&schema.layout, &bound, InferenceMode::Reuse)
                .expect("reuse");
            let full = runtime
                .prefill(&schema.layout, &bound, InferenceMode::Full)
                .expect("full");
            let argmax = |logits: &candle_core::Tensor| {
                logits
                    .argmax(0)
                    .and_then(|index| index.to_scalar::<u32>())
                    .expect("argmax")
            };
            assert_eq!(reuse.stats.units_encoded_on_the_fly.len(), 0);
            eprintln!(
                "{name}/{}: reused {} new {}: first token {} | max |Δlogit| {:.2}",
                path.file_name()
                    .and_then(|name| name.to_str())
                    .unwrap_or("?"),
                reuse.stats.tokens_reused,
                reuse.stats.tokens_new,
                if argmax(&reuse.logits) == argmax(&full.logits) {
                    "agrees"
                } else {
                    "differs"
                },
                max_abs_diff(&reuse.logits, &full.logits)
            );
        }
    }
}

/// The Llama family (SmolLM2, Q4_1): the same exactness as the other two.
#[test]
fn smollm_reuse_equals_full_after_the_system_prompt() {
    reuse_equals_full(SMOLLM);
}
