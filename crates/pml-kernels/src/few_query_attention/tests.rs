use candle_core::Device;

use super::*;
use crate::attention_reference::{reference, segment_cuts, segments_cut_at, stored_rows, values};

/// Every cut of the keys (whole rows, runs of 1, 3 and 5 keys, the pool's choice), the rows in
/// one segment or several, both item kernels, with and without a window, f32 and f16 rows,
/// against the f64 reference on the rows as stored.
fn check_against_reference(
    (n_queries, n_heads, n_kv_heads, n_keys, d): (usize, usize, usize, usize, usize),
    key_positions: &[u32],
    query_positions: &[u32],
) -> Result<(), KernelError> {
    let device = Device::Cpu;
    let q = values(n_queries * n_heads * d, 0.1);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (k_tensor, k) = stored_rows((n_keys, n_kv_heads, d), dtype, 1.3)?;
        let (v_tensor, v) = stored_rows((n_keys, n_kv_heads, d), dtype, 2.9)?;
        for window in [None, Some(4)] {
            let dims = (n_queries, n_heads, n_kv_heads, n_keys, d);
            let expected = reference(&q, &k, &v, dims, query_positions, key_positions, window);
            let cuts = segment_cuts(n_keys);
            let items = [None, Some(1), Some(3), Some(5), Some(n_keys)];
            for (cut_rows, keys_per_item) in cuts.iter().flat_map(|c| items.map(|i| (c, i))) {
                let segments = segments_cut_at(&k_tensor, &v_tensor, cut_rows)?;
                for portable in [false, true] {
                    let cut = Cut {
                        keys_per_item,
                        portable,
                    };
                    let ours = attend_cut(
                        &Tensor::from_slice(&q, (n_queries, n_heads, d), &device)?,
                        query_positions,
                        (&segments, key_positions),
                        window,
                        cut,
                    )?
                    .ok_or_else(|| KernelError::InvalidInput("no fast path".into()))?;
                    assert_eq!(ours.dims(), [n_queries, n_heads * d]);
                    for (a, b) in ours.flatten_all()?.to_vec1::<f32>()?.iter().zip(&expected) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{dtype:?} d={d} window {window:?}, {keys_per_item:?} keys per \
                             item, segments cut at {cut_rows:?}, portable {portable}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

#[test]
fn matches_plain_attention_under_the_mask() -> Result<(), KernelError> {
    // Keys out of order with a gap, queries at the end, a window that hides the oldest.
    let key_positions = [0u32, 1, 2, 3, 7, 4, 5, 8, 9];
    let query_positions = [8u32, 9];
    // 6 heads over 2 KV heads; head size 20 (not a multiple of the 8 lanes: the portable
    // kernel), 8, 40 (8- and 32-lane blocks) and 96 (64 + 32).
    for d in [20, 8, 40, 96] {
        check_against_reference((2, 6, 2, 9, d), &key_positions, &query_positions)?;
    }
    // One query head per KV head, 5 keys (a block of four and a tail).
    check_against_reference((1, 3, 3, 5, 64), &[0, 1, 2, 3, 4], &[4])?;
    Ok(())
}

#[test]
fn a_long_cache_is_cut_into_runs_that_merge_exactly() -> Result<(), KernelError> {
    // 9 heads over 3 KV heads (SmolLM2's shape), 700 keys: the pool's cut makes several runs.
    let n_keys = 700;
    let key_positions: Vec<u32> = (0..n_keys as u32).collect();
    check_against_reference((1, 9, 3, n_keys, 64), &key_positions, &[n_keys as u32])
}

#[test]
fn a_query_that_sees_nothing_gets_zeros() -> Result<(), KernelError> {
    let device = Device::Cpu;
    let kv = Tensor::ones((2, 1, 8), DType::F32, &device)?;
    let q = Tensor::ones((2, 1, 8), DType::F32, &device)?;
    // The first query sees neither key, the second both.
    let segments = segments_cut_at(&kv, &kv, &[])?;
    let out = attend_few(&q, &[0, 5], &segments, &[1, 2], None)?;
    let out = out.ok_or_else(|| KernelError::InvalidInput("no fast path".into()))?;
    let out = out.to_vec2::<f32>()?;
    assert_eq!(out[0], vec![0.0; 8]);
    assert_eq!(out[1], vec![1.0; 8]);
    Ok(())
}
