//! The host-RAM tier, and the device tier: states shared as `Arc`s in a concurrent map, charged
//! against a byte budget and evicted least recently used first. The device tier
//! ([`MemoryTier::on_device`], `--store device:SIZE`) moves each state it takes onto the model's
//! device (a GPU's memory), so a hit splices with a copy inside the device; on the CPU the device
//! is host memory and the tier holds states as the RAM tier does.
//!
//! Recency is a global access counter stamped on an entry at every put and hit, so a hit takes
//! no lock beyond the map's shard; eviction scans for the smallest stamp. Modules number in the
//! hundreds or thousands, so the scan costs microseconds, which is nothing next to encoding a
//! module, and it only runs when a put goes over budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use candle_core::Device;
use dashmap::DashMap;

use super::StoreError;
use super::key::StoreKey;
use super::state::ModuleState;
use super::tier::{PutOutcome, Tier, TierCounters, TierStats};

/// Host-RAM tier with a byte budget and LRU eviction.
#[derive(Debug)]
pub struct MemoryTier {
    name: &'static str,
    /// Where states are held: `None` for host RAM (as they come), else moved onto this device.
    device: Option<Device>,
    entries: DashMap<StoreKey, MemoryEntry>,
    budget_bytes: u64,
    resident_bytes: AtomicU64,
    clock: AtomicU64,
    /// One evictor at a time, so two puts do not both evict for the same overshoot.
    eviction: Mutex<()>,
    counters: TierCounters,
}

#[derive(Debug)]
struct MemoryEntry {
    state: Arc<ModuleState>,
    bytes: u64,
    last_access: AtomicU64,
}

impl MemoryTier {
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            name: "ram",
            device: None,
            entries: DashMap::new(),
            budget_bytes,
            resident_bytes: AtomicU64::new(0),
            clock: AtomicU64::new(0),
            eviction: Mutex::new(()),
            counters: TierCounters::default(),
        }
    }

    /// The device tier: states moved onto `device` as they are put, up to `budget_bytes` of
    /// them there (LRU by bytes, as in RAM).
    pub fn on_device(budget_bytes: u64, device: Device) -> Self {
        Self {
            name: "device",
            device: Some(device),
            ..Self::new(budget_bytes)
        }
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    pub fn resident_bytes(&self) -> u64 {
        self.resident_bytes.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Evicts least recently used entries until the tier fits its budget.
    fn evict_over_budget(&self) {
        let _evicting = self.eviction.lock().unwrap_or_else(PoisonError::into_inner);
        while self.resident_bytes() > self.budget_bytes {
            // Copy the victim out so no shard lock is held when it is removed.
            let victim = self
                .entries
                .iter()
                .map(|entry| {
                    (
                        entry.last_access.load(Ordering::Relaxed),
                        entry.key().clone(),
                    )
                })
                .min();
            let Some((stamp, key)) = victim else {
                break;
            };
            // A hit since the scan makes it recent again: rescan rather than evict it.
            let removed = self.entries.remove_if(&key, |_, entry| {
                entry.last_access.load(Ordering::Relaxed) == stamp
            });
            if let Some((_, entry)) = removed {
                self.resident_bytes
                    .fetch_sub(entry.bytes, Ordering::Relaxed);
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Tier for MemoryTier {
    fn name(&self) -> &'static str {
        self.name
    }

    fn is_memory(&self) -> bool {
        true
    }

    fn get(&self, key: &StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError> {
        match self.entries.get(key) {
            Some(entry) => {
                entry.last_access.store(self.tick(), Ordering::Relaxed);
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_read
                    .fetch_add(entry.bytes, Ordering::Relaxed);
                Ok(Some(Arc::clone(&entry.state)))
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    fn put(&self, key: &StoreKey, state: &Arc<ModuleState>) -> Result<PutOutcome, StoreError> {
        let bytes = state.size_in_bytes() as u64;
        if bytes > self.budget_bytes {
            self.counters.rejected_puts.fetch_add(1, Ordering::Relaxed);
            return Ok(PutOutcome::TooLarge {
                bytes,
                budget_bytes: self.budget_bytes,
            });
        }
        let state = match &self.device {
            Some(device) => Arc::new(state.to_device(device)?),
            None => Arc::clone(state),
        };
        let entry = MemoryEntry {
            state,
            bytes,
            last_access: AtomicU64::new(self.tick()),
        };
        self.resident_bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(replaced) = self.entries.insert(key.clone(), entry) {
            self.resident_bytes
                .fetch_sub(replaced.bytes, Ordering::Relaxed);
        }
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_written
            .fetch_add(bytes, Ordering::Relaxed);
        self.evict_over_budget();
        Ok(PutOutcome::Stored { bytes })
    }

    fn contains(&self, key: &StoreKey) -> Result<bool, StoreError> {
        Ok(self.entries.contains_key(key))
    }

    fn remove(&self, key: &StoreKey) -> Result<bool, StoreError> {
        match self.entries.remove(key) {
            Some((_, entry)) => {
                self.resident_bytes
                    .fetch_sub(entry.bytes, Ordering::Relaxed);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn stats(&self) -> TierStats {
        self.counters.snapshot(
            self.name(),
            Some(self.resident_bytes()),
            Some(self.entries.len() as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::key::{ContextHash, StoreKeyParts};
    use pml_engine::kv_cache::KvBlock;

    /// A one-layer state of `n_tokens` rows of 1×4 f32: 40 bytes a token.
    fn state(n_tokens: usize) -> Arc<ModuleState> {
        let rows = || Tensor::zeros((n_tokens, 1, 4), candle_core::DType::F32, &Device::Cpu);
        let kv = KvBlock::new(vec![(rows().unwrap(), rows().unwrap())], vec![0; n_tokens]).unwrap();
        Arc::new(ModuleState::new(kv, vec![0; n_tokens]).unwrap())
    }

    fn key(index: u32) -> StoreKey {
        StoreKeyParts {
            model_fingerprint: "test",
            weight_format: Default::default(),
            kv_dtype: candle_core::DType::F32,
            state_dtype: candle_core::DType::F16,
            kind: Default::default(),
            encode_mode: Default::default(),
            tokens: &[index],
            positions: &[0],
            context: ContextHash::NONE,
        }
        .key()
    }

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let tier = MemoryTier::new(400);
        assert_eq!(state(4).size_in_bytes(), 160);
        tier.put(&key(1), &state(4)).unwrap();
        tier.put(&key(2), &state(4)).unwrap();
        assert_eq!(tier.resident_bytes(), 320);
        // Touch 1 so that 2 is the least recently used.
        assert!(tier.get(&key(1)).unwrap().is_some());
        tier.put(&key(3), &state(4)).unwrap();
        assert!(tier.contains(&key(1)).unwrap());
        assert!(
            !tier.contains(&key(2)).unwrap(),
            "2 was least recently used"
        );
        assert!(tier.contains(&key(3)).unwrap());
        assert_eq!(tier.resident_bytes(), 320);

        // A big entry pushes out both others, oldest first.
        tier.put(&key(4), &state(8)).unwrap();
        assert_eq!(tier.len(), 1);
        assert!(tier.get(&key(2)).unwrap().is_none());
        let stats = tier.stats();
        assert_eq!(
            (stats.hits, stats.misses, stats.puts, stats.evictions),
            (1, 1, 4, 3)
        );
        assert_eq!(stats.resident_bytes, Some(320));
        assert_eq!(stats.entries, Some(1));
    }

    #[test]
    fn too_large_is_refused_not_cached() {
        let tier = MemoryTier::new(100);
        let outcome = tier.put(&key(1), &state(3)).unwrap();
        assert_eq!(
            outcome,
            PutOutcome::TooLarge {
                bytes: 120,
                budget_bytes: 100
            }
        );
        assert!(tier.is_empty());
        assert_eq!(tier.resident_bytes(), 0);
        assert_eq!(tier.stats().rejected_puts, 1);
    }

    #[test]
    fn replacing_and_removing_keep_bytes_exact() {
        let tier = MemoryTier::new(1000);
        tier.put(&key(1), &state(2)).unwrap();
        tier.put(&key(1), &state(5)).unwrap();
        assert_eq!((tier.len(), tier.resident_bytes()), (1, 200));
        assert!(tier.remove(&key(1)).unwrap());
        assert!(!tier.remove(&key(1)).unwrap());
        assert_eq!((tier.len(), tier.resident_bytes()), (0, 0));
    }

    #[test]
    fn concurrent_puts_and_gets_stay_within_budget() {
        let tier = MemoryTier::new(40 * 50);
        std::thread::scope(|scope| {
            for thread in 0..4u32 {
                let tier = &tier;
                scope.spawn(move || {
                    for round in 0..200u32 {
                        let index = (thread * 7 + round) % 40;
                        tier.put(&key(index), &state(1 + (index as usize % 5)))
                            .unwrap();
                        tier.get(&key((index + 3) % 40)).unwrap();
                    }
                });
            }
        });
        let held: u64 = tier.entries.iter().map(|entry| entry.bytes).sum();
        assert_eq!(tier.resident_bytes(), held, "byte count drifted");
        assert!(held <= tier.budget_bytes());
    }
}
