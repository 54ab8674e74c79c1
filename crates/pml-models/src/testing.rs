//! Support for tests that need a fetched model, shared by every crate's tests: such a test asks
//! [`fetched_model`] for the model's path and returns early (printing why) when the model is absent,
//! unless `PML_REQUIRE_MODELS=1`, under which a missing model fails the test. Test-only: it panics.

use std::path::PathBuf;

use crate::{ModelError, model_path};

/// The switch `redis-server`'s tests obey too: one variable, one reading of it.
pub use pml_store::redis_server::{REQUIRE_MODELS_ENV, models_required};

/// Path of the fetched, verified GGUF of model `id`, or `None` after printing a skip notice.
///
/// # Panics
/// When the model is absent and [`models_required`], or when it is present but corrupt or `id` is
/// unknown: a test must not pass silently on those.
pub fn fetched_model(id: &str) -> Option<PathBuf> {
    match model_path(id) {
        Ok(path) => Some(path),
        Err(ModelError::NotFetched { .. }) if !models_required() => {
            eprintln!("skipped: {id} not fetched (run `pml models fetch {id}`)");
            None
        }
        Err(error) => panic!("model {id} is required by this test: {error}"),
    }
}
