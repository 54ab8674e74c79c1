//! `exp` over a row of attention scores, eight at a time: the softmax of a cached prompt's new
//! tokens over a long cache exponentiates millions of scores per layer, and libm's scalar
//! `expf` made the softmax a fifth of such a call. The AVX2 version splits `x = n ln2 + r`
//! with `|r| <= ln2 / 2`, evaluates a degree-6 Taylor polynomial of `e^r` (truncation error
//! below 1.3e-7 relative, about one ulp) and builds `2^n` from its exponent bits. The scalar
//! loop is the fallback on other CPUs and the reference the tests compare with.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Below this, `e^x` is under f32's smallest normal and taken as 0: next to the row's largest
/// score (whose term is 1) it cannot move the sum.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const UNDERFLOW: f32 = -87.0;

/// `row[k] = e^(row[k] - max)` in place (`-inf` entries become 0); returns the sum. `max` must
/// be at least every finite entry, so each term is at most 1.
pub fn exp_shifted_sum(row: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::cpu_features::avx2() {
        // SAFETY: `cpu_features::avx2` is true only where avx2 and fma were detected at run time.
        return unsafe { exp_shifted_sum_avx2(row, max) };
    }
    exp_shifted_sum_scalar(row, max)
}

pub fn exp_shifted_sum_scalar(row: &mut [f32], max: f32) -> f32 {
    let mut sum = 0f32;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_shifted_sum_avx2(row: &mut [f32], max: f32) -> f32 {
    let shift = _mm256_set1_ps(max);
    let mut sums = _mm256_setzero_ps();
    let mut chunks = row.chunks_exact_mut(8);
    for chunk in &mut chunks {
        // SAFETY: `chunk` is 8 f32, readable and writable; loadu/storeu need no alignment.
        unsafe {
            let x = _mm256_sub_ps(_mm256_loadu_ps(chunk.as_ptr()), shift);
            let e = exp8(x);
            _mm256_storeu_ps(chunk.as_mut_ptr(), e);
            sums = _mm256_add_ps(sums, e);
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` is 8 writable f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), sums) };
    lanes.iter().sum::<f32>() + exp_shifted_sum_scalar(chunks.into_remainder(), max)
}

/// `e^x` of eight values `x <= 0` (NaN-free; `-inf` and anything below [`UNDERFLOW`] give 0).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp8(x: __m256) -> __m256 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(UNDERFLOW));
    let x = _mm256_max_ps(x, _mm256_set1_ps(UNDERFLOW));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // r = x - n ln2 in two steps, so the rounding of n ln2 does not swamp r.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for coefficient in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(coefficient));
    }
    // 2^n for -126 <= n <= 0: n + 127 in the exponent field.
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(p, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libm_within_two_ulp_and_zeroes_minus_infinity() {
        let mut row: Vec<f32> = (0..1000).map(|i| -(i as f32) * 0.0931 + 3.0).collect();
        // 1008 entries: the tail of 8 goes through the SIMD loop too.
        row.extend([
            f32::NEG_INFINITY,
            -87.5,
            -200.0,
            3.0,
            2.999,
            -84.0,
            -85.0,
            1.0,
        ]);
        let max = 3.0;
        let shifted: Vec<f32> = row.iter().map(|x| x - max).collect();
        let mut reference = row.clone();
        let reference_sum = exp_shifted_sum_scalar(&mut reference, max);
        let sum = exp_shifted_sum(&mut row, max);
        for (k, (&ours, &libm)) in row.iter().zip(&reference).enumerate() {
            if shifted[k] < UNDERFLOW {
                assert!(ours < 2e-38 && libm < 2e-38, "entry {k}: {ours} for {libm}");
                continue;
            }
            let ulps = (ours.to_bits() as i64 - libm.to_bits() as i64).abs();
            assert!(ulps <= 2, "entry {k}: {ours} vs {libm} ({ulps} ulp)");
        }
        assert_eq!(row[1000], 0.0, "-inf must give exactly 0");
        assert!((sum - reference_sum).abs() <= 1e-6 * reference_sum);
    }
}
