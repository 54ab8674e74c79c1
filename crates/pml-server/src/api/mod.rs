//! The HTTP layer: axum routes that parse requests, hand them to the engine over channels and
//! shape its reports into OpenAI-compatible JSON or server-sent events. Nothing here touches a
//! tensor or the model.
//!
//! - [`check`]: `/v1/pml/check`, the diagnostics of a schema and a prompt, for editors.
//! - [`cross_origin`]: what browser pages may call (CORS for the inference routes, none for the
//!   admin ones).
//! - [`error`]: error responses (OpenAI's `{"error": …}` shape, plus PML diagnostics).
//! - [`request`]: request bodies of the completion endpoints, checked field by field.
//! - [`request_log`]: one log line per request, written when its response ends.
//! - [`openai`]: response bodies and stream chunks of the completion endpoints.
//! - [`models`]: `/v1/models`, `/tokenize` and `/detokenize`.
//! - [`prompt_schema`]: the loaded schema a PML prompt is bound to, resolved here, once.
//! - [`completions`]: `/v1/completions` and `/v1/chat/completions`, streaming or not.
//! - [`responses`], [`responses_output`]: `/v1/responses`, answered as a chat.
//! - [`tools`]: tool calling: offered tools, tool messages, calls read from the answer.
//! - [`schemas`]: schema upload, progress, listing, deletion (bearer-token protected).
//! - [`status`]: `/health`, `/metrics`, `/openapi.yaml`.

pub mod check;
pub mod completions;
pub mod cross_origin;
pub mod error;
pub mod models;
pub mod openai;
pub mod prompt_schema;
pub mod request;
pub mod request_log;
pub mod responses;
pub mod responses_output;
pub mod schemas;
pub mod status;
pub mod tools;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodRouter, delete, get, post};

use crate::config::ServerConfig;
use crate::engine::EngineHandle;
pub use prompt_schema::prompt_schema;

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct AppState {
    pub engine: EngineHandle,
    pub config: Arc<ServerConfig>,
    /// Earlier responses, for `previous_response_id`.
    pub responses: Arc<responses::ResponseLog>,
    /// `/v1/pml/check`'s admission.
    pub checks: Arc<check::CheckSlots>,
    /// The address the server listens on.
    pub bound: SocketAddr,
}

/// Every route: method, path (axum and OpenAPI spell parameters alike, `{name}`), handler. The
/// OpenAPI document is tested against this table.
pub fn routes() -> Vec<(&'static str, &'static str, MethodRouter<AppState>)> {
    vec![
        ("get", "/health", get(status::health)),
        ("get", "/metrics", get(status::metrics)),
        ("get", "/openapi.yaml", get(status::openapi)),
        ("post", "/v1/schemas", post(schemas::upload)),
        ("get", "/v1/schemas", get(schemas::list)),
        ("get", "/v1/schemas/{name}", get(schemas::show)),
        ("delete", "/v1/schemas/{name}", delete(schemas::remove)),
        ("get", "/v1/schemas/{name}/source", get(schemas::source)),
        ("get", "/v1/schemas/{name}/layout", get(schemas::layout)),
        ("get", "/v1/models", get(models::list)),
        ("get", "/v1/models/{id}", get(models::show)),
        ("post", "/tokenize", post(models::tokenize)),
        ("post", "/detokenize", post(models::detokenize)),
        ("post", "/v1/completions", post(completions::completion)),
        (
            "post",
            "/v1/chat/completions",
            post(completions::chat_completion),
        ),
        ("post", "/v1/responses", post(responses::create)),
        ("post", "/v1/pml/check", post(check::check)),
    ]
}

/// The router of a server, with the body-size limit of `state.config`.
pub fn router(state: AppState) -> Router {
    let limit = state.config.max_body_bytes;
    let page = if state.config.ui {
        crate::playground::routes()
    } else {
        Router::new()
    };
    routes()
        .into_iter()
        .fold(page, |router, (_, path, handler)| {
            router.route(path, handler)
        })
        .fallback(error::not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(error::shape_method_not_allowed))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            cross_origin::cross_origin,
        ))
        .layer(axum::middleware::from_fn(request_log::log_requests))
        .with_state(state)
}
