//! Atomic file replacement: write a temporary file in the target's directory, fsync it, rename it
//! over the target, fsync the directory. Readers see the old file or the whole new one, never a
//! prefix; two processes writing the same path at once each rename a complete file, and the last
//! rename wins. A failed write removes its temporary file (dropping `NamedTempFile` deletes it).

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::StoreError;

/// Prefix of temporary files, so directory scans can tell them from entries.
pub(super) const TEMP_PREFIX: &str = ".tmp-";

/// Replaces `path` with `bytes`, creating its directory if needed.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(|error| StoreError::io("create directory", dir, error))?;
    let mut temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(|error| StoreError::io("create a temporary file in", dir, error))?;
    temp.write_all(bytes)
        .map_err(|error| StoreError::io("write", temp.path(), error))?;
    // Temporary files start private; entries are shared with other users' serving processes.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        temp.as_file()
            .set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(|error| StoreError::io("set permissions of", temp.path(), error))?;
    }
    temp.as_file()
        .sync_all()
        .map_err(|error| StoreError::io("sync", temp.path(), error))?;
    temp.persist(path)
        .map_err(|error| StoreError::io("rename a temporary file to", path, error.error))?;
    // The rename is durable only once the directory entry is on disk.
    File::open(dir)
        .and_then(|directory| directory.sync_all())
        .map_err(|error| StoreError::io("sync directory", dir, error))
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
            let is_temporary = entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX);
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
