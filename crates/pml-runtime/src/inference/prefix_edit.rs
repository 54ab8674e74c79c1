//! Edit reuse for plain prompts (AttMemo's reuse of *similar* inputs, in the prefix cache): a
//! prompt that differs from one the cache kept by a few edits — a document or source file sent
//! again after a change — reuses the kept KV of every unchanged token, not only of the blocks
//! before the first change. The new prompt is diffed against the recent prompts the cache
//! kept ([`super::edit::matched_pairs`], a token-level diff); each run of matched tokens is
//! spliced from the old prompt's blocks at its new positions (keys re-rotated where it moved),
//! and mode `blend` computes the changed tokens and recomputes the cached tokens its ranking
//! picks — those after an edit "took notes" of the old text, so swapping in the changed tokens
//! alone leaves the model answering from it (`docs/results/history.md`, "Edit reuse").
//!
//! The KV it leaves is approximate past the first change: it is never kept as blocks (whose keys
//! promise exact prefixes).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use pml_compiler::plan::UnitId;
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::{EngineError, Model};

use super::blend::blend_spliced;
use super::blend_options::{BlendOptions, Selection};
use super::edit::matched_pairs;
use super::plan::{PlannedSpan, SplicePlan};
use super::prefix_cache::{BLOCK_TOKENS, PrefixCache};
use super::stats::PrefillStats;
use super::{InferenceError, InferenceMode, Prefill};
use crate::encode::EncodeError;
use crate::store::ModuleState;

/// Tokens that must be left to compute after the cached prefix, and gained by a diff over it,
/// before edit reuse is tried: below that the probe and recompute cost more than they save.
pub const EDIT_MIN_TOKENS: usize = 64;

/// The settings of an edited prompt's `blend`: the default fraction, ranked by deviation (the
/// ranking that kept `full`'s first token on 0.956 of the HotpotQA edited-fact set, 0.967 on
/// NQ's), its shortcuts on.
pub fn edit_blend_options() -> BlendOptions {
    BlendOptions {
        selection: Selection::Deviation,
        ..BlendOptions::default()
    }
}

/// The pairs `(old row, new index)` the diff reuses of the prompt it reuses most of.
struct Match {
    pairs: Vec<(usize, usize)>,
}

impl PrefixCache {
    /// `tokens`' prefill by edit reuse, when a recent prompt's kept blocks give more than
    /// `cached_tokens` (what the exact prefix splice found) plus [`EDIT_MIN_TOKENS`]; `None`
    /// when none does. Leaves room for `reserve` more slots.
    pub fn edit_prefill(
        &self,
        model: &Model,
        tokens: &[u32],
        cached_tokens: usize,
        options: &BlendOptions,
        reserve: usize,
    ) -> Result<Option<Prefill>, InferenceError> {
        let started = Instant::now();
        if tokens.len() < cached_tokens + EDIT_MIN_TOKENS {
            return Ok(None);
        }
        let Some((found, old_kv)) = self.best_match(model, tokens, cached_tokens)? else {
            return Ok(None);
        };
        let (plan, blocks) = spliced_runs(model, &found, &old_kv, tokens)?;
        let new_tokens = plan.new_tokens.len();
        let refs: Vec<&KvBlock> = blocks.iter().collect();
        let kv = KvCache::from_blocks(
            model.kv_layout(),
            model.device(),
            &refs,
            new_tokens + reserve,
        )
        .map_err(EngineError::from)?;
        let mut stats = PrefillStats::new(InferenceMode::Blend(*options));
        stats.splice = started.elapsed();
        Ok(Some(blend_spliced(model, &plan, options, kv, stats)?))
    }

    /// The recent prompt whose matched tokens, within its leading run of kept blocks, are the
    /// most (and more than the prefix splice plus [`EDIT_MIN_TOKENS`]), with a cache of those
    /// blocks.
    fn best_match(
        &self,
        model: &Model,
        tokens: &[u32],
        cached_tokens: usize,
    ) -> Result<Option<(Match, KvCache)>, InferenceError> {
        let last = tokens.len() - 1;
        let wanted = cached_tokens + EDIT_MIN_TOKENS;
        let mut best: Option<(Match, Vec<Arc<ModuleState>>)> = None;
        for old in self.recent() {
            // Most kept prompts are unrelated to this one: the diff runs only where they share
            // enough text to reuse (it costs up to (n + m) × 512 steps otherwise).
            if !shares_enough(&old, tokens, wanted) {
                continue;
            }
            // Only the leading run of its blocks still kept can be read: a prompt whose blocks
            // were evicted is passed over before its diff, not chosen and then found empty.
            let mut held = Vec::new();
            for key in self.block_keys(model, &old) {
                match self.block(&key).map_err(EncodeError::from)? {
                    Some(state) => held.push(state),
                    None => break,
                }
            }
            let rows = held.len() * BLOCK_TOKENS;
            if rows < wanted {
                continue;
            }
            // The last token is always computed: its logits choose the first answer token.
            let pairs: Vec<(usize, usize)> = matched_pairs(&old, tokens)
                .into_iter()
                .filter(|&(row, index)| index < last && row < rows)
                .collect();
            let most = best.as_ref().map_or(0, |(best, _)| best.pairs.len());
            if pairs.len() >= wanted && pairs.len() > most {
                best = Some((Match { pairs }, held));
            }
        }
        let Some((found, held)) = best else {
            return Ok(None);
        };
        let blocks: Vec<&KvBlock> = held.iter().map(|state| state.kv()).collect();
        let old_kv = KvCache::from_shared_blocks(model.kv_layout(), model.device(), &blocks, 0)
            .map_err(EngineError::from)?;
        Ok(Some((found, old_kv)))
    }
}

/// Tokens in the n-grams [`shares_enough`] compares.
const SHINGLE: usize = 8;

/// Whether `tokens` likely matches at least `wanted` tokens of `old`: whether that many of its
/// tokens lie in 8-token windows that occur in `old` (one hashed pass over each). A filter, not
/// a bound: matched runs shorter than a window are not counted.
fn shares_enough(old: &[u32], tokens: &[u32], wanted: usize) -> bool {
    if old.len() < SHINGLE || tokens.len() < SHINGLE {
        return false;
    }
    let windows: HashSet<&[u32]> = old.windows(SHINGLE).collect();
    let mut covered = vec![false; tokens.len()];
    for (start, window) in tokens.windows(SHINGLE).enumerate() {
        if windows.contains(window) {
            covered[start..start + SHINGLE].fill(true);
        }
    }
    covered.iter().filter(|&&covered| covered).count() >= wanted
}

/// The plan of `tokens` (at positions 0, 1, …) reusing `found`'s matched rows of `old_kv`, one
/// span per run of rows that moved by the same shift, and each span's rows at their new
/// positions.
fn spliced_runs(
    model: &Model,
    found: &Match,
    old_kv: &KvCache,
    tokens: &[u32],
) -> Result<(SplicePlan, Vec<KvBlock>), InferenceError> {
    let mut runs: Vec<Vec<(usize, usize)>> = Vec::new();
    for &(row, index) in &found.pairs {
        match runs.last_mut() {
            Some(run)
                if run.last().is_some_and(|&(last_row, last_index)| {
                    row == last_row + 1 && index == last_index + 1
                }) =>
            {
                run.push((row, index));
            }
            _ => runs.push(vec![(row, index)]),
        }
    }
    let mut spans = Vec::with_capacity(runs.len());
    let mut blocks = Vec::with_capacity(runs.len());
    let mut reused = vec![false; tokens.len()];
    for run in runs {
        let rows: Vec<usize> = run.iter().map(|&(row, _)| row).collect();
        let positions: Vec<u32> = run.iter().map(|&(_, index)| index as u32).collect();
        let block = old_kv.gather(&rows).map_err(EngineError::from)?;
        let block = match block.positions() == positions.as_slice() {
            true => block,
            false => model.reposition(&block, &positions)?,
        };
        for &(_, index) in &run {
            reused[index] = true;
        }
        spans.push(PlannedSpan {
            unit: UnitId(0),
            tokens: run.iter().map(|&(_, index)| tokens[index]).collect(),
            encoded_positions: rows.iter().map(|&row| row as u32).collect(),
            rows,
            positions,
        });
        blocks.push(block);
    }
    let (new_tokens, new_positions) = tokens
        .iter()
        .enumerate()
        .filter(|&(index, _)| !reused[index])
        .map(|(index, &token)| (token, index as u32))
        .unzip();
    let plan = SplicePlan {
        spans,
        new_tokens,
        new_positions,
        all_tokens: tokens.to_vec(),
        all_positions: (0..tokens.len() as u32).collect(),
    };
    Ok((plan, blocks))
}

#[cfg(test)]
mod tests {
    use super::shares_enough;

    #[test]
    fn only_prompts_sharing_enough_windows_are_diffed() {
        let old: Vec<u32> = (0..200).collect();
        let mut edited = old.clone();
        edited[100] = 9_999;
        assert!(shares_enough(&old, &edited, 150));
        // Every token but the changed one lies in a shared window.
        assert!(shares_enough(&old, &edited, 199));
        assert!(!shares_enough(&old, &edited, 200));
        let unrelated: Vec<u32> = (1_000..1_200).collect();
        assert!(!shares_enough(&old, &unrelated, 64));
        assert!(!shares_enough(&old, &old[..5], 1));
    }
}
