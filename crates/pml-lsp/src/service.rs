//! [`LanguageService`]: the server's state and every feature, as plain method calls on LSP
//! parameter types — no I/O, no timing. The JSON-RPC loop (`server`) drives it; tests and the
//! benchmark call it directly.

use crate::completion::{complete, to_items};
use crate::hover::hover;
use crate::model::ModelAvailability;
use crate::navigation::{definition, references};
use crate::outline::{folding_ranges, symbols};
use crate::to_proto;
use crate::workspace::{OpenDocument, Workspace};
use lsp_types::{
    CompletionItem, DocumentSymbol, FoldingRange, Hover, HoverContents, Location, MarkupContent,
    MarkupKind, Position, TextDocumentContentChangeEvent, Uri,
};
use std::sync::Arc;

/// Diagnostics published per document: a file with 50,000 of them would be tens of megabytes of
/// JSON on every keystroke, and a problems panel of 50,000 entries helps no one.
const MAX_PUBLISHED: usize = 4 * pml_syntax::DEFAULT_MAX_SHOWN;

pub struct LanguageService {
    workspace: Workspace,
    model: ModelAvailability,
}

impl LanguageService {
    pub fn new(model: ModelAvailability) -> Self {
        let tokenizer = model.model().ok().map(|model| Arc::clone(&model.tokenizer));
        LanguageService {
            workspace: Workspace::new(tokenizer),
            model,
        }
    }

    pub fn open(&mut self, uri: Uri, text: String, version: i32) {
        self.workspace.open(uri, text, version);
    }

    /// Applies `didChange` edits; `false` when the document is not open.
    pub fn change(
        &mut self,
        uri: &Uri,
        version: i32,
        changes: Vec<TextDocumentContentChangeEvent>,
    ) -> bool {
        self.workspace.change(uri, version, changes)
    }

    pub fn close(&mut self, uri: &Uri) {
        self.workspace.close(uri);
    }

    /// A file was saved or changed on disk.
    pub fn saved(&mut self) {
        self.workspace.touch();
    }

    /// The open documents' URIs, sorted.
    pub fn open_uris(&self) -> Vec<Uri> {
        let mut uris: Vec<Uri> = self.workspace.documents().map(|d| d.uri.clone()).collect();
        uris.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        uris
    }

    /// The text of an open document.
    pub fn text(&self, uri: &Uri) -> Option<&str> {
        Some(self.workspace.document(uri)?.document.text())
    }

    /// The document's diagnostics and its version; `None` when it is not open.
    pub fn diagnostics(&self, uri: &Uri) -> Option<(Vec<lsp_types::Diagnostic>, i32)> {
        let open = self.workspace.document(uri)?;
        let analysis = self.workspace.analysis(uri)?;
        let text = open.document.text();
        let (shown, omitted) = pml_syntax::first_shown(&analysis.diagnostics, MAX_PUBLISHED);
        let mut diagnostics: Vec<lsp_types::Diagnostic> = shown
            .iter()
            .map(|diagnostic| to_proto::diagnostic(uri, text, open.document.lines(), diagnostic))
            .collect();
        if let Some(note) = omitted.describe() {
            let first_left_out = analysis.diagnostics[shown.len()].primary_span();
            diagnostics.push(to_proto::omitted_note(
                text,
                open.document.lines(),
                first_left_out,
                note,
            ));
        }
        Some((diagnostics, open.document.version()))
    }

    pub fn hover(&self, uri: &Uri, position: Position) -> Option<Hover> {
        let (open, offset) = self.at(uri, position)?;
        let analysis = self.workspace.analysis(uri)?;
        let (text, span) = hover(&analysis, offset, &self.model)?;
        Some(Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value: text,
            }),
            range: Some(open.document.lines().range(open.document.text(), span)),
        })
    }

    pub fn definition(&self, uri: &Uri, position: Position) -> Option<Location> {
        let (_, offset) = self.at(uri, position)?;
        definition(&*self.workspace.analysis(uri)?, offset)
    }

    pub fn references(
        &self,
        uri: &Uri,
        position: Position,
        include_declaration: bool,
    ) -> Vec<Location> {
        let Some((_, offset)) = self.at(uri, position) else {
            return Vec::new();
        };
        let Some(analysis) = self.workspace.analysis(uri) else {
            return Vec::new();
        };
        references(&self.workspace, &analysis, offset, include_declaration)
    }

    pub fn completion(&self, uri: &Uri, position: Position) -> Vec<CompletionItem> {
        let Some((open, offset)) = self.at(uri, position) else {
            return Vec::new();
        };
        let Some(analysis) = self.workspace.analysis(uri) else {
            return Vec::new();
        };
        let text = open.document.text();
        to_items(
            complete(&analysis, text, offset),
            text,
            open.document.lines(),
        )
    }

    pub fn document_symbols(&self, uri: &Uri) -> Vec<DocumentSymbol> {
        match (self.workspace.document(uri), self.workspace.analysis(uri)) {
            (Some(open), Some(analysis)) => {
                symbols(&analysis, open.document.text(), open.document.lines())
            }
            _ => Vec::new(),
        }
    }

    pub fn folding_ranges(&self, uri: &Uri) -> Vec<FoldingRange> {
        match (self.workspace.document(uri), self.workspace.analysis(uri)) {
            (Some(open), Some(analysis)) => {
                folding_ranges(&analysis, open.document.text(), open.document.lines())
            }
            _ => Vec::new(),
        }
    }

    /// The open document and the byte offset of `position` in it.
    fn at(&self, uri: &Uri, position: Position) -> Option<(&OpenDocument, usize)> {
        let open = self.workspace.document(uri)?;
        let offset = open.document.lines().offset(open.document.text(), position);
        Some((open, offset))
    }
}
