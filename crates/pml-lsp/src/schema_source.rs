//! A schema file as the server sees it: its text, tree, index and diagnostics (checked exactly as
//! `pmlc check` checks it), where it lives, and its layout for the injected model, computed on
//! the first hover that needs it and kept with this version of the text.

use crate::line_map::LineMap;
use crate::model::LayoutModel;
use crate::uri::DocumentUri;
use pml_compiler::check::{CheckEnvironment, PromptCheckOptions, SchemaLookup, SchemaResolver};
use pml_compiler::plan::SchemaLayout;
use pml_compiler::{
    FsSourceLoader, RefuseSources, ResolvedSchema, SchemaIndex, SourceLoader, check_source,
    layout_schema,
};
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Schema, SourceFile};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub struct SchemaSource {
    pub uri: DocumentUri,
    pub path: Option<PathBuf>,
    pub text: String,
    pub lines: LineMap,
    pub schema: Schema,
    /// The index with the error count and location a prompt's check reports.
    pub resolved: Arc<ResolvedSchema>,
    /// Syntax and schema diagnostics, as `pmlc check` gives them for this file.
    pub diagnostics: Vec<Diagnostic>,
    layout: OnceLock<Result<SchemaLayout, LayoutError>>,
}

/// Why a schema has no layout; hovers show it in place of token counts.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// Layout would only repeat the check's errors, which the editor already shows.
    #[error("the schema has errors, so it has no layout")]
    SchemaHasErrors,
    /// Layout's own diagnostics (the model's context is too short, a source is missing, ...).
    #[error("no layout ({})", first_problem(.0))]
    Failed(Vec<Diagnostic>),
}

/// The first of layout's diagnostics, which is the one a hover has room for.
fn first_problem(diagnostics: &[Diagnostic]) -> String {
    diagnostics.first().map_or_else(
        || "layout failed".to_string(),
        |first| format!("{}: {}", first.code, first.message),
    )
}

/// Answers every lookup with "not found": checking a schema never looks one up, and a file that
/// turns out to be a prompt is not analysed as one here.
struct NoSchemas;

impl SchemaResolver for NoSchemas {
    fn resolve(&mut self, _name: Option<&str>) -> SchemaLookup {
        SchemaLookup::NotFound {
            looked_in: String::new(),
        }
    }
}

/// Reads `src` files next to the schema, or none for a document not on disk.
pub fn loader_for(path: Option<&Path>) -> Box<dyn SourceLoader> {
    match path.and_then(Path::parent) {
        Some(folder) => Box::new(FsSourceLoader::new(folder)),
        None => Box::new(RefuseSources),
    }
}

impl SchemaSource {
    /// Checks `text` as `pmlc check` would; `None` when its root is not `<schema>`.
    pub fn check(uri: DocumentUri, path: Option<PathBuf>, text: String) -> Option<SchemaSource> {
        let loader = loader_for(path.as_deref());
        let mut environment = CheckEnvironment {
            loader: loader.as_ref(),
            resolver: &mut NoSchemas,
            options: PromptCheckOptions::default(),
        };
        let checked = check_source(&text, &mut environment);
        let error_count = checked.error_count();
        let (SourceFile::Schema(schema), Some(check)) = (checked.file, checked.schema) else {
            return None;
        };
        let location = path.as_ref().map_or_else(
            || uri.as_str().to_string(),
            |path| path.display().to_string(),
        );
        Some(SchemaSource {
            lines: LineMap::new(&text),
            resolved: Arc::new(ResolvedSchema {
                index: check.index,
                error_count,
                location,
            }),
            diagnostics: checked.diagnostics,
            uri,
            path,
            text,
            schema,
            layout: OnceLock::new(),
        })
    }

    pub fn index(&self) -> &SchemaIndex {
        &self.resolved.index
    }

    /// The schema's `name`, or `""`.
    pub fn name(&self) -> &str {
        self.index().name().map_or("", |name| name.text.as_str())
    }

    /// The layout for `model`, computed once per version of the text, or why there is none.
    pub fn layout(&self, model: &LayoutModel) -> Result<&SchemaLayout, &LayoutError> {
        self.layout
            .get_or_init(|| {
                if self.resolved.error_count > 0 {
                    return Err(LayoutError::SchemaHasErrors);
                }
                let loader = loader_for(self.path.as_deref());
                layout_schema(
                    &self.schema,
                    self.index(),
                    &self.text,
                    model.tokenizer.as_ref(),
                    &model.template,
                    loader.as_ref(),
                    model.max_positions,
                )
                .map_err(LayoutError::Failed)
            })
            .as_ref()
    }
}
