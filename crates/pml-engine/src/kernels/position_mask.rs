//! The candle path's masked softmax: the position mask built on the scores' device from the
//! two position vectors (the only data uploaded), added to the scores, then candle's
//! `softmax_last_dim`. Same contract as the native [`super::masked_softmax`], which never builds
//! the mask.

use candle_core::{DType, Tensor};

use super::EngineError;

/// Added to the scores of keys a query may not see. Finite, so a row that sees nothing stays
/// free of NaN (its uniform weights are zeroed afterwards); far below any real score, so its
/// exponential is 0 next to a visible key's.
const HIDDEN: f64 = 1e30;

/// `softmax(scores)` over the keys each row's query may see (`key <= query`, and `query - key <
/// window` in local layers), 0 for the others; a row that sees no key is all zeros. `scores`:
/// f32 `(heads, rows, key_positions.len())` with `rows` a multiple of `query_positions.len()`,
/// row `r` belonging to the query `query_positions[r % n_queries]`.
pub(super) fn masked_softmax_by_ops(
    scores: &Tensor,
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Tensor, EngineError> {
    let (heads, rows, n_keys) = scores.dims3()?;
    let n_queries = query_positions.len();
    if n_keys != key_positions.len() || n_queries == 0 || rows % n_queries != 0 {
        return Err(EngineError::InvalidInput(format!(
            "masked softmax of scores {:?} for {n_queries} queries and {} keys",
            scores.dims(),
            key_positions.len()
        )));
    }
    let device = scores.device();
    // Distances in f32: positions stay far below 2^24, where f32 counts exactly.
    let as_f32 = |positions: &[u32]| -> Vec<f32> { positions.iter().map(|&p| p as f32).collect() };
    let queries = Tensor::from_vec(as_f32(query_positions), (n_queries, 1), device)?;
    let keys = Tensor::from_vec(as_f32(key_positions), (1, n_keys), device)?;
    let distance = queries.broadcast_sub(&keys)?; // (n_queries, n_keys)
    let mut visible = distance.ge(0f64)?.to_dtype(DType::F32)?;
    if let Some(window) = window {
        visible = (visible * distance.lt(window as f64)?.to_dtype(DType::F32)?)?;
    }
    // 1 → 0, 0 → -HIDDEN.
    let mask = visible.affine(HIDDEN, -HIDDEN)?;
    let sees_any = visible.max_keepdim(1)?; // (n_queries, 1)
    let grouped = scores
        .to_dtype(DType::F32)?
        .reshape((heads, rows / n_queries, n_queries, n_keys))?
        .broadcast_add(&mask)?;
    let weights =
        candle_nn::ops::softmax_last_dim(&grouped.contiguous()?)?.broadcast_mul(&sees_any)?;
    Ok(weights.reshape((heads, rows, n_keys))?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// The same weights as the native kernel, for windows, gaps, repeated positions and a row
    /// that sees nothing.
    #[test]
    fn matches_the_native_masked_softmax() -> Result<(), EngineError> {
        let device = Device::Cpu;
        let scores = Tensor::arange(0f32, 2.0 * 6.0 * 5.0, &device)?
            .affine(0.41, -3.0)?
            .sin()?
            .affine(9.0, 0.0)?
            .reshape((2, 6, 5))?;
        let keys = [3u32, 4, 4, 7, 9];
        for (queries, window) in [
            ([9u32, 4, 2], None),
            ([9, 8, 7], Some(3)),
            ([1, 9, 4], Some(1)),
        ] {
            let native =
                super::super::masked_softmax::masked_softmax(&scores, &queries, &keys, window)?;
            let by_ops = masked_softmax_by_ops(&scores, &queries, &keys, window)?;
            let difference = (native - by_ops)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(difference < 1e-6, "{queries:?} {window:?}: {difference}");
        }
        Ok(())
    }

    #[test]
    fn mismatched_positions_are_refused() {
        let scores = Tensor::zeros((1, 3, 2), DType::F32, &Device::Cpu).unwrap();
        assert!(masked_softmax_by_ops(&scores, &[1, 2], &[0, 1], None).is_err());
        assert!(masked_softmax_by_ops(&scores, &[1], &[0], None).is_err());
    }
}
