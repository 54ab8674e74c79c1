//! Engine: GGUF files, tokenizers, our transformer forward passes with the layer-wise API, the KV
//! cache, generation and the CPU kernels under them. Knows nothing of PML, schemas or stores.
pub mod chat;
pub mod device;
mod error;
pub mod generation;
pub mod gguf;
pub mod kv_cache;
pub mod model;
pub mod stored_tensor;
/// Test scaffolding (stand-ins, fixtures): compiled for this crate's tests and for crates that
/// enable `test-support` in their dev-dependencies, never into a shipped binary.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tokenizer;

pub use pml_kernels::memory::allocator::keep_freed_memory;
pub use tokenizer::{TokenizeError, Tokenizer};
