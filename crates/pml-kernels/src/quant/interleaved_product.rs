//! Products of fewer than [`super::INTERLEAVED_PANEL_MIN_ROWS`] rows with an interleaved matrix (Q5_0, Q4_1, Q8_0, Q4_K, Q6_K):
//! the activations are quantized once; the pool's workers take items of
//! [`PANELS_PER_ITEM`] panel rows, walk the activation rows in tiles (of [`TILE`], or all of a
//! few up to [`PANEL_TILE`]), and write each
//! tile's eight outputs per panel straight into the row-major result.

use super::avx2_interleaved::{dequantize_panel, tile_panels, tile_q8_0_panels};
use super::avx2_interleaved_kquants::{tile_q4k_panels, tile_q6k_panels};
use super::blocks::{self, ActGroup, GROUP_WEIGHTS};
use super::interleaved::{PANEL, PanelQ5_0, tile_scalar, tile_scalar_by};
use super::interleaved_kquants::PanelQ4K;
use super::interleaved_q4_1::PanelQ4_1;
use super::interleaved_q6k::PanelQ6K;
use super::interleaved_q8::PanelQ8_0;
use super::kernel::TILE;
use super::kquants::{self, ActQ8K, SUPER};
use super::mac::{Level, Simd};
use super::panels::Output;

/// Panel rows (of eight output rows) per work item: 32 output rows, as the row-by-row path.
const PANELS_PER_ITEM: usize = 4;

/// Bytes of quantized activations one pass over the matrix reads. Every item reads the whole
/// block (from L3, where 2 MiB sits on any x86 server), and the matrix is read from memory once
/// per block: at a 7B model's MLP (18,944 inputs, 21 KiB of activations a row) a quarter of L2
/// held 12 rows, so `ffn_down` was read from memory 43 times for 512 tokens (2 MiB: 6 times,
/// and 1.3× the prefill rate).
const ACT_BLOCK_BYTES: usize = 2 << 20;

/// Activations from which quantizing them is split over the pool's workers: below it (a decode
/// step's row) handing out the work would cost more than it saves.
const PARALLEL_QUANTIZE_VALUES: usize = 1 << 16;

/// A block type interleaved by [`PANEL`] rows: its activations and its tile of eight rows.
pub trait PanelKernel: Sized + Sync {
    /// Weights of one row in one panel (a panel column).
    const COLUMN_WEIGHTS: usize;
    /// Activations per quantized unit (a row of activations is a whole number of them).
    const ACT_WEIGHTS: usize;
    type Act: Send + Sync;

    fn quantize(x: &[f32], out: &mut Vec<Self::Act>);

    /// `Σ w·a` of a row of panels with each of `RN` activation rows: at the SIMD level `simd`
    /// (in `Simd::best`, the fastest this CPU has), the scalar reference for `None` or where the
    /// type has no tile at that level.
    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[Self::Act]; RN],
    ) -> [[f32; PANEL]; RN];

    /// Row `r`'s [`Self::COLUMN_WEIGHTS`] weights in f32.
    fn dequantize_row(&self, r: usize, out: &mut [f32]);

    /// All eight rows, row `r` at `out[r * stride..]`, in SIMD code; `false` (nothing written)
    /// where the type or the CPU has none.
    fn dequantize_panel(&self, out: &mut [f32], stride: usize) -> bool {
        let _ = (out, stride);
        false
    }
}

/// The items shared by the panel types of one GGML block per column whose activations are
/// quantized in groups of blocks (Q5_0's, Q4_1's and Q8_0's).
macro_rules! block_column_with_group_activations {
    () => {
        const COLUMN_WEIGHTS: usize = blocks::BLOCK;
        const ACT_WEIGHTS: usize = GROUP_WEIGHTS;
        type Act = ActGroup;

        fn quantize(x: &[f32], out: &mut Vec<ActGroup>) {
            blocks::quantize_activations(x, out);
        }
    };
}

impl PanelKernel for PanelQ5_0 {
    block_column_with_group_activations!();

    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[ActGroup]; RN],
    ) -> [[f32; PANEL]; RN] {
        tile_panels(simd, panels, acts).unwrap_or_else(|| tile_scalar(panels, acts))
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PanelQ5_0::dequantize_row(self, r, out);
    }

    fn dequantize_panel(&self, out: &mut [f32], stride: usize) -> bool {
        dequantize_panel(self, out, stride)
    }
}

impl PanelKernel for PanelQ8_0 {
    block_column_with_group_activations!();

    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[ActGroup]; RN],
    ) -> [[f32; PANEL]; RN] {
        tile_q8_0_panels(simd, panels, acts)
            .unwrap_or_else(|| acts.map(|row| tile_scalar_by(panels, row, PanelQ8_0::dot)))
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PanelQ8_0::dequantize_row(self, r, out);
    }
}

impl PanelKernel for PanelQ4_1 {
    block_column_with_group_activations!();

    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[ActGroup]; RN],
    ) -> [[f32; PANEL]; RN] {
        tile_panels(simd, panels, acts)
            .unwrap_or_else(|| acts.map(|row| tile_scalar_by(panels, row, PanelQ4_1::dot)))
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PanelQ4_1::dequantize_row(self, r, out);
    }
}

/// The items shared by the K-quant panel types: one super-block per column, Q8_K activations.
macro_rules! super_block_column_with_q8k_activations {
    () => {
        const COLUMN_WEIGHTS: usize = SUPER;
        const ACT_WEIGHTS: usize = SUPER;
        type Act = ActQ8K;

        fn quantize(x: &[f32], out: &mut Vec<ActQ8K>) {
            kquants::quantize_activations(x, out);
        }
    };
}

/// Scalar `Σ w·a` of one row of K-quant panels (one super-block per column) with one row of
/// activations.
pub(super) fn tile_scalar_super<P>(
    panels: &[P],
    acts: &[ActQ8K],
    dot: impl Fn(&P, &ActQ8K) -> [f32; PANEL],
) -> [f32; PANEL] {
    let mut out = [0f32; PANEL];
    for (panel, act) in panels.iter().zip(acts) {
        for (out, partial) in out.iter_mut().zip(dot(panel, act)) {
            *out += partial;
        }
    }
    out
}

impl PanelKernel for PanelQ4K {
    super_block_column_with_q8k_activations!();

    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[ActQ8K]; RN],
    ) -> [[f32; PANEL]; RN] {
        tile_q4k_panels(simd, panels, acts)
            .unwrap_or_else(|| acts.map(|row| tile_scalar_super(panels, row, PanelQ4K::dot)))
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PanelQ4K::dequantize_row(self, r, out);
    }
}

impl PanelKernel for PanelQ6K {
    super_block_column_with_q8k_activations!();

    fn tile<const RN: usize>(
        simd: Option<Simd>,
        panels: &[Self],
        acts: [&[ActQ8K]; RN],
    ) -> [[f32; PANEL]; RN] {
        tile_q6k_panels(simd, panels, acts)
            .unwrap_or_else(|| acts.map(|row| tile_scalar_super(panels, row, PanelQ6K::dot)))
    }

    fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        PanelQ6K::dequantize_row(self, r, out);
    }
}

/// The most activation rows one interleaved tile multiplies with a row of panels, the panels
/// unpacked once for all of them: with the AVX2 tiles a product of at most this many rows (a
/// decode step with up to seven drafted tokens) is one tile, since unpacking twice cost more
/// than the accumulators that spill (1.5B, 5 rows: 109 against 136 ms a pass); a product of more
/// goes in tiles of [`TILE`], which stay in registers (128 rows: 1456 against 1582 ms), and so
/// does every product with the VNNI tiles, whose unpacking is a smaller share (8 rows measured
/// no faster).
pub const PANEL_TILE: usize = 2 * TILE;

/// `out[i]` = the eight outputs of activation row `acts[i]`, for up to [`PANEL_TILE`] rows.
fn tile_into<P: PanelKernel>(
    simd: Option<Simd>,
    panels: &[P],
    acts: &[&[P::Act]],
    out: &mut [[f32; PANEL]; PANEL_TILE],
) {
    match *acts {
        [a] => out[..1].copy_from_slice(&P::tile(simd, panels, [a])),
        [a, b] => out[..2].copy_from_slice(&P::tile(simd, panels, [a, b])),
        [a, b, c] => out[..3].copy_from_slice(&P::tile(simd, panels, [a, b, c])),
        [a, b, c, d] => out[..4].copy_from_slice(&P::tile(simd, panels, [a, b, c, d])),
        [a, b, c, d, e] => out[..5].copy_from_slice(&P::tile(simd, panels, [a, b, c, d, e])),
        [a, b, c, d, e, f] => {
            out[..6].copy_from_slice(&P::tile(simd, panels, [a, b, c, d, e, f]));
        }
        [a, b, c, d, e, f, g] => {
            out[..7].copy_from_slice(&P::tile(simd, panels, [a, b, c, d, e, f, g]));
        }
        [a, b, c, d, e, f, g, h] => {
            out.copy_from_slice(&P::tile(simd, panels, [a, b, c, d, e, f, g, h]));
        }
        _ => {
            for (out, row) in out.iter_mut().zip(acts) {
                *out = P::tile(simd, panels, [*row])[0];
            }
        }
    }
}

/// `input`'s rows of `in_features` values quantized for `P`, by the pool's workers for a prefill's
/// many rows (on one core, a 7B model's MLP input waited on a single thread while the other spun).
fn quantize_rows<P: PanelKernel>(input: &[f32], in_features: usize) -> Vec<P::Act> {
    let mut acts = Vec::new();
    if input.len() < PARALLEL_QUANTIZE_VALUES || in_features == 0 {
        P::quantize(input, &mut acts);
        return acts;
    }
    let n_rows = input.len() / in_features;
    let parts = 4 * candle_core::utils::get_num_threads().max(1);
    let part_len = n_rows.div_ceil(parts).max(1) * in_features;
    let quantized: Vec<std::sync::Mutex<Vec<P::Act>>> = input
        .chunks(part_len)
        .map(|_| std::sync::Mutex::new(Vec::new()))
        .collect();
    candle_core::utils::barrier_pool().execute_chunked(quantized.len(), |range| {
        for part in range {
            let rows = &input[part * part_len..];
            // Each part's lock is taken once, by the one worker given that part.
            let mut out = quantized[part]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            P::quantize(&rows[..part_len.min(rows.len())], &mut out);
        }
    });
    acts.reserve(input.len() / P::ACT_WEIGHTS);
    for part in quantized {
        acts.append(
            &mut part
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
    }
    acts
}

/// `input` `(n_rows, in_features)` row-major times the transpose of the `(out_features,
/// in_features)` matrix `panels` → `(n_rows, out_features)` row-major.
pub fn multiply_interleaved<P: PanelKernel>(
    panels: &[P],
    (out_features, in_features): (usize, usize),
    input: &[f32],
    n_rows: usize,
) -> Vec<f32> {
    let acts = quantize_rows::<P>(input, in_features);
    let act_rows: Vec<&[P::Act]> = acts.chunks_exact(in_features / P::ACT_WEIGHTS).collect();
    let columns = in_features / P::COLUMN_WEIGHTS;
    let panel_rows = out_features / PANEL;
    let simd = Simd::best();
    let mut output = vec![0f32; n_rows * out_features];
    let shared = Output(output.as_mut_ptr());
    // Blocks of activation rows, so that the items a worker takes in turn read the same block
    // from its L2 instead of every row from L3; the weights are read once per block.
    let row_bytes = std::mem::size_of_val(act_rows.first().map_or(&[][..], |row| *row));
    let tile = match simd.map(Simd::level) {
        Some(Level::Avx2) if n_rows <= PANEL_TILE => PANEL_TILE,
        _ => TILE,
    };
    let block_rows = (ACT_BLOCK_BYTES / row_bytes.max(1))
        .max(1)
        .next_multiple_of(PANEL_TILE);
    for (block_idx, block) in act_rows.chunks(block_rows).enumerate() {
        let compute = |item: usize| {
            let first = item * PANELS_PER_ITEM;
            let last = (first + PANELS_PER_ITEM).min(panel_rows);
            let out = &shared;
            let mut results = [[0f32; PANEL]; PANEL_TILE];
            for (tile_idx, acts) in block.chunks(tile).enumerate() {
                for panel_row in first..last {
                    tile_into(
                        simd,
                        &panels[panel_row * columns..][..columns],
                        acts,
                        &mut results,
                    );
                    for (offset, values) in results[..acts.len()].iter().enumerate() {
                        let row = block_idx * block_rows + tile_idx * tile + offset;
                        let at = row * out_features + panel_row * PANEL;
                        // SAFETY: row < n_rows and panel_row * PANEL + PANEL <= out_features,
                        // so the eight values lie inside the output; this item is the only
                        // writer of its panel rows' columns (see `Output`).
                        unsafe {
                            std::ptr::copy_nonoverlapping(values.as_ptr(), out.0.add(at), PANEL)
                        };
                    }
                }
            }
        };
        candle_core::utils::barrier_pool()
            .execute_chunked(panel_rows.div_ceil(PANELS_PER_ITEM), |range| {
                range.for_each(compute)
            });
    }
    output
}
