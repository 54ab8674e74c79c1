//! Shared code of the `pmlc` and `pml` binaries: file discovery, diagnostic output, the path
//! from files to a laid-out schema and a bound prompt, compiling, model fetching, exit statuses.

pub mod blend_args;
pub mod check_command;
pub mod compile_command;
pub mod diagnostic_output;
pub mod encode_progress;
pub mod explain_command;
pub mod failure;
pub mod fetch_progress;
pub mod logging;
pub mod model_fetch;
pub mod model_tokenizer;
pub mod pipeline;
pub mod plan_view;
pub mod recent_models;
pub mod run_command;
pub mod sampling_args;
pub mod schema_lookup;
pub mod source_file;
