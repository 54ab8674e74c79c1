//! Attention of a few queries (a decode step) over a layer's cached K/V, in plain loops over
//! the cache's own `(n_keys, n_kv_heads, head_dim)` rows, f32 or f16: no transposed copies of K
//! and V, no score tensor, no trip through candle's matmul, which for one query cost more than
//! the arithmetic.
//!
//! The work is cut into items of (query, KV head, run of visible keys), flash-decoding style:
//! the query heads of one KV head read each cached row together, and cutting the keys keeps
//! every core busy whatever the head count (SmolLM2's three KV heads left one of two cores idle
//! a third of the time when items were whole heads). Each item leaves, per head, its largest
//! score, its softmax denominator and its unnormalised output; the items of one (query, head)
//! are then merged by rescaling to the common maximum.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod rows;

use std::ops::Range;
use std::sync::Mutex;

use candle_core::{DType, Tensor};

use super::KernelError;
use super::KvSegment;
use super::exp_kernel::exp_shifted_sum;
use super::kv_rows::{self, KvRows};
use super::masked_softmax::Visibility;
use super::partial_softmax::{HEADER, merge_parts};

/// Items per pool thread the keys are cut into, so a thread that finishes early takes more.
const ITEMS_PER_THREAD: usize = 8;

/// Fewest keys per item: below this, merging partial results costs more than it balances.
const MIN_KEYS_PER_ITEM: usize = 64;

/// What one item computes: `group` consecutive query heads of KV head `kv_head` over some keys.
/// Its output holds, for each head, `[max score, Σ e^(score − max), Σ e^(score − max)·v]`
/// (`2 + head_dim` values, [`ItemShape::item_stride`]).
#[derive(Clone, Copy)]
struct ItemShape {
    group: usize,
    head_dim: usize,
    /// Elements of one cached row (every KV head).
    row_len: usize,
    /// Where this item's KV head starts in a row.
    kv_start: usize,
}

impl ItemShape {
    fn item_stride(&self) -> usize {
        self.head_dim + HEADER
    }

    /// Key `key`'s slice of this item's KV head (bounds-checked).
    #[inline(always)]
    fn row<'a, T>(&self, rows: &'a [T], key: u32) -> &'a [T] {
        &rows[key as usize * self.row_len + self.kv_start..][..self.head_dim]
    }

    /// Turns each head's `n` scores into `e^(score − max)` and writes its max and their sum at
    /// the head of its output.
    fn softmax_numerators(&self, scores: &mut [f32], n: usize, out: &mut [f32]) {
        for (head_scores, head_out) in scores
            .chunks_exact_mut(n)
            .zip(out.chunks_exact_mut(self.item_stride()))
        {
            let max = head_scores
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            head_out[0] = max;
            head_out[1] = exp_shifted_sum(head_scores, max);
        }
    }
}

/// The keys of one item: a run of one query row's visible keys, all in one segment.
struct Item {
    row: usize,
    kv_head: usize,
    segment: usize,
    /// Indices into the row's [`Visible::keys`].
    keys: Range<usize>,
}

/// The keys one query sees, as indices within their segments, segment after segment.
struct Visible {
    keys: Vec<u32>,
    /// Per segment, its range of `keys`.
    by_segment: Vec<Range<usize>>,
}

/// `softmax(q k^T under the position mask) v` for `queries` `(n, n_heads, head_dim)` (already
/// scaled) over the keys and values of `segments` (`(rows, n_kv_heads, head_dim)` each, read in
/// place) at `key_positions`; `(n, n_heads * head_dim)`, or `None` when a tensor is not a
/// contiguous CPU tensor (f32 queries; f32, f16 or bf16 keys and values) — the caller then
/// takes the general path. A query that sees no key gets zeros, as `masked_softmax` gives.
pub(super) fn attend_few(
    queries: &Tensor,
    query_positions: &[u32],
    segments: &[KvSegment],
    key_positions: &[u32],
    window: Option<usize>,
) -> Result<Option<Tensor>, KernelError> {
    attend_cut(
        queries,
        query_positions,
        (segments, key_positions),
        window,
        Cut::default(),
    )
}

/// How a call is cut and run; the defaults are what [`attend_few`] uses, the tests try others.
#[derive(Clone, Copy, Default)]
struct Cut {
    /// Keys per item; from the pool's size when `None`.
    keys_per_item: Option<usize>,
    /// Take the portable item kernel even where the AVX2 one could run.
    portable: bool,
}

fn attend_cut(
    queries: &Tensor,
    query_positions: &[u32],
    (segments, key_positions): (&[KvSegment], &[u32]),
    window: Option<usize>,
    cut: Cut,
) -> Result<Option<Tensor>, KernelError> {
    let (n_queries, n_heads, head_dim, _, n_kv_heads) =
        kv_rows::attention_dims(queries, query_positions, segments, key_positions)?;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || queries.dtype() != DType::F32 {
        return Ok(None);
    }
    let group = n_heads / n_kv_heads;
    let queries = queries.contiguous()?;
    // Which keys each query sees, as indices: a sliding window's hidden keys cost nothing.
    let visibility = Visibility::new(window);
    let starts = kv_rows::segment_starts(segments);
    let visible: Vec<Visible> = query_positions
        .iter()
        .map(|&query| {
            let mut keys = Vec::new();
            let by_segment = starts
                .windows(2)
                .map(|bounds| {
                    let first = keys.len();
                    keys.extend(
                        (0u32..)
                            .zip(&key_positions[bounds[0]..bounds[1]])
                            .filter(|&(_, &key)| visibility.sees(query, key))
                            .map(|(index, _)| index),
                    );
                    first..keys.len()
                })
                .collect();
            Visible { keys, by_segment }
        })
        .collect();
    let items = plan_items(&visible, n_kv_heads, cut.keys_per_item);
    let stride = group * (head_dim + HEADER);
    let mut partials = vec![0f32; items.len() * stride];
    let row_len = n_kv_heads * head_dim;
    let done = KvRows::with(&queries, |q| {
        kv_rows::with_segments(segments, row_len, |k, v| {
            let KvRows::F32(q) = q else { return false };
            let outputs: Vec<Mutex<&mut [f32]>> =
                partials.chunks_mut(stride).map(Mutex::new).collect();
            let run_item = |index: usize, scores: &mut Vec<f32>| {
                let item = &items[index];
                let shape = ItemShape {
                    group,
                    head_dim,
                    row_len,
                    kv_start: item.kv_head * head_dim,
                };
                let first_head = item.row * n_heads + item.kv_head * group;
                let queries = &q[first_head * head_dim..][..group * head_dim];
                let mut out = match outputs[index].lock() {
                    Ok(out) => out,
                    Err(poisoned) => poisoned.into_inner(),
                };
                let visible = &visible[item.row].keys[item.keys.clone()];
                let kv = (k[item.segment], v[item.segment]);
                run_kernel(&shape, queries, kv, visible, scores, &mut out, cut);
            };
            // Items are independent: candle's worker pool (the one the matrix products
            // use, already awake) hands them out from a shared cursor.
            candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
                let mut scores = Vec::new();
                range.for_each(|index| run_item(index, &mut scores));
            });
            true
        })
    });
    if done != Some(Some(true)) {
        return Ok(None);
    }
    let out = merge(&items, &partials, (n_queries, n_heads, head_dim), group);
    Ok(Some(Tensor::from_vec(
        out,
        (n_queries, n_heads * head_dim),
        queries.device(),
    )?))
}

/// The items of every (query, KV head): its visible keys in each segment cut into runs of
/// `keys_per_item`, or, by default, into the runs a call for that query alone would cut: enough
/// for [`ITEMS_PER_THREAD`] items per pool thread, none shorter than [`MIN_KEYS_PER_ITEM`]. So a
/// query's sums run in the same order whatever other queries share the call (a pass verifying
/// drafted tokens gives each row the very result of a decode step of that row alone). Items of
/// one (query, KV head) are consecutive.
fn plan_items(visible: &[Visible], n_kv_heads: usize, keys_per_item: Option<usize>) -> Vec<Item> {
    let threads = candle_core::utils::get_num_threads().max(1);
    let runs = (threads * ITEMS_PER_THREAD).div_ceil(n_kv_heads.max(1));
    let mut items = Vec::new();
    for (row, seen) in visible.iter().enumerate() {
        let keys_per_item = keys_per_item
            .unwrap_or_else(|| seen.keys.len().div_ceil(runs).max(MIN_KEYS_PER_ITEM))
            .max(1);
        for kv_head in 0..n_kv_heads {
            for (segment, keys) in seen.by_segment.iter().enumerate() {
                for start in keys.clone().step_by(keys_per_item) {
                    items.push(Item {
                        row,
                        kv_head,
                        segment,
                        keys: start..keys.end.min(start + keys_per_item),
                    });
                }
            }
        }
    }
    items
}

fn run_kernel(
    shape: &ItemShape,
    queries: &[f32],
    kv: (KvRows, KvRows),
    visible: &[u32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
    cut: Cut,
) {
    #[cfg(target_arch = "x86_64")]
    if !cut.portable
        && super::cpu_features::avx2()
        && let Some(rows) = avx2::handles(shape, kv.0, kv.1)
    {
        // SAFETY: `cpu_features::avx2` is true only where avx2, fma and f16c were detected at
        // run time, and `handles` accepted the head size and gave the rows.
        return unsafe { avx2::attend_item(shape, queries, rows, visible, scores, out) };
    }
    let _ = cut.portable;
    rows::attend_item_portable(shape, queries, kv, visible, scores, out);
}

/// Each (query, head)'s output from its items' partial results: `Σ_c e^(m_c − M) o_c / Σ_c
/// e^(m_c − M) s_c` with `M` the largest `m_c`. A query with no items (no visible key) stays 0.
fn merge(
    items: &[Item],
    partials: &[f32],
    (n_queries, n_heads, head_dim): (usize, usize, usize),
    group: usize,
) -> Vec<f32> {
    let stride = head_dim + HEADER;
    let mut out = vec![0f32; n_queries * n_heads * head_dim];
    let mut first = 0;
    while first < items.len() {
        let (row, kv_head) = (items[first].row, items[first].kv_head);
        let count = items[first..]
            .iter()
            .take_while(|item| item.row == row && item.kv_head == kv_head)
            .count();
        let runs: Vec<&[f32]> = partials[first * group * stride..][..count * group * stride]
            .chunks_exact(group * stride)
            .collect();
        for h in 0..group {
            let head = kv_head * group + h;
            let target = &mut out[(row * n_heads + head) * head_dim..][..head_dim];
            merge_parts(runs.iter().map(|run| &run[h * stride..][..stride]), target);
        }
        first += count;
    }
    out
}

#[cfg(test)]
mod tests;
