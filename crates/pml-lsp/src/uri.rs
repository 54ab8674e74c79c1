//! Documents' URIs, and `file://` URIs ↔ paths. Only `file` URIs name something on disk; other
//! schemes (`untitled:`) are documents that exist only in the editor. Percent-encoding is undone
//! byte-wise, so paths with spaces or non-ASCII names round-trip.

use std::path::{Path, PathBuf};

/// A document's URI exactly as the client spelled it: documents are told apart by that text, so
/// the same file under two spellings is two documents, as it is to the client.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DocumentUri(String);

impl DocumentUri {
    /// A URI the client sent or [`from_path`] made (nothing here parses it).
    pub fn new(uri: impl Into<String>) -> Self {
        DocumentUri(uri.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The path of a `file://` URI; `None` for other schemes or a URI that does not decode.
pub fn to_path(uri: &DocumentUri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    // `file://host/path`: only the local host (empty or `localhost`) names a local file.
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path.split(['?', '#']).next()?)?;
    Some(PathBuf::from(decoded))
}

/// The `file://` URI of an absolute path; every byte that is not unreserved is percent-encoded,
/// so the result is always a valid URI.
pub fn from_path(path: &Path) -> Option<DocumentUri> {
    let text = path.to_str()?;
    if !text.starts_with('/') {
        return None;
    }
    let mut encoded = String::from("file://");
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    Some(DocumentUri(encoded))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_round_trip_through_uris() {
        let path = Path::new("/tmp/my schemas/café.pml");
        let uri = from_path(path).expect("absolute path");
        assert_eq!(uri.as_str(), "file:///tmp/my%20schemas/caf%C3%A9.pml");
        assert_eq!(to_path(&uri).as_deref(), Some(path));
        let untitled = DocumentUri::new("untitled:Untitled-1");
        assert_eq!(to_path(&untitled), None);
        assert_eq!(from_path(Path::new("relative.pml")), None);
    }
}
