//! Semantic checks: [`check_schema`] on a schema alone, [`check_prompt`] on a prompt against its
//! schema, and [`check_source`], which parses a file, decides by its root element which it is,
//! finds a prompt's schema through a [`SchemaResolver`] and returns every diagnostic (syntax
//! included) in source order.

mod prompt;
mod schema;

pub use prompt::{PromptCheckOptions, check_prompt, check_schema_attribute};
pub use schema::{SchemaCheck, check_schema, element_attributes};

use crate::rules::{self, diagnostic};
use crate::schema_index::SchemaIndex;
use crate::source_loader::SourceLoader;
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Prompt, SourceFile};
use std::sync::Arc;

/// A schema found for a prompt, already checked.
#[derive(Clone, Debug)]
pub struct ResolvedSchema {
    pub index: SchemaIndex,
    /// Errors in the schema file itself (syntax included).
    pub error_count: usize,
    /// Where it came from, for messages (a path, a URL, ...).
    pub location: String,
}

/// The answer of a [`SchemaResolver`].
#[derive(Clone, Debug)]
pub enum SchemaLookup {
    Found(Arc<ResolvedSchema>),
    /// Nothing matched; `looked_in` says where the resolver searched, for the help text.
    NotFound {
        looked_in: String,
    },
}

/// Finds the schema a prompt names. `name` is `None` when the prompt names none (a resolver with
/// a fixed schema may still answer).
pub trait SchemaResolver {
    fn resolve(&mut self, name: Option<&str>) -> SchemaLookup;
}

/// What a host provides to [`check_source`].
pub struct CheckEnvironment<'a> {
    /// Reads `src` files of a schema being checked.
    pub loader: &'a dyn SourceLoader,
    /// Finds a prompt's schema.
    pub resolver: &'a mut dyn SchemaResolver,
    pub options: PromptCheckOptions<'a>,
}

/// The outcome of [`check_source`].
#[derive(Clone, Debug)]
pub struct FileCheck {
    pub file: SourceFile,
    /// Syntax and semantic diagnostics, in source order.
    pub diagnostics: Vec<Diagnostic>,
    /// The schema check, when the file is a schema.
    pub schema: Option<SchemaCheck>,
}

impl FileCheck {
    pub fn error_count(&self) -> usize {
        self.diagnostics
            .iter()
            .filter(|diagnostic| diagnostic.is_error())
            .count()
    }
}

/// Parses `source` and checks it as a schema or a prompt, by its root element.
pub fn check_source(source: &str, environment: &mut CheckEnvironment) -> FileCheck {
    let parse = pml_syntax::parse(source);
    let mut diagnostics = parse.diagnostics;
    let mut schema_check = None;
    match &parse.file {
        SourceFile::Schema(schema) => {
            let check = check_schema(schema, environment.loader);
            diagnostics.extend(check.diagnostics.iter().cloned());
            schema_check = Some(check);
        }
        SourceFile::Prompt(prompt) => {
            diagnostics.extend(check_prompt_with_resolver(prompt, environment))
        }
        SourceFile::Empty => {}
    }
    schema::sort_by_position(&mut diagnostics);
    FileCheck {
        file: parse.file,
        diagnostics,
        schema: schema_check,
    }
}

fn check_prompt_with_resolver(
    prompt: &Prompt,
    environment: &mut CheckEnvironment,
) -> Vec<Diagnostic> {
    let named = prompt
        .schema
        .as_ref()
        .filter(|name| !name.text.trim().is_empty());
    match environment
        .resolver
        .resolve(named.map(|name| name.text.as_str()))
    {
        SchemaLookup::Found(resolved) => {
            let mut diagnostics = check_prompt(prompt, &resolved.index, &environment.options);
            if resolved.error_count > 0 {
                let span = named.map_or(prompt.open_tag, |name| name.span);
                let errors = if resolved.error_count == 1 {
                    "1 error".to_string()
                } else {
                    format!("{} errors", resolved.error_count)
                };
                diagnostics.push(
                    diagnostic(
                        &rules::SCHEMA_HAS_ERRORS,
                        format!("the schema this prompt uses has {errors}"),
                    )
                    .with_label(span, format!("defined in {}", resolved.location))
                    .with_help(format!(
                        "fix the schema first (`pmlc check {}`)",
                        resolved.location
                    )),
                );
            }
            diagnostics
        }
        SchemaLookup::NotFound { looked_in } => {
            let mut diagnostics: Vec<Diagnostic> =
                check_schema_attribute(prompt, None).into_iter().collect();
            if let Some(name) = named {
                diagnostics.push(
                    diagnostic(
                        &rules::SCHEMA_NOT_FOUND,
                        format!("no schema named `{}` found", name.text),
                    )
                    .with_label(name.span, "this schema could not be found")
                    .with_help(format!(
                        "looked in {looked_in}; pass the schema file with `--schema FILE`"
                    )),
                );
            }
            diagnostics
        }
    }
}

#[cfg(test)]
mod tests;
