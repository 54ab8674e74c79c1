//! Q5_0 weights interleaved by eight output rows, the layout llama.cpp's ggml-cpu "repack" and
//! candle's x86 repack kernels use for their fast paths: one 32-byte vector holds four
//! consecutive weights of each of eight rows, so a kernel multiplies it with four activations
//! broadcast to every lane and gets eight rows' partial sums in the lanes — no horizontal
//! folding, and each block's two scales applied to eight rows with one multiply. Against the
//! row-by-row groups (`blocks::GroupQ5_0`) this halves the instructions per weight of a tile
//! (`examples/kernel_probe`). Matrices whose row count is not a multiple of eight keep the
//! row-by-row layout.
//!
//! One [`PanelQ5_0`] is one GGML block column (32 weights) of eight rows, the same bits
//! rearranged: for chunk `c` (weights `4c..4c + 4`) of row `r`, byte lane `4r + j` holds weight
//! `4c + j`. Chunks 0..4 are the low nibbles of `packed[c]`, chunks 4..8 the high nibbles of
//! `packed[c - 4]`; bit `4r + j` of `high[c]` is the weight's fifth bit.

use crate::memory::huge_pages::fill_on_huge_pages;
use half::f16;

use super::blocks::{ActGroup, BLOCK, GROUP, Q5_0_BYTES};

/// Output rows per panel.
pub const PANEL: usize = 8;
/// Weights of one row that share a chunk (one i32 of activations broadcast per chunk).
const CHUNK: usize = 4;

#[repr(C, align(32))]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct PanelQ5_0 {
    pub packed: [[u8; 32]; 4],
    pub high: [u32; 8],
    /// f16 bits of the eight rows' scales.
    pub d: [u16; PANEL],
    /// The alignment's padding, spelled out so that a panel is plain bytes (the layout cache
    /// writes and maps panels as they are).
    pub pad: [u8; 16],
}

impl PanelQ5_0 {
    /// Interleaves one GGML block (`Q5_0_BYTES` bytes: scale, fifth bits, nibbles) of each of
    /// eight rows.
    pub fn parse(rows: [&[u8]; PANEL]) -> Self {
        let mut panel = Self {
            packed: [[0; 32]; 4],
            high: [0; 8],
            d: [0; PANEL],
            pad: [0; 16],
        };
        for (r, block) in rows.iter().enumerate() {
            panel.d[r] = u16::from_le_bytes([block[0], block[1]]);
            let fifth = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let nibbles = &block[6..Q5_0_BYTES];
            // GGML's byte `i` holds weight `i` (low nibble) and `i + 16` (high nibble), which are
            // chunk `c`'s and chunk `c + 4`'s weight `i % 4` for `c = i / 4`: the bytes move whole.
            for (c, packed) in panel.packed.iter_mut().enumerate() {
                packed[CHUNK * r..][..CHUNK].copy_from_slice(&nibbles[CHUNK * c..][..CHUNK]);
            }
            for (c, high) in panel.high.iter_mut().enumerate() {
                *high |= ((fifth >> (CHUNK * c)) & 0xf) << (CHUNK * r);
            }
        }
        panel
    }

    /// The unsigned 5-bit value (`q + 16`) of weight `j` of row `r`.
    pub fn value(&self, r: usize, j: usize) -> u8 {
        let (chunk, lane) = (j / CHUNK, CHUNK * r + j % CHUNK);
        let nibble = if chunk < 4 {
            self.packed[chunk][lane] & 0x0f
        } else {
            self.packed[chunk - 4][lane] >> 4
        };
        nibble | ((((self.high[chunk] >> lane) & 1) as u8) << 4)
    }

    /// Row `r`'s 32 weights in f32.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let d = f16::from_bits(self.d[r]).to_f32();
        for (j, value) in out.iter_mut().enumerate().take(BLOCK) {
            *value = d * (f32::from(self.value(r, j)) - 16.0);
        }
    }

    /// Scalar `Σ w·a` of the eight rows with block `b` of `acts`: the reference of the SIMD tile.
    pub fn dot(&self, acts: &ActGroup, b: usize) -> [f32; PANEL] {
        std::array::from_fn(|r| {
            let sum: i32 = (0..BLOCK)
                .map(|j| i32::from(self.value(r, j)) * i32::from(acts.qs[b][j]))
                .sum();
            let d = f16::from_bits(self.d[r]).to_f32();
            d * acts.d[b] * sum as f32 - d * acts.offset[b]
        })
    }
}

/// Interleaves a row-major matrix of GGML Q5_0 blocks (`out_features` a multiple of
/// [`PANEL`]): panels in order of their eight rows, then of their block column.
pub fn interleave(bytes: &[u8], out_features: usize, in_features: usize) -> Vec<PanelQ5_0> {
    interleave_panels(
        bytes,
        out_features,
        in_features / BLOCK,
        Q5_0_BYTES,
        PanelQ5_0::parse,
    )
}

/// Panels of `PANEL` rows of a row-major matrix of `columns` blocks of `block_bytes` per row,
/// each panel `parse`d from one block of each of its rows; in order of their rows, then of
/// their block column, on huge pages.
pub(super) fn interleave_panels<P: Send>(
    bytes: &[u8],
    out_features: usize,
    columns: usize,
    block_bytes: usize,
    parse: impl Fn([&[u8]; PANEL]) -> P + Sync,
) -> Vec<P> {
    let row_bytes = columns * block_bytes;
    let panel_rows = (bytes.len() / (row_bytes * PANEL).max(1)).min(out_features / PANEL);
    fill_on_huge_pages(panel_rows * columns, |index| {
        let (panel_row, column) = (index / columns, index % columns);
        let at = panel_row * PANEL * row_bytes + column * block_bytes;
        parse(std::array::from_fn(|r| {
            &bytes[at + r * row_bytes..][..block_bytes]
        }))
    })
}

/// Scalar `Σ w·a` of one row of panels (eight output rows) with each of `RN` activation rows.
pub fn tile_scalar<const RN: usize>(
    panels: &[PanelQ5_0],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    acts.map(|row| tile_scalar_by(panels, row, PanelQ5_0::dot))
}

/// Scalar `Σ w·a` of one row of panels with one activation row, each panel's block column
/// multiplied by `dot` (a panel type's scalar reference).
pub fn tile_scalar_by<P>(
    panels: &[P],
    acts: &[ActGroup],
    dot: impl Fn(&P, &ActGroup, usize) -> [f32; PANEL],
) -> [f32; PANEL] {
    let mut out = [0f32; PANEL];
    for (column, panel) in panels.iter().enumerate() {
        let partial = dot(panel, &acts[column / GROUP], column % GROUP);
        for (out, partial) in out.iter_mut().zip(partial) {
            *out += partial;
        }
    }
    out
}
