//! The item kernel in AVX2 and FMA, for f32 and f16 caches and head sizes that are a multiple
//! of 8: scores four keys at a time (four independent accumulators, one horizontal reduction
//! for the four), outputs up to 64 lanes of one head at a time in registers. An f16 cache is
//! widened by F16C as it is read, so a decode step moves half the bytes of an f32 one.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

use super::ItemShape;
use super::KvRows;

/// Rows this kernel reads: f32, or f16 widened by F16C (bf16 rows go to the portable kernel).
#[derive(Clone, Copy)]
pub(super) enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> Rows<'a> {
    fn of(rows: KvRows<'a>) -> Option<Self> {
        match rows {
            KvRows::F32(rows) => Some(Rows::F32(rows)),
            KvRows::F16(rows) => Some(Rows::F16(rows)),
            KvRows::Bf16(_) => None,
        }
    }
}

/// The keys and values [`attend_item`] takes, where it takes these (a head size that is a
/// multiple of 8, f32 or f16 rows).
pub(super) fn handles<'a>(
    shape: &ItemShape,
    keys: KvRows<'a>,
    values: KvRows<'a>,
) -> Option<(Rows<'a>, Rows<'a>)> {
    if !shape.head_dim.is_multiple_of(8) {
        return None;
    }
    Some((Rows::of(keys)?, Rows::of(values)?))
}

/// Eight cache elements widened to f32.
trait Load8: Copy {
    /// # Safety
    /// `row[at..at + 8]` must be in bounds, and the CPU must have AVX2 and F16C.
    unsafe fn load8(row: &[Self], at: usize) -> __m256;
}

impl Load8 for f32 {
    #[inline(always)]
    unsafe fn load8(row: &[f32], at: usize) -> __m256 {
        debug_assert!(at + 8 <= row.len());
        // SAFETY: the caller keeps `at + 8` within `row`; loadu needs no alignment.
        unsafe { _mm256_loadu_ps(row.as_ptr().add(at)) }
    }
}

impl Load8 for f16 {
    #[inline(always)]
    unsafe fn load8(row: &[f16], at: usize) -> __m256 {
        debug_assert!(at + 8 <= row.len());
        // SAFETY: the caller keeps `at + 8` within `row` (16 bytes); loadu needs no alignment,
        // and the caller's CPU has F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(at).cast())) }
    }
}

/// One item (see [`ItemShape`] for `out`).
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C, and the rows must be those [`handles`] gave for `shape`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_item(
    shape: &ItemShape,
    queries: &[f32],
    (keys, values): (Rows, Rows),
    visible: &[u32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let n = visible.len();
    scores.clear();
    scores.resize(shape.group * n, 0.0);
    // SAFETY: the caller's CPU has the features, `handles` checked the head size, and every row
    // is cut from its slice by `ItemShape::row` (bounds-checked).
    unsafe {
        match keys {
            Rows::F32(k) => fill_scores(shape, queries, k, visible, scores),
            Rows::F16(k) => fill_scores(shape, queries, k, visible, scores),
        }
    }
    shape.softmax_numerators(scores, n, out);
    // SAFETY: as for the scores: the features, the head size, rows cut by `ItemShape::row`.
    unsafe {
        match values {
            Rows::F32(v) => accumulate(shape, v, visible, scores, out),
            Rows::F16(v) => accumulate(shape, v, visible, scores, out),
        }
    }
}

/// `scores[h * n + j] = q_h · k_{visible[j]}`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_scores<T: Load8>(
    shape: &ItemShape,
    queries: &[f32],
    keys: &[T],
    visible: &[u32],
    scores: &mut [f32],
) {
    let (n, d) = (visible.len(), shape.head_dim);
    let queries = &queries[..shape.group * d];
    let mut blocks = visible.chunks_exact(4);
    let mut j = 0;
    for block in &mut blocks {
        let rows = [
            shape.row(keys, block[0]),
            shape.row(keys, block[1]),
            shape.row(keys, block[2]),
            shape.row(keys, block[3]),
        ];
        for (h, query) in queries.chunks_exact(d).enumerate() {
            let mut acc = [_mm256_setzero_ps(); 4];
            for at in (0..d).step_by(8) {
                // SAFETY: `at + 8 <= d`, the length of `query` and of each row (d % 8 == 0).
                unsafe {
                    let q = _mm256_loadu_ps(query.as_ptr().add(at));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        *acc = _mm256_fmadd_ps(q, T::load8(row, at), *acc);
                    }
                }
            }
            let sums = sum_each(acc);
            // SAFETY: `h * n + j + 4 <= group * n`, the length of `scores`.
            unsafe { _mm_storeu_ps(scores[h * n + j..][..4].as_mut_ptr(), sums) };
        }
        j += 4;
    }
    for &key in blocks.remainder() {
        let row = shape.row(keys, key);
        for (h, query) in queries.chunks_exact(d).enumerate() {
            let mut acc = _mm256_setzero_ps();
            for at in (0..d).step_by(8) {
                // SAFETY: `at + 8 <= d`, the length of `query` and of `row`.
                unsafe {
                    let q = _mm256_loadu_ps(query.as_ptr().add(at));
                    acc = _mm256_fmadd_ps(q, T::load8(row, at), acc);
                }
            }
            scores[h * n + j] = lane_sum(acc);
        }
        j += 1;
    }
}

/// The lane sums of four vectors, in order.
#[inline(always)]
fn sum_each(acc: [__m256; 4]) -> __m128 {
    // SAFETY: plain register arithmetic; the enclosing function enables AVX.
    unsafe {
        let pairs = _mm256_hadd_ps(
            _mm256_hadd_ps(acc[0], acc[1]),
            _mm256_hadd_ps(acc[2], acc[3]),
        );
        _mm_add_ps(
            _mm256_castps256_ps128(pairs),
            _mm256_extractf128_ps::<1>(pairs),
        )
    }
}

#[inline(always)]
fn lane_sum(acc: __m256) -> f32 {
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 writable f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.iter().sum()
}

/// Each head's `Σ_j weights[h * n + j] · v_{visible[j]}` into its output lanes, 64, then 32,
/// then 8 lanes at a time, the accumulators in registers across all of the item's keys.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate<T: Load8>(
    shape: &ItemShape,
    values: &[T],
    visible: &[u32],
    weights: &[f32],
    out: &mut [f32],
) {
    let (n, d) = (visible.len(), shape.head_dim);
    for (h, head_out) in out.chunks_exact_mut(shape.item_stride()).enumerate() {
        let head_out = &mut head_out[2..];
        let weights = &weights[h * n..][..n];
        let mut at = 0;
        // Each loop's blocks end within `d`, the length of `head_out` and of every row.
        while at + 64 <= d {
            // SAFETY: `at + 64 <= d` (eight blocks of eight lanes).
            unsafe { accumulate_lanes::<8, T>(shape, values, visible, weights, at, head_out) };
            at += 64;
        }
        while at + 32 <= d {
            // SAFETY: `at + 32 <= d` (four blocks of eight lanes).
            unsafe { accumulate_lanes::<4, T>(shape, values, visible, weights, at, head_out) };
            at += 32;
        }
        while at + 8 <= d {
            // SAFETY: `at + 8 <= d` (one block of eight lanes).
            unsafe { accumulate_lanes::<1, T>(shape, values, visible, weights, at, head_out) };
            at += 8;
        }
    }
}

/// Lanes `at..at + 8 * W` of one head.
///
/// # Safety
/// `at + 8 * W` must be at most the head size; the CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn accumulate_lanes<const W: usize, T: Load8>(
    shape: &ItemShape,
    values: &[T],
    visible: &[u32],
    weights: &[f32],
    at: usize,
    head_out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); W];
    for (&key, &weight) in visible.iter().zip(weights) {
        let row = shape.row(values, key);
        let weight = _mm256_set1_ps(weight);
        for (lane, acc) in acc.iter_mut().enumerate() {
            // SAFETY: `at + 8 * W <= d = row.len()` (the caller's contract).
            *acc = _mm256_fmadd_ps(weight, unsafe { T::load8(row, at + 8 * lane) }, *acc);
        }
    }
    let head_out = &mut head_out[at..at + 8 * W];
    for (lane, acc) in acc.iter().enumerate() {
        // SAFETY: `head_out` holds `8 * W` f32 from `at`.
        unsafe { _mm256_storeu_ps(head_out.as_mut_ptr().add(8 * lane), *acc) };
    }
}
