//! Two `pml serve` processes share compiled modules through Redis and nothing else (on a
//! three-node Redis Cluster too): each
//! has its own RAM and disk tiers in its own temporary folder, both name one throwaway
//! `redis-server`. The first compiles an uploaded schema; the second, given the same schema,
//! encodes no unit and answers a prompt on it from cached modules read from Redis. On
//! Gemma-3-270M (skipped with a notice when it is not fetched or `redis-server` is missing,
//! unless `PML_REQUIRE_MODELS=1`), a few tokens. Also: a port already in use is said once, with
//! what to do.

mod serve_process;
// The server crate's test client (blocking HTTP calls, JSON parsing), shared rather than copied.
#[path = "../../pml-server/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pml_testkit::fetched_model;
use pml_testkit::redis_server::{start_redis, start_redis_cluster};
use serde_json::{Value, json};
use serve_process::ServeProcess;
use support::{call, completion_body, json};

const MODEL: &str = "gemma3-270m";

const SCHEMA: &str = r#"<schema name="travel">
  <system>You answer questions about the facts below.</system>
  <module name="capitals">Paris is the capital of France. Rome is the capital of Italy.</module>
  <module name="rivers">The Seine flows through Paris. The Tiber flows through Rome.</module>
</schema>"#;

const PROMPT: &str =
    r#"<prompt schema="travel"><capitals/><rivers/>Which river flows through Rome?</prompt>"#;

/// Uploads `schema` to `server` and polls `GET /v1/schemas/{name}` until it is compiled.
fn upload_ready(server: &ServeProcess, schema: &str) -> Value {
    support::upload_ready(&server.base, schema, Duration::from_secs(60))
}

/// `pml_store_lookups_total{tier=…,result=…}` from `server`'s `/metrics`.
fn store_lookups(server: &ServeProcess, tier: &str, result: &str) -> f64 {
    let (status, text) = call("GET", &server.url("/metrics"), None, None);
    assert_eq!(status, 200, "{text}");
    let series = format!("pml_store_lookups_total{{tier=\"{tier}\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// `pml serve` of the test's model with `store`, in `dir`.
fn serve(store: &str, dir: &Path) -> ServeProcess {
    ServeProcess::start(&["--model", MODEL, "--store", store], dir)
}

#[test]
fn a_second_server_answers_from_modules_the_first_compiled_into_redis() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let Some(redis) = start_redis() else {
        return;
    };
    share_through(&redis.url());
}

#[test]
fn two_servers_share_modules_and_a_chat_prefix_through_a_redis_cluster() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let Some(cluster) = start_redis_cluster() else {
        return;
    };
    share_through(&cluster.store_url());
}

/// The first server compiles a schema and answers a chat; the second, on empty local tiers and
/// the same `redis_url`, encodes nothing, answers a prompt on the schema from modules read from
/// Redis and the chat from its prefix blocks there.
fn share_through(redis_url: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = |name: &str| {
        format!(
            "ram:64MiB,disk:{},{redis_url}",
            dir.path().join(name).display(),
        )
    };

    let first = serve(&store("disk-a"), dir.path());
    let chat = json!({"max_tokens": 3, "temperature": 0, "messages": [
        {"role": "system", "content": "You answer briefly and plainly, in one short line. ".repeat(6)},
        {"role": "user", "content": "Name a colour."}]})
    .to_string();
    let (status, first_chat) = call(
        "POST",
        &first.url("/v1/chat/completions"),
        Some(&chat),
        None,
    );
    assert_eq!(status, 200, "{first_chat}");
    let compiled = upload_ready(&first, SCHEMA);
    let total = compiled["units_total"].as_u64().expect("units_total");
    assert!(total >= 2, "{compiled}");
    assert_eq!(compiled["units_encoded"], total, "{compiled}");
    let (status, stderr) = first.stop();
    assert!(status.success(), "first server: {status}\n{stderr}");

    // Its own empty RAM and disk: whatever it does not encode comes from Redis.
    let second = serve(&store("disk-b"), dir.path());
    let loaded = upload_ready(&second, SCHEMA);
    assert_eq!(loaded["units_total"], total, "{loaded}");
    assert_eq!(
        loaded["units_encoded"], 0,
        "the second server encoded: {loaded}"
    );

    let (status, body) = call(
        "POST",
        &second.url("/v1/completions"),
        Some(&completion_body(PROMPT, 4, false)),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let answer = json(&body);
    let usage = &answer["usage"];
    assert!(usage["cached_tokens"].as_u64() > Some(10), "{usage}");
    assert_eq!(usage["recomputed_tokens"], 0, "{usage}");
    assert!(usage["completion_tokens"].as_u64() > Some(0), "{usage}");
    assert!(answer["choices"][0]["text"].as_str().is_some(), "{answer}");
    // The answer's modules were read from Redis (the local tiers started empty).
    assert!(
        store_lookups(&second, "redis", "hit") > 0.0,
        "no module read from Redis"
    );
    // A plain chat the first server answered: its prompt's blocks come from Redis too, and
    // the answer is the same.
    let (status, second_chat) = call(
        "POST",
        &second.url("/v1/chat/completions"),
        Some(&chat),
        None,
    );
    assert_eq!(status, 200, "{second_chat}");
    let (first_chat, second_chat) = (json(&first_chat), json(&second_chat));
    let cached = &second_chat["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64() >= Some(16), "{second_chat}");
    assert_eq!(
        first_chat["choices"][0]["message"]["content"],
        second_chat["choices"][0]["message"]["content"]
    );
    let (status, stderr) = second.stop();
    assert!(status.success(), "second server: {status}\n{stderr}");
}

#[test]
fn a_port_in_use_is_said_once_with_what_to_do() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().expect("address").port().to_string();
    let home = tempfile::tempdir().expect("tempdir");
    let output = Command::new(env!("CARGO_BIN_EXE_pml"))
        .args(["serve", "--model", MODEL, "--port", &port])
        .env("PML_STORE", format!("disk:{}", home.path().display()))
        .output()
        .expect("pml serve runs");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.matches("Address already in use").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("pick another with --port"), "{stderr}");
}
