//! A model's tokenizer alone, for commands that count tokens without running the model
//! (`pmlc check --model` checks argument lengths, PML210): the GGUF's vocabulary is read, its
//! weights are not.

use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_runtime::tokenizer::PmlTokenizer;

use crate::model_fetch::{model_file, resolve_model};

/// The tokenizer of the model `name` (id, alias or GGUF path), fetching a registered model first
/// when it is absent.
pub fn load_tokenizer(name: &str) -> anyhow::Result<PmlTokenizer> {
    let path = model_file(&resolve_model(Some(name))?)?;
    let gguf = GgufFile::open(&path)?;
    Ok(PmlTokenizer::from(GgufTokenizer::from_gguf(&gguf)?))
}
