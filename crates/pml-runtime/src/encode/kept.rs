//! Compressed module states (`pmlc compile --keep F`): H2O's heavy hitters chosen at prefill. A
//! unit is encoded after its context as always, with the attention its own tokens pay each of its
//! rows summed over queries, heads and layers (query-independent: no prompt is known yet); the
//! stored state keeps a fraction of its rows — the first few (attention sinks), the last ones and
//! the heaviest of the rest, as H2O splits its budget between recent tokens and heavy hitters —
//! each at its position, so a prompt splices them as it would the whole unit and its new tokens
//! attend fewer rows.

use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, Model};

use crate::kv_budget::{DEFAULT_SINKS, KvBudget, observed_pass};
use crate::store::KeepFraction;

use super::chunked::MAX_CHUNK_TOKENS;

/// Appends `tokens` at `positions` (ascending) to `kv` as [`super::chunked::prefill_sorted`]
/// does, and returns, per appended row, the attention the appended tokens paid it.
pub fn observed_prefill(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
    kv: &mut KvCache,
) -> Result<Vec<f32>, EngineError> {
    if tokens.len() != positions.len() || positions.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(EngineError::InvalidInput(
            "an observed prefill needs one position per token, in order".into(),
        ));
    }
    let first_row = kv.len();
    let mut scores = Vec::new();
    if tokens.is_empty() {
        return Ok(scores);
    }
    let n_chunks = tokens.len().div_ceil(MAX_CHUNK_TOKENS);
    let chunk_len = tokens.len().div_ceil(n_chunks);
    for (chunk_tokens, chunk_positions) in tokens.chunks(chunk_len).zip(positions.chunks(chunk_len))
    {
        observed_pass(model, chunk_tokens, chunk_positions, kv, &mut scores)?;
    }
    Ok(scores.split_off(first_row))
}

/// The rows a compressed state keeps of a unit whose rows scored `scores`, ascending: `keep`
/// of them, half the newest, up to [`DEFAULT_SINKS`] first ones, the rest the highest scoring.
pub fn heavy_rows(scores: &[f32], keep: KeepFraction) -> Vec<usize> {
    let room = keep.rows_of(scores.len());
    let recent = room / 2;
    let sinks = DEFAULT_SINKS.min(room - recent);
    KvBudget {
        slots: room,
        recent,
        sinks,
    }
    .keep(scores, room, recent)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use pml_engine::model::tiny::random_model;
    use pml_engine::model::{Arch, WeightFormat};
    use pml_engine::testing::max_abs_diff;

    use super::*;

    #[test]
    fn keeps_sinks_the_newest_half_and_the_heaviest() {
        let mut scores = vec![0.0f32; 20];
        scores[7] = 5.0;
        scores[9] = 4.0;
        scores[12] = 3.0;
        let half = KeepFraction::new(0.5).unwrap();
        // 10 rows: 5 newest (15..20), 4 sinks, the heaviest one of the rest (7).
        assert_eq!(
            heavy_rows(&scores, half),
            vec![0, 1, 2, 3, 7, 15, 16, 17, 18, 19]
        );
        let tenth = KeepFraction::new(0.1).unwrap();
        assert_eq!(heavy_rows(&scores, tenth), vec![0, 19]);
        assert_eq!(heavy_rows(&[1.0], tenth), vec![0]);
        assert!(heavy_rows(&[], half).is_empty());
    }

    /// The observed prefill computes what the plain one does, over every chunk, and scores
    /// only the rows it appended: each query spreads one unit of attention per head and layer.
    #[test]
    fn observed_prefill_matches_the_plain_prefill() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).unwrap();
            let tokens: Vec<u32> = (0..24).map(|i| (i * 31 + 5) % 256).collect();
            let positions: Vec<u32> = (0..24).collect();
            let mut plain = model.new_kv_cache().unwrap();
            super::super::chunked::prefill_sorted(&model, &tokens, &positions, &mut plain, false)
                .unwrap();
            let mut observed = model.new_kv_cache().unwrap();
            super::super::chunked::prefill_sorted(
                &model,
                &tokens[..8],
                &positions[..8],
                &mut observed,
                false,
            )
            .unwrap();
            let scores =
                observed_prefill(&model, &tokens[8..], &positions[8..], &mut observed).unwrap();
            assert_eq!(scores.len(), 16);
            for layer in 0..model.config().n_layers {
                let keys = plain.layer(layer).unwrap().keys().unwrap();
                let observed_keys = observed.layer(layer).unwrap().keys().unwrap();
                assert!(
                    max_abs_diff(&keys, &observed_keys) < 1e-4,
                    "{arch:?} {layer}"
                );
            }
            let per_query = (model.config().n_heads * model.config().n_layers) as f32;
            let total: f32 = scores.iter().sum();
            assert!(total > 0.0 && total < 16.0 * per_query, "{arch:?}: {total}");
            assert!(observed_prefill(&model, &[1, 2], &[3], &mut observed).is_err());
        }
    }
}
