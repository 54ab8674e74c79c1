//! A prefill of tokens in position order, in as few forward passes as memory allows: one pass up
//! to [`MAX_CHUNK_TOKENS`] tokens, otherwise equal chunks of at most that many. Chunking is exact
//! for tokens sorted by position (a token never attends a later chunk); it only bounds the
//! `(tokens × keys)` attention scores a single pass would materialise.

use candle_core::Tensor;

use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, ForwardContext, ForwardOptions, LogitRows, Model};

/// The most tokens computed in one forward pass.
pub const MAX_CHUNK_TOKENS: usize = 2048;

/// Appends `tokens` at `positions` (non-decreasing) to `kv` and returns the logits `(vocab,)`
/// of the last token when `last_logits` is set. Chunks are equal in size, so none is small
/// enough to take a different matmul path than a single pass would (see `WeightFormat`).
pub fn prefill_sorted(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
    kv: &mut KvCache,
    last_logits: bool,
) -> Result<Option<Tensor>, EngineError> {
    if tokens.len() != positions.len() {
        return Err(EngineError::InvalidInput(format!(
            "{} tokens with {} positions",
            tokens.len(),
            positions.len()
        )));
    }
    if positions.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(EngineError::InvalidInput(
            "a chunked prefill needs tokens in position order".into(),
        ));
    }
    if tokens.is_empty() {
        return Ok(None);
    }
    let chunk_len = chunk_len(tokens.len(), MAX_CHUNK_TOKENS);
    let n_chunks = tokens.len().div_ceil(chunk_len);
    let mut logits = None;
    for (chunk_idx, (chunk_tokens, chunk_positions)) in tokens
        .chunks(chunk_len)
        .zip(positions.chunks(chunk_len))
        .enumerate()
    {
        let is_last = chunk_idx + 1 == n_chunks;
        let options = ForwardOptions {
            logits: if is_last && last_logits {
                LogitRows::Last
            } else {
                LogitRows::None
            },
            keep_layer_inputs: false,
        };
        let context = ForwardContext::appending(chunk_positions.to_vec(), kv);
        let output = model.forward_with(chunk_tokens, &context, kv, &options)?;
        if let Some(chunk_logits) = output.logits {
            logits = Some(chunk_logits.squeeze(0)?);
        }
    }
    Ok(logits)
}

/// The length of each of the equal chunks (the last one shorter at most) that `n_tokens` are
/// computed in when no pass may hold more than `max_chunk`.
pub fn chunk_len(n_tokens: usize, max_chunk: usize) -> usize {
    let n_chunks = n_tokens.div_ceil(max_chunk.max(1)).max(1);
    n_tokens.div_ceil(n_chunks).max(1)
}
