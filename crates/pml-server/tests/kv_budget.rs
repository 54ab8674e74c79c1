//! `--kv-cache-mib` on the tiny model: completions whose KV cannot all be held at once wait for
//! room and all finish, the sequences' resident KV never above the budget (the
//! `pml_kv_resident_peak_bytes` gauge), and a completion that could never fit is refused at once.

mod support;

use std::sync::Barrier;

use pml_engine::model::Arch;
use pml_runtime::testing::tiny_runtime;
use pml_server::ServerConfig;
use serde_json::json;
use support::{TestServer, call, json as parse};

/// Bytes of one KV slot of the tiny model `TestServer::tiny` serves.
fn slot_bytes() -> usize {
    let (runtime, _manifests) = tiny_runtime(Arch::Qwen2, 7);
    runtime.model().kv_layout().slot_bytes()
}

/// Eight distinct prompts of 20 letters each (21 tokens with BOS for the letter tokenizer).
fn prompts() -> Vec<String> {
    (0..8)
        .map(|i| format!("question {i} of eight ..."))
        .collect()
}

const MAX_TOKENS: usize = 40;

#[test]
fn completions_wait_for_kv_room_and_all_finish_within_the_budget() {
    let prompts = prompts();
    // The letter tokenizer: a token per byte, after BOS.
    let slots = prompts[0].len() + 1 + MAX_TOKENS + 1;
    // Room for two sequences, not three.
    let budget = slots * slot_bytes() * 5 / 2;
    let server = TestServer::tiny(ServerConfig {
        kv_cache_bytes: Some(budget),
        ..ServerConfig::default()
    });
    assert_eq!(server.metric("pml_kv_pool_bytes"), budget as f64);
    let url = server.url("/v1/completions");
    let start = Barrier::new(prompts.len());
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let (url, start) = (&url, &start);
                scope.spawn(move || {
                    let body = json!({"prompt": prompt, "max_tokens": MAX_TOKENS,
                        "temperature": 0});
                    start.wait();
                    call("POST", url, Some(&body.to_string()), None)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("client thread"))
            .collect()
    });
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert!(
            parse(body)["usage"]["completion_tokens"].as_u64() > Some(0),
            "{body}"
        );
    }
    // The engine publishes its gauges at the end of the step that sent the last answer.
    server.wait_for_metric("pml_kv_reserved_bytes", 0.0);
    let peak = server.metric("pml_kv_resident_peak_bytes");
    assert!(peak > 0.0, "the gauge saw the sequences");
    assert!(
        peak <= budget as f64,
        "peak {peak} over the budget {budget}"
    );
    assert_eq!(server.metric("pml_queue_depth"), 0.0);
}

#[test]
fn a_completion_that_can_never_fit_is_refused_at_once() {
    let budget = 30 * slot_bytes();
    let server = TestServer::tiny(ServerConfig {
        kv_cache_bytes: Some(budget),
        ..ServerConfig::default()
    });
    let fits = json!({"prompt": "short", "max_tokens": 8});
    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&fits.to_string()),
        None,
    );
    assert_eq!(status, 200, "{body}");
    for body in [
        json!({"prompt": "short", "max_tokens": 40}),
        json!({"prompt": "short", "max_tokens": 8, "n": 4}),
    ] {
        let (status, text) = call(
            "POST",
            &server.url("/v1/completions"),
            Some(&body.to_string()),
            None,
        );
        assert_eq!(status, 400, "{body} -> {text}");
        let error = &parse(&text)["error"];
        assert_eq!(error["code"], "kv_cache_budget_exceeded", "{text}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|message| message.contains("--kv-cache-mib")),
            "{text}"
        );
    }
}

/// `n` choices of one prompt hold its KV once: after the prefill the prompt's rows are shared
/// by every choice, each of which holds only its answer's rows (its reservation less the
/// prompt). Copies would hold the prompt four times.
#[test]
fn choices_hold_their_prompt_once() {
    let server = TestServer::tiny(ServerConfig::default());
    // 100 letters: 101 prompt tokens with BOS.
    let prompt = "a prompt that every one of the four choices reads: ".repeat(2);
    let prompt = &prompt[..100];
    let max_tokens = 8;
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "n": 4, "temperature": 1.0});
    let (status, text) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&body.to_string()),
        None,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(parse(&text)["choices"].as_array().map(Vec::len), Some(4));
    server.wait_for_metric("pml_kv_reserved_bytes", 0.0);
    let peak = server.metric("pml_kv_resident_peak_bytes") as usize;
    let (prompt_slots, answer_slots) = (101, max_tokens + 1);
    let shared = (prompt_slots + 4 * answer_slots) * slot_bytes();
    assert!(
        peak >= prompt_slots * slot_bytes(),
        "peak {peak}: the gauge saw the prompt"
    );
    assert!(
        peak <= shared,
        "peak {peak} bytes, over the {shared} of one prompt and four answers"
    );
}
