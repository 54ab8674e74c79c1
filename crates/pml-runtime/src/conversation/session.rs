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

/// One saved session, as [`SessionStore::list`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionEntry {
    pub name: String,
    /// `None` when the file does not parse.
    pub turns: Option<usize>,
    pub model_fingerprint: Option<String>,
    pub modified: Option<std::time::SystemTime>,
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

    /// The saved sessions: name (the file's stem), turns, and when it was last written; sorted by
    /// name. Files that do not parse are listed with `turns: None`.
    pub fn list(&self) -> Result<Vec<SessionEntry>, SessionError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(StoreError::io("read", &self.dir, error).into()),
        };
        let mut sessions = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_suffix(".json"))
            else {
                continue;
            };
            let modified = entry.metadata().and_then(|meta| meta.modified()).ok();
            let session = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Session>(&bytes).ok());
            sessions.push(SessionEntry {
                name: name.to_string(),
                turns: session.as_ref().map(|session| session.units.len()),
                model_fingerprint: session.map(|session| session.model_fingerprint),
                modified,
            });
        }
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(sessions)
    }

    /// Removes the session `name`; `false` when there was none. Its turns' states stay in the
    /// module store until its tiers evict them.
    pub fn delete(&self, name: &str) -> Result<bool, SessionError> {
        let path = self.path_of(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(StoreError::io("remove", path, error).into()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_listed_and_deleted() {
        let root = tempfile::tempdir().expect("tempdir");
        let sessions = SessionStore::new(root.path());
        assert_eq!(sessions.list().expect("list"), Vec::new(), "no folder yet");
        let session = Session::new("model-a", Some("Be brief.".into()), Vec::new(), Vec::new());
        sessions.write("work", &session).expect("write");
        sessions.write("home", &session).expect("write");
        std::fs::write(sessions.path_of("broken"), b"{").expect("write");
        let listed = sessions.list().expect("list");
        let names: Vec<&str> = listed.iter().map(|entry| entry.name.as_str()).collect();
        assert_eq!(names, ["broken", "home", "work"]);
        assert_eq!(listed[0].turns, None);
        assert_eq!(listed[1].turns, Some(0));
        assert_eq!(listed[1].model_fingerprint.as_deref(), Some("model-a"));
        assert!(sessions.delete("home").expect("delete"));
        assert!(!sessions.delete("home").expect("delete again"));
        assert_eq!(sessions.list().expect("list").len(), 2);
        assert!(sessions.read("home", "model-a").expect("read").is_none());
    }
}
