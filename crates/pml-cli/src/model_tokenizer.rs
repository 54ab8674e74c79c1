//! A model's tokenizer alone, for commands that count tokens without running the model
//! (`pmlc check --model` checks argument lengths, PML210): the GGUF's vocabulary is read, its
//! weights are not.

use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_runtime::tokenizer::PmlTokenizer;

use crate::model_fetch::{fetch_if_missing, resolve_model};

/// The tokenizer of the model `name` (id or alias), fetching the model first when it is absent.
pub fn load_tokenizer(name: &str) -> anyhow::Result<PmlTokenizer> {
    let spec = resolve_model(Some(name))?;
    let path = fetch_if_missing(spec)?;
    let gguf = GgufFile::open(&path)?;
    Ok(PmlTokenizer::from(GgufTokenizer::from_gguf(&gguf)?))
}
