//! AVX2 product of a row of interleaved Q5_0 panels (eight output rows) with a few rows of
//! quantized activations. Per panel and half: two 32-byte loads unpack into four vectors of
//! unsigned 5-bit weights (four weights of each of the eight rows); per activation row, four
//! `maddubs` against activations broadcast four at a time, summed in i16 (at most 4 · 2 · 31
//! · 127 < 2^15), widened once by `madd`. Per panel and activation row, one conversion, one
//! fused add with the eight rows' scales times the block's, and one for the activations'
//! `offset` (turning the unsigned values back into `q - 16`). The scalar `tile_scalar` in
//! `interleaved` is the reference. Q4_1 panels take the same tile without fifth bits and with
//! their mins for the offset; Q8_0 panels (`interleaved_q8`) a tile of their own for signed
//! weights. Where the CPU has AVX-512 VNNI, the same tiles run with `vpdpbusd` (`mac`), with
//! identical results.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::avx2::{available, fifth_bits};
use super::blocks::ActGroup;
#[cfg(target_arch = "x86_64")]
use super::blocks::GROUP;
use super::interleaved::{PANEL, PanelQ5_0};
use super::interleaved_q4_1::PanelQ4_1;
use super::interleaved_q8::PanelQ8_0;
use super::mac::Simd;
#[cfg(target_arch = "x86_64")]
use super::mac::{Dpbusd, Level, Mac, Maddubs};

/// A panel of unsigned 4-bit values (`packed`, chunks 0..4 in the low nibbles, 4..8 in the high
/// ones), with fifth bits (Q5_0) or without (Q4_1), for [`tile_panels`].
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub trait NibblePanel {
    const FIFTH_BITS: bool;
    fn packed(&self) -> &[[u8; 32]; 4];
    /// Bit `4r + j` of chunk `chunk`'s fifth bits (unused without them).
    fn high(&self, chunk: usize) -> u32;
    /// f16 bits of the rows' scales.
    fn scales(&self) -> &[u16; PANEL];
    /// The f16 factors of the rows by which the activations' `offset` enters, and a multiplier:
    /// Q5_0's `- d` (its values are `q + 16`), Q4_1's `m / 16` (its mins).
    fn offset_factors(&self) -> (&[u16; PANEL], f32);
}

impl NibblePanel for PanelQ5_0 {
    const FIFTH_BITS: bool = true;
    fn packed(&self) -> &[[u8; 32]; 4] {
        &self.packed
    }
    fn high(&self, chunk: usize) -> u32 {
        self.high[chunk]
    }
    fn scales(&self) -> &[u16; PANEL] {
        &self.d
    }
    fn offset_factors(&self) -> (&[u16; PANEL], f32) {
        (&self.d, -1.0)
    }
}

impl NibblePanel for PanelQ4_1 {
    const FIFTH_BITS: bool = false;
    fn packed(&self) -> &[[u8; 32]; 4] {
        &self.packed
    }
    fn high(&self, _chunk: usize) -> u32 {
        0
    }
    fn scales(&self) -> &[u16; PANEL] {
        &self.d
    }
    fn offset_factors(&self) -> (&[u16; PANEL], f32) {
        (&self.m, 1.0 / 16.0)
    }
}

/// `Σ w·a` of eight weight rows with each of `RN` activation rows, or `None` without AVX2.
pub fn tile_panels<P: NibblePanel, const RN: usize>(
    simd: Option<Simd>,
    panels: &[P],
    acts: [&[ActGroup]; RN],
) -> Option<[[f32; PANEL]; RN]> {
    #[cfg(target_arch = "x86_64")]
    match simd.map(Simd::level) {
        // SAFETY: a `Simd` of a level exists only where the CPU was found to have it.
        Some(Level::Avx512Vnni) => return Some(unsafe { tile_panels_vnni(panels, acts) }),
        // SAFETY: as above.
        Some(Level::Avx2) => return Some(unsafe { tile_panels_avx2(panels, acts) }),
        None => {}
    }
    let _ = (simd, panels, acts);
    None
}

/// Four activations from `at` broadcast to every i32 lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn broadcast4(qs: &[i8; 32], at: usize) -> __m256i {
    let four: [i8; 4] = [qs[at], qs[at + 1], qs[at + 2], qs[at + 3]];
    _mm256_set1_epi32(i32::from_le_bytes(four.map(|q| q as u8)))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn load(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

/// Eight f16 values in f32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn widen(halves: &[u16; PANEL]) -> __m256 {
    // SAFETY: `halves` is 16 readable bytes; loadu has no alignment requirement.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(halves.as_ptr().cast()) })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_panels_avx2<P: NibblePanel, const RN: usize>(
    panels: &[P],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Maddubs` needs.
    unsafe { tile_nibbles::<P, Maddubs, RN>(panels, acts) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_panels_vnni<P: NibblePanel, const RN: usize>(
    panels: &[P],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Dpbusd` needs.
    unsafe { tile_nibbles::<P, Dpbusd, RN>(panels, acts) }
}

/// The Q5_0 / Q4_1 tile, inlined into each of the functions above so that it is compiled with
/// their features.
///
/// # Safety
/// The CPU has avx2, fma, f16c and the features `M` needs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_nibbles<P: NibblePanel, M: Mac, const RN: usize>(
    panels: &[P],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: the caller guarantees the features of every intrinsic and helper called here.
    unsafe {
        let acts = acts.map(|row| &row[..panels.len().div_ceil(GROUP)]);
        let low = _mm256_set1_epi8(0x0f);
        let mut acc = [_mm256_setzero_ps(); RN];
        for (column, panel) in panels.iter().enumerate() {
            let (group, b) = (column / GROUP, column % GROUP);
            let scales = widen(panel.scales());
            let (factors, multiplier) = panel.offset_factors();
            let offset_factors = _mm256_mul_ps(widen(factors), _mm256_set1_ps(multiplier));
            let packed = panel.packed();
            let mut sums = [_mm256_setzero_si256(); RN];
            for half in 0..2 {
                let (first, second) = (load(&packed[2 * half]), load(&packed[2 * half + 1]));
                // Chunks 2h, 2h + 1 (low nibbles) and 2h + 4, 2h + 5 (high nibbles). Loops,
                // not closures, here and below: a closure would not have the caller's features.
                let mut weights = [
                    (_mm256_and_si256(first, low), 2 * half),
                    (_mm256_and_si256(second, low), 2 * half + 1),
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(first), low),
                        2 * half + 4,
                    ),
                    (
                        _mm256_and_si256(_mm256_srli_epi16::<4>(second), low),
                        2 * half + 5,
                    ),
                ];
                for (values, chunk) in &mut weights {
                    if P::FIFTH_BITS {
                        *values = _mm256_or_si256(*values, fifth_bits(panel.high(*chunk)));
                    }
                    *chunk *= 4;
                }
                for (sum, row) in sums.iter_mut().zip(&acts) {
                    let qs = &row[group].qs[b];
                    let mut steps = [(_mm256_setzero_si256(), _mm256_setzero_si256()); 4];
                    for (step, &(values, at)) in steps.iter_mut().zip(&weights) {
                        *step = (values, broadcast4(qs, at));
                    }
                    *sum = M::add_steps(*sum, steps);
                }
            }
            for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
                let a = &row[group];
                let scale = _mm256_mul_ps(scales, _mm256_set1_ps(a.d[b]));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *acc);
                *acc = _mm256_fmadd_ps(offset_factors, _mm256_set1_ps(a.offset[b]), *acc);
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

/// [`tile_panels`] for Q8_0 panels, or `None` without AVX2. Per chunk of four weights of the
/// eight rows, per activation row: `maddubs` of the weights' magnitudes with the activations
/// carrying the weights' signs (GGML's trick for two signed operands; each i16 pair sum is at
/// most 2 · 128 · 127 < 2^15), widened by `madd`.
pub fn tile_q8_0_panels<const RN: usize>(
    simd: Option<Simd>,
    panels: &[PanelQ8_0],
    acts: [&[ActGroup]; RN],
) -> Option<[[f32; PANEL]; RN]> {
    #[cfg(target_arch = "x86_64")]
    match simd.map(Simd::level) {
        // SAFETY: a `Simd` of a level exists only where the CPU was found to have it.
        Some(Level::Avx512Vnni) => return Some(unsafe { tile_q8_0_panels_vnni(panels, acts) }),
        // SAFETY: as above.
        Some(Level::Avx2) => return Some(unsafe { tile_q8_0_panels_avx2(panels, acts) }),
        None => {}
    }
    let _ = (simd, panels, acts);
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_q8_0_panels_avx2<const RN: usize>(
    panels: &[PanelQ8_0],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Maddubs` needs.
    unsafe { tile_q8_0::<Maddubs, RN>(panels, acts) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn tile_q8_0_panels_vnni<const RN: usize>(
    panels: &[PanelQ8_0],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: this function's features are those `Dpbusd` needs.
    unsafe { tile_q8_0::<Dpbusd, RN>(panels, acts) }
}

/// The Q8_0 tile, inlined as [`tile_nibbles`].
///
/// # Safety
/// The CPU has avx2, fma, f16c and the features `M` needs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_q8_0<M: Mac, const RN: usize>(
    panels: &[PanelQ8_0],
    acts: [&[ActGroup]; RN],
) -> [[f32; PANEL]; RN] {
    // SAFETY: the caller guarantees the features of every intrinsic and helper called here.
    unsafe {
        let acts = acts.map(|row| &row[..panels.len().div_ceil(GROUP)]);
        let mut acc = [_mm256_setzero_ps(); RN];
        for (column, panel) in panels.iter().enumerate() {
            let (group, b) = (column / GROUP, column % GROUP);
            let scales = widen(&panel.d);
            let mut sums = [_mm256_setzero_si256(); RN];
            for (chunk, weights) in panel.qs.iter().enumerate() {
                // `weights` is 32 readable bytes; loadu has no alignment requirement.
                let weights = _mm256_loadu_si256(weights.as_ptr().cast());
                let magnitudes = _mm256_sign_epi8(weights, weights);
                for (sum, row) in sums.iter_mut().zip(&acts) {
                    let signed =
                        _mm256_sign_epi8(broadcast4(&row[group].qs[b], 4 * chunk), weights);
                    *sum = M::add_steps(*sum, [(magnitudes, signed)]);
                }
            }
            for ((acc, sum), row) in acc.iter_mut().zip(sums).zip(&acts) {
                let scale = _mm256_mul_ps(scales, _mm256_set1_ps(row[group].d[b]));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *acc);
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

/// Writes the eight rows × 32 weights of `panel` in f32 into `out`: row `r` at
/// `out[r * stride..][..32]`. `false` without AVX2 (nothing written).
pub fn dequantize_panel(panel: &PanelQ5_0, out: &mut [f32], stride: usize) -> bool {
    assert!(
        stride >= 32 && out.len() >= (PANEL - 1) * stride + 32,
        "eight rows of 32 weights at stride {stride} in {} values",
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: avx2, fma and f16c were detected at run time by `available`.
        unsafe { dequantize_panel_avx2(panel, out, stride) };
        return true;
    }
    let _ = (panel, stride);
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn dequantize_panel_avx2(panel: &PanelQ5_0, out: &mut [f32], stride: usize) {
    let scales = widen(&panel.d);
    // Rows 2p and 2p + 1 take lanes 0..4 and 4..8 of one conversion: their scales side by side.
    let pair_scales: [__m256; 4] = std::array::from_fn(|p| {
        let (first, second) = (2 * p as i32, 2 * p as i32 + 1);
        _mm256_permutevar8x32_ps(
            scales,
            _mm256_setr_epi32(first, first, first, first, second, second, second, second),
        )
    });
    let (low, sixteen) = (_mm256_set1_epi8(0x0f), _mm256_set1_ps(16.0));
    for chunk in 0..8 {
        let packed = load(&panel.packed[chunk % 4]);
        let nibbles = if chunk < 4 {
            _mm256_and_si256(packed, low)
        } else {
            _mm256_and_si256(_mm256_srli_epi16::<4>(packed), low)
        };
        let values = _mm256_or_si256(nibbles, fifth_bits(panel.high[chunk]));
        let halves = [
            _mm256_castsi256_si128(values),
            _mm256_extracti128_si256::<1>(values),
        ];
        for (p, pair_scale) in pair_scales.iter().enumerate() {
            let half = halves[p / 2];
            let eight = if p % 2 == 0 {
                half
            } else {
                _mm_srli_si128::<8>(half)
            };
            let weights = _mm256_mul_ps(
                _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight)), sixteen),
                *pair_scale,
            );
            let (first, second) = (2 * p * stride + 4 * chunk, (2 * p + 1) * stride + 4 * chunk);
            // SAFETY: first + 4 and second + 4 are at most 7 * stride + 32 <= out.len()
            // (asserted by `dequantize_panel`); storeu has no alignment requirement.
            unsafe {
                _mm_storeu_ps(out.as_mut_ptr().add(first), _mm256_castps256_ps128(weights));
                _mm_storeu_ps(
                    out.as_mut_ptr().add(second),
                    _mm256_extractf128_ps::<1>(weights),
                );
            }
        }
    }
}
