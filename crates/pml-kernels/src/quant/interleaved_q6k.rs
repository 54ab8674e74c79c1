//! Q6_K weights interleaved by eight output rows, in GGML's bytes per weight: one 32-byte vector
//! holds the low four bits of four consecutive weights of each of eight rows in its low nibbles
//! and of the four weights 32 further on in its high nibbles (as Q4_K's panels), and one more
//! vector per two of those holds their top two bits. A kernel rebuilds the 6-bit values of eight
//! rows in registers and gets eight rows' sums in the lanes.
//!
//! Vector `(g, k)` covers weights `64g + 4k + j` (low nibble) and `64g + 32 + 4k + j` (high) of
//! row `r` in byte `4r + j`. Their top bits are in `bits[g][k / 2][2]`, byte `4r + j`, at bit
//! `4 (k % 2)` (the low-nibble weight) and `4 (k % 2) + 2` (the high-nibble one). Weight `i`'s
//! sub-block (16 weights, one signed scale) is `i / 16`: vectors `k < 4` of group `g` are in
//! sub-blocks `4g` (low nibbles) and `4g + 2` (high), vectors `k >= 4` in `4g + 1` and `4g + 3`.

use half::f16;

use super::interleaved::interleave_panels;
use super::kquants::{ActQ8K, BlockQ6K, Q6K_BYTES, SUPER};

/// Output rows per panel.
pub const PANEL: usize = 8;

/// Eight rows' super-blocks: the bytes of eight GGML Q6_K blocks, rearranged.
#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct PanelQ6K {
    /// `bits[g][m]`: vectors `(g, 2m)` and `(g, 2m + 1)`, each the low four bits of weights
    /// `64g + 4k + j` (low nibbles) and `64g + 32 + 4k + j` (high) of row `r` in byte `4r + j`,
    /// then their top two bits (vector `2m` in bits 0–3, `2m + 1` in bits 4–7): in the order a
    /// tile reads them, so a panel is read as one stream, not two planes.
    pub bits: [[[[u8; 32]; 3]; 4]; 4],
    /// `scales[s][r]`: row `r`'s signed scale of sub-block `s`.
    pub scales: [[i8; PANEL]; 16],
    /// f16 bits of the rows' `d`.
    pub d: [u16; PANEL],
    /// To the 32-byte alignment (a `Pod` type spells its padding out).
    pub pad: [u16; PANEL],
}

impl PanelQ6K {
    /// Interleaves one GGML super-block (`Q6K_BYTES` bytes) of each of eight rows.
    pub fn parse(rows: [&[u8]; PANEL]) -> Self {
        let mut panel = Self {
            bits: [[[[0; 32]; 3]; 4]; 4],
            scales: [[0; PANEL]; 16],
            d: [0; PANEL],
            pad: [0; PANEL],
        };
        for (r, bytes) in rows.iter().enumerate() {
            let block = BlockQ6K::parse(bytes);
            let values = block.values();
            panel.d[r] = block.d;
            for (s, scales) in panel.scales.iter_mut().enumerate() {
                scales[r] = block.scales[s];
            }
            for g in 0..4 {
                for k in 0..8 {
                    for j in 0..4 {
                        let (low, high) =
                            (values[64 * g + 4 * k + j], values[64 * g + 32 + 4 * k + j]);
                        let byte = 4 * r + j;
                        let pair = &mut panel.bits[g][k / 2];
                        pair[k % 2][byte] = (low & 0x0f) | ((high & 0x0f) << 4);
                        pair[2][byte] |= ((low >> 4) | ((high >> 4) << 2)) << (4 * (k % 2));
                    }
                }
            }
        }
        panel
    }

    /// The unsigned 6-bit value `q` of weight `i` of row `r` (weight = `d * scale * (q - 32)`).
    pub fn value(&self, r: usize, i: usize) -> u8 {
        let (g, within) = (i / 64, i % 64);
        let (k, j) = (within % 32 / 4, within % 4);
        let byte = 4 * r + j;
        let pair = &self.bits[g][k / 2];
        let low_bits = pair[k % 2][byte];
        let high_bits = pair[2][byte] >> (4 * (k % 2));
        if within < 32 {
            (low_bits & 0x0f) | ((high_bits & 0x03) << 4)
        } else {
            (low_bits >> 4) | ((high_bits & 0x0c) << 2)
        }
    }

    /// Row `r`'s 256 weights in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let d = f16::from_bits(self.d[r]).to_f32();
        for (i, value) in out.iter_mut().enumerate().take(SUPER) {
            let scale = f32::from(self.scales[i / 16][r]);
            *value = d * scale * (f32::from(self.value(r, i)) - 32.0);
        }
    }

    /// Scalar `Σ w·a` of the eight rows with `acts`: the reference of the SIMD tile, in the
    /// same integer domain as the row-by-row kernel.
    pub fn dot(&self, acts: &ActQ8K) -> [f32; PANEL] {
        std::array::from_fn(|r| {
            let mut scaled = 0i32;
            for s in 0..16 {
                let sum: i32 = (16 * s..16 * s + 16)
                    .map(|i| i32::from(self.value(r, i)) * i32::from(acts.qs[i]))
                    .sum();
                scaled += i32::from(self.scales[s][r]) * (sum - 32 * i32::from(acts.bsums16[s]));
            }
            f16::from_bits(self.d[r]).to_f32() * acts.d * scaled as f32
        })
    }
}

/// Interleaves a row-major matrix of GGML Q6_K super-blocks (`out_features` a multiple of
/// [`PANEL`]): panels in order of their eight rows, then of their super-block column.
pub fn interleave_q6k(bytes: &[u8], out_features: usize, in_features: usize) -> Vec<PanelQ6K> {
    interleave_panels(
        bytes,
        out_features,
        in_features / SUPER,
        Q6K_BYTES,
        PanelQ6K::parse,
    )
}
