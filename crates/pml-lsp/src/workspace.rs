//! The open documents, and the schema checks read from them and from the disk. A schema file's
//! check is cached by revision (open documents) or by modification time and size (files on
//! disk), so typing in a prompt does not re-check its 1 MB schema. Open documents take precedence
//! over the disk. Analyses, which depend on several documents, are cached a layer up
//! (`analysis_cache`), keyed by this workspace's generation.

use crate::document::{Document, TextChange};
use crate::schema_source::SchemaSource;
use crate::uri::{self, DocumentUri};
use pml_compiler::Tokenizer;
use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// One open document.
pub struct OpenDocument {
    pub uri: DocumentUri,
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
    documents: HashMap<DocumentUri, OpenDocument>,
    revision: u64,
    /// Bumped on every open, change, close and save: prompts' analyses depend on other files.
    generation: u64,
    schemas: RefCell<HashMap<PathOrUri, CachedSchema>>,
    /// The model's tokenizer when the host loaded one: prompts' argument lengths are checked.
    tokenizer: Option<Arc<dyn Tokenizer>>,
}

/// A schema check and what it was computed from (`None`: the file is not a schema).
type CachedSchema = (Stamp, Option<Arc<SchemaSource>>);

/// Where a schema's text comes from.
struct Source {
    uri: DocumentUri,
    path: Option<PathBuf>,
}

/// Cache key of a schema file: its path, or its URI when it has none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PathOrUri {
    Path(PathBuf),
    Uri(DocumentUri),
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

    pub fn open(&mut self, uri: DocumentUri, text: String, version: i32) {
        self.revision += 1;
        self.generation += 1;
        let document = OpenDocument {
            path: uri::to_path(&uri),
            uri: uri.clone(),
            document: Document::new(text, version),
            revision: self.revision,
        };
        self.documents.insert(uri, document);
    }

    /// Applies edits; `false` when the document is not open.
    pub fn change(&mut self, uri: &DocumentUri, version: i32, changes: Vec<TextChange>) -> bool {
        self.revision += 1;
        self.generation += 1;
        let revision = self.revision;
        match self.documents.get_mut(uri) {
            Some(open) => {
                open.document.apply(version, changes);
                open.revision = revision;
                true
            }
            None => false,
        }
    }

    pub fn close(&mut self, uri: &DocumentUri) {
        self.generation += 1;
        self.documents.remove(uri);
        self.schemas
            .borrow_mut()
            .remove(&PathOrUri::Uri(uri.clone()));
    }

    /// A file was saved or changed on disk: analyses that read it must be redone.
    pub fn touch(&mut self) {
        self.generation += 1;
    }

    /// Changes whenever any document opens, changes, closes or is saved.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn document(&self, uri: &DocumentUri) -> Option<&OpenDocument> {
        self.documents.get(uri)
    }

    pub fn documents(&self) -> impl Iterator<Item = &OpenDocument> {
        self.documents.values()
    }

    /// The open document's text checked as a schema; `None` when it is not one.
    pub fn open_schema(&self, open: &OpenDocument) -> Option<Arc<SchemaSource>> {
        let key = match &open.path {
            Some(path) => PathOrUri::Path(path.clone()),
            None => PathOrUri::Uri(open.uri.clone()),
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
            // Regular files only, checked again at the read: a FIFO would block the server.
            pml_compiler::read_regular_file(path)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
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
