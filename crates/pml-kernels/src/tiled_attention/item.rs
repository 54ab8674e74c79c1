//! One item: a chunk of one KV head's rows over one run of keys, leaving per row `[max, sum,
//! output…]` ([`super::partial_softmax`]).

use std::cell::RefCell;

use super::super::exp_kernel::exp_shifted_sum;
use super::super::kv_rows::KvRows;
use super::super::masked_softmax::Visibility;
use super::{HEADER, Item, PANEL, Plan, Sight, TILE_ROWS, portable};

/// What every item of one call reads.
pub(super) struct Call<'a> {
    pub(super) plan: &'a Plan,
    /// `(n_kv_heads, rows per head, head_dim)`.
    pub(super) queries: &'a [f32],
    /// Each segment's rows.
    pub(super) keys: &'a [KvRows<'a>],
    pub(super) values: &'a [KvRows<'a>],
    pub(super) query_positions: &'a [u32],
    pub(super) key_positions: &'a [u32],
    pub(super) visibility: Visibility,
    pub(super) portable: bool,
}

/// An item's working memory, kept per thread across calls so a long prompt's layers do not
/// fault in fresh pages for each.
#[derive(Default)]
struct Scratch {
    /// The run's keys, widened, in panels of `PANEL` keys: `panel[t * PANEL + lane]`.
    panels: Vec<f32>,
    /// `(chunk rows, width)` scores, then softmax numerators.
    scores: Vec<f32>,
    /// The run's values widened to f32 `(keys, head_dim)`.
    values: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Runs `item`, writing its partial results into `out` (at least the chunk's rows × (head_dim +
/// HEADER) values).
pub(super) fn run_item(call: &Call<'_>, item: &Item, out: &mut [f32]) {
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => run_with(call, item, &mut scratch, out),
        // Only a re-entrant call could find it borrowed; it gets its own.
        Err(_) => run_with(call, item, &mut Scratch::default(), out),
    });
}

fn run_with(call: &Call<'_>, item: &Item, scratch: &mut Scratch, out: &mut [f32]) {
    let plan = call.plan;
    let d = plan.head_dim;
    let stride = d + HEADER;
    let keys = plan.keys_of(item.run);
    let n = keys.len();
    // The run's segment and its keys' rows within it.
    let segment = plan.runs[item.run].segment;
    let (segment_keys, segment_values) = (call.keys[segment], call.values[segment]);
    let rows = keys.start - plan.segment_starts[segment]..keys.end - plan.segment_starts[segment];
    let width = n.next_multiple_of(PANEL);
    let n_rows = item.rows.len();
    let row_len = plan.n_kv_heads * d;
    let kv_start = item.kv_head * d;

    // Keys, transposed into panels; the padding keys are zeros (their scores are masked).
    // Each buffer is only grown: every value read below is written first.
    let panels = grown(&mut scratch.panels, width * d);
    for j in n..width {
        let panel = &mut panels[(j / PANEL) * d * PANEL..][..d * PANEL];
        panel
            .iter_mut()
            .skip(j % PANEL)
            .step_by(PANEL)
            .for_each(|k| *k = 0.0);
    }
    let mut widened = [0f32; MAX_WIDENED];
    for (j, index) in rows.clone().enumerate() {
        let at = index * row_len + kv_start;
        // The cache is read once per call, mostly from memory: ask for the next rows early.
        segment_keys.prefetch(at + PREFETCH_KEYS * row_len, d);
        let key = match segment_keys {
            KvRows::F32(all) => &all[at..at + d],
            other if d <= MAX_WIDENED => {
                other.widen_into(at, &mut widened[..d]);
                &widened[..d]
            }
            other => {
                let mut long = vec![0f32; d];
                other.widen_into(at, &mut long);
                transpose_into(panels, j, d, &long);
                continue;
            }
        };
        transpose_into(panels, j, d, key);
    }

    let sight_of = |local: usize| plan.sight(item.run, (item.rows.start + local) / plan.group);
    let queries =
        &call.queries[(item.kv_head * plan.rows_per_head() + item.rows.start) * d..][..n_rows * d];
    let panels = &scratch.panels[..width * d];
    let scores = grown(&mut scratch.scores, n_rows * width);
    for start in (0..n_rows).step_by(TILE_ROWS) {
        let tile = TILE_ROWS.min(n_rows - start);
        let tile_scores = &mut scores[start * width..][..tile * width];
        if (start..start + tile).all(|local| sight_of(local) == Sight::Nothing) {
            tile_scores.fill(f32::NEG_INFINITY);
            continue;
        }
        score_tile(
            call.portable,
            &queries[start * d..][..tile * d],
            panels,
            d,
            tile_scores,
        );
    }

    // Each row's softmax over the run: hidden keys and the padding to -inf, then e^(s − max).
    let positions = &call.key_positions[keys.clone()];
    let mut any_seen = vec![false; n_rows];
    for (local, scores) in scores.chunks_exact_mut(width.max(1)).enumerate() {
        let part = &mut out[local * stride..][..stride];
        let query = call.query_positions[(item.rows.start + local) / plan.group];
        match sight_of(local) {
            Sight::Nothing => scores.fill(f32::NEG_INFINITY),
            Sight::Part => {
                for (score, &key) in scores.iter_mut().zip(positions) {
                    if !call.visibility.sees(query, key) {
                        *score = f32::NEG_INFINITY;
                    }
                }
            }
            Sight::All => {}
        }
        scores[n..].fill(f32::NEG_INFINITY);
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            scores.fill(0.0);
            part[0] = f32::NEG_INFINITY;
            part[1] = 0.0;
            part[HEADER..].fill(0.0);
        } else {
            part[0] = max;
            part[1] = exp_shifted_sum(scores, max);
            any_seen[local] = true;
        }
    }

    // Values, gathered (and widened) once into consecutive rows: read in place, an f32 cache's
    // rows of every KV head were one cache line apart per key and stalled the tiles on loads.
    let values = grown(&mut scratch.values, n * d);
    for (j, index) in rows.enumerate() {
        let at = index * row_len + kv_start;
        segment_values.prefetch(at + PREFETCH_KEYS * row_len, d);
        segment_values.widen_into(at, &mut values[j * d..][..d]);
    }
    let (values, base, v_stride) = (&scratch.values[..n * d], 0, d);
    let scores = &scratch.scores[..n_rows * width];
    for start in (0..n_rows).step_by(TILE_ROWS) {
        let tile = TILE_ROWS.min(n_rows - start);
        if !any_seen[start..start + tile].iter().any(|&seen| seen) {
            continue;
        }
        weigh_tile(
            call.portable,
            (&scores[start * width..][..tile * width], width, n),
            (values, base, v_stride),
            d,
            &mut out[start * stride..][..tile * stride],
        );
    }
}

/// Keys ahead of the one being read whose rows are prefetched.
const PREFETCH_KEYS: usize = 4;

/// Longest head widened on the stack.
const MAX_WIDENED: usize = 512;

/// `buffer[..len]`, growing `buffer` (with zeros) where it is shorter.
fn grown(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// Key `j`'s `d` values into its panel's column.
fn transpose_into(panels: &mut [f32], j: usize, d: usize, key: &[f32]) {
    let panel = &mut panels[(j / PANEL) * d * PANEL..][..d * PANEL];
    for (t, &k) in key.iter().enumerate() {
        panel[t * PANEL + j % PANEL] = k;
    }
}

/// Scores of `queries` (`tile` rows of `d`) against the panels, into `scores` (`tile` rows of
/// the panels' width).
fn score_tile(portable: bool, queries: &[f32], panels: &[f32], d: usize, scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if !portable && super::super::cpu_features::avx2() {
        use super::avx2::score_rows;
        // SAFETY: in every arm, `cpu_features::avx2` is true only where avx2 and fma were
        // detected at run time; `score_rows` checks its slices' lengths itself.
        unsafe {
            match queries.len() / d.max(1) {
                1 => score_rows::<1>(queries, panels, d, scores),
                2 => score_rows::<2>(queries, panels, d, scores),
                3 => score_rows::<3>(queries, panels, d, scores),
                4 => score_rows::<4>(queries, panels, d, scores),
                5 => score_rows::<5>(queries, panels, d, scores),
                _ => score_rows::<TILE_ROWS>(queries, panels, d, scores),
            }
        }
        return;
    }
    let _ = portable;
    portable::score_rows(queries, panels, d, scores);
}

/// `out` row r's lanes from `HEADER`: `Σ_j weights[r][j] · values[base + j * v_stride..][..d]`
/// over the run's `n` keys; `weights` holds `tile` rows of `width`.
fn weigh_tile(
    portable: bool,
    weights: (&[f32], usize, usize),
    values: (&[f32], usize, usize),
    d: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if !portable && d.is_multiple_of(8) && super::super::cpu_features::avx2() {
        use super::avx2::weigh_rows;
        // SAFETY: in every arm, as in `score_tile`; `weigh_rows` checks the lengths and the
        // head size.
        unsafe {
            match weights.0.len() / weights.1.max(1) {
                1 => weigh_rows::<1>(weights, values, d, out),
                2 => weigh_rows::<2>(weights, values, d, out),
                3 => weigh_rows::<3>(weights, values, d, out),
                4 => weigh_rows::<4>(weights, values, d, out),
                5 => weigh_rows::<5>(weights, values, d, out),
                _ => weigh_rows::<TILE_ROWS>(weights, values, d, out),
            }
        }
        return;
    }
    let _ = portable;
    portable::weigh_rows(weights, values, d, out);
}
