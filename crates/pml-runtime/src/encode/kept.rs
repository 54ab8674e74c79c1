//! Compressed module states (`pmlc compile --keep F`): a unit's heavy hitters, chosen once, when
//! it is encoded, without knowing the prompts that will import it. The unit is encoded after its
//! context as always; then its tokens are read again after it, and each of its rows scores the
//! attention the second reading pays it, summed over queries, heads and layers ([`reread_scores`],
//! KVzip's query-agnostic score). The stored state keeps a fraction of the rows — the first few
//! (attention sinks) and the highest scoring — each at its position, so a prompt splices them as
//! it would the whole unit and its new tokens attend fewer rows.

use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, Model};

use crate::attention_mass::observed_pass;
use crate::kv_budget::{DEFAULT_SINKS, KvBudget};
use crate::store::KeepFraction;

use super::chunked::MAX_CHUNK_TOKENS;

/// Appends `tokens` at `positions` (ascending) to `kv` as [`super::chunked::prefill_sorted`]
/// does, and returns the attention the appended tokens paid each slot of the cache, summed over
/// their queries, heads and layers.
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
    Ok(scores)
}

/// How much the model draws on each row of a unit just appended to `kv` (its last
/// `tokens.len()` rows) when it reads the unit again: the unit's tokens run once more after it
/// (at the next positions, appended to `kv`: take the unit's rows out first) and the attention
/// they pay each of its rows is summed. Every row is seen by every query of the second reading — unlike the first reading's
/// attention, which favours early rows (more later tokens see them) — and copying a text attends
/// to the rows that carry it (KVzip's context-reconstruction score).
pub fn reread_scores(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
    kv: &mut KvCache,
) -> Result<Vec<f32>, EngineError> {
    let unit_end = kv.len();
    let first_row = kv.len().checked_sub(tokens.len()).ok_or_else(|| {
        EngineError::InvalidInput("the unit's rows are not all in the cache".into())
    })?;
    let Some(&last) = positions.last() else {
        return Ok(Vec::new());
    };
    // These positions may pass the model's context (a long module near its end): every family
    // here rotates keys and queries by position (RoPE), so the scores see only distances, at
    // most twice the module's length, never an absolute position. Overflow is refused.
    let again: Vec<u32> = (1..=tokens.len() as u32)
        .map(|offset| last.checked_add(offset))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            EngineError::InvalidInput("the second reading passes position 2^32".into())
        })?;
    let scores = observed_prefill(model, tokens, &again, kv)?;
    Ok(scores[first_row..unit_end].to_vec())
}

/// The rows a compressed state keeps of a unit whose rows scored `scores`, ascending: `keep`
/// of them, up to [`DEFAULT_SINKS`] first ones and the rest the highest scoring. With the
/// scores, what `store::key::KEPT_ROWS_SELECTION` names: change it with either.
pub fn heavy_rows(scores: &[f32], keep: KeepFraction) -> Vec<usize> {
    let room = keep.rows_of(scores.len());
    let sinks = DEFAULT_SINKS.min(room);
    KvBudget {
        slots: room,
        recent: 0,
        sinks,
    }
    .keep(scores, room, 0)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use pml_engine::model::tiny::random_model;
    use pml_engine::model::{Arch, WeightFormat};
    use pml_engine::testing::max_abs_diff;

    use super::super::chunked::prefill_sorted;
    use super::*;

    #[test]
    fn keeps_the_sinks_and_the_heaviest() {
        let mut scores = vec![0.0f32; 20];
        scores[7] = 5.0;
        scores[9] = 4.0;
        scores[12] = 3.0;
        let half = KeepFraction::new(0.5).unwrap();
        // 10 rows: 4 sinks, the three heaviest, then the newest among equal scores.
        assert_eq!(
            heavy_rows(&scores, half),
            vec![0, 1, 2, 3, 7, 9, 12, 17, 18, 19]
        );
        let tenth = KeepFraction::new(0.1).unwrap();
        assert_eq!(heavy_rows(&scores, tenth), vec![0, 1]);
        assert_eq!(heavy_rows(&[1.0], tenth), vec![0]);
        assert!(heavy_rows(&[], half).is_empty());
    }

    /// The observed prefill computes what the plain one does, over every chunk, and each query
    /// spreads one unit of attention per head and layer over the slots; the second reading of a
    /// unit scores the unit's rows only, from queries that see all of them.
    #[test]
    fn observed_prefill_matches_the_plain_prefill_and_rereads_score_the_unit() {
        for arch in Arch::ALL {
            let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).unwrap();
            let tokens: Vec<u32> = (0..24).map(|i| (i * 31 + 5) % 256).collect();
            let positions: Vec<u32> = (0..24).collect();
            let mut plain = model.new_kv_cache().unwrap();
            prefill_sorted(&model, &tokens, &positions, &mut plain, false).unwrap();
            let mut observed = model.new_kv_cache().unwrap();
            prefill_sorted(&model, &tokens[..8], &positions[..8], &mut observed, false).unwrap();
            let scores =
                observed_prefill(&model, &tokens[8..], &positions[8..], &mut observed).unwrap();
            assert_eq!(scores.len(), 24);
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
            assert!((total - 16.0 * per_query).abs() < 1e-2, "{arch:?}: {total}");
            assert!(observed_prefill(&model, &[1, 2], &[3], &mut observed).is_err());

            // The last 16 rows read again: 16 more rows, each of the unit's scored.
            let reread = reread_scores(&model, &tokens[8..], &positions[8..], &mut plain).unwrap();
            assert_eq!(plain.len(), 40);
            assert_eq!(reread.len(), 16);
            assert!(
                reread.iter().all(|&score| score > 0.0),
                "{arch:?}: {reread:?}"
            );
            let total: f32 = reread.iter().sum();
            assert!(total < 16.0 * per_query, "{arch:?}: {total}");
            assert!(
                reread_scores(
                    &model,
                    &tokens,
                    &[0; 24],
                    &mut model.new_kv_cache().unwrap()
                )
                .is_err()
            );
        }
    }
}
