//! Finding the schema a prompt names, on the filesystem: the `--schema` file if one was given,
//! else `NAME.pml` or `NAME.xml` next to the prompt, else any `.pml` or `.xml` file in the prompt's folder whose root is
//! `<schema name="NAME">`. Schemas are read, parsed and checked once per run and shared.

use pml_compiler::check::{ResolvedSchema, SchemaLookup, SchemaResolver};
use pml_compiler::schema_search::pml_sources_in;
use pml_compiler::{FsSourceLoader, SchemaSearch, check_schema};
use pml_syntax::ast::SourceFile;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A parsed and checked schema file, or why the file is not one.
#[derive(Clone, Debug)]
pub enum SchemaFile {
    Schema(Arc<ResolvedSchema>),
    /// The file parsed, but its root is not `<schema>`.
    NotASchema,
    Unreadable(String),
}

/// Schemas found so far in this run, by path.
#[derive(Debug, Default)]
pub struct SchemaCache {
    files: HashMap<PathBuf, SchemaFile>,
}

impl SchemaCache {
    /// Reads, parses and checks the schema at `path` (once per run).
    pub fn load(&mut self, path: &Path) -> SchemaFile {
        let key = cache_key(path);
        if let Some(file) = self.files.get(&key) {
            return file.clone();
        }
        let file = read_schema(path);
        self.files.insert(key, file.clone());
        file
    }

    /// Records a schema already checked as one of the files on the command line, so prompts
    /// that name it do not parse it again.
    pub fn insert(&mut self, path: &Path, schema: ResolvedSchema) {
        self.files
            .insert(cache_key(path), SchemaFile::Schema(Arc::new(schema)));
    }
}

/// One key per file however it is named (`a.pml`, `./a.pml`, `dir/../a.pml`).
fn cache_key(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

fn read_schema(path: &Path) -> SchemaFile {
    let source = match crate::source_file::read_source(path) {
        Ok(source) => source,
        Err(error) => return SchemaFile::Unreadable(error.to_string()),
    };
    let parse = pml_syntax::parse(&source);
    let SourceFile::Schema(schema) = &parse.file else {
        return SchemaFile::NotASchema;
    };
    let folder = path.parent().unwrap_or(Path::new("."));
    let check = check_schema(schema, &FsSourceLoader::new(folder));
    let syntax_errors = parse
        .diagnostics
        .iter()
        .filter(|diagnostic| diagnostic.is_error())
        .count();
    SchemaFile::Schema(Arc::new(ResolvedSchema {
        error_count: syntax_errors + check.error_count(),
        index: check.index,
        location: path.display().to_string(),
    }))
}

/// Resolves the schema of one prompt file.
pub struct FsSchemaResolver<'a> {
    pub cache: &'a mut SchemaCache,
    /// `--schema FILE`: used for every prompt, whatever it names.
    pub explicit: Option<&'a Path>,
    /// The prompt's own path; its folder is searched, and it is never taken for its own schema.
    pub prompt_path: &'a Path,
}

impl SchemaResolver for FsSchemaResolver<'_> {
    fn resolve(&mut self, name: Option<&str>) -> SchemaLookup {
        if let Some(explicit) = self.explicit {
            return match self.cache.load(explicit) {
                SchemaFile::Schema(schema) => SchemaLookup::Found(schema),
                SchemaFile::NotASchema => {
                    not_found(format!("`{}`, which is not a schema", explicit.display()))
                }
                SchemaFile::Unreadable(reason) => not_found(format!(
                    "`{}`, which cannot be read ({reason})",
                    explicit.display()
                )),
            };
        }
        let folder = match self.prompt_path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let Some(name) = name else {
            return not_found(format!("`{}`", folder.display()));
        };
        let search = SchemaSearch::new(&folder, name, pml_sources_in(&folder));
        for candidate in search.candidates() {
            if same_file(candidate, self.prompt_path) {
                continue;
            }
            if let SchemaFile::Schema(schema) = self.cache.load(candidate)
                && schema
                    .index
                    .name()
                    .is_some_and(|schema_name| schema_name.text == name)
            {
                return SchemaLookup::Found(schema);
            }
        }
        not_found(search.looked_in())
    }
}

fn not_found(looked_in: String) -> SchemaLookup {
    SchemaLookup::NotFound { looked_in }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
