//! The decode kernels against candle: blocks parse to the weights candle dequantizes, the
//! AVX2 dots agree with the scalar ones, and products match a dense f32 matmul of candle's
//! dequantized weights within the error of quantizing the activations.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::blocks::{self, ActGroup, GROUP_WEIGHTS};
use super::{Blocks, QuantMatrix, avx2};

fn random_matrix(rows: usize, cols: usize, seed: u64) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    Tensor::from_vec(values, (rows, cols), &Device::Cpu).expect("shape matches")
}

fn quantized(rows: usize, cols: usize, dtype: GgmlDType, seed: u64) -> QTensor {
    QTensor::quantize(&random_matrix(rows, cols, seed), dtype).expect("quantizable")
}

const TYPES: [GgmlDType; 2] = [GgmlDType::Q8_0, GgmlDType::Q5_0];

#[test]
fn blocks_dequantize_to_candles_weights() {
    for dtype in TYPES {
        let qtensor = quantized(5, 256, dtype, 1);
        let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
        let ours = matrix
            .dequantize_rows(&[0, 1, 2, 3, 4], &Device::Cpu)
            .expect("rows exist");
        let theirs = qtensor.dequantize(&Device::Cpu).expect("dequantizable");
        let difference = (ours - theirs)
            .expect("same shape")
            .abs()
            .expect("abs")
            .max_all()
            .expect("max")
            .to_scalar::<f32>()
            .expect("scalar");
        assert_eq!(difference, 0.0, "{dtype:?}");
    }
}

#[test]
fn simd_dots_agree_with_scalar_dots() {
    if !avx2::available() {
        return;
    }
    let mut acts: Vec<ActGroup> = Vec::new();
    let x = random_matrix(1, 4864, 2).flatten_all().expect("flat");
    blocks::quantize_activations(&x.to_vec1::<f32>().expect("f32"), &mut acts);
    for dtype in TYPES {
        let matrix = QuantMatrix::from_qtensor(&quantized(3, 4864, dtype, 3)).expect("supported");
        let per_row = 4864 / GROUP_WEIGHTS;
        for row in 0..3 {
            let range = row * per_row..(row + 1) * per_row;
            let (simd, scalar) = match &matrix.blocks {
                Blocks::Q8_0(b) => (
                    avx2::dot_q8_0(&b[range.clone()], &acts),
                    blocks::dot_q8_0(&b[range], &acts),
                ),
                Blocks::Q5_0(b) => (
                    avx2::dot_q5_0(&b[range.clone()], &acts),
                    blocks::dot_q5_0(&b[range], &acts),
                ),
            };
            let simd = simd.expect("avx2 available");
            assert!(
                (simd - scalar).abs() <= 1e-4 * scalar.abs().max(1.0),
                "{dtype:?} row {row}: simd {simd} scalar {scalar}"
            );
        }
    }
}

#[test]
fn products_match_dense_matmul_of_dequantized_weights() {
    // 70 rows: two full work items and a partial one; 3 input rows exercise the transpose.
    for dtype in TYPES {
        for n_rows in [1, 3] {
            let qtensor = quantized(70, 256, dtype, 4);
            let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
            let x = random_matrix(n_rows, 256, 5);
            let ours = matrix.forward(&x).expect("multiplies");
            let dense = qtensor.dequantize(&Device::Cpu).expect("dequantizable");
            let reference = x.matmul(&dense.t().expect("t")).expect("matmul");
            assert_eq!(ours.dims(), [n_rows, 70]);
            let ours = ours.flatten_all().and_then(|t| t.to_vec1::<f32>());
            let reference = reference.flatten_all().and_then(|t| t.to_vec1::<f32>());
            let (ours, reference) = (ours.expect("f32"), reference.expect("f32"));
            // Quantizing the activations to 8 bits moves each product by well under 1% of the
            // sum of magnitudes (at most 256 terms of |w x| <= 1 each here, about 64 on average).
            for (i, (&a, &b)) in ours.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() < 0.2,
                    "{dtype:?} {n_rows} rows, output {i}: {a} vs {b}"
                );
            }
            let max_abs = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(max_abs > 1.0, "outputs too small to test anything");
        }
    }
}

#[test]
fn unsupported_types_and_widths_are_refused() {
    let k_quant = quantized(2, 256, GgmlDType::Q4K, 6);
    assert!(!QuantMatrix::supports(&k_quant));
    assert!(QuantMatrix::from_qtensor(&k_quant).is_err());
    // Rows of 96 weights are whole blocks but not whole groups.
    let partial_group = quantized(2, 96, GgmlDType::Q8_0, 9);
    assert!(!QuantMatrix::supports(&partial_group));
    assert!(QuantMatrix::from_qtensor(&partial_group).is_err());
    let matrix = QuantMatrix::from_qtensor(&quantized(2, 128, GgmlDType::Q8_0, 7)).expect("ok");
    assert!(matrix.forward(&random_matrix(1, 256, 8)).is_err());
    assert!(matrix.dequantize_rows(&[2], &Device::Cpu).is_err());
}
