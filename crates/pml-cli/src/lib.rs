//! Shared code of the `pmlc` and `pml` binaries: file discovery, diagnostic output.

pub mod check_command;
pub mod diagnostic_output;
pub mod explain_command;
pub mod schema_lookup;
