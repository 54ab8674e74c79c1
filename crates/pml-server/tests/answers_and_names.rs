//! What clients read in answers (tiny models, real HTTP on a loopback port): an answer of no
//! tokens is still a message in `/v1/responses`, the model answers under any name and
//! `/v1/models` agrees, `/v1/pml/check` answers a flood of diagnostics with the first few and a
//! count, and an upload the server cannot save for its next start is accepted with a warning.

mod support;

use pml_engine::testing::write_tiny_chat_gguf_ending_on;
use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::{SCHEMA, TestServer, call, json as parse};

#[test]
fn an_answer_of_no_tokens_is_an_empty_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("tiny.gguf");
    // The seeded model's first answer token is its end of text: every answer is empty.
    write_tiny_chat_gguf_ending_on(&model, 512, b'\n');
    let server = TestServer::from_gguf(&model, ServerConfig::default());
    let (status, answer) = server.post(
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 4}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["output_tokens"], 0, "{answer}");
    let output = answer["output"].as_array().expect("output items");
    assert_eq!(output.len(), 1, "{answer}");
    assert_eq!(output[0]["type"], "message", "{answer}");
    assert_eq!(output[0]["role"], "assistant", "{answer}");
    assert_eq!(output[0]["content"][0]["type"], "output_text", "{answer}");
    assert_eq!(output[0]["content"][0]["text"], "", "{answer}");
    assert_eq!(answer["status"], "completed", "{answer}");
}

#[test]
fn any_model_name_is_answered_and_found() {
    let server = TestServer::tiny(ServerConfig {
        model_name: "qwen2.5-0.5b".to_string(),
        model_aliases: vec!["qwen2.5-coder-0.5b".to_string()],
        ..ServerConfig::default()
    });
    let (status, list) = call("GET", &server.url("/v1/models"), None, None);
    assert_eq!(status, 200);
    let ids: Vec<Value> = parse(&list)["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|model| model["id"].clone())
        .collect();
    assert_eq!(ids, [json!("qwen2.5-0.5b"), json!("qwen2.5-coder-0.5b")]);
    let (status, answer) = server.complete(&json!({"model": "gpt-4o-mini", "prompt": "hi",
        "max_tokens": 1}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "gpt-4o-mini");
    for id in ["gpt-4o-mini", "qwen2.5-coder-0.5b"] {
        let (status, card) = call("GET", &server.url(&format!("/v1/models/{id}")), None, None);
        assert_eq!(status, 200, "{card}");
        let card = parse(&card);
        assert_eq!(card["id"], id);
        assert_eq!(card["root"], "qwen2.5-0.5b");
    }
}

#[test]
fn a_flood_of_diagnostics_is_answered_with_the_first_and_a_count() {
    let server = TestServer::tiny(ServerConfig {
        max_body_bytes: 8 << 20,
        ..ServerConfig::default()
    });
    // One line of 50,000 unknown entities: each a diagnostic.
    let schema = format!(
        "<schema name=\"lol\"><module name=\"m\">{}</module></schema>",
        "&lol9;".repeat(50_000)
    );
    let (status, body) = server.post("/v1/pml/check", &json!({"schema": schema}));
    assert_eq!(status, 200, "{body}");
    let checked = &body["schema"];
    let shown = checked["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .len();
    assert_eq!(shown, 200, "{checked}");
    let omitted = checked["omitted"].as_u64().expect("omitted");
    assert!(omitted >= 49_000, "{omitted}");
    let counted =
        checked["errors"].as_u64().unwrap_or(0) + checked["warnings"].as_u64().unwrap_or(0);
    assert_eq!(
        counted,
        shown as u64 + omitted,
        "{}",
        checked["diagnostics"][0]
    );
    assert!(
        body.to_string().len() < 200_000,
        "{} bytes",
        body.to_string().len()
    );
    // The last one shown is on line 1, at its character column.
    let last = &checked["diagnostics"][199]["labels"][0];
    assert_eq!(last["line"], 1);
    let span_start = last["span"]["start"].as_u64().expect("span");
    assert_eq!(last["column"].as_u64(), Some(span_start + 1));
}

#[test]
fn an_upload_that_cannot_be_saved_is_accepted_with_a_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A folder that cannot be created, even by root: its parent is a file.
    let file = dir.path().join("file");
    std::fs::write(&file, "").expect("a file");
    let server = TestServer::tiny(ServerConfig {
        saved_schemas: Some(file.join("schemas")),
        ..ServerConfig::default()
    });
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(SCHEMA), None);
    assert_eq!(status, 202, "{body}");
    let info = parse(&body);
    assert_eq!(info["name"], "notes");
    let warning = info["warning"].as_str().expect("a warning");
    assert!(warning.contains("could not be saved"), "{warning}");
    server.upload_ready(SCHEMA);
    let (status, answer) = server.complete(&json!({"prompt": support::PROMPT, "max_tokens": 2}));
    assert_eq!(status, 200, "{answer}");
}
