//! Runtime: models, KV caches, encoding, cached inference, stores and serving. Knows nothing of PML syntax beyond what `pml-compiler` hands it.
pub mod gguf;
pub mod models;
pub mod testing;
pub mod tokenizer;
