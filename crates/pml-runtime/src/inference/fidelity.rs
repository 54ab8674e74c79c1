//! Mode `blend`'s estimate of how far its answer is from mode `full`'s, and the guard that sends
//! a prompt whose estimate is too low to `full`.
//!
//! The estimate compares two answers blend computes anyway: the first token's distribution after
//! the selective recompute, and the one the new tokens reach over the spliced rows alone (the
//! attention pass that ranks the cached rows is that computation, from the probe's exact first
//! layers on). Repairing a fraction of the cached rows moves the answer from the second towards
//! `full`'s; where it moved it a lot, the rows left unrepaired likely move it more, and where it
//! changed the most likely token, the answer sits on a near tie that any approximation flips.
//! So the estimated fidelity is one minus the total variation distance between the two
//! distributions, and the guard lets an answer through only where that reaches its floor and the
//! repair left the most likely first token as it was.

use std::fmt;

use candle_core::{DType, Tensor};

use super::InferenceError;
use super::blend_options::Ratio;

/// How far a `blend` answer's first token is estimated to be from `full`'s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FidelityEstimate {
    /// Total variation distance between the first token's distribution after the recompute and
    /// over the spliced rows alone: in `[0, 1]`, 0 where the repair changed nothing.
    pub deviation: f32,
    /// The repair changed the most likely first token.
    pub first_token_changed: bool,
}

impl FidelityEstimate {
    /// An answer computed exactly (nothing deviated, or everything was recomputed).
    pub const EXACT: FidelityEstimate = FidelityEstimate {
        deviation: 0.0,
        first_token_changed: false,
    };

    /// The estimate from the `(vocab,)` logits after the recompute and over the spliced rows.
    pub fn of(repaired: &Tensor, spliced: &Tensor) -> Result<Self, InferenceError> {
        let repaired = probabilities(repaired)?;
        let spliced = probabilities(spliced)?;
        if repaired.len() != spliced.len() {
            return Err(InferenceError::InvalidPrompt(format!(
                "fidelity estimate over {} and {} logits",
                repaired.len(),
                spliced.len()
            )));
        }
        let distance: f64 = repaired
            .iter()
            .zip(&spliced)
            .map(|(a, b)| f64::from((a - b).abs()))
            .sum();
        Ok(Self {
            deviation: (distance / 2.0).clamp(0.0, 1.0) as f32,
            first_token_changed: most_likely(&repaired) != most_likely(&spliced),
        })
    }

    /// One minus [`Self::deviation`].
    pub fn fidelity(&self) -> f32 {
        1.0 - self.deviation
    }

    /// Whether the guard lets the answer through at `floor`: the estimate reaches it and the
    /// repair kept the most likely first token.
    pub fn passes(&self, floor: Ratio) -> bool {
        f64::from(self.fidelity()) >= floor.get() && !self.first_token_changed
    }
}

impl fmt::Display for FidelityEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "estimated fidelity {:.3}", self.fidelity())?;
        if self.first_token_changed {
            f.write_str(" (the repair changed the first token)")?;
        }
        Ok(())
    }
}

/// What the guard did with a prompt whose estimate fell short of its floor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuardFired {
    pub floor: Ratio,
    /// The estimate of the `blend` answer that was not used.
    pub estimate: FidelityEstimate,
}

impl fmt::Display for GuardFired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fidelity guard: blend's {} fell short of {}, answered in mode full",
            self.estimate, self.floor
        )
    }
}

fn probabilities(logits: &Tensor) -> Result<Vec<f32>, InferenceError> {
    let logits = logits
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Err(InferenceError::InvalidPrompt(
            "fidelity estimate over logits that are not finite".into(),
        ));
    }
    let exps: Vec<f32> = logits.iter().map(|&x| (x - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    Ok(exps.into_iter().map(|e| e / sum).collect())
}

fn most_likely(probabilities: &[f32]) -> Option<usize> {
    probabilities
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map(|(index, _)| index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn logits(values: &[f32]) -> Tensor {
        Tensor::new(values, &Device::Cpu).expect("a tensor")
    }

    #[test]
    fn equal_logits_are_exact_and_pass_any_floor() {
        let estimate =
            FidelityEstimate::of(&logits(&[1.0, 3.0, 2.0]), &logits(&[1.0, 3.0, 2.0])).unwrap();
        assert!(estimate.deviation.abs() < 1e-6);
        assert!(!estimate.first_token_changed);
        assert!(estimate.passes(Ratio::new(0.999_999).unwrap()));
    }

    #[test]
    fn the_distance_is_total_variation_and_a_changed_first_token_never_passes() {
        // Probabilities (0.5, 0.5) against (~1, ~0): distance ~0.5.
        let estimate = FidelityEstimate::of(&logits(&[0.0, 0.0]), &logits(&[0.0, -40.0])).unwrap();
        assert!((estimate.deviation - 0.5).abs() < 1e-4, "{estimate:?}");
        // Ties break to the lower index: both pick token 0.
        assert!(!estimate.first_token_changed);
        assert!(estimate.passes(Ratio::new(0.5).unwrap()));
        assert!(!estimate.passes(Ratio::new(0.6).unwrap()));

        let flipped = FidelityEstimate::of(&logits(&[0.0, 0.01]), &logits(&[0.01, 0.0])).unwrap();
        assert!(flipped.first_token_changed);
        assert!(flipped.deviation < 0.01);
        assert!(!flipped.passes(Ratio::ZERO));
        assert!(FidelityEstimate::of(&logits(&[0.0]), &logits(&[0.0, 1.0])).is_err());
        assert!(FidelityEstimate::of(&logits(&[f32::NAN]), &logits(&[0.0])).is_err());
    }
}
