//! Drafted decoding in the server, on the tiny random model: answers equal to the ones decoded a
//! token per step, alone and batched, the drafts counted in each answer's `usage` and in
//! `/metrics`, one pass per step; an answer given before drafted from the earlier one.

mod support;

use pml_engine::generation::Speculation;
use pml_engine::model::Arch;
use pml_runtime::testing::tiny_runtime;
use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::{TestServer, captured_log};

/// Plain prompts the tiny model's greedy answers partly repeat (it loops), so drafts of the
/// answer's own text are accepted.
fn prompts() -> Vec<String> {
    (0..4)
        .map(|i| {
            format!(
                "{} the end {i}",
                "one two three four five six ".repeat(3 + i)
            )
        })
        .collect()
}

fn body(prompt: &str, speculative: &str) -> Value {
    json!({"prompt": prompt, "max_tokens": 40, "temperature": 0, "speculative": speculative})
}

/// `usage.completion_tokens_details`' accepted and rejected drafts.
fn drafts(answer: &Value) -> (f64, f64) {
    let details = &answer["usage"]["completion_tokens_details"];
    let count = |field: &str| {
        details[field]
            .as_f64()
            .unwrap_or_else(|| panic!("no {field} in {answer}"))
    };
    (
        count("accepted_prediction_tokens"),
        count("rejected_prediction_tokens"),
    )
}

fn text(answer: &Value) -> String {
    answer["choices"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text in {answer}"))
        .to_owned()
}

#[test]
fn drafted_answers_equal_plain_ones_alone_and_batched() {
    let log = captured_log();
    let server = TestServer::tiny(ServerConfig::default());
    let plain: Vec<String> = prompts()
        .iter()
        .map(|prompt| {
            let (status, answer) = server.complete(&body(prompt, "off"));
            assert_eq!(status, 200, "{answer}");
            assert_eq!(drafts(&answer), (0.0, 0.0));
            text(&answer)
        })
        .collect();
    assert_eq!(server.metric("pml_spec_draft_tokens_total"), 0.0);
    let alone: Vec<Value> = prompts()
        .iter()
        .map(|prompt| server.complete(&body(prompt, "ngram")).1)
        .collect();
    assert_eq!(
        alone.iter().map(text).collect::<Vec<_>>(),
        plain,
        "drafting changed an answer"
    );
    let together: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = prompts()
            .into_iter()
            .map(|prompt| {
                let server = &server;
                scope.spawn(move || server.complete(&body(&prompt, "ngram")).1)
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("client"))
            .collect()
    });
    assert_eq!(
        together.iter().map(text).collect::<Vec<_>>(),
        plain,
        "drafting in a batch changed an answer"
    );
    let drafted = server.metric("pml_spec_draft_tokens_total");
    let accepted = server.metric("pml_spec_accepted_tokens_total");
    // Every answer's usage counts its own drafts: together, the server's.
    let (kept, dropped) = alone
        .iter()
        .chain(&together)
        .map(drafts)
        .fold((0.0, 0.0), |(a, r), (accepted, rejected)| {
            (a + accepted, r + rejected)
        });
    assert_eq!((kept, kept + dropped), (accepted, drafted));
    // And its request's log line.
    assert!(alone.iter().any(|answer| drafts(answer).0 > 0.0));
    let log = String::from_utf8_lossy(&log.lock().expect("log")).into_owned();
    for answer in alone.iter().filter(|answer| drafts(answer) != (0.0, 0.0)) {
        let (accepted, rejected) = drafts(answer);
        let counts = format!(
            "completion_tokens={} drafted_tokens={} accepted_tokens={accepted}",
            answer["usage"]["completion_tokens"],
            accepted + rejected
        );
        assert!(log.contains(&counts), "no line has {counts}:\n{log}");
    }
    assert!(
        accepted > 0.0,
        "no draft accepted of {drafted}: the test proves nothing"
    );
    assert!(accepted <= drafted);
    assert_eq!(
        server.metric("vllm:spec_decode_num_draft_tokens_total"),
        drafted
    );
    assert_eq!(
        server.metric("vllm:spec_decode_num_accepted_tokens_total"),
        accepted
    );
    // The drafts ride in the step's one pass.
    assert_eq!(
        server.metric("pml_forward_passes_total"),
        server.metric("pml_engine_steps_total")
    );
    // A value the field does not know is refused, not ignored.
    let (status, refused) = server.complete(&json!({"prompt": "x", "speculative": "sometimes"}));
    assert_eq!(status, 400, "{refused}");
}

/// The same question twice: the second answer is drafted from the first, every such draft
/// accepted (it follows the earlier answer where the answer's own repeats would mislead a
/// lookup), unless the server holds no earlier answers.
#[test]
fn an_answer_given_before_is_drafted_from_the_earlier_one() {
    for held in [1 << 16, 0] {
        let (runtime, _manifests) = tiny_runtime(Arch::Gemma3, 7);
        let config = ServerConfig {
            answer_draft_tokens: held,
            ..ServerConfig::default()
        };
        let server = TestServer::with_runtime(runtime, config);
        let question = "a question nobody asked before";
        let (_, first) = server.complete(&body(question, "ngram"));
        assert_eq!(server.metric("pml_spec_answer_draft_tokens_total"), 0.0);
        let (status, second) = server.complete(&body(question, "ngram"));
        assert_eq!(status, 200, "{second}");
        assert_eq!(text(&second), text(&first));
        let from_answers = server.metric("pml_spec_answer_draft_tokens_total");
        let accepted = server.metric("pml_spec_answer_accepted_tokens_total");
        if held == 0 {
            assert_eq!(from_answers, 0.0);
            continue;
        }
        assert!(from_answers > 0.0, "nothing drafted from the first answer");
        // The same greedy answer: every token drafted from it is the model's.
        assert_eq!(accepted, from_answers, "{first}\n{second}");
    }
}

/// A server with a draft model (here the model's own weights, so every draft it makes is the
/// model's greedy token) answers as it does a token per step, the draft model's drafts counted
/// apart, all accepted (how often it is asked beside the lookup depends on pass times; the
/// engine's tests show its filled cache drafting the model's tokens); a server without one
/// refuses a request for it.
#[test]
fn a_server_with_a_draft_model_answers_as_without() {
    for (arch, seed) in [(Arch::Gemma3, 7), (Arch::Phi3, 3)] {
        let (mut runtime, _manifests) = tiny_runtime(arch, seed);
        let (draft, _draft_manifests) = tiny_runtime(arch, seed);
        runtime.attach_draft_model(draft).expect("same vocabulary");
        let config = ServerConfig {
            draft_speculation: Some(Speculation::Draft {
                max_draft: 5,
                p_min: 0.0,
            }),
            // Drafts from earlier answers would be accepted too: kept out of the counts.
            answer_draft_tokens: 0,
            ..ServerConfig::default()
        };
        let server = TestServer::with_runtime(runtime, config);
        // Prompts of few repeats: the lookup finds less to draft, so the draft model is asked.
        let prompts = [
            "Quick brown foxes jump over lazy dogs",
            "Seven violet hammers sing at dawn",
            "Where does the river meet the northern sea",
        ];
        for prompt in prompts {
            let (status, plain) = server.complete(&body(prompt, "off"));
            assert_eq!(status, 200, "{plain}");
            let (status, drafted) = server.complete(&body(prompt, "draft"));
            assert_eq!(status, 200, "{drafted}");
            let what = format!("{arch:?}: {prompt}");
            assert_eq!(text(&drafted), text(&plain), "{what}");
        }
        let model_drafted = server.metric("pml_spec_model_draft_tokens_total");
        // Its own greedy tokens, computed bit for bit as the verification rows are.
        assert_eq!(
            server.metric("pml_spec_model_accepted_tokens_total"),
            model_drafted
        );
        assert!(server.metric("pml_spec_draft_tokens_total") >= model_drafted);
        assert!(
            server.metric("pml_spec_draft_tokens_total") > 0.0,
            "{arch:?}: nothing drafted"
        );
    }
    let without = TestServer::tiny(ServerConfig::default());
    let (status, refused) = without.complete(&body("x", "draft"));
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused.to_string().contains("--draft-model"),
        "the refusal names the flag: {refused}"
    );
}
