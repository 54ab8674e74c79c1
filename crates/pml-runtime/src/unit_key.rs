//! The one constructor of a unit's store keys — the whole unit's KV, or one layer of it as KV or
//! as hidden states — shared by encoding, blend's pipelined splice and HCache's save and restore,
//! so "layer `i` of unit `u`" names the same entry whoever writes or reads it.

use pml_compiler::plan::EncodeMode;
use pml_engine::model::Model;

use crate::store::{ContextHash, ModuleStore, StateKind, StoreKey, StoreKeyParts};

/// What a unit's keys depend on besides the kind of state.
#[derive(Clone, Copy)]
pub struct UnitKey<'a> {
    pub model: &'a Model,
    pub store: &'a ModuleStore,
    /// How the unit was encoded; a conversation turn is computed after everything before it, as a
    /// scaffolded unit is.
    pub encode_mode: EncodeMode,
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub context: ContextHash,
}

impl UnitKey<'_> {
    /// The key of the unit's state of `kind`.
    pub fn of(&self, kind: StateKind) -> StoreKey {
        StoreKeyParts {
            model_fingerprint: &self.store.spec().model_fingerprint,
            weight_format: self.model.weight_format(),
            kv_dtype: self.model.kv_layout().dtype,
            state_dtype: self.store.spec().state_dtype,
            kind,
            encode_mode: self.encode_mode,
            tokens: self.tokens,
            positions: self.positions,
            context: self.context,
        }
        .key()
    }

    /// The key of layer `layer` as KV, or as hidden states (`hidden`); `None` past the layers a
    /// key can name.
    pub fn layer(&self, layer: usize, hidden: bool) -> Option<StoreKey> {
        let layer = u16::try_from(layer).ok()?;
        Some(self.of(match hidden {
            true => StateKind::HiddenLayer(layer),
            false => StateKind::KvLayer(layer),
        }))
    }
}
