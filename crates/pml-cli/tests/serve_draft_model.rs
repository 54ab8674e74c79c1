//! `pml serve --draft-model`: the tiny chat model drafting for itself drafts by default and
//! answers as it does a token per step, the draft model's drafts counted apart in `/metrics`
//! (the server crate's tests show them drafted and accepted); a draft model of other
//! end-of-turn tokens is refused at start, as a usage error.

mod serve_process;
// The server crate's test client (blocking HTTP calls, JSON parsing), shared rather than copied.
#[path = "../../pml-server/tests/support/mod.rs"]
mod support;

use std::process::Command;

use pml_engine::testing::{write_tiny_chat_gguf, write_tiny_chat_gguf_ending_on};
use serve_process::ServeProcess;
use support::{metric, post};

fn answer(server: &ServeProcess, speculative: Option<&str>) -> String {
    let mut body = serde_json::json!({
        "prompt": "one two three four five six seven eight nine ten",
        "max_tokens": 48,
        "temperature": 0,
    });
    if let Some(speculative) = speculative {
        body["speculative"] = speculative.into();
    }
    let (status, answer) = post(&server.url("/v1/completions"), &body);
    assert_eq!(status, 200, "{answer}");
    answer["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {answer}"))
        .to_owned()
}

#[test]
fn a_server_with_a_draft_model_drafts_by_default_and_answers_as_without() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_chat_gguf(&dir.path().join("tiny.gguf"), 512);
    let store = format!("disk:{}", dir.path().join("store").display());
    let args = [
        "--model",
        "tiny.gguf",
        "--draft-model",
        "tiny.gguf",
        "--draft-p-min",
        "0",
        "--draft-answers",
        "0",
        "--store",
        &store,
    ];
    let server = ServeProcess::start(&args, dir.path());
    let plain = answer(&server, Some("off"));
    assert_eq!(metric(&server.base, "pml_spec_draft_tokens_total"), 0.0);
    // With a draft model, requests draft unless they say otherwise.
    assert_eq!(answer(&server, None), plain);
    assert!(metric(&server.base, "pml_spec_draft_tokens_total") > 0.0);
    let drafted = metric(&server.base, "pml_spec_model_draft_tokens_total");
    assert_eq!(
        metric(&server.base, "pml_spec_model_accepted_tokens_total"),
        drafted,
        "the model's own drafts are all its tokens"
    );
    let (status, _) = server.stop();
    assert!(status.success());
}

#[test]
fn a_draft_model_of_other_end_tokens_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_chat_gguf(&dir.path().join("tiny.gguf"), 512);
    write_tiny_chat_gguf_ending_on(&dir.path().join("other.gguf"), 512, 1);
    let output = Command::new(env!("CARGO_BIN_EXE_pml"))
        .args(["serve", "--port", "0", "--model", "tiny.gguf"])
        .args(["--draft-model", "other.gguf"])
        .arg("--store")
        .arg(format!("disk:{}", dir.path().join("store").display()))
        .current_dir(dir.path())
        .output()
        .expect("pml serve runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--draft-model"), "{stderr}");
    assert!(stderr.contains("end-of-turn"), "{stderr}");
}
