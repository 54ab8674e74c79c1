//! Subcommands of the `pml` binary, one module each.

pub mod answer_stream;
pub mod bench;
pub mod chat;
pub mod eval;
pub mod generate;
pub mod lsp;
pub mod lsp_store;
pub mod models;
pub mod run;
pub mod serve;
pub mod tokenize;
