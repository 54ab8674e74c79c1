//! End to end on the real default model (skipped when it is not fetched): a schema uploaded and
//! compiled, a PML prompt answered from its cached module, a chat answered. Few tokens each.

mod support;

use pml_server::ServerConfig;
use serde_json::json;
use support::{PROMPT, SCHEMA, TestServer, call, completion_body, json as parse};

#[test]
fn the_default_model_answers_a_pml_prompt_and_a_chat() {
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    let info = server.upload_ready(SCHEMA);
    assert_eq!(info["units_encoded"], info["units_total"], "{info}");

    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body(PROMPT, 4, false)),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let answer = parse(&body);
    let text = answer["choices"][0]["text"].as_str().expect("text");
    assert!(!text.trim().is_empty(), "{answer}");
    let usage = &answer["usage"];
    assert!(usage["cached_tokens"].as_u64() > Some(10), "{usage}");
    assert!(usage["new_tokens"].as_u64() > Some(0), "{usage}");
    assert!(usage["completion_tokens"].as_u64() <= Some(4));

    let body = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Say hello."}]})
        .to_string();
    let (status, body) = call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&body),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let content = parse(&body)["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .expect("content");
    assert!(!content.trim().is_empty(), "{body}");
}
