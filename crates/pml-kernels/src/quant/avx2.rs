//! AVX2 products of one row of weight groups with a few rows of quantized activations. Per block, as in
//! GGML's x86 kernels, the bytes are multiplied pairwise (`maddubs`) and summed to eight i32;
//! per group of four blocks, horizontal adds fold the four blocks' sums into one vector that
//! one multiply scales and one fused add accumulates. Q5_0 multiplies its unsigned 5-bit
//! values and subtracts the activations' `offset` per group. The scalar versions in `blocks`
//! are the reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::blocks::{ActGroup, GroupQ4_1, GroupQ5_0, GroupQ8_0};

/// Whether this CPU runs the kernels below: true only where avx2, fma and f16c were detected at
/// run time (and `PML_NO_AVX2` does not turn them off).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn available() -> bool {
    crate::cpu_features::avx2()
}

/// `Σ w·a` of one weight row with each of `RN` activation rows, or `None` when the CPU lacks
/// the features. The weights of each group are loaded (and, for Q5_0, unpacked) once for all
/// `RN` rows: what makes a call of many rows cheaper per row than `RN` calls of one.
pub fn tile_q8_0<const RN: usize>(
    weights: &[GroupQ8_0],
    acts: [&[ActGroup]; RN],
) -> Option<[f32; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time just above.
        return Some(unsafe { tile_q8_0_avx2(weights, acts) });
    }
    let _ = (weights, acts);
    None
}

pub fn tile_q5_0<const RN: usize>(
    weights: &[GroupQ5_0],
    acts: [&[ActGroup]; RN],
) -> Option<[f32; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time just above.
        return Some(unsafe { tile_q5_0_avx2(weights, acts) });
    }
    let _ = (weights, acts);
    None
}

pub fn tile_q4_1<const RN: usize>(
    weights: &[GroupQ4_1],
    acts: [&[ActGroup]; RN],
) -> Option<[f32; RN]> {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time just above.
        return Some(unsafe { tile_q4_1_avx2(weights, acts) });
    }
    let _ = (weights, acts);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(x: __m256) -> f32 {
    hsum128(_mm_add_ps(
        _mm256_extractf128_ps::<1>(x),
        _mm256_castps256_ps128(x),
    ))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum128(x: __m128) -> f32 {
    let sum = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    _mm_cvtss_f32(sum)
}

/// The four f32 scales `d_w * d_a` of a group, and the f16 weight scales in f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales(d: &[u16; 4], acts: &ActGroup) -> (__m128, __m128) {
    // SAFETY: `d` is 8 readable bytes and `acts.d` 16; loadl/loadu need no alignment.
    let (weight, act) = unsafe {
        (
            _mm_cvtph_ps(_mm_loadl_epi64(d.as_ptr().cast())),
            _mm_loadu_ps(acts.d.as_ptr()),
        )
    };
    (_mm_mul_ps(weight, act), weight)
}

/// Eight i32 sums of the pairwise products of unsigned bytes `u` and signed bytes `s`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sum_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    // maddubs saturates pairs at i16: Q5_0 (u <= 31) never reaches it, Q8_0 only with -128,
    // which GGML's quantizers and ours (rounding to -127..=127) never write.
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Scales four blocks' i32 sums by `scale` (one f32 per block) and adds them to `acc`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn accumulate(sums: [__m256i; 4], scale: __m128, acc: __m256) -> __m256 {
    // hadd twice: lane k of each 128-bit half is block k's sum over that half.
    let folded = _mm256_hadd_epi32(
        _mm256_hadd_epi32(sums[0], sums[1]),
        _mm256_hadd_epi32(sums[2], sums[3]),
    );
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(folded),
        _mm256_set_m128(scale, scale),
        acc,
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_32(bytes: &[i8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q8_0_avx2<const RN: usize>(weights: &[GroupQ8_0], acts: [&[ActGroup]; RN]) -> [f32; RN] {
    let acts = acts.map(|row| &row[..weights.len()]);
    let mut acc = [_mm256_setzero_ps(); RN];
    for (g, w) in weights.iter().enumerate() {
        let quants: [__m256i; 4] = std::array::from_fn(|b| load_32(&w.qs[b]));
        // maddubs takes one unsigned operand: |w| here, w's sign moved onto the activations.
        let magnitudes = quants.map(|q| _mm256_sign_epi8(q, q));
        for (acc, row) in acc.iter_mut().zip(&acts) {
            let a = &row[g];
            let (scale, _) = scales(&w.d, a);
            let sums: [__m256i; 4] = std::array::from_fn(|b| {
                sum_u8_i8(
                    magnitudes[b],
                    _mm256_sign_epi8(load_32(&a.qs[b]), quants[b]),
                )
            });
            *acc = accumulate(sums, scale, *acc);
        }
    }
    acc.map(|sum| hsum(sum))
}

/// 16 bytes of packed nibbles as 32 unsigned bytes: low nibbles are weights 0..16, high
/// nibbles 16..32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: `qs` is 16 readable bytes; loadu has no alignment requirement.
    let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed),
        _mm256_set1_epi8(0x0f),
    )
}

/// Block `b` of a Q5_0 group as 32 unsigned bytes `q` (0..32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_values(group: &GroupQ5_0, b: usize) -> __m256i {
    _mm256_or_si256(
        nibbles(&group.qs[b]),
        fifth_bits(u32::from_le_bytes(group.qh[b])),
    )
}

/// Byte lane `j` is 0x10 where bit `j` of `bits` is set, 0 elsewhere: the fifth bits of 32
/// Q5_0 values in place.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn fifth_bits(bits: u32) -> __m256i {
    // Broadcast each byte of `bits` over 8 lanes, set every bit but the lane's own, compare
    // with all-ones.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let bit_set = _mm256_cmpeq_epi8(
        _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)),
        _mm256_set1_epi64x(-1),
    );
    _mm256_and_si256(bit_set, _mm256_set1_epi8(0x10))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q5_0_avx2<const RN: usize>(weights: &[GroupQ5_0], acts: [&[ActGroup]; RN]) -> [f32; RN] {
    let acts = acts.map(|row| &row[..weights.len()]);
    let mut acc = [_mm256_setzero_ps(); RN];
    let mut offsets = [_mm_setzero_ps(); RN];
    for (g, w) in weights.iter().enumerate() {
        let values: [__m256i; 4] = std::array::from_fn(|b| q5_0_values(w, b));
        for ((acc, offsets), row) in acc.iter_mut().zip(&mut offsets).zip(&acts) {
            let a = &row[g];
            let (scale, weight_scale) = scales(&w.d, a);
            // SAFETY: `a.offset` is 16 readable bytes; loadu needs no alignment.
            let offset = unsafe { _mm_loadu_ps(a.offset.as_ptr()) };
            *offsets = _mm_fmadd_ps(weight_scale, offset, *offsets);
            let sums: [__m256i; 4] =
                std::array::from_fn(|b| sum_u8_i8(values[b], load_32(&a.qs[b])));
            *acc = accumulate(sums, scale, *acc);
        }
    }
    std::array::from_fn(|n| hsum(acc[n]) - hsum128(offsets[n]))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q4_1_avx2<const RN: usize>(weights: &[GroupQ4_1], acts: [&[ActGroup]; RN]) -> [f32; RN] {
    let acts = acts.map(|row| &row[..weights.len()]);
    let mut acc = [_mm256_setzero_ps(); RN];
    let mut offsets = [_mm_setzero_ps(); RN];
    for (g, w) in weights.iter().enumerate() {
        let values: [__m256i; 4] = std::array::from_fn(|b| nibbles(&w.qs[b]));
        // SAFETY: `w.m` is 8 readable bytes; loadl needs no alignment.
        let mins = _mm_cvtph_ps(unsafe { _mm_loadl_epi64(w.m.as_ptr().cast()) });
        for ((acc, offsets), row) in acc.iter_mut().zip(&mut offsets).zip(&acts) {
            let a = &row[g];
            let (scale, _) = scales(&w.d, a);
            // SAFETY: `a.offset` is 16 readable bytes; loadu needs no alignment.
            let offset = unsafe { _mm_loadu_ps(a.offset.as_ptr()) };
            *offsets = _mm_fmadd_ps(mins, offset, *offsets);
            let sums: [__m256i; 4] =
                std::array::from_fn(|b| sum_u8_i8(values[b], load_32(&a.qs[b])));
            *acc = accumulate(sums, scale, *acc);
        }
    }
    // The activations' offsets are 16·d_a·Σq_a; the mins want d_a·Σq_a.
    std::array::from_fn(|n| hsum(acc[n]) + hsum128(offsets[n]) / 16.0)
}
