//! `POST /v1/pml/check`: the diagnostics `pmlc check` gives a schema and a prompt, for an editor
//! that checks as one types (the playground). The body holds either or both texts; the prompt is
//! checked against the schema sent beside it (a prompt alone is checked against none, and says
//! so). Nothing is laid out, encoded or read from the server's files (`src=` includes are
//! refused, as for an upload), and the work runs off the async threads: it is linear in the
//! texts, which the body limit and the compiler's source-size limit bound. An answer holds the
//! first [`MAX_DIAGNOSTICS`] diagnostics of a text (as the language server publishes them) and
//! counts the rest; one check runs at a time, a few more wait, and beyond them a check is
//! refused (503), so that an editor's stream of checks never takes the cores the completions
//! decode on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use pml_compiler::check::{
    CheckEnvironment, FileCheck, PromptCheckOptions, ResolvedSchema, SchemaLookup, SchemaResolver,
    check_source,
};
use pml_compiler::{RefuseSources, check_source_size};
use pml_syntax::ast::SourceFile;
use pml_syntax::json::JsonDiagnostic;
use pml_syntax::{Severity, first_shown};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use super::AppState;
use super::completions::parse_json;
use super::error::ApiError;

/// Diagnostics of one text an answer holds (the language server's bound).
pub const MAX_DIAGNOSTICS: usize = 200;

/// Checks that may wait for the one running before further ones are refused.
const MAX_WAITING: usize = 4;

/// The endpoint's admission: one check runs at a time (each takes a core while it does).
#[derive(Debug)]
pub struct CheckSlots {
    running: Semaphore,
    admitted: AtomicUsize,
}

impl Default for CheckSlots {
    fn default() -> Self {
        Self {
            running: Semaphore::new(1),
            admitted: AtomicUsize::new(0),
        }
    }
}

/// A check's place among those admitted, given back when it ends or its client leaves.
struct Admitted<'a>(&'a CheckSlots);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.0.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

impl CheckSlots {
    fn admit(&self) -> Result<Admitted<'_>, ApiError> {
        let before = self.admitted.fetch_add(1, Ordering::AcqRel);
        let admitted = Admitted(self);
        if before > MAX_WAITING {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "too many checks are waiting: try again in a moment",
            ));
        }
        Ok(admitted)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    schema: Option<String>,
    prompt: Option<String>,
}

/// One text's check.
#[derive(Debug, Serialize)]
pub struct TextCheck {
    /// What the text's root element makes it: `schema`, `prompt`, or `empty`.
    pub kind: &'static str,
    pub errors: usize,
    pub warnings: usize,
    /// In source order, the first [`MAX_DIAGNOSTICS`]; spans are byte offsets, lines and
    /// columns count from 1.
    pub diagnostics: Vec<JsonDiagnostic>,
    /// Diagnostics left out of `diagnostics` (0 when it holds them all).
    pub omitted: usize,
}

#[derive(Debug, Serialize)]
pub struct CheckResponse {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<TextCheck>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<TextCheck>,
}

pub async fn check(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CheckResponse>, ApiError> {
    let request: CheckRequest = parse_json(&body?)?;
    for (field, text) in [("schema", &request.schema), ("prompt", &request.prompt)] {
        if let Some(text) = text {
            check_source_size(text.len() as u64).map_err(|error| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    error.to_string(),
                )
                .with_param(field)
            })?;
        }
    }
    if request.schema.is_none() && request.prompt.is_none() {
        return Err(ApiError::bad_field(
            "schema",
            "give `schema`, `prompt` or both: the texts to check",
        ));
    }
    let slots = &state.checks;
    let _admitted = slots.admit()?;
    let _running = slots
        .running
        .acquire()
        .await
        .map_err(|error| ApiError::internal(format_args!("the checks' semaphore: {error}")))?;
    tokio::task::spawn_blocking(move || check_texts(&request))
        .await
        .map(Json)
        .map_err(|error| ApiError::internal(format_args!("checking a text: {error}")))
}

fn check_texts(request: &CheckRequest) -> CheckResponse {
    let mut resolver = SentSchema(None);
    let schema = request.schema.as_deref().map(|text| {
        let checked = check_with(text, &mut resolver);
        if let (SourceFile::Schema(_), Some(schema)) = (&checked.file, &checked.schema) {
            resolver.0 = Some(Arc::new(ResolvedSchema {
                index: schema.index.clone(),
                error_count: checked.error_count(),
                location: "the request's `schema`".to_string(),
            }));
        }
        report("schema", text, &checked)
    });
    let prompt = request
        .prompt
        .as_deref()
        .map(|text| report("prompt", text, &check_with(text, &mut resolver)));
    CheckResponse { schema, prompt }
}

fn check_with(text: &str, resolver: &mut SentSchema) -> FileCheck {
    check_source(
        text,
        &mut CheckEnvironment {
            loader: &RefuseSources,
            resolver,
            options: PromptCheckOptions::default(),
        },
    )
}

fn report(file: &str, text: &str, checked: &FileCheck) -> TextCheck {
    let count = |severity| {
        checked
            .diagnostics
            .iter()
            .filter(|diagnostic| diagnostic.severity == severity)
            .count()
    };
    let (shown, omitted) = first_shown(&checked.diagnostics, MAX_DIAGNOSTICS);
    TextCheck {
        kind: match checked.file {
            SourceFile::Schema(_) => "schema",
            SourceFile::Prompt(_) => "prompt",
            SourceFile::Empty => "empty",
        },
        errors: count(Severity::Error),
        warnings: count(Severity::Warning),
        diagnostics: JsonDiagnostic::all(file, text, shown),
        omitted: omitted.total(),
    }
}

/// The schema of the request, whatever name the prompt gives.
struct SentSchema(Option<Arc<ResolvedSchema>>);

impl SchemaResolver for SentSchema {
    fn resolve(&mut self, _name: Option<&str>) -> SchemaLookup {
        match &self.0 {
            Some(schema) => SchemaLookup::Found(Arc::clone(schema)),
            None => SchemaLookup::NotFound {
                looked_in: "the request's `schema` field (send the schema text beside the prompt)"
                    .to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_past_the_waiting_bound_are_refused_until_one_ends() {
        let slots = CheckSlots::default();
        // One running and MAX_WAITING waiting are admitted; the next is refused at once.
        let mut held: Vec<_> = (0..=MAX_WAITING)
            .map(|_| slots.admit().expect("admitted"))
            .collect();
        let refused = slots.admit().err().expect("refused");
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        // A refused check holds no place: once one admitted check ends, one more is let in.
        held.pop();
        held.push(slots.admit().expect("admitted once one ended"));
        assert!(slots.admit().is_err());
    }
}
