//! Mode `blend` (CacheBlend's selective recompute, design §3): splice the cached spans as mode
//! `reuse` does (moved units' K re-rotated), then repair the cross-attention the independent
//! encodings lost by recomputing the few cached tokens whose KV deviates most.
//!
//! 1. *Probe*: the layers up to the check layer run on every token, writing their fresh K/V over
//!    the spliced rows (CacheBlend's first layers are a full prefill); each cached token's
//!    deviation is `||K_fresh − K_spliced||²` (or V) at the check layer.
//! 2. *Selection*: the top `r` fraction of cached tokens, every new token (the last one
//!    included). Ranked by default by the attention the new tokens pay each cached token in the
//!    layers after the check layer: the new tokens alone continue from their probe state over
//!    the spliced rows (what mode `reuse` computes, a few percent of the work) and their softmax
//!    weights are summed per slot. `--select deviation` ranks by the check layer's deviation
//!    alone (CacheBlend), `weighted` by the product of the two, `attention-value` by the
//!    attention weights times each slot's value norm. Under every ranking, rows whose
//!    check-layer K/V the probe reproduced exactly (spliced after the same tokens they were
//!    encoded after) come last: recomputing them would change nothing.
//! 3. *Recompute*: only the selected tokens continue, from their probe hidden state, through the
//!    layers after the check layer; their fresh K/V overwrite the spliced rows and their queries
//!    attend over the whole cache under the position mask.
//!
//! Keeping the probe's K/V is free (it was computed anyway) and makes the first layers exact, and
//! continuing from the probe's hidden state saves recomputing those layers for the selected
//! tokens. `r = 1` is exactly mode `full` (up to summation order); `r = 0` selects nothing to
//! repair, so no probe runs and it is exactly mode `reuse`. Gradual filtering narrows the selection
//! once more one layer after the check layer, so there the dropped tokens keep their fresh KV in
//! the layers already computed.
//!
//! The spliced rows of a layer are placed right before the layer reads them
//! ([`super::layer_feed`]): spliced up front, or streamed from a slow tier by a loader thread while
//! the probe and the recompute run. With `--recompute auto` the fraction is chosen after the probe
//! by the loading controller ([`super::controller`]) from the probe's time per token-layer and the
//! measured time to load a layer (or from the costs the options declare). Ranking by attention
//! places every later layer before the recompute starts, so a streamed load then overlaps only the
//! probe and that pass.

use std::collections::HashSet;
use std::time::Instant;

use candle_core::{DType, Tensor};

use crate::encode::UnitEncoder;
use crate::encode::chunked::MAX_CHUNK_TOKENS;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{AttentionObserver, ForwardContext, Model};

use super::blend_options::{BlendOptions, Deviation, HEAD_ROWS, Ratio, Selection};
use super::controller::{LayerCosts, RemainingWork, Shortcut, choose_ratio};
use super::fidelity::{FidelityEstimate, GuardFired};
use super::full;
use super::layer_feed::{CachedLayers, LayerSource, Spliced, with_cached_layers};
use super::plan::SplicePlan;
use super::reuse::kept_plan;
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};
use crate::attention_mass::{AttentionMass, MassWeighting};

/// The prompt's tokens in position order, each with its KV slot: cached rows occupy the slots the
/// splice gave them, new tokens follow in position order.
struct Rows {
    tokens: Vec<u32>,
    context: ForwardContext,
    /// Rows whose slot is a cached one.
    cached: Vec<bool>,
}

impl Rows {
    fn new(plan: &SplicePlan, kv: &KvCache) -> Result<Self, InferenceError> {
        let n_cached = kv.len();
        let cached_tokens = plan
            .spans
            .iter()
            .flat_map(|span| span.tokens.iter().copied());
        let mut rows: Vec<(u32, usize, u32)> = cached_tokens
            .zip(kv.positions().iter().copied())
            .enumerate()
            .map(|(slot, (token, position))| (position, slot, token))
            .chain(
                plan.new_positions
                    .iter()
                    .zip(&plan.new_tokens)
                    .enumerate()
                    .map(|(index, (&position, &token))| (position, n_cached + index, token)),
            )
            .collect();
        // Stable: new tokens keep their (position-sorted) order, so their slots stay ascending,
        // which appending requires.
        rows.sort_by_key(|&(position, _, _)| position);
        let positions = rows.iter().map(|row| row.0).collect();
        let slots: Vec<usize> = rows.iter().map(|row| row.1).collect();
        Ok(Self {
            tokens: rows.iter().map(|row| row.2).collect(),
            cached: slots.iter().map(|&slot| slot < n_cached).collect(),
            context: ForwardContext::new(positions, slots)?,
        })
    }

    /// The row of the last new token, whose logits choose the first answer token.
    fn last(&self) -> Result<usize, InferenceError> {
        let last_slot = self.context.slots().iter().copied().max();
        self.context
            .slots()
            .iter()
            .position(|&slot| Some(slot) == last_slot)
            .filter(|&row| !self.cached[row])
            .ok_or_else(|| InferenceError::InvalidPrompt("no new tokens".into()))
    }
}

/// Splices the plan's cached spans, recomputes the most deviating fraction of them together with
/// the new tokens, and returns the last token's logits; `reserve` slots are left for decoding.
pub fn prefill_blend(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    options: &BlendOptions,
    reserve: usize,
) -> Result<Prefill, InferenceError> {
    check_layers(model, options)?;
    let whole_plan = plan;
    let mut stats = PrefillStats::new(InferenceMode::Blend(*options));
    let plan = &*kept_plan(encoder, plan, &mut stats)?;
    let probing = probes(options, plan.n_cached());
    // The probe overwrites every row of the layers before the check layer: never loaded.
    let first_layer = if probing { options.check_layer } else { 0 };
    let (kv, logits) = with_cached_layers(
        model,
        encoder,
        plan,
        CachedLayers {
            extra: plan.new_tokens.len() + reserve,
            first_layer,
            pipelining: options.pipelining,
        },
        &mut stats,
        |kv, source, stats| recompute(model, plan, options, probing, kv, source, stats),
    )?;
    let guard = options.min_fidelity.zip(stats.fidelity);
    match guard.filter(|(floor, estimate)| !estimate.passes(*floor)) {
        None => Ok(Prefill { kv, logits, stats }),
        Some((floor, estimate)) => {
            drop(kv);
            let mut full = full::prefill_full(model, whole_plan, reserve)?;
            // The answer is full's; the time includes blend's attempt.
            full.stats.load += stats.load;
            full.stats.store_reads += stats.store_reads;
            full.stats.splice += stats.splice;
            full.stats.compute += stats.compute;
            full.stats.warnings.extend(stats.warnings);
            full.stats.guard = Some(GuardFired { floor, estimate });
            Ok(full)
        }
    }
}

/// Whether `blend` probes `n_cached` spliced rows. Nothing cached is repaired at r = 0, so the
/// probe would only rewrite the first layers: skipping it keeps r = 0 exactly mode `reuse`. The
/// controller (ratio `auto`) needs the probe's timing.
fn probes(options: &BlendOptions, n_cached: usize) -> bool {
    match options.auto_ratio {
        true => n_cached > 0,
        false => options.recompute.of(n_cached) > 0,
    }
}

/// Refuses a check layer (or gradual filter layer) past the model's layers, and a fidelity floor
/// with nothing recomputed: the estimate measures what the repair moved, so without one it
/// would pass every answer.
fn check_layers(model: &Model, options: &BlendOptions) -> Result<(), InferenceError> {
    if options.min_fidelity.is_some() && options.recompute == Ratio::ZERO && !options.auto_ratio {
        return Err(InferenceError::InvalidOptions(
            "a minimum fidelity needs a fraction to recompute above 0: the estimate compares \
             the answer before and after the repair"
                .into(),
        ));
    }
    let n_layers = model.config().n_layers;
    if options.last_filter_layer() >= n_layers {
        return Err(InferenceError::InvalidOptions(format!(
            "check layer {} {}of a model with {n_layers} layers",
            options.check_layer,
            if options.gradual {
                "(and the gradual filter's next layer) "
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// `blend` over a cache the caller spliced: `kv` holds `plan`'s cached rows, one slot per row in
/// the plan's span order, at their positions in this prompt (re-rotated where moved), with room
/// for the new tokens. For cached rows that come from no module store (an edited plain prompt's
/// rows in the prefix cache, [`super::prefix_edit`]).
pub(super) fn blend_spliced(
    model: &Model,
    plan: &SplicePlan,
    options: &BlendOptions,
    mut kv: KvCache,
    stats: PrefillStats,
) -> Result<Prefill, InferenceError> {
    let mut stats = stats;
    check_layers(model, options)?;
    let probing = probes(options, plan.n_cached());
    let mut source = Spliced {
        load_per_layer: std::time::Duration::ZERO,
    };
    let logits = recompute(
        model,
        plan,
        options,
        probing,
        &mut kv,
        &mut source,
        &mut stats,
    )?;
    Ok(Prefill { kv, logits, stats })
}

/// Probe (when `probing`), selection and recompute over the spliced cache `kv`, whose layers
/// `source` places right before each is read; returns the last token's logits.
fn recompute(
    model: &Model,
    plan: &SplicePlan,
    options: &BlendOptions,
    probing: bool,
    kv: &mut KvCache,
    source: &mut dyn LayerSource,
    stats: &mut PrefillStats,
) -> Result<Tensor, InferenceError> {
    let n_cached = kv.len();
    let compute_start = Instant::now();
    let rows = Rows::new(plan, kv)?;
    let last = rows.last()?;
    let start = if probing {
        probe_and_select(model, plan, options, &rows, kv, source, stats)?
    } else {
        let selected = select_top(&rows.cached, &vec![0.0; rows.cached.len()], 0);
        let tokens: Vec<u32> = selected.iter().map(|&row| rows.tokens[row]).collect();
        Start {
            hidden: model.embed(&tokens)?,
            first_layer: 0,
            selected,
            keep: 0,
            spliced_logits: None,
        }
    };
    let spliced_logits = start.spliced_logits.clone();
    let (hidden, selected, context) = recompute_layers(model, options, &rows, start, kv, source)?;
    let last_index = selected
        .iter()
        .position(|&row| row == last)
        .ok_or_else(|| InferenceError::InvalidPrompt("the last token was not selected".into()))?;
    let logits = model.logits(&hidden, &[last_index])?.squeeze(0)?;
    let recomputed = selected.iter().filter(|&&row| rows.cached[row]).count();
    stats.fidelity = match (stats.shortcut, spliced_logits) {
        _ if probing && recomputed == n_cached => Some(FidelityEstimate::EXACT),
        (Some(_), _) => Some(FidelityEstimate::EXACT),
        (None, Some(spliced)) => Some(FidelityEstimate::of(&logits, &spliced)?),
        (None, None) => None,
    };
    stats.compute = compute_start.elapsed();

    stats.tokens_recomputed = recomputed;
    stats.tokens_reused = n_cached - recomputed;
    stats.tokens_new = plan.new_tokens.len();
    stats.recomputed_positions = context.positions().to_vec();
    Ok(logits)
}

/// Where the recompute starts: the hidden states of the rows it recomputes (`selected`, rows of
/// [`Rows`]) entering `first_layer`, how many cached rows the gradual filter keeps, and the new
/// tokens' logits over the spliced rows where that pass ran.
struct Start {
    hidden: Tensor,
    first_layer: usize,
    selected: Vec<usize>,
    keep: usize,
    spliced_logits: Option<Tensor>,
}

/// The probe through the check layer, the ratio (chosen or given, or a shortcut's), and the
/// rows to recompute from the layer after it.
fn probe_and_select(
    model: &Model,
    plan: &SplicePlan,
    options: &BlendOptions,
    rows: &Rows,
    kv: &mut KvCache,
    source: &mut dyn LayerSource,
    stats: &mut PrefillStats,
) -> Result<Start, InferenceError> {
    let n_layers = model.config().n_layers;
    let n_cached = kv.len();
    let probe = probe(model, rows, kv, source, options)?;
    let ratio = chosen_ratio(options, &probe, rows, n_cached, &*source, stats);
    // Cached tokens recomputed through the layers after the check layer, and through the
    // first of them (twice as many with gradual filtering).
    let keeps = |ratio: Ratio| {
        let keep = ratio.of(n_cached);
        match options.gradual {
            true => (keep, (2 * keep).min(n_cached)),
            false => (keep, keep),
        }
    };
    let (keep, first_keep) = keeps(ratio);
    let weighting = options.selection.attention_weighting();
    let shortcut = match options.shortcuts {
        false => None,
        true if nothing_to_repair(&probe, n_cached, options.check_layer) => Some(Shortcut::Reuse),
        true => RemainingWork {
            n_cached,
            n_new: plan.new_tokens.len(),
            keep,
            first_keep,
            attention_pass: weighting.is_some(),
            layers_after_probe: n_layers - options.check_layer - 1,
        }
        .shortcut(),
    };
    // A shortcut replaces the ratio, and the controller's choice reports the one applied.
    let (keep, first_keep) = keeps(shortcut.map_or(ratio, Shortcut::ratio));
    stats.ratio_choice = stats.ratio_choice.map(|choice| choice.applying(shortcut));
    stats.shortcut = shortcut;
    // The new tokens' pass over the spliced rows: it ranks by attention, and its answer is
    // what the estimate compares the repaired one with (run for that alone under a guard).
    let spliced_pass = match shortcut {
        None if weighting.is_some() || options.min_fidelity.is_some() => {
            Some(new_tokens_over_spliced(
                model,
                rows,
                &probe.hidden,
                options.check_layer + 1,
                weighting,
                kv,
                source,
            )?)
        }
        _ => None,
    };
    let spliced_logits = spliced_pass.as_ref().map(|pass| pass.logits.clone());
    let attention = spliced_pass.and_then(|pass| pass.mass);
    let by_row = selection_scores(options, plan, rows, &probe, attention.as_deref(), n_cached);
    let selected = select_top(&rows.cached, &by_row, first_keep);
    let hidden = probe
        .hidden
        .index_select(&row_ids(&selected, probe.hidden.device())?, 0)?;
    Ok(Start {
        hidden,
        first_layer: options.check_layer + 1,
        selected,
        keep,
        spliced_logits,
    })
}

/// The share of the cached rows to recompute: the options' ratio, or with `auto` the loading
/// controller's choice from the layer costs (declared, or measured by the probe and `source`),
/// which `stats` records.
fn chosen_ratio(
    options: &BlendOptions,
    probe: &Probe,
    rows: &Rows,
    n_cached: usize,
    source: &dyn LayerSource,
    stats: &mut PrefillStats,
) -> Ratio {
    if !options.auto_ratio {
        return options.recompute;
    }
    let costs = match options.declared_costs {
        Some(declared) => declared.layer_costs(n_cached),
        None => {
            let token_layers = (options.check_layer + 1) * rows.tokens.len();
            LayerCosts {
                load_per_layer: source.load_per_layer(),
                recompute_per_token_layer: probe.compute.as_secs_f64() / token_layers.max(1) as f64,
            }
        }
    };
    let choice = choose_ratio(&costs, n_cached, options.recompute);
    stats.ratio_choice = Some(choice);
    choice.ratio
}

/// Each row's score for the options' selection (the highest are recomputed): its deviation at
/// the check layer, the new tokens' `attention` to it, both, or a span's head first; rows the
/// splice got exactly right never.
fn selection_scores(
    options: &BlendOptions,
    plan: &SplicePlan,
    rows: &Rows,
    probe: &Probe,
    attention: Option<&[f32]>,
    n_cached: usize,
) -> Vec<f32> {
    let exact_up_to = exact_deviation(&probe.deviation[..n_cached]);
    let (deviation_rank, read_rank) = match options.selection {
        Selection::Mixed => (
            rank_scores(&probe.deviation[..n_cached]),
            rank_scores(attention.map_or(&[], |mass| &mass[..n_cached.min(mass.len())])),
        ),
        _ => (Vec::new(), Vec::new()),
    };
    let heads = match options.selection {
        Selection::Heads => span_heads(plan),
        _ => HashSet::new(),
    };
    rows.context
        .slots()
        .iter()
        .zip(rows.context.positions())
        .map(|(&slot, position)| {
            let deviation = probe.deviation[slot];
            let read = attention.map_or(0.0, |mass| mass[slot]);
            match options.selection {
                _ if deviation <= exact_up_to => f32::NEG_INFINITY,
                Selection::Deviation => deviation,
                Selection::Attention | Selection::AttentionValue => read,
                Selection::Heads if heads.contains(position) => f32::MAX,
                Selection::Heads => read,
                Selection::Weighted => deviation * read,
                Selection::Mixed => {
                    let rank = |ranks: &[f32]| ranks.get(slot).copied().unwrap_or(0.0);
                    rank(&deviation_rank).max(rank(&read_rank))
                }
            }
        })
        .collect()
}

/// The selected rows through the layers from `start.first_layer` on, each layer placed by
/// `source` right before it is read; at the gradual filter's layer the rows whose K moved least
/// drop out, down to `start.keep` cached ones. Returns the last layer's hidden states, the rows
/// they belong to and their context.
fn recompute_layers(
    model: &Model,
    options: &BlendOptions,
    rows: &Rows,
    start: Start,
    kv: &mut KvCache,
    source: &mut dyn LayerSource,
) -> Result<(Tensor, Vec<usize>, ForwardContext), InferenceError> {
    let gradual_layer = options.last_filter_layer();
    // Views of the spliced rows at the gradual filter's layer, before recompute overwrites them.
    let spliced_at_filter = if options.gradual {
        source.place(gradual_layer, kv)?;
        Some(kv_of(kv, gradual_layer, options.deviation)?)
    } else {
        None
    };
    let Start {
        mut hidden,
        first_layer,
        mut selected,
        keep,
        ..
    } = start;
    let mut context = rows.context.select(&selected)?;
    for layer_idx in first_layer..model.config().n_layers {
        source.place(layer_idx, kv)?;
        hidden = forward_layer_chunked(model, layer_idx, &hidden, &context, kv, None)?;
        if let (Some(spliced), true) = (&spliced_at_filter, layer_idx == gradual_layer) {
            let fresh = kv_of(kv, layer_idx, options.deviation)?;
            let deviation = squared_distance(spliced, &fresh)?;
            let cached: Vec<bool> = selected.iter().map(|&row| rows.cached[row]).collect();
            let by_row: Vec<f32> = selected
                .iter()
                .map(|&row| match rows.cached[row] {
                    true => deviation[rows.context.slots()[row]],
                    false => 0.0,
                })
                .collect();
            let kept = select_top(&cached, &by_row, keep);
            hidden = hidden.index_select(&row_ids(&kept, hidden.device())?, 0)?;
            context = context.select(&kept)?;
            selected = kept.iter().map(|&index| selected[index]).collect();
        }
    }
    Ok((hidden, selected, context))
}

/// What the probe found.
struct Probe {
    /// Hidden states after the check layer, one per row.
    hidden: Tensor,
    /// Each slot's squared distance between its fresh and spliced K (or V) at the check layer
    /// (new tokens' slots included, though selection ignores them).
    deviation: Vec<f32>,
    /// Each cached slot's squared norm of its spliced K (or V) at the check layer.
    spliced_norm: Vec<f32>,
    /// Time spent computing (waits for the check layer's spliced rows excluded).
    compute: std::time::Duration,
}

/// Runs layers `0..=check_layer` on every token, writing their fresh K/V into `kv`; the check
/// layer's spliced rows are placed (by `source`) just before it runs, the layers before it are
/// never read.
fn probe(
    model: &Model,
    rows: &Rows,
    kv: &mut KvCache,
    source: &mut dyn LayerSource,
    options: &BlendOptions,
) -> Result<Probe, InferenceError> {
    let started = Instant::now();
    let mut waited = std::time::Duration::ZERO;
    let mut hidden = model.embed(&rows.tokens)?;
    let mut spliced = None;
    for layer_idx in 0..=options.check_layer {
        if layer_idx == options.check_layer {
            let wait = Instant::now();
            source.place(layer_idx, kv)?;
            waited += wait.elapsed();
            // The view keeps the spliced rows though the probe overwrites them (see
            // `LayerKv::keys`).
            spliced = Some(kv_of(kv, layer_idx, options.deviation)?);
        }
        hidden = forward_layer_chunked(model, layer_idx, &hidden, &rows.context, kv, None)?;
    }
    let spliced = spliced.ok_or_else(|| {
        InferenceError::InvalidOptions("the probe never reached the check layer".into())
    })?;
    let fresh = kv_of(kv, options.check_layer, options.deviation)?;
    let mut deviation = squared_distance(&spliced, &fresh)?;
    deviation.resize(rows.tokens.len(), 0.0);
    let spliced_norm = spliced.sqr()?.flatten_from(1)?.sum(1)?.to_vec1::<f32>()?;
    Ok(Probe {
        hidden,
        deviation,
        spliced_norm,
        compute: started.elapsed().saturating_sub(waited),
    })
}

/// What the new tokens computed over the spliced rows alone.
struct SplicedPass {
    /// The attention they paid each slot, where a ranking asked for it.
    mass: Option<Vec<f32>>,
    /// The last token's `(vocab,)` logits.
    logits: Tensor,
}

/// A pass of the new tokens alone over the spliced rows (what mode `reuse` computes), starting
/// from their probe hidden states at `first_layer`: the last token's logits and, with a
/// `weighting`, the attention they pay each slot, summed over the layers, their heads and
/// themselves (each layer summing the weights of the queries it attends with). Their K/V
/// written on the way are rewritten by the recompute that follows.
fn new_tokens_over_spliced(
    model: &Model,
    rows: &Rows,
    probe_hidden: &Tensor,
    first_layer: usize,
    weighting: Option<MassWeighting>,
    kv: &mut KvCache,
    source: &mut dyn LayerSource,
) -> Result<SplicedPass, InferenceError> {
    let new_rows: Vec<usize> = (0..rows.cached.len())
        .filter(|&row| !rows.cached[row])
        .collect();
    let last = rows.last()?;
    let last_index = new_rows
        .iter()
        .position(|&row| row == last)
        .ok_or_else(|| InferenceError::InvalidPrompt("no new tokens".into()))?;
    let context = rows.context.select(&new_rows)?;
    let mut hidden = probe_hidden.index_select(&row_ids(&new_rows, probe_hidden.device())?, 0)?;
    let mut mass = weighting.map(|_| vec![0f32; rows.tokens.len()]);
    for layer_idx in first_layer..model.config().n_layers {
        source.place(layer_idx, kv)?;
        let mut observer = weighting
            .zip(mass.as_mut())
            .map(|(weighting, mass)| AttentionMass { mass, weighting });
        let observing = observer
            .as_mut()
            .map(|observer| observer as &mut dyn AttentionObserver);
        hidden = forward_layer_chunked(model, layer_idx, &hidden, &context, kv, observing)?;
    }
    let logits = model.logits(&hidden, &[last_index])?.squeeze(0)?;
    Ok(SplicedPass { mass, logits })
}

/// Below this fraction of the largest deviation a cached row counts as spliced exactly.
const EXACT_RELATIVE_DEVIATION: f32 = 1e-6;

/// A cached row whose squared deviation is below this fraction of its own squared norm has
/// nothing to repair: 0.3% of its length, above the f16 rounding of stored states (≤ 0.05% per
/// value) and far below what another context causes (tens of percent on the tiny and real
/// models).
const MATCHED_RELATIVE_SQUARED_DEVIATION: f32 = 1e-5;

/// Whether every cached row matched its fresh state at the check layer. Layer 0's K and V depend
/// on the token and its position only, so a match there says nothing about the context: only a
/// later check layer can tell.
fn nothing_to_repair(probe: &Probe, n_cached: usize, check_layer: usize) -> bool {
    check_layer > 0
        && (0..n_cached).all(|slot| {
            probe.deviation[slot] <= MATCHED_RELATIVE_SQUARED_DEVIATION * probe.spliced_norm[slot]
        })
}

/// The deviation up to which a cached row counts as exact: its spliced K/V are what the probe
/// computed, up to summation order, because it sits after the same tokens it was encoded after
/// (the always-present prefix, a module imported where it was encoded). Recomputing such a row
/// changes nothing, so every ranking puts it last; the attention ranking would otherwise spend a
/// good part of the rows it recomputes on it, since the prefix and the first document draw much
/// attention (on HotpotQA about 12% of the cached rows are exact and drew 18% of the attention
/// picks).
fn exact_deviation(cached_deviation: &[f32]) -> f32 {
    let largest = cached_deviation.iter().copied().fold(0f32, f32::max);
    largest * EXACT_RELATIVE_DEVIATION
}

/// The positions of the first [`HEAD_ROWS`] rows of every span but one that starts the prompt:
/// where an encoding began without the text now before it (EPIC's LegoLink recomputes these).
/// A span imported where it was encoded counts too, as the units before it in the prompt were
/// not before it when it was encoded; the probe's exact rows still come last.
fn span_heads(plan: &SplicePlan) -> HashSet<u32> {
    plan.spans
        .iter()
        .filter(|span| span.positions.first().is_some_and(|&first| first > 0))
        .flat_map(|span| span.positions.iter().copied().take(HEAD_ROWS))
        .collect()
}

/// Each value's place from the top as a score in `(0, 1]`: the largest 1, the smallest
/// `1 / n` (ties in index order), so two rankings of different scales can be merged.
fn rank_scores(values: &[f32]) -> Vec<f32> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    let n = values.len() as f32;
    let mut scores = vec![0.0; values.len()];
    for (place, index) in order.into_iter().enumerate() {
        scores[index] = 1.0 - place as f32 / n;
    }
    scores
}

/// The rows to recompute, ascending: every row that is not cached, and the `keep` cached rows
/// with the largest score (deviation, attention or their product; ties to the earlier row).
pub fn select_top(cached: &[bool], score_of_row: &[f32], keep: usize) -> Vec<usize> {
    let mut candidates: Vec<usize> = (0..cached.len()).filter(|&row| cached[row]).collect();
    candidates.sort_by(|&a, &b| score_of_row[b].total_cmp(&score_of_row[a]).then(a.cmp(&b)));
    candidates.truncate(keep);
    let mut selected: Vec<usize> = (0..cached.len())
        .filter(|&row| !cached[row])
        .chain(candidates)
        .collect();
    selected.sort_unstable();
    selected
}

/// K or V of every live slot of layer `layer_idx`.
fn kv_of(kv: &KvCache, layer_idx: usize, on: Deviation) -> Result<Tensor, InferenceError> {
    let layer = kv.layer(layer_idx)?;
    Ok(match on {
        Deviation::Keys => layer.keys()?,
        Deviation::Values => layer.values()?,
    })
}

/// `||a_i − b_i||²` for every row `i` of `(n, heads, dim)` tensors (`b` may have more rows).
fn squared_distance(a: &Tensor, b: &Tensor) -> Result<Vec<f32>, InferenceError> {
    let n = a.dim(0)?;
    // In f32: the cache's rows may be f16.
    let a = a.to_dtype(DType::F32)?;
    let b = b.narrow(0, 0, n)?.to_dtype(DType::F32)?;
    let distance = (a - b)?.sqr()?.flatten_from(1)?.sum(1)?;
    Ok(distance.to_vec1::<f32>()?)
}

/// One layer for the tokens of `context` (in position order), in chunks of at most
/// [`MAX_CHUNK_TOKENS`] so a long prompt's attention scores stay bounded; exact because a chunk
/// never attends to a later one. An `observer` sees every chunk's attention.
fn forward_layer_chunked(
    model: &Model,
    layer_idx: usize,
    hidden: &Tensor,
    context: &ForwardContext,
    kv: &mut KvCache,
    mut observer: Option<&mut dyn AttentionObserver>,
) -> Result<Tensor, InferenceError> {
    let mut step = |hidden: &Tensor, context: &ForwardContext, kv: &mut KvCache| match &mut observer
    {
        Some(observer) => model.forward_layer_observed(layer_idx, hidden, context, kv, *observer),
        None => model.forward_layer(layer_idx, hidden, context, kv),
    };
    let n = context.len();
    if n <= MAX_CHUNK_TOKENS {
        return Ok(step(hidden, context, kv)?);
    }
    let chunk_len = n.div_ceil(n.div_ceil(MAX_CHUNK_TOKENS));
    let mut outputs = Vec::with_capacity(n.div_ceil(chunk_len));
    for start in (0..n).step_by(chunk_len) {
        let len = chunk_len.min(n - start);
        let rows: Vec<usize> = (start..start + len).collect();
        let chunk_context = context.select(&rows)?;
        outputs.push(step(&hidden.narrow(0, start, len)?, &chunk_context, kv)?);
    }
    Ok(Tensor::cat(&outputs, 0)?)
}

fn row_ids(rows: &[usize], device: &candle_core::Device) -> Result<Tensor, InferenceError> {
    let ids: Vec<u32> = rows.iter().map(|&row| row as u32).collect();
    Ok(Tensor::new(ids.as_slice(), device)?)
}

#[cfg(test)]
mod tests {
    use super::{rank_scores, select_top};

    #[test]
    fn rank_scores_place_values_from_the_top() {
        assert_eq!(rank_scores(&[0.5, 9.0, 0.5, 2.0]), [0.5, 1.0, 0.25, 0.75]);
        assert!(rank_scores(&[]).is_empty());
    }

    #[test]
    fn selection_keeps_every_new_row_and_the_highest_scoring_cached_ones() {
        let cached = [true, true, false, true, true, false];
        let deviation = [0.5, 3.0, 0.0, 1.0, 3.0, 0.0];
        assert_eq!(select_top(&cached, &deviation, 0), [2, 5]);
        assert_eq!(select_top(&cached, &deviation, 2), [1, 2, 4, 5]);
        assert_eq!(select_top(&cached, &deviation, 3), [1, 2, 3, 4, 5]);
        assert_eq!(select_top(&cached, &deviation, 9), [0, 1, 2, 3, 4, 5]);
    }
}
