//! Attention of a block of queries (a cached prompt's new tokens, a prefill) over a layer's
//! cached K/V, flash-attention style, with no score matrix and no copy of the cache.
//!
//! The work is cut into items of (KV head, chunk of query rows, run of keys), the rows being
//! every (query, query head) that shares the KV head. An item widens its run's keys once into
//! panels of [`PANEL`] transposed keys and scores the chunk's rows against them in register
//! tiles (six rows × sixteen keys: each key element loaded serves six rows), takes each row's
//! softmax over the run, and multiplies by the run's values in tiles of six rows × sixteen
//! lanes. The matrix-product path it replaces packed these small operands per call and wrote a
//! score matrix for the softmax to read back: for a cached prompt's ~20 new tokens over 4k
//! cached ones that was half of the compute.
//!
//! Runs no query of a chunk can see (a sliding window's past, a causal prefill's future) are
//! never read; runs are merged exactly as in flash-decoding ([`super::partial_softmax`]).

#[cfg(target_arch = "x86_64")]
mod avx2;
mod item;
mod portable;

use std::ops::Range;
use std::sync::Mutex;

use candle_core::{DType, Tensor};

use super::KernelError;
use super::KvSegment;
use super::kv_rows;
use super::masked_softmax::Visibility;
use super::partial_softmax::{HEADER, merge_parts};
use item::{Call, run_item};

/// Keys per panel: two AVX2 vectors of scores.
const PANEL: usize = 16;

/// Rows per register tile.
const TILE_ROWS: usize = 6;

/// Items per pool thread the work is cut into, so a thread that finishes early takes more.
const ITEMS_PER_THREAD: usize = 8;

/// Fewest and most keys per run: fewer makes merging cost more than it balances; more
/// outgrows the caches (an item's scores are rows × keys f32).
const MIN_KEYS_PER_RUN: usize = 64;
const MAX_KEYS_PER_RUN: usize = 256;

/// Most rows per chunk: an item's scores stay within the L2 cache.
const ROWS_PER_CHUNK: usize = 96;

/// How a query sees a run of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sight {
    Nothing,
    /// Some keys, or possibly all or none: the item checks each.
    Part,
    All,
}

/// Keys of one segment, read together by the items of one run.
struct Run {
    segment: usize,
    /// Indices among all the call's keys.
    keys: Range<usize>,
}

/// The keys of one item: one chunk of a KV head's rows over one run of keys.
struct Item {
    kv_head: usize,
    rows: Range<usize>,
    run: usize,
}

/// How one call is cut.
struct Plan {
    n_queries: usize,
    group: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Where each segment's keys start among the call's, then their end.
    segment_starts: Vec<usize>,
    /// Runs never cross a segment.
    runs: Vec<Run>,
    /// `sight[run * n_queries + query]`.
    sight: Vec<Sight>,
    items: Vec<Item>,
    rows_per_chunk: usize,
}

impl Plan {
    fn rows_per_head(&self) -> usize {
        self.n_queries * self.group
    }

    fn keys_of(&self, run: usize) -> Range<usize> {
        self.runs[run].keys.clone()
    }

    fn sight(&self, run: usize, query: usize) -> Sight {
        self.sight[run * self.n_queries + query]
    }

    /// Values one item leaves: `[max, sum, output…]` per row of a whole chunk.
    fn item_len(&self) -> usize {
        self.rows_per_chunk * (self.head_dim + HEADER)
    }
}

/// How a call is cut and run; the defaults are what [`attend_tiled`] uses, the tests try others.
#[derive(Clone, Copy, Default)]
struct Cut {
    keys_per_run: Option<usize>,
    rows_per_chunk: Option<usize>,
    /// Take the portable tile kernels even where the AVX2 ones could run.
    portable: bool,
}

/// `softmax(q k^T under the position mask) v` for `queries` `(n, n_heads, head_dim)` (already
/// scaled) over the keys and values of `segments` (`(rows, n_kv_heads, head_dim)` each, read in
/// place) at `key_positions`; `(n, n_heads * head_dim)`, or `None` when a tensor is not a
/// contiguous CPU tensor (f32 queries; f32, f16 or bf16 keys and values) — the caller then
/// takes another path. A query that sees no key gets zeros, as `masked_softmax` gives.
pub(super) fn attend_tiled(
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

fn attend_cut(
    queries: &Tensor,
    query_positions: &[u32],
    (segments, key_positions): (&[KvSegment], &[u32]),
    window: Option<usize>,
    cut: Cut,
) -> Result<Option<Tensor>, KernelError> {
    let (n_queries, n_heads, head_dim, _, n_kv_heads) =
        kv_rows::attention_dims(queries, query_positions, segments, key_positions)?;
    if n_kv_heads == 0
        || n_heads % n_kv_heads != 0
        || head_dim == 0
        || queries.dtype() != DType::F32
        || !queries.device().is_cpu()
    {
        return Ok(None);
    }
    let group = n_heads / n_kv_heads;
    // Row r of KV head h is query r / group's head h * group + r % group: (n_kv_heads,
    // n_queries * group, head_dim), so an item's rows are consecutive.
    let packed = queries
        .reshape((n_queries, n_kv_heads, group, head_dim))?
        .transpose(0, 1)?
        .contiguous()?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let visibility = Visibility::new(window);
    let plan = Plan::new(
        (n_queries, group, n_kv_heads, head_dim),
        (query_positions, key_positions),
        &kv_rows::segment_starts(segments),
        window,
        cut,
    );
    let mut partials = vec![0f32; plan.items.len() * plan.item_len()];
    let done = kv_rows::with_segments(segments, n_kv_heads * head_dim, |k, v| {
        let call = Call {
            plan: &plan,
            queries: &packed,
            keys: k,
            values: v,
            query_positions,
            key_positions,
            visibility,
            portable: cut.portable,
        };
        let outputs: Vec<Mutex<&mut [f32]>> = partials
            .chunks_mut(plan.item_len().max(1))
            .map(Mutex::new)
            .collect();
        // Items are independent: candle's worker pool (the one the matrix products use,
        // already awake) hands them out from a shared cursor.
        candle_core::utils::barrier_pool().execute_chunked(plan.items.len(), |range| {
            for index in range {
                let mut out = match outputs[index].lock() {
                    Ok(out) => out,
                    Err(poisoned) => poisoned.into_inner(),
                };
                run_item(&call, &plan.items[index], &mut out);
            }
        });
        true
    });
    if done != Some(true) {
        return Ok(None);
    }
    let out = merge(&plan, &partials);
    Ok(Some(
        Tensor::from_vec(
            out,
            (n_kv_heads, n_queries, group, head_dim),
            queries.device(),
        )?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((n_queries, n_heads * head_dim))?,
    ))
}

impl Plan {
    fn new(
        (n_queries, group, n_kv_heads, head_dim): (usize, usize, usize, usize),
        (query_positions, key_positions): (&[u32], &[u32]),
        segment_starts: &[usize],
        window: Option<usize>,
        cut: Cut,
    ) -> Self {
        let n_keys = key_positions.len();
        let rows_per_head = n_queries * group;
        let rows_per_chunk = cut
            .rows_per_chunk
            .unwrap_or(ROWS_PER_CHUNK)
            .min(rows_per_head)
            .max(1);
        let n_chunks = rows_per_head.div_ceil(rows_per_chunk);
        let keys_per_run = cut.keys_per_run.unwrap_or_else(|| {
            // A window hides all but about its width (plus the queries' spread) from a call.
            let spread = query_positions
                .iter()
                .max()
                .zip(query_positions.iter().min());
            let spread = spread.map_or(0, |(max, min)| (max - min) as usize);
            let seen = window.map_or(n_keys, |window| n_keys.min(window + spread));
            let threads = candle_core::utils::get_num_threads().max(1);
            let runs = (threads * ITEMS_PER_THREAD).div_ceil((n_kv_heads * n_chunks).max(1));
            seen.div_ceil(runs.max(1))
                .next_multiple_of(PANEL)
                .clamp(MIN_KEYS_PER_RUN, MAX_KEYS_PER_RUN)
        });
        let keys_per_run = keys_per_run.max(1);
        let runs: Vec<Run> = segment_starts
            .windows(2)
            .enumerate()
            .flat_map(|(segment, bounds)| {
                (bounds[0]..bounds[1])
                    .step_by(keys_per_run)
                    .map(move |start| Run {
                        segment,
                        keys: start..bounds[1].min(start + keys_per_run),
                    })
            })
            .collect();
        let n_runs = runs.len();
        let visibility = Visibility::new(window);
        let mut sight = Vec::with_capacity(n_runs * n_queries);
        for run in &runs {
            let positions = &key_positions[run.keys.clone()];
            let lowest = positions.iter().copied().min().unwrap_or(0);
            let highest = positions.iter().copied().max().unwrap_or(0);
            sight.extend(query_positions.iter().map(|&query| {
                // Positions between the run's extremes may be missing: only the extremes
                // decide All and Nothing, the item checks each key of a Part.
                if visibility.sees(query, highest) && visibility.sees(query, lowest) {
                    Sight::All
                } else if lowest > query || !visibility.sees(query, highest.min(query)) {
                    Sight::Nothing
                } else {
                    Sight::Part
                }
            }));
        }
        let mut plan = Self {
            n_queries,
            group,
            n_kv_heads,
            head_dim,
            segment_starts: segment_starts.to_vec(),
            runs,
            sight,
            items: Vec::new(),
            rows_per_chunk,
        };
        for kv_head in 0..n_kv_heads {
            for chunk in 0..n_chunks {
                let rows = chunk * rows_per_chunk..rows_per_head.min((chunk + 1) * rows_per_chunk);
                let queries = rows.start / group..(rows.end - 1) / group + 1;
                for run in 0..n_runs {
                    if queries
                        .clone()
                        .any(|query| plan.sight(run, query) != Sight::Nothing)
                    {
                        plan.items.push(Item {
                            kv_head,
                            rows: rows.clone(),
                            run,
                        });
                    }
                }
            }
        }
        plan
    }
}

/// Rows merged per unit of work handed to a pool thread.
const MERGE_ROWS: usize = 16;

/// Each row's output from its items' partial results, `(n_kv_heads, rows per head, head_dim)`
/// (a row with no items stays 0), merged on the pool.
fn merge(plan: &Plan, partials: &[f32]) -> Vec<f32> {
    let (d, rows_per_head) = (plan.head_dim, plan.rows_per_head());
    let stride = d + HEADER;
    let mut out = vec![0f32; plan.n_kv_heads * rows_per_head * d];
    let item_parts: Vec<&[f32]> = partials.chunks(plan.item_len().max(1)).collect();
    // Units of at most MERGE_ROWS rows of one (KV head, chunk), with its items.
    let mut units = Vec::new();
    let mut first = 0;
    while first < plan.items.len() {
        let (kv_head, rows) = (plan.items[first].kv_head, plan.items[first].rows.clone());
        let count = plan.items[first..]
            .iter()
            .take_while(|item| item.kv_head == kv_head && item.rows == rows)
            .count();
        for start in rows.clone().step_by(MERGE_ROWS) {
            let end = rows.end.min(start + MERGE_ROWS);
            units.push((first..first + count, kv_head, rows.start, start..end));
        }
        first += count;
    }
    // The units' rows are disjoint and in order: cut the output at their bounds.
    let mut targets = Vec::with_capacity(units.len());
    let mut rest = &mut out[..];
    let mut consumed = 0;
    for (_, kv_head, _, rows) in &units {
        let start = (kv_head * rows_per_head + rows.start) * d;
        let (_, tail) = rest.split_at_mut(start - consumed);
        let (target, tail) = tail.split_at_mut(rows.len() * d);
        targets.push(Mutex::new(target));
        rest = tail;
        consumed = start + rows.len() * d;
    }
    candle_core::utils::barrier_pool().execute_chunked(units.len(), |range| {
        for index in range {
            let (items, _, chunk_start, rows) = &units[index];
            let mut target = match targets[index].lock() {
                Ok(target) => target,
                Err(poisoned) => poisoned.into_inner(),
            };
            for (row, target) in rows.clone().zip(target.chunks_exact_mut(d)) {
                let local = row - chunk_start;
                merge_parts(
                    item_parts[items.clone()]
                        .iter()
                        .map(|part| &part[local * stride..][..stride]),
                    target,
                );
            }
        }
    });
    out
}

#[cfg(test)]
mod tests;
