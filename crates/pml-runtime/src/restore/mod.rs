//! Hidden-state restore (HCache, design §3 "Hidden-state restore"): a unit's state kept per
//! layer as KV, as the layer's input hidden states, or not at all (recomputed from its tokens),
//! chosen per layer by a planner from measured I/O and compute speeds, and restored layer by
//! layer with loading and computing overlapped.
//!
//! - [`plan`]: [`LayerForm`], [`RestorePlan`], the bubble-free partition [`plan_restore`].
//! - [`profile`]: [`measure_costs`] of a model and a tier on this machine, the overlap
//!   efficiency of loading and computing included ([`measure_overlap`]).
//! - [`unit`]: [`save_unit`] and the pipelined [`restore_unit`].

pub mod plan;
pub mod profile;
pub mod unit;

use crate::store::StoreError;
use pml_engine::kv_cache::KvCacheError;
use pml_engine::model::EngineError;

pub use plan::{Estimate, LayerForm, RestoreCosts, RestorePlan, candidates, plan_restore};
pub use profile::{CostCache, DEFAULT_PROBE_TOKENS, measure_costs, measure_overlap};
pub use unit::{
    ComputedUnit, LayerLoader, RestoreReport, SaveReport, SavedUnit, compute_unit, restore_unit,
    restore_unit_with, save_unit,
};

/// Why a unit could not be saved or restored (a missing or damaged stored layer is not an error:
/// the unit is recomputed).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("invalid restore request: {0}")]
    Invalid(String),
}

impl From<EngineError> for RestoreError {
    fn from(error: EngineError) -> Self {
        RestoreError::Engine(Box::new(error))
    }
}

impl From<KvCacheError> for RestoreError {
    fn from(error: KvCacheError) -> Self {
        RestoreError::Engine(Box::new(EngineError::KvCache(error)))
    }
}

impl From<candle_core::Error> for RestoreError {
    fn from(error: candle_core::Error) -> Self {
        RestoreError::Engine(Box::new(EngineError::Tensor(error)))
    }
}
