//! Protocol types arriving from the client, as the service's own. Positions pass through
//! unchanged: the server announces UTF-16 columns, which is what the service counts in.

use crate::document::TextChange;
use crate::location::{Position, Range};
use crate::uri::DocumentUri;

pub fn uri(uri: &lsp_types::Uri) -> DocumentUri {
    DocumentUri::new(uri.as_str())
}

/// The document and position a request is about.
pub fn document_position(at: lsp_types::TextDocumentPositionParams) -> (DocumentUri, Position) {
    (uri(&at.text_document.uri), position(at.position))
}

fn position(position: lsp_types::Position) -> Position {
    Position::new(position.line, position.character)
}

fn range(range: lsp_types::Range) -> Range {
    Range::new(position(range.start), position(range.end))
}

/// `rangeLength` is deprecated and ignored: the range alone says what is replaced.
pub fn change(change: lsp_types::TextDocumentContentChangeEvent) -> TextChange {
    TextChange {
        range: change.range.map(range),
        text: change.text,
    }
}
