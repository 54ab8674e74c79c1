//! `pml generate` end to end on the default model: the full-prefill baseline answers a simple
//! question, and stop strings cut the streamed text. Skipped (with a notice) when the model is not
//! fetched, unless `PML_REQUIRE_MODELS=1`.

use std::process::{Command, Output};

use pml_models::DEFAULT_MODEL_ID;
use pml_testkit::fetched_model;

fn pml_generate(args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_pml"))
        .arg("generate")
        .args(args)
        .output()
        .expect("the pml binary runs");
    assert!(
        output.status.success(),
        "pml generate {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("pml writes UTF-8")
}

#[test]
fn chat_answers_the_capital_of_france() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let output = pml_generate(&[
        "--chat",
        "What is the capital of France?",
        "--max-tokens",
        "32",
    ]);
    let answer = text(&output.stdout);
    let summary = text(&output.stderr);
    eprintln!("answer: {answer}\nsummary: {summary}");
    assert!(answer.contains("Paris"), "answer: {answer}");
    assert!(
        summary.contains(&format!("model {DEFAULT_MODEL_ID}")),
        "{summary}"
    );
    assert!(summary.contains("TTFT"), "{summary}");
}

#[test]
fn a_stop_string_cuts_the_answer_before_it() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let prompt = "The capital of France is";
    let full = text(&pml_generate(&[prompt, "--max-tokens", "8", "--no-stream"]).stdout);
    assert!(full.contains("Paris."), "completion: {full}");
    let output = pml_generate(&[prompt, "--max-tokens", "8", "--stop", "."]);
    let answer = text(&output.stdout);
    assert_eq!(
        answer.trim_end(),
        full[..full.find('.').unwrap()].trim_end()
    );
    assert!(text(&output.stderr).contains("finish stop"));
}
