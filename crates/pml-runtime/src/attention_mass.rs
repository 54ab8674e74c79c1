//! How much attention each slot of a cache receives, as an observer of the engine's layer step,
//! summed over the observed queries, heads and layers: blend's ranking of cached rows (the
//! attention the new tokens pay them, `--select attention` and its variants), H2O's heavy-hitter
//! scores (`kv_budget`) and the second reading that scores a compressed module's rows
//! (`encode::kept`). The model only shows its attention ([`AttentionObserver`]); what to sum, and
//! weighted how, is the caller's business.

use candle_core::Tensor;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{AttentionObserver, AttentionView, EngineError, ForwardContext, Model};

/// What [`AttentionMass`] adds to each slot's entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MassWeighting {
    /// The softmax weights the queries give the slot, summed over the queries and heads.
    #[default]
    Weights,
    /// Each of those weights times the norm of the slot's value vector in the weight's KV head:
    /// how much the slot adds to the attention output, not only how much it is looked at.
    ValueNorm,
}

/// Adds to `mass[slot]` the attention each observed step's queries pay `slot`.
pub struct AttentionMass<'m> {
    pub mass: &'m mut [f32],
    pub weighting: MassWeighting,
}

impl AttentionObserver for AttentionMass<'_> {
    fn observe(&mut self, attention: &AttentionView<'_>) -> Result<(), EngineError> {
        if self.mass.len() < attention.n_slots() {
            return Err(EngineError::InvalidInput(format!(
                "attention mass has {} entries for a layer of {} slots",
                self.mass.len(),
                attention.n_slots()
            )));
        }
        // (n_kv_heads, 1, n_slots): broadcast over each KV head's rows of weights.
        let value_norms = match self.weighting {
            MassWeighting::Weights => None,
            MassWeighting::ValueNorm => Some(value_norms(attention)?),
        };
        attention.for_each_weights(|weights| {
            let weights = match &value_norms {
                Some(norms) => weights.broadcast_mul(norms)?,
                None => weights.clone(),
            };
            let summed = weights.sum(1)?.sum(0)?.to_vec1::<f32>()?;
            for (total, value) in self.mass.iter_mut().zip(summed) {
                *total += value;
            }
            Ok(())
        })
    }
}

/// Appends `tokens` at `positions` to `kv` in one pass of every layer and adds to `scores[slot]`
/// (grown to the cache's new length) the attention each slot received from them, summed over
/// queries, heads and layers; returns the last layer's output.
pub(crate) fn observed_pass(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
    kv: &mut KvCache,
    scores: &mut Vec<f32>,
) -> Result<candle_core::Tensor, EngineError> {
    let context = ForwardContext::appending(positions.to_vec(), kv);
    scores.resize(kv.len() + tokens.len(), 0.0);
    observed_layers(model, tokens, &context, kv, scores)
}

/// One pass of every layer for `tokens` in `context` (their slots may be ones `kv` holds
/// already, rewritten with what they held), adding to `scores[slot]` the attention each slot
/// received from them; returns the last layer's output. `scores` covers every slot the pass
/// reads.
pub(crate) fn observed_layers(
    model: &Model,
    tokens: &[u32],
    context: &ForwardContext,
    kv: &mut KvCache,
    scores: &mut [f32],
) -> Result<candle_core::Tensor, EngineError> {
    let mut hidden = model.embed(tokens)?;
    for layer_idx in 0..model.config().n_layers {
        // A sliding-window layer a splice left slots out of (they are outside every later
        // query's window) has no weights for them: its attention is not counted, the other
        // layers' is.
        if kv.layer(layer_idx)?.first_held() > 0 {
            hidden = model.forward_layer(layer_idx, &hidden, context, kv)?;
            continue;
        }
        let mut mass = AttentionMass {
            mass: scores,
            weighting: MassWeighting::Weights,
        };
        hidden = model.forward_layer_observed(layer_idx, &hidden, context, kv, &mut mass)?;
    }
    Ok(hidden)
}

fn value_norms(attention: &AttentionView<'_>) -> Result<Tensor, EngineError> {
    Ok(attention
        .values()
        .to_dtype(attention.dtype())?
        .sqr()?
        .sum(2)?
        .sqrt()?
        .t()?
        .unsqueeze(1)?
        .contiguous()?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use pml_engine::model::tiny::random_model;
    use pml_engine::model::{Arch, ForwardContext, ForwardOptions, LogitRows, WeightFormat};

    use super::*;

    /// A sum of softmax rows (one unit per query and head, none on later keys); weighted by value
    /// norms, each slot's mass lies between its plain mass times the smallest and the largest
    /// norm of its values over the KV heads.
    #[test]
    fn mass_sums_softmax_rows_and_value_norms_weigh_them() {
        for arch in Arch::ALL {
            let model = random_model(arch, 7, WeightFormat::F32, &Device::Cpu).unwrap();
            let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 11) % 256).collect();
            let positions: Vec<u32> = (0..12).collect();
            let mut kv = model.new_kv_cache().unwrap();
            let context = ForwardContext::appending(positions.clone(), &kv);
            let options = ForwardOptions {
                logits: LogitRows::None,
                keep_layer_inputs: true,
            };
            let output = model
                .forward_with(&tokens, &context, &mut kv, &options)
                .unwrap();
            let n_heads = model.config().n_heads as f32;
            // Rows 2 and 3 run their layer again over the whole prefill's cache.
            let context = ForwardContext::new(positions[2..4].to_vec(), vec![2, 3]).unwrap();
            for (layer, input) in output.layer_inputs.iter().enumerate() {
                let queries = input.narrow(0, 2, 2).unwrap();
                let mass_of = |slots: usize, weighting| {
                    let mut mass = vec![0f32; slots];
                    let mut observer = AttentionMass {
                        mass: &mut mass,
                        weighting,
                    };
                    model
                        .forward_layer_observed(
                            layer,
                            &queries,
                            &context,
                            &mut kv.clone(),
                            &mut observer,
                        )
                        .map(|_| mass)
                };
                let mass = mass_of(12, MassWeighting::Weights).unwrap();
                assert!(
                    mass_of(11, MassWeighting::Weights).is_err(),
                    "a mass shorter than the layer's 12 slots is refused"
                );
                let total: f32 = mass.iter().sum();
                assert!(
                    (total - 2.0 * n_heads).abs() < 1e-3,
                    "{arch:?} {layer}: {total}"
                );
                assert!(mass[4..].iter().all(|&value| value == 0.0));

                let valued = mass_of(12, MassWeighting::ValueNorm).unwrap();
                let norms = kv
                    .layer(layer)
                    .and_then(|layer| layer.values())
                    .unwrap()
                    .to_dtype(DType::F32)
                    .and_then(|values| values.sqr()?.sum(2)?.sqrt()?.to_vec2::<f32>())
                    .unwrap();
                for slot in 0..4 {
                    let lowest = norms[slot].iter().copied().fold(f32::INFINITY, f32::min);
                    let highest = norms[slot].iter().copied().fold(0f32, f32::max);
                    let (low, high) = (mass[slot] * lowest, mass[slot] * highest);
                    assert!(
                        valued[slot] >= low * (1.0 - 1e-4) && valued[slot] <= high * (1.0 + 1e-4),
                        "{arch:?} layer {layer} slot {slot}: {} not in [{low}, {high}]",
                        valued[slot]
                    );
                }
                assert_ne!(
                    valued, mass,
                    "{arch:?} layer {layer}: the norms are not all 1"
                );
                assert!(valued[4..].iter().all(|&value| value == 0.0));
            }
        }
    }
}
