//! Clients that misbehave or leave, and what the server does about them (tiny model, real HTTP
//! on a loopback port): a body trickled past its deadline is answered 408, connections past the
//! bound are answered 503, a non-streaming request whose client closes is cancelled (its tokens
//! stop, its log line says so), and a client that half-closes after sending still gets its answer.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use pml_server::ServerConfig;
use serde_json::json;
use support::{TestServer, captured_log, json as parse, parse_raw};

fn read_all(stream: &mut TcpStream) -> String {
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text
}

#[test]
fn a_body_sent_too_slowly_is_answered_408() {
    let server = TestServer::tiny(ServerConfig {
        body_read_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    });
    let mut stream = server.connect();
    // A third of the body it announces, then nothing: the deadline ends the wait.
    stream
        .write_all(
            b"POST /v1/completions HTTP/1.1\r\nHost: pml\r\nContent-Type: application/json\r\n\
              Content-Length: 100000\r\n\r\n{\"prompt\": \"",
        )
        .expect("headers sent");
    let response = parse_raw(&read_all(&mut stream));
    assert_eq!(response.status, 408, "{}", response.body);
    assert!(
        response.body.contains("request_timeout"),
        "{}",
        response.body
    );
}

#[test]
fn connections_past_the_bound_are_answered_503_and_the_open_ones_served() {
    let server = TestServer::tiny(ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    });
    // Two connections that have sent nothing yet hold both places.
    let mut held: Vec<TcpStream> = (0..2).map(|_| server.connect()).collect();
    let mut third = server.connect();
    let refused = parse_raw(&read_all(&mut third));
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(
        parse(&refused.body)["error"]["code"],
        "too_many_connections"
    );
    assert_eq!(refused.header("retry-after"), Some("1"));
    // The held ones are served, and once they close, new connections are again.
    let mut first = held.remove(0);
    first
        .write_all(b"GET /health HTTP/1.1\r\nHost: pml\r\nConnection: close\r\n\r\n")
        .expect("request");
    assert_eq!(parse_raw(&read_all(&mut first)).status, 200);
    drop(held);
    let (status, _) = support::call("GET", &server.url("/health"), None, None);
    assert_eq!(status, 200);
}

#[test]
fn a_non_streaming_request_whose_client_closes_is_cancelled() {
    let log = captured_log();
    let server = TestServer::tiny(ServerConfig {
        // Any close counts as leaving (no half-close window), so the test needs no wait.
        half_close_window: Duration::ZERO,
        max_tokens_limit: 1 << 20,
        ..ServerConfig::default()
    });
    let (_, models) = support::call("GET", &server.url("/v1/models"), None, None);
    let context = parse(&models)["data"][0]["max_model_len"]
        .as_u64()
        .expect("the context");
    // As many choices as a request may ask, each as long as the context allows: far more tokens
    // than are decoded between the request's start and its client's leaving.
    let max_tokens = context - 64;
    let n = 8;
    let body = json!({"prompt": "Once upon a time", "max_tokens": max_tokens, "n": n,
        "temperature": 1.0})
    .to_string();
    let mut stream = server.connect();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: pml\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    server.wait_for_metric("pml_active_sequences", n as f64);
    drop(stream);
    server.wait_for_metric("pml_active_sequences", 0.0);
    let generated = server.metric("pml_generated_tokens_total");
    assert!(
        generated < (max_tokens * n) as f64,
        "{generated} tokens: the request ran to its end"
    );
    let written = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    assert!(
        written
            .lines()
            .any(|line| line.contains("POST /v1/completions") && line.contains("(client gone)")),
        "{written}"
    );
}

#[test]
fn a_client_that_half_closes_right_after_its_request_still_gets_the_answer() {
    let server = TestServer::tiny(ServerConfig::default());
    let body = json!({"prompt": "hello", "max_tokens": 8}).to_string();
    let mut stream = server.connect();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: pml\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("request sent");
    stream.shutdown(Shutdown::Write).expect("half-closed");
    let response = parse_raw(&read_all(&mut stream));
    assert_eq!(response.status, 200, "{}", response.body);
    assert!(
        response.body.contains("\"text_completion\""),
        "{}",
        response.body
    );
}
