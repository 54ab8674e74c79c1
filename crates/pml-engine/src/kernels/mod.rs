//! The engine's CPU kernels: quantized matrix products, the masked softmax, few-query attention and
//! the exponentials under both.

mod exp_kernel;
mod few_query_attention;
mod masked_softmax;
pub(crate) mod quant;

use candle_core::Tensor;

pub(crate) use crate::model::EngineError;

/// See [`few_query_attention::attend_few`].
pub(crate) fn attend_few(
    queries: &Tensor,
    query_positions: &[u32],
    keys: &Tensor,
    values: &Tensor,
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Option<Tensor>, EngineError> {
    few_query_attention::attend_few(
        queries,
        query_positions,
        keys,
        values,
        key_positions,
        window,
    )
}

/// See [`masked_softmax::masked_softmax`].
pub(crate) fn masked_softmax(
    scores: &Tensor,
    query_positions: &[u32],
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Tensor, EngineError> {
    masked_softmax::masked_softmax(scores, query_positions, key_positions, window)
}
