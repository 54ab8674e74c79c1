//! Files written whole or not at all: the bytes go to a temporary file in the target's folder,
//! which is synced, made readable by other users, renamed over the target, and the folder synced.
//! Readers see the old file or the whole new one, never a prefix; two processes writing the same
//! path at once each rename a complete file, and the last rename wins. A write that fails (or
//! whose `fill` refuses what it wrote) leaves the target as it was and no temporary file (dropping
//! a `NamedTempFile` deletes it); a process that dies mid-write leaves one named with
//! [`TEMP_PREFIX`] and [`TEMP_SUFFIX`], which folder scans can tell from real entries.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// How a temporary file's name starts.
pub const TEMP_PREFIX: &str = ".tmp-";
/// How a temporary file's name ends.
pub const TEMP_SUFFIX: &str = ".tmp";

/// A step of an atomic write that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {step} {}: {source}", path.display())]
pub struct AtomicWriteError {
    /// What was being done: "create the folder", "create a temporary file in", "write", …
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl AtomicWriteError {
    fn new(step: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            step,
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<AtomicWriteError> for std::io::Error {
    fn from(error: AtomicWriteError) -> Self {
        std::io::Error::new(error.source.kind(), error)
    }
}

/// Replaces `path` with `bytes`, creating its folder if needed.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    replace_with(path, |file| {
        let mut writer: &File = file;
        writer
            .write_all(bytes)
            .map_err(|error| AtomicWriteError::new("write", path, error))
    })
}

/// Replaces `path` with what `fill` writes into the temporary file it is given (its own
/// buffering flushed before it returns), creating the folder if needed; `fill`'s error leaves
/// `path` untouched.
pub fn replace_with<T, E: From<AtomicWriteError>>(
    path: &Path,
    fill: impl FnOnce(&File) -> Result<T, E>,
) -> Result<T, E> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)
        .map_err(|error| AtomicWriteError::new("create the folder", dir, error))?;
    let temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .suffix(TEMP_SUFFIX)
        .tempfile_in(dir)
        .map_err(|error| AtomicWriteError::new("create a temporary file in", dir, error))?;
    let filled = fill(temp.as_file())?;
    // Temporary files start private; PML's files are shared with other users' processes.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file()
            .set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(|error| AtomicWriteError::new("set the permissions of", temp.path(), error))?;
    }
    temp.as_file()
        .sync_all()
        .map_err(|error| AtomicWriteError::new("sync", temp.path(), error))?;
    temp.persist(path)
        .map_err(|error| AtomicWriteError::new("rename a temporary file to", path, error.error))?;
    // The rename is durable only once the folder's entry is on disk.
    File::open(dir)
        .and_then(|folder| folder.sync_all())
        .map_err(|error| AtomicWriteError::new("sync the folder", dir, error))?;
    Ok(filled)
}

/// Whether `name` is a temporary file's ([`replace_with`]). Either mark is enough: files left
/// by older writers carry one of them (the store's the prefix, the layout cache's the suffix).
pub fn is_temporary(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) || name.ends_with(TEMP_SUFFIX)
}
