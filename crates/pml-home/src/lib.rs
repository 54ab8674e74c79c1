//! The folder PML keeps its files in (models, the module store, sessions): `$PML_HOME`, else
//! `$HOME/.cache/pml`. A crate of its own so that model fetching (`pml-models`) and the module
//! store (`pml-store`) find the same folder without either linking the other.
//!
//! Architecture invariant: reads two environment variables; depends on nothing.

use std::path::PathBuf;

/// Environment variable naming PML's folder.
pub const PML_HOME_ENV: &str = "PML_HOME";

/// `$PML_HOME`, else `$HOME/.cache/pml`; `None` when neither is set.
pub fn pml_home() -> Option<PathBuf> {
    if let Some(root) = std::env::var_os(PML_HOME_ENV).filter(|value| !value.is_empty()) {
        return Some(PathBuf::from(root));
    }
    std::env::var_os("HOME")
        .filter(|value| !value.is_empty())
        .map(|home| PathBuf::from(home).join(".cache").join("pml"))
}
