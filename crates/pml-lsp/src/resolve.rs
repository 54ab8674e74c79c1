//! Finding a prompt's schema the way `pmlc check` does (`NAME.pml` beside the prompt, else any
//! `.pml` file in its folder whose root is `<schema name="NAME">`, sorted), except that open
//! documents take precedence over the disk and count as files of their folder even when unsaved.
//! A document that is not on disk (`untitled:`) is matched against the open schemas by name.

use crate::schema_source::SchemaSource;
use crate::workspace::{OpenDocument, Workspace};
use pml_compiler::check::{SchemaLookup, SchemaResolver};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
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
        let by_file_name = folder.join(format!("{name}.pml"));
        let mut others: BTreeSet<PathBuf> = pml_files_in(folder);
        others.extend(
            self.workspace
                .documents()
                .filter_map(|open| open.path.clone())
                .filter(|path| path.parent() == Some(folder) && is_pml(path)),
        );
        others.remove(&by_file_name);
        for candidate in std::iter::once(by_file_name.clone()).chain(others) {
            if candidate == *prompt_path {
                continue;
            }
            if let Some(schema) = self.workspace.schema_at(&candidate)
                && schema.name() == name
            {
                return self.found(schema);
            }
        }
        not_found(format!(
            "`{}` and the other `.pml` files in `{}`",
            by_file_name.display(),
            folder.display()
        ))
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
        open.sort_by(|a, b| a.uri.as_str().cmp(b.uri.as_str()));
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

fn is_pml(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "pml")
}

/// The `.pml` files directly in `folder`.
fn pml_files_in(folder: &Path) -> BTreeSet<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return BTreeSet::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| is_pml(path) && path.is_file())
        .collect()
}
