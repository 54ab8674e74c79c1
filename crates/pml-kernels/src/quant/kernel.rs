//! One trait over the block types our kernels multiply: the activations each type pairs with,
//! how they are quantized, and the product of one weight row with a tile of activation rows,
//! through the AVX2 code where the CPU has it and the scalar reference where it does not.

use super::avx2::{tile_q4_1, tile_q5_0, tile_q8_0};
use super::avx2_kquants::{tile_q4k, tile_q6k};
use super::blocks::{self, ActGroup, GROUP_WEIGHTS, GroupQ4_1, GroupQ5_0, GroupQ8_0};
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

/// The impl for a block type: its activations, their quantizer and its SIMD tile.
macro_rules! block_kernel {
    ($block:ty, $weights:expr, $act:ty, $quantize:path, $tile:path) => {
        impl BlockKernel for $block {
            const WEIGHTS: usize = $weights;
            type Act = $act;

            fn quantize(x: &[f32], out: &mut Vec<$act>) {
                $quantize(x, out);
            }

            fn dot(&self, acts: &$act) -> f32 {
                <$block>::dot(self, acts)
            }

            fn simd_tile<const RN: usize>(
                weights: &[Self],
                acts: [&[$act]; RN],
            ) -> Option<[f32; RN]> {
                $tile(weights, acts)
            }
        }
    };
}

block_kernel!(
    GroupQ8_0,
    GROUP_WEIGHTS,
    ActGroup,
    blocks::quantize_activations,
    tile_q8_0
);
block_kernel!(
    GroupQ5_0,
    GROUP_WEIGHTS,
    ActGroup,
    blocks::quantize_activations,
    tile_q5_0
);
block_kernel!(
    GroupQ4_1,
    GROUP_WEIGHTS,
    ActGroup,
    blocks::quantize_activations,
    tile_q4_1
);
block_kernel!(
    BlockQ4K,
    SUPER,
    ActQ8K,
    kquants::quantize_activations,
    tile_q4k
);
block_kernel!(
    BlockQ6K,
    SUPER,
    ActQ8K,
    kquants::quantize_activations,
    tile_q6k
);
