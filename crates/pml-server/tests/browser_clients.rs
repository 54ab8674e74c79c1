//! What browsers may do with a server (tiny model, real HTTP on a loopback port): pages of the
//! allowed origins call the inference routes (CORS preflights and headers), no page of another
//! origin reaches the routes that change the server, a name rebound to 127.0.0.1 reaches them
//! neither on a server open to loopback, an uploaded schema's text is never served as markup,
//! and the playground page carries its content security policy. A route asked with the wrong
//! method answers in OpenAI's shape.

mod support;

use pml_server::{CorsOrigins, ServerConfig};
use support::{RawResponse, SCHEMA, TestServer, json, raw};

fn request(
    server: &TestServer,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> RawResponse {
    let addr = server.handle.as_ref().expect("running").addr();
    let host = format!("{addr}");
    let has_host = headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"));
    let mut text = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !has_host {
        text.push_str(&format!("Host: {host}\r\n"));
    }
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    raw(addr, &text)
}

const PAGE: &str = "http://localhost:5173";

#[test]
fn a_page_of_any_origin_calls_the_inference_routes_by_default() {
    let server = TestServer::tiny(ServerConfig::default());
    let preflight = request(
        &server,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", PAGE),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type, x-stainless-os",
            ),
        ],
        "",
    );
    assert_eq!(preflight.status, 204, "{}", preflight.body);
    assert_eq!(preflight.header("access-control-allow-origin"), Some("*"));
    assert!(
        preflight
            .header("access-control-allow-methods")
            .is_some_and(|methods| methods.contains("POST"))
    );
    assert_eq!(
        preflight.header("access-control-allow-headers"),
        Some("authorization, content-type, x-stainless-os")
    );
    let body = r#"{"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}"#;
    let answer = request(
        &server,
        "POST",
        "/v1/chat/completions",
        &[("Origin", PAGE), ("Content-Type", "application/json")],
        body,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("access-control-allow-origin"), Some("*"));
    assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    let models = request(&server, "GET", "/v1/models", &[("Origin", PAGE)], "");
    assert_eq!(models.header("access-control-allow-origin"), Some("*"));
}

#[test]
fn only_the_listed_origins_are_allowed_and_admin_routes_allow_none() {
    let server = TestServer::tiny(ServerConfig {
        cors_origins: CorsOrigins::parse(PAGE).expect("an origin"),
        ..ServerConfig::default()
    });
    let preflight = |origin: &str, path: &str| {
        request(
            &server,
            "OPTIONS",
            path,
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
            ],
            "",
        )
    };
    let allowed = preflight(PAGE, "/v1/completions");
    assert_eq!(allowed.status, 204);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(PAGE));
    assert!(
        allowed
            .header("vary")
            .is_some_and(|vary| vary.contains("Origin"))
    );
    for refused in [
        preflight("http://evil.example", "/v1/completions"),
        preflight(PAGE, "/v1/schemas"),
    ] {
        assert_eq!(refused.header("access-control-allow-origin"), None);
        assert_eq!(refused.status, 405, "{}", refused.body);
    }
}

#[test]
fn pages_of_other_sites_cannot_upload_schemas() {
    // The default server: loopback, no admin token, uploads open to local clients.
    let server = TestServer::tiny(ServerConfig::default());
    let upload = |headers: &[(&str, &str)]| {
        let mut all = vec![("Content-Type", "text/plain")];
        all.extend_from_slice(headers);
        request(&server, "POST", "/v1/schemas", &all, SCHEMA)
    };
    for headers in [
        vec![
            ("Origin", "http://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
        vec![("Origin", "http://evil.example")],
        vec![("Sec-Fetch-Site", "cross-site")],
        // A page whose name was rebound to 127.0.0.1 (DNS rebinding) is "same origin".
        vec![
            ("Host", "evil.example:8080"),
            ("Origin", "http://evil.example:8080"),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    ] {
        let refused = upload(&headers);
        assert_eq!(refused.status, 403, "{headers:?}: {}", refused.body);
        assert_eq!(json(&refused.body)["error"]["type"], "permission_error");
    }
    let (status, list) = support::call("GET", &server.url("/v1/schemas"), None, None);
    assert_eq!(status, 200);
    assert_eq!(
        json(&list)["data"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    // The playground's own page, and a client that is no page (curl), still upload.
    let addr = server.handle.as_ref().expect("running").addr();
    let own = format!("http://{addr}");
    let accepted = upload(&[("Origin", &own), ("Sec-Fetch-Site", "same-origin")]);
    assert_eq!(accepted.status, 202, "{}", accepted.body);
    let accepted = upload(&[]);
    assert_eq!(accepted.status, 202, "{}", accepted.body);
}

#[test]
fn an_uploaded_schema_is_served_as_plain_text_and_the_page_has_a_policy() {
    let server = TestServer::tiny(ServerConfig::default());
    server.upload_ready(SCHEMA);
    let source = request(&server, "GET", "/v1/schemas/notes/source", &[], "");
    assert_eq!(source.status, 200, "{}", source.body);
    assert_eq!(
        source.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(source.header("x-content-type-options"), Some("nosniff"));
    assert!(
        source
            .header("content-security-policy")
            .is_some_and(|policy| policy.contains("sandbox"))
    );
    let page = request(&server, "GET", "/", &[], "");
    assert_eq!(page.status, 200);
    let policy = page.header("content-security-policy").expect("a policy");
    assert!(policy.contains("script-src 'self'"), "{policy}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn a_wrong_method_answers_in_openai_shape_with_allow() {
    let server = TestServer::tiny(ServerConfig::default());
    for (method, path) in [
        ("GET", "/v1/chat/completions"),
        ("OPTIONS", "/v1/chat/completions"),
        ("PUT", "/v1/schemas"),
    ] {
        let answer = request(&server, method, path, &[], "");
        assert_eq!(answer.status, 405, "{method} {path}");
        let error = &json(&answer.body)["error"];
        assert_eq!(error["code"], "method_not_allowed", "{}", answer.body);
        assert!(
            error["message"].as_str().is_some_and(|m| m.contains(path)),
            "{}",
            answer.body
        );
        assert!(answer.header("allow").is_some(), "{method} {path}");
    }
}
