//! The tile kernels in AVX2 and FMA: `ROWS` query rows (up to six) against sixteen keys or
//! sixteen value lanes at a time, every accumulator in a register (at six rows, twelve of the
//! sixteen), each loaded key or value vector serving every row of the tile.

use std::arch::x86_64::*;

use super::{HEADER, PANEL};

/// `scores[r * width + j] = queries[r * d..][..d] · key j`, for `ROWS` rows, from the keys'
/// panels (`panels[(j / PANEL) * d * PANEL + t * PANEL + j % PANEL]` is key `j`'s element `t`);
/// `width = scores.len() / ROWS`.
///
/// # Safety
/// The CPU must have AVX2 and FMA. (The slices' lengths are checked here.)
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn score_rows<const ROWS: usize>(
    queries: &[f32],
    panels: &[f32],
    d: usize,
    scores: &mut [f32],
) {
    let width = scores.len() / ROWS;
    assert!(
        queries.len() == ROWS * d
            && scores.len() == ROWS * width
            && width.is_multiple_of(PANEL)
            && panels.len() >= width * d,
        "score tile: {} query values, {} panel values, {} scores for {ROWS} rows of {d}",
        queries.len(),
        panels.len(),
        scores.len()
    );
    let q = queries.as_ptr();
    for p in 0..width / PANEL {
        // SAFETY: panel `p` is `d * PANEL` values within `panels` (checked above).
        let panel = unsafe { panels.as_ptr().add(p * d * PANEL) };
        let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
        for t in 0..d {
            // SAFETY: `t * PANEL + 16 <= d * PANEL` within the panel; `r * d + t < ROWS * d`,
            // the length of `queries`.
            unsafe {
                let k0 = _mm256_loadu_ps(panel.add(t * PANEL));
                let k1 = _mm256_loadu_ps(panel.add(t * PANEL + 8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let q = _mm256_broadcast_ss(&*q.add(r * d + t));
                    acc[0] = _mm256_fmadd_ps(q, k0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(q, k1, acc[1]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let at = r * width + p * PANEL;
            // SAFETY: `at + 16 <= r * width + width <= scores.len()`.
            unsafe {
                _mm256_storeu_ps(scores.as_mut_ptr().add(at), acc[0]);
                _mm256_storeu_ps(scores.as_mut_ptr().add(at + 8), acc[1]);
            }
        }
    }
}

/// For each of `ROWS` rows: `out[r * (d + HEADER) + HEADER..][..d] = Σ_{j < n} weights[r * width
/// + j] · values[base + j * v_stride..][..d]`.
///
/// # Safety
/// The CPU must have AVX2 and FMA. (The lengths and `d % 8 == 0` are checked here.)
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weigh_rows<const ROWS: usize>(
    (weights, width, n): (&[f32], usize, usize),
    (values, base, v_stride): (&[f32], usize, usize),
    d: usize,
    out: &mut [f32],
) {
    let stride = d + HEADER;
    assert!(
        d.is_multiple_of(8)
            && n <= width
            && weights.len() >= ROWS * width
            && (n == 0 || base + (n - 1) * v_stride + d <= values.len())
            && out.len() >= ROWS * stride,
        "weight tile: {} weights of {ROWS} rows × {width} for {n} keys, {} values from {base} \
         by {v_stride}, {} outputs of {d}",
        weights.len(),
        values.len(),
        out.len()
    );
    let mut at = 0;
    // Both loops keep `at + 8 * W <= d`, the contract of `lanes`, whose other bounds were
    // checked above.
    while at + 16 <= d {
        // SAFETY: `at + 16 <= d` (W = 2).
        unsafe {
            lanes::<ROWS, 2>(
                (weights, width, n),
                (values, base, v_stride),
                at,
                out,
                stride,
            )
        };
        at += 16;
    }
    while at + 8 <= d {
        // SAFETY: `at + 8 <= d` (W = 1).
        unsafe {
            lanes::<ROWS, 1>(
                (weights, width, n),
                (values, base, v_stride),
                at,
                out,
                stride,
            )
        };
        at += 8;
    }
}

/// Lanes `at..at + 8 * W` of [`weigh_rows`].
///
/// # Safety
/// The CPU must have AVX2 and FMA; `at + 8 * W <= d` and [`weigh_rows`]' checks hold.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn lanes<const ROWS: usize, const W: usize>(
    (weights, width, n): (&[f32], usize, usize),
    (values, base, v_stride): (&[f32], usize, usize),
    at: usize,
    out: &mut [f32],
    stride: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); W]; ROWS];
    let w = weights.as_ptr();
    for j in 0..n {
        // SAFETY: `base + j * v_stride + at + 8 * W <= base + (n - 1) * v_stride + d`, within
        // `values`; `r * width + j < ROWS * width`, within `weights`.
        unsafe {
            let row = values.as_ptr().add(base + j * v_stride + at);
            let mut v = [_mm256_setzero_ps(); W];
            for (lane, v) in v.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(row.add(8 * lane));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let weight = _mm256_broadcast_ss(&*w.add(r * width + j));
                for (acc, v) in acc.iter_mut().zip(&v) {
                    *acc = _mm256_fmadd_ps(weight, *v, *acc);
                }
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        for (lane, acc) in acc.iter().enumerate() {
            // SAFETY: `r * stride + HEADER + at + 8 * W <= ROWS * stride <= out.len()`.
            unsafe {
                _mm256_storeu_ps(
                    out.as_mut_ptr().add(r * stride + HEADER + at + 8 * lane),
                    *acc,
                )
            };
        }
    }
}
