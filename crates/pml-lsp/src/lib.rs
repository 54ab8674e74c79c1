//! The PML language server: diagnostics (the same codes and messages as `pmlc check`), hover,
//! go to definition, references, completion, document symbols and folding ranges for schemas and
//! prompts, over JSON-RPC on any reader/writer pair ([`serve`]; `pml lsp` runs it on stdio).
//!
//! Depends on `pml-syntax` and `pml-compiler` only; the model view that layout needs for token
//! counts in hovers is injected by the host ([`ModelAvailability`]).
//!
//! The protocol stays at the edge, as in rust-analyzer: `server` (the loop) converts with
//! `from_proto` and `to_proto`, and everything below speaks PML's own types.
//!
//! Reading order: [`serve`] (the loop) → [`LanguageService`] (the features) → `workspace` (open
//! documents, schema checks) → `analysis_cache` → `analysis` / `resolve` / `schema_source`
//! (checking, as `pmlc check` does) → the features (`diagnostics`, `hover`, `navigation`,
//! `completion`, `outline`) built on `locate`.

mod analysis;
mod analysis_cache;
mod completion;
mod diagnostics;
mod document;
mod from_proto;
mod hover;
mod line_map;
mod locate;
mod location;
mod model;
mod navigation;
mod outline;
mod resolve;
mod schema_source;
mod server;
mod service;
/// Test scaffolding (stand-ins, fixtures): compiled for this crate's tests and for crates that
/// enable `test-support` in their dev-dependencies, never into a shipped binary.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod to_proto;
pub mod uri;
mod workspace;

pub use completion::{CompletionItem, CompletionKind};
pub use diagnostics::{Diagnostic, DiagnosticSeverity, RelatedInformation};
pub use document::TextChange;
pub use hover::Hover;
pub use location::{Location, Position, Range};
pub use model::{CompiledStates, LayoutModel, ModelAvailability};
pub use outline::{DocumentSymbol, FoldingRange, SymbolKind};
pub use server::{DEFAULT_DEBOUNCE, ServerError, ServerOptions, serve};
pub use service::LanguageService;
pub use uri::DocumentUri;
