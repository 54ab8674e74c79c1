//! The flags that choose an inference mode and its selective-recompute settings, shared by
//! `pml run` and `pml eval`.

use clap::Args;
use pml_runtime::inference::{BlendOptions, Deviation, InferenceMode, Ratio};

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

/// Selective-recompute settings (mode `blend`) other than the ratio.
#[derive(Args, Clone, Debug)]
pub struct BlendArgs {
    /// Layer at which mode `blend` measures each cached token's deviation.
    #[arg(long, value_name = "L", default_value_t = BlendOptions::DEFAULT_CHECK_LAYER)]
    pub check_layer: usize,
    /// Measure the deviation on K (default) or V.
    #[arg(long, value_enum, default_value_t = DeviationArg::K)]
    pub deviation: DeviationArg,
    /// Gradual filtering: choose twice the fraction at the check layer, narrow to it one layer on.
    #[arg(long)]
    pub gradual: bool,
}

impl BlendArgs {
    /// The options with `recompute` as the ratio.
    pub fn options(&self, recompute: Ratio) -> BlendOptions {
        BlendOptions {
            recompute,
            check_layer: self.check_layer,
            deviation: match self.deviation {
                DeviationArg::K => Deviation::Keys,
                DeviationArg::V => Deviation::Values,
            },
            gradual: self.gradual,
        }
    }

    /// Mode `mode` with these settings and `recompute` where it takes them.
    pub fn mode(&self, mode: ModeArg, recompute: Ratio) -> InferenceMode {
        match mode {
            ModeArg::Reuse => InferenceMode::Reuse,
            ModeArg::Blend => InferenceMode::Blend(self.options(recompute)),
            ModeArg::Full => InferenceMode::Full,
        }
    }
}

/// The default fraction recomputed.
pub fn default_ratio() -> Ratio {
    Ratio::new(BlendOptions::DEFAULT_RATIO).unwrap_or(Ratio::ZERO)
}
