//! AVX2 product of a row of interleaved Q4_K panels (eight output rows) with a few rows of Q8_K
//! activations. Per 64 weights of a row: eight vectors, each split into its low nibbles (sub-
//! block `2g`) and high nibbles (`2g + 1`), `maddubs` against activations broadcast four at a
//! time and summed in i16 over the eight (at most 8 · 2 · 15 · 127 < 2^15), then one `madd` with
//! the rows' sub-block scales into the exact i32 sum of the super-block, as the row-by-row
//! kernel keeps it. Per super-block and activation row: the mins through the activations'
//! sums per 32, one conversion and two fused adds. `PanelQ4K::dot` is the reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::avx2::available;
use super::interleaved_kquants::{PANEL, PanelQ4K};
use super::kquants::ActQ8K;

/// `Σ w·a` of eight Q4_K rows with each of `RN` activation rows, or `None` without AVX2.
pub fn tile_q4k_panels<const RN: usize>(
    panels: &[PanelQ4K],
    acts: [&[ActQ8K]; RN],
) -> Option<[[f32; PANEL]; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time by `available`.
        return Some(unsafe { tile_q4k_panels_avx2(panels, acts) });
    }
    let _ = (panels, acts);
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
fn load_i16(values: &[i16; 16]) -> __m256i {
    // SAFETY: `values` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(values.as_ptr().cast()) }
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
                    *lows = _mm256_add_epi16(
                        *lows,
                        _mm256_maddubs_epi16(low_values, broadcast4(qs, at)),
                    );
                    *highs = _mm256_add_epi16(
                        *highs,
                        _mm256_maddubs_epi16(high_values, broadcast4(qs, at + 32)),
                    );
                }
            }
            let (low_scales, high_scales) = (
                load_i16(&panel.scales[2 * g]),
                load_i16(&panel.scales[2 * g + 1]),
            );
            for ((sum, lows), highs) in sums.iter_mut().zip(lows).zip(highs) {
                *sum = _mm256_add_epi32(
                    *sum,
                    _mm256_add_epi32(
                        _mm256_madd_epi16(lows, low_scales),
                        _mm256_madd_epi16(highs, high_scales),
                    ),
                );
            }
        }
        let (d, dmin) = (f16x8(&panel.d), f16x8(&panel.dmin));
        for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
            let a = &row[column];
            let mut mins = _mm256_setzero_si256();
            for (t, pair) in panel.mins.iter().enumerate() {
                let sums32 = [a.bsums32[2 * t], a.bsums32[2 * t + 1]];
                let broadcast = _mm256_set1_epi32(
                    i32::from(sums32[0] as u16) | (i32::from(sums32[1] as u16) << 16),
                );
                mins = _mm256_add_epi32(mins, _mm256_madd_epi16(load_i16(pair), broadcast));
            }
            let scale = _mm256_set1_ps(a.d);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, scale), *acc);
            *acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, scale), *acc);
        }
    }
    acc.map(|lanes| {
        let mut out = [0f32; PANEL];
        // SAFETY: `out` is 8 writable f32; storeu has no alignment requirement.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), lanes) };
        out
    })
}
