//! `pml generate` end to end on the default model: the full-prefill baseline answers a simple
//! question, and stop strings cut the streamed text. Skipped (with a notice) when the model is not
//! fetched, unless `PML_REQUIRE_MODELS=1`.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

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

/// A KV budget smaller than the prompt: the prompt goes in chunks, slots are evicted, the
/// answer still comes, and the summary says what was evicted.
#[test]
fn a_kv_budget_smaller_than_the_prompt_evicts_and_answers() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let context = "The museum opened in 1901 and moved twice before the war. ".repeat(12);
    let question = format!("{context}\nWhat is the capital of France?");
    let output = pml_generate(&[
        "--chat",
        &question,
        "--max-tokens",
        "24",
        "--kv-budget",
        "96",
    ]);
    let summary = text(&output.stderr);
    eprintln!("answer: {}\nsummary: {summary}", text(&output.stdout));
    assert!(!text(&output.stdout).trim().is_empty(), "{summary}");
    let evicted: usize = summary
        .split("KV budget 96 slots (48 recent, 4 sinks): ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no eviction count in: {summary}"));
    assert!(evicted > 0, "{summary}");
}

/// A budget that cannot hold its sinks and recent slots is refused before the model loads,
/// naming the flags to change.
#[test]
fn a_budget_too_small_for_its_recent_slots_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_pml"))
        .args(["generate", "hello", "--kv-budget", "8", "--kv-recent", "8"])
        .output()
        .expect("the pml binary runs");
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("--kv-budget") && stderr.contains("--kv-recent"),
        "{stderr}"
    );
}
