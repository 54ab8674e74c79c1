//! Compiler: semantic checks of schemas and prompts, chat templates, layout and prompt binding.
//!
//! Architecture invariant: this crate knows nothing of tensors or model weights; it sees a model
//! only through the [`Tokenizer`] trait and chat-template strings.
//!
//! The checker's entry points are [`check_schema`], [`check_prompt`] and [`check_source`]; the
//! resolved schema model that later stages build on is [`SchemaIndex`]; every diagnostic code is
//! documented in [`rules`]. [`layout_schema`] lays a schema out on a model's positions and
//! [`bind_prompt`] binds a prompt to that layout, producing the [`plan`] types the runtime runs.

pub mod bind;
pub mod chat_template;
pub mod check;
pub mod conversation;
pub mod decoding_schema;
pub mod json_bounds;
pub mod layout;
pub mod lazy_tool_grammar;
pub mod plan;
pub mod rules;
pub mod schema_index;
pub mod schema_search;
pub mod source_loader;
pub mod source_plan;
pub mod suggest;
pub mod template_render;
#[cfg(test)]
mod test_sources;
/// Test scaffolding (stand-ins, fixtures): compiled for this crate's tests and for crates that
/// enable `test-support` in their dev-dependencies, never into a shipped binary.
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tokenizer;
pub mod tool_calls;

pub use bind::bind_prompt;
pub use check::{
    CheckEnvironment, FileCheck, PromptCheckOptions, ResolvedSchema, SchemaCheck, SchemaLookup,
    SchemaResolver, check_prompt, check_schema, check_source,
};
pub use layout::{layout_schema, unit_of};
/// The diagnostics a [`PlanError`] carries, for hosts that render them.
pub use pml_syntax::Diagnostic;
pub use rules::all_rules;
pub use schema_index::{MAX_SCHEMA_NAME_CHARS, ModuleId, SchemaIndex, Scope};
pub use schema_search::SchemaSearch;
pub use source_loader::{
    FsSourceLoader, MAX_SOURCE_BYTES, MemorySourceLoader, ReadFileError, RefuseSources,
    SourceError, SourceLoader, check_source_size, read_regular_file,
};
pub use source_plan::{LaidOutSchema, PlanError, PlanModel, bind_source, lay_out_source};
pub use tokenizer::{TokenizeError, Tokenizer};
