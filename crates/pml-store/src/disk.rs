//! The disk tier: one sealed safetensors file per key under `<root>/objects/<first two hex
//! digits>/<key>.safetensors`, written atomically ([`super::atomic_file`]) and memory-mapped to
//! load: the checksum is verified over the map and each tensor copied once, from the map into
//! its storage, instead of the whole file being read into a buffer and then copied again. A file
//! that fails its checksum or its checks is removed and reported as [`StoreError::Corrupt`], so
//! the caller re-encodes; a file for another model (or stored dtype) is left alone.
//!
//! Safe under concurrent writers, threads or processes: an entry is a single file published by
//! one rename, and two writers of one key write identical bytes (the key fixes the content).
//!
//! With a byte budget ([`DiskTier::with_budget`]) a hit refreshes its file's modification time
//! and a put that takes the tier over budget scans the entries and removes the least recently
//! used (oldest modification time) down to 90% of the budget, so scans stay rare. Several
//! processes may share the folder: each scan measures what is really there.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use super::StoreError;
use super::atomic_file::{self, write_atomically};
use super::key::StoreKey;
use super::state::{ModuleState, StateSpec};
use super::tier::{PutOutcome, Tier, TierCounters, TierStats};

/// Disk tier of one model's states under a root directory.
#[derive(Debug)]
pub struct DiskTier {
    root: PathBuf,
    spec: StateSpec,
    budget_bytes: Option<u64>,
    /// Bytes held as of the last scan plus this process's puts since (only kept with a budget).
    resident_bytes: AtomicU64,
    /// One eviction scan at a time in this process.
    eviction: Mutex<()>,
    counters: TierCounters,
}

/// One entry file found by a scan.
struct EntryFile {
    path: PathBuf,
    bytes: u64,
    modified: SystemTime,
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
            budget_bytes: None,
            resident_bytes: AtomicU64::new(0),
            eviction: Mutex::new(()),
            counters: TierCounters::default(),
        })
    }

    /// Bounds the tier to `budget_bytes` (none: unbounded), measuring what it holds now.
    pub fn with_budget(mut self, budget_bytes: Option<u64>) -> Result<Self, StoreError> {
        self.budget_bytes = budget_bytes;
        if budget_bytes.is_some() {
            let held = self.scan()?.iter().map(|entry| entry.bytes).sum();
            self.resident_bytes.store(held, Ordering::Relaxed);
        }
        Ok(self)
    }

    pub fn budget_bytes(&self) -> Option<u64> {
        self.budget_bytes
    }

    /// Every entry file under `objects/` (temporaries excluded).
    fn scan(&self) -> Result<Vec<EntryFile>, StoreError> {
        let objects = self.root.join("objects");
        let mut found = Vec::new();
        let shards =
            fs::read_dir(&objects).map_err(|error| StoreError::io("list", &objects, error))?;
        for shard in shards {
            let shard = shard.map_err(|error| StoreError::io("list", &objects, error))?;
            let files = match fs::read_dir(shard.path()) {
                Ok(files) => files,
                // A stray file beside the shards, or a shard removed since the listing.
                Err(_) => continue,
            };
            for file in files.flatten() {
                let path = file.path();
                if path
                    .extension()
                    .is_none_or(|extension| extension != "safetensors")
                {
                    continue;
                }
                // Removed by another process since the listing: not ours to count.
                let Ok(metadata) = file.metadata() else {
                    continue;
                };
                found.push(EntryFile {
                    path,
                    bytes: metadata.len(),
                    modified: metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
        Ok(found)
    }

    /// Removes least recently used entries until the tier holds at most 90% of its budget.
    fn evict_over_budget(&self, budget: u64) -> Result<(), StoreError> {
        let _evicting = self.eviction.lock().unwrap_or_else(PoisonError::into_inner);
        if self.resident_bytes.load(Ordering::Relaxed) <= budget {
            return Ok(());
        }
        let mut entries = self.scan()?;
        let mut held: u64 = entries.iter().map(|entry| entry.bytes).sum();
        let target = budget / 10 * 9;
        entries.sort_by_key(|entry| entry.modified);
        for entry in entries {
            if held <= target {
                break;
            }
            match fs::remove_file(&entry.path) {
                Ok(()) => {
                    self.counters.evictions.fetch_add(1, Ordering::Relaxed);
                    held = held.saturating_sub(entry.bytes);
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    held = held.saturating_sub(entry.bytes);
                }
                Err(error) => return Err(StoreError::io("evict", entry.path, error)),
            }
        }
        self.resident_bytes.store(held, Ordering::Relaxed);
        Ok(())
    }

    /// `$PML_HOME/store` (default `~/.cache/pml/store`).
    pub fn default_root() -> Result<PathBuf, StoreError> {
        Ok(crate::pml_home().ok_or(StoreError::NoHome)?.join("store"))
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

    /// Maps and decodes the file of `key`; `Malformed` means the file is damaged.
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
        // The one `unsafe` outside pml-kernels (named in docs/architecture.md).
        #[allow(unsafe_code)]
        // SAFETY: a map is only sound while no one changes the file under it. Entry files are
        // never written in place: a put writes a temporary file and renames it over the entry
        // (`write_atomically`), and eviction and corruption handling unlink it; either leaves
        // this mapping on the old, unchanged inode, which lives as long as the map. The state
        // keeps the map (its K and V are read from it by the splice, never copied out first),
        // so this holds for the state's life: the store's own files are only replaced or
        // unlinked, and docs/architecture.md ("Stored states") tells users not to edit them in
        // place. Whatever the bytes hold, the checksum over the whole map is verified before
        // any state is built on it.
        let map = unsafe { memmap2::MmapOptions::new().map(file) }
            .map_err(|error| StoreError::io("map", path, error))?;
        let state = ModuleState::from_safetensors(Arc::new(map), key, &self.spec)?;
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
                if self.budget_bytes.is_some() {
                    // Recency for eviction only: a file whose time cannot be set is just older.
                    let _ = file.set_modified(SystemTime::now());
                }
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
        let len = bytes.len() as u64;
        if let Some(budget) = self.budget_bytes
            && len > budget
        {
            self.counters.rejected_puts.fetch_add(1, Ordering::Relaxed);
            return Ok(PutOutcome::TooLarge {
                bytes: len,
                budget_bytes: budget,
            });
        }
        write_atomically(&self.path_of(key), &bytes)?;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(len, Ordering::Relaxed);
        if let Some(budget) = self.budget_bytes {
            self.resident_bytes.fetch_add(len, Ordering::Relaxed);
            self.evict_over_budget(budget)?;
        }
        Ok(PutOutcome::Stored { bytes: len })
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
        let resident = self
            .budget_bytes
            .map(|_| self.resident_bytes.load(Ordering::Relaxed));
        self.counters.snapshot(self.name(), resident, None)
    }

    fn is_shared(&self) -> bool {
        true
    }
}
