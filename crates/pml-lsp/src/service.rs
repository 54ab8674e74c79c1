//! [`LanguageService`]: the server's state and every feature, as plain method calls on PML's own
//! types (URIs, UTF-16 positions, plain result structs) — no protocol, no I/O, no timing. The
//! JSON-RPC loop (`server`) drives it through `from_proto` and `to_proto`; tests and the
//! benchmark call it directly.

use crate::analysis::Analysis;
use crate::analysis_cache::AnalysisCache;
use crate::completion::{CompletionItem, completions};
use crate::diagnostics::{self, Diagnostic};
use crate::document::TextChange;
use crate::hover::{Hover, hover};
use crate::location::{Location, Position};
use crate::model::ModelAvailability;
use crate::navigation::{definition, references};
use crate::outline::{DocumentSymbol, FoldingRange, folding_ranges, symbols};
use crate::uri::DocumentUri;
use crate::workspace::{OpenDocument, Workspace};
use std::sync::Arc;

pub struct LanguageService {
    workspace: Workspace,
    analyses: AnalysisCache,
    model: ModelAvailability,
}

impl LanguageService {
    pub fn new(model: ModelAvailability) -> Self {
        let tokenizer = model.model().ok().map(|model| Arc::clone(&model.tokenizer));
        LanguageService {
            workspace: Workspace::new(tokenizer),
            analyses: AnalysisCache::default(),
            model,
        }
    }

    pub fn open(&mut self, uri: DocumentUri, text: String, version: i32) {
        self.workspace.open(uri, text, version);
    }

    /// Applies `didChange` edits; `false` when the document is not open.
    pub fn change(&mut self, uri: &DocumentUri, version: i32, changes: Vec<TextChange>) -> bool {
        self.workspace.change(uri, version, changes)
    }

    pub fn close(&mut self, uri: &DocumentUri) {
        self.workspace.close(uri);
        self.analyses.forget(uri);
    }

    /// A file was saved or changed on disk.
    pub fn saved(&mut self) {
        self.workspace.touch();
    }

    /// The open documents' URIs, sorted.
    pub fn open_uris(&self) -> Vec<DocumentUri> {
        let mut uris: Vec<DocumentUri> =
            self.workspace.documents().map(|d| d.uri.clone()).collect();
        uris.sort();
        uris
    }

    /// The text of an open document.
    pub fn text(&self, uri: &DocumentUri) -> Option<&str> {
        Some(self.workspace.document(uri)?.document.text())
    }

    /// The document's diagnostics and its version; `None` when it is not open.
    pub fn diagnostics(&self, uri: &DocumentUri) -> Option<(Vec<Diagnostic>, i32)> {
        let open = self.workspace.document(uri)?;
        let analysis = self.analysis(uri)?;
        let published = diagnostics::for_document(uri, &open.document, &analysis.diagnostics);
        Some((published, open.document.version()))
    }

    pub fn hover(&self, uri: &DocumentUri, position: Position) -> Option<Hover> {
        let (open, offset) = self.at(uri, position)?;
        let (markdown, span) = hover(&*self.analysis(uri)?, offset, &self.model)?;
        Some(Hover {
            markdown,
            range: open.document.lines().range(open.document.text(), span),
        })
    }

    pub fn definition(&self, uri: &DocumentUri, position: Position) -> Option<Location> {
        let (_, offset) = self.at(uri, position)?;
        definition(&*self.analysis(uri)?, offset)
    }

    pub fn references(
        &self,
        uri: &DocumentUri,
        position: Position,
        include_declaration: bool,
    ) -> Vec<Location> {
        let Some((_, offset)) = self.at(uri, position) else {
            return Vec::new();
        };
        let Some(analysis) = self.analysis(uri) else {
            return Vec::new();
        };
        references(
            &self.workspace,
            &self.analyses,
            &analysis,
            offset,
            include_declaration,
        )
    }

    pub fn completion(&self, uri: &DocumentUri, position: Position) -> Vec<CompletionItem> {
        let Some((open, offset)) = self.at(uri, position) else {
            return Vec::new();
        };
        let Some(analysis) = self.analysis(uri) else {
            return Vec::new();
        };
        completions(
            &analysis,
            open.document.text(),
            open.document.lines(),
            offset,
        )
    }

    pub fn document_symbols(&self, uri: &DocumentUri) -> Vec<DocumentSymbol> {
        match (self.workspace.document(uri), self.analysis(uri)) {
            (Some(open), Some(analysis)) => {
                symbols(&analysis, open.document.text(), open.document.lines())
            }
            _ => Vec::new(),
        }
    }

    pub fn folding_ranges(&self, uri: &DocumentUri) -> Vec<FoldingRange> {
        match (self.workspace.document(uri), self.analysis(uri)) {
            (Some(open), Some(analysis)) => {
                folding_ranges(&analysis, open.document.text(), open.document.lines())
            }
            _ => Vec::new(),
        }
    }

    fn analysis(&self, uri: &DocumentUri) -> Option<Arc<Analysis>> {
        self.analyses.get(&self.workspace, uri)
    }

    /// The open document and the byte offset of `position` in it.
    fn at(&self, uri: &DocumentUri, position: Position) -> Option<(&OpenDocument, usize)> {
        let open = self.workspace.document(uri)?;
        let offset = open.document.lines().offset(open.document.text(), position);
        Some((open, offset))
    }
}
