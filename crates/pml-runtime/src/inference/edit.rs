//! Reuse of an edited text's cached KV (AttMemo's reuse for *similar* inputs, in the brief's
//! reading notes): a unit whose text changed by a few edits since its state was computed keeps
//! the rows of every unchanged token — aligned by a token-level diff, moved to their new
//! positions (the splice re-rotates moved K) — and computes the changed tokens as new ones.
//!
//! The result is a set of cached spans of the *old* unit plus new tokens, for a prompt bound
//! to the old layout: mode `reuse` splices the unchanged rows as they are (what llama.cpp's
//! `--cache-reuse` does by shifting chunks), mode `blend` also recomputes the cached tokens its
//! ranking says read the edit most — the tokens after an edit "took notes" of the old text, so
//! swapping in the changed tokens alone leaves the model answering from it.

use pml_compiler::plan::{BoundPrompt, CachedSpan, LayoutUnit, NewTokenKind, SchemaLayout, UnitId};

use super::InferenceError;

/// Edits beyond which the diff gives up and only the common prefix and suffix are kept: a text
/// that different is better recomputed, and the diff's memory grows with the square of them.
pub const MAX_EDIT_TOKENS: usize = 512;

/// What an edited unit reuses of its old state, and what it computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditedUnit {
    /// Runs of the old unit's rows, each at one shift (`placed_at`) to its new positions.
    pub cached: Vec<CachedSpan>,
    /// The new text's tokens no old row matches, and their positions.
    pub new_tokens: Vec<u32>,
    pub new_positions: Vec<u32>,
}

impl EditedUnit {
    /// Rows of the old state reused.
    pub fn reused(&self) -> usize {
        self.cached.iter().map(|span| span.rows.len()).sum()
    }
}

/// How unit `old` (id `old_id` in the layout its state was computed under) becomes `tokens` at
/// `positions`: every token the diff matches reuses its old row, the others are new. With
/// `prefix_only`, only the rows before the first change are reused (exact: they were computed
/// after the same tokens).
pub fn edit_unit(
    old_id: UnitId,
    old: &LayoutUnit,
    tokens: &[u32],
    positions: &[u32],
    prefix_only: bool,
) -> EditedUnit {
    let pairs: Vec<(usize, usize)> = if prefix_only {
        let prefix = common_prefix(&old.tokens, tokens);
        (0..prefix)
            .take_while(|&row| old.positions[row] == positions[row])
            .map(|row| (row, row))
            .collect()
    } else {
        matched_pairs(&old.tokens, tokens)
    };
    let first = old.positions.first().copied().map_or(0, i64::from);
    let mut cached: Vec<CachedSpan> = Vec::new();
    let mut reused = vec![false; tokens.len()];
    let mut last: Option<(usize, usize, i64)> = None;
    for (row, index) in pairs {
        let delta = i64::from(positions[index]) - i64::from(old.positions[row]);
        // The splice moves a span by `placed_at - first`, the old unit's first position: a run
        // that would need it before position 0 (more tokens deleted before it than the unit's
        // first position) is computed instead, a loss of reuse, not of correctness.
        let Ok(placed_at) = u32::try_from(first + delta) else {
            continue;
        };
        reused[index] = true;
        let continues = last.is_some_and(|(last_row, last_index, last_delta)| {
            row == last_row + 1 && index == last_index + 1 && delta == last_delta
        });
        match cached.last_mut() {
            Some(span) if continues => span.rows.push(row),
            _ => cached.push(CachedSpan {
                unit: old_id,
                rows: vec![row],
                placed_at: (delta != 0).then_some(placed_at),
            }),
        }
        last = Some((row, index, delta));
    }
    let (new_tokens, new_positions) = tokens
        .iter()
        .zip(positions)
        .zip(&reused)
        .filter(|(_, reused)| !**reused)
        .map(|((&token, &position), _)| (token, position))
        .unzip();
    EditedUnit {
        cached,
        new_tokens,
        new_positions,
    }
}

/// `bound`, a prompt bound to layout `new`, bound to `old` instead, whose units' states are
/// cached: each cached span's unit reuses the rows of the same unit of `old` (same id and path:
/// the schema's structure is unchanged, its texts edited) that the diff matches, at their new
/// positions; the rest of its rows become new text. With `prefix_only`, a unit reuses only its
/// rows before its first change that stay where they were (exact where nothing before them
/// changed).
pub fn rebind_edited(
    old: &SchemaLayout,
    new: &SchemaLayout,
    bound: &BoundPrompt,
    prefix_only: bool,
) -> Result<BoundPrompt, InferenceError> {
    let mut rebound = BoundPrompt {
        schema_name: old.schema_name.clone(),
        cached: Vec::new(),
        new_tokens: bound.new_tokens.clone(),
        new_positions: bound.new_positions.clone(),
        new_kinds: bound.new_kinds.clone(),
    };
    for span in &bound.cached {
        let (old_unit, new_unit) = (layout_unit(old, span.unit)?, layout_unit(new, span.unit)?);
        if old_unit.path != new_unit.path {
            return Err(InferenceError::InvalidPrompt(format!(
                "unit {} is `{}` in the cached layout and `{}` in the edited one",
                span.unit.0,
                old_unit.path.join("/"),
                new_unit.path.join("/")
            )));
        }
        // A collection member placed elsewhere in the prompt moves by its placement.
        let moved_by = match (span.placed_at, new_unit.positions.first()) {
            (Some(placed_at), Some(&first)) => i64::from(placed_at) - i64::from(first),
            _ => 0,
        };
        let mut tokens = Vec::with_capacity(span.rows.len());
        let mut positions = Vec::with_capacity(span.rows.len());
        for &row in &span.rows {
            let (Some(&token), Some(&position)) =
                (new_unit.tokens.get(row), new_unit.positions.get(row))
            else {
                return Err(InferenceError::InvalidPrompt(format!(
                    "row {row} of unit {}, which has {} tokens",
                    span.unit.0,
                    new_unit.tokens.len()
                )));
            };
            let position = u32::try_from(i64::from(position) + moved_by).map_err(|_| {
                InferenceError::InvalidPrompt(format!(
                    "unit {} placed at {:?} moves position {position} out of range",
                    span.unit.0, span.placed_at
                ))
            })?;
            tokens.push(token);
            positions.push(position);
        }
        let edited = edit_unit(span.unit, old_unit, &tokens, &positions, prefix_only);
        rebound.cached.extend(edited.cached);
        rebound.new_kinds.extend(std::iter::repeat_n(
            NewTokenKind::Text,
            edited.new_tokens.len(),
        ));
        rebound.new_tokens.extend(edited.new_tokens);
        rebound.new_positions.extend(edited.new_positions);
    }
    Ok(rebound)
}

fn layout_unit(layout: &SchemaLayout, id: UnitId) -> Result<&LayoutUnit, InferenceError> {
    layout.units.get(id.index()).ok_or_else(|| {
        InferenceError::InvalidPrompt(format!(
            "unit {} is not in schema `{}`'s layout",
            id.0, layout.schema_name
        ))
    })
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Index pairs `(i, j)` with `a[i] == b[j]` of a longest common subsequence of `a` and `b`,
/// ascending in both (Myers' O((n + m) d) diff between the common prefix and suffix). Past
/// [`MAX_EDIT_TOKENS`] edits, the common prefix and suffix alone.
pub fn matched_pairs(a: &[u32], b: &[u32]) -> Vec<(usize, usize)> {
    let prefix = common_prefix(a, b);
    let suffix = a[prefix..]
        .iter()
        .rev()
        .zip(b[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (middle_a, middle_b) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let mut pairs: Vec<(usize, usize)> = (0..prefix).map(|i| (i, i)).collect();
    if let Some(middle) = myers(middle_a, middle_b, MAX_EDIT_TOKENS) {
        pairs.extend(middle.into_iter().map(|(i, j)| (prefix + i, prefix + j)));
    }
    let (suffix_a, suffix_b) = (a.len() - suffix, b.len() - suffix);
    pairs.extend((0..suffix).map(|k| (suffix_a + k, suffix_b + k)));
    pairs
}

/// Myers' greedy LCS: the matched index pairs, or `None` past `max_edits` insertions and
/// deletions. `trace[d]` keeps the furthest x of every diagonal `k` in `-d..=d` reached with
/// `d` edits, so memory is O(d²).
fn myers(a: &[u32], b: &[u32], max_edits: usize) -> Option<Vec<(usize, usize)>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let slide = |mut x: isize, k: isize| {
        while x < n && x - k < m && a[x as usize] == b[(x - k) as usize] {
            x += 1;
        }
        x
    };
    // x reached on diagonal k with d edits; index k + d.
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut edits = None;
    for d in 0..=(max_edits as isize).min(n + m) {
        let previous = trace.last();
        let reached = |k: isize| previous.map_or(0, |v| v[(k + d - 1) as usize]);
        let mut row = Vec::with_capacity(2 * d as usize + 1);
        for k in (-d..=d).step_by(2) {
            let x = if d == 0 {
                0
            } else if k == -d || (k != d && reached(k - 1) < reached(k + 1)) {
                reached(k + 1)
            } else {
                reached(k - 1) + 1
            };
            let x = slide(x, k);
            // Diagonals of the other parity are not reached with d edits: fill them so the
            // next round can index every k in -d..=d.
            if k > -d {
                row.push(x);
            }
            row.push(x);
            if k == n - m && x >= n {
                edits = Some(d);
            }
        }
        trace.push(row);
        if edits.is_some() {
            break;
        }
    }
    let edits = edits?;
    let mut pairs = Vec::new();
    let (mut x, mut y) = (n, m);
    for d in (1..=edits).rev() {
        let previous = &trace[d as usize - 1];
        let reached = |k: isize| previous[(k + d - 1) as usize];
        let k = x - y;
        let down = k == -d || (k != d && reached(k - 1) < reached(k + 1));
        let previous_k = if down { k + 1 } else { k - 1 };
        let previous_x = reached(previous_k);
        // The edit step lands at (start_x, start_x - k); a diagonal of matches leads on to (x, y).
        let start_x = if down { previous_x } else { previous_x + 1 };
        while x > start_x {
            x -= 1;
            y -= 1;
            pairs.push((x as usize, y as usize));
        }
        x = previous_x;
        y = previous_x - previous_k;
    }
    while x > 0 && y > 0 {
        x -= 1;
        y -= 1;
        pairs.push((x as usize, y as usize));
    }
    pairs.reverse();
    Some(pairs)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// Length of a longest common subsequence, by the quadratic table.
    fn lcs_length(a: &[u32], b: &[u32]) -> usize {
        let mut table = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                table[i + 1][j + 1] = if a[i] == b[j] {
                    table[i][j] + 1
                } else {
                    table[i][j + 1].max(table[i + 1][j])
                };
            }
        }
        table[a.len()][b.len()]
    }

    fn check(a: &[u32], b: &[u32]) {
        let pairs = matched_pairs(a, b);
        assert!(pairs.iter().all(|&(i, j)| a[i] == b[j]), "{a:?} {b:?}");
        assert!(
            pairs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
            "{pairs:?}"
        );
        assert_eq!(pairs.len(), lcs_length(a, b), "{a:?} {b:?}");
    }

    #[test]
    fn the_diff_finds_a_longest_common_subsequence() {
        check(&[], &[]);
        check(&[1, 2, 3], &[]);
        check(&[], &[1, 2]);
        check(&[1, 2, 3], &[1, 2, 3]);
        check(&[1, 2, 3, 4, 5], &[1, 9, 3, 4, 5]);
        check(&[1, 2, 3], &[4, 5, 6]);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..300 {
            let a: Vec<u32> = (0..rng.random_range(0..40))
                .map(|_| rng.random_range(0..5))
                .collect();
            // b: a with a few random edits, or unrelated.
            let mut b = a.clone();
            for _ in 0..rng.random_range(0..6) {
                let at = rng.random_range(0..=b.len());
                match rng.random_range(0..3) {
                    0 => b.insert(at, rng.random_range(0..5)),
                    1 if at < b.len() => {
                        b.remove(at);
                    }
                    _ if at < b.len() => b[at] = rng.random_range(0..5),
                    _ => {}
                }
            }
            check(&a, &b);
            let c: Vec<u32> = (0..rng.random_range(0..30))
                .map(|_| rng.random_range(0..3))
                .collect();
            check(&a, &c);
        }
    }

    #[test]
    fn past_the_edit_limit_the_prefix_and_suffix_stay() {
        let a: Vec<u32> = (0..2000).collect();
        let mut b = a.clone();
        // Every middle token replaced: far more than MAX_EDIT_TOKENS edits.
        for token in &mut b[10..1990] {
            *token += 10_000;
        }
        let pairs = matched_pairs(&a, &b);
        assert_eq!(pairs.len(), 20);
        assert_eq!(pairs[9], (9, 9));
        assert_eq!(pairs[10], (1990, 1990));
    }

    fn unit(tokens: Vec<u32>, first: u32) -> LayoutUnit {
        let mut unit = LayoutUnit::root();
        unit.positions = (first..first + tokens.len() as u32).collect();
        unit.tokens = tokens;
        unit
    }

    #[test]
    fn unchanged_runs_are_spans_at_their_new_positions() {
        let old = unit(vec![10, 11, 12, 13, 14, 15, 16], 5);
        // 12 replaced by two tokens: 10 11 | 20 21 | 13 14 15 16, one position later after it.
        let tokens = [10, 11, 20, 21, 13, 14, 15, 16];
        let positions: Vec<u32> = (5..13).collect();
        let edited = edit_unit(UnitId(3), &old, &tokens, &positions, false);
        assert_eq!(
            edited.cached,
            vec![
                CachedSpan {
                    unit: UnitId(3),
                    rows: vec![0, 1],
                    placed_at: None,
                },
                CachedSpan {
                    unit: UnitId(3),
                    rows: vec![3, 4, 5, 6],
                    placed_at: Some(6),
                },
            ]
        );
        assert_eq!(edited.new_tokens, vec![20, 21]);
        assert_eq!(edited.new_positions, vec![7, 8]);
        assert_eq!(edited.reused(), 6);

        let prefix = edit_unit(UnitId(3), &old, &tokens, &positions, true);
        assert_eq!(prefix.reused(), 2);
        assert_eq!(prefix.new_tokens, vec![20, 21, 13, 14, 15, 16]);
    }

    #[test]
    fn a_run_that_would_move_before_position_zero_is_computed() {
        // Five tokens deleted at the start of a unit at position 2: the rest would move by -5.
        let old = unit(vec![1, 2, 3, 4, 5, 6, 7, 8], 2);
        let tokens = [6, 7, 8];
        let edited = edit_unit(UnitId(0), &old, &tokens, &[2, 3, 4], false);
        assert!(edited.cached.is_empty());
        assert_eq!(edited.new_tokens, vec![6, 7, 8]);
    }
}
