//! PML's files: the folder it keeps them in (models, the module store, sessions) — `$PML_HOME`,
//! else `$HOME/.cache/pml` — and how every one of them is written ([`atomic_write`]: whole or not
//! at all). A crate of its own so that model fetching (`pml-models`), the module store
//! (`pml-store`), the engine's layout cache and the server find the same folder and write the
//! same way without linking each other.
//!
//! Architecture invariant: reads two environment variables and writes files; depends on no PML
//! crate.

pub mod atomic_write;

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
