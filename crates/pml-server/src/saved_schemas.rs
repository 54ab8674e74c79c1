//! Schemas uploaded through the API, kept as files so a restarted server serves them again:
//! `<folder>/<hex of the name>.pml` (the hex keeps any name a plain file name), written to a
//! temporary file and renamed, removed on deletion, all loaded at start. A name too long for its
//! hex to fit a file name is saved as the hex of its first bytes and a hash of the whole name.
//! Every `.pml` file of the folder is loaded whatever its file name, so files saved under either
//! form come back.

use std::fs;
use std::path::{Path, PathBuf};

use pml_compiler::{ReadFileError, read_regular_file};
use pml_home::atomic_write::write_atomically;
use sha2::{Digest, Sha256};

/// The longest file name (without `.pml`) a schema is saved under. File systems cap a name at 255
/// bytes; every name whose hex fits this (names of up to 125 bytes) keeps the file name it was
/// always saved under, so nothing saved before moves.
const MAX_FILE_STEM: usize = 250;

/// Bytes of a long name kept, in hex, before the hash: enough to tell names apart in a listing.
const LONG_NAME_PREFIX_BYTES: usize = 64;

/// A saved schema's file and its source, or why it could not be read.
pub type SavedSource = (PathBuf, Result<String, ReadFileError>);

/// The folder of one server's saved schemas.
#[derive(Clone, Debug)]
pub struct SavedSchemas {
    folder: PathBuf,
}

impl SavedSchemas {
    pub fn new(folder: impl Into<PathBuf>) -> Self {
        Self {
            folder: folder.into(),
        }
    }

    pub fn folder(&self) -> &Path {
        &self.folder
    }

    fn path_of(&self, name: &str) -> PathBuf {
        self.folder.join(format!("{}.pml", file_stem(name)))
    }

    /// Saves `source` as schema `name`, replacing an earlier one whole or not at all.
    pub fn save(&self, name: &str, source: &str) -> std::io::Result<()> {
        Ok(write_atomically(&self.path_of(name), source.as_bytes())?)
    }

    /// Forgets schema `name` (nothing to do when it was never saved).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        match fs::remove_file(self.path_of(name)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// Every saved schema's source, in file-name order; a missing folder holds none. A file that
    /// cannot be read (not UTF-8, or not a regular file: a FIFO would block the start for ever)
    /// is reported on its own and the others are still loaded.
    pub fn load_all(&self) -> std::io::Result<Vec<SavedSource>> {
        let entries = match fs::read_dir(&self.folder) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "pml"))
            .collect();
        paths.sort();
        Ok(paths
            .into_iter()
            .map(|path| {
                let source = read_regular_file(&path).and_then(|bytes| {
                    String::from_utf8(bytes).map_err(|_| {
                        ReadFileError::Io(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "not UTF-8 text",
                        ))
                    })
                });
                (path, source)
            })
            .collect())
    }
}

/// The file name of schema `name`, without `.pml`: the hex of the name, or for a name whose hex
/// would be longer than [`MAX_FILE_STEM`], the hex of its first bytes, `-` and the SHA-256 of the
/// whole name (the `-` keeps the two forms apart).
fn file_stem(name: &str) -> String {
    let hex = |bytes: &[u8]| -> String { bytes.iter().map(|byte| format!("{byte:02x}")).collect() };
    if name.len() * 2 <= MAX_FILE_STEM {
        return hex(name.as_bytes());
    }
    let prefix: Vec<u8> = name.bytes().take(LONG_NAME_PREFIX_BYTES).collect();
    format!(
        "{}-{}",
        hex(&prefix),
        hex(Sha256::digest(name.as_bytes()).as_slice())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(saved: &SavedSchemas) -> Vec<String> {
        saved
            .load_all()
            .expect("load")
            .into_iter()
            .map(|(path, source)| source.unwrap_or_else(|error| panic!("{path:?}: {error}")))
            .collect()
    }

    #[test]
    fn saved_schemas_round_trip_and_names_stay_file_names() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let saved = SavedSchemas::new(dir.path().join("schemas"));
        assert!(saved.load_all().expect("empty").is_empty());
        saved
            .save("notes", "<schema name=\"notes\"/>")
            .expect("save");
        saved
            .save("../odd/name", "<schema/>")
            .expect("save an odd name");
        saved
            .save("notes", "<schema name=\"notes\">v2</schema>")
            .expect("replace");
        let all = saved.load_all().expect("load");
        assert_eq!(all.len(), 2);
        assert!(
            all.iter()
                .all(|(path, _)| path.parent() == Some(saved.folder()))
        );
        assert!(
            sources(&saved)
                .iter()
                .any(|source| source.ends_with("v2</schema>"))
        );
        saved.remove("notes").expect("remove");
        saved.remove("never saved").expect("nothing to remove");
        assert_eq!(saved.load_all().expect("load").len(), 1);
    }

    #[test]
    fn long_names_are_saved_under_bounded_file_names() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let saved = SavedSchemas::new(dir.path());
        // 128 ASCII characters made a 260-byte file name, which file systems refuse.
        for length in [125, 126, 128, 300, 5000] {
            let name = "n".repeat(length);
            let source = format!("<schema name=\"{name}\"/>");
            saved.save(&name, &source).expect("save a long name");
            let stem_len = saved
                .path_of(&name)
                .file_stem()
                .map_or(0, |stem| stem.len());
            assert!(stem_len <= MAX_FILE_STEM, "{length}: {stem_len}");
            assert!(sources(&saved).contains(&source), "{length}");
            saved.remove(&name).expect("remove");
            assert!(!sources(&saved).contains(&source), "{length}");
        }
        // Names alike in their first bytes stay apart.
        let a = format!("{}a", "n".repeat(200));
        let b = format!("{}b", "n".repeat(200));
        assert_ne!(saved.path_of(&a), saved.path_of(&b));
    }

    #[test]
    fn files_saved_in_the_old_form_are_loaded_and_removed() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let saved = SavedSchemas::new(dir.path());
        // As every earlier version named the file: the hex of the whole name.
        let name = "x".repeat(125);
        let old_form: String = name.bytes().map(|byte| format!("{byte:02x}")).collect();
        let source = format!("<schema name=\"{name}\"/>");
        std::fs::write(dir.path().join(format!("{old_form}.pml")), &source).expect("write");
        assert_eq!(sources(&saved), [source]);
        saved.remove(&name).expect("remove");
        assert!(saved.load_all().expect("load").is_empty());
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_among_the_saved_schemas_is_reported_not_read() {
        let dir = tempfile::TempDir::new().expect("temp dir");
        let saved = SavedSchemas::new(dir.path());
        saved.save("a", "<schema name=\"a\"/>").expect("save");
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("b.pml"))
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");
        let all = saved.load_all().expect("load");
        assert_eq!(all.len(), 2);
        assert!(all.iter().any(|(_, source)| source.is_ok()));
        assert!(
            all.iter()
                .any(|(_, source)| matches!(source, Err(ReadFileError::NotRegular("a FIFO"))))
        );
    }
}
