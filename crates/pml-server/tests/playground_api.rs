//! What the playground page reads, through HTTP on the tiny model: `/v1/pml/check` (a schema's
//! and a prompt's diagnostics with codes and spans; refusals), a loaded schema's `/source` and
//! `/layout`, `prompt_token_kinds` on a completion, and the page itself (`--no-ui` removes it).

mod support;

use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::{PROMPT, SCHEMA, TestServer, call, json};

fn check(server: &TestServer, body: &Value) -> (u16, Value) {
    server.post("/v1/pml/check", body)
}

#[test]
fn check_reports_codes_spans_and_hints_for_schema_and_prompt() {
    let server = TestServer::tiny(ServerConfig::default());
    let (status, clean) = check(&server, &json!({"schema": SCHEMA, "prompt": PROMPT}));
    assert_eq!(status, 200, "{clean}");
    assert_eq!(clean["schema"]["kind"], "schema");
    assert_eq!(clean["prompt"]["kind"], "prompt");
    assert_eq!(clean["schema"]["diagnostics"], json!([]));
    assert_eq!(clean["prompt"]["diagnostics"], json!([]));

    // A prompt importing a module the schema lacks: PML205 on the tag, with a hint.
    let prompt = r#"<prompt schema="notes"><nots/>When?</prompt>"#;
    let (status, checked) = check(&server, &json!({"schema": SCHEMA, "prompt": prompt}));
    assert_eq!(status, 200, "{checked}");
    let diagnostic = &checked["prompt"]["diagnostics"][0];
    assert_eq!(diagnostic["code"], "PML205", "{checked}");
    assert_eq!(checked["prompt"]["errors"], 1);
    let span = &diagnostic["labels"][0]["span"];
    let (start, end) = (
        span["start"].as_u64().unwrap(),
        span["end"].as_u64().unwrap(),
    );
    assert!(
        prompt[start as usize..end as usize].contains("nots"),
        "{span}"
    );
    assert!(
        diagnostic["help"].as_str().unwrap().contains("notes"),
        "{diagnostic}"
    );

    // A prompt alone is checked against no schema, and says where it looked.
    let (_, alone) = check(&server, &json!({"prompt": PROMPT}));
    let message = alone["prompt"]["diagnostics"][0].to_string();
    assert!(message.contains("the request's `schema` field"), "{alone}");

    // A schema with a syntax error; `src=` is refused rather than read from the server's files.
    let broken = r#"<schema name="x"><module name="a" src="/etc/passwd"/></schema>"#;
    let (_, refused) = check(&server, &json!({"schema": broken}));
    assert!(
        refused["schema"]["errors"].as_u64().unwrap() >= 1,
        "{refused}"
    );
    assert!(!refused.to_string().contains("root:"), "{refused}");
}

#[test]
fn check_refuses_what_it_cannot_check() {
    let server = TestServer::tiny(ServerConfig::default());
    let (status, body) = check(&server, &json!({}));
    assert_eq!(status, 400, "{body}");
    let (status, body) = check(&server, &json!({"schema": SCHEMA, "other": 1}));
    assert_eq!(status, 400, "{body}");
    let huge = "x".repeat(17 << 20);
    let config = ServerConfig {
        max_body_bytes: 64 << 20,
        ..ServerConfig::default()
    };
    let roomy = TestServer::tiny(config);
    let (status, body) = check(&roomy, &json!({"schema": huge}));
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["param"], "schema", "{body}");
}

#[test]
fn a_loaded_schema_shows_its_source_and_layout() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let (status, source) = call("GET", &server.url("/v1/schemas/notes/source"), None, None);
    assert_eq!(status, 200);
    assert_eq!(source, SCHEMA);
    let (status, layout) = call("GET", &server.url("/v1/schemas/notes/layout"), None, None);
    assert_eq!(status, 200, "{layout}");
    let layout = json(&layout);
    let units = layout["units"].as_array().expect("units");
    assert_eq!(units.len(), 2, "{layout}");
    assert_eq!(units[0]["name"], "(root)");
    assert_eq!(units[1]["name"], "notes");
    for unit in units {
        // Compiled: each state is in the store's fastest tier.
        assert_eq!(unit["tier"], "ram", "{layout}");
        assert!(unit["end"].as_u64() > unit["start"].as_u64(), "{unit}");
    }
    assert!(layout["positions"].as_u64().unwrap() >= units[1]["end"].as_u64().unwrap());
    for path in ["/v1/schemas/nope/source", "/v1/schemas/nope/layout"] {
        let (status, body) = call("GET", &server.url(path), None, None);
        assert_eq!(status, 404, "{path}: {body}");
    }
}

#[test]
fn a_completion_lists_its_prompt_tokens_by_kind_when_asked() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    for mode in ["reuse", "blend", "full"] {
        let (status, body) = server.complete(&json!({
            "prompt": PROMPT, "mode": mode, "max_tokens": 2, "prompt_token_kinds": true
        }));
        assert_eq!(status, 200, "{body}");
        let usage = &body["usage"];
        let kinds = usage["prompt_token_kinds"].as_array().expect("kinds");
        assert_eq!(kinds.len() as u64, usage["prompt_tokens"].as_u64().unwrap());
        let count = |kind: &str| kinds.iter().filter(|pair| pair[1] == kind).count() as u64;
        assert_eq!(
            count("reused"),
            usage["cached_tokens"].as_u64().unwrap(),
            "{mode}"
        );
        assert_eq!(
            count("recomputed"),
            usage["recomputed_tokens"].as_u64().unwrap()
        );
        assert_eq!(
            count("new"),
            usage["new_tokens"].as_u64().unwrap(),
            "{mode}"
        );
        // Each token's text (the tiny model's vocabulary spells nonsense, but every token some).
        assert!(
            kinds
                .iter()
                .all(|pair| pair[0].as_str().is_some_and(|text| !text.is_empty()))
        );
    }
    // Not asked, not sent.
    let (_, body) = server.complete(&json!({"prompt": PROMPT, "max_tokens": 1}));
    assert!(body["usage"].get("prompt_token_kinds").is_none(), "{body}");
}

#[test]
fn the_page_is_served_unless_turned_off() {
    let server = TestServer::tiny(ServerConfig::default());
    let (status, page) = call("GET", &server.url("/"), None, None);
    assert_eq!(status, 200);
    assert!(page.contains("/playground/app.js"), "{page}");
    for asset in ["/playground/app.js", "/playground/style.css"] {
        let (status, body) = call("GET", &server.url(asset), None, None);
        assert_eq!(status, 200, "{asset}");
        assert!(!body.is_empty());
    }
    let off = TestServer::tiny(ServerConfig {
        ui: false,
        ..ServerConfig::default()
    });
    let (status, _) = call("GET", &off.url("/"), None, None);
    assert_eq!(status, 404);
}
