//! One trait over the block types our kernels multiply: the activations each type pairs with,
//! how they are quantized, and the product of one weight row with a tile of activation rows,
//! through the AVX2 code where the CPU has it and the scalar reference where it does not.

use super::avx2::{tile_q5_0, tile_q8_0};
use super::avx2_kquants::{tile_q4k, tile_q6k};
use super::blocks::{self, ActGroup, GROUP_WEIGHTS, GroupQ5_0, GroupQ8_0};
use super::kquants::{self, ActQ8K, BlockQ4K, BlockQ6K, SUPER};

/// Activation rows one kernel call multiplies with one weight row: the weights are unpacked
/// once per tile. Four keeps a tile's accumulators and unpacked weights within AVX2's 16
/// registers.
pub const TILE: usize = 4;

pub trait BlockKernel: Sized + Sync {
    /// Weights per unit (a row is a whole number of units).
    const WEIGHTS: usize;
    /// The quantized activations, one per unit of weights.
    type Act: Sync;

    /// Quantizes rows of activations (whole units long, concatenated) into `out`.
    fn quantize(x: &[f32], out: &mut Vec<Self::Act>);

    /// Scalar `Σ w·a` of one unit.
    fn dot(&self, acts: &Self::Act) -> f32;

    /// SIMD `Σ w·a` of a weight row with `RN` activation rows, `None` without the CPU features.
    fn simd_tile<const RN: usize>(weights: &[Self], acts: [&[Self::Act]; RN]) -> Option<[f32; RN]>;

    /// `Σ w·a` of a weight row with each of `RN` activation rows.
    fn tile<const RN: usize>(weights: &[Self], acts: [&[Self::Act]; RN]) -> [f32; RN] {
        Self::simd_tile(weights, acts)
            .unwrap_or_else(|| acts.map(|row| weights.iter().zip(row).map(|(w, a)| w.dot(a)).sum()))
    }

    /// `out[i] = Σ w·acts[i]` for up to [`TILE`] activation rows.
    fn tile_rows(weights: &[Self], acts: &[&[Self::Act]], out: &mut [f32]) {
        match *acts {
            [a] => out.copy_from_slice(&Self::tile(weights, [a])),
            [a, b] => out.copy_from_slice(&Self::tile(weights, [a, b])),
            [a, b, c] => out.copy_from_slice(&Self::tile(weights, [a, b, c])),
            [a, b, c, d] => out.copy_from_slice(&Self::tile(weights, [a, b, c, d])),
            _ => {
                for (out, row) in out.iter_mut().zip(acts) {
                    *out = Self::tile(weights, [*row])[0];
                }
            }
        }
    }
}

impl BlockKernel for GroupQ8_0 {
    const WEIGHTS: usize = GROUP_WEIGHTS;
    type Act = ActGroup;

    fn quantize(x: &[f32], out: &mut Vec<ActGroup>) {
        blocks::quantize_activations(x, out);
    }

    fn dot(&self, acts: &ActGroup) -> f32 {
        GroupQ8_0::dot(self, acts)
    }

    fn simd_tile<const RN: usize>(weights: &[Self], acts: [&[ActGroup]; RN]) -> Option<[f32; RN]> {
        tile_q8_0(weights, acts)
    }
}

impl BlockKernel for GroupQ5_0 {
    const WEIGHTS: usize = GROUP_WEIGHTS;
    type Act = ActGroup;

    fn quantize(x: &[f32], out: &mut Vec<ActGroup>) {
        blocks::quantize_activations(x, out);
    }

    fn dot(&self, acts: &ActGroup) -> f32 {
        GroupQ5_0::dot(self, acts)
    }

    fn simd_tile<const RN: usize>(weights: &[Self], acts: [&[ActGroup]; RN]) -> Option<[f32; RN]> {
        tile_q5_0(weights, acts)
    }
}

impl BlockKernel for BlockQ4K {
    const WEIGHTS: usize = SUPER;
    type Act = ActQ8K;

    fn quantize(x: &[f32], out: &mut Vec<ActQ8K>) {
        kquants::quantize_activations(x, out);
    }

    fn dot(&self, acts: &ActQ8K) -> f32 {
        BlockQ4K::dot(self, acts)
    }

    fn simd_tile<const RN: usize>(weights: &[Self], acts: [&[ActQ8K]; RN]) -> Option<[f32; RN]> {
        tile_q4k(weights, acts)
    }
}

impl BlockKernel for BlockQ6K {
    const WEIGHTS: usize = SUPER;
    type Act = ActQ8K;

    fn quantize(x: &[f32], out: &mut Vec<ActQ8K>) {
        kquants::quantize_activations(x, out);
    }

    fn dot(&self, acts: &ActQ8K) -> f32 {
        BlockQ6K::dot(self, acts)
    }

    fn simd_tile<const RN: usize>(weights: &[Self], acts: [&[ActQ8K]; RN]) -> Option<[f32; RN]> {
        tile_q6k(weights, acts)
    }
}
