//! What browsers may do with the server. Pages of the origins `--cors-origins` allows may call
//! the inference routes (CORS, preflights answered here); the routes that change the server
//! (schema upload and deletion) answer no other origin, and on a server open to loopback without
//! a token they take only requests addressed to a loopback name, so a page whose name was
//! rebound to 127.0.0.1 cannot plant a schema. Every answer carries `nosniff`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::config::CorsOrigins;

/// How long a browser may keep a preflight's answer.
const PREFLIGHT_MAX_AGE_SECONDS: &str = "600";

/// The routes a browser page may call from another origin: the model's, never the admin ones.
fn is_inference_route(path: &str) -> bool {
    matches!(
        path,
        "/v1/completions"
            | "/v1/chat/completions"
            | "/v1/responses"
            | "/v1/models"
            | "/tokenize"
            | "/detokenize"
            | "/health"
    ) || path.starts_with("/v1/models/")
        || path.starts_with("/v1/responses/")
}

/// The middleware: preflights of allowed origins answered, their requests' answers marked.
pub async fn cross_origin(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let allowed = origin.filter(|origin| {
        is_inference_route(request.uri().path()) && state.config.cors_origins.allows(origin)
    });
    let mut response = match &allowed {
        Some(_) if is_preflight(&request) => preflight(request.headers()),
        _ => next.run(request).await,
    };
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Some(origin) = allowed {
        let value = match &state.config.cors_origins {
            CorsOrigins::Any => HeaderValue::from_static("*"),
            _ => HeaderValue::from_str(&origin).unwrap_or(HeaderValue::from_static("null")),
        };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

fn is_preflight(request: &Request) -> bool {
    request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// 204 allowing the methods the routes take and the headers the page asked for (OpenAI's
/// clients send `authorization` and their own `x-stainless-*` ones, which `*` would not cover
/// for `authorization`).
fn preflight(asked: &HeaderMap) -> Response {
    let allow_headers = asked
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or(HeaderValue::from_static("authorization, content-type"));
    (
        StatusCode::NO_CONTENT,
        [
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            ),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(PREFLIGHT_MAX_AGE_SECONDS),
            ),
        ],
    )
        .into_response()
}

/// 403 unless an admin request comes from no page or a page of the server's own origin, and,
/// on a server bound to loopback with no admin token, unless it names a loopback host.
pub fn check_admin_origin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let refuse = |why: String| {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            format!("schema upload and deletion {why}"),
        ))
    };
    let text = |name| {
        headers
            .get(name)
            .and_then(|value: &HeaderValue| value.to_str().ok())
    };
    let host = text(header::HOST).unwrap_or_default();
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && !matches!(site, "same-origin" | "none")
    {
        return refuse(format!(
            "take no requests from other sites' pages (Sec-Fetch-Site: {site})"
        ));
    }
    if let Some(origin) = text(header::ORIGIN) {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(|authority| authority.eq_ignore_ascii_case(host)) {
            return refuse(format!(
                "take no requests from another origin's page (Origin: {origin})"
            ));
        }
    }
    if state.config.admin_token.is_none() && state.bound.ip().is_loopback() && !is_loopback(host) {
        return refuse(format!(
            "on a server open to loopback take requests addressed to a loopback host only \
             (Host: `{host}`; a name rebound to 127.0.0.1 is not one); give --admin-token to \
             serve them through another name"
        ));
    }
    Ok(())
}

/// Whether a `Host` header names this machine's loopback: `localhost` or a loopback address,
/// with or without a port.
fn is_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_with_and_without_ports() {
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:80",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "evil.example:8080",
            "10.0.0.1",
            "",
            "localhost.evil.example",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn origins_parse_and_compare_without_case() {
        assert_eq!(CorsOrigins::parse("*"), Ok(CorsOrigins::Any));
        assert_eq!(CorsOrigins::parse("none"), Ok(CorsOrigins::None));
        let list = CorsOrigins::parse("http://Localhost:3000/, https://app.example").unwrap();
        assert!(list.allows("http://localhost:3000"));
        assert!(list.allows("https://APP.example"));
        assert!(!list.allows("https://evil.example"));
        assert!(CorsOrigins::parse("localhost:3000").is_err());
        assert!(!CorsOrigins::None.allows("http://localhost"));
    }
}
