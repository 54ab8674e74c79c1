//! Runtime: model fetching, module encoding, cached inference, restore and conversations on top of
//! `pml-engine`, with states kept in `pml-store`. Knows nothing of PML syntax beyond what `pml-compiler` hands it.
pub mod chat;
pub mod conversation;
pub mod encode;
pub mod inference;
pub mod models;
pub mod restore;
/// The module store, its own crate (`pml-store`); re-exported so `store::` paths read as before.
pub use pml_store as store;
pub mod testing;
pub mod tokenizer;
