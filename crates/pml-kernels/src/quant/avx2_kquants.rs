//! AVX2 products of one row of K-quant super-blocks with a few rows of Q8_K activations. The
//! unsigned 4- or 6-bit weights are multiplied with the signed activations pairwise
//! (`maddubs`), then by their sub-block scale as i16 (`madd`), and summed in i32 over the
//! whole super-block: one conversion and one fused add per super-block and activation row.
//! Q4_K's mins and Q6_K's offset of 32 are applied through the activations' block sums. The
//! scalar `dot`s in `kquants` are the reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::avx2::{available, hsum, load_32};
use super::kquants::{ActQ8K, BlockQ4K, BlockQ6K};

/// `Σ w·a` of one Q4_K row with each of `RN` activation rows, or `None` without AVX2.
pub fn tile_q4k<const RN: usize>(weights: &[BlockQ4K], acts: [&[ActQ8K]; RN]) -> Option<[f32; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time by `available`.
        return Some(unsafe { tile_q4k_avx2(weights, acts) });
    }
    let _ = (weights, acts);
    None
}

pub fn tile_q6k<const RN: usize>(weights: &[BlockQ6K], acts: [&[ActQ8K]; RN]) -> Option<[f32; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time by `available`.
        return Some(unsafe { tile_q6k_avx2(weights, acts) });
    }
    let _ = (weights, acts);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_32_u8(bytes: &[u8]) -> __m256i {
    assert!(bytes.len() >= 32);
    // SAFETY: at least 32 readable bytes (asserted); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn activations_32(acts: &ActQ8K, at: usize) -> __m256i {
    let chunk: &[i8; 32] = acts.qs[at..at + 32]
        .try_into()
        .expect("32 activations from a multiple of 32 below 256");
    load_32(chunk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q4k_avx2<const RN: usize>(weights: &[BlockQ4K], acts: [&[ActQ8K]; RN]) -> [f32; RN] {
    let acts = acts.map(|row| &row[..weights.len()]);
    let low_nibbles = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); RN];
    for (s, w) in weights.iter().enumerate() {
        let mut sums = [_mm256_setzero_si256(); RN];
        for chunk in 0..4 {
            let packed = load_32_u8(&w.qs[32 * chunk..]);
            let low = _mm256_and_si256(packed, low_nibbles);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low_nibbles);
            let low_scale = _mm256_set1_epi16(w.scales[2 * chunk]);
            let high_scale = _mm256_set1_epi16(w.scales[2 * chunk + 1]);
            for (sum, row) in sums.iter_mut().zip(&acts) {
                let a = &row[s];
                // Pairs of (<= 15) x (<= 127) fit i16; times a 6-bit scale, 8 sub-blocks fit i32.
                let low = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(low, activations_32(a, 64 * chunk)),
                    low_scale,
                );
                let high = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(high, activations_32(a, 64 * chunk + 32)),
                    high_scale,
                );
                *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(low, high));
            }
        }
        let (d, dmin) = (f16_to_f32(w.d), f16_to_f32(w.dmin));
        // SAFETY: `mins` and `bsums32` are 8 i16 each (16 readable bytes); loadu needs no alignment.
        let mins = unsafe { _mm_loadu_si128(w.mins.as_ptr().cast()) };
        for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
            let a = &row[s];
            // SAFETY: as above.
            let bsums = unsafe { _mm_loadu_si128(a.bsums32.as_ptr().cast()) };
            let min_sums = _mm256_zextsi128_si256(_mm_madd_epi16(mins, bsums));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * a.d), *acc);
            *acc = _mm256_fnmadd_ps(
                _mm256_cvtepi32_ps(min_sums),
                _mm256_set1_ps(dmin * a.d),
                *acc,
            );
        }
    }
    acc.map(|sum| hsum(sum))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q6k_avx2<const RN: usize>(weights: &[BlockQ6K], acts: [&[ActQ8K]; RN]) -> [f32; RN] {
    let acts = acts.map(|row| &row[..weights.len()]);
    let (low_nibbles, high_pair) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x30));
    let mut acc = [_mm256_setzero_ps(); RN];
    for (s, w) in weights.iter().enumerate() {
        let mut sums = [_mm256_setzero_si256(); RN];
        for half in 0..2 {
            let ql0 = load_32_u8(&w.ql[64 * half..]);
            let ql1 = load_32_u8(&w.ql[64 * half + 32..]);
            let qh = load_32_u8(&w.qh[32 * half..]);
            // The four runs of 32 values of this half (see `BlockQ6K::values`), 0..64 each.
            let values = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, low_nibbles),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), high_pair),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, low_nibbles),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), high_pair),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low_nibbles),
                    _mm256_and_si256(qh, high_pair),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low_nibbles),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), high_pair),
                ),
            ];
            for (run, values) in values.into_iter().enumerate() {
                // The run's first 16 values (i16 lanes 0..8 after maddubs) have one scale, the
                // next 16 (lanes 8..16) the next.
                let k = 8 * half + 2 * run;
                let scale = _mm256_set_m128i(
                    _mm_set1_epi16(i16::from(w.scales[k + 1])),
                    _mm_set1_epi16(i16::from(w.scales[k])),
                );
                for (sum, row) in sums.iter_mut().zip(&acts) {
                    let a = activations_32(&row[s], 128 * half + 32 * run);
                    // Pairs of (<= 63) x (<= 127) fit i16.
                    let product = _mm256_madd_epi16(_mm256_maddubs_epi16(values, a), scale);
                    *sum = _mm256_add_epi32(*sum, product);
                }
            }
        }
        let d = f16_to_f32(w.d);
        // SAFETY: `scales` is 16 readable bytes; loadu needs no alignment.
        let scales = _mm256_cvtepi8_epi16(unsafe { _mm_loadu_si128(w.scales.as_ptr().cast()) });
        for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
            let a = &row[s];
            // SAFETY: `bsums16` is 16 i16 (32 readable bytes); loadu needs no alignment.
            let bsums = unsafe { _mm256_loadu_si256(a.bsums16.as_ptr().cast()) };
            // The stored values are q + 32: subtract 32 * scale * (sum of each 16 activations).
            let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(scales, bsums));
            let sum = _mm256_sub_epi32(sum, offset);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * a.d), *acc);
        }
    }
    acc.map(|sum| hsum(sum))
}
