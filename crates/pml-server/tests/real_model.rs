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

    // `/tokenize` shows the prompt a request with tools renders to (the Qwen template's).
    let tokenize = |body: serde_json::Value| {
        let (status, text) = call(
            "POST",
            &server.url("/tokenize"),
            Some(&body.to_string()),
            None,
        );
        assert_eq!(status, 200, "{text}");
        parse(&text)["count"].as_u64().expect("count")
    };
    let messages = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let tool = json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
    let plain = tokenize(json!({"messages": messages}));
    let with_tools = tokenize(json!({"messages": messages, "tools": [tool]}));
    assert!(with_tools > plain + 20, "{with_tools} vs {plain}");
}

/// A chat's third turn sends both earlier answers back in its prompt. Each answer's blocks were
/// kept when it finished, so the turn reuses everything before its new message but the last
/// partial block: at least the second turn's prompt and completion less one block (the
/// prompts' own blocks would stop short of the second answer). Needs a real tokenizer, whose
/// template re-renders an answer as the tokens that were generated.
#[test]
fn a_chats_third_turn_reuses_the_earlier_answers() {
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    let ask = |messages: &[serde_json::Value]| {
        let body = json!({"max_tokens": 24, "temperature": 0, "messages": messages}).to_string();
        let (status, text) = call(
            "POST",
            &server.url("/v1/chat/completions"),
            Some(&body),
            None,
        );
        assert_eq!(status, 200, "{text}");
        parse(&text)
    };
    let mut turns = vec![
        json!({"role": "system", "content": "You are a concise assistant."}),
        json!({"role": "user", "content": "Name three rivers in Europe."}),
    ];
    let mut last = None;
    for question in [
        "Which of them is the longest?",
        "Which countries does it cross?",
    ] {
        let answer = ask(&turns);
        turns.push(json!({"role": "assistant",
                          "content": answer["choices"][0]["message"]["content"].clone()}));
        turns.push(json!({"role": "user", "content": question}));
        last = Some(answer);
    }
    let second = last.expect("two turns");
    let third = ask(&turns);
    let usage = |answer: &serde_json::Value, field: &str| {
        answer["usage"][field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field}: {answer}"))
    };
    let cached = third["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    let before = usage(&second, "prompt_tokens") + usage(&second, "completion_tokens");
    assert!(
        cached + 16 >= before,
        "third turn: {cached} cached of a second turn of {before} tokens: {third}"
    );
}

/// Every agent framework's default, `tool_choice: auto`: the 0.5B model writes its call as a
/// fenced or bare object rather than in tags, which the lazy grammar holds to the tool's schema
/// and the reader takes as the call (it came back as text before).
#[test]
fn an_auto_tool_call_comes_back_as_a_call_on_the_default_model() {
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    let weather = json!({"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"]}}});
    let calls = (0..10)
        .filter(|seed| {
            let body = json!({"messages": [{"role": "user",
                "content": "What is the weather in Paris?"}], "tools": [weather.clone()],
                "tool_choice": "auto", "seed": seed, "max_tokens": 96});
            let (status, answer) = server.post("/v1/chat/completions", &body);
            assert_eq!(status, 200, "{answer}");
            let choice = &answer["choices"][0];
            let call = &choice["message"]["tool_calls"][0]["function"];
            let called = choice["finish_reason"] == "tool_calls"
                && call["name"] == "get_weather"
                && call["arguments"]
                    .as_str()
                    .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                    .is_some_and(|arguments| arguments["city"].is_string());
            if !called {
                eprintln!("seed {seed}: no call: {}", choice["message"]);
            }
            called
        })
        .count();
    assert!(calls >= 9, "{calls} of 10 seeded runs called the tool");
}
