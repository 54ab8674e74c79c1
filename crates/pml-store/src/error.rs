//! [`StoreError`]: every way a store operation can fail, with messages that say what to do.

use std::path::PathBuf;

use pml_engine::kv_cache::KvCacheError;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A stored state failed its checksum or its structural checks. The tier has already dropped
    /// it, so the caller re-encodes the module and puts it again.
    #[error(
        "stored state {key} at {location} is corrupt ({reason}); it was removed: re-encode the module"
    )]
    Corrupt {
        key: String,
        location: String,
        reason: String,
    },
    /// Bytes that are not a module state this store wrote: bad header, checksum, tensors or metadata.
    #[error("malformed module state: {0}")]
    Malformed(String),
    /// A well-formed state made for another model or layout than the one asked for. It is valid
    /// for that other model, so it is kept.
    #[error("module state is for another {what}: expected {expected}, found {found}")]
    Mismatch {
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("{0}")]
    Unsupported(String),
    /// A store specification (`--store`, `PML_STORE`) that does not parse.
    #[error(
        "invalid store {0}; expected a comma-separated list of `device:SIZE`, `ram:SIZE`, `disk:PATH[?max=SIZE]` and `redis://HOST:PORT[?max=SIZE]`, optionally with `dtype:f16` or `dtype:f32`"
    )]
    InvalidSpec(String),
    #[error("`{0}` is not a store key (expected 64 lowercase hex digits)")]
    InvalidKey(String),
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot locate the store: set PML_HOME or HOME, or pass a store directory")]
    NoHome,
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
}

impl StoreError {
    /// What happened, without advice, for a caller that has already acted on it: a corrupt
    /// state's warning once the module was re-encoded ("…; it was removed: re-encode the module"
    /// would ask for what was done).
    pub fn what_happened(&self) -> String {
        match self {
            StoreError::Corrupt {
                key,
                location,
                reason,
            } => format!("stored state {key} at {location} was corrupt ({reason}) and was removed"),
            other => other.to_string(),
        }
    }

    /// An I/O error on `path` while doing `action` ("read", "create directory", ...).
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub fn mismatch(what: &'static str, expected: impl ToString, found: impl ToString) -> Self {
        StoreError::Mismatch {
            what,
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }
}
