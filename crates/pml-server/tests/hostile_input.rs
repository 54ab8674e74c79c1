//! Inputs and clients that once stalled or broke the server, each answered at once now, with the
//! other requests unaffected (tiny model, real HTTP on a loopback port): a schema whose encoding
//! takes long, connections that send their headers slowly or half-close after sending.

mod support;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use pml_server::ServerConfig;
use serde_json::json;
use support::{EventStream, TestServer, call, json as parse};

/// A union of `members` small modules: one unit each, all at the same positions.
fn union_schema(name: &str, members: usize) -> String {
    let modules: String = (0..members)
        .map(|index| format!("<module name=\"m{index}\">Fact number {index}.</module>"))
        .collect();
    format!("<schema name=\"{name}\">Facts:<union>{modules}</union></schema>")
}

fn chat(server: &TestServer) -> (u16, String) {
    let body = json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&body.to_string()),
        None,
    )
}

#[test]
fn a_schema_encodes_between_completions_and_can_be_deleted_meanwhile() {
    let server = TestServer::tiny(ServerConfig::default());
    let (status, body) = call(
        "POST",
        &server.url("/v1/schemas"),
        Some(&union_schema("many", 3000)),
        None,
    );
    assert_eq!(status, 202, "{body}");
    // Encoded a piece per engine step: the chat is answered while most units are still to do.
    let (status, answer) = chat(&server);
    assert_eq!(status, 200, "{answer}");
    let (status, info) = call("GET", &server.url("/v1/schemas/many"), None, None);
    assert_eq!(status, 200, "{info}");
    let info = parse(&info);
    assert_ne!(info["status"], "ready", "{info}");
    assert!(
        info["units_done"].as_u64() < info["units_total"].as_u64(),
        "{info}"
    );
    // Deleting it needs no wait for the encoding either.
    let (status, body) = call("DELETE", &server.url("/v1/schemas/many"), None, None);
    assert!((200..300).contains(&status), "{status} {body}");
    let (status, _) = call("GET", &server.url("/v1/schemas/many"), None, None);
    assert_eq!(status, 404);
    let (status, answer) = chat(&server);
    assert_eq!(status, 200, "{answer}");
}

/// While a completion streams, an upload's modules are computed inside its steps: their rows
/// join the step's one forward pass instead of running passes of their own between its tokens.
#[test]
fn an_encoding_beside_a_stream_joins_its_steps() {
    let server = TestServer::tiny(ServerConfig::default());
    let (status, body) = call(
        "POST",
        &server.url("/v1/schemas"),
        Some(&union_schema("busy", 3000)),
        None,
    );
    assert_eq!(status, 202, "{body}");
    let request = json!({"prompt": "hello", "max_tokens": 24, "stream": true}).to_string();
    let stream = EventStream::open(&server.url("/v1/completions"), &request);
    assert_eq!(stream.status, 200);
    let events = stream.rest();
    assert!(events.len() > 2, "{events:?}");
    let (_, info) = call("GET", &server.url("/v1/schemas/busy"), None, None);
    assert_ne!(
        parse(&info)["status"],
        "ready",
        "the stream outlasted the encoding: {info}"
    );
    assert!(
        server.metric("pml_encode_joined_tokens_total") > 0.0,
        "no module token was computed in the stream's steps"
    );
    // Still one pass a step: the encoding's rows are in the pass, not beside it.
    assert_eq!(
        server.metric("pml_forward_passes_total"),
        server.metric("pml_engine_steps_total")
    );
    let (status, _) = call("DELETE", &server.url("/v1/schemas/busy"), None, None);
    assert!((200..300).contains(&status));
}

#[test]
fn a_schema_of_more_units_than_the_server_takes_is_refused_at_upload() {
    let server = TestServer::tiny(ServerConfig {
        max_schema_units: 10,
        ..ServerConfig::default()
    });
    let (status, body) = call(
        "POST",
        &server.url("/v1/schemas"),
        Some(&union_schema("wide", 20)),
        None,
    );
    assert_eq!(status, 400, "{body}");
    let message = parse(&body)["error"]["message"].to_string();
    assert!(
        message.contains("21 units") && message.contains("--max-schema-units"),
        "{body}"
    );
    let (status, _) = call("GET", &server.url("/v1/schemas/wide"), None, None);
    assert_eq!(status, 404);
}

#[test]
fn a_client_sending_its_headers_slowly_is_cut_off_and_others_are_served() {
    let server = TestServer::tiny(ServerConfig {
        header_read_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let mut slow = server.connect();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: pml\r\n")
        .expect("a first header");
    let (status, _) = chat(&server);
    assert_eq!(status, 200);
    // The server closes the connection: the read ends (no bytes, or a reset), it does not time out.
    let mut buffer = Vec::new();
    match slow.read_to_end(&mut buffer) {
        Ok(_) => {}
        Err(error) => assert!(
            !matches!(
                error.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "still open: {error}"
        ),
    }
}

#[test]
fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let server = TestServer::tiny(ServerConfig::default());
    let body = json!({"prompt": "hello", "max_tokens": 2}).to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: pml\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = server.connect();
    stream.write_all(request.as_bytes()).expect("request sent");
    stream.shutdown(Shutdown::Write).expect("half-closed");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("the answer");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("\"text_completion\""), "{response}");
}

#[test]
fn a_prompt_past_the_context_is_refused_before_it_is_tokenized_or_computed() {
    let server = TestServer::tiny(ServerConfig {
        max_body_bytes: 64 << 20,
        ..ServerConfig::default()
    });
    // Far more bytes than the context could hold at its longest token.
    let text = "z".repeat(32 << 20);
    let body = json!({"prompt": text, "max_tokens": 1}).to_string();
    let (status, answer) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 400, "{answer}");
    let error = &parse(&answer)["error"];
    assert_eq!(error["code"], "context_length_exceeded", "{answer}");
    assert!(error["message"].to_string().contains("PML306"), "{answer}");
    let chat = json!({"max_tokens": 1, "messages": [{"role": "user", "content": text}]});
    let (status, answer) = call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&chat.to_string()),
        None,
    );
    assert_eq!(status, 400, "{answer}");

    // A collection member imported until its positions outgrow the context: refused by its
    // positions, though its tokens alone would fit.
    let schema = "<schema name=\"lib\"><collection name=\"docs\"><module name=\"note\">A short \
                  note on the weather in spring.</module></collection></schema>";
    server.upload_ready(schema);
    let (status, models) = call("GET", &server.url("/v1/models"), None, None);
    assert_eq!(status, 200);
    let context = parse(&models)["data"][0]["max_model_len"]
        .as_u64()
        .expect("the context") as usize;
    let prompt = format!(
        "<prompt schema=\"lib\">{}Which season?</prompt>",
        "<note/>".repeat(context / 20)
    );
    let (status, answer) = server.complete(&json!({"prompt": prompt, "max_tokens": 1}));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"]["code"], "context_length_exceeded",
        "{answer}"
    );
}

#[test]
fn an_upload_past_the_source_limit_is_refused_unparsed() {
    let server = TestServer::tiny(ServerConfig {
        max_body_bytes: 64 << 20,
        ..ServerConfig::default()
    });
    let module = "<module name=\"m\">x</module>";
    let schema = format!(
        "<schema name=\"huge\">{}</schema>",
        module.repeat((pml_compiler::MAX_SOURCE_BYTES as usize) / module.len() + 1)
    );
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(&schema), None);
    assert_eq!(status, 413, "{body}");
    let error = &parse(&body)["error"];
    assert_eq!(error["type"], "request_too_large", "{body}");
    assert!(error["message"].to_string().contains("PML307"), "{body}");
}
