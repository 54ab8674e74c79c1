//! One sequence's decoding state, advanced one sampled token at a time: sampler, stop strings,
//! incremental detokenizer and the answer's length limit. [`super::Generator`] drives it for one
//! sequence with a forward pass per token; a server's scheduler drives many of them from one
//! batched pass, so both stop, stream and count tokens identically.

use crate::tokenizer::Tokenizer;

use super::detokenizer::IncrementalDetokenizer;
use super::error::GenerateError;
use super::sampling::{Sampler, SamplingParams};
use super::stop::StopStringMatcher;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence or end-of-turn token.
    Eos,
    /// A stop string appeared in the text.
    Stop,
    /// `max_tokens` tokens were generated.
    Length,
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        })
    }
}

/// What to do after a token was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeStep {
    /// Run `token` at `position` through the model; its logits choose the next token.
    Continue { token: u32, position: u32 },
    /// Generation is over; all of the text has been emitted.
    Finished(FinishReason),
}

/// What [`DecodeState::accept_drafted`] made of a pass's rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The step after the last row taken: the token to run next, or the end.
    pub step: DecodeStep,
    /// Drafts kept: the first `accepted` of them are the answer's next tokens.
    pub accepted: usize,
    /// Rows sampled (tokens decided): `accepted + 1` unless the answer ended on a kept draft.
    pub sampled: usize,
}

impl Verified {
    /// Whether a draft was refused (rather than the answer ending before its verdict).
    pub fn rejected(&self, drafted: usize) -> bool {
        self.accepted < drafted && matches!(self.step, DecodeStep::Continue { .. })
    }
}

/// Sampling, stopping and detokenizing state of one sequence between forward passes.
pub struct DecodeState<'t> {
    sampler: Sampler,
    stop_matcher: StopStringMatcher,
    detokenizer: IncrementalDetokenizer<'t>,
    eos_tokens: Vec<u32>,
    history: Vec<u32>,
    token_ids: Vec<u32>,
    max_tokens: usize,
    next_position: u32,
}

impl<'t> DecodeState<'t> {
    /// State after a prefill of `prompt_tokens` (every prompt token in position order);
    /// decoded tokens go at `next_position` and after.
    pub fn new(
        tokenizer: &'t dyn Tokenizer,
        prompt_tokens: &[u32],
        params: &SamplingParams,
        next_position: u32,
    ) -> Result<Self, GenerateError> {
        Ok(Self {
            sampler: Sampler::new(params.clone())?,
            stop_matcher: StopStringMatcher::new(&params.stop),
            detokenizer: IncrementalDetokenizer::new(tokenizer, prompt_tokens),
            eos_tokens: tokenizer.eos_tokens(),
            history: prompt_tokens.to_vec(),
            token_ids: Vec::new(),
            max_tokens: params.max_tokens,
            next_position,
        })
    }

    /// Generated tokens so far, without an end-of-turn token.
    pub fn token_ids(&self) -> &[u32] {
        &self.token_ids
    }

    pub fn into_token_ids(self) -> Vec<u32> {
        self.token_ids
    }

    /// Samples the next token from the last token's `logits` (f32, one per vocabulary entry),
    /// hands any text that settled to `emit` and says whether to continue.
    pub fn accept(
        &mut self,
        logits: &[f32],
        emit: &mut dyn FnMut(&str),
    ) -> Result<DecodeStep, GenerateError> {
        if self.token_ids.len() >= self.max_tokens {
            return self.finish(FinishReason::Length, emit);
        }
        let token = self.sampler.sample(logits, &self.history)?;
        if self.eos_tokens.contains(&token) {
            return self.finish(FinishReason::Eos, emit);
        }
        self.token_ids.push(token);
        self.history.push(token);
        let scan = self.stop_matcher.push(&self.detokenizer.push(token)?);
        emit_nonempty(emit, &scan.text);
        if scan.stopped {
            return Ok(DecodeStep::Finished(FinishReason::Stop));
        }
        if self.token_ids.len() >= self.max_tokens {
            // The last token's forward pass would only feed a token never sampled.
            return self.finish(FinishReason::Length, emit);
        }
        let position = self.next_position;
        self.next_position += 1;
        Ok(DecodeStep::Continue { token, position })
    }

    /// Takes the logits rows of a pass over a step's token and `drafts` after it (row `i` is the
    /// model's next-token distribution after `drafts[..i]`): samples from each row in turn,
    /// keeping a draft while the token drawn from its row equals it. A draft of probability one
    /// kept when the draw equals it is speculative sampling's `min(1, p/q)` acceptance with its
    /// `(p − q)+` resampling in a single draw, so the answer's distribution is the model's.
    pub fn accept_drafted(
        &mut self,
        rows: &[Vec<f32>],
        drafts: &[u32],
        emit: &mut dyn FnMut(&str),
    ) -> Result<Verified, GenerateError> {
        let mut verified = Verified {
            step: DecodeStep::Finished(FinishReason::Length),
            accepted: 0,
            sampled: 0,
        };
        for (row, logits) in rows.iter().enumerate() {
            verified.step = self.accept(logits, emit)?;
            verified.sampled += 1;
            match (verified.step, drafts.get(row)) {
                (DecodeStep::Continue { token, .. }, Some(&draft)) if token == draft => {
                    verified.accepted += 1;
                }
                _ => break,
            }
        }
        Ok(verified)
    }

    /// Flushes bytes of an unfinished character and text held back as a possible stop string.
    fn finish(
        &mut self,
        reason: FinishReason,
        emit: &mut dyn FnMut(&str),
    ) -> Result<DecodeStep, GenerateError> {
        let scan = self.stop_matcher.push(&self.detokenizer.finish()?);
        emit_nonempty(emit, &scan.text);
        if scan.stopped {
            return Ok(DecodeStep::Finished(FinishReason::Stop));
        }
        emit_nonempty(emit, &self.stop_matcher.finish());
        Ok(DecodeStep::Finished(reason))
    }
}

fn emit_nonempty(emit: &mut dyn FnMut(&str), piece: &str) {
    if !piece.is_empty() {
        emit(piece);
    }
}
