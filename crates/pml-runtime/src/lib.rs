//! Runtime: module encoding, cached inference, restore and conversations on top of `pml-engine`,
//! with states kept in `pml-store`. Knows nothing of PML syntax beyond what `pml-compiler` hands
//! it, and nothing of where model files come from (`pml-models`): it is given a path.
pub mod attention_mass;
pub mod chat;
pub mod conversation;
pub mod encode;
pub mod inference;
pub mod kv_budget;
pub mod layer_stream;
pub mod restore;
/// The module store, its own crate (`pml-store`); re-exported so `store::` paths read as before.
pub use pml_store as store;
/// Test scaffolding (stand-ins, fixtures): compiled for this crate's tests and for crates that
/// enable `test-support` in their dev-dependencies, never into a shipped binary.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tokenizer;
pub mod unit_key;
