//! The Jinja source of a model's chat template: the one in its GGUF (`tokenizer.chat_template`),
//! or the built-in one for its architecture when the file has none (Gemma-3 GGUFs often lack it).
//! Analysing it into role strings is the business of the layers above.

use crate::gguf::{GgufError, GgufFile};

/// Why a model's chat template source could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ChatSourceError {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error("the model has no chat template and architecture `{0}` has no built-in one")]
    NoTemplate(String),
}

/// The template to use for models whose GGUF carries none, by `general.architecture`.
/// Gemma-3 GGUFs converted without a tokenizer config lack it; this is the template Google ships.
pub fn builtin_template(architecture: &str) -> Option<&'static str> {
    match architecture {
        "gemma3" => Some(include_str!("chat_templates/gemma3.jinja")),
        _ => None,
    }
}

/// The Jinja source of the model's chat template (from the file, else built in).
pub fn chat_template_source(gguf: &GgufFile) -> Result<&str, ChatSourceError> {
    match gguf.chat_template()? {
        Some(source) => Ok(source),
        None => {
            let architecture = gguf.architecture()?;
            builtin_template(architecture)
                .ok_or_else(|| ChatSourceError::NoTemplate(architecture.to_owned()))
        }
    }
}
