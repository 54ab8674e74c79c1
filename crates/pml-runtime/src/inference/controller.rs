//! CacheBlend's loading controller (§5): with `--recompute auto`, mode `blend` recomputes the
//! largest fraction `r` of the cached tokens whose recompute of one layer still fits inside the
//! time to load one layer's K/V of all of them — recomputing more then costs no extra time-to-
//! first-token while the layers stream in — and never less than a floor (the paper's 15%, below
//! which quality drops).
//!
//! The paper estimates `T_recompute(r) = r × Prefill(one layer, N tokens)` and `T_load = KV bytes
//! of N tokens / storage throughput`; here both come from this very prefill: the probe pass runs
//! whole layers over every token (its time per token-layer), and the loader times the reads of
//! the layers it has fetched. [`choose_ratio`] is a pure function of those figures; a caller
//! that knows them (or a test that pins them) declares them instead ([`DeclaredCosts`]).

use std::fmt;
use std::time::Duration;

use super::blend_options::{DeclaredCosts, Ratio};

/// What the controller decides from, measured during the prefill.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerCosts {
    /// Loading one layer's K/V of every cached token (read, verify, decode, re-rotate).
    pub load_per_layer: Duration,
    /// Running one transformer layer for one token, in seconds.
    pub recompute_per_token_layer: f64,
}

// Declared with the options it is one of; what it means to the controller is said here.
impl DeclaredCosts {
    /// The controller's inputs for `n_cached` cached tokens.
    pub fn layer_costs(&self, n_cached: usize) -> LayerCosts {
        LayerCosts {
            load_per_layer: self.load_per_layer,
            recompute_per_token_layer: self.recompute_per_layer.as_secs_f64()
                / n_cached.max(1) as f64,
        }
    }
}

/// The controller's choice and the figures behind it (what `pml run` and `pml eval` report).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RatioChoice {
    /// The fraction of the cached tokens recomputed: the prefill recomputes exactly
    /// `ratio.of(n_cached)` of them. The controller's pick, unless a [`Shortcut`] replaced it
    /// ([`RatioChoice::applying`]).
    pub ratio: Ratio,
    /// What the controller picked from the costs: at least `floor`.
    pub picked: Ratio,
    pub floor: Ratio,
    pub load_per_layer: Duration,
    /// One layer's recompute of `floor × n_cached` tokens.
    pub recompute_per_layer_at_floor: Duration,
}

/// The largest `r ≤ 1` with `r × n_cached` tokens' recompute of one layer within
/// `load_per_layer`, at least `floor`; the floor when nothing is cached or the recompute time is
/// not a positive measurement.
pub fn choose_ratio(costs: &LayerCosts, n_cached: usize, floor: Ratio) -> RatioChoice {
    let per_token = costs.recompute_per_token_layer;
    let measured = per_token.is_finite() && per_token > 0.0;
    let whole_layer = per_token * n_cached as f64;
    let fitted = match (measured, n_cached) {
        (true, 1..) => costs.load_per_layer.as_secs_f64() / whole_layer,
        _ => 0.0,
    };
    let ratio = Ratio::new(fitted.clamp(floor.get(), 1.0)).unwrap_or(floor);
    let at_floor = match measured {
        true => floor.get() * whole_layer,
        false => 0.0,
    };
    RatioChoice {
        ratio,
        picked: ratio,
        floor,
        load_per_layer: costs.load_per_layer,
        recompute_per_layer_at_floor: Duration::from_secs_f64(at_floor),
    }
}

impl RatioChoice {
    /// The choice with the fraction `shortcut` recomputes in place of the pick.
    pub fn applying(self, shortcut: Option<Shortcut>) -> Self {
        Self {
            ratio: shortcut.map_or(self.picked, Shortcut::ratio),
            ..self
        }
    }
}

/// What `blend` does instead of its selective recompute when the probe shows it cannot pay
/// (`BlendOptions::shortcuts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortcut {
    /// Every cached token is recomputed — mode `full` from the probe on, since the probe is
    /// `full`'s first layers: the selective recompute had no fewer token-layers left to run.
    Full {
        blend_token_layers: usize,
        full_token_layers: usize,
    },
    /// No cached token is recomputed — mode `reuse` after the probe: every cached row matched its
    /// fresh K (or V) at the check layer, so there was nothing to repair.
    Reuse,
}

/// The work left after the probe, in token-layers (one token through one layer), of the
/// selective recompute and of recomputing everything; the probe's own time per token-layer
/// prices both, so comparing counts is comparing the controller's time estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemainingWork {
    pub n_cached: usize,
    pub n_new: usize,
    /// Cached tokens recomputed in the layers after the check layer.
    pub keep: usize,
    /// Cached tokens recomputed through the first of them (twice `keep` with gradual filtering).
    pub first_keep: usize,
    /// The new tokens' attention pass that ranks the cached ones runs.
    pub attention_pass: bool,
    pub layers_after_probe: usize,
}

impl RemainingWork {
    pub fn blend_token_layers(&self) -> usize {
        let Some(rest) = self.layers_after_probe.checked_sub(1) else {
            return 0;
        };
        let ranking = if self.attention_pass {
            self.n_new * self.layers_after_probe
        } else {
            0
        };
        ranking + (self.first_keep + self.n_new) + (self.keep + self.n_new) * rest
    }

    pub fn full_token_layers(&self) -> usize {
        (self.n_cached + self.n_new) * self.layers_after_probe
    }

    /// [`Shortcut::Full`] when the selective recompute would run no fewer token-layers than
    /// recomputing everything (and does not already recompute everything).
    pub fn shortcut(&self) -> Option<Shortcut> {
        let (blend, full) = (self.blend_token_layers(), self.full_token_layers());
        (self.keep < self.n_cached && blend >= full).then_some(Shortcut::Full {
            blend_token_layers: blend,
            full_token_layers: full,
        })
    }
}

impl Shortcut {
    /// The fraction of the cached tokens it recomputes.
    pub fn ratio(self) -> Ratio {
        match self {
            Shortcut::Full { .. } => Ratio::ONE,
            Shortcut::Reuse => Ratio::ZERO,
        }
    }
}

impl fmt::Display for Shortcut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shortcut::Full {
                blend_token_layers,
                full_token_layers,
            } => write!(
                f,
                "recomputed every cached token (= full): after the probe, blend had \
                 {blend_token_layers} token-layers left, full {full_token_layers}"
            ),
            Shortcut::Reuse => f.write_str(
                "recomputed no cached token (= reuse): every one matched its fresh state at the \
                 check layer",
            ),
        }
    }
}

impl fmt::Display for RatioChoice {
    /// `r=0.230 (auto: load 1.20 ms/layer, recompute 0.90 ms/layer at r=0.15)`, and where a
    /// shortcut replaced the pick, `r=1.000 (auto: …, picked r=0.926 before the shortcut)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "r={:.3} (auto: load {:.2} ms/layer, recompute {:.2} ms/layer at r={}",
            self.ratio.get(),
            self.load_per_layer.as_secs_f64() * 1e3,
            self.recompute_per_layer_at_floor.as_secs_f64() * 1e3,
            self.floor
        )?;
        if self.picked != self.ratio {
            write!(f, ", picked r={:.3} before the shortcut", self.picked.get())?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(load_ms: f64, recompute_us_per_token: f64) -> LayerCosts {
        LayerCosts {
            load_per_layer: Duration::from_secs_f64(load_ms / 1e3),
            recompute_per_token_layer: recompute_us_per_token / 1e6,
        }
    }

    fn floor() -> Ratio {
        Ratio::new(0.15).expect("a fraction")
    }

    #[test]
    fn fast_loads_keep_the_floor() {
        // 1000 tokens at 10 µs per token-layer: a whole layer takes 10 ms; loading it 0.5 ms.
        let choice = choose_ratio(&costs(0.5, 10.0), 1000, floor());
        assert_eq!(choice.ratio, floor());
        assert_eq!(
            choice.recompute_per_layer_at_floor,
            Duration::from_secs_f64(1.5e-3)
        );
    }

    #[test]
    fn slow_loads_buy_a_larger_fraction_that_fits_inside_them() {
        // Loading a layer takes 4 ms, recomputing all of it 10 ms: 40% fits.
        let choice = choose_ratio(&costs(4.0, 10.0), 1000, floor());
        assert_eq!(choice.ratio, Ratio::new(0.4).expect("a fraction"));
        // Slower still than recomputing everything: everything.
        let choice = choose_ratio(&costs(50.0, 10.0), 1000, floor());
        assert_eq!(choice.ratio, Ratio::ONE);
        // The choice grows with the load time.
        let ratios: Vec<Ratio> = [0.1, 1.0, 2.0, 3.0, 8.0, 20.0]
            .iter()
            .map(|&load| choose_ratio(&costs(load, 10.0), 1000, floor()).ratio)
            .collect();
        assert!(
            ratios.windows(2).all(|pair| pair[0] <= pair[1]),
            "{ratios:?}"
        );
    }

    #[test]
    fn declared_costs_decide_as_the_measured_ones_would() {
        // Loading a layer takes 4 ms, recomputing all of it 10 ms: 40% fits.
        let declared = DeclaredCosts {
            load_per_layer: Duration::from_millis(4),
            recompute_per_layer: Duration::from_millis(10),
        };
        let choice = choose_ratio(&declared.layer_costs(1000), 1000, floor());
        assert_eq!(choice.ratio, Ratio::new(0.4).expect("a fraction"));
        assert_eq!(
            choice.to_string(),
            "r=0.400 (auto: load 4.00 ms/layer, recompute 1.50 ms/layer at r=0.15)"
        );
    }

    #[test]
    fn nothing_cached_or_nothing_measured_keeps_the_floor() {
        assert_eq!(choose_ratio(&costs(4.0, 10.0), 0, floor()).ratio, floor());
        assert_eq!(choose_ratio(&costs(4.0, 0.0), 1000, floor()).ratio, floor());
        let nan = LayerCosts {
            recompute_per_token_layer: f64::NAN,
            ..costs(4.0, 0.0)
        };
        assert_eq!(choose_ratio(&nan, 1000, floor()).ratio, floor());
        // A floor of 1 is always full recompute.
        assert_eq!(
            choose_ratio(&costs(0.0, 10.0), 1000, Ratio::ONE).ratio,
            Ratio::ONE
        );
    }

    fn work(n_cached: usize, n_new: usize, keep: usize) -> RemainingWork {
        RemainingWork {
            n_cached,
            n_new,
            keep,
            first_keep: keep,
            attention_pass: true,
            layers_after_probe: 22,
        }
    }

    #[test]
    fn blend_gives_way_to_full_when_its_remaining_work_is_no_less() {
        // 1000 cached, 50 new, 150 recomputed: 50 + 200 rows a layer against 1050.
        assert_eq!(work(1000, 50, 150).shortcut(), None);
        // 60 cached, 64 new, 9 recomputed: 64 + 73 rows a layer against 124.
        let shortcut = work(60, 64, 9).shortcut();
        assert_eq!(
            shortcut,
            Some(Shortcut::Full {
                blend_token_layers: 64 * 22 + 73 * 22,
                full_token_layers: 124 * 22,
            })
        );
        assert!(
            shortcut
                .expect("full")
                .to_string()
                .starts_with("recomputed every cached token")
        );
        // Already everything: nothing to switch to.
        assert_eq!(work(60, 64, 60).shortcut(), None);
        // Without the attention pass blend never costs more than full.
        let by_deviation = RemainingWork {
            attention_pass: false,
            ..work(60, 64, 9)
        };
        assert_eq!(by_deviation.shortcut(), None);
    }

    #[test]
    fn the_report_names_the_choice_and_its_inputs() {
        let choice = choose_ratio(&costs(4.0, 10.0), 1000, floor());
        assert_eq!(
            choice.to_string(),
            "r=0.400 (auto: load 4.00 ms/layer, recompute 1.50 ms/layer at r=0.15)"
        );
        assert_eq!(choice.applying(None), choice);
    }

    #[test]
    fn a_shortcut_replaces_the_ratio_and_keeps_the_pick() {
        let choice = choose_ratio(&costs(4.0, 10.0), 1000, floor());
        let full = choice.applying(Some(Shortcut::Full {
            blend_token_layers: 2,
            full_token_layers: 1,
        }));
        assert_eq!((full.ratio, full.picked), (Ratio::ONE, choice.ratio));
        assert_eq!(
            full.to_string(),
            "r=1.000 (auto: load 4.00 ms/layer, recompute 1.50 ms/layer at r=0.15, picked \
             r=0.400 before the shortcut)"
        );
        let reuse = choice.applying(Some(Shortcut::Reuse));
        assert_eq!((reuse.ratio, reuse.picked), (Ratio::ZERO, choice.ratio));
    }
}
