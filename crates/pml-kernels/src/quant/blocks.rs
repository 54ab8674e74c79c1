//! Block layouts our decode kernels read, the quantization of activations, and the portable
//! scalar dot products that are both the fallback on CPUs without AVX2 and the reference the
//! SIMD kernels are tested against.
//!
//! GGML stores Q8_0 and Q5_0 as 32-weight blocks, each with its own f16 scale. We regroup four
//! consecutive blocks of a row into one struct with the four scales, (Q5_0) the four fifth-bit
//! words and the four blocks of quants side by side: the same bytes, but a kernel converts four
//! scales with one instruction and scales four blocks' sums with one multiply.

use half::f16;

/// Weights per GGML block.
pub const BLOCK: usize = 32;
/// Blocks per group.
pub const GROUP: usize = 4;
/// Weights per group: rows must be a whole number of groups.
pub const GROUP_WEIGHTS: usize = BLOCK * GROUP;

/// Four Q8_0 blocks: weight `j` of block `b` is `d[b] * qs[b][j]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct GroupQ8_0 {
    /// f16 bits of the scales.
    pub d: [u16; GROUP],
    pub qs: [[i8; BLOCK]; GROUP],
}

/// Four Q5_0 blocks: weight `j` of block `b` is `d[b] * (q - 16)` with the 5-bit `q` made of
/// a nibble of `qs[b]` (low nibbles: weights 0..16, high nibbles: 16..32) and bit `j` of
/// `qh[b]` (little-endian) as fifth bit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct GroupQ5_0 {
    pub d: [u16; GROUP],
    pub qh: [[u8; 4]; GROUP],
    pub qs: [[u8; BLOCK / 2]; GROUP],
}

/// Four Q4_1 blocks: weight `j` of block `b` is `d[b] * q + m[b]` with the 4-bit `q` a nibble
/// of `qs[b]` (low nibbles: weights 0..16, high nibbles: 16..32).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct GroupQ4_1 {
    pub d: [u16; GROUP],
    /// f16 bits of the mins.
    pub m: [u16; GROUP],
    pub qs: [[u8; BLOCK / 2]; GROUP],
}

/// Four blocks of quantized activations: `d[b] * qs[b][j]`, with `offset[b] = 16 * d[b] *
/// Σ qs[b]`, which turns Q5_0's unsigned 5-bit values back into signed ones (`q - 16`) once
/// per block instead of once per weight, and adds Q4_1's mins (`m / 16` of it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActGroup {
    pub d: [f32; GROUP],
    pub offset: [f32; GROUP],
    pub qs: [[i8; BLOCK]; GROUP],
}

/// GGML bytes per block of each type.
pub const Q8_0_BYTES: usize = 34;
pub const Q5_0_BYTES: usize = 22;
pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;

/// GGML Q4_0 blocks (`d`, then 16 bytes: weight `j` in the low nibble of byte `j`, weight
/// `j + 16` in its high nibble, value `d * (q - 8)`) rewritten as Q5_0 blocks of the same values:
/// `q + 8` (8..=23) is a 5-bit `q5` with `d * (q5 - 16) = d * (q - 8)`.
pub fn q4_0_as_q5_0(q4_0: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q4_0.len() / Q4_0_BYTES * Q5_0_BYTES);
    for block in q4_0.chunks_exact(Q4_0_BYTES) {
        let mut q5 = [0u8; BLOCK];
        for (j, &byte) in block[2..].iter().enumerate() {
            q5[j] = (byte & 0x0f) + 8;
            q5[j + BLOCK / 2] = (byte >> 4) + 8;
        }
        let high_bits = q5
            .iter()
            .enumerate()
            .fold(0u32, |bits, (j, &q)| bits | (u32::from(q >> 4) << j));
        out.extend_from_slice(&block[..2]);
        out.extend_from_slice(&high_bits.to_le_bytes());
        for j in 0..BLOCK / 2 {
            out.push((q5[j] & 0x0f) | ((q5[j + BLOCK / 2] & 0x0f) << 4));
        }
    }
    out
}

fn f16_bits(bytes: &[u8]) -> u16 {
    u16::from_le_bytes([bytes[0], bytes[1]])
}

impl GroupQ8_0 {
    /// Parses `GROUP` consecutive GGML blocks (`GROUP * Q8_0_BYTES` bytes).
    pub fn parse(bytes: &[u8]) -> Self {
        let mut group = Self {
            d: [0; GROUP],
            qs: [[0; BLOCK]; GROUP],
        };
        for (b, block) in bytes.chunks_exact(Q8_0_BYTES).enumerate() {
            group.d[b] = f16_bits(block);
            for (q, &byte) in group.qs[b].iter_mut().zip(&block[2..]) {
                *q = byte as i8;
            }
        }
        group
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let d = f16::from_bits(self.d[b]).to_f32();
            for (value, &q) in out.iter_mut().zip(&self.qs[b]) {
                *value = d * f32::from(q);
            }
        }
    }

    pub fn dot(&self, acts: &ActGroup) -> f32 {
        (0..GROUP)
            .map(|b| {
                f16::from_bits(self.d[b]).to_f32() * acts.d[b] * int_dot(&self.qs[b], &acts.qs[b])
            })
            .sum()
    }
}

impl GroupQ5_0 {
    pub fn parse(bytes: &[u8]) -> Self {
        let mut group = Self {
            d: [0; GROUP],
            qh: [[0; 4]; GROUP],
            qs: [[0; BLOCK / 2]; GROUP],
        };
        for (b, block) in bytes.chunks_exact(Q5_0_BYTES).enumerate() {
            group.d[b] = f16_bits(block);
            group.qh[b].copy_from_slice(&block[2..6]);
            group.qs[b].copy_from_slice(&block[6..]);
        }
        group
    }

    /// The 32 signed values `q - 16` of block `b`.
    fn values(&self, b: usize) -> [i8; BLOCK] {
        let high_bits = u32::from_le_bytes(self.qh[b]);
        let high = |j: usize| (((high_bits >> j) & 1) << 4) as u8;
        let mut values = [0i8; BLOCK];
        for (j, &byte) in self.qs[b].iter().enumerate() {
            values[j] = ((byte & 0x0f) | high(j)) as i8 - 16;
            values[j + BLOCK / 2] = ((byte >> 4) | high(j + BLOCK / 2)) as i8 - 16;
        }
        values
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let d = f16::from_bits(self.d[b]).to_f32();
            for (value, q) in out.iter_mut().zip(self.values(b)) {
                *value = d * f32::from(q);
            }
        }
    }

    pub fn dot(&self, acts: &ActGroup) -> f32 {
        (0..GROUP)
            .map(|b| {
                f16::from_bits(self.d[b]).to_f32()
                    * acts.d[b]
                    * int_dot(&self.values(b), &acts.qs[b])
            })
            .sum()
    }
}

impl GroupQ4_1 {
    pub fn parse(bytes: &[u8]) -> Self {
        let mut group = Self {
            d: [0; GROUP],
            m: [0; GROUP],
            qs: [[0; BLOCK / 2]; GROUP],
        };
        for (b, block) in bytes.chunks_exact(Q4_1_BYTES).enumerate() {
            group.d[b] = f16_bits(block);
            group.m[b] = f16_bits(&block[2..]);
            group.qs[b].copy_from_slice(&block[4..]);
        }
        group
    }

    /// The 32 unsigned values `q` of block `b`.
    fn values(&self, b: usize) -> [i8; BLOCK] {
        let mut values = [0i8; BLOCK];
        for (j, &byte) in self.qs[b].iter().enumerate() {
            values[j] = (byte & 0x0f) as i8;
            values[j + BLOCK / 2] = (byte >> 4) as i8;
        }
        values
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let d = f16::from_bits(self.d[b]).to_f32();
            let m = f16::from_bits(self.m[b]).to_f32();
            for (value, q) in out.iter_mut().zip(self.values(b)) {
                *value = d * f32::from(q) + m;
            }
        }
    }

    /// `Σ (d·q + m)·a = d·d_a·Σ q·q_a + m·d_a·Σ q_a`, the last sum being the activations'
    /// `offset / 16`.
    pub fn dot(&self, acts: &ActGroup) -> f32 {
        (0..GROUP)
            .map(|b| {
                f16::from_bits(self.d[b]).to_f32()
                    * acts.d[b]
                    * int_dot(&self.values(b), &acts.qs[b])
                    + f16::from_bits(self.m[b]).to_f32() * acts.offset[b] / 16.0
            })
            .sum()
    }
}

pub(super) fn int_dot(a: &[i8; BLOCK], b: &[i8; BLOCK]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&a, &b)| i32::from(a) * i32::from(b))
        .sum::<i32>() as f32
}

/// Quantizes `block` into `out` (the same length) scaled so its largest magnitude maps to 127,
/// rounding to nearest even as GGML's AVX2 `quantize_row_q8_0` does; returns the scale. Written
/// so it vectorizes: eight running maxima, and a rounding by arithmetic ([`round_small`];
/// `round()` was a libm call per value, which made quantizing a cached prompt's new rows a tenth
/// of its matrix products).
pub(super) fn quantize_block(block: &[f32], out: &mut [i8]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = block.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(v.abs());
        }
    }
    let amax = chunks
        .remainder()
        .iter()
        .chain(&lanes)
        .fold(0f32, |max, &v| max.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in out.iter_mut().zip(block) {
        *q = round_small(v * inverse) as i8;
    }
    d
}

/// `x` (|x| ≤ 127) rounded to the nearest integer, ties to even: adding 1.5·2²³ leaves no bits
/// below the units, so the sum is rounded by the FPU's own rounding (to nearest even), and
/// subtracting it back is exact. Plain arithmetic, so the loop vectorizes on any x86-64, where
/// `round_ties_even` is a libm call per value without SSE4.1.
#[inline(always)]
fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// Quantizes `x` (whole groups long) into `out`, each block of 32 scaled so its largest
/// magnitude maps to 127, as GGML's `quantize_row_q8_0` does.
pub fn quantize_activations(x: &[f32], out: &mut Vec<ActGroup>) {
    out.clear();
    out.extend(x.chunks_exact(GROUP_WEIGHTS).map(|group| {
        let mut acts = ActGroup {
            d: [0.0; GROUP],
            offset: [0.0; GROUP],
            qs: [[0; BLOCK]; GROUP],
        };
        for (b, block) in group.chunks_exact(BLOCK).enumerate() {
            let d = quantize_block(block, &mut acts.qs[b]);
            let sum: i32 = acts.qs[b].iter().map(|&q| i32::from(q)).sum();
            acts.d[b] = d;
            acts.offset[b] = 16.0 * d * sum as f32;
        }
        acts
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_round_to_nearest_even() {
        // Quarter steps hit every tie; the odd fractions the values in between.
        let values = (-1016..=1016)
            .map(|i| i as f32 * 0.125)
            .chain((0..1000).map(|i| (i as f32 * 0.731).sin() * 127.0));
        for x in values {
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn a_block_maps_its_largest_magnitude_to_127() {
        let block: Vec<f32> = (0..32).map(|i| (i as f32 - 20.0) * 0.5).collect();
        let mut out = [0i8; 32];
        let d = quantize_block(&block, &mut out);
        assert_eq!(d, 10.0 / 127.0);
        assert_eq!(out[0], -127);
        for (&q, &x) in out.iter().zip(&block) {
            assert!((f32::from(q) * d - x).abs() <= d / 2.0 + 1e-6, "{x} → {q}");
        }
    }
}
