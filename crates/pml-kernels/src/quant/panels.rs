//! Products of many rows (a prefill's hundreds of tokens) without a resident f32 copy of the
//! matrix: each worker dequantizes a panel of [`PANEL_ROWS`] output rows into its own scratch
//! buffer and multiplies every input row with it through the `gemm` crate's f32 kernels, writing
//! its columns of the output in place. Dequantizing costs one pass over the weights per call,
//! which hundreds of rows amortize; the f32 gemm then runs at the speed the resident copies
//! gave, on the same f32 weights (ours dequantize bit-exactly to candle's), for a panel's bytes
//! of memory per worker instead of four bytes per weight for the life of the model.

use std::cell::RefCell;

use gemm::Parallelism;

/// Output rows one worker dequantizes and multiplies at a time: a multiple of the gemm
/// micro-kernel's width, and few enough that the panels of a 896-row matrix still keep both
/// workers busy.
pub const PANEL_ROWS: usize = 64;

thread_local! {
    /// Each worker's panel, kept between calls so a prefill allocates it once per thread.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An output `(n_rows, out_features)` row-major, shared by the workers of one product, each
/// writing only the columns of its own output rows.
pub(super) struct Output(pub(super) *mut f32);

// SAFETY: every user hands each worker a disjoint set of columns of the buffer, which outlives
// `execute_chunked` (it returns only when every worker is done).
unsafe impl Sync for Output {}

/// `input` `(n_rows, in_features)` row-major times the transpose of an `(out_features,
/// in_features)` matrix → `(n_rows, out_features)` row-major. `dequantize(first, out)` writes
/// the matrix rows from `first` on into `out` (a whole number of rows, row-major); panels start
/// at multiples of [`PANEL_ROWS`].
pub fn multiply_by_panels(
    dequantize: impl Fn(usize, &mut [f32]) + Sync,
    (out_features, in_features): (usize, usize),
    input: &[f32],
    n_rows: usize,
) -> Vec<f32> {
    let mut output = vec![0f32; n_rows * out_features];
    let shared = Output(output.as_mut_ptr());
    let compute = |panel: usize| {
        let first = panel * PANEL_ROWS;
        let rows = PANEL_ROWS.min(out_features - first);
        PANEL.with_borrow_mut(|weights| {
            weights.resize(rows * in_features, 0.0);
            dequantize(first, weights);
            let dst = &shared;
            // SAFETY: dst (n_rows × rows at column `first`, row stride out_features), lhs
            // (n_rows × in_features, row-major) and rhs (in_features × rows, the panel's rows
            // as columns) lie inside their buffers: first + rows <= out_features, input is
            // n_rows * in_features long, the panel rows * in_features. This worker is the only
            // writer of these columns (see `Output`).
            unsafe {
                gemm::gemm(
                    n_rows,
                    rows,
                    in_features,
                    dst.0.add(first),
                    1,
                    out_features as isize,
                    false,
                    input.as_ptr(),
                    1,
                    in_features as isize,
                    weights.as_ptr(),
                    in_features as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    Parallelism::None,
                );
            }
        });
    };
    candle_core::utils::barrier_pool()
        .execute_chunked(out_features.div_ceil(PANEL_ROWS), |range| {
            range.for_each(compute)
        });
    output
}
