//! Opening a model file for inference: its weights and its tokenizer, built on two cores.

use std::path::PathBuf;

use pml_engine::device::Backend;
use pml_engine::gguf::GgufFile;
use pml_engine::model::{Model, WeightFormat};
use pml_engine::tokenizer::GgufTokenizer;

use super::RuntimeError;

/// Environment variable naming the layout cache's directory (`on` for `layouts/` in the PML
/// home); unset, or `off`, for none.
pub const LAYOUT_CACHE_ENV: &str = "PML_LAYOUT_CACHE";

/// The layout cache's directory (`pml_engine::model::layout_cache`), only where
/// `$PML_LAYOUT_CACHE` asks for one: a second copy of every model on disk, about its size, is
/// a cost a user chooses, for later loads that map the layouts instead of building them.
pub fn layout_cache_dir() -> Option<PathBuf> {
    match std::env::var_os(LAYOUT_CACHE_ENV) {
        Some(value) if value == "on" || value == "1" => {
            pml_home::pml_home().map(|home| home.join("layouts"))
        }
        Some(value) if value.is_empty() || value == "off" || value == "0" => None,
        Some(value) => Some(PathBuf::from(value)),
        None => None,
    }
}

/// The model and the tokenizer of `gguf`. A large vocabulary (Qwen's 151k tokens and merges)
/// takes about as long to build as the weights' layouts, so the tokenizer is built on another
/// thread while this one loads the weights (read in place from the layout cache
/// ([`layout_cache_dir`]) where one is asked for).
pub fn load_model_and_tokenizer(
    gguf: &GgufFile,
    format: WeightFormat,
    backend: &Backend,
) -> Result<(Model, GgufTokenizer), RuntimeError> {
    let layout_cache = layout_cache_dir();
    let (model, tokenizer) = std::thread::scope(|scope| {
        let tokenizer = scope.spawn(|| GgufTokenizer::from_gguf(gguf));
        let model = Model::from_gguf_on(gguf, format, backend, layout_cache.as_deref());
        let tokenizer = tokenizer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (model, tokenizer)
    });
    Ok((model?, tokenizer?))
}
