//! PML source to the runtime's plan types, in one place: a schema's text parsed, checked and laid
//! out ([`lay_out_source`]), a prompt's text parsed and bound to it ([`bind_source`]). Hosts that
//! run prompts (the CLI, the server) call these through the runtime, which sees only the results
//! — [`LaidOutSchema`], [`BoundPrompt`] and diagnostics — never the syntax tree's parser.

use pml_syntax::ast::{Schema, SourceFile};
use pml_syntax::{Diagnostic, parse};

use crate::chat_template::ChatTemplate;
use crate::plan::{BoundPrompt, SchemaLayout};
use crate::{SchemaIndex, SourceLoader, Tokenizer, bind_prompt, layout_schema};

/// A schema parsed, indexed and laid out for one model.
#[derive(Clone, Debug)]
pub struct LaidOutSchema {
    pub schema: Schema,
    pub index: SchemaIndex,
    pub layout: SchemaLayout,
}

/// Why a source did not become a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The source has errors (syntax, checks, layout or binding); render them with its text.
    #[error("the {what} has {} error(s)", diagnostics.len())]
    Diagnostics {
        what: &'static str,
        diagnostics: Vec<Diagnostic>,
    },
    #[error("expected a {expected}, but the file holds {found}")]
    WrongKind {
        expected: &'static str,
        found: &'static str,
    },
}

/// The model's view that layout and binding need.
#[derive(Clone, Copy)]
pub struct PlanModel<'a> {
    pub tokenizer: &'a dyn Tokenizer,
    pub template: &'a ChatTemplate,
    /// The model's context length.
    pub max_positions: u32,
}

/// Parses, checks and lays out a schema's source; `loader` reads its `src` files.
pub fn lay_out_source(
    schema_source: &str,
    model: PlanModel<'_>,
    loader: &dyn SourceLoader,
) -> Result<LaidOutSchema, PlanError> {
    let schema = match parse_source(schema_source, "schema")? {
        SourceFile::Schema(schema) => schema,
        other => return Err(wrong_kind("schema", &other)),
    };
    let index = SchemaIndex::build(&schema);
    let layout = layout_schema(
        &schema,
        &index,
        schema_source,
        model.tokenizer,
        model.template,
        loader,
        model.max_positions,
    )
    .map_err(|diagnostics| PlanError::Diagnostics {
        what: "schema",
        diagnostics,
    })?;
    Ok(LaidOutSchema {
        schema,
        index,
        layout,
    })
}

/// Binds a prompt's source to a laid-out schema, with the generation prompt at the end.
pub fn bind_source(
    schema: &LaidOutSchema,
    prompt_source: &str,
    model: PlanModel<'_>,
) -> Result<BoundPrompt, PlanError> {
    let prompt = match parse_source(prompt_source, "prompt")? {
        SourceFile::Prompt(prompt) => prompt,
        other => return Err(wrong_kind("prompt", &other)),
    };
    bind_prompt(
        &prompt,
        &schema.index,
        &schema.layout,
        prompt_source,
        model.tokenizer,
        model.template,
        true,
    )
    .map_err(|diagnostics| PlanError::Diagnostics {
        what: "prompt",
        diagnostics,
    })
}

/// The parsed file, or its syntax errors.
fn parse_source(source: &str, what: &'static str) -> Result<SourceFile, PlanError> {
    let parse = parse(source);
    let errors: Vec<Diagnostic> = parse
        .diagnostics
        .into_iter()
        .filter(Diagnostic::is_error)
        .collect();
    if errors.is_empty() {
        Ok(parse.file)
    } else {
        Err(PlanError::Diagnostics {
            what,
            diagnostics: errors,
        })
    }
}

fn wrong_kind(expected: &'static str, found: &SourceFile) -> PlanError {
    let found = match found {
        SourceFile::Schema(_) => "a schema",
        SourceFile::Prompt(_) => "a prompt",
        SourceFile::Empty => "neither a schema nor a prompt",
    };
    PlanError::WrongKind { expected, found }
}
