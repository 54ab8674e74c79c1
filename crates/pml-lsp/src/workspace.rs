//! The open documents and what the server knows about them. Analyses are computed on demand and
//! cached: a document's analysis is valid until any document changes (a prompt's diagnostics
//! depend on its schema, which may be another open document); a schema file's check is cached by
//! revision (open documents) or by modification time and size (files on disk), so typing in a
//! prompt does not re-check its 1 MB schema. Open documents take precedence over the disk.

use crate::analysis::{Analysis, analyse};
use crate::document::Document;
use crate::schema_source::SchemaSource;
use crate::uri;
use lsp_types::{TextDocumentContentChangeEvent, Uri};
use pml_compiler::Tokenizer;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// One open document.
pub struct OpenDocument {
    pub uri: Uri,
    pub path: Option<PathBuf>,
    pub document: Document,
    /// Unique across the session (client versions restart when a file is reopened).
    revision: u64,
}

/// What a cached schema check was computed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stamp {
    Open(u64),
    Disk(Option<SystemTime>, u64),
}

#[derive(Default)]
pub struct Workspace {
    documents: HashMap<String, OpenDocument>,
    revision: u64,
    /// Bumped on every open, change, close and save: prompts' analyses depend on other files.
    generation: u64,
    analyses: RefCell<HashMap<String, (u64, Arc<Analysis>)>>,
    schemas: RefCell<HashMap<PathOrUri, CachedSchema>>,
    /// The model's tokenizer when the host loaded one: prompts' argument lengths are checked.
    tokenizer: Option<Arc<dyn Tokenizer>>,
}

/// A schema check and what it was computed from (`None`: the file is not a schema).
type CachedSchema = (Stamp, Option<Arc<SchemaSource>>);

/// Where a schema's text comes from.
struct Source {
    uri: Uri,
    path: Option<PathBuf>,
}

/// Cache key of a schema file: its path, or its URI when it has none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PathOrUri {
    Path(PathBuf),
    Uri(String),
}

impl Workspace {
    pub fn new(tokenizer: Option<Arc<dyn Tokenizer>>) -> Self {
        Workspace {
            tokenizer,
            ..Workspace::default()
        }
    }

    pub fn tokenizer(&self) -> Option<&dyn Tokenizer> {
        self.tokenizer.as_deref()
    }

    pub fn open(&mut self, uri: Uri, text: String, version: i32) {
        self.revision += 1;
        self.generation += 1;
        let document = OpenDocument {
            path: uri::to_path(&uri),
            uri: uri.clone(),
            document: Document::new(text, version),
            revision: self.revision,
        };
        self.documents.insert(uri.as_str().to_string(), document);
    }

    /// Applies edits; `false` when the document is not open.
    pub fn change(
        &mut self,
        uri: &Uri,
        version: i32,
        changes: Vec<TextDocumentContentChangeEvent>,
    ) -> bool {
        self.revision += 1;
        self.generation += 1;
        let revision = self.revision;
        match self.documents.get_mut(uri.as_str()) {
            Some(open) => {
                open.document.apply(version, changes);
                open.revision = revision;
                true
            }
            None => false,
        }
    }

    pub fn close(&mut self, uri: &Uri) {
        self.generation += 1;
        self.documents.remove(uri.as_str());
        self.analyses.borrow_mut().remove(uri.as_str());
        self.schemas
            .borrow_mut()
            .remove(&PathOrUri::Uri(uri.as_str().to_string()));
    }

    /// A file was saved or changed on disk: analyses that read it must be redone.
    pub fn touch(&mut self) {
        self.generation += 1;
    }

    pub fn document(&self, uri: &Uri) -> Option<&OpenDocument> {
        self.documents.get(uri.as_str())
    }

    pub fn documents(&self) -> impl Iterator<Item = &OpenDocument> {
        self.documents.values()
    }

    /// The analysis of an open document (cached until the next edit anywhere).
    pub fn analysis(&self, uri: &Uri) -> Option<Arc<Analysis>> {
        let open = self.document(uri)?;
        if let Some((generation, analysis)) = self.analyses.borrow().get(uri.as_str())
            && *generation == self.generation
        {
            return Some(Arc::clone(analysis));
        }
        let analysis = Arc::new(analyse(self, open));
        self.analyses.borrow_mut().insert(
            uri.as_str().to_string(),
            (self.generation, Arc::clone(&analysis)),
        );
        Some(analysis)
    }

    /// The open document's text checked as a schema; `None` when it is not one.
    pub fn open_schema(&self, open: &OpenDocument) -> Option<Arc<SchemaSource>> {
        let key = match &open.path {
            Some(path) => PathOrUri::Path(path.clone()),
            None => PathOrUri::Uri(open.uri.as_str().to_string()),
        };
        let source = Source {
            uri: open.uri.clone(),
            path: open.path.clone(),
        };
        self.cached_schema(key, Stamp::Open(open.revision), source, || {
            Some(open.document.text().to_string())
        })
    }

    /// The schema at `path`: its open document if there is one, else the file on disk.
    pub fn schema_at(&self, path: &Path) -> Option<Arc<SchemaSource>> {
        if let Some(open) = self.open_at(path) {
            return self.open_schema(open);
        }
        let metadata = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        let stamp = Stamp::Disk(metadata.modified().ok(), metadata.len());
        let source = Source {
            uri: uri::from_path(path)?,
            path: Some(path.to_path_buf()),
        };
        self.cached_schema(PathOrUri::Path(path.to_path_buf()), stamp, source, || {
            std::fs::read_to_string(path).ok()
        })
    }

    /// The open document at `path`.
    pub fn open_at(&self, path: &Path) -> Option<&OpenDocument> {
        self.documents
            .values()
            .find(|open| open.path.as_deref() == Some(path))
    }

    fn cached_schema(
        &self,
        key: PathOrUri,
        stamp: Stamp,
        source: Source,
        read: impl FnOnce() -> Option<String>,
    ) -> Option<Arc<SchemaSource>> {
        if let Some((cached, schema)) = self.schemas.borrow().get(&key)
            && *cached == stamp
        {
            return schema.clone();
        }
        let text = read()?;
        let schema = SchemaSource::check(source.uri, source.path, text).map(Arc::new);
        self.schemas
            .borrow_mut()
            .insert(key, (stamp, schema.clone()));
        schema
    }
}
