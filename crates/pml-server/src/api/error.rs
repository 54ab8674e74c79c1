//! Error responses: OpenAI's shape `{"error": {"message", "type", "code"}}`, with PML diagnostics
//! (code, message, span, line and column) under `error.diagnostics` for a bad schema or prompt.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pml_syntax::json::JsonDiagnostic;
use serde::Serialize;

use crate::engine::{JobError, SubmitError};

/// Seconds a client refused with 503 is told to wait.
const RETRY_AFTER_SECONDS: &str = "1";

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
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
    code: u16,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    diagnostics: &'a [JsonDiagnostic],
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            diagnostics: Vec::new(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
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
            JobError::UnknownSchema(_) => ApiError::not_found(message),
            JobError::BadRequest(_) => ApiError::bad_request(message),
            JobError::Internal(_) => ApiError::internal(message),
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                code: self.status.as_u16(),
                diagnostics: &self.diagnostics,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

/// Any path no route serves.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}
