//! Where PML keeps its files: `$PML_HOME` (default `~/.cache/pml`), with downloaded wheels in
//! `downloads/` and assembled models in `models/`.

use std::path::{Path, PathBuf};

use super::error::ModelError;
use super::registry::ModelSpec;

/// Environment variable that overrides the PML home directory.
pub use pml_home::PML_HOME_ENV;

/// The PML home directory and the layout beneath it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PmlHome {
    root: PathBuf,
}

impl PmlHome {
    /// A home rooted at `root` (tests point this at a temporary directory).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `$PML_HOME`, else `$HOME/.cache/pml`.
    pub fn from_env() -> Result<Self, ModelError> {
        pml_home::pml_home()
            .map(Self::new)
            .ok_or(ModelError::NoHome)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of downloaded wheels.
    pub fn downloads_dir(&self) -> PathBuf {
        self.root.join("downloads")
    }

    /// Directory of assembled model files.
    pub fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    /// Path of the assembled GGUF of `spec`.
    pub fn model_file(&self, spec: &ModelSpec) -> PathBuf {
        self.models_dir().join(spec.file_name)
    }

    /// Path of the verification stamp written next to the model file.
    pub fn stamp_file(&self, spec: &ModelSpec) -> PathBuf {
        self.models_dir()
            .join(format!("{}.verified", spec.file_name))
    }
}
