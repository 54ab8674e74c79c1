//! Schema endpoints. `POST /v1/schemas` takes a PML schema as the body, lays it out at once
//! (400 with diagnostics when it has errors) and answers 202 while the engine encodes it; `GET
//! /v1/schemas/{name}` shows the progress. Upload and deletion need the admin bearer token when
//! the server has one.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::oneshot;

use super::AppState;
use super::cross_origin::check_admin_origin;
use super::error::ApiError;
use crate::engine::EngineRequest;
use crate::engine::schemas::{SchemaInfo, SchemaLayoutView};
use crate::incident::error_chain;
use crate::saved_schemas::SavedSchemas;

pub async fn upload(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    authorize(&state, &headers)?;
    let body = body?;
    pml_compiler::check_source_size(body.len() as u64).map_err(|error| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            error.to_string(),
        )
    })?;
    let source = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::bad_request("the schema is not UTF-8 text"))?;
    let (reply, answer) = oneshot::channel();
    state.engine.send(EngineRequest::Upload {
        source: source.clone(),
        sources_root: None,
        reply,
    })?;
    let info = answer
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))??;
    let mut body = serde_json::to_value(&info)
        .map_err(|error| ApiError::internal(format_args!("a schema's record: {error}")))?;
    if let Some(folder) = &state.config.saved_schemas {
        let saved = SavedSchemas::new(folder);
        let name = info.name.clone();
        let outcome = tokio::task::spawn_blocking(move || saved.save(&name, &source))
            .await
            .map_err(|error| ApiError::internal(format_args!("saving a schema: {error}")))?;
        // The schema is loaded and answers: the upload succeeded, and what it lacks (a copy for
        // the next start) is said beside its record, and in the log with the reason.
        if let Err(error) = outcome {
            tracing::warn!(
                "schema `{}` is loaded but not saved in {} (it is gone after a restart): {}",
                info.name,
                folder.display(),
                error_chain(&error)
            );
            body["warning"] = json!(format!(
                "schema `{}` is loaded but could not be saved for the next start (the server's \
                 folder for schemas cannot be written): upload it again after a restart",
                info.name
            ));
        }
    }
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub async fn list(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({"object": "list", "data": state.engine.schemas.list()}))
}

pub async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<SchemaInfo>, ApiError> {
    loaded(&state, &name).map(Json)
}

/// The record of loaded schema `name`, or 404.
fn loaded(state: &AppState, name: &str) -> Result<SchemaInfo, ApiError> {
    state
        .engine
        .schemas
        .get(name)
        .ok_or_else(|| ApiError::not_found(format!("no schema named `{name}`")))
}

/// The text of a loaded schema, as uploaded.
pub async fn source(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let info = loaded(&state, &name)?;
    // Anyone may upload a schema, so its text is never markup a browser would run in this
    // server's origin: plain text, not sniffed, and sandboxed should a browser render it.
    Ok((
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "sandbox; default-src 'none'",
            ),
        ],
        info.source.to_string(),
    )
        .into_response())
}

/// A loaded schema's units at their positions, each with the store tier its state is in.
pub async fn layout(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<SchemaLayoutView>, ApiError> {
    let (reply, answer) = oneshot::channel();
    state.engine.send(EngineRequest::Layout { name, reply })?;
    let view = answer
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))??;
    Ok(Json(view))
}

pub async fn remove(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    authorize(&state, &headers)?;
    let (reply, answer) = oneshot::channel();
    state.engine.send(EngineRequest::Delete {
        name: name.clone(),
        reply,
    })?;
    match answer.await {
        Ok(true) => {
            if let Some(folder) = &state.config.saved_schemas {
                let saved = SavedSchemas::new(folder);
                let forgotten = name.clone();
                tokio::task::spawn_blocking(move || saved.remove(&forgotten))
                    .await
                    .map_err(|error| {
                        ApiError::internal(format_args!("removing a saved schema: {error}"))
                    })?
                    .map_err(|error| {
                        ApiError::internal(format_args!(
                            "removing saved schema `{name}` from {}: {}",
                            folder.display(),
                            error_chain(&error)
                        ))
                        .after(format_args!(
                            "schema `{name}` is unloaded but its saved copy could not be \
                             removed (it comes back at the next start)"
                        ))
                    })?;
            }
            Ok(StatusCode::NO_CONTENT)
        }
        Ok(false) => Err(ApiError::not_found(format!("no schema named `{name}`"))),
        Err(_) => Err(ApiError::internal("the engine stopped")),
    }
}

/// 403 for a browser page of another origin (or, on a loopback server open to all, a request
/// addressed to another host); then 401 unless the request carries `Authorization: Bearer <admin token>` (when one is set);
/// without a token, 403 unless the server was started open (on loopback).
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    check_admin_origin(state, headers)?;
    let Some(token) = &state.config.admin_token else {
        if state.config.open_admin {
            return Ok(());
        }
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            "schema upload and deletion are off: this server listens beyond loopback and was \
             started without --admin-token",
        ));
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match presented {
        Some(presented) if constant_time_eq(presented.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "schema upload and deletion need `Authorization: Bearer <admin token>`",
        )),
    }
}

/// Equality whose time does not depend on where the inputs first differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
