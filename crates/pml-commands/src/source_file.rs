//! Reading a PML file: UTF-8 text, or an error that says where it stops being UTF-8 and what the
//! file probably is (UTF-16, Latin-1, binary), instead of "stream did not contain valid UTF-8".
//! Only regular files are read: a FIFO or a device among the files (`x.pml` in a folder of
//! schemas) would block the reader for ever.

use pml_compiler::ReadFileError;
use std::path::Path;

/// Why a file could not be read as PML source.
#[derive(Debug, thiserror::Error)]
pub enum ReadSourceError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not a regular file ({0}); PML files are read from regular files only")]
    NotRegular(&'static str),
    #[error("{0}")]
    TooLarge(ReadFileError),
    #[error(
        "not UTF-8 text: byte 0x{byte:02X} at offset {offset} (line {line}, column {column}) \
         {what}; {hint}"
    )]
    NotUtf8 {
        byte: u8,
        offset: usize,
        line: usize,
        column: usize,
        what: &'static str,
        hint: &'static str,
    },
}

/// The text of `path`, a regular file (symbolic links followed).
pub fn read_source(path: &Path) -> Result<String, ReadSourceError> {
    match pml_compiler::read_regular_file(path) {
        Ok(bytes) => decode(bytes),
        Err(ReadFileError::NotRegular(kind)) => Err(ReadSourceError::NotRegular(kind)),
        Err(ReadFileError::Io(error)) => Err(ReadSourceError::Io(error)),
        Err(too_large @ ReadFileError::TooLarge { .. }) => {
            Err(ReadSourceError::TooLarge(too_large))
        }
    }
}

/// `bytes` as UTF-8 text, or where and why not.
pub fn decode(bytes: Vec<u8>) -> Result<String, ReadSourceError> {
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(error) => {
            let bytes = error.as_bytes();
            let offset = error.utf8_error().valid_up_to();
            let before = &bytes[..offset];
            let line = 1 + before.iter().filter(|&&byte| byte == b'\n').count();
            let line_start = before
                .iter()
                .rposition(|&byte| byte == b'\n')
                .map_or(0, |newline| newline + 1);
            // Characters (not bytes) since the line's start: the valid prefix is UTF-8.
            let column = 1 + String::from_utf8_lossy(&before[line_start..])
                .chars()
                .count();
            let (what, hint) =
                if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
                    (
                        "(the file starts with a UTF-16 byte-order mark)",
                        "save it as UTF-8",
                    )
                } else if bytes[offset..].iter().take(64).any(|&byte| byte == 0) {
                    (
                        "(NUL bytes follow: a binary file?)",
                        "PML files are text; check the path",
                    )
                } else {
                    (
                        "(probably Latin-1 or Windows-1252 text)",
                        "save it as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)",
                    )
                };
            Err(ReadSourceError::NotUtf8 {
                byte: bytes[offset],
                offset,
                line,
                column,
                what,
                hint,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_reads_and_other_encodings_say_where_and_what() {
        assert_eq!(decode(b"<schema/>".to_vec()).unwrap(), "<schema/>");
        let latin1 = b"<schema>\ncaf\xE9</schema>".to_vec();
        let message = decode(latin1).unwrap_err().to_string();
        assert!(
            message.contains("0xE9 at offset 12 (line 2, column 4)"),
            "{message}"
        );
        assert!(message.contains("Latin-1"), "{message}");
        let utf16 = vec![0xFF, 0xFE, b'<', 0, b's', 0];
        assert!(decode(utf16).unwrap_err().to_string().contains("UTF-16"));
        let binary = vec![b'P', b'K', 3, 4, 0x9F, 0, 0, 0];
        assert!(decode(binary).unwrap_err().to_string().contains("binary"));
    }
}
