//! What the tests (and `pml bench`) need from outside the code under test, in one crate that only
//! `pml-bench` links outside tests: a fetched model's path or a skip ([`fetched_model`]), the switch that
//! turns such skips into failures ([`models_required`]), a throwaway `redis-server`
//! ([`redis_server`]), child test processes that start together ([`child_process`]) and the
//! built binaries run with a given stdin ([`cli`]).
//!
//! Test-only: its functions panic where a test must not go on, and tell the test's output what
//! they skipped or started.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod child_process;
pub mod cli;
pub mod redis_server;

use std::path::PathBuf;

use pml_models::{ModelError, model_path};

/// Environment variable (CI sets it to `1`) under which a test fails instead of skipping when
/// something it needs from outside is missing: a fetched model, or `redis-server`.
pub const REQUIRE_MODELS_ENV: &str = "PML_REQUIRE_MODELS";

/// Whether tests must fail instead of skipping when a model or `redis-server` is missing.
pub fn models_required() -> bool {
    std::env::var(REQUIRE_MODELS_ENV).is_ok_and(|value| value == "1")
}

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

/// Version of the llama-cpp-python sdist whose vendored llama.cpp test data the tests use
/// (`scripts/fetch-llama-cpp-testdata.sh`, the same version `scripts/setup-llama-cpp.sh` builds).
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";

/// llama.cpp's `models/` folder (vocab-only GGUFs with tokenizer test pairs, chat templates):
/// `$PML_LLAMA_CPP_MODELS`, else where `scripts/fetch-llama-cpp-testdata.sh` puts it; `None`
/// after a skip notice when it is absent.
///
/// # Panics
/// When it is absent and [`models_required`].
pub fn llama_cpp_models() -> Option<PathBuf> {
    let dir = match std::env::var_os("PML_LLAMA_CPP_MODELS") {
        Some(dir) => PathBuf::from(dir),
        None => pml_home::pml_home()?
            .join("llama-cpp-testdata")
            .join(LLAMA_CPP_PYTHON_VERSION)
            .join("models"),
    };
    if dir.join("ggml-vocab-qwen2.gguf.out").is_file() {
        return Some(dir);
    }
    assert!(
        !models_required(),
        "llama.cpp's test data is required ({REQUIRE_MODELS_ENV}=1) but not in {}: run \
         scripts/fetch-llama-cpp-testdata.sh",
        dir.display()
    );
    eprintln!(
        "skipped: llama.cpp's test data is not in {} (run scripts/fetch-llama-cpp-testdata.sh)",
        dir.display()
    );
    None
}
