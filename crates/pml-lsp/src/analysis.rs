//! One open document analysed: what it is (schema or prompt), its diagnostics exactly as
//! `pmlc check` reports them, and the schema it is about (itself, or the schema a prompt names,
//! found through [`WorkspaceResolver`]). Every feature reads an analysis; none parses on its own.

use crate::resolve::WorkspaceResolver;
use crate::schema_source::{SchemaSource, loader_for};
use crate::workspace::{OpenDocument, Workspace};
use pml_compiler::check::{CheckEnvironment, PromptCheckOptions, check_source};
use pml_syntax::Diagnostic;
use pml_syntax::ast::{Prompt, SourceFile};
use std::sync::Arc;

pub enum DocumentKind {
    /// The document is the schema in [`Analysis::schema`].
    Schema,
    Prompt(Prompt),
    /// Neither root was found.
    Empty,
}

pub struct Analysis {
    pub kind: DocumentKind,
    pub diagnostics: Vec<Diagnostic>,
    /// The document itself when it is a schema; a prompt's schema when it was found.
    pub schema: Option<Arc<SchemaSource>>,
}

impl Analysis {
    pub fn prompt(&self) -> Option<&Prompt> {
        match &self.kind {
            DocumentKind::Prompt(prompt) => Some(prompt),
            _ => None,
        }
    }
}

pub fn analyse(workspace: &Workspace, open: &OpenDocument) -> Analysis {
    if let Some(schema) = workspace.open_schema(open) {
        return Analysis {
            kind: DocumentKind::Schema,
            diagnostics: schema.diagnostics.clone(),
            schema: Some(schema),
        };
    }
    let loader = loader_for(open.path.as_deref());
    let mut resolver = WorkspaceResolver {
        workspace,
        prompt: open,
        found: None,
    };
    let mut environment = CheckEnvironment {
        loader: loader.as_ref(),
        resolver: &mut resolver,
        options: PromptCheckOptions {
            tokenizer: workspace.tokenizer(),
        },
    };
    let checked = check_source(open.document.text(), &mut environment);
    let kind = match checked.file {
        SourceFile::Prompt(prompt) => DocumentKind::Prompt(prompt),
        // Not reached for a schema (handled above), but a tree is a tree.
        SourceFile::Schema(_) | SourceFile::Empty => DocumentKind::Empty,
    };
    Analysis {
        kind,
        diagnostics: checked.diagnostics,
        schema: resolver.found,
    }
}
