//! The module store: cached states of prompt modules, keyed by everything they depend on, kept in
//! tiers (Prompt Cache's module cache; design §3 "Store").
//!
//! - [`key`]: [`StoreKey`] and the parts it hashes.
//! - [`state`]: [`ModuleState`] and its checked safetensors form; [`StateSpec`] of a model.
//! - [`tier`]: the [`Tier`] interface and its counters.
//! - [`memory`]: host RAM, byte budget, LRU.
//! - [`disk`]: one memory-mapped, checksummed, atomically written file per key.
//! - [`manifest`]: per-schema manifests of what compiling stored.
//! - [`module_store`]: [`ModuleStore`], the tiers stacked (RAM over disk).
//!
//! Device memory, Redis and hidden-state formats slot in as further [`Tier`]s and
//! [`key::StateKind`]s; the byte form in [`state`] is what a remote tier would ship.

mod atomic_file;
mod checksum;
pub mod disk;
mod error;
pub mod key;
pub mod manifest;
pub mod memory;
pub mod module_store;
pub mod state;
pub mod tier;

pub use disk::DiskTier;
pub use error::StoreError;
pub use key::{ContextHash, STORE_FORMAT_VERSION, StateKind, StoreKey, StoreKeyParts};
pub use manifest::{Manifest, ManifestLookup, ManifestStore, ManifestUnit};
pub use memory::MemoryTier;
pub use module_store::{
    DEFAULT_RAM_BUDGET_BYTES, ModuleStore, StoreConfig, StoreHit, StoreStats, TierPut,
};
pub use state::{ModuleState, StateSpec};
pub use tier::{PutOutcome, Tier, TierStats};
