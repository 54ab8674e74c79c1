//! `GET /health`, `GET /metrics` (Prometheus text format) and `GET /openapi.yaml` (the API's
//! OpenAPI document, `docs/openapi.yaml`).

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::json;

use super::AppState;

/// The OpenAPI document of every route.
pub const OPENAPI_YAML: &str = include_str!("../../../../docs/openapi.yaml");

pub async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "model": state.config.model_name,
        "schemas": state.engine.schemas.list().len(),
    }))
}

pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.engine.metrics.render(),
    )
}

pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}
