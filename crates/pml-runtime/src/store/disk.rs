//! The disk tier: one sealed safetensors file per key under `<root>/objects/<first two hex
//! digits>/<key>.safetensors`, written atomically ([`super::atomic_file`]) and read whole to
//! load (every load verifies the sha256 of every byte, so a memory map would save no I/O, and it
//! would need `unsafe`, which this project keeps to its kernels). A file that fails its checksum or its checks is removed and reported as
//! [`StoreError::Corrupt`], so the caller re-encodes; a file for another model is left alone.
//!
//! Safe under concurrent writers, threads or processes: an entry is a single file published by
//! one rename, and two writers of one key write identical bytes (the key fixes the content).

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::StoreError;
use super::atomic_file::{self, write_atomically};
use super::key::StoreKey;
use super::state::{ModuleState, StateSpec};
use super::tier::{PutOutcome, Tier, TierCounters, TierStats};
use crate::models::PmlHome;

/// Disk tier of one model's states under a root directory.
#[derive(Debug)]
pub struct DiskTier {
    root: PathBuf,
    spec: StateSpec,
    counters: TierCounters,
}

impl DiskTier {
    /// Opens (creating if needed) the tier under `root`.
    pub fn open(root: impl Into<PathBuf>, spec: StateSpec) -> Result<Self, StoreError> {
        let root = root.into();
        let objects = root.join("objects");
        fs::create_dir_all(&objects)
            .map_err(|error| StoreError::io("create directory", &objects, error))?;
        Ok(Self {
            root,
            spec,
            counters: TierCounters::default(),
        })
    }

    /// `$PML_HOME/store` (default `~/.cache/pml/store`).
    pub fn default_root() -> Result<PathBuf, StoreError> {
        let home = PmlHome::from_env().map_err(|_| StoreError::NoHome)?;
        Ok(home.root().join("store"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn spec(&self) -> &StateSpec {
        &self.spec
    }

    /// Removes temporary files older than `older_than` that crashed writers left anywhere in
    /// the store (entries and manifests); returns how many. An hour is a safe age: a write takes
    /// well under a second.
    pub fn remove_stale_temporaries(&self, older_than: Duration) -> Result<usize, StoreError> {
        atomic_file::remove_stale_temporaries(&self.root, older_than)
    }

    /// Where the entry of `key` lives.
    pub fn path_of(&self, key: &StoreKey) -> PathBuf {
        self.root
            .join("objects")
            .join(key.shard())
            .join(format!("{key}.safetensors"))
    }

    /// Reads and decodes the file of `key`; `Malformed` means the file is damaged.
    fn load(&self, key: &StoreKey, file: &File, path: &Path) -> Result<ModuleState, StoreError> {
        let len = file
            .metadata()
            .map_err(|error| StoreError::io("inspect", path, error))?
            .len();
        if len < 8 {
            return Err(StoreError::Malformed(format!(
                "truncated: only {len} bytes"
            )));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        (&*file)
            .read_to_end(&mut bytes)
            .map_err(|error| StoreError::io("read", path, error))?;
        let state = ModuleState::from_safetensors(&bytes, key, &self.spec)?;
        self.counters.bytes_read.fetch_add(len, Ordering::Relaxed);
        Ok(state)
    }
}

impl Tier for DiskTier {
    fn name(&self) -> &'static str {
        "disk"
    }

    fn get(&self, key: &StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError> {
        let path = self.path_of(key);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
            Err(error) => return Err(StoreError::io("open", path, error)),
        };
        match self.load(key, &file, &path) {
            Ok(state) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                Ok(Some(Arc::new(state)))
            }
            Err(StoreError::Malformed(reason)) => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                // Gone already is fine: another reader may have removed it first.
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => return Err(StoreError::io("remove corrupt file", path, error)),
                }
                Err(StoreError::Corrupt {
                    key: key.to_string(),
                    location: path.display().to_string(),
                    reason,
                })
            }
            Err(error) => Err(error),
        }
    }

    fn put(&self, key: &StoreKey, state: &Arc<ModuleState>) -> Result<PutOutcome, StoreError> {
        let bytes = state.to_safetensors(key, &self.spec)?;
        write_atomically(&self.path_of(key), &bytes)?;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let bytes = bytes.len() as u64;
        self.counters
            .bytes_written
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(PutOutcome::Stored { bytes })
    }

    fn contains(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let path = self.path_of(key);
        match fs::metadata(&path) {
            Ok(metadata) => Ok(metadata.is_file()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(StoreError::io("inspect", path, error)),
        }
    }

    fn remove(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let path = self.path_of(key);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(StoreError::io("remove", path, error)),
        }
    }

    fn stats(&self) -> TierStats {
        self.counters.snapshot(self.name(), None, None)
    }
}
