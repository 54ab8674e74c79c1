//! The restore planner (HCache §4.1, the bubble-free partition): per layer, keep a unit's state as
//! KV, as input hidden states, or as nothing (recompute from tokens), so that the loader (I/O) and
//! the compute side finish together.
//!
//! Layer-wise partitions only (the paper's choice: every layer's rows are computed in one
//! matrix product). Two families, as in the paper:
//! - compute is the spare resource: the first `r` layers are recomputed from tokens while the
//!   hidden states of the other layers load; then those are projected to K/V;
//! - I/O is the spare resource: the first `h` layers load hidden states and are projected, the
//!   other layers load their KV.
//!
//! Each candidate's time is `max(c, io) + (1 − η)·min(c, io)` of the measured per-token,
//! per-layer costs ([`RestoreCosts`]), where η is the measured overlap efficiency of loading and
//! computing: 1 when they truly run side by side (the paper's GPU + PCIe setting: `max`), 0 when
//! they share the same cores and their times add up (a small CPU-only machine). The planner
//! enumerates every split of both families (pure KV, pure hidden and pure recompute are among
//! them), so by its own estimate it never loses to a pure strategy.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How one layer of a unit is stored and restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerForm {
    /// K and V are stored and loaded as they are.
    Kv,
    /// The layer's input hidden states are stored; K/V are projected from them at restore.
    Hidden,
    /// Nothing is stored: the layer is recomputed from the tokens (needs the layers before it
    /// recomputed too, so recomputed layers are always a prefix).
    Recompute,
}

impl LayerForm {
    pub fn name(self) -> &'static str {
        match self {
            LayerForm::Kv => "kv",
            LayerForm::Hidden => "hidden",
            LayerForm::Recompute => "recompute",
        }
    }
}

/// Measured restore costs, in seconds per token per layer.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RestoreCosts {
    /// Loading one token-layer of K/V from the tier (read, verify, decode).
    pub io_kv: f64,
    /// Loading one token-layer of hidden states.
    pub io_hidden: f64,
    /// Projecting one token-layer of hidden states to K/V (norm, projections, RoPE).
    pub compute_hidden: f64,
    /// Recomputing one token-layer from the tokens (a whole transformer layer).
    pub compute_token: f64,
    /// Overlap efficiency η in [0, 1] of the loader and the compute side, measured on a
    /// pipelined restore ([`super::profile::measure_overlap`]): the fraction of the shorter side
    /// hidden behind the longer one.
    pub overlap: f64,
}

/// A per-layer choice of [`LayerForm`]s for every layer of a model.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RestorePlan {
    pub layers: Vec<LayerForm>,
}

impl RestorePlan {
    /// Every layer in `form` (a pure strategy).
    pub fn uniform(form: LayerForm, n_layers: usize) -> Self {
        Self {
            layers: vec![form; n_layers],
        }
    }

    /// The first `first` layers in `head`, the rest in `tail`.
    pub fn split(head: LayerForm, first: usize, tail: LayerForm, n_layers: usize) -> Self {
        Self {
            layers: (0..n_layers)
                .map(|layer| if layer < first { head } else { tail })
                .collect(),
        }
    }

    /// Whether the plan can be restored: recomputed layers form a prefix.
    pub fn is_valid(&self) -> bool {
        let recomputed = self
            .layers
            .iter()
            .take_while(|&&form| form == LayerForm::Recompute)
            .count();
        self.layers[recomputed..]
            .iter()
            .all(|&form| form != LayerForm::Recompute)
    }

    pub fn count(&self, form: LayerForm) -> usize {
        self.layers.iter().filter(|&&layer| layer == form).count()
    }

    /// Estimated compute and I/O seconds to restore `n_tokens` tokens, and how well they
    /// overlap ([`Estimate::total`] combines them).
    pub fn estimate(&self, costs: &RestoreCosts, n_tokens: usize) -> Estimate {
        let count = |form| self.count(form) as f64;
        let tokens = n_tokens as f64;
        let compute = tokens
            * (count(LayerForm::Recompute) * costs.compute_token
                + count(LayerForm::Hidden) * costs.compute_hidden);
        let io = tokens
            * (count(LayerForm::Hidden) * costs.io_hidden + count(LayerForm::Kv) * costs.io_kv);
        Estimate {
            compute,
            io,
            overlap: costs.overlap,
        }
    }

    /// Bytes stored per token under this plan, given the bytes per token-layer of each form.
    pub fn bytes_per_token(&self, kv_bytes: usize, hidden_bytes: usize) -> usize {
        self.count(LayerForm::Kv) * kv_bytes + self.count(LayerForm::Hidden) * hidden_bytes
    }
}

impl fmt::Display for RestorePlan {
    /// `recompute 0-3, hidden 4-23`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut runs: Vec<(LayerForm, usize, usize)> = Vec::new();
        for (layer, &form) in self.layers.iter().enumerate() {
            match runs.last_mut() {
                Some((last, _, end)) if *last == form => *end = layer,
                _ => runs.push((form, layer, layer)),
            }
        }
        let text: Vec<String> = runs
            .iter()
            .map(|(form, start, end)| match start == end {
                true => format!("{} {start}", form.name()),
                false => format!("{} {start}-{end}", form.name()),
            })
            .collect();
        f.write_str(&text.join(", "))
    }
}

/// Estimated compute and I/O seconds of a restore, and their overlap efficiency η.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub compute: f64,
    pub io: f64,
    pub overlap: f64,
}

impl Estimate {
    /// The restore's time: the longer side, plus the part of the shorter side not hidden behind
    /// it (`max + (1 − η)·min`; η = 1 is perfect overlap, η = 0 the plain sum).
    pub fn total(&self) -> f64 {
        let hidden_fraction = self.overlap.clamp(0.0, 1.0);
        self.compute.max(self.io) + (1.0 - hidden_fraction) * self.compute.min(self.io)
    }
}

/// The plan of least estimated time for `n_layers` layers, from every split of both partition
/// families; ties go to fewer recomputed layers (less CPU taken from other requests).
pub fn plan_restore(costs: &RestoreCosts, n_layers: usize) -> RestorePlan {
    let time = |plan: &RestorePlan| plan.estimate(costs, 1).total();
    candidates(n_layers)
        .into_iter()
        .min_by(|a, b| {
            time(a).total_cmp(&time(b)).then_with(|| {
                a.count(LayerForm::Recompute)
                    .cmp(&b.count(LayerForm::Recompute))
            })
        })
        .unwrap_or_else(|| RestorePlan::uniform(LayerForm::Kv, n_layers))
}

/// Every layer-wise split of both families, the pure strategies included.
pub fn candidates(n_layers: usize) -> Vec<RestorePlan> {
    let mut plans = Vec::with_capacity(2 * n_layers + 2);
    for split in 0..=n_layers {
        plans.push(RestorePlan::split(
            LayerForm::Recompute,
            split,
            LayerForm::Hidden,
            n_layers,
        ));
        plans.push(RestorePlan::split(
            LayerForm::Hidden,
            split,
            LayerForm::Kv,
            n_layers,
        ));
    }
    let mut seen = std::collections::HashSet::new();
    plans.retain(|plan| seen.insert(plan.clone()));
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(io_kv: f64, io_hidden: f64, compute_hidden: f64, compute_token: f64) -> RestoreCosts {
        RestoreCosts {
            io_kv,
            io_hidden,
            compute_hidden,
            compute_token,
            overlap: 1.0,
        }
    }

    fn best_pure(costs: &RestoreCosts, n_layers: usize) -> f64 {
        [LayerForm::Kv, LayerForm::Hidden, LayerForm::Recompute]
            .into_iter()
            .map(|form| {
                RestorePlan::uniform(form, n_layers)
                    .estimate(costs, 1)
                    .total()
            })
            .fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn overlap_one_is_the_max_and_overlap_zero_the_sum() {
        let plan = RestorePlan::split(LayerForm::Hidden, 4, LayerForm::Kv, 12);
        let perfect = plan.estimate(&costs(1.0, 0.5, 2.0, 10.0), 1);
        // compute 4 × 2 = 8, io 4 × 0.5 + 8 × 1 = 10.
        assert_eq!((perfect.compute, perfect.io), (8.0, 10.0));
        assert_eq!(perfect.total(), 10.0);
        let serial = RestoreCosts {
            overlap: 0.0,
            ..costs(1.0, 0.5, 2.0, 10.0)
        };
        assert_eq!(plan.estimate(&serial, 1).total(), 18.0);
        let half = RestoreCosts {
            overlap: 0.5,
            ..serial
        };
        assert_eq!(plan.estimate(&half, 1).total(), 14.0);
        // Out-of-range η is clamped rather than giving a time below max or above the sum.
        let wild = RestoreCosts {
            overlap: 7.0,
            ..serial
        };
        assert_eq!(plan.estimate(&wild, 1).total(), 10.0);
    }

    #[test]
    fn without_overlap_mha_like_costs_choose_pure_kv() {
        // The measured MHA disk shape: projection far dearer than loading KV. With perfect
        // overlap a hidden prefix hides behind the KV loads; with none it only adds time.
        let mha = costs(3.0, 1.5, 37.0, 370.0);
        let overlapped = plan_restore(&mha, 24);
        assert!(overlapped.count(LayerForm::Hidden) > 0, "{overlapped}");
        let serial = RestoreCosts {
            overlap: 0.0,
            ..mha
        };
        assert_eq!(
            plan_restore(&serial, 24),
            RestorePlan::uniform(LayerForm::Kv, 24)
        );
    }

    #[test]
    fn the_plan_never_estimates_above_the_best_pure_strategy() {
        // A deterministic sweep of cost shapes and overlaps (no RNG dependency needed).
        let values = [0.01, 0.3, 1.0, 3.0, 40.0];
        for &io_kv in &values {
            for &io_hidden in &values {
                for &compute_hidden in &values {
                    for &compute_token in &values {
                        for overlap in [0.0, 0.3, 1.0] {
                            let costs = RestoreCosts {
                                overlap,
                                ..costs(io_kv, io_hidden, compute_hidden, compute_token)
                            };
                            let plan = plan_restore(&costs, 8);
                            assert!(plan.is_valid(), "{plan}");
                            let chosen = plan.estimate(&costs, 1).total();
                            let pure = best_pure(&costs, 8);
                            assert!(chosen <= pure, "{costs:?}: {plan} {chosen} > {pure}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slow_io_mixes_in_recompute_and_never_loses_to_a_pure_strategy() {
        // I/O slow, compute fast: hidden I/O is the bottleneck, recompute of a prefix fills it.
        let costs = costs(4.0, 2.0, 0.5, 3.0);
        let plan = plan_restore(&costs, 24);
        assert!(plan.is_valid());
        assert!(plan.count(LayerForm::Recompute) > 0, "{plan}");
        assert!(plan.count(LayerForm::Hidden) > 0, "{plan}");
        let best = plan.estimate(&costs, 100).total();
        for form in [LayerForm::Kv, LayerForm::Hidden, LayerForm::Recompute] {
            let pure = RestorePlan::uniform(form, 24).estimate(&costs, 100).total();
            assert!(best <= pure, "{plan}: {best} > pure {form:?} {pure}");
        }
        // Balanced: r layers of recompute against 24 - r of hidden loads → r * 3 + (24 - r) * 0.5
        // ≈ (24 - r) * 2 → r ≈ 8.
        assert!(
            (7..=9).contains(&plan.count(LayerForm::Recompute)),
            "{plan}"
        );
    }

    #[test]
    fn fast_io_mixes_in_kv_and_gqa_like_costs_choose_kv() {
        // Projection slower than loading hidden states: KV loads fill the compute bubble.
        let plan = plan_restore(&costs(1.0, 0.5, 2.0, 10.0), 12);
        assert!(plan.is_valid());
        assert_eq!(plan.layers[0], LayerForm::Hidden);
        assert_eq!(plan.layers[11], LayerForm::Kv);
        // KV cheaper to load than hidden states and projection not free: pure KV.
        let plan = plan_restore(&costs(0.3, 1.0, 0.5, 10.0), 12);
        assert_eq!(plan, RestorePlan::uniform(LayerForm::Kv, 12), "{plan}");
    }

    #[test]
    fn display_and_validity() {
        let plan = RestorePlan::split(LayerForm::Recompute, 4, LayerForm::Hidden, 24);
        assert_eq!(plan.to_string(), "recompute 0-3, hidden 4-23");
        assert!(plan.is_valid());
        let invalid = RestorePlan {
            layers: vec![LayerForm::Hidden, LayerForm::Recompute],
        };
        assert!(!invalid.is_valid());
        assert_eq!(candidates(3).len(), 2 * 4 - 1);
    }
}
