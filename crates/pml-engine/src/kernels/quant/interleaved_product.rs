//! Products of fewer than [`super::INTERLEAVED_PANEL_MIN_ROWS`] rows with an interleaved Q5_0 matrix:
//! the activations are quantized once; the pool's workers take items of
//! [`PANELS_PER_ITEM`] panel rows, walk the activation rows in tiles of [`TILE`], and write each
//! tile's eight outputs per panel straight into the row-major result.

use super::avx2_interleaved::tile_panels;
use super::blocks::{self, ActGroup, GROUP_WEIGHTS};
use super::interleaved::{PANEL, PanelQ5_0, tile_scalar};
use super::kernel::TILE;
use super::panels::Output;

/// Panel rows (of eight output rows) per work item: 32 output rows, as the row-by-row path.
const PANELS_PER_ITEM: usize = 4;

/// `out[i]` = `Σ w·a` of one panel row with activation row `acts[i]`, for up to [`TILE`] rows:
/// written into the caller's array, as this runs once per tile and panel row.
fn tile_into(panels: &[PanelQ5_0], acts: &[&[ActGroup]], out: &mut [[f32; PANEL]; TILE]) {
    fn one<const RN: usize>(panels: &[PanelQ5_0], acts: [&[ActGroup]; RN]) -> [[f32; PANEL]; RN] {
        tile_panels(panels, acts).unwrap_or_else(|| tile_scalar(panels, acts))
    }
    match *acts {
        [a] => out[..1].copy_from_slice(&one(panels, [a])),
        [a, b] => out[..2].copy_from_slice(&one(panels, [a, b])),
        [a, b, c] => out[..3].copy_from_slice(&one(panels, [a, b, c])),
        [a, b, c, d] => out.copy_from_slice(&one(panels, [a, b, c, d])),
        _ => {
            for (out, row) in out.iter_mut().zip(acts) {
                *out = one(panels, [*row])[0];
            }
        }
    }
}

/// `input` `(n_rows, in_features)` row-major times the transpose of the `(out_features,
/// in_features)` matrix `panels` → `(n_rows, out_features)` row-major.
pub fn multiply_interleaved(
    panels: &[PanelQ5_0],
    (out_features, in_features): (usize, usize),
    input: &[f32],
    n_rows: usize,
) -> Vec<f32> {
    let mut acts = Vec::new();
    blocks::quantize_activations(input, &mut acts);
    let act_rows: Vec<&[ActGroup]> = acts.chunks_exact(in_features / GROUP_WEIGHTS).collect();
    let columns = in_features / blocks::BLOCK;
    let panel_rows = out_features / PANEL;
    let mut output = vec![0f32; n_rows * out_features];
    let shared = Output(output.as_mut_ptr());
    let compute = |item: usize| {
        let first = item * PANELS_PER_ITEM;
        let last = (first + PANELS_PER_ITEM).min(panel_rows);
        let out = &shared;
        let mut results = [[0f32; PANEL]; TILE];
        for (tile_idx, acts) in act_rows.chunks(TILE).enumerate() {
            for panel_row in first..last {
                tile_into(
                    &panels[panel_row * columns..][..columns],
                    acts,
                    &mut results,
                );
                for (offset, values) in results[..acts.len()].iter().enumerate() {
                    let row = tile_idx * TILE + offset;
                    let at = row * out_features + panel_row * PANEL;
                    // SAFETY: row < n_rows and panel_row * PANEL + PANEL <= out_features, so
                    // the eight values lie inside the output; this item is the only writer of
                    // its panel rows' columns (see `Output`).
                    unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out.0.add(at), PANEL) };
                }
            }
        }
    };
    candle_core::utils::barrier_pool()
        .execute_chunked(panel_rows.div_ceil(PANELS_PER_ITEM), |range| {
            range.for_each(compute)
        });
    output
}
