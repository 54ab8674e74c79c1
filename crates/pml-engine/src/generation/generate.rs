//! The generation loop: prefill the prompt, then decode one token at a time, streaming text as it
//! settles, until an end-of-turn token, a stop string or the token limit. The prefill is a step of
//! its own ([`Generator::generate_after`]) so cached-inference modes can run theirs (splice module
//! KV, compute only the new tokens, recompute some) and share the decoding, stopping and timing.

use std::time::{Duration, Instant};

use crate::tokenizer::Tokenizer;
use candle_core::{DType, Tensor};

use super::error::GenerateError;
use super::logits::logits_to_vec;
use super::sampling::SamplingParams;
use super::speculative::{DraftModel, Proposer, SpeculationStats};
use super::step::{DecodeState, DecodeStep, FinishReason};
use crate::kv_cache::KvCache;
use crate::model::{ForwardContext, ForwardOptions, LogitRows, Model};

/// A prompt as the model receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptInput {
    /// Tokens to compute now, after whatever the KV cache already holds; the last one's logits
    /// choose the first generated token, so there is at least one.
    pub new_tokens: Vec<u32>,
    /// Position of each new token.
    pub new_positions: Vec<u32>,
    /// Every token of the prompt in position order, cached ones included: the repetition
    /// penalty looks back over them, and the detokenizer decodes the first answer token after
    /// them. Modes that differ only in caching must pass the same sequence here.
    pub all_tokens: Vec<u32>,
}

impl PromptInput {
    /// A prompt computed in full from position 0, with nothing cached.
    pub fn uncached(tokens: Vec<u32>) -> Self {
        PromptInput {
            new_positions: (0..tokens.len() as u32).collect(),
            all_tokens: tokens.clone(),
            new_tokens: tokens,
        }
    }
}

/// Where the time went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationTimings {
    /// The prompt's forward pass (for cached modes: everything their prefill step does).
    pub prefill: Duration,
    /// Prefill plus choosing the first token: what a user waits before the answer starts.
    pub time_to_first_token: Duration,
    /// For each token after the first: its forward pass of one token and its sampling.
    pub decode_steps: Vec<Duration>,
}

impl GenerationTimings {
    pub fn decode_total(&self) -> Duration {
        self.decode_steps.iter().sum()
    }

    /// Mean time per decoded token in milliseconds, `None` before any decode step.
    pub fn decode_ms_per_token(&self) -> Option<f64> {
        (!self.decode_steps.is_empty())
            .then(|| self.decode_total().as_secs_f64() * 1e3 / self.decode_steps.len() as f64)
    }

    /// Decoding speed in tokens per second (prefill excluded), `None` before any decode step.
    pub fn decode_tokens_per_second(&self) -> Option<f64> {
        let total = self.decode_total().as_secs_f64();
        (!self.decode_steps.is_empty() && total > 0.0)
            .then(|| self.decode_steps.len() as f64 / total)
    }
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Everything streamed, concatenated: the answer up to (not including) a stop string.
    pub text: String,
    /// Generated tokens, without the end-of-turn token that ended generation; with a stop string,
    /// up to the token that completed it.
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    pub timings: GenerationTimings,
    /// Drafted and accepted tokens (all zero without speculation).
    pub speculation: SpeculationStats,
}

/// Runs generation with one model and its tokenizer.
pub struct Generator<'a> {
    model: &'a Model,
    tokenizer: &'a dyn Tokenizer,
}

impl<'a> Generator<'a> {
    pub fn new(model: &'a Model, tokenizer: &'a dyn Tokenizer) -> Self {
        Generator { model, tokenizer }
    }

    /// Computes `prompt.new_tokens` after whatever `kv` holds (nothing, for a plain prompt), then
    /// decodes. `on_text` receives each settled piece of text as it appears.
    pub fn generate(
        &self,
        kv: &mut KvCache,
        prompt: &PromptInput,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, GenerateError> {
        self.generate_prompt(kv, prompt, params, on_text, None)
    }

    /// [`Self::generate`] of a prompt computed in full (nothing cached), drafting with
    /// `draft_model` as `params.speculation` says (its own cache prefilled with the prompt).
    pub fn generate_with_draft_model(
        &self,
        kv: &mut KvCache,
        prompt: &PromptInput,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        draft_model: &Model,
    ) -> Result<Generation, GenerateError> {
        if !kv.is_empty() || prompt.new_tokens.len() != prompt.all_tokens.len() {
            return Err(GenerateError::InvalidPrompt(
                "a draft model prefills the whole prompt: the cache must start empty".into(),
            ));
        }
        self.generate_prompt(kv, prompt, params, on_text, Some(draft_model))
    }

    fn generate_prompt(
        &self,
        kv: &mut KvCache,
        prompt: &PromptInput,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        draft_model: Option<&Model>,
    ) -> Result<Generation, GenerateError> {
        if prompt.new_tokens.is_empty() {
            return Err(GenerateError::InvalidPrompt(
                "no new tokens: the last prompt token must be computed to get its logits".into(),
            ));
        }
        if prompt.new_tokens.len() != prompt.new_positions.len() {
            return Err(GenerateError::InvalidPrompt(format!(
                "{} new tokens with {} positions",
                prompt.new_tokens.len(),
                prompt.new_positions.len()
            )));
        }
        let forward = |model: &Model, kv: &mut KvCache| {
            Ok(model.forward(&prompt.new_tokens, &prompt.new_positions, kv)?)
        };
        let draft = draft_model.map(|draft_model| DraftModel {
            model: draft_model,
            prefill: Box::new(move |_| {
                let mut draft_kv = draft_model.new_kv_cache()?;
                forward(draft_model, &mut draft_kv)?;
                Ok(draft_kv)
            }),
            kept: None,
        });
        let model = self.model;
        self.generate_after_with_draft(
            kv,
            &prompt.all_tokens,
            params,
            on_text,
            |kv| forward(model, kv),
            draft,
        )
    }

    /// Decodes after a prefill of the caller's making: `prefill` fills `kv` with the whole prompt
    /// and returns the last prompt token's logits `(vocab,)`; it is timed as the prefill.
    /// Decoding continues at one past the highest position in `kv`, with the model's own passes
    /// (drafted tokens verified beside each step's token, as `params.speculation` says).
    /// `prompt_tokens` is every prompt token in position order (see [`PromptInput::all_tokens`]).
    pub fn generate_after(
        &self,
        kv: &mut KvCache,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        prefill: impl FnOnce(&mut KvCache) -> Result<Tensor, GenerateError>,
    ) -> Result<Generation, GenerateError> {
        self.generate_after_with_draft(kv, prompt_tokens, params, on_text, prefill, None)
    }

    /// [`Self::generate_after`] drafting with `draft` where `params.speculation` asks for a
    /// draft model (its prefill runs at the first draft, after the first token).
    pub fn generate_after_with_draft(
        &self,
        kv: &mut KvCache,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        prefill: impl FnOnce(&mut KvCache) -> Result<Tensor, GenerateError>,
        draft: Option<DraftModel<'_>>,
    ) -> Result<Generation, GenerateError> {
        self.decode(
            kv,
            prompt_tokens,
            params,
            on_text,
            prefill,
            DecodePass::Model,
            draft,
        )
    }

    /// [`Self::generate_after`] with each decoding step's pass of the caller's making too: `decode`
    /// runs `token` at `position` after what `kv` holds and returns its logits `(vocab,)` (a KV
    /// budget watches the attention and evicts slots there). One token per pass: nothing is
    /// drafted.
    pub fn generate_stepped(
        &self,
        kv: &mut KvCache,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        prefill: impl FnOnce(&mut KvCache) -> Result<Tensor, GenerateError>,
        mut decode: impl FnMut(&mut KvCache, u32, u32) -> Result<Tensor, GenerateError>,
    ) -> Result<Generation, GenerateError> {
        self.decode(
            kv,
            prompt_tokens,
            params,
            on_text,
            prefill,
            DecodePass::Stepped(&mut decode),
            None,
        )
    }

    /// The decoding loop: each pass runs the step's token (and any drafts after it), then the
    /// sequence's state takes the rows' logits in order while they agree with the drafts.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        kv: &mut KvCache,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
        prefill: impl FnOnce(&mut KvCache) -> Result<Tensor, GenerateError>,
        mut pass: DecodePass<'_>,
        draft: Option<DraftModel<'_>>,
    ) -> Result<Generation, GenerateError> {
        let mut output = StreamedOutput {
            text: String::new(),
            on_text,
        };
        let mut emit = |piece: &str| output.emit(piece);

        let prefill_start = Instant::now();
        let logits = logits_to_vec(&prefill(kv)?)?;
        let prefill_time = prefill_start.elapsed();
        let next_position = kv
            .positions()
            .iter()
            .max()
            .map(|&position| position + 1)
            .ok_or_else(|| {
                GenerateError::InvalidPrompt("the prefill left the KV cache empty".into())
            })?;
        let mut state = DecodeState::new(self.tokenizer, prompt_tokens, params, next_position)?;
        let mut proposer = match pass {
            DecodePass::Model => Proposer::new(
                params.speculation,
                prompt_tokens,
                draft,
                self.tokenizer.vocab_size(),
            )?,
            DecodePass::Stepped(_) => None,
        };
        let mut speculation = SpeculationStats::default();

        let mut step = state.accept(&logits, &mut emit)?;
        let mut timings = GenerationTimings {
            prefill: prefill_time,
            time_to_first_token: prefill_start.elapsed(),
            ..GenerationTimings::default()
        };
        let finish_reason = loop {
            let (token, position) = match step {
                DecodeStep::Finished(reason) => break reason,
                DecodeStep::Continue { token, position } => (token, position),
            };
            let pass_start = Instant::now();
            // Rows the answer's length limit leaves after this step's own.
            let room = params
                .max_tokens
                .saturating_sub(state.token_ids().len() + 1);
            let drafts = match &mut proposer {
                Some(proposer) => {
                    proposer.push(token, position);
                    proposer.draft(room)?
                }
                None => Vec::new(),
            };
            let first_slot = kv.len();
            let rows = match &mut pass {
                DecodePass::Model if drafts.is_empty() => {
                    vec![logits_to_vec(&self.model.forward(
                        &[token],
                        &[position],
                        kv,
                    )?)?]
                }
                DecodePass::Model => self.verify_pass(kv, token, position, &drafts)?,
                DecodePass::Stepped(decode) => vec![logits_to_vec(&decode(kv, token, position)?)?],
            };
            if let Some(proposer) = &mut proposer {
                proposer.record_pass(rows.len(), pass_start.elapsed().as_secs_f64());
            }

            let verified = state.accept_drafted(&rows, &drafts, &mut emit)?;
            step = verified.step;
            if let Some(proposer) = &mut proposer {
                proposer.verdict(&drafts, verified.accepted, verified.rejected(drafts.len()));
            }
            if !drafts.is_empty() {
                // The step's token and the accepted drafts keep their slots.
                kv.rollback(first_slot + 1 + verified.accepted);
            }
            let (accepted, sampled) = (verified.accepted, verified.sampled);
            speculation.passes += 1;
            speculation.drafted += drafts.len();
            speculation.accepted += accepted;
            let per_token = pass_start.elapsed() / sampled as u32;
            timings
                .decode_steps
                .extend(std::iter::repeat_n(per_token, sampled));
        };
        let token_ids = state.into_token_ids();
        Ok(Generation {
            text: output.text,
            token_ids,
            finish_reason,
            timings,
            speculation,
        })
    }

    /// One pass over the step's `token` at `position` and `drafts` after it; the logits of
    /// every row, f32.
    fn verify_pass(
        &self,
        kv: &mut KvCache,
        token: u32,
        position: u32,
        drafts: &[u32],
    ) -> Result<Vec<Vec<f32>>, GenerateError> {
        let mut tokens = Vec::with_capacity(drafts.len() + 1);
        tokens.push(token);
        tokens.extend_from_slice(drafts);
        let positions: Vec<u32> = (position..position + tokens.len() as u32).collect();
        let context = ForwardContext::appending(positions, kv);
        let options = ForwardOptions {
            logits: LogitRows::All,
            ..ForwardOptions::default()
        };
        let logits = self
            .model
            .forward_with(&tokens, &context, kv, &options)?
            .logits
            .ok_or_else(|| GenerateError::InvalidPrompt("a pass returned no logits".into()))?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }
}

/// How a decoding step's pass runs.
enum DecodePass<'f> {
    /// The model's own forward, over the step's token and any drafts.
    Model,
    /// The caller's pass of one token.
    Stepped(&'f mut dyn FnMut(&mut KvCache, u32, u32) -> Result<Tensor, GenerateError>),
}

/// Text sent to the caller's callback, and kept.
struct StreamedOutput<'c> {
    text: String,
    on_text: &'c mut dyn FnMut(&str),
}

impl StreamedOutput<'_> {
    fn emit(&mut self, piece: &str) {
        if !piece.is_empty() {
            self.text.push_str(piece);
            (self.on_text)(piece);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::test_tokenizer::{ByteTokenizer, letter_tokenizer, tiny_model};

    const PROMPT: [u32; 6] = [3, 141, 59, 26, 53, 58];

    fn greedy(max_tokens: usize) -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..SamplingParams::default()
        }
    }

    fn run(
        model: &Model,
        tokenizer: &ByteTokenizer,
        params: &SamplingParams,
    ) -> (Generation, String) {
        let mut kv = model.new_kv_cache().unwrap();
        let mut streamed = String::new();
        let generation = Generator::new(model, tokenizer)
            .generate(
                &mut kv,
                &PromptInput::uncached(PROMPT.to_vec()),
                params,
                &mut |piece| streamed.push_str(piece),
            )
            .unwrap();
        (generation, streamed)
    }

    /// Greedy decoding written out by hand: forward, argmax, append, repeat.
    fn step_manually(model: &Model, n_tokens: usize) -> Vec<u32> {
        let mut kv = model.new_kv_cache().unwrap();
        let positions: Vec<u32> = (0..PROMPT.len() as u32).collect();
        let mut logits = model.forward(&PROMPT, &positions, &mut kv).unwrap();
        let mut tokens = Vec::new();
        for position in PROMPT.len() as u32.. {
            let token = logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
            tokens.push(token);
            if tokens.len() == n_tokens {
                return tokens;
            }
            logits = model.forward(&[token], &[position], &mut kv).unwrap();
        }
        unreachable!("the loop returns after n_tokens")
    }

    #[test]
    fn greedy_generation_equals_manual_stepping_and_repeats() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let (generation, streamed) = run(&model, &tokenizer, &greedy(16));
        assert_eq!(generation.token_ids, step_manually(&model, 16));
        assert_eq!(generation.finish_reason, FinishReason::Length);
        assert_eq!(generation.text, streamed);
        assert_eq!(
            generation.text,
            tokenizer.decode(&generation.token_ids).unwrap()
        );
        let (again, _) = run(&model, &tokenizer, &greedy(16));
        assert_eq!(again.token_ids, generation.token_ids);
    }

    #[test]
    fn max_tokens_is_respected() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let (generation, _) = run(&model, &tokenizer, &greedy(5));
        assert_eq!(generation.token_ids.len(), 5);
        assert_eq!(generation.finish_reason, FinishReason::Length);
        assert_eq!(generation.timings.decode_steps.len(), 4);
        assert!(generation.timings.time_to_first_token >= generation.timings.prefill);
        let (nothing, _) = run(&model, &tokenizer, &greedy(0));
        assert_eq!(nothing.token_ids, Vec::<u32>::new());
        assert_eq!(nothing.text, "");
    }

    #[test]
    fn an_end_of_turn_token_ends_generation() {
        let model = tiny_model();
        let expected = step_manually(&model, 16);
        // The first token that did not appear before it, so generation stops exactly there.
        let stop_index = (1..expected.len())
            .find(|&index| !expected[..index].contains(&expected[index]))
            .expect("a random model does not repeat one token 16 times");
        let tokenizer = letter_tokenizer().with_eos_tokens(&[expected[stop_index]]);
        let (generation, _) = run(&model, &tokenizer, &greedy(16));
        assert_eq!(generation.token_ids, expected[..stop_index]);
        assert_eq!(generation.finish_reason, FinishReason::Eos);
        assert_eq!(
            generation.text,
            tokenizer.decode(&expected[..stop_index]).unwrap()
        );
    }

    #[test]
    fn a_stop_string_ends_generation_before_it() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let (full, _) = run(&model, &tokenizer, &greedy(16));
        let stop = full.text[5..7].to_string();
        let kept = &full.text[..full.text.find(&stop).unwrap()];
        let params = SamplingParams {
            stop: vec![stop],
            ..greedy(16)
        };
        let (generation, streamed) = run(&model, &tokenizer, &params);
        assert_eq!(generation.finish_reason, FinishReason::Stop);
        assert_eq!(generation.text, kept);
        assert_eq!(streamed, kept);
        assert!(generation.token_ids.len() < 16);
    }

    #[test]
    fn a_prefilled_cache_continues_like_a_full_prefill() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let (full, _) = run(&model, &tokenizer, &greedy(10));
        let mut kv = model.new_kv_cache().unwrap();
        model.forward(&PROMPT[..4], &[0, 1, 2, 3], &mut kv).unwrap();
        let prompt = PromptInput {
            new_tokens: PROMPT[4..].to_vec(),
            new_positions: vec![4, 5],
            all_tokens: PROMPT.to_vec(),
        };
        let generation = Generator::new(&model, &tokenizer)
            .generate(&mut kv, &prompt, &greedy(10), &mut |_| {})
            .unwrap();
        assert_eq!(generation.token_ids, full.token_ids);
        // Decoding continued at one past the highest prompt position.
        let expected_positions: Vec<u32> = (0..PROMPT.len() as u32 + 9).collect();
        assert_eq!(kv.positions(), expected_positions);
    }

    #[test]
    fn sampling_with_a_seed_repeats() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 3,
            max_tokens: 12,
            ..SamplingParams::default()
        };
        let (first, _) = run(&model, &tokenizer, &params);
        let (second, _) = run(&model, &tokenizer, &params);
        assert_eq!(first.token_ids, second.token_ids);
    }

    #[test]
    fn an_empty_prompt_is_an_error() {
        let model = tiny_model();
        let tokenizer = letter_tokenizer();
        let mut kv = model.new_kv_cache().unwrap();
        let result = Generator::new(&model, &tokenizer).generate(
            &mut kv,
            &PromptInput::uncached(Vec::new()),
            &greedy(4),
            &mut |_| {},
        );
        assert!(matches!(result, Err(GenerateError::InvalidPrompt(_))));
    }
}
