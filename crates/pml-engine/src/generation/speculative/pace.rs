//! How many drafted tokens to verify in the next pass, from what passes cost on this machine and
//! model (measured as decoding goes) and how often drafts of each match length were accepted.
//!
//! A pass over `r` rows reads the weights once, so on a GPU or a wide CPU a few more rows cost
//! little; but the products' row tiles make the cost a staircase (on two Zen 4 cores a 0.5B
//! step is ~22 ms at 1 row, ~30 ms at 4, ~49 ms at 5), and a rejected draft's rows are wasted.
//! The pace picks the `k` that maximises expected tokens per second:
//! `(1 + α + … + α^k) / cost(k + 1)`, `α` the acceptance of a drafted token given the ones
//! before it were accepted. A row count not yet measured is assumed to cost what the nearest
//! smaller measured one did (optimistic, so it is tried once and then known); `k = 0` is a plain
//! step, so where drafts do not pay the loop decodes as it would without them.

/// Weight of one new observation in a pass cost's running mean.
const COST_WEIGHT: f64 = 0.25;
/// Each verdict discounts older ones by this much, so acceptance follows the answer's phase
/// (quoting a module, then explaining in its own words).
const ACCEPTANCE_DECAY: f64 = 0.9;
/// Prior acceptance counts: one accepted of two tried, weak enough that two verdicts outweigh it.
const PRIOR_ACCEPTED: f64 = 1.0;
const PRIOR_TRIED: f64 = 2.0;

/// Running estimates behind the draft length, one per decoding sequence.
#[derive(Clone, Debug)]
pub struct DraftPace {
    /// Mean seconds of a pass of `r` rows at `cost[r - 1]`, `None` until one ran.
    cost: Vec<Option<f64>>,
    /// Per match length `n` at `n - 1`: (accepted, tried) drafted tokens, decayed.
    acceptance: Vec<(f64, f64)>,
}

impl DraftPace {
    /// A pace for drafts of at most `max_draft` tokens found by matches of up to `max_match`.
    pub fn new(max_draft: usize, max_match: usize) -> Self {
        DraftPace {
            cost: vec![None; max_draft + 1],
            acceptance: vec![(0.0, 0.0); max_match.max(1)],
        }
    }

    /// The most drafted tokens this pace can ask for.
    pub fn max_draft(&self) -> usize {
        self.cost.len() - 1
    }

    /// Records a pass of `rows` rows that took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = rows.checked_sub(1).and_then(|at| self.cost.get_mut(at)) {
            *slot = Some(match *slot {
                Some(mean) => mean + COST_WEIGHT * (seconds - mean),
                None => seconds,
            });
        }
    }

    /// Records that of `drafted` tokens from a match of length `matched`, the first `accepted`
    /// were accepted; `rejected` says whether the next one was refused (a stop or the token
    /// limit ends a run with no verdict on the rest).
    pub fn record_verdict(&mut self, matched: usize, accepted: usize, rejected: bool) {
        let at = matched.clamp(1, self.acceptance.len()) - 1;
        let (kept, tried) = &mut self.acceptance[at];
        *kept = *kept * ACCEPTANCE_DECAY + accepted as f64;
        *tried = *tried * ACCEPTANCE_DECAY + (accepted + usize::from(rejected)) as f64;
    }

    /// The estimated chance that a drafted token from a match of length `matched` is accepted
    /// once the ones before it were.
    pub fn acceptance(&self, matched: usize) -> f64 {
        let (kept, tried) = self.acceptance[matched.clamp(1, self.acceptance.len()) - 1];
        (kept + PRIOR_ACCEPTED) / (tried + PRIOR_TRIED)
    }

    /// The estimated cost of a pass of `rows` rows: its measured mean, else the nearest smaller
    /// measured one (passes never get cheaper with more rows), else that of any larger measured
    /// one if it is cheaper still; 1 when nothing was measured.
    fn estimated_cost(&self, rows: usize) -> f64 {
        let at = rows - 1;
        let below = self.cost[..=at].iter().rev().find_map(|cost| *cost);
        let above = self.cost[at..]
            .iter()
            .filter_map(|cost| *cost)
            .reduce(f64::min);
        match (below, above) {
            (Some(below), Some(above)) => below.min(above),
            (Some(cost), None) | (None, Some(cost)) => cost,
            (None, None) => 1.0,
        }
    }

    /// How many of `available` drafted tokens (from a match of length `matched`) to verify:
    /// the count with the most expected tokens per second, 0 when a plain step is best.
    pub fn draft_len(&self, matched: usize, available: usize) -> usize {
        let alpha = self.acceptance(matched);
        let mut expected = 1.0;
        let mut reach = 1.0;
        let mut best = (0, expected / self.estimated_cost(1));
        for k in 1..=available.min(self.max_draft()) {
            reach *= alpha;
            expected += reach;
            let rate = expected / self.estimated_cost(k + 1);
            if rate > best.1 {
                best = (k, rate);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_rows_and_accepted_drafts_lengthen_the_draft() {
        let mut pace = DraftPace::new(8, 4);
        // Nothing measured: every length looks free, so the prior acceptance decides.
        assert_eq!(pace.draft_len(3, 8), 8);
        // A pass of 9 rows costs 3 steps, of 4 rows barely more than one.
        pace.record_pass(1, 0.020);
        pace.record_pass(4, 0.022);
        pace.record_pass(9, 0.060);
        for _ in 0..10 {
            pace.record_verdict(3, 8, false);
        }
        assert!(pace.acceptance(3) > 0.9);
        // Unmeasured 5..8 rows are assumed to cost what 4 did: tried, then known.
        assert_eq!(pace.draft_len(3, 8), 7);
        for rows in 5..=8 {
            pace.record_pass(rows, 0.050);
        }
        assert_eq!(pace.draft_len(3, 8), 3);
        assert_eq!(pace.draft_len(3, 2), 2);
    }

    #[test]
    fn rejected_drafts_and_costly_rows_fall_back_to_plain_steps() {
        let mut pace = DraftPace::new(4, 4);
        pace.record_pass(1, 0.020);
        pace.record_pass(2, 0.030);
        for _ in 0..10 {
            pace.record_verdict(1, 0, true);
        }
        // Matches of one token never held: no draft is worth a pass 1.5 times as long.
        assert!(pace.acceptance(1) < 0.2);
        assert_eq!(pace.draft_len(1, 4), 0);
        // Longer matches keep their own record, still the prior.
        assert_eq!(pace.acceptance(4), 0.5);
        // Acceptance follows the answer: after a run of accepted drafts, drafting resumes.
        for _ in 0..20 {
            pace.record_verdict(1, 4, false);
        }
        assert!(pace.draft_len(1, 4) > 0);
    }

    #[test]
    fn a_pass_cost_is_a_running_mean() {
        let mut pace = DraftPace::new(2, 1);
        pace.record_pass(2, 0.040);
        pace.record_pass(2, 0.080);
        assert!((pace.estimated_cost(2) - 0.050).abs() < 1e-12);
        // Larger measured passes bound smaller unmeasured ones from above.
        assert!((pace.estimated_cost(1) - 0.050).abs() < 1e-12);
        pace.record_pass(0, 1.0);
        pace.record_pass(9, 1.0);
        assert!((pace.estimated_cost(3) - 0.050).abs() < 1e-12);
    }
}
