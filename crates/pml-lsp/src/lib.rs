//! The PML language server: diagnostics (the same codes and messages as `pmlc check`), hover,
//! go to definition, references, completion, document symbols and folding ranges for schemas and
//! prompts, over JSON-RPC on any reader/writer pair ([`serve`]; `pml lsp` runs it on stdio).
//!
//! Depends on `pml-syntax` and `pml-compiler` only; the model view that layout needs for token
//! counts in hovers is injected by the host ([`ModelAvailability`]).
//!
//! Reading order: [`server`] (the loop) → [`service`] (the features) → `workspace` (open
//! documents, caches) → `analysis` / `resolve` / `schema_source` (checking, as `pmlc check` does)
//! → the features (`hover`, `navigation`, `completion`, `outline`) built on `locate`.

mod analysis;
mod completion;
pub mod document;
mod hover;
pub mod line_map;
mod locate;
pub mod model;
mod navigation;
mod outline;
mod resolve;
mod schema_source;
pub mod server;
pub mod service;
/// Test scaffolding (stand-ins, fixtures): compiled for this crate's tests and for crates that
/// enable `test-support` in their dev-dependencies, never into a shipped binary.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod to_proto;
pub mod uri;
mod workspace;

pub use model::{CompiledStates, LayoutModel, ModelAvailability};
pub use server::{DEFAULT_DEBOUNCE, ServerError, ServerOptions, serve};
pub use service::LanguageService;
