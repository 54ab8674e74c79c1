//! `file://` URIs ↔ paths. Only `file` URIs name something on disk; other schemes (`untitled:`)
//! are documents that exist only in the editor. Percent-encoding is undone byte-wise, so paths
//! with spaces or non-ASCII names round-trip.

use lsp_types::Uri;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The path of a `file://` URI; `None` for other schemes or a URI that does not decode.
pub fn to_path(uri: &Uri) -> Option<PathBuf> {
    let rest = uri.as_str().strip_prefix("file://")?;
    // `file://host/path`: only the local host (empty or `localhost`) names a local file.
    let path = rest.strip_prefix("localhost").unwrap_or(rest);
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path.split(['?', '#']).next()?)?;
    Some(PathBuf::from(decoded))
}

/// The `file://` URI of an absolute path.
pub fn from_path(path: &Path) -> Option<Uri> {
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
    Uri::from_str(&encoded).ok()
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
        let untitled = Uri::from_str("untitled:Untitled-1").expect("uri");
        assert_eq!(to_path(&untitled), None);
        assert_eq!(from_path(Path::new("relative.pml")), None);
    }
}
