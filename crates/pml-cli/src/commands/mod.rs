//! Subcommands of the `pml` binary, one module each.

pub mod generate;
pub mod models;
