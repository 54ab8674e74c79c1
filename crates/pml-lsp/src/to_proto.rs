//! The service's results leaving the server as protocol types. The only choices made here are
//! the protocol's: which LSP kinds stand for PML's symbols and completions, the `pml` source
//! tag, and markdown hovers.

use crate::completion::{CompletionItem, CompletionKind};
use crate::diagnostics::{Diagnostic, DiagnosticSeverity, RelatedInformation};
use crate::hover::Hover;
use crate::location::{Location, Position, Range};
use crate::outline::{DocumentSymbol, FoldingRange, SymbolKind};
use crate::uri::DocumentUri;
use std::str::FromStr;

/// `None` only for a URI that does not parse, which the service never makes: its URIs are the
/// client's own or `file://` URIs with every reserved byte percent-encoded.
pub fn uri(uri: &DocumentUri) -> Option<lsp_types::Uri> {
    lsp_types::Uri::from_str(uri.as_str()).ok()
}

fn position(position: Position) -> lsp_types::Position {
    lsp_types::Position::new(position.line, position.character)
}

fn range(range: Range) -> lsp_types::Range {
    lsp_types::Range::new(position(range.start), position(range.end))
}

pub fn location(location: Location) -> Option<lsp_types::Location> {
    Some(lsp_types::Location::new(
        uri(&location.uri)?,
        range(location.range),
    ))
}

pub fn locations(locations: Vec<Location>) -> Vec<lsp_types::Location> {
    locations.into_iter().filter_map(location).collect()
}

pub fn diagnostic(diagnostic: Diagnostic) -> lsp_types::Diagnostic {
    let related: Vec<lsp_types::DiagnosticRelatedInformation> = diagnostic
        .related
        .into_iter()
        .filter_map(related_information)
        .collect();
    lsp_types::Diagnostic {
        range: range(diagnostic.range),
        severity: Some(match diagnostic.severity {
            DiagnosticSeverity::Error => lsp_types::DiagnosticSeverity::ERROR,
            DiagnosticSeverity::Warning => lsp_types::DiagnosticSeverity::WARNING,
            DiagnosticSeverity::Information => lsp_types::DiagnosticSeverity::INFORMATION,
        }),
        code: diagnostic.code.map(lsp_types::NumberOrString::String),
        source: Some("pml".to_string()),
        message: diagnostic.message,
        related_information: (!related.is_empty()).then_some(related),
        ..lsp_types::Diagnostic::default()
    }
}

fn related_information(
    related: RelatedInformation,
) -> Option<lsp_types::DiagnosticRelatedInformation> {
    Some(lsp_types::DiagnosticRelatedInformation {
        location: location(related.location)?,
        message: related.message,
    })
}

pub fn hover(hover: Hover) -> lsp_types::Hover {
    lsp_types::Hover {
        contents: lsp_types::HoverContents::Markup(lsp_types::MarkupContent {
            kind: lsp_types::MarkupKind::Markdown,
            value: hover.markdown,
        }),
        range: Some(range(hover.range)),
    }
}

pub fn completion_item(item: CompletionItem) -> lsp_types::CompletionItem {
    lsp_types::CompletionItem {
        label: item.label,
        kind: Some(match item.kind {
            CompletionKind::Element => lsp_types::CompletionItemKind::KEYWORD,
            CompletionKind::Attribute => lsp_types::CompletionItemKind::PROPERTY,
            CompletionKind::Module => lsp_types::CompletionItemKind::MODULE,
        }),
        detail: item.detail,
        text_edit: Some(lsp_types::CompletionTextEdit::Edit(
            lsp_types::TextEdit::new(range(item.replace), item.insert),
        )),
        ..lsp_types::CompletionItem::default()
    }
}

pub fn document_symbol(symbol: DocumentSymbol) -> lsp_types::DocumentSymbol {
    let children: Vec<lsp_types::DocumentSymbol> =
        symbol.children.into_iter().map(document_symbol).collect();
    #[allow(deprecated)] // `deprecated` is a required field of the struct, itself deprecated.
    lsp_types::DocumentSymbol {
        name: symbol.name,
        detail: symbol.detail,
        kind: match symbol.kind {
            SymbolKind::Module => lsp_types::SymbolKind::MODULE,
            SymbolKind::Union => lsp_types::SymbolKind::ENUM,
            SymbolKind::Collection => lsp_types::SymbolKind::ARRAY,
            SymbolKind::Param => lsp_types::SymbolKind::FIELD,
        },
        tags: None,
        deprecated: None,
        range: range(symbol.range),
        selection_range: range(symbol.selection_range),
        children: (!children.is_empty()).then_some(children),
    }
}

pub fn folding_range(folding: FoldingRange) -> lsp_types::FoldingRange {
    lsp_types::FoldingRange {
        start_line: folding.start_line,
        end_line: folding.end_line,
        ..lsp_types::FoldingRange::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: u32, from: u32, to: u32) -> Range {
        Range::new(Position::new(line, from), Position::new(line, to))
    }

    #[test]
    fn diagnostics_carry_the_pml_code_source_and_related_information() {
        let uri = DocumentUri::new("untitled:prompt.pml");
        let related = RelatedInformation {
            location: Location {
                uri: uri.clone(),
                range: at(2, 0, 3),
            },
            message: "help: import it".to_string(),
        };
        let converted = diagnostic(Diagnostic {
            range: at(1, 4, 9),
            severity: DiagnosticSeverity::Warning,
            code: Some("PML206".to_string()),
            message: "misplaced".to_string(),
            related: vec![related],
        });
        assert_eq!(
            converted.severity,
            Some(lsp_types::DiagnosticSeverity::WARNING)
        );
        assert_eq!(
            converted.code,
            Some(lsp_types::NumberOrString::String("PML206".to_string()))
        );
        assert_eq!(converted.source.as_deref(), Some("pml"));
        assert_eq!(
            converted.range,
            lsp_types::Range::new(
                lsp_types::Position::new(1, 4),
                lsp_types::Position::new(1, 9),
            )
        );
        let related = converted.related_information.expect("related information");
        assert_eq!(related[0].location.uri.as_str(), uri.as_str());
        assert_eq!(related[0].message, "help: import it");

        // The note about diagnostics left out: no code, and no empty related list.
        let note = diagnostic(Diagnostic {
            range: at(0, 0, 0),
            severity: DiagnosticSeverity::Information,
            code: None,
            message: "3 more".to_string(),
            related: Vec::new(),
        });
        assert_eq!(
            note.severity,
            Some(lsp_types::DiagnosticSeverity::INFORMATION)
        );
        assert_eq!((note.code, note.related_information), (None, None));
    }

    #[test]
    fn completions_are_text_edits_and_symbols_nest() {
        let item = completion_item(CompletionItem {
            label: "overseas".to_string(),
            kind: CompletionKind::Module,
            detail: Some("module".to_string()),
            replace: at(1, 9, 10),
            insert: "overseas".to_string(),
        });
        assert_eq!(item.kind, Some(lsp_types::CompletionItemKind::MODULE));
        let Some(lsp_types::CompletionTextEdit::Edit(edit)) = item.text_edit else {
            panic!("a text edit")
        };
        assert_eq!(edit.range.start, lsp_types::Position::new(1, 9));
        assert_eq!(edit.new_text, "overseas");

        let leaf = DocumentSymbol {
            name: "city".to_string(),
            detail: None,
            kind: SymbolKind::Param,
            range: at(3, 2, 20),
            selection_range: at(3, 8, 12),
            children: Vec::new(),
        };
        let module = document_symbol(DocumentSymbol {
            name: "plan".to_string(),
            kind: SymbolKind::Module,
            children: vec![leaf.clone()],
            ..leaf
        });
        assert_eq!(module.kind, lsp_types::SymbolKind::MODULE);
        let children = module.children.expect("children");
        assert_eq!(children[0].kind, lsp_types::SymbolKind::FIELD);
        assert_eq!(children[0].children, None);
    }
}
