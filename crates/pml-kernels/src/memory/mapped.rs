//! Kernel data that is either built in memory or read in place from a mapped file (the layout
//! cache, `model::layout_cache`, or a GGUF file's lookup table): a [`Slab`] derefs to the same
//! slice either way, so the kernels never know which. Every map of a file is made here.
//!
//! A mapped slab costs no fresh memory: the file's pages are already in the page cache after the
//! run that wrote it, where a built layout faults in (and the OS zeroes) every page it fills —
//! on a virtual machine the larger part of a model load.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

/// Alignment of the ranges [`MappedFile::release`] drops: a multiple of every page size Linux
/// uses (4–64 KiB), so that a neighbour's bytes on a shared page stay mapped.
const RELEASE_UNIT: usize = 64 * 1024;

/// A read-only file mapped whole, shared by the slabs read from it.
#[derive(Debug)]
pub struct MappedFile {
    map: Mmap,
}

impl MappedFile {
    /// Maps `path` read-only, every page mapped up front (`MAP_POPULATE`, as llama.cpp maps
    /// its GGUF): pages left to fault in on first use would cost the first forward pass, and
    /// so the first time to first token, one fault per 64 KiB (Gemma-3's 170 MB vocabulary
    /// matrix, read whole for the first logits: +25 ms), where populating costs the load a
    /// fraction of that while the tokenizer, the longer part of it, builds on another core.
    pub fn open(path: &Path) -> std::io::Result<Arc<Self>> {
        let file = File::open(path)?;
        // SAFETY: a map is sound only while no one changes the file under it. The layout cache
        // never writes a file in place: it writes a temporary file and renames it over the old
        // name, so a mapped file keeps its bytes (its inode) for as long as the map lives. Editing
        // or truncating a cache file by hand while a model reads it is outside the contract, as
        // for the GGUF file itself (`gguf.rs`).
        let map = unsafe { MmapOptions::new().populate().map(&file) }?;
        Ok(Arc::new(Self { map }))
    }

    /// Maps a model file read-only, each page read when first touched: a loader copies most
    /// tensors out of it once ([`Self::release`] then drops their pages), and a lookup table
    /// read in place touches only the rows a prompt asks for.
    pub fn open_lazily(file: &File) -> std::io::Result<Arc<Self>> {
        // SAFETY: as in `open`: a model file is only read, and changing or truncating it while
        // a program maps it is outside the contract, as for llama.cpp, which maps its GGUF the
        // same way and keeps the map for the process's life.
        let map = unsafe { Mmap::map(file) }?;
        Ok(Arc::new(Self { map }))
    }

    /// Drops the process's pages of `range` (whole [`RELEASE_UNIT`]s inside it), which stay in
    /// the page cache: once a loader holds its own copy of a tensor, the model is resident
    /// once, not as its layouts plus the file's pages. Advice only: where it fails (or on
    /// another OS) the pages stay mapped.
    pub fn release(&self, range: std::ops::Range<usize>) {
        let unit = RELEASE_UNIT;
        let (first, end) = (range.start.next_multiple_of(unit), range.end / unit * unit);
        if end <= first || end > self.map.len() {
            return;
        }
        #[cfg(unix)]
        {
            // SAFETY: the map is read-only and backed by the file, so dropping its pages only
            // makes the next read of them fault the same bytes back in from the file (which no
            // one changes while it is mapped: `open_lazily`'s contract). No reference into the
            // map observes a change, so this is sound though memmap2 marks the advice unsafe.
            let advised = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    end - first,
                )
            };
            if let Err(error) = advised {
                tracing::debug!("cannot drop mapped pages: {error}");
            }
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// `bytes` bytes from `offset` in a mapped file.
#[derive(Clone, Debug)]
pub struct MappedSlice {
    file: Arc<MappedFile>,
    offset: usize,
    bytes: usize,
}

impl MappedSlice {
    /// The `bytes` bytes at `offset`, if the file holds them.
    pub fn new(file: Arc<MappedFile>, offset: usize, bytes: usize) -> Option<Self> {
        let end = offset.checked_add(bytes)?;
        (end <= file.bytes().len()).then_some(Self {
            file,
            offset,
            bytes,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.file.bytes()[self.offset..self.offset + self.bytes]
    }
}

/// Values of `T` owned in memory or read in place from a mapped file.
#[derive(Debug)]
pub enum Slab<T: bytemuck::Pod> {
    Owned(Vec<T>),
    /// Checked at construction ([`Slab::mapped`]) to be whole values of `T`, aligned for `T`.
    Mapped(MappedSlice),
}

impl<T: bytemuck::Pod> Slab<T> {
    /// The values stored in `slice`, if it holds a whole number of them at an address aligned
    /// for `T`.
    pub fn mapped(slice: MappedSlice) -> Option<Self> {
        bytemuck::try_cast_slice::<u8, T>(slice.bytes()).ok()?;
        Some(Self::Mapped(slice))
    }

    pub fn is_mapped(&self) -> bool {
        matches!(self, Slab::Mapped(_))
    }

    /// The values as bytes (what the layout cache writes).
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
}

impl<T: bytemuck::Pod> From<Vec<T>> for Slab<T> {
    fn from(values: Vec<T>) -> Self {
        Self::Owned(values)
    }
}

impl<T: bytemuck::Pod> Deref for Slab<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Slab::Owned(values) => values,
            // Size and alignment were checked when the slab was made, and the mapped bytes
            // never change, so this cast cannot fail.
            Slab::Mapped(slice) => bytemuck::cast_slice(slice.bytes()),
        }
    }
}
