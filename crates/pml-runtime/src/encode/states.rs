//! The port between encoding/inference and wherever encoded states live: [`UnitStates`] loads and
//! saves one unit's KV by [`UnitKey`]. The module store implements it for its RAM and disk tiers;
//! [`MemoryStates`] is a plain in-process map for tests and one-shot runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::kv_cache::KvBlock;

use super::key::UnitKey;

/// A unit's encoded KV with the tokens and positions it was computed for; loaders compare those
/// with the unit's before trusting a state.
#[derive(Clone, Debug)]
pub struct UnitState {
    pub kv: Arc<KvBlock>,
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
}

/// Why a state could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("module store: {0}")]
pub struct StatesError(pub Box<dyn std::error::Error + Send + Sync>);

/// Somewhere unit states are kept.
pub trait UnitStates: Send + Sync {
    /// The state saved under `key`, if any.
    fn load(&self, key: &UnitKey) -> Result<Option<UnitState>, StatesError>;

    /// Whether a state is saved under `key`, without reading it.
    fn contains(&self, key: &UnitKey) -> Result<bool, StatesError>;

    /// Saves `state` under `key`, replacing any state there.
    fn save(&self, key: &UnitKey, state: &UnitState) -> Result<(), StatesError>;
}

/// States in a map in this process (cloning a state clones an `Arc`, not the tensors).
#[derive(Debug, Default)]
pub struct MemoryStates {
    states: Mutex<HashMap<UnitKey, UnitState>>,
}

impl MemoryStates {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets the state under `key` (tests use it to simulate an evicted module).
    pub fn remove(&self, key: &UnitKey) -> Option<UnitState> {
        self.lock().remove(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UnitKey, UnitState>> {
        // A panic while holding the lock cannot leave the map half-updated (each operation is one
        // map call), so a poisoned lock is still safe to use.
        self.states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl UnitStates for MemoryStates {
    fn load(&self, key: &UnitKey) -> Result<Option<UnitState>, StatesError> {
        Ok(self.lock().get(key).cloned())
    }

    fn contains(&self, key: &UnitKey) -> Result<bool, StatesError> {
        Ok(self.lock().contains_key(key))
    }

    fn save(&self, key: &UnitKey, state: &UnitState) -> Result<(), StatesError> {
        self.lock().insert(key.clone(), state.clone());
        Ok(())
    }
}
