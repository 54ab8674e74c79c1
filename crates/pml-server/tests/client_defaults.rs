//! What a client library configured by default meets, over real HTTP with the tiny model (one
//! token per byte, context 256): chats that name no `max_tokens` answer until their turn or the
//! context ends, every request is logged, the OpenAI fields clients send by default are taken
//! on both chat endpoints, and what is not served says so.

mod support;

use std::sync::Mutex;

use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::{EventStream, TestServer, call, captured_log, json as parse};

fn chat(server: &TestServer, body: &Value) -> (u16, Value) {
    server.post("/v1/chat/completions", body)
}

fn hi() -> Value {
    json!([{"role": "user", "content": "Count from one to ten."}])
}

#[test]
fn a_chat_without_max_tokens_answers_until_its_turn_or_the_context_ends() {
    let server = TestServer::tiny(ServerConfig {
        max_tokens_limit: 40,
        ..ServerConfig::default()
    });
    let (status, answer) = chat(&server, &json!({"messages": hi()}));
    assert_eq!(status, 200, "{answer}");
    let tokens = answer["usage"]["completion_tokens"].as_u64();
    match answer["choices"][0]["finish_reason"].as_str() {
        Some("length") => assert_eq!(tokens, Some(40), "{answer}"),
        Some("stop") => assert!(tokens.is_some_and(|tokens| tokens < 40), "{answer}"),
        other => panic!("finish_reason {other:?}: {answer}"),
    }
    assert!(
        tokens > Some(16),
        "not the legacy 16-token default: {answer}"
    );

    // Streamed alike.
    let body = json!({"messages": hi(), "stream": true, "stream_options": {"include_usage": true}});
    let events = EventStream::open(&server.url("/v1/chat/completions"), &body.to_string()).rest();
    let usage = events
        .iter()
        .rev()
        .filter(|event| *event != "[DONE]")
        .map(|event| parse(event))
        .find(|chunk| chunk["usage"].is_object())
        .expect("a usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"].as_u64(), tokens);

    // The Responses API too: not `incomplete` at 16 tokens.
    let body = json!({"input": "Count from one to ten."}).to_string();
    let (status, text) = call("POST", &server.url("/v1/responses"), Some(&body), None);
    let response = parse(&text);
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["usage"]["output_tokens"].as_u64(), tokens);

    // The legacy completions endpoint keeps OpenAI's 16.
    let body = json!({"prompt": "Count from one to ten."}).to_string();
    let (status, text) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{text}");
    assert!(parse(&text)["usage"]["completion_tokens"].as_u64() <= Some(16));
}

#[test]
fn an_open_ended_answer_stops_at_the_context_instead_of_being_refused() {
    let server = TestServer::tiny(ServerConfig {
        max_tokens_limit: 100_000,
        ..ServerConfig::default()
    });
    let (status, models) = call("GET", &server.url("/v1/models"), None, None);
    assert_eq!(status, 200);
    let context = parse(&models)["data"][0]["max_model_len"]
        .as_u64()
        .expect("the context");
    // A prompt that leaves a few dozen positions, far less than the server's limit.
    let long = "word ".repeat((context as usize - 60) / 5);
    let messages = json!([{"role": "user", "content": long}]);
    let (status, answer) = chat(&server, &json!({"messages": messages}));
    assert_eq!(status, 200, "{answer}");
    let usage = &answer["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("prompt tokens"),
        usage["completion_tokens"]
            .as_u64()
            .expect("completion tokens"),
    );
    assert!(prompt + 100 > context, "{usage}");
    match answer["choices"][0]["finish_reason"].as_str() {
        Some("length") => assert_eq!(prompt + completion, context, "{usage}"),
        Some("stop") => assert!(prompt + completion < context, "{usage}"),
        other => panic!("finish_reason {other:?}: {answer}"),
    }
    // A limit the request names is still the request's: past the context it is refused.
    let (status, error) = chat(&server, &json!({"messages": messages, "max_tokens": 100}));
    assert_eq!(status, 400, "{error}");
}

fn log_lines_with(log: &Mutex<Vec<u8>>, needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&log.lock().expect("log"))
        .lines()
        .filter(|line| line.contains(needle))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_request_is_logged_once_with_its_status_time_and_tokens() {
    let log = captured_log();
    let server = TestServer::tiny(ServerConfig::default());
    let (status, answer) = chat(
        &server,
        &json!({"messages": hi(), "max_tokens": 5, "user": "log-test"}),
    );
    assert_eq!(status, 200, "{answer}");
    let prompt = answer["usage"]["prompt_tokens"].as_u64().expect("prompt");
    let lines = log_lines_with(&log, "POST /v1/chat/completions 127.0.0.1 200 ");
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(" ms "), "{line}");
    assert!(
        line.contains(&format!(
            "prompt_tokens={prompt} cached_tokens=0 completion_tokens=5"
        )),
        "{line}"
    );

    // A stream's line counts what it sent, once it ended.
    let body = json!({"messages": hi(), "max_tokens": 3, "stream": true, "seed": 11});
    let events = EventStream::open(&server.url("/v1/chat/completions"), &body.to_string()).rest();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let streamed = log_lines_with(&log, "completion_tokens=3");
    assert_eq!(streamed.len(), 1, "{streamed:?}");

    // Refusals and other routes too, with their status.
    let (status, _) = call("GET", &server.url("/v1/nothing"), None, None);
    assert_eq!(status, 404);
    assert_eq!(
        log_lines_with(&log, "GET /v1/nothing 127.0.0.1 404 ").len(),
        1
    );
    let (status, _) = call("GET", &server.url("/health"), None, None);
    assert_eq!(status, 200);
    assert_eq!(log_lines_with(&log, "GET /health 127.0.0.1 200 ").len(), 1);
}

#[test]
fn chat_takes_the_fields_clients_send_by_default_as_responses_does() {
    let server = TestServer::tiny(ServerConfig::default());
    let metadata = json!({"session": "abc", "user_tier": "free"});
    let (status, answer) = chat(
        &server,
        &json!({"messages": hi(), "max_tokens": 2, "store": false, "metadata": metadata,
                "service_tier": "auto"}),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["metadata"], metadata);
    assert_eq!(answer["service_tier"], "default");
    let (status, _) = chat(
        &server,
        &json!({"messages": hi(), "max_tokens": 2, "store": true}),
    );
    assert_eq!(status, 200);
    for (field, value, param) in [
        ("service_tier", json!("priority"), "service_tier"),
        ("metadata", json!({"n": 1}), "metadata.n"),
    ] {
        let mut body = json!({"messages": hi(), "max_tokens": 2});
        body[field] = value;
        let (status, error) = chat(&server, &body);
        assert_eq!(status, 400, "{error}");
        assert_eq!(error["error"]["param"], param, "{error}");
    }

    // /v1/responses: the same tiers, the same metadata rules.
    let respond = |body: Value| server.post("/v1/responses", &body);
    let (status, response) = respond(json!({"input": "hi", "max_output_tokens": 2,
        "service_tier": "default", "metadata": metadata, "store": false}));
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["metadata"], metadata);
    assert_eq!(response["service_tier"], "default");
    let (status, error) = respond(json!({"input": "hi", "metadata": {"n": 1}}));
    assert_eq!(
        (status, &error["error"]["param"]),
        (400, &json!("metadata.n"))
    );
    let (status, error) = respond(json!({"input": "hi", "text": 1}));
    assert_eq!((status, &error["error"]["param"]), (400, &json!("text")));
}

#[test]
fn endpoints_this_server_does_not_serve_say_so() {
    let server = TestServer::tiny(ServerConfig::default());
    let body = json!({"model": "x", "input": "hello"}).to_string();
    let (status, text) = call("POST", &server.url("/v1/embeddings"), Some(&body), None);
    assert_eq!(status, 404, "{text}");
    let error = &parse(&text)["error"];
    assert_eq!(error["code"], "unsupported_endpoint", "{text}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|message| message.contains("does not serve embeddings")),
        "{text}"
    );
    let (status, text) = call("GET", &server.url("/v1/embeddingsx"), None, None);
    assert_eq!(status, 404, "{text}");
    assert!(parse(&text)["error"]["code"].is_null(), "{text}");
}

#[test]
fn a_schema_that_refers_to_itself_without_end_is_a_400_not_a_500() {
    let server = TestServer::tiny(ServerConfig::default());
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}});
    let (status, error) = chat(
        &server,
        &json!({"messages": hi(), "max_tokens": 4, "response_format": format}),
    );
    assert_eq!(status, 400, "{error}");
    // Streamed: refused before the stream starts.
    let body =
        json!({"messages": hi(), "max_tokens": 4, "stream": true, "response_format": format});
    let (status, error) = chat(&server, &body);
    assert_eq!(status, 400, "{error}");
}

#[test]
fn an_upload_past_the_body_limit_gets_the_json_error_shape() {
    let server = TestServer::tiny(ServerConfig {
        max_body_bytes: 1024,
        ..ServerConfig::default()
    });
    let schema = format!(
        "<schema name=\"big\"><module name=\"m\">{}</module></schema>",
        "x".repeat(4096)
    );
    let (status, text) = call("POST", &server.url("/v1/schemas"), Some(&schema), None);
    assert_eq!(status, 413, "{text}");
    assert_eq!(parse(&text)["error"]["type"], "request_too_large", "{text}");
}

#[test]
fn a_pml_prompt_opening_with_a_comment_is_bound_to_its_schema() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(support::SCHEMA);
    let prompt = format!("<!-- asked by the notes page -->\n{}", support::PROMPT);
    let (status, answer) = server.complete(&json!({"prompt": prompt, "max_tokens": 2}));
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["usage"]["cached_tokens"].as_u64() > Some(0),
        "answered as plain text: {answer}"
    );
}
