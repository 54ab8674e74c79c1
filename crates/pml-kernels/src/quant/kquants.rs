//! GGML's K-quant super-blocks the models' larger matrices use (Q4_K and Q6_K: the MLP's down
//! projection, whose rows are whole super-blocks of 256), the 8-bit activations they are
//! multiplied with (Q8_K: one scale per 256 values plus sums per 16 and per 32 values), and the
//! scalar dot products that are the fallback and the reference of the AVX2 kernels.
//!
//! Q4_K's twelve bytes of packed 6-bit scales and mins are unpacked to `i16` at load: 20 more
//! bytes per 256 weights, so no kernel call unpacks them again, and the SIMD code broadcasts
//! and multiplies them as they are.

use half::f16;

use super::blocks::quantize_block;

/// Weights per super-block.
pub const SUPER: usize = 256;
pub const Q4K_BYTES: usize = 144;
pub const Q6K_BYTES: usize = 210;

/// Q4_K: weight `j` of sub-block `s` (32 weights) is `d * scales[s] * q - dmin * mins[s]` with
/// the 4-bit `q` the low nibble of `qs[32 * (s / 2) + j]` for even `s`, the high nibble for odd.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [i16; 8],
    pub mins: [i16; 8],
    pub qs: [u8; 128],
}

/// Q6_K, as GGML stores it: weight `i` is `d * scales[i / 16] * (q - 32)` with the 6-bit `q`
/// split into four low bits in `ql` and two high bits in `qh` (see [`BlockQ6K::values`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Zeroable, bytemuck::Pod)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: u16,
}

/// 256 activations: `d * qs[i]`, with `bsums16[k]` the sum of `qs[16k..16k + 16]` (Q6_K's
/// offset of 32 and per-16 scales) and `bsums32[k]` of `qs[32k..32k + 32]` (Q4_K's mins).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActQ8K {
    pub d: f32,
    pub qs: [i8; SUPER],
    pub bsums16: [i16; 16],
    pub bsums32: [i16; 8],
}

fn f16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

impl BlockQ4K {
    /// Parses one GGML block (`Q4K_BYTES` bytes: d, dmin, 12 bytes of scales, 128 of nibbles).
    pub fn parse(bytes: &[u8]) -> Self {
        let packed = &bytes[4..16];
        let mut scales = [0i16; 8];
        let mut mins = [0i16; 8];
        // GGML's `get_scale_min_k4`: sub-blocks 0..4 in the low 6 bits of bytes 0..8, 4..8 in
        // the nibbles of bytes 8..12 with their top two bits in the high bits of bytes 0..8.
        for j in 0..8 {
            let (scale, min) = if j < 4 {
                (packed[j] & 63, packed[j + 4] & 63)
            } else {
                (
                    (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4),
                    (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
                )
            };
            scales[j] = i16::from(scale);
            mins[j] = i16::from(min);
        }
        let mut qs = [0u8; 128];
        qs.copy_from_slice(&bytes[16..Q4K_BYTES]);
        Self {
            d: f16_at(bytes, 0),
            dmin: f16_at(bytes, 2),
            scales,
            mins,
            qs,
        }
    }

    /// The 4-bit value of weight `i`.
    fn value(&self, i: usize) -> u8 {
        let byte = self.qs[32 * (i / 64) + i % 32];
        if (i / 32).is_multiple_of(2) {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        let (d, dmin) = (
            f16::from_bits(self.d).to_f32(),
            f16::from_bits(self.dmin).to_f32(),
        );
        for (i, value) in out.iter_mut().enumerate().take(SUPER) {
            let s = i / 32;
            *value = d * f32::from(self.scales[s]) * f32::from(self.value(i))
                - dmin * f32::from(self.mins[s]);
        }
    }

    /// The integer-domain product the AVX2 kernel computes, in scalar code.
    pub fn dot(&self, acts: &ActQ8K) -> f32 {
        let mut scaled = 0i32;
        for s in 0..8 {
            let sum: i32 = (32 * s..32 * s + 32)
                .map(|i| i32::from(self.value(i)) * i32::from(acts.qs[i]))
                .sum();
            scaled += i32::from(self.scales[s]) * sum;
        }
        let mins: i32 = (0..8)
            .map(|s| i32::from(self.mins[s]) * i32::from(acts.bsums32[s]))
            .sum();
        let (d, dmin) = (
            f16::from_bits(self.d).to_f32(),
            f16::from_bits(self.dmin).to_f32(),
        );
        d * acts.d * scaled as f32 - dmin * acts.d * mins as f32
    }
}

impl BlockQ6K {
    pub fn parse(bytes: &[u8]) -> Self {
        let mut block = Self {
            ql: [0; 128],
            qh: [0; 64],
            scales: [0; 16],
            d: f16_at(bytes, 208),
        };
        block.ql.copy_from_slice(&bytes[..128]);
        block.qh.copy_from_slice(&bytes[128..192]);
        for (scale, &byte) in block.scales.iter_mut().zip(&bytes[192..208]) {
            *scale = byte as i8;
        }
        block
    }

    /// The 256 unsigned 6-bit values `q` (weight = `d * scale * (q - 32)`): in each half of 128,
    /// value `32k + l` takes a nibble of `ql[l]` (k = 0, 2) or `ql[l + 32]` (k = 1, 3), low for
    /// k < 2, and bits `2k..2k + 2` of `qh[l]`.
    pub fn values(&self) -> [u8; SUPER] {
        let mut values = [0u8; SUPER];
        for half in 0..2 {
            let (ql, qh) = (&self.ql[64 * half..], &self.qh[32 * half..]);
            let out = &mut values[128 * half..];
            for l in 0..32 {
                let high = |k: usize| ((qh[l] >> (2 * k)) & 3) << 4;
                out[l] = (ql[l] & 0x0f) | high(0);
                out[l + 32] = (ql[l + 32] & 0x0f) | high(1);
                out[l + 64] = (ql[l] >> 4) | high(2);
                out[l + 96] = (ql[l + 32] >> 4) | high(3);
            }
        }
        values
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        let d = f16::from_bits(self.d).to_f32();
        for (i, (value, q)) in out.iter_mut().zip(self.values()).enumerate() {
            *value = d * f32::from(self.scales[i / 16]) * (f32::from(q) - 32.0);
        }
    }

    pub fn dot(&self, acts: &ActQ8K) -> f32 {
        let values = self.values();
        let mut scaled = 0i32;
        for k in 0..16 {
            let sum: i32 = (16 * k..16 * k + 16)
                .map(|i| i32::from(values[i]) * i32::from(acts.qs[i]))
                .sum();
            scaled += i32::from(self.scales[k]) * (sum - 32 * i32::from(acts.bsums16[k]));
        }
        f16::from_bits(self.d).to_f32() * acts.d * scaled as f32
    }
}

/// Quantizes `x` (whole super-blocks long) into `out`, each block of 256 scaled so its largest
/// magnitude maps to 127.
pub fn quantize_activations(x: &[f32], out: &mut Vec<ActQ8K>) {
    out.clear();
    out.extend(x.chunks_exact(SUPER).map(|block| {
        let mut acts = ActQ8K {
            d: 0.0,
            qs: [0; SUPER],
            bsums16: [0; 16],
            bsums32: [0; 8],
        };
        acts.d = quantize_block(block, &mut acts.qs);
        for (k, chunk) in acts.qs.chunks_exact(16).enumerate() {
            // At most 16 * 127: well inside i16, as is the sum of two.
            let sum: i16 = chunk.iter().map(|&q| i16::from(q)).sum();
            acts.bsums16[k] = sum;
            acts.bsums32[k / 2] += sum;
        }
        acts
    }));
}
