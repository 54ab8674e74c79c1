//! The layout cache: the matrices our kernels multiply, in their layouts (interleaved panels,
//! groups of blocks), and lookup tables as stored, written to one file per model file after
//! its first load and mapped by every later one. A load then builds nothing and allocates no
//! fresh memory for those matrices: the file's pages are already in the page cache, where a
//! built layout has the OS fault in and zero every page it fills (on a virtual machine, most
//! of a model load). llama.cpp maps its GGUF the same way; our layouts differ from GGUF's
//! blocks, so they get a file of their own.
//!
//! A file is named by a key of the model file's fingerprint, size and modification time, this
//! format's version and the program's, so another model file, an edited one or another PML
//! never reads it. Before any matrix is served, the smallest cached matrix of each layout
//! kind and stored type is built again from the model file and must equal its cached bytes:
//! a changed layout function (a code change without a version bump) or a damaged file turns
//! the whole cache off for that load, and the load writes a new file. Writes go to a
//! temporary file, synced, then renamed over the name (never a half-written cache, and a file
//! another process maps keeps its bytes). The directory keeps the [`KEPT_FILES`] most recently
//! used files. The cache never fails a load: what it cannot read or write it logs and skips.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

use candle_core::quantized::GgmlDType;
use sha2::{Digest, Sha256};

use super::EngineError;
use super::layout_file::{CacheFile, Entry, Layout, read_file, touch, trim_dir, write_file};
use super::stored_rows::StoredRows;
use super::weights::{CachedLayout, TensorSource, WeightFormat, native_layouts};
use crate::device::Backend;
use crate::gguf::GgufFile;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::MappedSlice;
use pml_kernels::quant::QuantMatrix;

/// Bumped whenever a layout's bytes or this file format change.
const FORMAT_VERSION: u32 = 6;
/// Cache files kept in the directory (the most recently used).
pub const KEPT_FILES: usize = 4;
/// Bytes compared at each end of a lookup table when the cache is checked.
const ROWS_SAMPLE: usize = 4096;

/// One model file's layout cache during a load: what an earlier load left, and what this one
/// holds (written at [`LayoutCache::finish`] where anything had to be built).
#[derive(Debug)]
pub struct LayoutCache {
    dir: PathBuf,
    path: PathBuf,
    file: Option<CacheFile>,
    /// Whether the file's matrices are served: `None` until checked, on the first request.
    usable: Option<bool>,
    /// Every matrix the model holds that the cache covers, in load order.
    layouts: Vec<(String, GgmlDType, CachedLayout)>,
    built: usize,
}

impl LayoutCache {
    /// Whether a model loaded in `format` on `backend` has matrices the cache holds: our
    /// kernels' layouts, made for the quantized format on the native CPU path.
    pub fn serves(format: WeightFormat, backend: &Backend) -> bool {
        format == WeightFormat::Quantized && native_layouts(backend)
    }

    /// The cache in `dir` for `gguf`: its file mapped if an earlier load wrote one.
    pub fn open(dir: &Path, gguf: &GgufFile) -> Self {
        let path = dir.join(format!("{}.layout", cache_key(gguf)));
        let file = match read_file(&path) {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "layout cache unreadable; rebuilding it");
                None
            }
        };
        Self {
            dir: dir.to_owned(),
            path,
            file,
            usable: None,
            layouts: Vec::new(),
            built: 0,
        }
    }

    /// Matrix `name` from the file, once the file has passed its check.
    fn lookup(&mut self, name: &str, inner: &mut dyn TensorSource) -> Option<CachedLayout> {
        let usable = match self.usable {
            Some(usable) => usable,
            None => {
                let usable = self.check(inner);
                self.usable = Some(usable);
                usable
            }
        };
        let (file, entries) = self.file.as_ref().filter(|_| usable)?;
        let entry = entries.get(name)?;
        let slice = MappedSlice::new(file.clone(), entry.offset as usize, entry.len as usize)?;
        let layout = match entry.layout {
            Layout::Quant(shape) => QuantMatrix::from_layout(shape, slice)
                .map(|matrix| CachedLayout::Quant(Arc::new(matrix)))
                .map_err(EngineError::from),
            Layout::Rows {
                dtype,
                rows,
                columns,
            } => StoredRows::in_place(slice, dtype, rows, columns)
                .map(|rows| CachedLayout::Rows(Arc::new(rows))),
        };
        match layout {
            Ok(layout) => {
                self.layouts
                    .push((name.to_owned(), entry.stored_dtype, layout.clone()));
                Some(layout)
            }
            Err(error) => {
                tracing::warn!(name, %error, "cached layout refused; building it");
                None
            }
        }
    }

    fn record(&mut self, name: &str, stored_dtype: GgmlDType, layout: CachedLayout) {
        self.layouts.push((name.to_owned(), stored_dtype, layout));
        self.built += 1;
    }

    /// Builds the smallest cached matrix of each layout kind and stored type again from the
    /// model file: the file is used only if each equals its cached bytes.
    fn check(&self, inner: &mut dyn TensorSource) -> bool {
        let Some((file, entries)) = &self.file else {
            return false;
        };
        let mut probes: HashMap<String, (&String, &Entry)> = HashMap::new();
        for (name, entry) in entries {
            let group = match entry.layout {
                Layout::Quant(shape) => format!("{:?} from {:?}", shape.kind, entry.stored_dtype),
                Layout::Rows { dtype, .. } => format!("rows of {dtype:?}"),
            };
            let probe = probes.entry(group).or_insert((name, entry));
            if (entry.len, name) < (probe.1.len, probe.0) {
                *probe = (name, entry);
            }
        }
        let mut names: Vec<_> = probes.into_values().collect();
        names.sort_by_key(|(name, _)| *name);
        for (name, entry) in names {
            let cached = &file.bytes()[entry.offset as usize..][..entry.len as usize];
            let same = inner
                .stored(name)
                .and_then(|stored| rebuilt_equals(&stored, entry, cached));
            match same {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(name, path = %self.path.display(), "layout cache out of date; rebuilding it");
                    return false;
                }
                Err(error) => {
                    tracing::warn!(name, %error, "layout cache not checkable; rebuilding it");
                    return false;
                }
            }
        }
        true
    }

    /// Writes the file if this load built any matrix (on a thread of its own, so the model
    /// can run meanwhile: [`wait_for_writes`] waits for it), else marks the file recently used;
    /// then trims the directory to [`KEPT_FILES`] files.
    pub fn finish(self) {
        if self.built == 0 {
            self.finished(touch(&self.path));
            return;
        }
        let mut pending = PENDING_WRITES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Writers that are done have logged their result: nothing left to wait for.
        pending.retain(|(_, writer)| !writer.is_finished());
        // Models of one file loaded side by side (a test binary's threads) write it once.
        if pending.iter().any(|(path, _)| *path == self.path) {
            tracing::debug!(path = %self.path.display(), "layout cache already being written");
            return;
        }
        let path = self.path.clone();
        let writer = std::thread::Builder::new()
            .name("pml-layout-cache".to_string())
            .spawn(move || {
                let result = write_file(&self.path, &self.layouts);
                self.finished(result);
            });
        match writer {
            Ok(writer) => pending.push((path, writer)),
            Err(error) => tracing::warn!(%error, "layout cache not written: no thread"),
        }
    }

    fn finished(&self, result: std::io::Result<()>) {
        match result {
            Ok(()) if self.built > 0 => tracing::info!(
                path = %self.path.display(),
                matrices = self.layouts.len(),
                "layout cache written"
            ),
            Ok(()) => tracing::debug!(
                path = %self.path.display(),
                matrices = self.layouts.len(),
                "layouts read in place from the layout cache"
            ),
            Err(error) => {
                tracing::warn!(path = %self.path.display(), %error, "layout cache not written")
            }
        }
        if let Err(error) = trim_dir(&self.dir, KEPT_FILES) {
            tracing::warn!(dir = %self.dir.display(), %error, "layout cache directory not trimmed");
        }
    }
}

/// Cache files being written by [`LayoutCache::finish`], and their writers.
static PENDING_WRITES: Mutex<Vec<(PathBuf, JoinHandle<()>)>> = Mutex::new(Vec::new());

/// Held while writers taken from [`PENDING_WRITES`] are joined: a caller that finds the list
/// empty because another took its writer waits here until that writer is joined too.
static JOINING_WRITES: Mutex<()> = Mutex::new(());

/// Waits until every layout cache file this process started writing is written (or has
/// failed): a program calls it before it exits, or the file is not written. Safe from several
/// threads at once: none returns while a writer started before its call is still running.
pub fn wait_for_writes() {
    let _joining = JOINING_WRITES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let writers = std::mem::take(
        &mut *PENDING_WRITES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    for (_, writer) in writers {
        if writer.join().is_err() {
            tracing::warn!("a layout cache writer panicked");
        }
    }
}

/// A tensor source whose matrices come from a [`LayoutCache`] where it has them.
pub struct LayoutCached<'a> {
    pub inner: &'a mut dyn TensorSource,
    pub cache: LayoutCache,
}

impl TensorSource for LayoutCached<'_> {
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError> {
        self.inner.stored(name)
    }

    fn cached_layout(&mut self, name: &str) -> Option<CachedLayout> {
        self.cache.lookup(name, &mut *self.inner)
    }

    fn built_layout(&mut self, name: &str, stored_dtype: GgmlDType, layout: CachedLayout) {
        self.cache.record(name, stored_dtype, layout);
    }

    fn release(&mut self, name: &str) {
        self.inner.release(name);
    }

    fn mapped(&mut self, name: &str) -> Option<MappedSlice> {
        self.inner.mapped(name)
    }
}

/// Whether building `stored` as `entry` says gives `cached` again (for a lookup table, its
/// shape and the bytes at both ends).
fn rebuilt_equals(
    stored: &StoredTensor<'_>,
    entry: &Entry,
    cached: &[u8],
) -> Result<bool, EngineError> {
    if stored.dtype() != entry.stored_dtype {
        return Ok(false);
    }
    let (out_features, in_features) = stored.dims2()?;
    Ok(match entry.layout {
        Layout::Quant(shape) => {
            let built =
                QuantMatrix::from_bytes(stored.bytes(), stored.dtype(), out_features, in_features)?;
            built.layout() == (shape, cached)
        }
        Layout::Rows { rows, columns, .. } => {
            let bytes = stored.bytes();
            let sample = ROWS_SAMPLE.min(bytes.len());
            (rows, columns) == (out_features, in_features)
                && bytes.len() == cached.len()
                && bytes[..sample] == cached[..sample]
                && bytes[bytes.len() - sample..] == cached[cached.len() - sample..]
        }
    })
}

/// The file's name: everything that decides its bytes.
fn cache_key(gguf: &GgufFile) -> String {
    let mut hasher = Sha256::new();
    hasher.update(FORMAT_VERSION.to_le_bytes());
    hasher.update(env!("CARGO_PKG_VERSION"));
    hasher.update(std::env::consts::ARCH);
    hasher.update(if cfg!(target_endian = "little") {
        "le"
    } else {
        "be"
    });
    hasher.update(gguf.fingerprint());
    if let Ok(metadata) = std::fs::metadata(gguf.path()) {
        hasher.update(metadata.len().to_le_bytes());
        if let Ok(modified) = metadata.modified()
            && let Ok(since) = modified.duration_since(SystemTime::UNIX_EPOCH)
        {
            hasher.update(since.as_nanos().to_le_bytes());
        }
    }
    let digest = format!("{:x}", hasher.finalize());
    digest[..32].to_owned()
}
