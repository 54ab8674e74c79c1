//! Saved conversations on disk: `<store root>/sessions/<name>.json` records a conversation's
//! turns (tokens, positions, context hash and the plan each was saved in) for one model; the
//! turns' states themselves live in the module store. Written atomically after every turn.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::restore::SavedUnit;
use crate::store::StoreError;
use crate::store::atomic_file::write_atomically;
use crate::store::manifest::safe_file_name;

/// Version of the session file layout.
pub const SESSION_FORMAT_VERSION: u32 = 1;

/// A conversation as saved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub format_version: u32,
    pub model_fingerprint: String,
    pub system: Option<String>,
    pub units: Vec<SavedUnit>,
    /// Tokens sampled by the last turn but never fed.
    pub pending: Vec<u32>,
}

impl Session {
    pub fn new(
        model_fingerprint: &str,
        system: Option<String>,
        units: Vec<SavedUnit>,
        pending: Vec<u32>,
    ) -> Self {
        Self {
            format_version: SESSION_FORMAT_VERSION,
            model_fingerprint: model_fingerprint.to_string(),
            system,
            units,
            pending,
        }
    }
}

/// Why a session could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session `{name}` at {path} is unreadable: {reason}")]
    Unreadable {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error("session `{name}` belongs to another model ({found}); start a new session name")]
    OtherModel { name: String, found: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The session folder of a store.
#[derive(Clone, Debug)]
pub struct SessionStore {
    dir: PathBuf,
}

impl SessionStore {
    /// Sessions of the store rooted at `store_root`.
    pub fn new(store_root: &Path) -> Self {
        Self {
            dir: store_root.join("sessions"),
        }
    }

    pub fn path_of(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{}.json", safe_file_name(name)))
    }

    /// The session `name` of model `model_fingerprint`; `None` if there is none yet.
    pub fn read(
        &self,
        name: &str,
        model_fingerprint: &str,
    ) -> Result<Option<Session>, SessionError> {
        let path = self.path_of(name);
        let unreadable = |reason: String| SessionError::Unreadable {
            name: name.to_string(),
            path: path.clone(),
            reason,
        };
        let text = match std::fs::read(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(unreadable(error.to_string())),
        };
        let session: Session =
            serde_json::from_slice(&text).map_err(|error| unreadable(error.to_string()))?;
        if session.format_version != SESSION_FORMAT_VERSION {
            return Err(unreadable(format!(
                "format version {}, this build reads {SESSION_FORMAT_VERSION}",
                session.format_version
            )));
        }
        if session.model_fingerprint != model_fingerprint {
            return Err(SessionError::OtherModel {
                name: name.to_string(),
                found: session.model_fingerprint,
            });
        }
        Ok(Some(session))
    }

    /// Writes `session` as `name`, replacing the previous state; returns its path.
    pub fn write(&self, name: &str, session: &Session) -> Result<PathBuf, SessionError> {
        let path = self.path_of(name);
        let mut json = serde_json::to_vec_pretty(session).map_err(|error| {
            StoreError::Malformed(format!("cannot serialise the session: {error}"))
        })?;
        json.push(b'\n');
        write_atomically(&path, &json)?;
        Ok(path)
    }
}
