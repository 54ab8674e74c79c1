//! Kernel data that is either built in memory or read in place from a mapped file (the layout
//! cache, `model::layout_cache`): a [`Slab`] derefs to the same slice either way, so the kernels
//! never know which.
//!
//! A mapped slab costs no fresh memory: the file's pages are already in the page cache after the
//! run that wrote it, where a built layout faults in (and the OS zeroes) every page it fills —
//! on a virtual machine the larger part of a model load.

use std::fs::File;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

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
