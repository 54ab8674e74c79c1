//! The verification stamp kept next to a model file: the size, modification time and sha256 the
//! file had when it was last hashed, so that later runs skip re-hashing hundreds of megabytes
//! unless the file changed.

use std::io;
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::error::ModelError;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerificationStamp {
    pub size: u64,
    pub mtime_secs: u64,
    pub mtime_nanos: u32,
    pub sha256: String,
}

impl VerificationStamp {
    /// A stamp for `file` as it is now, asserting that it hashes to `sha256`.
    pub fn for_file(file: &Path, sha256: &str) -> Result<Self, ModelError> {
        let (size, mtime_secs, mtime_nanos) = file_identity(file)?;
        Ok(Self {
            size,
            mtime_secs,
            mtime_nanos,
            sha256: sha256.to_owned(),
        })
    }

    /// The stamp stored at `stamp_path`, if there is a readable one.
    pub fn load(stamp_path: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(stamp_path).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn save(&self, stamp_path: &Path) -> Result<(), ModelError> {
        let text = serde_json::to_string_pretty(self).map_err(|error| {
            ModelError::io("cannot encode stamp", stamp_path, io::Error::other(error))
        })?;
        Ok(pml_home::atomic_write::write_atomically(
            stamp_path,
            text.as_bytes(),
        )?)
    }

    /// Whether this stamp vouches that `file` (as it is now) has sha256 `expected_sha256`.
    pub fn vouches_for(&self, file: &Path, expected_sha256: &str) -> bool {
        match file_identity(file) {
            Ok((size, mtime_secs, mtime_nanos)) => {
                self.size == size
                    && self.mtime_secs == mtime_secs
                    && self.mtime_nanos == mtime_nanos
                    && self.sha256 == expected_sha256
            }
            Err(_) => false,
        }
    }
}

fn file_identity(file: &Path) -> Result<(u64, u64, u32), ModelError> {
    let metadata =
        std::fs::metadata(file).map_err(|error| ModelError::io("cannot stat", file, error))?;
    let modified = metadata
        .modified()
        .map_err(|error| ModelError::io("cannot read mtime of", file, error))?;
    let since_epoch = modified.duration_since(UNIX_EPOCH).unwrap_or_default();
    Ok((
        metadata.len(),
        since_epoch.as_secs(),
        since_epoch.subsec_nanos(),
    ))
}
