//! Measuring what the planner needs ([`RestoreCosts`]) on this machine, for one model and one
//! tier: a probe unit is computed once (timing a whole-layer recompute per token), its layers are
//! put into the tier as KV and as hidden states and read back (timing the loads, checksums and
//! decoding included), and its hidden states are projected (timing the restore computation).
//! Then a mixed plan of the probe is restored through the real pipeline ([`restore_unit_with`])
//! with its loads done beforehand (compute alone) and from the tier (pipelined), against its
//! loads alone, which gives the overlap efficiency η of loading and computing on this machine
//! ([`measure_overlap`]). The probe's entries are removed afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::RestoreError;
use super::plan::{LayerForm, RestoreCosts, RestorePlan};
use super::unit::{SavedUnit, compute_unit, layer_state, restore_unit_with};
use crate::store::{ContextHash, ModuleStore, StoreKey, Tier};
use pml_engine::model::{ForwardContext, Model};

/// Cost given to a form the tier cannot load (down, too small): finite, so that a plan with no
/// layer in that form still estimates to a number, and large enough never to be chosen.
pub const UNAVAILABLE_COST: f64 = 1.0e6;

/// Tokens of the default probe: long enough that per-call overheads do not dominate.
pub const DEFAULT_PROBE_TOKENS: usize = 256;

/// Timed repetitions of each part of the overlap measurement (medians are used).
const OVERLAP_RUNS: usize = 3;

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

    let projected = ForwardContext::new(positions.clone(), (0..n_tokens).collect())?;
    let started = Instant::now();
    for (layer, hidden) in output.layer_inputs.iter().enumerate() {
        model.project_kv(layer, hidden, &projected)?;
    }
    let compute_hidden = per_token_layer(started.elapsed().as_secs_f64());

    let probe = |plan: RestorePlan| SavedUnit {
        tokens: tokens.clone(),
        positions: positions.clone(),
        context,
        plan,
    };
    // Every layer in both forms stays in the tier until the overlap is measured; removed below
    // whatever happens in between.
    let mut stored: Vec<StoreKey> = Vec::with_capacity(2 * n_layers);
    let measured = (|| -> Result<RestoreCosts, RestoreError> {
        let mut io = [0.0; 2];
        for (slot, form) in [LayerForm::Kv, LayerForm::Hidden].into_iter().enumerate() {
            let unit = probe(RestorePlan::uniform(form, n_layers));
            let mut keys = Vec::with_capacity(n_layers);
            for layer in 0..n_layers {
                let Some(key) = unit.layer_key(model, store, layer, form) else {
                    continue;
                };
                let Some(state) = layer_state(&unit, layer, form, rows, &output.layer_inputs)?
                else {
                    continue;
                };
                // Straight into the tier, so converted here as `ModuleStore::put` would: a tier
                // holds states of the store's dtype only, and refuses to read any other.
                let state = state.to_dtype(store.spec().state_dtype)?;
                stored.push(key.clone());
                tier.put(&key, &Arc::new(state))?;
                keys.push(key);
            }
            let started = Instant::now();
            let complete = load_all(tier, &keys)?;
            // A tier that could not hold the probe (down, too small) loads nothing: never
            // choose it.
            io[slot] = if complete {
                per_token_layer(started.elapsed().as_secs_f64())
            } else {
                UNAVAILABLE_COST
            };
        }
        let mut costs = RestoreCosts {
            io_kv: io[0],
            io_hidden: io[1],
            compute_hidden,
            compute_token,
            // Until measured: assume none, the estimate that never flatters a mixed plan.
            overlap: 0.0,
        };
        if io.iter().all(|&cost| cost < UNAVAILABLE_COST) {
            let mixed = probe(balanced_mix(&costs, n_layers));
            costs.overlap = measure_overlap(model, store, tier, &mixed)?;
        }
        Ok(costs)
    })();
    for key in &stored {
        tier.remove(key)?;
    }
    measured
}

/// The hidden-prefix + KV split whose compute and loads are closest to equal, so that the
/// overlap (at most the shorter side) is as large, and as measurable, as it can be.
fn balanced_mix(costs: &RestoreCosts, n_layers: usize) -> RestorePlan {
    let balance = |hidden: usize| {
        let estimate = RestorePlan::split(LayerForm::Hidden, hidden, LayerForm::Kv, n_layers)
            .estimate(costs, 1);
        estimate.compute.min(estimate.io) / estimate.compute.max(estimate.io).max(f64::EPSILON)
    };
    let hidden = (1..=n_layers)
        .max_by(|&a, &b| balance(a).total_cmp(&balance(b)))
        .unwrap_or(n_layers);
    RestorePlan::split(LayerForm::Hidden, hidden, LayerForm::Kv, n_layers)
}

/// Whether every key is in the tier (each read in full: the timed part of a load).
fn load_all(tier: &dyn Tier, keys: &[StoreKey]) -> Result<bool, RestoreError> {
    let mut complete = true;
    for key in keys {
        complete &= tier.get(key)?.is_some();
    }
    Ok(complete)
}

/// The overlap efficiency η in [0, 1] of restoring `unit` (its plan's layers already in `tier`)
/// through the pipeline: with `c` its restore with every layer loaded beforehand (compute side
/// alone), `io` its loads alone and `t` the pipelined restore from the tier,
/// `η = (c + io − t) / min(c, io)`, medians of a few runs. 1 when the loader hides entirely
/// behind the compute side (or the reverse), 0 when their times add up. A restore that fell
/// back to recomputing measures nothing: 0, the estimate that never flatters a mixed plan.
pub fn measure_overlap(
    model: &Model,
    store: &ModuleStore,
    tier: &dyn Tier,
    unit: &SavedUnit,
) -> Result<f64, RestoreError> {
    let keys: Vec<StoreKey> = unit
        .plan
        .layers
        .iter()
        .enumerate()
        .filter_map(|(layer, &form)| unit.layer_key(model, store, layer, form))
        .collect();
    let mut parts: [Vec<Duration>; 3] = Default::default();
    for _ in 0..OVERLAP_RUNS {
        let started = Instant::now();
        let mut loaded = Vec::with_capacity(keys.len());
        for key in &keys {
            match tier.get(key)? {
                Some(state) => loaded.push((key.clone(), state)),
                None => return Ok(0.0),
            }
        }
        parts[1].push(started.elapsed());

        let preloaded = |key: &StoreKey| {
            Ok(loaded
                .iter()
                .find(|(stored, _)| stored == key)
                .map(|(_, state)| Arc::clone(state)))
        };
        let mut kv = model.new_kv_cache()?;
        let report = restore_unit_with(model, store, unit, &mut kv, &preloaded)?;
        if report.fallback.is_some() {
            return Ok(0.0);
        }
        parts[0].push(report.elapsed);

        let from_tier = |key: &StoreKey| tier.get(key);
        let mut kv = model.new_kv_cache()?;
        let report = restore_unit_with(model, store, unit, &mut kv, &from_tier)?;
        if report.fallback.is_some() {
            return Ok(0.0);
        }
        parts[2].push(report.elapsed);
    }
    let [compute, io, pipelined] = parts.map(|mut times| {
        times.sort();
        times[times.len() / 2].as_secs_f64()
    });
    Ok(overlap_efficiency(compute, io, pipelined))
}

/// `(c + io − t) / min(c, io)` clamped to [0, 1]; 1 when one side is empty (nothing to overlap,
/// so nothing is lost either).
pub fn overlap_efficiency(compute: f64, io: f64, pipelined: f64) -> f64 {
    let shorter = compute.min(io);
    if shorter <= 0.0 {
        return 1.0;
    }
    ((compute + io - pipelined) / shorter).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::overlap_efficiency;

    #[test]
    fn overlap_efficiency_spans_sum_to_max() {
        // Times add up: no overlap.
        assert_eq!(overlap_efficiency(3.0, 1.0, 4.0), 0.0);
        // The shorter side entirely hidden.
        assert_eq!(overlap_efficiency(3.0, 1.0, 3.0), 1.0);
        assert!((overlap_efficiency(3.0, 1.0, 3.5) - 0.5).abs() < 1e-12);
        // Noise beyond either bound is clamped.
        assert_eq!(overlap_efficiency(3.0, 1.0, 5.0), 0.0);
        assert_eq!(overlap_efficiency(3.0, 1.0, 2.0), 1.0);
        assert_eq!(overlap_efficiency(0.0, 1.0, 1.2), 1.0);
    }
}

/// Version of the recorded costs: 2 added the overlap efficiency η (files without it, or of
/// another version, are measured again).
const COST_CACHE_VERSION: u32 = 2;

/// What a [`CostCache`] file holds.
#[derive(Serialize, Deserialize)]
struct CachedCosts {
    version: u32,
    costs: RestoreCosts,
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
        let weights = model.weight_format().name();
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
            .and_then(|bytes| serde_json::from_slice::<CachedCosts>(&bytes).ok())
            .filter(|cached| cached.version == COST_CACHE_VERSION);
        if let Some(cached) = recorded {
            return Ok((cached.costs, false));
        }
        let costs = measure_costs(model, store, tier, DEFAULT_PROBE_TOKENS)?;
        let cached = CachedCosts {
            version: COST_CACHE_VERSION,
            costs,
        };
        if let Ok(json) = serde_json::to_vec_pretty(&cached) {
            // Not recording only means measuring again next time.
            let _ = crate::store::atomic_file::write_atomically(&path, &json);
        }
        Ok((costs, true))
    }
}
