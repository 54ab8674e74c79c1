//! Runtime: models, KV caches, encoding, cached inference, stores and serving. Knows nothing of PML syntax beyond what `pml-compiler` hands it.
pub mod chat;
pub mod conversation;
pub mod device;
pub mod encode;
pub mod generation;
pub mod gguf;
pub mod inference;
pub mod kv_cache;
pub mod model;
pub mod models;
pub mod restore;
pub mod store;
pub mod testing;
pub mod tokenizer;
