//! The settings of mode `blend` (selective recompute): how many cached tokens to recompute (a
//! fixed fraction, or chosen by the loading controller above a floor), at which layer to measure
//! their deviation, on K or V, whether to filter gradually, and whether the cached layers are
//! streamed from the store while the recompute runs. Kept `Copy + Eq + Hash` so a mode with its
//! settings is a plain value ([`super::InferenceMode`]).

use std::fmt;
use std::str::FromStr;

use crate::attention_mass::MassWeighting;

/// A command-line or request value that names no setting (`--recompute 2`, `--mode fast`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not {expected}")]
pub struct ValueError {
    pub text: String,
    /// What would have been accepted, worded to follow "is not".
    pub expected: &'static str,
}

impl ValueError {
    pub fn new(text: &str, expected: &'static str) -> Self {
        Self {
            text: text.to_string(),
            expected,
        }
    }
}

/// A fraction in `[0, 1]`, held in parts per million so it compares and hashes exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ratio(u32);

impl Ratio {
    const SCALE: f64 = 1e6;
    pub const ZERO: Ratio = Ratio(0);
    pub const ONE: Ratio = Ratio(1_000_000);

    /// `value` rounded to parts per million; `None` outside `[0, 1]` or not a number.
    pub fn new(value: f64) -> Option<Self> {
        (0.0..=1.0)
            .contains(&value)
            .then(|| Ratio((value * Self::SCALE).round() as u32))
    }

    pub fn get(self) -> f64 {
        f64::from(self.0) / Self::SCALE
    }

    /// `round(self × n)`, at most `n`.
    pub fn of(self, n: usize) -> usize {
        ((self.get() * n as f64).round() as usize).min(n)
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl FromStr for Ratio {
    type Err = ValueError;

    fn from_str(text: &str) -> Result<Self, ValueError> {
        text.trim()
            .parse()
            .ok()
            .and_then(Ratio::new)
            .ok_or_else(|| ValueError::new(text, "a fraction between 0 and 1"))
    }
}

/// What the check layer compares between a token's fresh and cached state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Deviation {
    /// `||K_fresh − K_cached||²` (the design's default).
    #[default]
    Keys,
    /// `||V_fresh − V_cached||²` (the paper's "KV deviation" leaves K or V open).
    Values,
}

/// How the cached tokens to recompute are ranked.
///
/// The default is `AttentionValue`. Ranking by the new tokens' attention (`Attention`) took the
/// first-token KL against mode `full` from 0.42 (`Deviation`) to 0.23 and 32-token greedy
/// agreement from 0.63 to 0.86 on NQ-open (12 questions, r = 0.15) for ~7% more TTFT: with a
/// small model, deviation ranks many tokens the answer never reads. Weighting each attention
/// weight by the slot's value norm lowered the KL further on the 103 HotpotQA questions (0.316 →
/// 0.270, lower on 64 of 103) with the same first-token and greedy agreement
/// (docs/results/history.md, "Selective recompute"). Chosen on fidelity to `full` alone, never
/// on gold answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Selection {
    /// By their deviation at the check layer (CacheBlend's HKVD tokens).
    Deviation,
    /// By the attention the new tokens pay them in the layers after the check layer, measured
    /// in a pass of the new tokens over the spliced cache (as mode `reuse` computes them).
    Attention,
    /// By deviation × attention: tokens that are both wrong and read.
    Weighted,
    /// By the attention as for `Attention`, each weight times the norm of the slot's value
    /// vector in that head: what the slot adds to the new tokens' attention output rather than
    /// how much it is looked at (a slot read much with a small value, a "no-op" read, counts
    /// less).
    #[default]
    AttentionValue,
    /// Half from each of `AttentionValue` and `Deviation`: a row ranks by the better of its two
    /// places (rank fusion), so the selection is the union of the two lists' heads — the
    /// tokens the question reads and the tokens the splice got most wrong.
    Mixed,
    /// EPIC's LegoLink before `AttentionValue`: the first [`HEAD_ROWS`] rows of every cached
    /// span that does not start the prompt come first — where a module's encoding began without
    /// the text now before it — and the rest of the rows to recompute go by `AttentionValue`.
    Heads,
}

/// Rows at the start of each cached span that [`Selection::Heads`] recomputes first.
pub const HEAD_ROWS: usize = 8;

impl Selection {
    pub fn name(self) -> &'static str {
        match self {
            Selection::Deviation => "deviation",
            Selection::Attention => "attention",
            Selection::Weighted => "weighted",
            Selection::AttentionValue => "attention-value",
            Selection::Mixed => "mixed",
            Selection::Heads => "heads",
        }
    }

    /// What the new tokens' attention pass sums per slot for this ranking; `None` where the
    /// ranking needs no such pass.
    pub fn attention_weighting(self) -> Option<MassWeighting> {
        match self {
            Selection::Deviation => None,
            Selection::Attention | Selection::Weighted => Some(MassWeighting::Weights),
            Selection::AttentionValue | Selection::Mixed | Selection::Heads => {
                Some(MassWeighting::ValueNorm)
            }
        }
    }
}

/// Whether the cached spans' K/V are streamed layer by layer from the store while the recompute
/// runs ([`super::layer_feed`]) or spliced whole before it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Pipelining {
    /// Stream when some cached unit would come from a tier slower than RAM (disk, Redis).
    #[default]
    Auto,
    Always,
    Never,
}

impl Pipelining {
    pub fn name(self) -> &'static str {
        match self {
            Pipelining::Auto => "auto",
            Pipelining::Always => "on",
            Pipelining::Never => "off",
        }
    }
}

impl FromStr for Pipelining {
    type Err = ValueError;

    fn from_str(text: &str) -> Result<Self, ValueError> {
        match text {
            "auto" => Ok(Pipelining::Auto),
            "on" => Ok(Pipelining::Always),
            "off" => Ok(Pipelining::Never),
            other => Err(ValueError::new(other, "`auto`, `on` or `off`")),
        }
    }
}

/// Figures the controller takes instead of measuring them (`BlendOptions::declared_costs`): a
/// caller that knows its storage and compute, or a test that must not depend on the machine's
/// load. Whole durations, so the options stay `Eq + Hash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeclaredCosts {
    /// Loading one layer's K/V of every cached token.
    pub load_per_layer: std::time::Duration,
    /// Running one transformer layer over every cached token.
    pub recompute_per_layer: std::time::Duration,
}

/// Settings of one `blend` prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlendOptions {
    /// Fraction of the cached tokens recomputed in every layer (new tokens always are); with
    /// `auto_ratio`, the least fraction the loading controller may choose.
    pub recompute: Ratio,
    /// `--recompute auto`: the loading controller ([`super::controller`]) picks the fraction
    /// from this run's measured per-layer load and recompute times, at least `recompute`.
    pub auto_ratio: bool,
    /// With `auto_ratio`, the load and recompute times the controller decides from in place of
    /// this run's measurements; `None` measures them.
    pub declared_costs: Option<DeclaredCosts>,
    /// Layer whose K (or V) deviation chooses the tokens; the layers up to it run on every
    /// token in a probe pass.
    pub check_layer: usize,
    pub deviation: Deviation,
    pub selection: Selection,
    /// CacheBlend's gradual filtering: choose twice the ratio at the check layer, recompute
    /// those through the next layer, and keep the `recompute` fraction that deviates most there.
    pub gradual: bool,
    pub pipelining: Pipelining,
    /// After the probe, do the cheaper thing where the selective recompute cannot pay:
    /// recompute everything when that is no dearer, nothing when no cached row deviates
    /// ([`super::Shortcut`], said in the summary line). Off where the ratio itself is measured
    /// (`pml eval`, `pml bench pipeline`).
    pub shortcuts: bool,
    /// The fidelity guard ([`super::fidelity`]): an answer whose estimated fidelity to mode
    /// `full` falls below this floor, or whose first token the repair changed, is computed in
    /// mode `full` instead. `None`: every answer is kept (its estimate still reported).
    pub min_fidelity: Option<Ratio>,
}

impl BlendOptions {
    pub const DEFAULT_RATIO: f64 = 0.15;
    pub const DEFAULT_CHECK_LAYER: usize = 1;

    /// The last layer whose K/V the selection reads: the check layer, or the one after it where
    /// gradual filtering narrows the selection.
    pub fn last_filter_layer(&self) -> usize {
        self.check_layer + usize::from(self.gradual)
    }
}

impl Default for BlendOptions {
    fn default() -> Self {
        Self {
            recompute: Ratio((BlendOptions::DEFAULT_RATIO * Ratio::SCALE) as u32),
            check_layer: BlendOptions::DEFAULT_CHECK_LAYER,
            deviation: Deviation::Keys,
            selection: Selection::default(),
            gradual: false,
            auto_ratio: false,
            declared_costs: None,
            pipelining: Pipelining::Auto,
            shortcuts: true,
            min_fidelity: None,
        }
    }
}

impl fmt::Display for BlendOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.auto_ratio {
            true => write!(f, "r=auto (floor {})", self.recompute)?,
            false => write!(f, "r={}", self.recompute)?,
        }
        if let (true, Some(declared)) = (self.auto_ratio, self.declared_costs) {
            write!(
                f,
                ", declared load {:.2} ms/layer, recompute {:.2} ms/layer",
                declared.load_per_layer.as_secs_f64() * 1e3,
                declared.recompute_per_layer.as_secs_f64() * 1e3
            )?;
        }
        let deviation = match self.deviation {
            Deviation::Keys => "K",
            Deviation::Values => "V",
        };
        write!(f, ", check layer {}, rank by ", self.check_layer)?;
        match self.selection {
            Selection::Attention => f.write_str("attention")?,
            Selection::Deviation => write!(f, "{deviation} deviation")?,
            Selection::Weighted => write!(f, "attention × {deviation} deviation")?,
            Selection::AttentionValue => f.write_str("attention × |V|")?,
            Selection::Mixed => write!(f, "attention × |V| and {deviation} deviation")?,
            Selection::Heads => write!(f, "{HEAD_ROWS} head rows of each module, attention × |V|")?,
        }
        if self.gradual {
            write!(f, ", gradual on {deviation}")?;
        }
        if self.pipelining != Pipelining::Auto {
            write!(f, ", pipeline {}", self.pipelining.name())?;
        }
        if let Some(floor) = self.min_fidelity {
            write!(f, ", min fidelity {floor}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_parse_round_and_count() {
        let ratio: Ratio = "0.15".parse().expect("a ratio");
        assert_eq!(ratio.of(100), 15);
        assert_eq!(ratio.of(0), 0);
        assert_eq!(Ratio::ONE.of(7), 7);
        assert!("1.5".parse::<Ratio>().is_err());
        assert!("-0.1".parse::<Ratio>().is_err());
        assert!("x".parse::<Ratio>().is_err());
        assert!("NaN".parse::<Ratio>().is_err());
        assert_eq!(BlendOptions::default().recompute, ratio);
    }

    #[test]
    fn auto_ratio_and_pipelining_show_in_the_description() {
        let auto = BlendOptions {
            auto_ratio: true,
            pipelining: Pipelining::Always,
            ..BlendOptions::default()
        };
        assert_eq!(
            auto.to_string(),
            "r=auto (floor 0.15), check layer 1, rank by attention × |V|, pipeline on"
        );
        let declared = BlendOptions {
            declared_costs: Some(DeclaredCosts {
                load_per_layer: std::time::Duration::from_millis(4),
                recompute_per_layer: std::time::Duration::from_millis(10),
            }),
            ..auto
        };
        assert_eq!(
            declared.to_string(),
            "r=auto (floor 0.15), declared load 4.00 ms/layer, recompute 10.00 ms/layer, check \
             layer 1, rank by attention × |V|, pipeline on"
        );
        assert_eq!(
            BlendOptions::default().to_string(),
            "r=0.15, check layer 1, rank by attention × |V|"
        );
        let plain = BlendOptions {
            selection: Selection::Attention,
            ..BlendOptions::default()
        };
        assert_eq!(
            plain.to_string(),
            "r=0.15, check layer 1, rank by attention"
        );
        let weighted = BlendOptions {
            selection: Selection::Weighted,
            deviation: Deviation::Values,
            gradual: true,
            ..BlendOptions::default()
        };
        assert_eq!(
            weighted.to_string(),
            "r=0.15, check layer 1, rank by attention × V deviation, gradual on V"
        );
        assert_eq!("off".parse::<Pipelining>(), Ok(Pipelining::Never));
        assert!("sometimes".parse::<Pipelining>().is_err());
    }
}
