//! The module store: cached states of prompt modules, keyed by everything they depend on, kept in
//! tiers (Prompt Cache's module cache; design §3 "Store").
//!
//! Architecture invariant: this crate stores and finds bytes of KV states; it knows nothing of
//! PML source, of how a state is computed (no model forward pass), nor of prompts. It sees the
//! compiler's plan types only for the encoding mode a key covers.
//!
//! - [`key`]: [`StoreKey`] and the parts it hashes.
//! - [`state`]: [`ModuleState`] and its checked safetensors form; [`StateSpec`] of a model
//!   (f16 states by default).
//! - [`tier`]: the [`Tier`] interface and its counters.
//! - [`memory`]: host RAM or the model's device memory, byte budget, LRU.
//! - [`disk`]: one checksummed, atomically written file per key; optional byte budget, LRU by
//!   modification time.
//! - [`redis`]: a shared Redis server; chunked, checksummed values; warns and degrades when down.
//! - [`config`]: which tiers a store stacks, parsed from `--store` / `PML_STORE` specifications.
//! - [`manifest`]: per-schema manifests of what compiling stored.
//! - [`module_store`]: [`ModuleStore`], the tiers stacked (device over RAM over disk over Redis).
//! - [`unit_lock`]: per-key locks so processes sharing a store encode a unit once.
//! - [`atomic_file`]: temp file + rename, for every file the store and its users write.
//!
//! The byte form in [`state`] is what the disk and Redis tiers hold; the memory tiers hold
//! states as tensors.

pub mod atomic_file;
mod checksum;
pub mod config;
pub mod disk;
mod error;
pub mod key;
pub mod manifest;
pub mod memory;
pub mod module_store;
pub mod redis;
pub mod state;
pub mod tier;
pub mod unit_lock;

pub use config::{
    DEFAULT_DEVICE_BUDGET_BYTES, DEFAULT_RAM_BUDGET_BYTES, STORE_ENV, SizeError, StoreConfig,
    TierConfig, parse_size,
};
pub use disk::DiskTier;
pub use error::StoreError;
pub use key::{
    ContextHash, KeepFraction, STORE_FORMAT_VERSION, StateKind, StoreKey, StoreKeyParts,
};
pub use manifest::{Manifest, ManifestLookup, ManifestStore, ManifestUnit};
pub use memory::MemoryTier;
pub use module_store::{ModuleStore, StoreHit, StoreStats, TierPut};
pub use pml_home::{PML_HOME_ENV, pml_home};
pub use redis::{RedisConfig, RedisTier};
pub use state::{DEFAULT_STATE_DTYPE, ModuleState, StateSpec};
pub use tier::{PutOutcome, Tier, TierStats};
pub use unit_lock::{UnitLock, UnitLocks};
