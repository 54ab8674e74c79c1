use candle_core::Device;

use super::*;
use crate::attention_reference::{reference, segment_cuts, segments_cut_at, stored_rows, values};

/// Every cut (runs of 16, 32 and 64 keys and the default; chunks of 1, 5 and 96 rows; the keys
/// in one segment or several), both tile kernels, with and without a window, f32, f16 and bf16 rows, against the f64
/// reference on the rows as stored.
fn check_against_reference(
    (n_queries, n_heads, n_kv_heads, n_keys, d): (usize, usize, usize, usize, usize),
    key_positions: &[u32],
    query_positions: &[u32],
    window: Option<usize>,
) -> Result<(), KernelError> {
    let device = Device::Cpu;
    let q = values(n_queries * n_heads * d, 0.1);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (k_tensor, k) = stored_rows((n_keys, n_kv_heads, d), dtype, 1.3)?;
        let (v_tensor, v) = stored_rows((n_keys, n_kv_heads, d), dtype, 2.9)?;
        let dims = (n_queries, n_heads, n_kv_heads, n_keys, d);
        let expected = reference(&q, &k, &v, dims, query_positions, key_positions, window);
        let runs = [None, Some(16), Some(32), Some(64)];
        let cuts = segment_cuts(n_keys);
        for (cut_rows, keys_per_run) in cuts.iter().flat_map(|c| runs.map(|r| (c, r))) {
            let segments = segments_cut_at(&k_tensor, &v_tensor, cut_rows)?;
            for rows_per_chunk in [None, Some(1), Some(5)] {
                for portable in [false, true] {
                    let cut = Cut {
                        keys_per_run,
                        rows_per_chunk,
                        portable,
                    };
                    let ours = attend_cut(
                        &Tensor::from_slice(&q, (n_queries, n_heads, d), &device)?,
                        query_positions,
                        (&segments, key_positions),
                        window,
                        cut,
                    )?
                    .ok_or_else(|| KernelError::InvalidInput("no tiled path".into()))?;
                    assert_eq!(ours.dims(), [n_queries, n_heads * d]);
                    let ours = ours.flatten_all()?.to_vec1::<f32>()?;
                    for (index, (a, b)) in ours.iter().zip(&expected).enumerate() {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{dtype:?} d={d} window {window:?}, runs of {keys_per_run:?}, \
                             chunks of {rows_per_chunk:?}, segments cut at {cut_rows:?}, \
                             portable {portable}, value {index}: {a} vs {b}"
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
    // Keys out of order with a gap; queries among and after them (the first sees only part of
    // the keys); 6 heads over 2 KV heads.
    let key_positions: Vec<u32> = (0..40).chain(50..60).chain(40..45).collect();
    let query_positions = [3u32, 44, 57, 60, 61, 70, 71];
    // Head sizes: 20 (no whole vector: the portable weights), 8, 40 (16- and 8-lane blocks),
    // 64 and 96.
    for d in [20, 8, 40, 64, 96] {
        for window in [None, Some(6)] {
            check_against_reference(
                (query_positions.len(), 6, 2, key_positions.len(), d),
                &key_positions,
                &query_positions,
                window,
            )?;
        }
    }
    Ok(())
}

#[test]
fn a_causal_prefill_matches() -> Result<(), KernelError> {
    // Every query among the keys: tiles above the diagonal are skipped, the diagonal's masked.
    let positions: Vec<u32> = (0..70).collect();
    check_against_reference((70, 4, 1, 70, 32), &positions, &positions, None)?;
    check_against_reference((70, 4, 1, 70, 32), &positions, &positions, Some(9))
}

#[test]
fn new_tokens_over_a_long_cache_match() -> Result<(), KernelError> {
    // SmolLM2's heads (9 over 3 KV heads), 22 new tokens after 600 cached ones.
    let key_positions: Vec<u32> = (0..622).collect();
    let query_positions: Vec<u32> = (600..622).collect();
    check_against_reference((22, 9, 3, 622, 64), &key_positions, &query_positions, None)
}

#[test]
fn a_query_that_sees_nothing_gets_zeros() -> Result<(), KernelError> {
    let device = Device::Cpu;
    let kv = Tensor::ones((2, 1, 8), DType::F32, &device)?;
    let q = Tensor::ones((2, 1, 8), DType::F32, &device)?;
    // The first query sees neither key, the second both.
    let segments = segments_cut_at(&kv, &kv, &[])?;
    let out = attend_tiled(&q, &[0, 5], &segments, &[1, 2], None)?;
    let out = out.ok_or_else(|| KernelError::InvalidInput("no tiled path".into()))?;
    let out = out.to_vec2::<f32>()?;
    assert_eq!(out[0], vec![0.0; 8]);
    assert_eq!(out[1], vec![1.0; 8]);
    Ok(())
}

#[test]
fn a_window_skips_the_runs_it_hides() {
    // 1000 keys, a window of 100 at the end: runs of 64 keys, of which only the last two or
    // three are read.
    let keys: Vec<u32> = (0..1000).collect();
    let cut = Cut {
        keys_per_run: Some(64),
        ..Cut::default()
    };
    let plan = Plan::new(
        (4, 1, 1, 8),
        (&[996, 997, 998, 999], &keys),
        &[0, 1000],
        Some(100),
        cut,
    );
    let runs: Vec<usize> = plan.items.iter().map(|item| item.run).collect();
    assert_eq!(runs, [14, 15]);
    // The last run (960..1000) is all seen by the last query; the first lacks its 3 last keys.
    assert_eq!(plan.sight(15, 3), Sight::All);
    assert_eq!(plan.sight(15, 0), Sight::Part);
    assert_eq!(plan.sight(14, 0), Sight::Part);
    assert_eq!(plan.sight(13, 3), Sight::Nothing);
}
