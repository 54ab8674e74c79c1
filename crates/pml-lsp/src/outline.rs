//! Document symbols and folding ranges. A schema's symbols are its module tree (unions and
//! collections as grouping nodes, parameters as fields; role blocks are transparent, as they are
//! for naming); a prompt's are its imports, nested as written. Every element spanning several
//! lines folds.

use crate::analysis::{Analysis, DocumentKind};
use crate::line_map::LineMap;
use crate::location::Range;
use pml_syntax::Span;
use pml_syntax::ast::{PromptItem, SchemaItem};

/// What a symbol is in PML terms; the edge picks the editor's icon for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    /// A module in a schema, or an import of one in a prompt.
    Module,
    Union,
    Collection,
    Param,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocumentSymbol {
    /// Never empty (clients reject empty names): an unnamed element is `(unnamed)`.
    pub name: String,
    pub detail: Option<String>,
    pub kind: SymbolKind,
    /// The whole element.
    pub range: Range,
    /// The element's name, or its open tag; always inside `range`.
    pub selection_range: Range,
    pub children: Vec<DocumentSymbol>,
}

/// Lines `start_line..=end_line` fold into the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldingRange {
    pub start_line: u32,
    pub end_line: u32,
}

/// The symbols of an analysed document.
pub fn symbols(analysis: &Analysis, text: &str, lines: &LineMap) -> Vec<DocumentSymbol> {
    match (&analysis.kind, analysis.schema.as_deref()) {
        (DocumentKind::Schema, Some(schema)) => schema_symbols(&schema.schema.items, text, lines),
        (DocumentKind::Prompt(prompt), _) => prompt_symbols(&prompt.items, text, lines),
        _ => Vec::new(),
    }
}

fn schema_symbols(items: &[SchemaItem], text: &str, lines: &LineMap) -> Vec<DocumentSymbol> {
    let mut symbols = Vec::new();
    for item in items {
        let (name, detail, kind, span, selection, children) = match item {
            SchemaItem::Module(module) => (
                module.name.as_ref().map(|n| n.text.clone()),
                None,
                SymbolKind::Module,
                module.span,
                module.name.as_ref().map_or(module.open_tag, |n| n.span),
                &module.items,
            ),
            SchemaItem::Union(union) => (
                Some("union".to_string()),
                union
                    .default
                    .as_ref()
                    .map(|d| format!("default {}", d.value)),
                SymbolKind::Union,
                union.span,
                union.open_tag,
                &union.items,
            ),
            SchemaItem::Collection(collection) => (
                collection.name.as_ref().map(|n| n.text.clone()),
                Some("collection".to_string()),
                SymbolKind::Collection,
                collection.span,
                collection
                    .name
                    .as_ref()
                    .map_or(collection.open_tag, |n| n.span),
                &collection.items,
            ),
            SchemaItem::Param(param) => {
                let detail = param.len.as_ref().map(|len| format!("len {}", len.value));
                let selection = param.name.as_ref().map_or(param.open_tag, |n| n.span);
                let name = param.name.as_ref().map(|n| n.text.clone());
                symbols.push(symbol(
                    name,
                    detail,
                    SymbolKind::Param,
                    (param.span, selection),
                    Vec::new(),
                    (text, lines),
                ));
                continue;
            }
            SchemaItem::Role(block) => {
                symbols.extend(schema_symbols(&block.items, text, lines));
                continue;
            }
            SchemaItem::Text(_) => continue,
        };
        let children = schema_symbols(children, text, lines);
        symbols.push(symbol(
            name,
            detail,
            kind,
            (span, selection),
            children,
            (text, lines),
        ));
    }
    symbols
}

fn prompt_symbols(items: &[PromptItem], text: &str, lines: &LineMap) -> Vec<DocumentSymbol> {
    let mut symbols = Vec::new();
    for item in items {
        match item {
            PromptItem::Import(import) => {
                let arguments: Vec<&str> = import
                    .arguments
                    .iter()
                    .map(|argument| argument.name.text.as_str())
                    .collect();
                let detail = (!arguments.is_empty()).then(|| arguments.join(", "));
                symbols.push(symbol(
                    Some(import.name.text.clone()),
                    detail,
                    SymbolKind::Module,
                    (import.span, import.name.span),
                    prompt_symbols(&import.items, text, lines),
                    (text, lines),
                ));
            }
            PromptItem::Role(block) => symbols.extend(prompt_symbols(&block.items, text, lines)),
            PromptItem::Text(_) | PromptItem::RoleClose { .. } => {}
        }
    }
    symbols
}

fn symbol(
    name: Option<String>,
    detail: Option<String>,
    kind: SymbolKind,
    (span, selection): (Span, Span),
    children: Vec<DocumentSymbol>,
    (text, lines): (&str, &LineMap),
) -> DocumentSymbol {
    // The specification requires the selection inside the range; recovered trees may disagree.
    let selection = if span.start <= selection.start && selection.end <= span.end {
        selection
    } else {
        span
    };
    DocumentSymbol {
        // Clients reject empty names; an unnamed element is still worth listing.
        name: name
            .filter(|name| !name.trim().is_empty())
            .unwrap_or_else(|| "(unnamed)".to_string()),
        detail,
        kind,
        range: lines.range(text, span),
        selection_range: lines.range(text, selection),
        children,
    }
}

/// Folding ranges of every multi-line element.
pub fn folding_ranges(analysis: &Analysis, text: &str, lines: &LineMap) -> Vec<FoldingRange> {
    let mut spans = Vec::new();
    match (&analysis.kind, analysis.schema.as_deref()) {
        (DocumentKind::Schema, Some(schema)) => {
            spans.push(schema.schema.span);
            schema_spans(&schema.schema.items, &mut spans);
        }
        (DocumentKind::Prompt(prompt), _) => {
            spans.push(prompt.span);
            prompt_spans(&prompt.items, &mut spans);
        }
        _ => {}
    }
    spans
        .into_iter()
        .filter_map(|span| {
            let start = lines.position(text, span.start).line;
            let end = lines.position(text, span.end).line;
            (end > start).then_some(FoldingRange {
                start_line: start,
                end_line: end,
            })
        })
        .collect()
}

fn schema_spans(items: &[SchemaItem], spans: &mut Vec<Span>) {
    for item in items {
        match item {
            SchemaItem::Module(module) => {
                spans.push(module.span);
                schema_spans(&module.items, spans);
            }
            SchemaItem::Union(union) => {
                spans.push(union.span);
                schema_spans(&union.items, spans);
            }
            SchemaItem::Collection(collection) => {
                spans.push(collection.span);
                schema_spans(&collection.items, spans);
            }
            SchemaItem::Role(block) => {
                spans.push(block.span);
                schema_spans(&block.items, spans);
            }
            SchemaItem::Param(param) => spans.push(param.span),
            SchemaItem::Text(_) => {}
        }
    }
}

fn prompt_spans(items: &[PromptItem], spans: &mut Vec<Span>) {
    for item in items {
        match item {
            PromptItem::Import(import) => {
                spans.push(import.span);
                prompt_spans(&import.items, spans);
            }
            PromptItem::Role(block) => {
                spans.push(block.span);
                prompt_spans(&block.items, spans);
            }
            PromptItem::Text(_) | PromptItem::RoleClose { .. } => {}
        }
    }
}
