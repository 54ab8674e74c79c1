//! The flags that choose an inference mode and its selective-recompute settings, shared by
//! `pml run` and `pml eval`: the recompute fraction (a number, or `auto` for the loading
//! controller above `--recompute-floor`), check layer, deviation, gradual filtering and whether
//! cached layers stream from the store during the recompute.

use std::fmt;
use std::str::FromStr;

use clap::Args;
use pml_runtime::inference::{
    BlendOptions, Deviation, InferenceMode, Pipelining, Ratio, Selection,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Reuse,
    Blend,
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviationArg {
    K,
    V,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SelectArg {
    Deviation,
    Attention,
    Weighted,
    AttentionValue,
    Mixed,
    Heads,
}

impl From<SelectArg> for Selection {
    fn from(select: SelectArg) -> Self {
        match select {
            SelectArg::Deviation => Selection::Deviation,
            SelectArg::Attention => Selection::Attention,
            SelectArg::Weighted => Selection::Weighted,
            SelectArg::AttentionValue => Selection::AttentionValue,
            SelectArg::Mixed => Selection::Mixed,
            SelectArg::Heads => Selection::Heads,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PipelineArg {
    Auto,
    On,
    Off,
}

/// `--recompute`: a fixed fraction, or `auto` (the loading controller's choice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecomputeArg {
    Fixed(Ratio),
    Auto,
}

impl FromStr for RecomputeArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.trim() {
            "auto" => Ok(RecomputeArg::Auto),
            number => number
                .parse()
                .map(RecomputeArg::Fixed)
                .map_err(|error| format!("{error} (or `auto`)")),
        }
    }
}

impl fmt::Display for RecomputeArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecomputeArg::Fixed(ratio) => write!(f, "{ratio}"),
            RecomputeArg::Auto => f.write_str("auto"),
        }
    }
}

/// Selective-recompute settings (mode `blend`) other than the ratio.
#[derive(Args, Clone, Debug)]
pub struct BlendArgs {
    /// Layer at which mode `blend` measures each cached token's deviation.
    #[arg(long, value_name = "L", default_value_t = BlendOptions::DEFAULT_CHECK_LAYER)]
    pub check_layer: usize,
    /// Measure the deviation on K (default) or V.
    #[arg(long, value_enum, default_value_t = DeviationArg::K)]
    pub deviation: DeviationArg,
    /// How mode `blend` ranks the cached tokens to recompute: by the attention the new tokens pay
    /// them, each weight times the slot's value norm (attention-value, the default), by the plain
    /// attention, by their deviation at the check layer (CacheBlend's), by deviation ×
    /// attention (weighted), or by the better of their attention-value and deviation places
    /// (mixed).
    #[arg(long, value_enum, default_value_t = SelectArg::AttentionValue)]
    pub select: SelectArg,
    /// Gradual filtering: choose twice the fraction at the check layer, narrow to it one layer on.
    #[arg(long)]
    pub gradual: bool,
    /// With `--recompute auto`: the least fraction the loading controller picks.
    #[arg(long, value_name = "R", default_value_t = default_ratio())]
    pub recompute_floor: Ratio,
    /// Stream the cached layers from the store while the recompute runs: `auto` when some
    /// cached module is not in RAM (disk, Redis).
    #[arg(long, value_enum, default_value_t = PipelineArg::Auto)]
    pub pipeline: PipelineArg,
    /// Recompute exactly the fraction asked, even where the probe shows that recomputing
    /// everything costs no more, or that no cached token deviates (by default blend then does
    /// the cheaper thing and says so in the summary line).
    #[arg(long)]
    pub exact_ratio: bool,
    /// The fidelity guard: answer in mode `full` instead where blend's estimated fidelity to
    /// it (one minus the distance between the first token's distributions before and after the
    /// repair) is below F, or where the repair changed the most likely first token.
    #[arg(long, value_name = "F")]
    pub min_fidelity: Option<Ratio>,
}

impl BlendArgs {
    /// The options with `recompute` as the ratio (or the controller's choice).
    pub fn options(&self, recompute: RecomputeArg) -> BlendOptions {
        BlendOptions {
            recompute: match recompute {
                RecomputeArg::Fixed(ratio) => ratio,
                RecomputeArg::Auto => self.recompute_floor,
            },
            auto_ratio: recompute == RecomputeArg::Auto,
            declared_costs: None,
            pipelining: match self.pipeline {
                PipelineArg::Auto => Pipelining::Auto,
                PipelineArg::On => Pipelining::Always,
                PipelineArg::Off => Pipelining::Never,
            },
            check_layer: self.check_layer,
            deviation: match self.deviation {
                DeviationArg::K => Deviation::Keys,
                DeviationArg::V => Deviation::Values,
            },
            selection: self.select.into(),
            gradual: self.gradual,
            shortcuts: !self.exact_ratio,
            min_fidelity: self.min_fidelity,
        }
    }

    /// Mode `mode` with these settings and `recompute` where it takes them.
    pub fn mode(&self, mode: ModeArg, recompute: RecomputeArg) -> InferenceMode {
        match mode {
            ModeArg::Reuse => InferenceMode::Reuse,
            ModeArg::Blend => InferenceMode::Blend(self.options(recompute)),
            ModeArg::Full => InferenceMode::Full,
        }
    }
}

/// The default fraction recomputed (and the default floor of `--recompute auto`).
pub fn default_ratio() -> Ratio {
    Ratio::new(BlendOptions::DEFAULT_RATIO).unwrap_or(Ratio::ZERO)
}

/// `--recompute`'s default.
pub fn default_recompute() -> RecomputeArg {
    RecomputeArg::Fixed(default_ratio())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recompute_takes_a_fraction_or_auto() {
        assert_eq!("auto".parse::<RecomputeArg>(), Ok(RecomputeArg::Auto));
        let fixed: RecomputeArg = "0.3".parse().expect("a fraction");
        assert_eq!(fixed.to_string(), "0.3");
        let error = "lots".parse::<RecomputeArg>().expect_err("neither");
        assert!(error.contains("or `auto`"), "{error}");
        assert!("1.5".parse::<RecomputeArg>().is_err());
    }
}
