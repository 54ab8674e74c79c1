//! Finding a prompt's schema the way `pmlc check` does (`NAME.pml` or `NAME.xml` beside the prompt, else any
//! `.pml` or `.xml` file in its folder whose root is `<schema name="NAME">`, sorted: [`SchemaSearch`]), except that open
//! documents take precedence over the disk and count as files of their folder even when unsaved.
//! A document that is not on disk (`untitled:`) is matched against the open schemas by name.

use crate::schema_source::SchemaSource;
use crate::workspace::{OpenDocument, Workspace};
use pml_compiler::SchemaSearch;
use pml_compiler::check::{SchemaLookup, SchemaResolver};
use pml_compiler::schema_search::{is_pml_source, pml_sources_in};
use std::path::Path;
use std::sync::Arc;

pub struct WorkspaceResolver<'a> {
    pub workspace: &'a Workspace,
    pub prompt: &'a OpenDocument,
    /// The schema the last lookup found.
    pub found: Option<Arc<SchemaSource>>,
}

impl SchemaResolver for WorkspaceResolver<'_> {
    fn resolve(&mut self, name: Option<&str>) -> SchemaLookup {
        let Some(prompt_path) = &self.prompt.path else {
            return self.resolve_among_open(name);
        };
        let folder = prompt_path.parent().unwrap_or(Path::new("/"));
        let Some(name) = name else {
            return not_found(format!("`{}`", folder.display()));
        };
        let open_in_folder = self
            .workspace
            .documents()
            .filter_map(|open| open.path.clone())
            .filter(|path| path.parent() == Some(folder) && is_pml_source(path));
        let search = SchemaSearch::new(
            folder,
            name,
            pml_sources_in(folder).into_iter().chain(open_in_folder),
        );
        for candidate in search.candidates() {
            if candidate == prompt_path {
                continue;
            }
            if let Some(schema) = self.workspace.schema_at(candidate)
                && schema.name() == name
            {
                return self.found(schema);
            }
        }
        not_found(search.looked_in())
    }
}

impl WorkspaceResolver<'_> {
    fn found(&mut self, schema: Arc<SchemaSource>) -> SchemaLookup {
        let resolved = Arc::clone(&schema.resolved);
        self.found = Some(schema);
        SchemaLookup::Found(resolved)
    }

    fn resolve_among_open(&mut self, name: Option<&str>) -> SchemaLookup {
        let looked_in = "the open documents".to_string();
        let Some(name) = name else {
            return not_found(looked_in);
        };
        let mut open: Vec<&OpenDocument> = self
            .workspace
            .documents()
            .filter(|open| open.uri != self.prompt.uri)
            .collect();
        open.sort_by(|a, b| a.uri.cmp(&b.uri));
        for candidate in open {
            if let Some(schema) = self.workspace.open_schema(candidate)
                && schema.name() == name
            {
                return self.found(schema);
            }
        }
        not_found(looked_in)
    }
}

fn not_found(looked_in: String) -> SchemaLookup {
    SchemaLookup::NotFound { looked_in }
}
