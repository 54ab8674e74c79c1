//! Batched decoding: one new token for each of several independent sequences in a single pass,
//! which is what continuous batching in a server needs. The tokens are stacked into one matrix for
//! every linear layer (projections, MLP, LM head), so each weight matrix is read once for the
//! whole batch instead of once per sequence — decoding is memory-bound, and that is the win.
//! Attention stays per sequence: each token writes its K/V into its own [`KvCache`] and attends
//! over that cache only, exactly as [`Model::forward_layer`] does.

use candle_core::Tensor;

use super::EngineError;
use super::context::ForwardContext;
use super::transformer::{Block, Model};
use crate::kv_cache::KvCache;

/// One sequence's share of a batched decode step: its next token, that token's position, and the
/// sequence's cache, which the step extends by one slot.
pub struct DecodeSlot<'k> {
    pub token: u32,
    pub position: u32,
    pub kv: &'k mut KvCache,
}

impl Model {
    /// Runs one token per sequence through every layer and returns their logits,
    /// `(batch.len(), vocab_size)`, row `i` for `batch[i]`. Equal (to float tolerance) to calling
    /// [`Model::forward`] on each sequence alone.
    pub fn decode_batch(&self, batch: &mut [DecodeSlot<'_>]) -> Result<Tensor, EngineError> {
        if batch.is_empty() {
            return Err(EngineError::InvalidInput(
                "an empty decode batch".to_string(),
            ));
        }
        let mut contexts = Vec::with_capacity(batch.len());
        for slot in batch.iter() {
            self.check_cache(slot.kv)?;
            slot.kv.check_consistent()?;
            // Taken before any layer writes: every layer appends at the same slot.
            contexts.push(ForwardContext::appending(vec![slot.position], slot.kv));
        }
        let tokens: Vec<u32> = batch.iter().map(|slot| slot.token).collect();
        let mut hidden = self.embed(&tokens)?;
        for (layer_idx, block) in self.blocks.iter().enumerate() {
            hidden = block.forward_batch(&hidden, layer_idx, batch, &contexts)?;
        }
        let rows: Vec<usize> = (0..batch.len()).collect();
        self.logits(&hidden, &rows)
    }
}

impl Block {
    /// [`Block::forward`] for one token of each sequence: the linear layers run on the stacked
    /// rows, attention runs row by row against each row's own cache.
    fn forward_batch(
        &self,
        hidden: &Tensor,
        layer_idx: usize,
        batch: &mut [DecodeSlot<'_>],
        contexts: &[ForwardContext],
    ) -> Result<Tensor, EngineError> {
        let positions: Vec<u32> = batch.iter().map(|slot| slot.position).collect();
        let attention = &self.attention;
        let (x, tables) = self.normed(hidden, &positions)?;
        let (keys, values) = attention.keys_values(&x, &tables)?;
        let queries = attention.queries(&x, &tables)?;

        let mut attended = Vec::with_capacity(batch.len());
        for (row, (slot, context)) in batch.iter_mut().zip(contexts).enumerate() {
            slot.kv.write(
                layer_idx,
                context.slots(),
                &keys.narrow(0, row, 1)?,
                &values.narrow(0, row, 1)?,
                context.positions(),
            )?;
            let layer_kv = slot.kv.layer(layer_idx)?;
            attended.push(attention.attend(
                &queries.narrow(0, row, 1)?,
                context.positions(),
                &layer_kv.keys()?,
                &layer_kv.values()?,
                layer_kv.held_positions(),
            )?);
        }
        let attended = Tensor::cat(&attended, 0)?;

        // The rest of the layer is row-wise, so it runs on the stacked rows exactly as
        // `Block::forward` runs it on a sequence's tokens.
        self.finish(hidden, &attended)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::model::tiny::random_model;
    use crate::model::{Arch, WeightFormat};
    use crate::testing::max_abs_diff;

    /// Prompts of different lengths, so the sequences sit at different positions and cache
    /// lengths (and, for Gemma's local layers, on both sides of the sliding window).
    const PROMPTS: [&[u32]; 3] = [&[3, 141, 59], &[26, 53, 58, 97, 93, 23, 84, 62, 64], &[7]];
    const STEPS: usize = 5;

    #[test]
    fn batched_decode_equals_one_sequence_at_a_time() {
        for arch in Arch::ALL {
            for format in [WeightFormat::F32, WeightFormat::default()] {
                let model = random_model(arch, 5, format, &Device::Cpu).expect("tiny model");
                let mut alone = Vec::new();
                let mut batched = Vec::new();
                for prompt in PROMPTS {
                    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
                    let mut kv = model.new_kv_cache().expect("cache");
                    model.forward(prompt, &positions, &mut kv).expect("prefill");
                    alone.push(kv.clone());
                    batched.push(kv);
                }
                for step in 0..STEPS {
                    let tokens: Vec<u32> = (0..PROMPTS.len())
                        .map(|i| (17 * step + 31 * i) as u32 % 256)
                        .collect();
                    let positions: Vec<u32> = PROMPTS
                        .iter()
                        .map(|prompt| (prompt.len() + step) as u32)
                        .collect();
                    let mut slots: Vec<DecodeSlot<'_>> = batched
                        .iter_mut()
                        .zip(&tokens)
                        .zip(&positions)
                        .map(|((kv, &token), &position)| DecodeSlot {
                            token,
                            position,
                            kv,
                        })
                        .collect();
                    let logits = model.decode_batch(&mut slots).expect("batched step");
                    assert_eq!(logits.dims(), [PROMPTS.len(), model.config().vocab_size]);
                    for (row, kv) in alone.iter_mut().enumerate() {
                        let single = model
                            .forward(&[tokens[row]], &[positions[row]], kv)
                            .expect("single step");
                        let row_logits = logits.get(row).expect("row");
                        let diff = max_abs_diff(&row_logits, &single);
                        let scale = single
                            .abs()
                            .unwrap()
                            .max(0)
                            .unwrap()
                            .to_scalar::<f32>()
                            .unwrap();
                        assert!(
                            diff <= 1e-4 * scale.max(1.0),
                            "{arch:?} {format:?} step {step} row {row}: {diff} (scale {scale})"
                        );
                    }
                }
                for (a, b) in alone.iter().zip(&batched) {
                    assert_eq!(a.positions(), b.positions());
                }
            }
        }
    }

    #[test]
    fn an_empty_batch_is_an_error() {
        let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &Device::Cpu).expect("model");
        assert!(matches!(
            model.decode_batch(&mut []),
            Err(EngineError::InvalidInput(_))
        ));
    }
}
