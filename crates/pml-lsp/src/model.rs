//! What the host injects about a model: the tokenizer, chat template and context length that
//! layout needs for hover's token counts and positions, and optionally what the module store holds
//! for a compiled schema (KV bytes, store tier). `pml-lsp` never loads a model or opens a store
//! itself (it knows nothing of weights, GGUF files or KV); without them, hovers say why the
//! figures are missing.

use pml_compiler::Tokenizer;
use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::LayoutUnit;
use std::sync::Arc;

/// What the module store holds for one unit of a schema compiled for the model. `Send`, so a host
/// may run the server on a thread of its own.
pub trait CompiledStates: Send {
    /// One line for the hover of `unit` (laid out now) in schema `schema_name`: its stored KV size
    /// and tier, or why there is none (not compiled, compiled from another version, ...).
    fn describe(&self, schema_name: &str, unit: &LayoutUnit) -> String;
}

/// A model's view as the compiler's layout needs it.
pub struct LayoutModel {
    /// For hover text (`qwen2.5-coder-0.5b`).
    pub name: String,
    /// Shared with the workspace, which checks argument lengths (PML210) with it.
    pub tokenizer: Arc<dyn Tokenizer>,
    pub template: ChatTemplate,
    /// The model's context length: a schema must leave at least one position free.
    pub max_positions: u32,
    /// The store of compiled modules for this model, if the host has one.
    pub compiled: Option<Box<dyn CompiledStates>>,
}

/// The model for layout, or why there is none (shown in hovers).
pub enum ModelAvailability {
    Loaded(Box<LayoutModel>),
    Unavailable { reason: String },
}

impl ModelAvailability {
    pub fn model(&self) -> Result<&LayoutModel, &str> {
        match self {
            ModelAvailability::Loaded(model) => Ok(model),
            ModelAvailability::Unavailable { reason } => Err(reason),
        }
    }
}
