//! Q4_1 weights interleaved by eight output rows (SmolLM2's type), as Q5_0's (`interleaved`):
//! the same nibble arrangement without the fifth bits, and a min per row and block instead of
//! Q5_0's fixed offset.
//!
//! One [`PanelQ4_1`] is one GGML block column (32 weights) of eight rows: chunk `c` (weights
//! `4c..4c + 4`) of row `r` sits in byte lanes `4r..4r + 4`, chunks 0..4 in the low nibbles of
//! `packed[c]`, chunks 4..8 in the high nibbles of `packed[c - 4]`.

use half::f16;

use super::blocks::{ActGroup, BLOCK, Q4_1_BYTES, int_dot};
use super::interleaved::{PANEL, interleave_panels};

/// Weights of one row that share a chunk (one i32 of activations broadcast per chunk).
const CHUNK: usize = 4;

#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct PanelQ4_1 {
    pub packed: [[u8; 32]; 4],
    /// f16 bits of the eight rows' scales and mins.
    pub d: [u16; PANEL],
    pub m: [u16; PANEL],
}

impl PanelQ4_1 {
    /// Interleaves one GGML block (`Q4_1_BYTES` bytes: scale, min, nibbles) of each of eight
    /// rows.
    pub fn parse(rows: [&[u8]; PANEL]) -> Self {
        let mut panel = Self {
            packed: [[0; 32]; 4],
            d: [0; PANEL],
            m: [0; PANEL],
        };
        for (r, block) in rows.iter().enumerate() {
            panel.d[r] = u16::from_le_bytes([block[0], block[1]]);
            panel.m[r] = u16::from_le_bytes([block[2], block[3]]);
            // GGML's byte `i` holds weight `i` (low nibble) and `i + 16` (high nibble): chunk
            // `c`'s and chunk `c + 4`'s weight `i % 4` for `c = i / 4`, so the bytes move whole.
            for (c, packed) in panel.packed.iter_mut().enumerate() {
                packed[CHUNK * r..][..CHUNK].copy_from_slice(&block[4 + CHUNK * c..][..CHUNK]);
            }
        }
        panel
    }

    /// The unsigned 4-bit value `q` of weight `j` of row `r`.
    pub fn value(&self, r: usize, j: usize) -> u8 {
        let (chunk, lane) = (j / CHUNK, CHUNK * r + j % CHUNK);
        if chunk < 4 {
            self.packed[chunk][lane] & 0x0f
        } else {
            self.packed[chunk - 4][lane] >> 4
        }
    }

    /// Row `r`'s 32 weights in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let d = f16::from_bits(self.d[r]).to_f32();
        let m = f16::from_bits(self.m[r]).to_f32();
        for (j, value) in out.iter_mut().enumerate().take(BLOCK) {
            *value = d * f32::from(self.value(r, j)) + m;
        }
    }

    /// Scalar `Σ w·a` of the eight rows with block `b` of `acts` (the row-by-row
    /// `GroupQ4_1::dot`'s sums): the reference of the SIMD tile.
    pub fn dot(&self, acts: &ActGroup, b: usize) -> [f32; PANEL] {
        std::array::from_fn(|r| {
            let row: [i8; BLOCK] = std::array::from_fn(|j| self.value(r, j) as i8);
            f16::from_bits(self.d[r]).to_f32() * acts.d[b] * int_dot(&row, &acts.qs[b])
                + f16::from_bits(self.m[r]).to_f32() * acts.offset[b] / 16.0
        })
    }
}

/// Interleaves a row-major matrix of GGML Q4_1 blocks (`out_features` a multiple of [`PANEL`]).
pub fn interleave_q4_1(bytes: &[u8], out_features: usize, in_features: usize) -> Vec<PanelQ4_1> {
    interleave_panels(
        bytes,
        out_features,
        in_features / BLOCK,
        Q4_1_BYTES,
        PanelQ4_1::parse,
    )
}
