//! Mode `reuse` (Prompt Cache's cached inference): load each imported unit's state, keep the rows
//! the prompt uses, re-rotate K of units placed at other positions, splice everything into one KV
//! cache (one concatenation per layer), then compute all new tokens in one forward pass over it,
//! masked by position. [`splice`] is shared with mode `blend`, which starts from the same cache.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::encode::context::{held_rows, select_rows};
use crate::encode::unit_encoder::describe;
use crate::encode::{StateOrigin, UnitEncoder};
use pml_compiler::plan::UnitId;
use pml_engine::kv_cache::{KvBlock, KvCache, ParallelContexts, ParallelScaling};
use pml_engine::model::Model;

use super::plan::{PlannedSpan, SplicePlan};
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};
use crate::encode::chunked::prefill_sorted;

/// Splices the plan's cached spans and computes its new tokens; `reserve` is how many slots to
/// leave for decoding. Units missing from the store are encoded now (and stored).
pub fn prefill_reuse(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    reserve: usize,
) -> Result<Prefill, InferenceError> {
    let mut stats = PrefillStats::new(InferenceMode::Reuse);
    let plan = &*kept_plan(encoder, plan, &mut stats)?;
    let mut kv = splice(
        model,
        encoder,
        plan,
        plan.new_tokens.len() + reserve,
        plan.first_new_position(),
        &mut stats,
    )?;
    stats.tokens_reused = kv.len();
    mark_parallel_contexts(&mut kv, plan, encoder.parallel_scaling());

    let compute_start = Instant::now();
    let logits = prefill_sorted(model, &plan.new_tokens, &plan.new_positions, &mut kv, true)?
        .ok_or_else(|| InferenceError::InvalidPrompt("no new tokens".into()))?;
    stats.compute = compute_start.elapsed();
    stats.tokens_new = plan.new_tokens.len();
    Ok(Prefill { kv, logits, stats })
}

/// With `scaling`, marks the rows of every spliced module (every span but the schema root's) as
/// parallel contexts of `kv`, so the new tokens and the answer attend them with APE's
/// correction ([`ParallelContexts`]); the root's rows and the new tokens stay plain.
pub(super) fn mark_parallel_contexts(
    kv: &mut KvCache,
    plan: &SplicePlan,
    scaling: Option<ParallelScaling>,
) {
    let Some(scaling) = scaling else {
        return;
    };
    let ranges = plan
        .spans
        .iter()
        .filter(|span| span.unit != UnitId::ROOT)
        .flat_map(|span| consecutive_runs(&span.positions))
        .collect();
    kv.set_parallel_contexts(Some(ParallelContexts::new(ranges, scaling)));
}

/// `positions` (ascending) as ranges of consecutive positions.
fn consecutive_runs(positions: &[u32]) -> Vec<Range<u32>> {
    let mut runs: Vec<Range<u32>> = Vec::new();
    for &position in positions {
        match runs.last_mut() {
            Some(run) if run.end == position => run.end = position + 1,
            _ => runs.push(position..position + 1),
        }
    }
    runs
}

/// The cache holding every cached span's rows, in `plan.spans` order (slot `i` is the `i`-th
/// cached row), moved rows re-rotated to their positions in this prompt, with room for `extra`
/// more slots. With `first_query`, every row computed later is at that position or after
/// (mode `reuse`, not `blend`, which recomputes cached rows at theirs), and sliding-window
/// layers leave out the rows none of them can see. Fills in the load and splice parts of
/// `stats`.
pub(super) fn splice(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    extra: usize,
    first_query: Option<u32>,
    stats: &mut PrefillStats,
) -> Result<KvCache, InferenceError> {
    let warnings_before = encoder.warnings().len();
    let load_start = Instant::now();
    let mut blocks: Vec<KvBlock> = Vec::with_capacity(plan.spans.len());
    for span in &plan.spans {
        blocks.push(span_rows(model, encoder, span, stats)?);
    }
    stats.load += load_start.elapsed();
    stats
        .warnings
        .extend_from_slice(&encoder.warnings()[warnings_before..]);

    let splice_start = Instant::now();
    let block_refs: Vec<&KvBlock> = blocks.iter().collect();
    let kv = match first_query {
        Some(first_query) => model.splice_for_queries(&block_refs, extra, first_query)?,
        None => KvCache::from_blocks(model.kv_layout(), model.device(), &block_refs, extra)?,
    };
    stats.splice = splice_start.elapsed();
    Ok(kv)
}

/// The rows `span` splices: its unit's state ([`span_state`]), the span's rows of it, re-rotated
/// to the span's positions if it moved.
pub(super) fn span_rows(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    span: &PlannedSpan,
    stats: &mut PrefillStats,
) -> Result<KvBlock, InferenceError> {
    let (state, _) = span_state(encoder, span, stats)?;
    span_block(model, &state, span)
}

/// The whole state of `span`'s unit: from this run, the store, or encoded now, as `stats`
/// records.
pub(super) fn span_state(
    encoder: &mut UnitEncoder<'_>,
    span: &PlannedSpan,
    stats: &mut PrefillStats,
) -> Result<(Arc<KvBlock>, StateOrigin), InferenceError> {
    let started = Instant::now();
    let (state, origin) = encoder.state(span.unit)?;
    match origin {
        StateOrigin::Store => {
            stats.units_loaded += 1;
            stats.store_reads += started.elapsed();
        }
        StateOrigin::Encoded => {
            let layout_unit = crate::encode::context::unit(encoder.layout(), span.unit)?;
            if encoder.stored(span.unit) {
                stats.units_encoded_on_the_fly.push(describe(layout_unit));
            } else {
                stats.units_not_stored.push(describe(layout_unit));
            }
        }
        StateOrigin::Memory | StateOrigin::Empty => {}
    }
    Ok((state, origin))
}

/// `span`'s rows of its unit's `state` (found by position), re-rotated to the span's positions
/// if it moved.
pub(super) fn span_block(
    model: &Model,
    state: &Arc<KvBlock>,
    span: &PlannedSpan,
) -> Result<KvBlock, InferenceError> {
    // The state's rows at the span's positions: the span's rows of a whole state, and of a
    // compressed one the rows it kept (the plan splices no other, see `kept_plan`).
    let state_rows: Vec<usize> =
        held_rows(state.positions(), span.encoded_positions.iter().copied())
            .into_iter()
            .collect::<Option<_>>()
            .ok_or_else(|| {
                InferenceError::InvalidPrompt(format!(
                    "the state of unit {} lacks rows the prompt splices",
                    span.unit.0
                ))
            })?;
    if !span.is_moved()
        && state.holds_tensors()
        && let Some(&first) = state_rows.first()
        && state_rows
            .iter()
            .copied()
            .eq(first..first + state_rows.len())
    {
        // Consecutive rows in place: a view, which a cache of the state's dtype reads without
        // copying, so a module many prompts import is held once.
        return Ok(KvBlock::view(state, first..first + state_rows.len())?);
    }
    let rows = select_rows(state, &state_rows)?;
    Ok(if span.is_moved() {
        model.reposition(&rows, &span.positions)?
    } else {
        rows
    })
}

/// `plan` restricted to the cached rows the units' states hold: all of them, unless the encoder
/// reads compressed states ([`UnitEncoder::keep`]), which hold their heavy hitters only. Reads
/// each state (recorded in `stats`); the splice then finds them in the encoder's memory.
pub(super) fn kept_plan<'p>(
    encoder: &mut UnitEncoder<'_>,
    plan: &'p SplicePlan,
    stats: &mut PrefillStats,
) -> Result<Cow<'p, SplicePlan>, InferenceError> {
    if encoder.keep().is_none() {
        return Ok(Cow::Borrowed(plan));
    }
    let load_start = Instant::now();
    let warnings_before = encoder.warnings().len();
    let kept = plan.retaining(|span| {
        let (state, _) = span_state(encoder, span, stats)?;
        Ok(
            held_rows(state.positions(), span.encoded_positions.iter().copied())
                .into_iter()
                .map(|row| row.is_some())
                .collect(),
        )
    })?;
    stats.load += load_start.elapsed();
    stats
        .warnings
        .extend_from_slice(&encoder.warnings()[warnings_before..]);
    stats.tokens_dropped = plan.n_cached() - kept.n_cached();
    Ok(Cow::Owned(kept))
}
