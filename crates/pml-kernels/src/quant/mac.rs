//! The multiply-accumulate step the quantized tiles are generic over: unsigned weight bytes
//! times signed activation bytes, four pairs to an i32 lane. AVX2 has it in two instructions
//! (`maddubs` into i16 pairs, summed in i16 and widened by `madd` per sub-block), AVX-512 VNNI
//! in one (`vpdpbusd`, summed in i32). Both give the same integer sums, so a tile's result does
//! not depend on which one ran. A tile body is an `#[inline(always)]` function generic over
//! [`Mac`], inlined into one `#[target_feature]` function per implementation so that each is
//! compiled with its own features.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::cpu_features;

/// A SIMD level of the panel tiles that this CPU runs. Only [`Simd::best`] and
/// [`Simd::available`] make one, after detecting it, so holding one is what makes calling its
/// tiles sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Simd(Level);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// AVX2, FMA and F16C: [`Maddubs`].
    Avx2,
    /// AVX2 and AVX-512 F/BW/VL/VNNI: [`Dpbusd`].
    Avx512Vnni,
}

impl Simd {
    /// The fastest level this CPU runs and the environment switches leave on; `None` where
    /// only the scalar code runs.
    pub fn best() -> Option<Simd> {
        // Called on every product: decided without building `available`'s list.
        if cpu_features::avx512_vnni() {
            Some(Simd(Level::Avx512Vnni))
        } else if cpu_features::avx2() {
            Some(Simd(Level::Avx2))
        } else {
            None
        }
    }

    /// Every level this CPU runs, slowest first: the tests compare them.
    #[cfg(test)]
    pub fn available() -> Vec<Simd> {
        let mut levels = Vec::new();
        if cpu_features::avx2() {
            levels.push(Simd(Level::Avx2));
            if cpu_features::avx512_vnni() {
                levels.push(Simd(Level::Avx512Vnni));
            }
        }
        levels
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn level(self) -> Level {
        self.0
    }
}

/// How a tile multiplies unsigned weight bytes by signed activation bytes, four pairs to each
/// row's lanes, and accumulates a sub-block: in i16 lanes with `maddubs` (AVX2; lanes `2r` and
/// `2r + 1` hold row `r`), or in i32 lanes with `vpdpbusd` (AVX-512 VNNI; lane `r`).
#[cfg(target_arch = "x86_64")]
pub trait Mac {
    /// `acc` plus the products of `weights` and `acts`.
    ///
    /// # Safety
    /// The CPU has the features of the tile that calls it (the caller's `target_feature`).
    unsafe fn step(acc: __m256i, weights: __m256i, acts: __m256i) -> __m256i;

    /// Whether `step`'s sums are i32 (any number of steps may add up before [`Mac::scaled`]);
    /// otherwise they are i16 and each caller bounds the steps it adds.
    const WIDE_SUMS: bool;

    /// The eight rows' scales (one i8 per row) as [`Mac::scaled`] multiplies by them.
    ///
    /// # Safety
    /// As [`Mac::step`].
    unsafe fn row_scales(scales: &[i8; 8]) -> __m256i;

    /// The eight rows' sums of `acc` times `scales` (from [`Mac::row_scales`]), as i32.
    ///
    /// # Safety
    /// As [`Mac::step`].
    unsafe fn scaled(acc: __m256i, scales: __m256i) -> __m256i;

    /// `sum` (i32, lane `r` for row `r`) plus the products of every pair of `steps`: at most
    /// four, whose i16 sums in [`Maddubs`] stay below 2^15 for weights up to 5 bits (4 · 2 · 31
    /// · 127), and for one step of 8-bit magnitudes (2 · 128 · 127).
    ///
    /// # Safety
    /// As [`Mac::step`].
    unsafe fn add_steps<const N: usize>(sum: __m256i, steps: [(__m256i, __m256i); N]) -> __m256i;
}

#[cfg(target_arch = "x86_64")]
pub struct Maddubs;

#[cfg(target_arch = "x86_64")]
impl Mac for Maddubs {
    const WIDE_SUMS: bool = false;

    #[inline(always)]
    unsafe fn step(acc: __m256i, weights: __m256i, acts: __m256i) -> __m256i {
        // SAFETY: only inlined into tiles compiled with avx2 (the trait's contract).
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(weights, acts)) }
    }

    /// Row `r`'s scale in i16 lanes `2r` and `2r + 1`, the pair `madd` multiplies.
    #[inline(always)]
    unsafe fn row_scales(scales: &[i8; 8]) -> __m256i {
        // SAFETY: as in `step`; `scales` is 8 readable bytes, which loadl reads exactly.
        unsafe {
            let bytes = _mm_loadl_epi64(scales.as_ptr().cast());
            _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(bytes, bytes))
        }
    }

    #[inline(always)]
    unsafe fn scaled(acc: __m256i, scales: __m256i) -> __m256i {
        // SAFETY: as in `step`.
        unsafe { _mm256_madd_epi16(acc, scales) }
    }

    #[inline(always)]
    unsafe fn add_steps<const N: usize>(sum: __m256i, steps: [(__m256i, __m256i); N]) -> __m256i {
        // SAFETY: as in `step`.
        unsafe {
            // A loop, not a closure: a closure would not have the caller's features.
            let mut pairs = _mm256_setzero_si256();
            for (weights, acts) in steps {
                pairs = Self::step(pairs, weights, acts);
            }
            _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub struct Dpbusd;

#[cfg(target_arch = "x86_64")]
impl Mac for Dpbusd {
    const WIDE_SUMS: bool = true;

    /// Row `r`'s scale in i32 lane `r`.
    #[inline(always)]
    unsafe fn row_scales(scales: &[i8; 8]) -> __m256i {
        // SAFETY: as in `step`; `scales` is 8 readable bytes, which loadl reads exactly.
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(scales.as_ptr().cast())) }
    }

    #[inline(always)]
    unsafe fn step(acc: __m256i, weights: __m256i, acts: __m256i) -> __m256i {
        // SAFETY: only inlined into tiles compiled with avx512vnni and avx512vl (the trait's
        // contract).
        unsafe { _mm256_dpbusd_epi32(acc, weights, acts) }
    }

    #[inline(always)]
    unsafe fn scaled(acc: __m256i, scales: __m256i) -> __m256i {
        // SAFETY: as in `step`.
        unsafe { _mm256_mullo_epi32(acc, scales) }
    }

    #[inline(always)]
    unsafe fn add_steps<const N: usize>(sum: __m256i, steps: [(__m256i, __m256i); N]) -> __m256i {
        // SAFETY: as in `step`.
        let mut sum = sum;
        for (weights, acts) in steps {
            // SAFETY: as in `step`.
            sum = unsafe { Self::step(sum, weights, acts) };
        }
        sum
    }
}
