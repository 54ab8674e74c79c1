//! Measuring what the planner needs ([`RestoreCosts`]) on this machine, for one model and one
//! tier: a probe unit is computed once (timing a whole-layer recompute per token), its layers are
//! put into the tier as KV and as hidden states and read back (timing the loads, checksums and
//! decoding included), and its hidden states are projected (timing the restore computation). The
//! probe's entries are removed afterwards.

use std::sync::Arc;
use std::time::Instant;

use super::RestoreError;
use super::plan::{LayerForm, RestoreCosts, RestorePlan};
use super::unit::{SavedUnit, compute_unit};
use crate::model::Model;
use crate::store::{ContextHash, ModuleState, ModuleStore, Tier};

/// Cost given to a form the tier cannot load (down, too small): finite, so that a plan with no
/// layer in that form still estimates to a number, and large enough never to be chosen.
pub const UNAVAILABLE_COST: f64 = 1.0e6;

/// Tokens of the default probe: long enough that per-call overheads do not dominate.
pub const DEFAULT_PROBE_TOKENS: usize = 256;

/// Measures the restore costs of `model` with states in `tier`, using a probe of `n_tokens`
/// tokens. `store` only supplies the key derivation (model fingerprint); nothing is put in it.
pub fn measure_costs(
    model: &Model,
    store: &ModuleStore,
    tier: &dyn Tier,
    n_tokens: usize,
) -> Result<RestoreCosts, RestoreError> {
    let n_tokens = n_tokens.max(1);
    let n_layers = model.config().n_layers;
    let vocab = model.config().vocab_size as u32;
    let tokens: Vec<u32> = (0..n_tokens as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let positions: Vec<u32> = (0..n_tokens as u32).collect();
    // A context no real unit has, so the probe's keys never collide with stored states.
    let context = ContextHash::of(&[u32::MAX], &[u32::MAX]);

    let started = Instant::now();
    let output = compute_unit(model, &tokens, &positions)?;
    let per_token_layer = |seconds: f64| seconds / (n_tokens * n_layers) as f64;
    let compute_token = per_token_layer(started.elapsed().as_secs_f64());
    let rows = &output.rows;

    let started = Instant::now();
    for (layer, hidden) in output.layer_inputs.iter().enumerate() {
        model.project_kv(layer, hidden, &positions)?;
    }
    let compute_hidden = per_token_layer(started.elapsed().as_secs_f64());

    let mut io = [0.0; 2];
    for (slot, form) in [LayerForm::Kv, LayerForm::Hidden].into_iter().enumerate() {
        let unit = SavedUnit {
            tokens: tokens.clone(),
            positions: positions.clone(),
            context,
            plan: RestorePlan::uniform(form, n_layers),
        };
        let mut keys = Vec::with_capacity(n_layers);
        for layer in 0..n_layers {
            let Some(key) = unit.layer_key(model, store, layer, form) else {
                continue;
            };
            let layer_id = u16::try_from(layer).unwrap_or(u16::MAX);
            let state = match form {
                LayerForm::Kv => {
                    let (keys, values) = rows.layer(layer)?;
                    ModuleState::kv_layer(
                        layer_id,
                        keys.clone(),
                        values.clone(),
                        positions.clone(),
                        tokens.clone(),
                    )?
                }
                _ => ModuleState::hidden_layer(
                    layer_id,
                    output.layer_inputs[layer].clone(),
                    positions.clone(),
                    tokens.clone(),
                )?,
            };
            tier.put(&key, &Arc::new(state))?;
            keys.push(key);
        }
        let started = Instant::now();
        let mut complete = true;
        for key in &keys {
            complete &= tier.get(key)?.is_some();
        }
        let elapsed = started.elapsed().as_secs_f64();
        for key in &keys {
            tier.remove(key)?;
        }
        // A tier that could not hold the probe (down, too small) loads nothing: never choose it.
        io[slot] = if complete {
            per_token_layer(elapsed)
        } else {
            UNAVAILABLE_COST
        };
    }
    Ok(RestoreCosts {
        io_kv: io[0],
        io_hidden: io[1],
        compute_hidden,
        compute_token,
    })
}

/// Costs measured once per machine, model, weight format and tier, kept under
/// `<store root>/restore-costs/`: the planner runs at every `pml chat` start, the probe takes
/// seconds.
#[derive(Clone, Debug)]
pub struct CostCache {
    dir: std::path::PathBuf,
}

impl CostCache {
    pub fn new(store_root: &std::path::Path) -> Self {
        Self {
            dir: store_root.join("restore-costs"),
        }
    }

    fn path_of(&self, model: &Model, store: &ModuleStore, tier: &dyn Tier) -> std::path::PathBuf {
        let fingerprint: String = store.spec().model_fingerprint.chars().take(16).collect();
        let weights = crate::store::key::weight_format_name(model.weight_format());
        self.dir.join(
            crate::store::manifest::safe_file_name(&format!(
                "{fingerprint}-{weights}-{}",
                tier.name()
            )) + ".json",
        )
    }

    /// The recorded costs, else measured now (and recorded); `true` when measured now.
    pub fn load_or_measure(
        &self,
        model: &Model,
        store: &ModuleStore,
        tier: &dyn Tier,
    ) -> Result<(RestoreCosts, bool), RestoreError> {
        let path = self.path_of(model, store, tier);
        let recorded = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<RestoreCosts>(&bytes).ok());
        if let Some(costs) = recorded {
            return Ok((costs, false));
        }
        let costs = measure_costs(model, store, tier, DEFAULT_PROBE_TOKENS)?;
        if let Ok(json) = serde_json::to_vec_pretty(&costs) {
            // Not recording only means measuring again next time.
            let _ = crate::store::atomic_file::write_atomically(&path, &json);
        }
        Ok((costs, true))
    }
}
