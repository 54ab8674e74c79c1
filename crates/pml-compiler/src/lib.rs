//! Compiler: semantic checks of schemas and prompts, chat templates, layout and prompt binding.
//!
//! Architecture invariant: this crate knows nothing of tensors or model weights; it sees a model
//! only through the [`Tokenizer`] trait and chat-template strings.

pub mod tokenizer;

pub use tokenizer::{TokenizeError, Tokenizer};
