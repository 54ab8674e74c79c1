//! Q4_K weights interleaved by eight output rows, as `interleaved` does for Q5_0: one 32-byte
//! vector holds four consecutive weights of each of eight rows in its low nibbles and the four
//! weights 32 further on in its high nibbles, so a kernel gets eight rows' sums in the lanes.
//! GGML's byte `32g + i` of a row holds weight `64g + i` (low nibble) and `64g + 32 + i` (high):
//! vector `(g, k)` is bytes `32g + 4k .. 32g + 4k + 4` of each row, moved whole.
//!
//! The 6-bit sub-block scales and mins are unpacked to one byte each, by sub-block and row: a
//! panel is 1184 bytes for GGML's 1152 (the weights resident and read per token stay within 3%
//! of the file's), and a tile widens a sub-block's eight scales into `madd`'s i16 lanes with one
//! unpack, so a super-block's integer sum stays exact in i32 as in the row-by-row kernel.

use half::f16;

use super::interleaved::interleave_panels;
use super::kquants::{ActQ8K, BlockQ4K, Q4K_BYTES, SUPER};

/// Output rows per panel.
pub const PANEL: usize = 8;

#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct PanelQ4K {
    /// `qs[g][k]`: weights `64g + 4k + j` (low nibbles) and `64g + 32 + 4k + j` (high) of row
    /// `r` in byte `4r + j`.
    pub qs: [[[u8; 32]; 8]; 4],
    /// `scales[s][r]`: sub-block `s`'s 6-bit scale of row `r` (below 64, so as i8 it widens
    /// like Q6_K's signed scales).
    pub scales: [[i8; PANEL]; 8],
    /// `mins[s][r]`: sub-block `s`'s 6-bit min of row `r`.
    pub mins: [[i8; PANEL]; 8],
    /// f16 bits of the rows' `d` and `dmin`.
    pub d: [u16; PANEL],
    pub dmin: [u16; PANEL],
}

impl PanelQ4K {
    /// Interleaves one GGML super-block (`Q4K_BYTES` bytes) of each of eight rows.
    pub fn parse(rows: [&[u8]; PANEL]) -> Self {
        let mut panel = Self {
            qs: [[[0; 32]; 8]; 4],
            scales: [[0; PANEL]; 8],
            mins: [[0; PANEL]; 8],
            d: [0; PANEL],
            dmin: [0; PANEL],
        };
        for (r, bytes) in rows.iter().enumerate() {
            let block = BlockQ4K::parse(bytes);
            panel.d[r] = block.d;
            panel.dmin[r] = block.dmin;
            for (g, vectors) in panel.qs.iter_mut().enumerate() {
                for (k, vector) in vectors.iter_mut().enumerate() {
                    vector[4 * r..][..4].copy_from_slice(&block.qs[32 * g + 4 * k..][..4]);
                }
            }
            for s in 0..8 {
                // Both are 6-bit (`BlockQ4K::parse`), so the casts keep their values.
                panel.scales[s][r] = block.scales[s] as i8;
                panel.mins[s][r] = block.mins[s] as i8;
            }
        }
        panel
    }

    /// The 4-bit value of weight `i` of row `r`.
    pub fn value(&self, r: usize, i: usize) -> u8 {
        let (g, within) = (i / 64, i % 64);
        let byte = self.qs[g][within % 32 / 4][4 * r + within % 4];
        if within < 32 { byte & 0x0f } else { byte >> 4 }
    }

    /// Row `r`'s 256 weights in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (d, dmin) = (
            f16::from_bits(self.d[r]).to_f32(),
            f16::from_bits(self.dmin[r]).to_f32(),
        );
        for (i, value) in out.iter_mut().enumerate().take(SUPER) {
            let s = i / 32;
            let min = self.mins[s][r];
            *value = d * f32::from(self.scales[s][r]) * f32::from(self.value(r, i))
                - dmin * f32::from(min);
        }
    }

    /// Scalar `Σ w·a` of the eight rows with `acts`: the reference of the SIMD tile, in the
    /// same integer domain.
    pub fn dot(&self, acts: &ActQ8K) -> [f32; PANEL] {
        std::array::from_fn(|r| {
            let mut scaled = 0i32;
            let mut mins = 0i32;
            for s in 0..8 {
                let sum: i32 = (32 * s..32 * s + 32)
                    .map(|i| i32::from(self.value(r, i)) * i32::from(acts.qs[i]))
                    .sum();
                scaled += i32::from(self.scales[s][r]) * sum;
                mins += i32::from(self.mins[s][r]) * i32::from(acts.bsums32[s]);
            }
            let (d, dmin) = (
                f16::from_bits(self.d[r]).to_f32(),
                f16::from_bits(self.dmin[r]).to_f32(),
            );
            d * acts.d * scaled as f32 - dmin * acts.d * mins as f32
        })
    }
}

/// Interleaves a row-major matrix of GGML Q4_K super-blocks (`out_features` a multiple of
/// [`PANEL`]): panels in order of their eight rows, then of their super-block column.
pub fn interleave_q4k(bytes: &[u8], out_features: usize, in_features: usize) -> Vec<PanelQ4K> {
    interleave_panels(
        bytes,
        out_features,
        in_features / SUPER,
        Q4K_BYTES,
        PanelQ4K::parse,
    )
}
