//! AVX2 product of a row of interleaved Q4_K panels (eight output rows) with a few rows of Q8_K
//! activations. Per 64 weights of a row: eight vectors, each split into its low nibbles (sub-
//! block `2g`) and high nibbles (`2g + 1`), `maddubs` against activations broadcast four at a
//! time and summed in i16 over the eight (at most 8 · 2 · 15 · 127 < 2^15), then one `madd` with
//! the rows' sub-block scales into the exact i32 sum of the super-block, as the row-by-row
//! kernel keeps it. Per super-block and activation row: the mins through the activations'
//! sums per 32, one conversion and two fused adds. `PanelQ4K::dot` is the reference. The Q6_K
//! tile below works the same way on six-bit values rebuilt from a nibble and two top bits.
//!
//! Where the CPU has AVX-512 VNNI (`cpu_features::avx512_vnni`), the same tiles run with
//! `vpdpbusd` in place of `maddubs` + add: the sums of a sub-block are kept in i32 and scaled
//! with one `mullo`. The integer sums are the same, so the results are identical to the bit.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::interleaved_kquants::{PANEL, PanelQ4K};
use super::interleaved_q6k::PanelQ6K;
use super::kquants::ActQ8K;
use super::mac::Simd;
#[cfg(target_arch = "x86_64")]
use super::mac::{Dpbusd, Level, Mac, Maddubs};

/// `Σ w·a` of eight Q4_K rows with each of `RN` activation rows, or `None` without AVX2.
pub fn tile_q4k_panels<const RN: usize>(
    simd: Option<Simd>,
    panels: &[PanelQ4K],
    acts: [&[ActQ8K]; RN],
) -> Option<[[f32; PANEL]; RN]> {
    #[cfg(target_arch = "x86_64")]
    match simd.map(Simd::level) {
        // SAFETY: a `Simd` of a level exists only where the CPU was found to have it.
        Some(Level::Avx512Vnni) => return Some(unsafe { tile_q4k_panels_vnni(panels, acts) }),
        // SAFETY: as above.
        Some(Level::Avx2) => return Some(unsafe { tile_q4k_panels_avx2(panels, acts) }),
        None => {}
    }
    let _ = (simd, panels, acts);
    None
}

/// `Σ w·a` of eight Q6_K rows with each of `RN` activation rows, or `None` without AVX2.
pub fn tile_q6k_panels<const RN: usize>(
    simd: Option<Simd>,
    panels: &[PanelQ6K],
    acts: [&[ActQ8K]; RN],
) -> Option<[[f32; PANEL]; RN]> {
    #[cfg(target_arch = "x86_64")]
    match simd.map(Simd::level) {
        // SAFETY: a `Simd` of a level exists only where the CPU was found to have it.
        Some(Level::Avx512Vnni) => return Some(unsafe { tile_q6k_panels_vnni(panels, acts) }),
        // SAFETY: as above.
        Some(Level::Avx2) => return Some(unsafe { tile_q6k_panels_avx2(panels, acts) }),
        None => {}
    }
    let _ = (simd, panels, acts);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn broadcast4(qs: &[i8; 256], at: usize) -> __m256i {
    debug_assert!(at + 4 <= qs.len());
    // SAFETY: callers pass at = 64g + 4k (+ 32) with g < 4, k < 8, so at + 4 <= 256; the read
    // is unaligned-safe. Checked indexing here put four bounds checks in the innermost loop.
    _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(qs.as_ptr().add(at).cast::<i32>()) })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_bytes(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x8(bits: &[u16; PANEL]) -> __m256 {
    // SAFETY: `bits` is 16 readable bytes; loadu has no alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(bits.as_ptr().cast()) })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q4k_panels_avx2<const RN: usize>(
    panels: &[PanelQ4K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Maddubs` needs.
    unsafe { tile_q4k::<Maddubs, RN>(panels, acts) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q4k_panels_vnni<const RN: usize>(
    panels: &[PanelQ4K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Dpbusd` needs.
    unsafe { tile_q4k::<Dpbusd, RN>(panels, acts) }
}

/// The Q4_K tile, inlined into each of the functions above so that it is compiled with their
/// features.
///
/// # Safety
/// The CPU has avx2, fma, f16c and the features `M` needs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_q4k<M: Mac, const RN: usize>(
    panels: &[PanelQ4K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: the caller guarantees the features of every intrinsic and helper called here.
    unsafe {
        let acts = acts.map(|row| &row[..panels.len()]);
        let low = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); RN];
        for (column, panel) in panels.iter().enumerate() {
            let mut sums = [_mm256_setzero_si256(); RN];
            for (g, vectors) in panel.qs.iter().enumerate() {
                let mut lows = [_mm256_setzero_si256(); RN];
                let mut highs = [_mm256_setzero_si256(); RN];
                for (k, vector) in vectors.iter().enumerate() {
                    let packed = load_bytes(vector);
                    let (low_values, high_values) = (
                        _mm256_and_si256(packed, low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low),
                    );
                    for ((lows, highs), row) in lows.iter_mut().zip(&mut highs).zip(&acts) {
                        let qs = &row[column].qs;
                        let at = 64 * g + 4 * k;
                        *lows = M::step(*lows, low_values, broadcast4(qs, at));
                        *highs = M::step(*highs, high_values, broadcast4(qs, at + 32));
                    }
                }
                let (low_scales, high_scales) = (
                    M::row_scales(&panel.scales[2 * g]),
                    M::row_scales(&panel.scales[2 * g + 1]),
                );
                for ((sum, lows), highs) in sums.iter_mut().zip(lows).zip(highs) {
                    *sum = _mm256_add_epi32(
                        *sum,
                        _mm256_add_epi32(
                            M::scaled(lows, low_scales),
                            M::scaled(highs, high_scales),
                        ),
                    );
                }
            }
            let (d, dmin) = (f16x8(&panel.d), f16x8(&panel.dmin));
            let mut min_pairs = [_mm256_setzero_si256(); 4];
            for (t, pair) in min_pairs.iter_mut().enumerate() {
                *pair = scale_lanes(&panel.mins[2 * t], &panel.mins[2 * t + 1]);
            }
            for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
                let a = &row[column];
                let mut mins = _mm256_setzero_si256();
                for (t, pair) in min_pairs.iter().enumerate() {
                    let sums32 = [a.bsums32[2 * t], a.bsums32[2 * t + 1]];
                    let broadcast = _mm256_set1_epi32(
                        i32::from(sums32[0] as u16) | (i32::from(sums32[1] as u16) << 16),
                    );
                    mins = _mm256_add_epi32(mins, _mm256_madd_epi16(*pair, broadcast));
                }
                let scale = _mm256_set1_ps(a.d);
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, scale), *acc);
                *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, scale), *acc);
            }
        }
        // A loop, not a closure: a closure here would not have the caller's features.
        let mut out = [[0f32; PANEL]; RN];
        for (out, lanes) in out.iter_mut().zip(acc) {
            // `out` is 8 writable f32; storeu has no alignment requirement.
            _mm256_storeu_ps(out.as_mut_ptr(), lanes);
        }
        out
    }
}

/// Eight i8 values widened to i16, each twice: lanes `2r` and `2r + 1` hold `first[r]`, or,
/// with `second`, lane `2r` `first[r]` and lane `2r + 1` `second[r]`: what `madd` multiplies
/// by one or two of a row's sub-block sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_lanes(first: &[i8; PANEL], second: &[i8; PANEL]) -> __m256i {
    // SAFETY: each array is 8 readable bytes; loadl reads exactly 8 and needs no alignment.
    let (a, b) = unsafe {
        (
            _mm_loadl_epi64(first.as_ptr().cast()),
            _mm_loadl_epi64(second.as_ptr().cast()),
        )
    };
    _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b))
}

/// Per column: each pair of vectors `(g, 2m)`, `(g, 2m + 1)` shares one vector of top bits and
/// lies in one sub-block per nibble, so their `maddubs` sums (at most 2 · 2 · 63 · 127 < 2^15)
/// add in i16 before one `madd` with that sub-block's scales (with VNNI's i32 sums, both pairs
/// of a sub-block add up before one multiply); the offset of 32 is taken off
/// through the activations' sums per 16, paired as Q4_K's mins. `PanelQ6K::dot` is the
/// reference.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q6k_panels_avx2<const RN: usize>(
    panels: &[PanelQ6K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Maddubs` needs.
    unsafe { tile_q6k::<Maddubs, RN>(panels, acts) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q6k_panels_vnni<const RN: usize>(
    panels: &[PanelQ6K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Dpbusd` needs.
    unsafe { tile_q6k::<Dpbusd, RN>(panels, acts) }
}

/// The Q6_K tile, inlined as [`tile_q4k`].
///
/// # Safety
/// The CPU has avx2, fma, f16c and the features `M` needs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_q6k<M: Mac, const RN: usize>(
    panels: &[PanelQ6K],
    acts: [&[ActQ8K]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: the caller guarantees the features of every intrinsic and helper called here.
    unsafe {
        let acts = acts.map(|row| &row[..panels.len()]);
        let (nibble, two_bits, upper_two) = (
            _mm256_set1_epi8(0x0f),
            _mm256_set1_epi8(0x03),
            _mm256_set1_epi8(0x0c),
        );
        let mut acc = [_mm256_setzero_ps(); RN];
        for (column, panel) in panels.iter().enumerate() {
            let mut sums = [_mm256_setzero_si256(); RN];
            for (g, pairs) in panel.bits.iter().enumerate() {
                let mut lows = [_mm256_setzero_si256(); RN];
                let mut highs = [_mm256_setzero_si256(); RN];
                for (m, pair) in pairs.iter().enumerate() {
                    let top_bits = load_bytes(&pair[2]);
                    for (half, low_bits) in pair[..2].iter().enumerate() {
                        let k = 2 * m + half;
                        let packed = load_bytes(low_bits);
                        let top = if half == 0 {
                            top_bits
                        } else {
                            _mm256_srli_epi16::<4>(top_bits)
                        };
                        // Masked before each shift, so no bit crosses into the next byte.
                        let low_values = _mm256_or_si256(
                            _mm256_and_si256(packed, nibble),
                            _mm256_slli_epi16::<4>(_mm256_and_si256(top, two_bits)),
                        );
                        let high_values = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble),
                            _mm256_slli_epi16::<2>(_mm256_and_si256(top, upper_two)),
                        );
                        for ((lows, highs), row) in lows.iter_mut().zip(&mut highs).zip(&acts) {
                            let qs = &row[column].qs;
                            let at = 64 * g + 4 * k;
                            *lows = M::step(*lows, low_values, broadcast4(qs, at));
                            *highs = M::step(*highs, high_values, broadcast4(qs, at + 32));
                        }
                    }
                    // Both pairs of a sub-block (m = 2i, 2i + 1) share its scale: i32 sums take
                    // them together, i16 sums one pair at a time (two would pass 2^15).
                    if M::WIDE_SUMS && m % 2 == 0 {
                        continue;
                    }
                    let low_block = 4 * g + m / 2;
                    let (low_scales, high_scales) = (
                        M::row_scales(&panel.scales[low_block]),
                        M::row_scales(&panel.scales[low_block + 2]),
                    );
                    for ((sum, lows), highs) in sums.iter_mut().zip(&mut lows).zip(&mut highs) {
                        *sum = _mm256_add_epi32(
                            *sum,
                            _mm256_add_epi32(
                                M::scaled(*lows, low_scales),
                                M::scaled(*highs, high_scales),
                            ),
                        );
                        *lows = _mm256_setzero_si256();
                        *highs = _mm256_setzero_si256();
                    }
                }
            }
            let d = f16x8(&panel.d);
            for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
                let a = &row[column];
                let mut offsets = _mm256_setzero_si256();
                for t in 0..8 {
                    let pair = scale_lanes(&panel.scales[2 * t], &panel.scales[2 * t + 1]);
                    let broadcast = _mm256_set1_epi32(
                        i32::from(a.bsums16[2 * t] as u16)
                            | (i32::from(a.bsums16[2 * t + 1] as u16) << 16),
                    );
                    offsets = _mm256_add_epi32(offsets, _mm256_madd_epi16(pair, broadcast));
                }
                let exact = _mm256_sub_epi32(sum, _mm256_slli_epi32::<5>(offsets));
                *acc = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(exact),
                    _mm256_mul_ps(d, _mm256_set1_ps(a.d)),
                    *acc,
                );
            }
        }
        // A loop, not a closure: a closure here would not have the caller's features.
        let mut out = [[0f32; PANEL]; RN];
        for (out, lanes) in out.iter_mut().zip(acc) {
            // `out` is 8 writable f32; storeu has no alignment requirement.
            _mm256_storeu_ps(out.as_mut_ptr(), lanes);
        }
        out
    }
}
