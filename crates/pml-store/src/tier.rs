//! The [`Tier`] interface every storage level implements (host RAM, disk, Redis), what a put
//! reports ([`PutOutcome`]), and the counters each tier keeps ([`TierStats`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::StoreError;
use super::key::StoreKey;
use super::state::ModuleState;

/// One storage level of the [`super::ModuleStore`]. Implementations are shared between threads
/// (`&self` everywhere) and keep their own counters.
pub trait Tier: Send + Sync {
    /// Short name for statistics and reports (`"device"`, `"ram"`, `"disk"`, `"redis"`).
    fn name(&self) -> &'static str;

    /// Whether a hit hands out a state already in memory (device or host RAM), with nothing to
    /// read or decode: what makes streaming its layers pointless.
    fn is_memory(&self) -> bool {
        false
    }

    /// The state under `key`, `None` on a miss. A damaged entry is dropped by the tier and
    /// reported as [`StoreError::Corrupt`].
    fn get(&self, key: &StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError>;

    /// Stores `state` under `key`, replacing any entry (same key, same content).
    fn put(&self, key: &StoreKey, state: &Arc<ModuleState>) -> Result<PutOutcome, StoreError>;

    /// Whether `key` is present, without counting a hit or reading the state.
    fn contains(&self, key: &StoreKey) -> Result<bool, StoreError>;

    /// Drops `key`; `true` if it was present.
    fn remove(&self, key: &StoreKey) -> Result<bool, StoreError>;

    fn stats(&self) -> TierStats;

    /// Whether other processes see what this tier holds (a folder, a server), so that encoding
    /// a key is worth coordinating with them ([`super::UnitLocks`]).
    fn is_shared(&self) -> bool {
        false
    }
}

/// What a tier did with a put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored, occupying `bytes` in this tier (the file size on disk: what a manifest records).
    Stored { bytes: u64 },
    /// The state alone exceeds the tier's budget, so it was not cached.
    TooLarge { bytes: u64, budget_bytes: u64 },
    /// A remote tier could not be reached (or timed out): nothing was stored, and the other
    /// tiers carry on without it.
    Unavailable,
}

/// A snapshot of one tier's counters since it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub tier: &'static str,
    pub hits: u64,
    pub misses: u64,
    pub puts: u64,
    /// Puts refused as [`PutOutcome::TooLarge`].
    pub rejected_puts: u64,
    pub evictions: u64,
    /// Entries found damaged and dropped.
    pub corrupt: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Operations skipped or failed because a remote backend was unreachable or too slow (each
    /// such get counts as a miss too).
    pub unavailable: u64,
    /// Bytes held now, where the tier tracks it (the disk tier does not scan its directory).
    pub resident_bytes: Option<u64>,
    pub entries: Option<u64>,
}

/// The counters behind [`TierStats`], updated without locks.
#[derive(Debug, Default)]
pub(crate) struct TierCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub puts: AtomicU64,
    pub rejected_puts: AtomicU64,
    pub evictions: AtomicU64,
    pub corrupt: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub unavailable: AtomicU64,
}

impl TierCounters {
    pub fn snapshot(
        &self,
        tier: &'static str,
        resident_bytes: Option<u64>,
        entries: Option<u64>,
    ) -> TierStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TierStats {
            tier,
            hits: load(&self.hits),
            misses: load(&self.misses),
            puts: load(&self.puts),
            rejected_puts: load(&self.rejected_puts),
            evictions: load(&self.evictions),
            corrupt: load(&self.corrupt),
            bytes_read: load(&self.bytes_read),
            bytes_written: load(&self.bytes_written),
            unavailable: load(&self.unavailable),
            resident_bytes,
            entries,
        }
    }
}
