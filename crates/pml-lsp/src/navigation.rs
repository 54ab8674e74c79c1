//! Go to definition (a prompt's import → the schema's module, an argument → the parameter,
//! `schema="..."` → the schema file) and find references (a module's imports across the open
//! prompts that use the same schema file, from the module in the schema or from any import).

use crate::analysis::{Analysis, DocumentKind};
use crate::analysis_cache::AnalysisCache;
use crate::locate::{
    PromptTarget, SchemaTarget, prompt_target, resolve_chain, resolved_imports, schema_target,
};
use crate::location::Location;
use crate::schema_source::SchemaSource;
use crate::workspace::Workspace;
use pml_compiler::ModuleId;
use pml_syntax::Span;

pub fn definition(analysis: &Analysis, offset: usize) -> Option<Location> {
    let schema = analysis.schema.as_deref()?;
    let index = schema.index();
    let span = match prompt_target(analysis.prompt()?, offset)? {
        PromptTarget::Import { chain } => module_name_span(schema, resolve_chain(index, &chain)?),
        PromptTarget::Argument { chain, argument } => {
            let module = index.module(resolve_chain(index, &chain)?);
            let param = module.param(&argument.name.text)?;
            param.name.as_ref().map_or(param.span, |name| name.span)
        }
        PromptTarget::SchemaName(_) => schema.schema.open_tag,
    };
    Some(location(schema, span))
}

/// Every import of the module at `offset` in the open prompts, and its declaration if asked.
pub fn references(
    workspace: &Workspace,
    analyses: &AnalysisCache,
    analysis: &Analysis,
    offset: usize,
    include_declaration: bool,
) -> Vec<Location> {
    let Some((schema, id)) = module_at(analysis, offset) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    if include_declaration {
        found.push(location(schema, module_name_span(schema, id)));
    }
    let mut documents: Vec<_> = workspace.documents().collect();
    documents.sort_by(|a, b| a.uri.cmp(&b.uri));
    for open in documents {
        let Some(other) = analyses.get(workspace, &open.uri) else {
            continue;
        };
        let (Some(prompt), Some(other_schema)) = (other.prompt(), other.schema.as_deref()) else {
            continue;
        };
        if !same_file(schema, other_schema) {
            continue;
        }
        let text = open.document.text();
        let lines = open.document.lines();
        found.extend(
            resolved_imports(prompt, other_schema.index())
                .into_iter()
                .filter(|(_, module)| *module == Some(id))
                .map(|(import, _)| Location {
                    uri: open.uri.clone(),
                    range: lines.range(text, import.name.span),
                }),
        );
    }
    found
}

fn module_at(analysis: &Analysis, offset: usize) -> Option<(&SchemaSource, ModuleId)> {
    let schema = analysis.schema.as_deref()?;
    let id = match &analysis.kind {
        DocumentKind::Schema => match schema_target(schema.index(), offset)? {
            SchemaTarget::Module(id) => id,
            SchemaTarget::Param(..) => return None,
        },
        DocumentKind::Prompt(prompt) => match prompt_target(prompt, offset)? {
            PromptTarget::Import { chain } => resolve_chain(schema.index(), &chain)?,
            _ => return None,
        },
        DocumentKind::Empty => return None,
    };
    Some((schema, id))
}

fn same_file(a: &SchemaSource, b: &SchemaSource) -> bool {
    match (&a.path, &b.path) {
        (Some(a), Some(b)) => a == b,
        _ => a.uri == b.uri,
    }
}

fn module_name_span(schema: &SchemaSource, id: ModuleId) -> Span {
    let module = schema.index().module(id);
    module
        .name
        .as_ref()
        .map_or(module.open_tag, |name| name.span)
}

fn location(schema: &SchemaSource, span: Span) -> Location {
    Location {
        uri: schema.uri.clone(),
        range: schema.lines.range(&schema.text, span),
    }
}
