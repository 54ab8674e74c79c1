//! Error responses in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}` (`param`
//! the request field at fault or null, `code` a string or null), with PML diagnostics (code,
//! message, span, line and column) under `error.diagnostics` for a bad schema or prompt.
//!
//! A 500's detail stays in the server's log: the client gets the incident's number only
//! ([`crate::incident`]), in the body as in a stream's error event.

use axum::Json;
use axum::extract::Request;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pml_syntax::json::JsonDiagnostic;
use serde::Serialize;

use crate::connections::BodyTimedOut;
use crate::engine::{JobError, SubmitError};
use crate::incident::Incident;

/// Seconds a client refused with 503 is told to wait.
const RETRY_AFTER_SECONDS: &str = "1";

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault, as OpenAI names it (`messages[0].content`).
    pub param: Option<String>,
    /// A machine-readable reason (`unsupported_parameter`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
    pub diagnostics: Vec<JsonDiagnostic>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    diagnostics: &'a [JsonDiagnostic],
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            diagnostics: Vec::new(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 400 about one request field.
    pub fn bad_field(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_request(message).with_param(param)
    }

    /// A 400 for a field this server does not implement: refused, never ignored.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::bad_field(param, message).with_code("unsupported_parameter")
    }

    pub fn with_param(self, param: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..self
        }
    }

    pub fn with_code(self, code: &'static str) -> Self {
        Self {
            code: Some(code),
            ..self
        }
    }

    /// The body as OpenAI shapes it, also for errors sent inside a stream.
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
                diagnostics: &self.diagnostics,
            },
        })
        .unwrap_or_else(|_| serde_json::json!({"error": {"message": self.message}}))
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// A 500 for `detail`, which is logged under a new incident number and not answered.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        Self::from(&Incident::report(detail))
    }

    /// Says first what the failure means for the request (`schema `x` is loaded but …`): only
    /// for text that reveals nothing of the server.
    pub fn after(self, outcome: impl std::fmt::Display) -> Self {
        Self {
            message: format!("{outcome}: {}", self.message),
            ..self
        }
    }
}

impl From<&Incident> for ApiError {
    fn from(incident: &Incident) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            incident.public_message(),
        )
        .with_code("internal_error")
    }
}

impl From<JobError> for ApiError {
    fn from(error: JobError) -> Self {
        let message = error.to_string();
        match error {
            JobError::Diagnostics { diagnostics, .. } => ApiError {
                diagnostics,
                ..ApiError::bad_request(message)
            },
            JobError::UnknownSchema(_) => {
                ApiError::not_found(message).with_code("schema_not_found")
            }
            JobError::Context(_) => {
                ApiError::bad_request(message).with_code("context_length_exceeded")
            }
            JobError::OverKvPool { .. } => {
                ApiError::bad_request(message).with_code("kv_cache_budget_exceeded")
            }
            JobError::BadRequest(_) => ApiError::bad_request(message),
            // Logged when the engine made it; its message is the log's, not the client's.
            JobError::Internal(incident) => ApiError::from(&incident),
            JobError::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", message)
                    .with_code("shutting_down")
            }
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            error.to_string(),
        )
    }
}

/// A body axum could not read: too large (413, in JSON as well), too slow to arrive (408) or
/// cut off.
impl From<BytesRejection> for ApiError {
    fn from(rejection: BytesRejection) -> Self {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&rejection);
        while let Some(error) = cause {
            if let Some(timed_out) = error.downcast_ref::<BodyTimedOut>() {
                return ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    format!("{timed_out}: send it faster, or in one piece"),
                )
                .with_code("request_timeout");
            }
            cause = error.source();
        }
        let status = rejection.status();
        let kind = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "request_too_large"
        } else {
            "invalid_request_error"
        };
        ApiError::new(status, kind, rejection.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Any other path: OpenAI's endpoints this server does not offer say so by name.
pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    let path = uri.path();
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let what = [
        ("/v1/embeddings", "embeddings"),
        ("/v1/audio", "audio"),
        ("/v1/images", "images"),
        ("/v1/moderations", "moderations"),
        ("/v1/files", "files"),
        ("/v1/batches", "batches"),
        ("/v1/fine_tuning", "fine-tuning"),
    ]
    .into_iter()
    .find(|(prefix, _)| under(prefix));
    match what {
        Some((_, what)) => ApiError::not_found(format!(
            "`{path}`: this server does not serve {what}; it runs one generative model \
             (completions, chat completions, responses)"
        ))
        .with_code("unsupported_endpoint"),
        None => ApiError::not_found(format!("no such route: `{path}`")),
    }
}

/// A route asked with a method it does not take answers in OpenAI's shape too, keeping the
/// `Allow` header that says which it takes.
pub async fn shape_method_not_allowed(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    if response.status() != StatusCode::METHOD_NOT_ALLOWED {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let takes = allow
        .as_ref()
        .and_then(|allow| allow.to_str().ok())
        .map_or_else(String::new, |allow| format!(": it takes {allow}"));
    let mut shaped = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("`{method} {path}` is not served{takes}"),
    )
    .with_code("method_not_allowed")
    .into_response();
    if let Some(allow) = allow {
        shaped.headers_mut().insert(header::ALLOW, allow);
    }
    shaped
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_internal_error_answers_its_incident_only() {
        let detail = "shape mismatch [1, 896] × [2, 896] reading /home/operator/model.gguf";
        let incident = Incident::report(detail);
        let number = incident.number();
        let error = ApiError::from(JobError::Internal(incident));
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
        let message =
            format!("internal error (incident {number}); the server's log has the details");
        assert_eq!(
            error.body(),
            json!({"error": {
                "message": message,
                "type": "server_error",
                "param": null,
                "code": "internal_error",
            }})
        );
        let error = ApiError::internal(detail).after("schema `notes` is loaded");
        let body = error.body().to_string();
        assert!(
            body.contains("schema `notes` is loaded: internal error (incident"),
            "{body}"
        );
        assert!(!body.contains("896") && !body.contains("/home"), "{body}");
    }

    #[test]
    fn client_errors_keep_their_messages() {
        let error = ApiError::from(JobError::BadRequest("the prompt is empty".to_string()));
        assert_eq!(error.status, StatusCode::BAD_REQUEST);
        assert_eq!(error.message, "the prompt is empty");
    }
}
