//! One question through every mode: lay its schema out, encode its documents once (into the
//! run's RAM store), bind the prompt, run mode `full` once as the reference and every other mode
//! against it. Each mode's prefill is timed to its first token (TTFT: store loads, splice,
//! recompute and the argmax), then decoded greedily — the reference for up to the horizon, the
//! others only as long as they still agree with it or their answer is unfinished.

use std::time::{Duration, Instant};

use anyhow::Context;
use pml_compiler::RefuseSources;
use pml_compiler::plan::{BoundPrompt, SchemaLayout};
use pml_engine::Tokenizer;
use pml_engine::kv_cache::ParallelScaling;
use pml_runtime::inference::{FidelityEstimate, InferenceMode, LaidOutSchema, Runtime, SplicePlan};
use pml_runtime::kv_budget::{DEFAULT_SINKS, HeavyHitters, KvBudget};
use pml_runtime::store::KeepFraction;

use super::data::Question;
use super::score::{
    Continuation, exact_match, f1, greedy_agreement, kl_divergence, top_two_margin,
};
use super::sources;

/// What one mode did on one question.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ModeResult {
    pub mode: String,
    pub answer: String,
    pub f1: f64,
    pub exact_match: f64,
    pub first_token_agrees: bool,
    pub first_token_kl: f64,
    pub greedy_agreement: f64,
    pub ttft_ms: f64,
    pub tokens_reused: usize,
    pub tokens_recomputed: usize,
    pub tokens_new: usize,
    /// Mode `blend` with ratio `auto`: the fraction the loading controller chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_chosen: Option<f64>,
    /// Modes reading module states: the bytes the question's states take in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
    /// Mode `blend`: its estimated fidelity to `full` and whether the repair changed the most
    /// likely first token (what `--min-fidelity` decides by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_fidelity: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_changed: Option<bool>,
}

/// A question's results, the reference (`full`) first.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct QuestionResult {
    pub id: String,
    pub question: String,
    pub answers: Vec<String>,
    pub encode_ms: f64,
    pub modes: Vec<ModeResult>,
    /// An edited question (`--edits`): the answer its documents held before the edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edited_from: Option<String>,
    /// The bytes the question's whole module states take in the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
    /// How far `full`'s first token's probability leads its runner-up's (results written
    /// before it was recorded have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_token_margin: Option<f64>,
}

/// How a compared mode computes the prompt and the answer.
#[derive(Clone, Copy, Debug)]
pub enum EvalMode {
    /// A cached mode's prefill, then plain decoding.
    Cached(InferenceMode),
    /// Every token computed (as `full`) within a KV budget of this fraction of the prompt
    /// (H2O: half of it the newest slots, the rest the heavy hitters and the attention sinks),
    /// the prompt in chunks and the answer evicting as it goes.
    KvBudget(f64),
    /// A cached mode over compressed module states that keep this fraction of each unit's rows
    /// (`pmlc compile --keep`).
    Kept(KeepFraction, InferenceMode),
    /// Mode `reuse` attending the spliced documents as parallel contexts with APE's attention
    /// temperature and scale.
    Parallel(ParallelScaling),
}

/// A mode's greedy run.
pub(super) struct Decoded {
    ttft: Duration,
    first_logits: Vec<f32>,
    continuation: Continuation,
    answer: String,
    tokens: (usize, usize, usize),
    ratio_chosen: Option<f64>,
    fidelity: Option<FidelityEstimate>,
}

impl Decoded {
    pub(super) fn first_token_margin(&self) -> f64 {
        top_two_margin(&self.first_logits)
    }
}

/// Runs `question` in mode `full` and in each of `modes`, decoding at most `horizon` tokens.
pub fn run_question(
    runtime: &mut Runtime,
    question: &Question,
    modes: &[(String, EvalMode)],
    horizon: usize,
) -> anyhow::Result<QuestionResult> {
    let schema_source = sources::schema(question);
    let laid_out: LaidOutSchema = runtime
        .lay_out(&schema_source, &RefuseSources)
        .context("laying out the question's schema")?;
    let bound = runtime
        .bind(&laid_out, &sources::prompt(question))
        .context("binding the question's prompt")?;
    // A question too long for the context is skipped before its documents are encoded.
    runtime.check_context(&SplicePlan::new(&laid_out.layout, &bound)?, horizon)?;
    let encode_start = Instant::now();
    let store_bytes = encode(runtime, &laid_out.layout)?;
    let encode_ms = encode_start.elapsed().as_secs_f64() * 1e3;

    let reference = decode(
        runtime,
        &laid_out.layout,
        &bound,
        EvalMode::Cached(InferenceMode::Full),
        None,
        horizon,
    )?;
    let mut results = vec![score(question, "full", &reference, &reference, horizon)];
    for (label, mode) in modes {
        let layout = &laid_out.layout;
        let (decoded, bytes) = match *mode {
            EvalMode::Kept(keep, mode) => {
                runtime.set_keep(Some(keep));
                let decoded = encode(runtime, layout).and_then(|bytes| {
                    let mode = EvalMode::Cached(mode);
                    let decoded = decode(runtime, layout, &bound, mode, Some(&reference), horizon);
                    Ok((decoded?, Some(bytes)))
                });
                runtime.set_keep(None);
                decoded
            }
            EvalMode::Parallel(scaling) => {
                runtime.set_parallel_scaling(Some(scaling));
                let mode = EvalMode::Cached(InferenceMode::Reuse);
                let decoded = decode(runtime, layout, &bound, mode, Some(&reference), horizon);
                runtime.set_parallel_scaling(None);
                decoded.map(|decoded| (decoded, Some(store_bytes)))
            }
            EvalMode::Cached(InferenceMode::Reuse) => {
                let decoded = decode(runtime, layout, &bound, *mode, Some(&reference), horizon);
                decoded.map(|decoded| (decoded, Some(store_bytes)))
            }
            _ => decode(runtime, layout, &bound, *mode, Some(&reference), horizon)
                .map(|decoded| (decoded, None)),
        }
        .with_context(|| format!("mode {label}"))?;
        let mut result = score(question, label, &decoded, &reference, horizon);
        result.store_bytes = bytes;
        results.push(result);
    }
    Ok(QuestionResult {
        id: question.id.clone(),
        question: question.question.clone(),
        answers: question.answers.clone(),
        encode_ms,
        modes: results,
        edited_from: None,
        store_bytes: Some(store_bytes),
        first_token_margin: Some(reference.first_token_margin()),
    })
}

/// Encodes `layout`'s units into the runtime's store (whole, or as its keep fraction says) and
/// returns the bytes its states take there, by the manifest the encoding wrote.
fn encode(runtime: &Runtime, layout: &SchemaLayout) -> anyhow::Result<u64> {
    runtime
        .encode(layout, &mut |_| {})
        .context("encoding the documents")?;
    let manifest = runtime
        .store()
        .read_manifest(&layout.schema_name)
        .found()
        .context("reading the question's manifest back")?;
    Ok(manifest.units.iter().map(|unit| unit.bytes).sum())
}

pub(super) fn score(
    question: &Question,
    label: &str,
    decoded: &Decoded,
    reference: &Decoded,
    horizon: usize,
) -> ModeResult {
    let (tokens_reused, tokens_recomputed, tokens_new) = decoded.tokens;
    ModeResult {
        mode: label.to_string(),
        f1: f1(&decoded.answer, &question.answers),
        exact_match: exact_match(&decoded.answer, &question.answers),
        answer: decoded.answer.clone(),
        first_token_agrees: decoded.continuation.tokens.first()
            == reference.continuation.tokens.first(),
        first_token_kl: kl_divergence(&reference.first_logits, &decoded.first_logits),
        greedy_agreement: greedy_agreement(&reference.continuation, &decoded.continuation, horizon),
        ttft_ms: decoded.ttft.as_secs_f64() * 1e3,
        tokens_reused,
        tokens_recomputed,
        tokens_new,
        ratio_chosen: decoded.ratio_chosen,
        store_bytes: None,
        estimated_fidelity: decoded
            .fidelity
            .map(|estimate| f64::from(estimate.fidelity())),
        first_token_changed: decoded
            .fidelity
            .map(|estimate| estimate.first_token_changed),
    }
}

/// Prefills `bound` in `mode` and decodes greedily: up to `horizon` tokens or the end of
/// sequence for the reference; otherwise while the tokens still match `reference` or the answer
/// (its first line) is unfinished.
pub(super) fn decode(
    runtime: &Runtime,
    layout: &SchemaLayout,
    bound: &BoundPrompt,
    mode: EvalMode,
    reference: Option<&Decoded>,
    horizon: usize,
) -> anyhow::Result<Decoded> {
    let model = runtime.model();
    let tokenizer = runtime.tokenizer();
    let eos = tokenizer.eos_tokens();
    // Refused before anything is computed when the prompt and `horizon` tokens run past the
    // context.
    let plan = SplicePlan::new(layout, bound)?;
    runtime.check_context(&plan, horizon)?;
    let start = Instant::now();
    let mut fidelity = None;
    let (logits, mut kv, tokens, ratio_chosen, mut hitters) = match mode {
        EvalMode::Cached(mode) => {
            let prefill = runtime.prefill(layout, bound, mode)?;
            let stats = &prefill.stats;
            let tokens = (
                stats.tokens_reused,
                stats.tokens_recomputed,
                stats.tokens_new,
            );
            let ratio_chosen = stats.ratio_choice.map(|choice| choice.ratio.get());
            fidelity = stats.blend_estimate();
            (prefill.logits, prefill.kv, tokens, ratio_chosen, None)
        }
        EvalMode::Kept(..) | EvalMode::Parallel(_) => {
            anyhow::bail!(
                "compressed states and parallel contexts are decoded in mode reuse once set"
            )
        }
        EvalMode::KvBudget(fraction) => {
            let n = plan.all_tokens.len();
            let slots = ((n as f64 * fraction).round() as usize).max(2 * DEFAULT_SINKS + 2);
            let budget = KvBudget::new(slots, slots / 2, DEFAULT_SINKS)?;
            let mut hitters = HeavyHitters::new(budget);
            let mut kv = hitters.new_cache(model)?;
            let logits = hitters.forward(model, &plan.all_tokens, &plan.all_positions, &mut kv)?;
            (logits, kv, (0, 0, n), None, Some(hitters))
        }
    };
    let first_logits: Vec<f32> = logits.to_vec1()?;
    let first = argmax(&first_logits);
    let ttft = start.elapsed();
    let mut position = kv.positions().iter().max().map_or(0, |&p| p + 1);
    let mut continuation = Continuation {
        tokens: vec![first],
        ended: eos.contains(&first),
    };
    while !continuation.ended && continuation.tokens.len() < horizon {
        if let Some(reference) = reference {
            let n = continuation.tokens.len();
            let agrees = reference.continuation.tokens.get(..n) == Some(&continuation.tokens[..]);
            if !agrees && answer_finished(&answer_text(tokenizer, &continuation.tokens, &eos)?) {
                break;
            }
        }
        let last = *continuation.tokens.last().unwrap_or(&first);
        let logits = match &mut hitters {
            Some(hitters) => hitters.step(model, last, &mut kv)?,
            None => model.forward(&[last], &[position], &mut kv)?,
        };
        let logits: Vec<f32> = logits.to_vec1()?;
        position += 1;
        let next = argmax(&logits);
        continuation.tokens.push(next);
        continuation.ended = eos.contains(&next);
    }
    let answer = first_line(&answer_text(tokenizer, &continuation.tokens, &eos)?);
    Ok(Decoded {
        ttft,
        first_logits,
        continuation,
        answer,
        tokens,
        ratio_chosen,
        fidelity,
    })
}

fn answer_text(
    tokenizer: &dyn pml_compiler::Tokenizer,
    tokens: &[u32],
    eos: &[u32],
) -> anyhow::Result<String> {
    let ids: Vec<u32> = tokens
        .iter()
        .copied()
        .filter(|token| !eos.contains(token))
        .collect();
    Ok(tokenizer.decode(&ids)?)
}

/// An answer is finished once a line of it is complete.
fn answer_finished(text: &str) -> bool {
    text.trim_start().contains('\n')
}

fn first_line(text: &str) -> String {
    text.trim().lines().next().unwrap_or("").trim().to_string()
}

fn argmax(values: &[f32]) -> u32 {
    values
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(index, _)| index as u32)
}
