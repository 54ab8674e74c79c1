//! The server over real HTTP on a loopback port, with the tiny random model (answers are
//! letters; only their shape and counts matter): upload and compile progress, completions
//! streamed and not, OpenAI shapes, the error statuses, queue limits, cancellation and shutdown.

mod support;

use std::time::Duration;

use pml_server::ServerConfig;
use serde_json::json;
use support::{
    EventStream, PROMPT, SCHEMA, TestServer, call, call_with_headers, captured_log,
    completion_body, json as parse,
};

#[test]
fn upload_then_complete_with_cached_modules() {
    let server = TestServer::tiny(ServerConfig::default());
    let info = server.upload_ready(SCHEMA);
    assert_eq!(info["name"], "notes");
    assert_eq!(info["units_done"], info["units_total"]);
    assert!(info["units_encoded"].as_u64() > Some(0), "{info}");

    let (status, body) = call("GET", &server.url("/v1/schemas"), None, None);
    assert_eq!(status, 200);
    assert_eq!(parse(&body)["data"][0]["name"], "notes");

    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body(PROMPT, 6, false)),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let answer = parse(&body);
    assert_eq!(answer["object"], "text_completion");
    assert!(
        answer["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("cmpl-"))
    );
    let choice = &answer["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["text"].as_str().map(str::len), Some(6), "{answer}");
    let usage = &answer["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    let cached = usage["cached_tokens"].as_u64().expect("cached_tokens");
    let new = usage["new_tokens"].as_u64().expect("new_tokens");
    assert!(cached > 0 && new > 0, "{usage}");
    assert_eq!(usage["prompt_tokens"].as_u64(), Some(cached + new));
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        Some(cached)
    );
    assert_eq!(usage["recomputed_tokens"], 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(cached + new + 6),
        "{usage}"
    );

    // Mode `full` computes every prompt token and, greedy, gives the same tokens here
    // (one module right after the prefix is exact).
    let body = json!({"prompt": PROMPT, "max_tokens": 6, "mode": "full"}).to_string();
    let (status, full) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{full}");
    let full = parse(&full);
    assert_eq!(full["usage"]["cached_tokens"], 0);
    assert_eq!(full["usage"]["new_tokens"].as_u64(), Some(cached + new));

    // Mode `blend` recomputes the requested fraction of the cached tokens.
    let body =
        json!({"prompt": PROMPT, "max_tokens": 2, "mode": "blend", "recompute": 0.5}).to_string();
    let (status, blend) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{blend}");
    let recomputed = parse(&blend)["usage"]["recomputed_tokens"]
        .as_u64()
        .expect("recomputed_tokens");
    assert!(recomputed > 0 && recomputed <= cached, "{blend}");
    let fidelity = parse(&blend)["usage"]["estimated_fidelity"]
        .as_f64()
        .expect("blend's estimate");
    assert!((0.0..=1.0).contains(&fidelity), "{blend}");

    // Under a floor of 1, an answer the repair moved at all is computed in mode `full`.
    let body = json!({"prompt": PROMPT, "max_tokens": 2, "mode": "blend", "recompute": 0.5,
        "min_fidelity": 1.0})
    .to_string();
    let (status, guarded) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{guarded}");
    let usage = &parse(&guarded)["usage"];
    if usage["fidelity_guard_fired"] == true {
        assert_eq!(usage["cached_tokens"], 0, "{guarded}");
        assert_eq!(
            usage["new_tokens"].as_u64(),
            Some(cached + new),
            "{guarded}"
        );
    } else {
        assert_eq!(usage["estimated_fidelity"].as_f64(), Some(1.0), "{guarded}");
    }

    assert!(server.metric("pml_prompt_tokens_total{origin=\"reused\"}") >= cached as f64);
    assert!(server.metric("pml_store_lookups_total{tier=\"ram\",result=\"hit\"}") >= 1.0);
    assert_eq!(server.metric("pml_time_to_first_token_seconds_count"), 4.0);
}

#[test]
fn streamed_answer_matches_the_collected_one_and_ends_in_done() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let (_, collected) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body(PROMPT, 8, false)),
        None,
    );
    let collected = parse(&collected);

    let stream = EventStream::open(
        &server.url("/v1/completions"),
        &completion_body(PROMPT, 8, true),
    );
    assert_eq!(stream.status, 200);
    assert_eq!(stream.content_type, "text/event-stream");
    let events = stream.rest();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<_> = events[..events.len() - 1]
        .iter()
        .map(|e| parse(e))
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(
        text,
        collected["choices"][0]["text"].as_str().expect("text")
    );
    // No usage unless `stream_options.include_usage` asks for it (OpenAI's rule).
    assert!(chunks.iter().all(|chunk| chunk.get("usage").is_none()));
    let last = chunks.last().expect("a final chunk");
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert!(
        chunks[..chunks.len() - 1]
            .iter()
            .all(|chunk| chunk["choices"][0]["finish_reason"].is_null())
    );

    // With it, one more chunk: no choices, the whole usage.
    let body = json!({"prompt": PROMPT, "max_tokens": 8, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let stream = EventStream::open(&server.url("/v1/completions"), &body);
    let events = stream.rest();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage_chunk = parse(&events[events.len() - 2]);
    assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 8);
    assert_eq!(
        usage_chunk["usage"]["cached_tokens"],
        collected["usage"]["cached_tokens"]
    );
}

/// `n` choices of one prompt: the prompt is computed once (the engine's count of new prompt
/// tokens grows by the prompt once, the other choices' prompts count as reused), and greedy
/// choices from the forked caches agree token for token.
#[test]
fn choices_share_one_prefill() {
    let server = TestServer::tiny(ServerConfig::default());
    let new_before = server.metric("pml_prompt_tokens_total{origin=\"new\"}");
    let reused_before = server.metric("pml_prompt_tokens_total{origin=\"reused\"}");
    let body = json!({"prompt": "choices of one prompt share its prefill", "max_tokens": 5,
                      "n": 3, "temperature": 0})
    .to_string();
    let (status, text) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    let prompt_tokens = answer["usage"]["prompt_tokens"]
        .as_f64()
        .expect("prompt_tokens");
    let texts: Vec<&str> = (0..3)
        .map(|index| answer["choices"][index]["text"].as_str().expect("text"))
        .collect();
    assert_eq!(texts.len(), 3);
    assert!(
        texts
            .iter()
            .all(|text| *text == texts[0] && text.len() == 5),
        "{answer}"
    );
    assert_eq!(answer["usage"]["completion_tokens"], 15, "{answer}");
    assert_eq!(
        answer["usage"]["shared_tokens"].as_f64(),
        Some(2.0 * prompt_tokens),
        "the two other choices took the prompt from the first: {answer}"
    );
    assert_eq!(
        server.metric("pml_prompt_tokens_total{origin=\"new\"}") - new_before,
        prompt_tokens
    );
    assert_eq!(
        server.metric("pml_prompt_tokens_total{origin=\"reused\"}") - reused_before,
        2.0 * prompt_tokens
    );
}

#[test]
fn plain_text_and_chat_completions() {
    let server = TestServer::tiny(ServerConfig::default());
    let body = json!({"prompt": "hello there", "max_tokens": 3, "stop": ["zzzz"], "seed": 3,
                      "temperature": 0.7, "top_p": 0.9})
    .to_string();
    let (status, text) = call("POST", &server.url("/v1/completions"), Some(&body), None);
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    // BOS and one token per byte: nothing cached.
    assert_eq!(answer["usage"]["prompt_tokens"], 12);
    assert_eq!(answer["usage"]["new_tokens"], 12);
    assert_eq!(answer["usage"]["cached_tokens"], 0);

    let body = json!({"model": "tiny", "max_tokens": 4, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    .to_string();
    let (status, text) = call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&body),
        None,
    );
    assert_eq!(status, 200, "{text}");
    let answer = parse(&text);
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], "tiny");
    assert_eq!(answer["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .map(str::len),
        Some(4)
    );

    let body = json!({"max_tokens": 2, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let events = EventStream::open(&server.url("/v1/chat/completions"), &body).rest();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let first = parse(&events[0]);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");

    let (status, text) = call("GET", &server.url("/health"), None, None);
    assert_eq!((status, parse(&text)["status"].clone()), (200, json!("ok")));
}

#[test]
fn bad_input_gets_400_with_diagnostics() {
    let config = ServerConfig {
        max_tokens_limit: 100,
        ..ServerConfig::default()
    };
    let server = TestServer::tiny(config);
    let broken =
        r#"<schema name="broken"><module name="a">x</module><module name="a">y</module></schema>"#;
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(broken), None);
    assert_eq!(status, 400, "{body}");
    let error = &parse(&body)["error"];
    let diagnostic = &error["diagnostics"][0];
    assert!(
        diagnostic["code"]
            .as_str()
            .is_some_and(|code| code.starts_with("PML")),
        "{body}"
    );
    assert!(diagnostic["message"].is_string());
    assert!(diagnostic["labels"][0]["span"]["start"].is_u64(), "{body}");

    // `src=` would read the server's files: refused for uploads.
    let include = r#"<schema name="inc"><module name="a" src="/etc/passwd"/></schema>"#;
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(include), None);
    assert_eq!(status, 400, "{body}");
    // An absolute path is refused as leaving the schema's folder; a relative one as a file the
    // server does not read, with help that does not send the client looking for a folder.
    let relative = r#"<schema name="inc"><module name="a" src="notes.txt"/></schema>"#;
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(relative), None);
    assert_eq!(status, 400, "{body}");
    let help = parse(&body)["error"]["diagnostics"][0]["help"].to_string();
    assert!(help.contains("instead of `src`"), "{body}");
    assert!(!help.contains("relative to the schema's folder"), "{body}");
    assert!(server.metric("pml_queue_depth") == 0.0);

    server.upload_ready(SCHEMA);
    let bad_prompt = r#"<prompt schema="notes"><nosuch/>hi</prompt>"#;
    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body(bad_prompt, 2, false)),
        None,
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        parse(&body)["error"]["diagnostics"][0]["code"].is_string(),
        "{body}"
    );

    for body in [
        "{not json".to_string(),
        completion_body("hi", 101, false),
        json!({"prompt": PROMPT, "mode": "sideways"}).to_string(),
        json!({"prompt": PROMPT, "recompute": 0.2}).to_string(),
        json!({"prompt": PROMPT, "mode": "blend", "recompute": 1.5}).to_string(),
        json!({"prompt": PROMPT, "mode": "reuse", "min_fidelity": 0.9}).to_string(),
        json!({"prompt": PROMPT, "mode": "blend", "min_fidelity": 1.5}).to_string(),
        json!({"prompt": PROMPT, "mode": "blend", "recompute": 0, "min_fidelity": 0.5}).to_string(),
        json!({"prompt": "hi", "temperature": -1.0}).to_string(),
    ] {
        let (status, text) = call("POST", &server.url("/v1/completions"), Some(&body), None);
        assert_eq!(status, 400, "{body} -> {text}");
        assert_eq!(parse(&text)["error"]["type"], "invalid_request_error");
    }
    let body = json!({"messages": [{"role": "robot", "content": "x"}]}).to_string();
    let (status, _) = call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&body),
        None,
    );
    assert_eq!(status, 400);

    // The tiny model's template teaches no tool-call format: tools are refused, by name.
    let tool = json!({"type": "function", "function": {"name": "f"}});
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": [tool]});
    let (status, text) = call(
        "POST",
        &server.url("/v1/chat/completions"),
        Some(&body.to_string()),
        None,
    );
    assert_eq!(status, 400, "{text}");
    assert_eq!(parse(&text)["error"]["param"], "tools", "{text}");
    assert_eq!(
        parse(&text)["error"]["code"],
        "unsupported_parameter",
        "{text}"
    );

    // /v1/responses: a field that asks for something is refused by name (the first by name);
    // the defaults the SDKs send (an empty `include`, `service_tier: auto`) are not.
    let responses = server.url("/v1/responses");
    let body = json!({"input": "x", "max_output_tokens": 2, "reasoning": {"effort": "low"},
                      "background": true, "include": []});
    let (status, text) = call("POST", &responses, Some(&body.to_string()), None);
    assert_eq!(status, 400, "{text}");
    assert_eq!(parse(&text)["error"]["param"], "background", "{text}");
    assert_eq!(
        parse(&text)["error"]["code"],
        "unsupported_parameter",
        "{text}"
    );
    let body = json!({"input": "x", "max_output_tokens": 2, "include": [],
                      "service_tier": "auto"});
    let (status, text) = call("POST", &responses, Some(&body.to_string()), None);
    assert_eq!(status, 200, "{text}");
}

#[test]
fn not_found_unauthorized_and_too_large() {
    let config = ServerConfig {
        admin_token: Some("s3cret".to_string()),
        max_body_bytes: 4096,
        ..ServerConfig::default()
    };
    let server = TestServer::tiny(config);
    let schemas = server.url("/v1/schemas");
    assert_eq!(call("POST", &schemas, Some(SCHEMA), None).0, 401);
    assert_eq!(call("POST", &schemas, Some(SCHEMA), Some("wrong")).0, 401);
    let (status, body) = call("POST", &schemas, Some(SCHEMA), Some("s3cret"));
    assert_eq!(status, 202, "{body}");

    let notes = server.url("/v1/schemas/notes");
    assert_eq!(call("DELETE", &notes, None, None).0, 401);
    assert_eq!(
        call("GET", &server.url("/v1/schemas/nope"), None, None).0,
        404
    );
    assert_eq!(
        call(
            "DELETE",
            &server.url("/v1/schemas/nope"),
            None,
            Some("s3cret")
        )
        .0,
        404
    );
    assert_eq!(call("GET", &server.url("/v2/nothing"), None, None).0, 404);
    let unknown = r#"<prompt schema="other">hi</prompt>"#;
    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body(unknown, 2, false)),
        None,
    );
    assert_eq!(status, 404, "{body}");

    let huge = "x".repeat(5000);
    assert_eq!(call("POST", &schemas, Some(&huge), Some("s3cret")).0, 413);
    let body = completion_body(&huge, 2, false);
    assert_eq!(
        call("POST", &server.url("/v1/completions"), Some(&body), None).0,
        413
    );

    assert_eq!(call("DELETE", &notes, None, Some("s3cret")).0, 204);
    assert_eq!(call("GET", &notes, None, None).0, 404);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let config = ServerConfig {
        max_batch: 1,
        queue_capacity: 1,
        ..ServerConfig::default()
    };
    let server = TestServer::tiny(config);
    let url = server.url("/v1/completions");
    // One request decoding (the batch is full) ...
    let mut running = EventStream::open(&url, &completion_body("long", 4000, true));
    assert!(running.next_data().is_some());
    // ... one waiting ...
    let waiting_url = url.clone();
    let waiting = std::thread::spawn(move || {
        call(
            "POST",
            &waiting_url,
            Some(&completion_body("wait", 2, false)),
            None,
        )
        .0
    });
    server.wait_for_metric("pml_queue_depth", 1.0);
    // ... and the next one is refused.
    let (status, retry_after, body) = call_with_headers(
        "POST",
        &url,
        Some(&completion_body("no room", 2, false)),
        None,
    );
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(parse(&body)["error"]["type"], "overloaded_error");
    assert_eq!(
        server.metric("pml_requests_total{outcome=\"rejected\"}"),
        1.0
    );
    drop(running);
    assert_eq!(waiting.join().expect("waiting client"), 200);
}

#[test]
fn a_dropped_stream_cancels_its_sequence() {
    let server = TestServer::tiny(ServerConfig::default());
    let mut stream = EventStream::open(
        &server.url("/v1/completions"),
        &completion_body("never read to the end", 4000, true),
    );
    assert!(stream.next_data().is_some());
    assert!(stream.next_data().is_some());
    // The gauge is published at the end of each scheduler step, after that step's tokens are
    // sent: the client can read them first.
    server.wait_for_metric("pml_active_sequences", 1.0);
    drop(stream);
    server.wait_for_metric("pml_requests_total{outcome=\"cancelled\"}", 1.0);
    server.wait_for_metric("pml_active_sequences", 0.0);
    assert_eq!(
        server.metric("pml_requests_total{outcome=\"completed\"}"),
        0.0
    );
}

#[test]
fn a_request_past_its_deadline_gets_504() {
    let config = ServerConfig {
        request_timeout: Duration::ZERO,
        ..ServerConfig::default()
    };
    let server = TestServer::tiny(config);
    let (status, body) = call(
        "POST",
        &server.url("/v1/completions"),
        Some(&completion_body("late", 2, false)),
        None,
    );
    assert_eq!(status, 504, "{body}");
    assert_eq!(
        server.metric("pml_requests_total{outcome=\"timed_out\"}"),
        1.0
    );
}

#[test]
fn shutdown_drains_in_flight_streams() {
    let mut server = TestServer::tiny(ServerConfig::default());
    let mut stream = EventStream::open(
        &server.url("/v1/completions"),
        &json!({"prompt": "drain me", "max_tokens": 200, "stream": true,
            "stream_options": {"include_usage": true}})
        .to_string(),
    );
    assert!(stream.next_data().is_some());
    let handle = server.handle.take().expect("running server");
    let stopper = std::thread::spawn(move || handle.shutdown());
    let rest = stream.rest();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let last = parse(&rest[rest.len() - 2]);
    assert_eq!(last["usage"]["completion_tokens"], 200);
    stopper.join().expect("stopper").expect("clean shutdown");
}

#[test]
fn concurrent_requests_are_batched_and_match_sequential_answers() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let prompts: Vec<String> = (0..6)
        .map(|i| match i % 2 {
            0 => PROMPT.to_string(),
            _ => format!("plain prompt number {i}"),
        })
        .collect();
    let url = server.url("/v1/completions");
    let alone: Vec<String> = prompts
        .iter()
        .map(|prompt| {
            call(
                "POST",
                &url,
                Some(&completion_body(prompt, 12, false)),
                None,
            )
            .1
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|prompt| {
                let url = &url;
                scope.spawn(move || {
                    call("POST", url, Some(&completion_body(prompt, 12, false)), None).1
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client"))
            .collect()
    });
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(
            parse(a)["choices"][0]["text"],
            parse(b)["choices"][0]["text"],
            "batched decoding changed an answer"
        );
    }
    // PML prompts' chunks and plain prompts' share the decoding rows' pass: one per step.
    let (status, metrics) = call("GET", &server.url("/metrics"), None, None);
    assert_eq!(status, 200);
    let sample = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let steps = sample("pml_engine_steps_total");
    assert!(steps > 0, "{metrics}");
    assert_eq!(sample("pml_forward_passes_total"), steps, "{metrics}");
}

#[test]
fn a_repeated_prefix_is_spliced_and_answers_as_it_would_uncached() {
    let system = "Answer in one short line, using only the notes you were given. ".repeat(8);
    let chat = |question: &str| {
        json!({"max_tokens": 8, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}]})
        .to_string()
    };
    let ask = |server: &TestServer, question: &str| {
        let (status, body) = call(
            "POST",
            &server.url("/v1/chat/completions"),
            Some(&chat(question)),
            None,
        );
        assert_eq!(status, 200, "{body}");
        parse(&body)
    };
    let server = TestServer::tiny(ServerConfig::default());
    let first = ask(&server, "What is first?");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = ask(&server, "And what comes second?");
    let prompt = second["usage"]["prompt_tokens"].as_u64().expect("prompt");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    // The system turn is shared; the questions differ: most of the prompt is spliced, in
    // whole blocks, and the rest computed.
    assert!(cached > 0 && cached % 16 == 0, "{second}");
    assert!(cached * 10 >= prompt * 6, "{cached} of {prompt}");
    assert_eq!(
        second["usage"]["new_tokens"].as_u64(),
        Some(prompt - cached),
        "{second}"
    );

    // The same question on a server without the cache: the same greedy answer.
    let uncached = TestServer::tiny(ServerConfig {
        prefix_cache_bytes: 0,
        ..ServerConfig::default()
    });
    let alone = ask(&uncached, "And what comes second?");
    assert_eq!(alone["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        second["choices"][0]["message"]["content"],
        alone["choices"][0]["message"]["content"]
    );
    // And the whole prompt once more: everything but the last block's remainder is cached.
    let again = ask(&server, "And what comes second?");
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(cached),
        "{again}"
    );
    assert_eq!(
        again["choices"][0]["message"]["content"],
        alone["choices"][0]["message"]["content"]
    );
    let hits = server.metric("pml_prefix_cache_hits_total");
    let again_cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached");
    assert_eq!(hits, (cached + again_cached) as f64);
    assert!(server.metric("pml_prefix_cache_queries_total") >= hits + prompt as f64);
    assert!(server.metric("pml_request_queue_time_seconds_count") >= 3.0);
}

#[test]
fn shutdown_cuts_off_what_outlasts_the_grace_period() {
    let mut server = TestServer::tiny(ServerConfig {
        shutdown_grace: Duration::ZERO,
        ..ServerConfig::default()
    });
    let mut stream = EventStream::open(
        &server.url("/v1/completions"),
        &json!({"prompt": "go on", "max_tokens": 4000, "stream": true}).to_string(),
    );
    assert!(stream.next_data().is_some());
    let handle = server.handle.take().expect("running server");
    let stopper = std::thread::spawn(move || handle.shutdown());
    let rest = stream.rest();
    stopper.join().expect("stopper").expect("clean shutdown");
    // Cut off, not drained: far fewer chunks than the 4000 tokens asked for (counted, not timed).
    assert!(rest.len() < 4000, "{} events after the first", rest.len());
    // The stream was cut off with an error event, not left hanging or ended as complete.
    let error = rest
        .iter()
        .rev()
        .find(|event| event.contains("\"error\""))
        .map(|event| parse(event))
        .expect("an error event");
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
}

/// A server config saving uploads in `folder`.
fn saving_in(folder: &tempfile::TempDir) -> ServerConfig {
    ServerConfig {
        saved_schemas: Some(folder.path().join("schemas")),
        ..ServerConfig::default()
    }
}

/// Stops `server`, so the next one on its folder starts from what it saved.
fn stop(server: &mut TestServer) {
    server
        .handle
        .take()
        .expect("running")
        .shutdown()
        .expect("stops");
}

#[test]
fn uploaded_schemas_survive_a_restart_and_deletions_too() {
    let folder = tempfile::TempDir::new().expect("temp dir");
    let config = || saving_in(&folder);
    let mut first = TestServer::tiny(config());
    first.upload_ready(SCHEMA);
    stop(&mut first);

    let second = TestServer::tiny(config());
    let (status, body) = call("GET", &second.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 200, "a restarted server lists the upload: {body}");
    let (status, body) = call(
        "POST",
        &second.url("/v1/completions"),
        Some(&completion_body(PROMPT, 2, false)),
        None,
    );
    assert_eq!(status, 200, "and answers on it: {body}");
    let (status, _) = call("DELETE", &second.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 204);
    drop(second);

    let third = TestServer::tiny(config());
    let (status, _) = call("GET", &third.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 404, "a deleted schema stays deleted");
}

#[test]
fn a_long_schema_name_is_refused_at_upload_and_a_saved_one_survives_a_restart() {
    let folder = tempfile::TempDir::new().expect("temp dir");
    let config = || saving_in(&folder);
    let mut first = TestServer::tiny(config());
    // Past the checker's bound: refused with the diagnostic, before anything is saved.
    let too_long = format!("<schema name=\"{}\">x</schema>", "n".repeat(300));
    let (status, body) = call("POST", &first.url("/v1/schemas"), Some(&too_long), None);
    assert_eq!(status, 400, "{body}");
    assert_eq!(parse(&body)["error"]["diagnostics"][0]["code"], "PML117");
    // The longest name allowed made a file name of 260 bytes: the upload answered 500 and was
    // gone after a restart. It is saved under a bounded file name now.
    let name = "n".repeat(128);
    let schema = SCHEMA.replacen("name=\"notes\"", &format!("name=\"{name}\""), 1);
    let (status, body) = call("POST", &first.url("/v1/schemas"), Some(&schema), None);
    assert_eq!(status, 202, "{body}");
    stop(&mut first);
    let second = TestServer::tiny(config());
    let (status, body) = call(
        "GET",
        &second.url(&format!("/v1/schemas/{name}")),
        None,
        None,
    );
    assert_eq!(status, 200, "a restarted server lists the upload: {body}");
}

#[test]
fn broken_markup_gets_a_small_answer() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let refuse = |prompt: &str| {
        let (status, body) = call(
            "POST",
            &server.url("/v1/completions"),
            Some(&completion_body(prompt, 2, false)),
            None,
        );
        assert_eq!(status, 400, "{}", &body[..body.len().min(2000)]);
        body
    };
    // A megabyte of it is more than the context could hold: refused by its size, unparsed.
    let body = refuse(&format!(
        "<prompt schema=\"notes\">{}",
        "<!--".repeat(250_000)
    ));
    assert_eq!(
        parse(&body)["error"]["code"],
        "context_length_exceeded",
        "{body}"
    );
    assert!(body.len() < 2_000, "{} bytes", body.len());
    // One diagnostic for all the unclosed comments, where there was one per `<!--`.
    let body = refuse(&format!("<prompt schema=\"notes\">{}", "<!--".repeat(500)));
    let count = parse(&body)["error"]["diagnostics"]
        .as_array()
        .map_or(0, Vec::len);
    assert!((1..=3).contains(&count), "{count} diagnostics");
    assert!(body.len() < 20_000, "{} bytes", body.len());
    // Many diagnostics of their own (each import after the first is a duplicate) are cut to the
    // first 50, and the rest counted.
    let body = refuse(&format!(
        "<prompt schema=\"notes\">{}</prompt>",
        "<notes/>".repeat(300)
    ));
    let error = &parse(&body)["error"];
    assert_eq!(error["diagnostics"].as_array().map(Vec::len), Some(50));
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("the prompt has 299 errors; 249 more diagnostics"),
        "{message}"
    );
    assert!(body.len() < 100_000, "{} bytes", body.len());
}

#[test]
fn without_a_token_a_closed_server_refuses_uploads() {
    let server = TestServer::tiny(ServerConfig {
        open_admin: false,
        ..ServerConfig::default()
    });
    let (status, body) = call("POST", &server.url("/v1/schemas"), Some(SCHEMA), None);
    assert_eq!(status, 403, "{body}");
    assert_eq!(parse(&body)["error"]["type"], "permission_error");
    let (status, _) = call("DELETE", &server.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 403);
}

#[test]
fn a_long_pml_prompt_prefills_in_chunks_and_answers_as_in_one_piece() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    // New text several prefill chunks long (128 tokens a step), after the cached module.
    let question = "what was moved and what should be brought along ".repeat(8);
    let prompt = format!(r#"<prompt schema="notes"><notes/>{question}</prompt>"#);
    let answer = |mode: &str| {
        let body = json!({"prompt": prompt, "max_tokens": 6, "mode": mode}).to_string();
        let (status, body) = call("POST", &server.url("/v1/completions"), Some(&body), None);
        assert_eq!(status, 200, "{body}");
        parse(&body)
    };
    let reuse = answer("reuse");
    let full = answer("full");
    assert!(reuse["usage"]["new_tokens"].as_u64() > Some(300), "{reuse}");
    assert!(full["usage"]["new_tokens"].as_u64() > Some(300), "{full}");
    assert_eq!(reuse["choices"][0]["text"], full["choices"][0]["text"]);
}

#[test]
fn an_internal_error_answers_its_incident_and_logs_the_detail() {
    let log = captured_log();
    let folder = tempfile::TempDir::new().expect("temp dir");
    let saved = folder.path().join("schemas");
    let server = TestServer::tiny(ServerConfig {
        saved_schemas: Some(saved.clone()),
        ..ServerConfig::default()
    });
    server.upload_ready(SCHEMA);
    // The saved copy replaced by a folder that is not empty: removing it fails on the server.
    let copy = std::fs::read_dir(&saved)
        .expect("saved schemas")
        .next()
        .expect("the saved copy")
        .expect("an entry")
        .path();
    std::fs::remove_file(&copy).expect("remove the copy");
    std::fs::create_dir(&copy).expect("a folder in its place");
    std::fs::write(copy.join("inside"), "").expect("a file inside");
    let (status, body) = call("DELETE", &server.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 500, "{body}");
    let error = &parse(&body)["error"];
    assert_eq!(error["type"], "server_error", "{body}");
    assert_eq!(error["code"], "internal_error", "{body}");
    assert!(error["param"].is_null(), "{body}");
    let message = error["message"].as_str().expect("a message");
    let incident = message
        .split("(incident ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("an incident number");
    assert_eq!(
        message,
        format!(
            "schema `notes` is unloaded but its saved copy could not be removed (it comes back at \
             the next start): internal error (incident {incident}); the server's log has the \
             details"
        )
    );
    let path = saved.display().to_string();
    assert!(!body.contains(&path), "no server path in {body}");
    assert!(!body.contains("os error"), "no OS error in {body}");

    let log = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    let line = log
        .lines()
        .find(|line| line.contains(&format!("(incident {incident}):")))
        .unwrap_or_else(|| panic!("incident {incident} is not in the log:\n{log}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&path) && line.contains("os error"), "{line}");
}

#[test]
fn a_prompt_naming_no_schema_gets_the_same_400_every_time() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let unnamed = "<prompt><notes/>When is the meeting?</prompt>";
    let ask = || {
        call(
            "POST",
            &server.url("/v1/completions"),
            Some(&completion_body(unnamed, 2, false)),
            None,
        )
    };
    // One schema loaded: bound against it, which reports what `pmlc check` reports.
    let (status, body) = ask();
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        parse(&body)["error"]["diagnostics"][0]["code"],
        "PML201",
        "{body}"
    );

    server.upload_ready(r#"<schema name="another">Other text.</schema>"#);
    let (first_status, first) = ask();
    let (second_status, second) = ask();
    assert_eq!(
        (first_status, second_status),
        (400, 400),
        "{first}\n{second}"
    );
    assert_eq!(first, second, "the same answer every time");
    let error = &parse(&first)["error"];
    assert_eq!(error["code"], "schema_ambiguous", "{first}");
    assert_eq!(error["param"], "prompt", "{first}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|message| message.contains("(another, notes)")),
        "{first}"
    );
}
