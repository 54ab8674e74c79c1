//! Subcommands of the `pml` binary, one module each.

pub mod models;
