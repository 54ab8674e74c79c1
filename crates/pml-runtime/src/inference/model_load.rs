//! Opening a model file for inference: its weights and its tokenizer, built on two cores.

use pml_engine::device::Backend;
use pml_engine::gguf::GgufFile;
use pml_engine::model::{Model, ModelConfig, WeightFormat};
use pml_engine::tokenizer::GgufTokenizer;

use super::RuntimeError;

/// The model and the tokenizer of `gguf`. A large vocabulary (Qwen's 151k tokens and merges)
/// takes about as long to build as the weights' layouts, so the tokenizer is built on another
/// thread while this one loads the weights.
pub fn load_model_and_tokenizer(
    gguf: &GgufFile,
    format: WeightFormat,
    backend: &Backend,
) -> Result<(Model, GgufTokenizer), RuntimeError> {
    let config = ModelConfig::from_gguf(gguf)?;
    let (model, tokenizer) = std::thread::scope(|scope| {
        let tokenizer = scope.spawn(|| GgufTokenizer::from_gguf(gguf));
        let model = Model::from_source_on(config, &mut &*gguf, format, backend);
        let tokenizer = tokenizer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (model, tokenizer)
    });
    Ok((model?, tokenizer?))
}
