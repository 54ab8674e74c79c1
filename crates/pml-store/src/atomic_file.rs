//! The store's files are written whole or not at all (`pml_home::atomic_write`), and the
//! temporary files a crashed writer left behind are swept.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use pml_home::atomic_write::{self, AtomicWriteError, is_temporary};

use super::StoreError;

impl From<AtomicWriteError> for StoreError {
    fn from(error: AtomicWriteError) -> Self {
        StoreError::io(error.step, error.path, error.source)
    }
}

/// Replaces `path` with `bytes`, creating its directory if needed.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    Ok(atomic_write::write_atomically(path, bytes)?)
}

/// Removes temporary files older than `older_than` under `dir` (recursively): what a writer that
/// crashed between creating and renaming its file left behind. Younger ones may belong to a
/// write in progress in another process, so they stay.
pub(super) fn remove_stale_temporaries(
    dir: &Path,
    older_than: Duration,
) -> Result<usize, StoreError> {
    let now = SystemTime::now();
    let mut removed = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = match fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(StoreError::io("list", current, error)),
        };
        for entry in entries {
            let entry = entry.map_err(|error| StoreError::io("list", &current, error))?;
            let path = entry.path();
            let metadata = match entry.metadata() {
                Ok(metadata) => metadata,
                // Renamed or removed by its writer since the listing.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(StoreError::io("inspect", path, error)),
            };
            if metadata.is_dir() {
                pending.push(path);
                continue;
            }
            let is_temporary = is_temporary(&entry.file_name().to_string_lossy());
            let age = metadata
                .modified()
                .ok()
                .and_then(|modified| now.duration_since(modified).ok());
            if is_temporary && age.is_some_and(|age| age >= older_than) {
                match fs::remove_file(&path) {
                    Ok(()) => removed += 1,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(StoreError::io("remove", path, error)),
                }
            }
        }
    }
    Ok(removed)
}
