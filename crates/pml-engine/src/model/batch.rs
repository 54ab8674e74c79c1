//! Batched steps: new tokens for each of several independent sequences in a single pass, which
//! is what continuous batching in a server needs — one token of every decoding sequence and a
//! chunk of every prefilling prompt together (llama.cpp's `update_slots`, vLLM's chunked
//! prefill). The rows are stacked into one matrix for every linear layer (projections, MLP, LM
//! head), so each weight matrix is read once for the whole step instead of once per sequence —
//! decoding is memory-bound, and that is the win. Attention stays per sequence: each sequence's
//! rows write their K/V into its own [`KvCache`] and attend over that cache only, exactly as
//! [`Model::forward_layer`] does.

use candle_core::Tensor;

use super::EngineError;
use super::context::ForwardContext;
use super::transformer::{Block, Model};
use super::weights::SharedInput;
use crate::kv_cache::KvCache;

/// One sequence's share of a batched decode step: its next token, that token's position, and the
/// sequence's cache, which the step extends by one slot.
pub struct DecodeSlot<'k> {
    pub token: u32,
    pub position: u32,
    pub kv: &'k mut KvCache,
}

/// One sequence's share of a batched step: tokens to append after everything in its cache (one
/// when decoding, a chunk when prefilling), their positions, and the cache.
pub struct BatchSlot<'k> {
    pub tokens: &'k [u32],
    pub positions: &'k [u32],
    pub kv: &'k mut KvCache,
}

impl Model {
    /// Runs one token per sequence through every layer and returns their logits,
    /// `(batch.len(), vocab_size)`, row `i` for `batch[i]`. Equal (to float tolerance) to calling
    /// [`Model::forward`] on each sequence alone.
    pub fn decode_batch(&self, batch: &mut [DecodeSlot<'_>]) -> Result<Tensor, EngineError> {
        let tokens: Vec<[u32; 1]> = batch.iter().map(|slot| [slot.token]).collect();
        let positions: Vec<[u32; 1]> = batch.iter().map(|slot| [slot.position]).collect();
        let mut slots: Vec<BatchSlot<'_>> = batch
            .iter_mut()
            .zip(tokens.iter().zip(&positions))
            .map(|(slot, (tokens, positions))| BatchSlot {
                tokens,
                positions,
                kv: &mut *slot.kv,
            })
            .collect();
        self.forward_batch(&mut slots)
    }

    /// Runs every slot's tokens through every layer in one pass and returns the logits of each
    /// slot's last token, `(batch.len(), vocab_size)`, row `i` for `batch[i]`. Equal (to float
    /// tolerance) to calling [`Model::forward`] on each sequence alone.
    pub fn forward_batch(&self, batch: &mut [BatchSlot<'_>]) -> Result<Tensor, EngineError> {
        let last_only = vec![1; batch.len()];
        self.forward_batch_rows(batch, &last_only)
    }

    /// [`Self::forward_batch`] returning the logits of the last `logit_rows[i]` tokens of
    /// `batch[i]` (1 to all of them), stacked in slot order: a decoding sequence's drafted
    /// tokens are verified by the rows of its own token and the drafts before each.
    pub fn forward_batch_rows(
        &self,
        batch: &mut [BatchSlot<'_>],
        logit_rows: &[usize],
    ) -> Result<Tensor, EngineError> {
        if batch.is_empty() {
            return Err(EngineError::InvalidInput("an empty batch".to_string()));
        }
        if logit_rows.len() != batch.len() {
            return Err(EngineError::InvalidInput(format!(
                "logit rows for {} of {} batch slots",
                logit_rows.len(),
                batch.len()
            )));
        }
        if let Some((slot, &rows)) = batch
            .iter()
            .zip(logit_rows)
            .find(|(slot, rows)| **rows == 0 || **rows > slot.tokens.len())
        {
            return Err(EngineError::InvalidInput(format!(
                "{rows} logit rows of a batch slot of {} tokens",
                slot.tokens.len()
            )));
        }
        let mut contexts = Vec::with_capacity(batch.len());
        let mut tokens = Vec::new();
        for slot in batch.iter() {
            if slot.tokens.is_empty() || slot.tokens.len() != slot.positions.len() {
                return Err(EngineError::InvalidInput(format!(
                    "a batch slot of {} tokens at {} positions",
                    slot.tokens.len(),
                    slot.positions.len()
                )));
            }
            self.check_cache(slot.kv)?;
            slot.kv.check_consistent()?;
            // Taken before any layer writes: every layer appends at the same slots.
            contexts.push(ForwardContext::appending(slot.positions.to_vec(), slot.kv));
            tokens.extend_from_slice(slot.tokens);
        }
        let mut hidden = self.embed(&tokens)?;
        for (layer_idx, block) in self.blocks.iter().enumerate() {
            hidden = block.forward_batch(&hidden, layer_idx, batch, &contexts)?;
        }
        let mut rows = Vec::with_capacity(logit_rows.iter().sum());
        let mut end = 0;
        for (slot, &wanted) in batch.iter().zip(logit_rows) {
            end += slot.tokens.len();
            rows.extend(end - wanted..end);
        }
        self.logits(&hidden, &rows)
    }
}

impl Block {
    /// [`Block::forward`] for the stacked rows of several sequences: the linear layers run on
    /// all rows at once, attention on each sequence's rows against its own cache.
    fn forward_batch(
        &self,
        hidden: &Tensor,
        layer_idx: usize,
        batch: &mut [BatchSlot<'_>],
        contexts: &[ForwardContext],
    ) -> Result<Tensor, EngineError> {
        let positions: Vec<u32> = batch
            .iter()
            .flat_map(|slot| slot.positions.iter().copied())
            .collect();
        let attention = &self.attention;
        let (x, tables) = self.normed(hidden, &positions)?;
        let input = SharedInput::new(&x);
        let (keys, values) = attention.keys_values(&input, &tables)?;
        let queries = attention.queries(&input, &tables)?;

        let mut attended = Vec::with_capacity(batch.len());
        let mut row = 0;
        for (slot, context) in batch.iter_mut().zip(contexts) {
            let rows = slot.tokens.len();
            slot.kv.write(
                layer_idx,
                context.slots(),
                &keys.narrow(0, row, rows)?,
                &values.narrow(0, row, rows)?,
                context.positions(),
            )?;
            let layer_kv = slot.kv.layer(layer_idx)?;
            attended.push(attention.attend(
                &queries.narrow(0, row, rows)?,
                context.positions(),
                &layer_kv.segments()?,
                layer_kv.held_positions(),
                slot.kv.parallel_contexts(),
            )?);
            row += rows;
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

    /// Row `row` of a batch's logits equals `single`, a sequence's logits run alone, within
    /// 1e-4 of the larger of 1 and its largest magnitude.
    fn assert_row_matches(logits: &Tensor, row: usize, single: &Tensor, what: &str) {
        let diff = max_abs_diff(&logits.get(row).expect("row"), single);
        let scale = single
            .abs()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            diff <= 1e-4 * scale.max(1.0),
            "{what}: {diff} (scale {scale})"
        );
    }

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
                        assert_row_matches(
                            &logits,
                            row,
                            &single,
                            &format!("{arch:?} {format:?} step {step} row {row}"),
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
    fn a_step_of_prompt_chunks_and_decode_tokens_equals_each_sequence_alone() {
        for arch in Arch::ALL {
            let model =
                random_model(arch, 9, WeightFormat::default(), &Device::Cpu).expect("tiny model");
            // Two sequences decoding one token, one prefilling its first chunk, one its second.
            let prompts: [&[u32]; 4] = [&[3, 141, 59], &[26, 53], &[], &[7, 8, 9, 10]];
            let steps: [&[u32]; 4] = [&[5], &[6], &[11, 12, 13, 14, 15], &[16, 17, 18]];
            let mut alone = Vec::new();
            let mut batched = Vec::new();
            for prompt in prompts {
                let mut kv = model.new_kv_cache().expect("cache");
                if !prompt.is_empty() {
                    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
                    model.forward(prompt, &positions, &mut kv).expect("prefill");
                }
                alone.push(kv.clone());
                batched.push(kv);
            }
            let positions: Vec<Vec<u32>> = prompts
                .iter()
                .zip(steps)
                .map(|(prompt, step)| {
                    (prompt.len() as u32..(prompt.len() + step.len()) as u32).collect()
                })
                .collect();
            let mut slots: Vec<BatchSlot<'_>> = batched
                .iter_mut()
                .zip(steps.iter().zip(&positions))
                .map(|(kv, (tokens, positions))| BatchSlot {
                    tokens,
                    positions,
                    kv,
                })
                .collect();
            let logits = model.forward_batch(&mut slots).expect("mixed step");
            assert_eq!(logits.dims(), [4, model.config().vocab_size]);
            for (row, kv) in alone.iter_mut().enumerate() {
                let single = model
                    .forward(steps[row], &positions[row], kv)
                    .expect("alone");
                assert_row_matches(&logits, row, &single, &format!("{arch:?} row {row}"));
                assert_eq!(
                    kv.positions(),
                    batched[row].positions(),
                    "{arch:?} row {row}"
                );
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
