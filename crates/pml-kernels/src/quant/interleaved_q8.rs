//! Q8_0 weights interleaved by eight output rows, as Q5_0's (`interleaved`): one 32-byte vector
//! holds four consecutive weights of each of eight rows, so a tile multiplies it with four
//! activations broadcast to every lane and gets the eight rows' partial sums in its lanes.
//!
//! One [`PanelQ8_0`] is one GGML block column (32 weights) of eight rows: for chunk `c`
//! (weights `4c..4c + 4`) of row `r`, byte lane `4r + j` of `qs[c]` holds weight `4c + j`.

use half::f16;

use super::blocks::{ActGroup, BLOCK, Q8_0_BYTES, int_dot};
use super::interleaved::{PANEL, interleave_panels};

/// Weights of one row that share a chunk (one i32 of activations broadcast per chunk).
const CHUNK: usize = 4;

#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct PanelQ8_0 {
    pub qs: [[i8; 32]; BLOCK / CHUNK],
    /// f16 bits of the eight rows' scales.
    pub d: [u16; PANEL],
    /// The alignment's padding, spelled out so that a panel is plain bytes (the layout cache
    /// writes and maps panels as they are).
    pub pad: [u8; 16],
}

impl PanelQ8_0 {
    /// Interleaves one GGML block (`Q8_0_BYTES` bytes: scale, 32 signed weights) of each of
    /// eight rows.
    pub fn parse(rows: [&[u8]; PANEL]) -> Self {
        let mut panel = Self {
            qs: [[0; 32]; BLOCK / CHUNK],
            d: [0; PANEL],
            pad: [0; 16],
        };
        for (r, block) in rows.iter().enumerate() {
            panel.d[r] = u16::from_le_bytes([block[0], block[1]]);
            for (c, chunk) in panel.qs.iter_mut().enumerate() {
                for (lane, &byte) in chunk[CHUNK * r..][..CHUNK]
                    .iter_mut()
                    .zip(&block[2 + CHUNK * c..][..CHUNK])
                {
                    *lane = byte as i8;
                }
            }
        }
        panel
    }

    /// Weight `j` of row `r`.
    pub fn value(&self, r: usize, j: usize) -> i8 {
        self.qs[j / CHUNK][CHUNK * r + j % CHUNK]
    }

    /// Row `r`'s 32 weights in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let d = f16::from_bits(self.d[r]).to_f32();
        for (j, value) in out.iter_mut().enumerate().take(BLOCK) {
            *value = d * f32::from(self.value(r, j));
        }
    }

    /// Scalar `Σ w·a` of the eight rows with block `b` of `acts`: the reference of the SIMD tile
    /// (the same sums as the row-by-row `GroupQ8_0::dot`).
    pub fn dot(&self, acts: &ActGroup, b: usize) -> [f32; PANEL] {
        std::array::from_fn(|r| {
            let row: [i8; BLOCK] = std::array::from_fn(|j| self.value(r, j));
            f16::from_bits(self.d[r]).to_f32() * acts.d[b] * int_dot(&row, &acts.qs[b])
        })
    }
}

/// Interleaves a row-major matrix of GGML Q8_0 blocks (`out_features` a multiple of [`PANEL`]).
pub fn interleave_q8_0(bytes: &[u8], out_features: usize, in_features: usize) -> Vec<PanelQ8_0> {
    interleave_panels(
        bytes,
        out_features,
        in_features / BLOCK,
        Q8_0_BYTES,
        PanelQ8_0::parse,
    )
}
