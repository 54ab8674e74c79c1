//! Subcommands of the `pml` binary and the helpers they share (`answer_stream`, `lsp_store`);
//! `bench` and `eval` are `pml-bench`'s.

pub mod answer_stream;
pub mod chat;
pub mod generate;
pub mod lsp;
pub mod lsp_store;
pub mod models;
pub mod run;
pub mod serve;
pub mod tokenize;
