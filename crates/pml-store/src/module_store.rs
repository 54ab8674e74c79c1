//! [`ModuleStore`]: a stack of [`Tier`]s, fastest first (RAM over disk by default, Redis last
//! when configured). Gets read through the stack and promote a hit into every faster tier; puts
//! write through to every tier; each tier keeps its own counters and budget. Manifests of
//! compiled schemas live beside the tiers.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::Device;

use super::StoreError;
use super::config::{StoreConfig, TierConfig};
use super::disk::DiskTier;
use super::key::StoreKey;
use super::manifest::{Manifest, ManifestLookup, ManifestStore};
use super::memory::MemoryTier;
use super::redis::RedisTier;
use super::state::{ModuleState, StateSpec};
use super::tier::{PutOutcome, Tier, TierStats};
use super::unit_lock::{UnitLock, UnitLocks};

/// A successful lookup: the state and the tier that had it.
#[derive(Clone, Debug)]
pub struct StoreHit {
    pub state: Arc<ModuleState>,
    pub tier: &'static str,
}

/// What one tier did with a put.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierPut {
    pub tier: &'static str,
    pub outcome: PutOutcome,
}

/// Counters of every tier, fastest first, and of failed promotions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub tiers: Vec<TierStats>,
    /// Hits that could not be copied into a faster tier (the get still succeeded).
    pub promotion_failures: u64,
}

/// The module store of one model: tiers, fastest first, and the manifests.
pub struct ModuleStore {
    spec: StateSpec,
    tiers: Vec<Box<dyn Tier>>,
    manifests: ManifestStore,
    /// Per-key locks in the store's folder, when a tier is shared with other processes.
    locks: Option<UnitLocks>,
    promotion_failures: AtomicU64,
}

impl ModuleStore {
    /// The tiers `config` lists, manifests under `config.root`; a device tier holds its states
    /// in host memory (see [`Self::open_on`]).
    pub fn open(config: &StoreConfig, spec: StateSpec) -> Result<Self, StoreError> {
        Self::open_on(config, spec, &Device::Cpu)
    }

    /// [`Self::open`] for a model on `device`, where a device tier holds its states.
    pub fn open_on(
        config: &StoreConfig,
        spec: StateSpec,
        device: &Device,
    ) -> Result<Self, StoreError> {
        let tiers = config
            .tiers
            .iter()
            .map(|tier| -> Result<Box<dyn Tier>, StoreError> {
                Ok(match tier {
                    TierConfig::Device { budget_bytes } => {
                        Box::new(MemoryTier::on_device(*budget_bytes, device.clone()))
                    }
                    TierConfig::Ram { budget_bytes } => Box::new(MemoryTier::new(*budget_bytes)),
                    TierConfig::Disk { root, budget_bytes } => {
                        Box::new(DiskTier::open(root, spec.clone())?.with_budget(*budget_bytes)?)
                    }
                    TierConfig::Redis(redis) => {
                        Box::new(RedisTier::open(redis.clone(), spec.clone())?)
                    }
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(Self::with_tiers(
            spec,
            tiers,
            ManifestStore::new(&config.root),
        ))
    }

    /// Any stack of tiers, fastest first.
    pub fn with_tiers(
        spec: StateSpec,
        tiers: Vec<Box<dyn Tier>>,
        manifests: ManifestStore,
    ) -> Self {
        let locks = tiers
            .iter()
            .any(|tier| tier.is_shared())
            .then(|| UnitLocks::new(manifests.store_root()));
        Self {
            spec,
            tiers,
            manifests,
            locks,
            promotion_failures: AtomicU64::new(0),
        }
    }

    /// Takes `key`'s lock among the processes sharing this store before encoding it (see
    /// [`UnitLocks`]); `on_wait` is called when another process holds it. `None` when no tier is
    /// shared (nobody else could use the state) or the file system cannot lock.
    pub fn lock(
        &self,
        key: &StoreKey,
        on_wait: &mut dyn FnMut(),
    ) -> Result<Option<UnitLock>, StoreError> {
        match &self.locks {
            Some(locks) => locks.lock(key, on_wait),
            None => Ok(None),
        }
    }

    pub fn spec(&self) -> &StateSpec {
        &self.spec
    }

    pub fn tiers(&self) -> &[Box<dyn Tier>] {
        &self.tiers
    }

    /// The state under `key` from the fastest tier that has it, copied into the faster ones.
    /// A damaged entry is removed and reported as [`StoreError::Corrupt`]: re-encode and put.
    pub fn get(&self, key: &StoreKey) -> Result<Option<StoreHit>, StoreError> {
        for (tier_idx, tier) in self.tiers.iter().enumerate() {
            let Some(state) = tier.get(key)? else {
                continue;
            };
            for faster in &self.tiers[..tier_idx] {
                // The state is in hand and valid; a faster tier refusing it costs speed only.
                if faster.put(key, &state).is_err() {
                    self.promotion_failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            return Ok(Some(StoreHit {
                state,
                tier: tier.name(),
            }));
        }
        Ok(None)
    }

    /// Writes `state` to every tier, slowest first, so that a state in a fast tier is durable.
    /// The state is converted to the store's dtype ([`StateSpec::state_dtype`]) first: every
    /// tier, RAM included, holds what a later get returns.
    pub fn put(&self, key: &StoreKey, state: ModuleState) -> Result<Vec<TierPut>, StoreError> {
        let state = state.to_dtype(self.spec.state_dtype)?;
        state.check_spec(&self.spec)?;
        let state = Arc::new(state);
        let mut outcomes = self
            .tiers
            .iter()
            .rev()
            .map(|tier| {
                Ok(TierPut {
                    tier: tier.name(),
                    outcome: tier.put(key, &state)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        outcomes.reverse();
        Ok(outcomes)
    }

    /// Whether any tier holds `key`.
    pub fn contains(&self, key: &StoreKey) -> Result<bool, StoreError> {
        Ok(self.tier_holding(key)?.is_some())
    }

    /// The name of the fastest tier holding `key` (`device`, `ram`, `disk`, `redis`), if any.
    pub fn tier_holding(&self, key: &StoreKey) -> Result<Option<&'static str>, StoreError> {
        for tier in &self.tiers {
            if tier.contains(key)? {
                return Ok(Some(tier.name()));
            }
        }
        Ok(None)
    }

    /// Drops `key` from every tier; `true` if any held it.
    pub fn remove(&self, key: &StoreKey) -> Result<bool, StoreError> {
        let mut removed = false;
        for tier in &self.tiers {
            removed |= tier.remove(key)?;
        }
        Ok(removed)
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            tiers: self.tiers.iter().map(|tier| tier.stats()).collect(),
            promotion_failures: self.promotion_failures.load(Ordering::Relaxed),
        }
    }

    /// Records a compiled schema (after its units are stored); returns the manifest's path.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<PathBuf, StoreError> {
        if manifest.model_fingerprint != self.spec.model_fingerprint {
            return Err(StoreError::mismatch(
                "model",
                &self.spec.model_fingerprint,
                &manifest.model_fingerprint,
            ));
        }
        self.manifests.write(manifest)
    }

    /// The manifest of `schema_name` for this store's model.
    pub fn read_manifest(&self, schema_name: &str) -> ManifestLookup {
        self.manifests
            .read(&self.spec.model_fingerprint, schema_name)
    }
}
