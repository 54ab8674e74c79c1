//! Runtime: model fetching, module encoding, cached inference, stores, restore and conversations on
//! top of `pml-engine`. Knows nothing of PML syntax beyond what `pml-compiler` hands it.
pub mod chat;
pub mod conversation;
pub mod encode;
pub mod inference;
pub mod models;
pub mod restore;
pub mod store;
pub mod testing;
pub mod tokenizer;
