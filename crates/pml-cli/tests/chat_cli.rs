//! `pml chat` and the model's context, on the default model (skipped with a notice when it is
//! not fetched, unless `PML_REQUIRE_MODELS=1`): with `--kv-budget` a conversation run past its
//! context (`-c`) keeps answering, never holding more slots than the budget; without one the
//! turn that does not fit is refused, naming the flag; with a draft model the answers are the
//! ones without.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

use pml_models::DEFAULT_MODEL_ID;
use pml_testkit::cli::{assert_ok, run, text};
use pml_testkit::fetched_model;

const TURNS: &str = "What is the capital of France?\nAnd of Italy?\nAnd of Spain?\n\
    And of Germany?\nAnd of Portugal?\nAnd of Austria?\nAnd of Japan?\nAnd of Egypt?\n";

fn chat(extra: &[&str]) -> std::process::Output {
    chat_within("128", extra)
}

/// [`chat`] with a context of `ctx_size` positions.
fn chat_within(ctx_size: &str, extra: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("disk:{}", dir.path().join("store").display());
    let mut args = vec![
        "chat",
        "--store",
        &store,
        "--max-tokens",
        "24",
        "--temperature",
        "0",
        "-c",
        ctx_size,
    ];
    args.extend(extra);
    run(env!("CARGO_BIN_EXE_pml"), &args, Some(TURNS), dir.path())
}

/// Slots held after each turn, from the status lines (`KV n of 96 slots`).
fn held_slots(stderr: &str) -> Vec<usize> {
    stderr
        .lines()
        .filter_map(|line| line.split("| KV ").nth(1))
        .map(|rest| {
            let (held, rest) = rest.split_once(" of ").expect("`KV n of m slots`");
            assert!(rest.starts_with("96 slots"), "{rest}");
            held.parse().expect("a slot count")
        })
        .collect()
}

#[test]
fn a_chat_within_a_kv_budget_goes_on_past_its_context() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let output = chat(&["--kv-budget", "96"]);
    assert_ok(&output, "pml chat --kv-budget");
    let stderr = text(&output.stderr);
    let answers = text(&output.stdout);
    eprintln!("{answers}\n{stderr}");
    let held = held_slots(&stderr);
    assert_eq!(held.len(), 8, "one status line per turn:\n{stderr}");
    assert!(held.iter().all(|&slots| slots <= 96), "{held:?}");
    assert!(stderr.contains("moved to position 0"), "{stderr}");
    assert!(answers.contains("Paris"), "{answers}");
    assert!(
        answers.contains("Cairo"),
        "the last turn, past the context: {answers}"
    );
    let blank_separated = answers.split("\n\n").filter(|a| !a.trim().is_empty());
    assert_eq!(blank_separated.count(), 8, "{answers}");
}

#[test]
fn without_a_budget_a_chat_ends_at_its_context() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let output = chat(&[]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("the conversation is full"), "{stderr}");
    assert!(stderr.contains("--kv-budget"), "{stderr}");
    assert!(
        text(&output.stdout).contains("Paris"),
        "the turns that fit are answered"
    );
}

/// `pml chat ARGS` on no input is refused as a misuse (exit 2) before any model loads, the
/// message naming `flag`.
fn assert_refused_naming(args: &[&str], flag: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = run(env!("CARGO_BIN_EXE_pml"), args, Some(""), dir.path());
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains(flag));
}

/// A budget that cannot hold its sinks and recent slots is refused before the model loads.
#[test]
fn a_budget_too_small_for_its_recent_slots_is_refused() {
    assert_refused_naming(
        &["chat", "--kv-budget", "8", "--kv-recent", "8"],
        "--kv-recent",
    );
}

/// A budget larger than the context it may use is refused, naming the most it may be.
#[test]
fn a_budget_past_the_context_is_refused() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let output = chat(&["--kv-budget", "200"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("does not fit a context of 128 positions"),
        "{stderr}"
    );
}

/// The default model drafting for itself (the same vocabulary): the answers are the ones
/// without drafts, and each turn's line counts what was drafted.
#[test]
fn a_chat_with_a_draft_model_answers_as_without_one() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let plain = chat_within("1024", &["--speculative", "off"]);
    assert_ok(&plain, "pml chat --speculative off");
    let drafted = chat_within("1024", &["--draft-model", DEFAULT_MODEL_ID]);
    assert_ok(&drafted, "pml chat --draft-model");
    let stderr = text(&drafted.stderr);
    assert_eq!(text(&drafted.stdout), text(&plain.stdout), "{stderr}");
    let counted = stderr
        .lines()
        .filter(|line| line.starts_with("turn ") && line.contains(" | drafted "))
        .count();
    assert!(counted > 0, "{stderr}");
}

/// Within a KV budget each step is a pass of one token: a draft model is refused before any
/// model loads.
#[test]
fn a_draft_model_within_a_kv_budget_is_refused() {
    assert_refused_naming(
        &["chat", "--kv-budget", "96", "--draft-model", "qwen2.5-0.5b"],
        "--kv-budget",
    );
}
