//! Per-sequence KV budgets (H2O) in the server, on the tiny model: a plain completion whose
//! prompt and answer would hold more than its budget is computed and decoded within it — the
//! same tokens as the runtime's own heavy-hitter passes, its resident KV never above the budget —
//! whether the request names the budget (`kv_budget`) or the server sets it (`--kv-budget`);
//! a budget it never reaches changes nothing; a budget that cannot work, or one on a PML prompt,
//! is refused with a 400 naming the field. The pool's pressure valve (`--kv-pressure-budget`)
//! serves within its budget a completion `--kv-cache-mib` could never hold whole.

mod support;

use pml_engine::Tokenizer;
use pml_engine::model::Arch;
use pml_runtime::kv_budget::{HeavyHitters, KvBudget};
use pml_runtime::testing::tiny_runtime;
use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::{PROMPT as PML_PROMPT, SCHEMA, TestServer};

/// 40 letters: 41 prompt tokens with BOS for the letter tokenizer, more than the budget.
const PROMPT: &str = "a prompt longer than the budget it runs ";
const MAX_TOKENS: usize = 30;
const BUDGET: usize = 24;

/// The greedy answer of the runtime's heavy-hitter passes over the same tiny model, and each
/// token's log-probability: the prompt in one call (as the server's first step computes a
/// prompt this short), then a token a pass.
fn reference_answer(n_tokens: usize) -> (String, Vec<f32>) {
    let (runtime, _manifests) = tiny_runtime(Arch::Qwen2, 7);
    let (model, tokenizer) = (runtime.model(), runtime.tokenizer());
    let mut tokens: Vec<u32> = tokenizer.bos_token().into_iter().collect();
    tokens.extend(tokenizer.encode(PROMPT, false).expect("tokenizes"));
    assert!(
        tokens.len() > BUDGET,
        "the prompt alone overflows the budget"
    );
    let mut hitters = HeavyHitters::new(KvBudget::h2o(BUDGET, None).expect("budget"));
    let mut kv = hitters.new_cache(model).expect("cache");
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut logits = hitters
        .forward(model, &tokens, &positions, &mut kv)
        .expect("prompt");
    let (mut answer, mut logprobs) = (Vec::new(), Vec::new());
    for position in tokens.len() as u32.. {
        let row = logits.to_vec1::<f32>().expect("logits");
        let token = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .expect("a vocabulary");
        let log_sum: f32 = row.iter().map(|&logit| (logit - row[token]).exp()).sum();
        logprobs.push(-log_sum.ln());
        let token = token as u32;
        answer.push(token);
        if answer.len() == n_tokens {
            break;
        }
        logits = hitters
            .forward(model, &[token], &[position], &mut kv)
            .expect("step");
        assert!(kv.len() <= BUDGET);
    }
    (tokenizer.decode(&answer).expect("decodes"), logprobs)
}

fn slot_bytes() -> usize {
    let (runtime, _manifests) = tiny_runtime(Arch::Qwen2, 7);
    runtime.model().kv_layout().slot_bytes()
}

fn check_budgeted(server: &TestServer, body: &Value) -> String {
    let slot_bytes = slot_bytes();
    let (status, answer) = server.complete(body);
    assert_eq!(status, 200, "{answer}");
    let text = answer["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    let logprobs: Vec<f32> = answer["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .expect("logprobs")
        .iter()
        .map(|logprob| logprob.as_f64().expect("a number") as f32)
        .collect();
    assert!(!logprobs.is_empty(), "{answer}");
    // The log-probabilities tell budgets apart where the tiny model's greedy letters do not.
    let (expected_text, expected_logprobs) = reference_answer(logprobs.len());
    assert_eq!(text, expected_text, "{answer}");
    for (got, expected) in logprobs.iter().zip(&expected_logprobs) {
        assert!(
            (got - expected).abs() <= 1e-4,
            "log-probabilities {logprobs:?}, the runtime's {expected_logprobs:?}"
        );
    }
    server.wait_for_metric("pml_kv_reserved_bytes", 0.0);
    let peak = server.metric("pml_kv_resident_peak_bytes");
    assert!(peak > 0.0, "the gauge saw the sequence");
    assert!(
        peak <= (BUDGET * slot_bytes) as f64,
        "resident peak {peak} bytes over {BUDGET} slots of {slot_bytes}"
    );
    text
}

#[test]
fn a_budgeted_completion_decodes_what_the_runtimes_heavy_hitters_do_within_its_budget() {
    let asked = TestServer::tiny(ServerConfig::default());
    let body = json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "logprobs": 1, "kv_budget": BUDGET});
    let by_request = check_budgeted(&asked, &body);

    let server_default = TestServer::tiny(ServerConfig {
        kv_budget: Some(KvBudget::h2o(BUDGET, None).expect("budget")),
        ..ServerConfig::default()
    });
    let body = json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "logprobs": 1});
    assert_eq!(check_budgeted(&server_default, &body), by_request);
}

#[test]
fn the_pressure_valve_serves_within_its_budget_what_the_pool_could_never_hold() {
    let (prompt_slots, slots) = (PROMPT.len() + 1, PROMPT.len() + 1 + MAX_TOKENS + 1);
    let pool = (slots - 10) * slot_bytes();
    let body = json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
        "logprobs": 1});
    let without = TestServer::tiny(ServerConfig {
        kv_cache_bytes: Some(pool),
        ..ServerConfig::default()
    });
    let (status, refused) = without.complete(&body);
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["code"], "kv_cache_budget_exceeded");

    let server = TestServer::tiny(ServerConfig {
        kv_cache_bytes: Some(pool),
        kv_pressure_budget: Some(KvBudget::h2o(BUDGET, None).expect("budget")),
        ..ServerConfig::default()
    });
    check_budgeted(&server, &body);
    assert_eq!(server.metric("pml_kv_pressure_admissions_total"), 1.0);
    // Every prompt and answer token but the last ran; the budget holds the rest.
    let ran = prompt_slots + MAX_TOKENS - 1;
    assert!(
        server.metric("pml_kv_evicted_tokens_total") >= (ran - BUDGET) as f64,
        "evicted {}",
        server.metric("pml_kv_evicted_tokens_total")
    );
    // One that fits whole is not squeezed.
    let (status, answer) = server.complete(&json!({"prompt": "short", "max_tokens": 4}));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(server.metric("pml_kv_pressure_admissions_total"), 1.0);
}

#[test]
fn a_budget_never_reached_changes_nothing() {
    let server = TestServer::tiny(ServerConfig::default());
    let plain = json!({"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0});
    let mut roomy = plain.clone();
    roomy["kv_budget"] = json!(PROMPT.len() + 1 + MAX_TOKENS + 1);
    let (status, unbounded) = server.complete(&plain);
    assert_eq!(status, 200, "{unbounded}");
    let (status, bounded) = server.complete(&roomy);
    assert_eq!(status, 200, "{bounded}");
    assert_eq!(
        bounded["choices"][0]["text"],
        unbounded["choices"][0]["text"]
    );
    // Not budgeted, so it read the first answer's prompt blocks from the prefix cache.
    assert!(
        bounded["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "{bounded}"
    );
}

#[test]
fn budgets_that_cannot_apply_are_refused_naming_the_field() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    for (body, says) in [
        (json!({"prompt": PROMPT, "kv_budget": 8}), "at least 9"),
        (
            json!({"prompt": PML_PROMPT, "kv_budget": BUDGET}),
            "plain prompts and chats",
        ),
    ] {
        let (status, answer) = server.complete(&body);
        assert_eq!(status, 400, "{body} -> {answer}");
        let error = &answer["error"];
        assert_eq!(error["param"], "kv_budget", "{answer}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|message| message.contains(says)),
            "{answer}"
        );
    }
    // The smallest budget that works is served.
    let (status, answer) = server.complete(&json!({"prompt": PROMPT, "kv_budget": 9}));
    assert_eq!(status, 200, "{answer}");
}
