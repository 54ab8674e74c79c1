//! The kernels against candle: blocks parse to the weights candle dequantizes, the SIMD tiles
//! agree with the scalar dots for every tile width, and products of every row count match a
//! dense f32 matmul of candle's dequantized weights within the error of quantizing the
//! activations.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::blocks::{ActGroup, GROUP_WEIGHTS, quantize_activations};
use super::interleaved::{PANEL, tile_scalar, tile_scalar_by};
use super::interleaved_product::{PanelKernel, tile_scalar_super};
use super::interleaved_q4_1::PanelQ4_1;
use super::interleaved_q8::PanelQ8_0;
use super::kernel::BlockKernel;
use super::mac::Simd;
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

/// Every block type the two default models store their projections in, and Q4_0 (as Q5_0)
/// and Q4_1 (SmolLM2's).
const TYPES: [GgmlDType; 6] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q4K,
    GgmlDType::Q6K,
];

fn to_vec(tensor: &Tensor) -> Vec<f32> {
    tensor
        .flatten_all()
        .and_then(|t| t.to_vec1::<f32>())
        .expect("f32 tensor")
}

#[test]
fn blocks_dequantize_to_candles_weights() {
    for dtype in TYPES {
        let qtensor = quantized(5, 512, dtype, 1);
        let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
        let ours = matrix
            .dequantize_rows(&[0, 1, 2, 3, 4], &Device::Cpu)
            .expect("rows exist");
        let theirs = qtensor.dequantize(&Device::Cpu).expect("dequantizable");
        assert_eq!(to_vec(&ours), to_vec(&theirs), "{dtype:?}");
    }
}

/// Each SIMD tile width against the scalar dots of the same quantized activations.
fn check_tiles<W: BlockKernel>(weights: &[W], x: &[f32], per_row: usize, label: &str) {
    let mut acts = Vec::new();
    W::quantize(x, &mut acts);
    let rows: Vec<&[W::Act]> = acts.chunks_exact(per_row).collect();
    let scalar: Vec<f32> = rows
        .iter()
        .map(|row| weights.iter().zip(*row).map(|(w, a)| w.dot(a)).sum())
        .collect();
    let mut simd = vec![0f32; rows.len()];
    for width in 1..=rows.len() {
        for (tile, out) in rows.chunks(width).zip(simd.chunks_mut(width)) {
            W::tile_rows(weights, tile, out);
        }
        for (row, (&s, &r)) in simd.iter().zip(&scalar).enumerate() {
            assert!(
                (s - r).abs() <= 1e-4 * r.abs().max(1.0),
                "{label} width {width} row {row}: simd {s} scalar {r}"
            );
        }
    }
}

#[test]
fn simd_tiles_agree_with_scalar_dots() {
    if !avx2::available() {
        return;
    }
    let (cols, n_act_rows) = (4864, 5);
    let x = to_vec(&random_matrix(n_act_rows, cols, 2));
    for dtype in TYPES {
        let matrix = QuantMatrix::from_qtensor(&quantized(1, cols, dtype, 3)).expect("supported");
        let label = format!("{dtype:?}");
        match &matrix.blocks {
            Blocks::Q8_0(b) => check_tiles(b, &x, b.len(), &label),
            Blocks::Q5_0(b) => check_tiles(b, &x, b.len(), &label),
            Blocks::Q4_1(b) => check_tiles(b, &x, b.len(), &label),
            Blocks::Q4K(b) => check_tiles(b, &x, b.len(), &label),
            Blocks::Q6K(b) => check_tiles(b, &x, b.len(), &label),
            Blocks::Q5_0x8(_)
            | Blocks::Q4Kx8(_)
            | Blocks::Q8_0x8(_)
            | Blocks::Q4_1x8(_)
            | Blocks::Q6Kx8(_) => unreachable!("one row is not a panel of eight"),
        }
    }
}

/// The panel's rows, dequantized by us, are candle's dequantization bit for bit.
fn assert_dequantizes_as_candle(matrix: &QuantMatrix, qtensor: &QTensor) {
    let rows: Vec<u32> = (0..PANEL as u32).collect();
    let ours = matrix.dequantize_rows(&rows, &Device::Cpu).expect("rows");
    let theirs = qtensor.dequantize(&Device::Cpu).expect("dequantizable");
    assert_eq!(to_vec(&ours), to_vec(&theirs));
}

#[test]
fn interleaved_panels_hold_the_rows_and_their_simd_tiles_agree_with_scalar_dots() {
    let (cols, n_act_rows) = (4864, 5);
    let qtensor = quantized(PANEL, cols, GgmlDType::Q5_0, 12);
    let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
    let Blocks::Q5_0x8(panels) = &matrix.blocks else {
        panic!("eight Q5_0 rows are interleaved");
    };
    assert_dequantizes_as_candle(&matrix, &qtensor);
    if !avx2::available() {
        return;
    }
    let x = to_vec(&random_matrix(n_act_rows, cols, 13));
    let mut acts = Vec::new();
    quantize_activations(&x, &mut acts);
    let act_rows: Vec<&[ActGroup]> = acts.chunks_exact(cols / GROUP_WEIGHTS).collect();
    let scalar = act_rows
        .iter()
        .map(|row| tile_scalar(panels, [*row])[0])
        .collect::<Vec<_>>();
    assert_panel_tiles_match(panels, &act_rows, &scalar);
}

/// `P::tile` at widths 1, 2 and 4 over five activation rows against `scalar`, the reference
/// outputs of each row, at every SIMD level this CPU has; the levels' outputs are identical
/// to the bit (the same integer sums, scaled alike).
fn assert_panel_tiles_match<P: PanelKernel>(
    panels: &[P],
    act_rows: &[&[P::Act]],
    scalar: &[[f32; PANEL]],
) {
    let levels = Simd::available();
    eprintln!("panel tiles at the SIMD levels {levels:?}");
    let mut first_level: Option<Vec<[f32; PANEL]>> = None;
    for simd in levels {
        let simd = Some(simd);
        let outputs = [
            P::tile(simd, panels, [act_rows[0]]).to_vec(),
            P::tile(simd, panels, [act_rows[1], act_rows[2]]).to_vec(),
            P::tile(
                simd,
                panels,
                [act_rows[3], act_rows[4], act_rows[0], act_rows[1]],
            )
            .to_vec(),
        ];
        let outputs: Vec<[f32; PANEL]> = outputs.into_iter().flatten().collect();
        let order = [0, 1, 2, 3, 4, 0, 1];
        assert_eq!(outputs.len(), order.len());
        for (k, (values, &row)) in outputs.iter().zip(&order).enumerate() {
            for (lane, (&s, &r)) in values.iter().zip(&scalar[row]).enumerate() {
                assert!(
                    (s - r).abs() <= 1e-4 * r.abs().max(1.0),
                    "{simd:?} tile output {k} row {lane}: simd {s} scalar {r}"
                );
            }
        }
        match &first_level {
            None => first_level = Some(outputs),
            Some(first) => assert_eq!(first, &outputs, "{simd:?} against the slower level"),
        }
    }
}

/// Our product of a random `(out_features, 512)` matrix of `dtype` with `n_rows` random rows,
/// and candle's f32 matmul of the same rows with the matrix it dequantizes.
fn product_and_reference(
    dtype: GgmlDType,
    out_features: usize,
    n_rows: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    product_and_reference_of_width(dtype, out_features, 512, n_rows, seed)
}

fn product_and_reference_of_width(
    dtype: GgmlDType,
    out_features: usize,
    in_features: usize,
    n_rows: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let qtensor = quantized(out_features, in_features, dtype, seed);
    let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
    let x = random_matrix(n_rows, in_features, seed + 1);
    let ours = matrix.forward(&x).expect("multiplies");
    let dense = qtensor.dequantize(&Device::Cpu).expect("dequantizable");
    let reference = x.matmul(&dense.t().expect("t")).expect("matmul");
    assert_eq!(ours.dims(), [n_rows, out_features]);
    (to_vec(&ours), to_vec(&reference))
}

#[test]
fn products_match_dense_matmul_of_dequantized_weights() {
    // 70 output rows: two full work items and a partial one; 72 (the interleaved types: panels of
    // eight rows), two full items and a partial one. Input rows 1 (decode), 3 and 6 (a full
    // tile and a partial one), 9 (two full tiles and one row).
    for (dtype, out_features) in TYPES.map(|t| (t, 70)).into_iter().chain([
        (GgmlDType::Q5_0, 72),
        (GgmlDType::Q4K, 72),
        (GgmlDType::Q8_0, 72),
        (GgmlDType::Q4_1, 72),
        (GgmlDType::Q6K, 72),
    ]) {
        for n_rows in [1, 3, 6, 9] {
            let (ours, reference) = product_and_reference(dtype, out_features, n_rows, 4);
            // Quantizing the activations to 8 bits moves each product by well under 1% of the
            // sum of magnitudes (512 terms of |w x| <= 1 each here, about 128 on average).
            for (i, (&a, &b)) in ours.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() < 0.4,
                    "{dtype:?} {n_rows} rows, output {i}: {a} vs {b}"
                );
            }
            let max_abs = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(max_abs > 1.0, "outputs too small to test anything");
        }
    }
}

#[test]
fn rows_of_whole_blocks_but_not_whole_groups_are_padded() {
    // SmolLM2's widths: 576 = 18 blocks (four and a half groups of four), 1536 whole groups.
    for dtype in [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q8_0,
    ] {
        let qtensor = quantized(PANEL, 576, dtype, 21);
        assert!(QuantMatrix::supports(&qtensor), "{dtype:?}");
        let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
        assert_dequantizes_as_candle(&matrix, &qtensor);
        for n_rows in [1, 5, super::PANEL_MIN_ROWS] {
            let (ours, reference) = product_and_reference_of_width(dtype, 16, 576, n_rows, 22);
            for (i, (&a, &b)) in ours.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() < 0.4,
                    "{dtype:?} {n_rows} rows, output {i}: {a} vs {b}"
                );
            }
        }
    }
}

/// The types whose matrices of whole panels are interleaved.
const INTERLEAVED: [GgmlDType; 5] = [
    GgmlDType::Q5_0,
    GgmlDType::Q4K,
    GgmlDType::Q8_0,
    GgmlDType::Q4_1,
    GgmlDType::Q6K,
];

#[test]
fn interleaved_products_of_many_rows_equal_their_rows_products() {
    // 4864 inputs: an activation row of about 19 KB as f32, so ~250–300 rows span several
    // blocks of activations (`ACT_BLOCK_BYTES`), the last one partial, and a partial tile —
    // staying below the row count from which this CPU's kernels hand products to the f32
    // panels (the AVX2 tiles' threshold; none with AVX-512 VNNI), so the tiles are what runs.
    // Each output row is the same tiles' sums in the same order whether computed among many
    // or alone.
    let n_rows = 299.min(super::interleaved_panel_min_rows() - 1);
    let (out_features, in_features) = (16, 4864);
    for dtype in INTERLEAVED {
        let qtensor = quantized(out_features, in_features, dtype, 23);
        let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
        let x = random_matrix(n_rows, in_features, 24);
        let rows = [0, 1, 47, 48, 49, 150, n_rows - 2, n_rows - 1];
        assert_rows_as_alone(&matrix, &x, &rows, &format!("{dtype:?}"));
    }
}

/// Each of `rows` of `matrix` times all of `x` equals that row of `x` multiplied alone.
fn assert_rows_as_alone(matrix: &QuantMatrix, x: &Tensor, rows: &[usize], what: &str) {
    let all = to_vec(&matrix.forward(x).expect("multiplies"));
    let out_features = all.len() / x.dim(0).expect("rows");
    for &row in rows {
        let one = matrix
            .forward(&x.narrow(0, row, 1).expect("row"))
            .expect("multiplies");
        assert_eq!(
            &all[row * out_features..][..out_features],
            &to_vec(&one)[..],
            "{what}, row {row}"
        );
    }
}

#[test]
fn interleaved_products_of_a_few_rows_equal_their_rows_products() {
    // Up to `PANEL_TILE` rows (a decode step and its drafts) make one tile with the AVX2 tiles
    // (`PML_NO_AVX512=1` on an AVX-512 machine), in tiles of `TILE` otherwise: either way each
    // row's sums are the ones it gets alone, so drafted rows decode the tokens a step would.
    let (out_features, in_features) = (16, 2 * 256);
    for dtype in INTERLEAVED {
        let qtensor = quantized(out_features, in_features, dtype, 31);
        let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
        let x = random_matrix(super::interleaved_product::PANEL_TILE + 1, in_features, 32);
        for n_rows in 2..=super::interleaved_product::PANEL_TILE + 1 {
            let rows: Vec<usize> = (0..n_rows).collect();
            let first = x.narrow(0, 0, n_rows).expect("rows");
            assert_rows_as_alone(&matrix, &first, &rows, &format!("{dtype:?} of {n_rows}"));
        }
    }
}

#[test]
fn panel_products_match_dense_matmul_of_the_same_weights() {
    // 150 output rows: two full panels and a partial one (152 for Q5_0's interleaved rows);
    // input rows from the panel threshold up. The panels multiply the dequantized weights with
    // the activations in f32, so they agree with candle's matmul up to summation order.
    // With the AVX-512 VNNI tiles interleaved matrices never take the panels (scripts/test.sh
    // runs these tests again with PML_NO_AVX512=1, where they do).
    let interleaved = (super::interleaved_panel_min_rows() != usize::MAX)
        .then_some(INTERLEAVED)
        .into_iter()
        .flatten()
        .map(|t| (t, 152, super::INTERLEAVED_PANEL_MIN_ROWS));
    let cases = TYPES
        .map(|t| (t, 150, super::PANEL_MIN_ROWS))
        .into_iter()
        .chain(interleaved);
    for (dtype, out_features, threshold) in cases {
        for n_rows in [threshold, threshold + 33] {
            let (ours, reference) = product_and_reference(dtype, out_features, n_rows, 10);
            for (i, (&a, &b)) in ours.iter().zip(&reference).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                    "{dtype:?} {n_rows} rows, output {i}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn interleaved_q4k_panels_hold_the_rows_and_their_simd_tiles_agree_with_the_reference() {
    check_kquant_panels(
        GgmlDType::Q4K,
        14,
        |blocks| match blocks {
            Blocks::Q4Kx8(panels) => Some(panels),
            _ => None,
        },
        super::interleaved_kquants::PanelQ4K::dot,
    );
}

#[test]
fn interleaved_q6k_panels_hold_the_rows_and_their_simd_tiles_agree_with_the_reference() {
    check_kquant_panels(
        GgmlDType::Q6K,
        16,
        |blocks| match blocks {
            Blocks::Q6Kx8(panels) => Some(panels),
            _ => None,
        },
        super::interleaved_q6k::PanelQ6K::dot,
    );
    // The panel's scalar reference is the row-by-row block's, row for row: the same 6-bit
    // values, scales and integer sums.
    let cols = 2 * 256;
    let qtensor = quantized(PANEL, cols, GgmlDType::Q6K, 17);
    let bytes = qtensor.data().expect("bytes");
    let x = to_vec(&random_matrix(1, cols, 18));
    let mut acts = Vec::new();
    super::kquants::quantize_activations(&x, &mut acts);
    let row_bytes = bytes.len() / PANEL;
    let panels_of_these = super::interleaved_q6k::interleave_q6k(&bytes, PANEL, cols);
    for (column, (panel, act)) in panels_of_these.iter().zip(&acts).enumerate() {
        let by_panel = panel.dot(act);
        for (r, &value) in by_panel.iter().enumerate() {
            let at = r * row_bytes + column * super::kquants::Q6K_BYTES;
            let block = super::kquants::BlockQ6K::parse(&bytes[at..]);
            assert_eq!(value, block.dot(act), "row {r}, column {column}");
        }
    }
}

/// Eight rows of a K-quant `dtype` (a width of 19 super-blocks) are interleaved into panels
/// (`panels_of`) that dequantize as candle does, and their SIMD tiles (where the CPU has AVX2)
/// agree with their scalar reference (`dot`) at widths 1, 2 and 4.
fn check_kquant_panels<P: PanelKernel<Act = super::kquants::ActQ8K>>(
    dtype: GgmlDType,
    seed: u64,
    panels_of: impl Fn(&Blocks) -> Option<&[P]>,
    dot: impl Fn(&P, &super::kquants::ActQ8K) -> [f32; PANEL] + Copy,
) {
    let cols = 4864 / 256 * 256;
    let qtensor = quantized(PANEL, cols, dtype, seed);
    let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
    let panels =
        panels_of(&matrix.blocks).unwrap_or_else(|| panic!("eight {dtype:?} rows are interleaved"));
    assert_dequantizes_as_candle(&matrix, &qtensor);
    if !avx2::available() {
        return;
    }
    let x = to_vec(&random_matrix(5, cols, seed + 1));
    let mut acts = Vec::new();
    super::kquants::quantize_activations(&x, &mut acts);
    let act_rows: Vec<&[super::kquants::ActQ8K]> = acts.chunks_exact(cols / 256).collect();
    let scalar: Vec<[f32; PANEL]> = act_rows
        .iter()
        .map(|row| tile_scalar_super(panels, row, dot))
        .collect();
    assert_panel_tiles_match(panels, &act_rows, &scalar);
}

/// Eight rows of `dtype` are interleaved into panels (`panels_of`) that dequantize as candle
/// does; their scalar reference (`dot`) equals the row-by-row layout's (`rows_of`, one row of
/// the same weights) on the first row, and their SIMD tiles agree with it.
fn check_interleaved_group_panels<P, W>(
    dtype: GgmlDType,
    seed: u64,
    panels_of: impl Fn(&Blocks) -> Option<&[P]>,
    rows_of: impl Fn(&Blocks) -> Option<&[W]>,
    dot: impl Fn(&P, &ActGroup, usize) -> [f32; PANEL] + Copy,
) where
    P: PanelKernel<Act = ActGroup>,
    W: BlockKernel<Act = ActGroup>,
{
    let (cols, n_act_rows) = (4864, 5);
    let qtensor = quantized(PANEL, cols, dtype, seed);
    let matrix = QuantMatrix::from_qtensor(&qtensor).expect("supported");
    let panels =
        panels_of(&matrix.blocks).unwrap_or_else(|| panic!("eight {dtype:?} rows are interleaved"));
    assert_dequantizes_as_candle(&matrix, &qtensor);
    let x = to_vec(&random_matrix(n_act_rows, cols, seed + 1));
    let mut acts = Vec::new();
    quantize_activations(&x, &mut acts);
    let act_rows: Vec<&[ActGroup]> = acts.chunks_exact(cols / GROUP_WEIGHTS).collect();
    let scalar: Vec<[f32; PANEL]> = act_rows
        .iter()
        .map(|row| tile_scalar_by(panels, row, dot))
        .collect();
    let rows = QuantMatrix::from_qtensor(&quantized(1, cols, dtype, seed))
        .expect("one row stays row by row");
    let first_row =
        rows_of(&rows.blocks).unwrap_or_else(|| panic!("one {dtype:?} row is not interleaved"));
    for (row, values) in act_rows.iter().zip(&scalar) {
        let by_rows: f32 = first_row.iter().zip(*row).map(|(w, a)| w.dot(a)).sum();
        assert!((values[0] - by_rows).abs() <= 1e-4 * by_rows.abs().max(1.0));
    }
    if !avx2::available() {
        return;
    }
    assert_panel_tiles_match(panels, &act_rows, &scalar);
}

#[test]
fn interleaved_q8_0_panels_hold_the_rows_and_their_simd_tiles_agree_with_scalar_dots() {
    check_interleaved_group_panels(
        GgmlDType::Q8_0,
        16,
        |blocks| match blocks {
            Blocks::Q8_0x8(panels) => Some(&panels[..]),
            _ => None,
        },
        |blocks| match blocks {
            Blocks::Q8_0(groups) => Some(&groups[..]),
            _ => None,
        },
        PanelQ8_0::dot,
    );
}

#[test]
fn interleaved_q4_1_panels_hold_the_rows_and_their_simd_tiles_agree_with_scalar_dots() {
    check_interleaved_group_panels(
        GgmlDType::Q4_1,
        18,
        |blocks| match blocks {
            Blocks::Q4_1x8(panels) => Some(&panels[..]),
            _ => None,
        },
        |blocks| match blocks {
            Blocks::Q4_1(groups) => Some(&groups[..]),
            _ => None,
        },
        PanelQ4_1::dot,
    );
}

#[test]
fn unsupported_types_and_widths_are_refused() {
    let other = quantized(2, 256, GgmlDType::Q5K, 6);
    assert!(!QuantMatrix::supports(&other));
    assert!(QuantMatrix::from_qtensor(&other).is_err());
    // K-quant rows must be whole super-blocks (rows of whole blocks of the grouped types are
    // padded: `rows_of_whole_blocks_but_not_whole_groups_are_padded`).
    let bytes = vec![0u8; 2 * 3 * 18];
    let storage = candle_core::quantized::QStorage::from_data(
        std::borrow::Cow::Owned(bytes),
        &Device::Cpu,
        GgmlDType::Q4_0,
    )
    .expect("storage");
    let partial_block = QTensor::new(storage, (2, 96)).expect("96 = 3 blocks");
    assert!(QuantMatrix::supports(&partial_block));
    let matrix = QuantMatrix::from_qtensor(&quantized(2, 128, GgmlDType::Q8_0, 7)).expect("ok");
    assert!(matrix.forward(&random_matrix(1, 256, 8)).is_err());
    assert!(matrix.dequantize_rows(&[2], &Device::Cpu).is_err());
}
