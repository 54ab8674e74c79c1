//! Saving a unit's state per layer in a [`RestorePlan`]'s forms, and restoring it into a KV cache
//! layer by layer with loading and computing overlapped (HCache §3.1, figure 5).
//!
//! Every layer is its own store entry ([`StateKind::KvLayer`] / [`StateKind::HiddenLayer`]),
//! keyed like a module state (model, weight format, tokens, positions, context) plus the kind and
//! layer, so it goes through every tier (RAM, disk, Redis) with their checksums, budgets and
//! promotion, and the loader can hand over a layer as soon as it is read.
//!
//! Restore: a loader thread reads the stored layers in order into a small channel while this
//! thread recomputes the plan's recomputed prefix from the tokens, then writes each loaded KV
//! layer, or projects each loaded hidden layer to K/V at the unit's positions. If any layer is
//! missing or damaged (evicted, corrupt, Redis down) the rows written so far are dropped and the
//! unit is recomputed from its tokens: slower, never wrong.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use pml_compiler::plan::EncodeMode;
use serde::{Deserialize, Serialize};

use super::RestoreError;
use super::plan::{LayerForm, RestorePlan};
use crate::layer_stream::{LayerError, LayerReceiver, layer_id, read_layer, stream_layers};
use crate::store::{ContextHash, ModuleState, ModuleStore, StateKind, StoreError, StoreKey};
use crate::unit_key::UnitKey;
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::{ForwardContext, ForwardOptions, LogitRows, Model};

/// A unit saved per layer: its tokens at their positions after a context, and the plan it was
/// saved in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedUnit {
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    /// Hash of the tokens and positions before the unit.
    pub context: ContextHash,
    pub plan: RestorePlan,
}

impl SavedUnit {
    /// The store key of layer `layer` in `form` (`None` for a recomputed layer).
    pub fn layer_key(
        &self,
        model: &Model,
        store: &ModuleStore,
        layer: usize,
        form: LayerForm,
    ) -> Option<StoreKey> {
        let hidden = match form {
            LayerForm::Kv => false,
            LayerForm::Hidden => true,
            LayerForm::Recompute => return None,
        };
        UnitKey {
            model,
            store,
            encode_mode: EncodeMode::Scaffolded,
            tokens: &self.tokens,
            positions: &self.positions,
            context: self.context,
        }
        .layer(layer, hidden)
    }
}

/// A unit computed from its tokens into an empty cache: its rows and every layer's input hidden
/// states (what [`save_unit`] takes).
#[derive(Clone, Debug)]
pub struct ComputedUnit {
    pub rows: KvBlock,
    pub layer_inputs: Vec<Tensor>,
}

/// Computes `tokens` at `positions` with no context, keeping every layer's input.
pub fn compute_unit(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
) -> Result<ComputedUnit, RestoreError> {
    let mut kv = model.new_kv_cache()?;
    let context = ForwardContext::appending(positions.to_vec(), &kv);
    let options = ForwardOptions {
        logits: LogitRows::None,
        keep_layer_inputs: true,
    };
    let output = model.forward_with(tokens, &context, &mut kv, &options)?;
    Ok(ComputedUnit {
        rows: kv.to_block()?,
        layer_inputs: output.layer_inputs,
    })
}

/// What saving stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SaveReport {
    pub entries: usize,
    /// Bytes of the stored tensors (K/V or hidden states), all layers.
    pub tensor_bytes: usize,
}

/// Stores `unit`'s layers in its plan's forms: `rows` is the unit's K/V (every layer, one row
/// per token) and `layer_inputs` each layer's input hidden states `(n_tokens, d_model)`, needed
/// only for the plan's hidden layers.
pub fn save_unit(
    model: &Model,
    store: &ModuleStore,
    unit: &SavedUnit,
    rows: &KvBlock,
    layer_inputs: &[Tensor],
) -> Result<SaveReport, RestoreError> {
    check_unit(model, unit)?;
    let mut report = SaveReport::default();
    for (layer, &form) in unit.plan.layers.iter().enumerate() {
        let Some(key) = unit.layer_key(model, store, layer, form) else {
            continue;
        };
        let Some(state) = layer_state(unit, layer, form, rows, layer_inputs)? else {
            continue;
        };
        report.tensor_bytes += state.size_in_bytes() - 8 * unit.tokens.len();
        report.entries += 1;
        store.put(&key, state)?;
    }
    Ok(report)
}

/// The stored state of one layer of `unit` in `form` (`None` for a recomputed layer): its K/V rows
/// from `rows`, or its input hidden states from `layer_inputs`.
pub(crate) fn layer_state(
    unit: &SavedUnit,
    layer: usize,
    form: LayerForm,
    rows: &KvBlock,
    layer_inputs: &[Tensor],
) -> Result<Option<ModuleState>, RestoreError> {
    let layer_id = u16::try_from(layer).unwrap_or(u16::MAX);
    let state = match form {
        LayerForm::Kv => {
            let (keys, values) = rows.layer(layer)?;
            ModuleState::kv_layer(
                layer_id,
                keys.clone(),
                values.clone(),
                unit.positions.clone(),
                unit.tokens.clone(),
            )?
        }
        LayerForm::Hidden => {
            let hidden = layer_inputs.get(layer).ok_or_else(|| {
                RestoreError::Invalid(format!(
                    "layer {layer} is saved as hidden states, but only {} layer inputs were kept",
                    layer_inputs.len()
                ))
            })?;
            ModuleState::hidden_layer(
                layer_id,
                hidden.clone(),
                unit.positions.clone(),
                unit.tokens.clone(),
            )?
        }
        LayerForm::Recompute => return Ok(None),
    };
    Ok(Some(state))
}

/// How a restore went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestoreReport {
    pub n_tokens: usize,
    /// Layers restored in each form (`kv`, `hidden`, `recompute`).
    pub kv_layers: usize,
    pub hidden_layers: usize,
    pub recomputed_layers: usize,
    /// Wall time of the whole restore.
    pub elapsed: Duration,
    /// Time the compute side waited for the loader.
    pub waited_for_io: Duration,
    /// Why the stored layers could not be used and the unit was recomputed instead.
    pub fallback: Option<String>,
}

/// Appends `unit`'s rows to `kv` (which holds the unit's context), from the store in the unit's
/// plan, falling back to recomputing the unit from its tokens if any stored layer is unusable.
pub fn restore_unit(
    model: &Model,
    store: &ModuleStore,
    unit: &SavedUnit,
    kv: &mut KvCache,
) -> Result<RestoreReport, RestoreError> {
    let load = |key: &StoreKey| store.get(key).map(|hit| hit.map(|hit| hit.state));
    restore_unit_with(model, store, unit, kv, &load)
}

/// A layer reader for [`restore_unit_with`]: the state under a key, `None` when absent.
pub type LayerLoader<'a> =
    dyn Fn(&StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError> + Sync + 'a;

/// [`restore_unit`] reading the layers through `load` (the profiler times the same pipeline on
/// one tier); `store` only derives the keys.
pub fn restore_unit_with(
    model: &Model,
    store: &ModuleStore,
    unit: &SavedUnit,
    kv: &mut KvCache,
    load: &LayerLoader<'_>,
) -> Result<RestoreReport, RestoreError> {
    check_unit(model, unit)?;
    let started = Instant::now();
    kv.check_consistent()?;
    let base = kv.len();
    let mut report = RestoreReport {
        n_tokens: unit.tokens.len(),
        ..RestoreReport::default()
    };
    if unit.tokens.is_empty() {
        return Ok(report);
    }
    let recomputed = unit.plan.count(LayerForm::Recompute);
    // A valid plan recomputes a prefix of the layers and stores every later one.
    let stored = recomputed..unit.plan.layers.len();
    let fetch = |layer: usize| {
        let form = unit.plan.layers[layer];
        let key = unit
            .layer_key(model, store, layer, form)
            .ok_or(LayerError::NoKey { layer })?;
        let id = layer_id(layer)?;
        let kind = match form {
            LayerForm::Hidden => StateKind::HiddenLayer(id),
            LayerForm::Kv | LayerForm::Recompute => StateKind::KvLayer(id),
        };
        read_layer(load, &key, layer, kind, &unit.tokens, &unit.positions)
    };
    let restored = stream_layers(
        stored,
        fetch,
        || (),
        |receiver| restore_layers(model, unit, recomputed, kv, base, receiver, &mut report),
    )
    .and_then(|(restored, ())| restored);
    if let Err(reason) = restored {
        kv.truncate(base);
        report.kv_layers = 0;
        report.hidden_layers = 0;
        report.recomputed_layers = unit.plan.layers.len();
        let context = ForwardContext::appending(unit.positions.clone(), kv);
        let options = ForwardOptions {
            logits: LogitRows::None,
            keep_layer_inputs: false,
        };
        model.forward_with(&unit.tokens, &context, kv, &options)?;
        report.fallback = Some(reason.to_string());
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// The compute side of a restore: recomputes the plan's first `recomputed` layers while the
/// loader reads, then places each stored layer. Any error sends the caller to recompute the unit
/// instead.
fn restore_layers(
    model: &Model,
    unit: &SavedUnit,
    recomputed: usize,
    kv: &mut KvCache,
    base: usize,
    mut receiver: LayerReceiver<Result<Arc<ModuleState>, LayerError>>,
    report: &mut RestoreReport,
) -> Result<(), LayerError> {
    let slots: Vec<usize> = (base..base + unit.tokens.len()).collect();
    // One context for every layer, recomputed or projected: they share its RoPE tables.
    let context = ForwardContext::new(unit.positions.clone(), slots.clone())
        .map_err(LayerError::engine(0))?;
    if recomputed > 0 {
        let mut hidden = model.embed(&unit.tokens).map_err(LayerError::engine(0))?;
        for layer in 0..recomputed {
            hidden = model
                .forward_layer(layer, &hidden, &context, kv)
                .map_err(LayerError::engine(layer))?;
        }
        report.recomputed_layers = recomputed;
    }
    for (layer, &form) in unit.plan.layers.iter().enumerate().skip(recomputed) {
        let state = receiver.next(layer)??;
        let (keys, values) = match (form, state.hidden()) {
            (LayerForm::Hidden, Some(hidden)) => {
                report.hidden_layers += 1;
                model
                    .project_kv(layer, hidden, &context)
                    .map_err(LayerError::engine(layer))?
            }
            (LayerForm::Hidden, None) => return Err(LayerError::NoHiddenStates { layer }),
            _ => {
                let (keys, values) = state.kv().layer(0).map_err(LayerError::engine(layer))?;
                report.kv_layers += 1;
                (keys.clone(), values.clone())
            }
        };
        kv.write(layer, &slots, &keys, &values, &unit.positions)
            .map_err(LayerError::engine(layer))?;
    }
    report.waited_for_io = receiver.waited();
    Ok(())
}

fn check_unit(model: &Model, unit: &SavedUnit) -> Result<(), RestoreError> {
    let n_layers = model.config().n_layers;
    if unit.plan.layers.len() != n_layers || !unit.plan.is_valid() {
        return Err(RestoreError::Invalid(format!(
            "plan `{}` does not fit a model of {n_layers} layers",
            unit.plan
        )));
    }
    if unit.tokens.len() != unit.positions.len() {
        return Err(RestoreError::Invalid(format!(
            "{} tokens at {} positions",
            unit.tokens.len(),
            unit.positions.len()
        )));
    }
    Ok(())
}
