//! How many drafted tokens to verify in the next pass, from what passes cost on this machine and
//! model (measured as decoding goes) and how often drafts of each match length were accepted.
//!
//! A pass over `r` rows reads the weights once, so on a GPU or a wide CPU a few more rows cost
//! little; but the products' row tiles make the cost a staircase (on two Zen 4 cores a 0.5B
//! step is ~22 ms at 1 row, ~30 ms at 4, ~49 ms at 5), and a rejected draft's rows are wasted.
//! The pace picks the rows that maximise expected tokens per second: for one sequence
//! `(1 + α + … + α^k) / cost(k + 1)`, `α` the acceptance of a drafted token given the ones
//! before it were accepted; for several sharing a pass, the drafts of highest expected value
//! across them, as many as raise the pass's expected tokens per second. A row count not yet
//! measured is assumed to cost what the nearest smaller measured one did (optimistic, so it is
//! tried once and then known), up to twice that one (or twice the largest measured); no drafts
//! is a plain step, so where drafts do not pay the loop decodes as it would without them.

/// How many times more rows a measured pass may have than the measured one below it for the
/// line between their costs to price the rows between ([`PassCosts::estimate`]).
const FAR: usize = 4;

/// Weight of one new observation in a pass cost's running mean.
const COST_WEIGHT: f64 = 0.25;
/// Each verdict discounts older ones by this much, so acceptance follows the answer's phase
/// (quoting a module, then explaining in its own words).
const ACCEPTANCE_DECAY: f64 = 0.9;
/// Most tried drafts per match length that an answer's pace takes from the server's shared
/// record ([`Acceptance::rate_with`]): enough that the workload's measured rate outweighs the
/// prior, few enough that an answer's own verdicts outweigh it within a few passes.
const LEARNT_WEIGHT: f64 = 8.0;
/// Prior acceptance of a draft from a match of `n` tokens, as counts: `n` accepted of `n + 2`
/// tried (a third for one matching token, two thirds for four), weak enough that a few verdicts
/// outweigh it. A lone matching token predicts little; a short answer must not pay to learn so.
fn prior(matched: usize) -> (f64, f64) {
    let n = matched as f64;
    (n, n + 2.0)
}

/// Moves the running mean `mean` toward `value` by [`COST_WEIGHT`] (the first value starts it).
pub fn update_mean(mean: &mut Option<f64>, value: f64) {
    *mean = Some(match *mean {
        Some(mean) => mean + COST_WEIGHT * (value - mean),
        None => value,
    });
}

/// Mean seconds of a pass by its number of rows, measured.
#[derive(Clone, Debug)]
pub struct PassCosts {
    /// The mean of a pass of `r` rows at `r - 1`, `None` until one ran.
    cost: Vec<Option<f64>>,
}

impl PassCosts {
    /// Costs of passes of up to `max_rows` rows (larger ones are estimated from these).
    pub fn new(max_rows: usize) -> Self {
        PassCosts {
            cost: vec![None; max_rows.max(1)],
        }
    }

    /// Records a pass of `rows` rows that took `seconds`.
    pub fn record(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = rows.checked_sub(1).and_then(|at| self.cost.get_mut(at)) {
            update_mean(slot, seconds);
        }
    }

    /// The most rows a pass may have before larger ones are measured: twice the largest measured
    /// (1, a plain step, before any), so the costs are learnt at 2, 4, 8 rows rather than by a
    /// first pass of every row at once, which a short answer would not win back.
    pub fn explorable(&self) -> usize {
        self.cost
            .iter()
            .rposition(Option::is_some)
            .map_or(1, |at| 2 * (at + 1))
    }

    /// Whether a pass of `rows` rows ran (within the table).
    pub fn measured(&self, rows: usize) -> bool {
        rows.checked_sub(1)
            .and_then(|at| self.cost.get(at))
            .is_some_and(Option::is_some)
    }

    /// The estimated cost of a pass of `rows` rows: its measured mean; between two measured
    /// row counts, the straight line between their means (the products' cost rises in steps of
    /// row tiles, so this errs high between a cheap few-row pass and a long prefill chunk);
    /// above every measured count, the largest one's (an optimistic guess, tried once within
    /// [`Self::explorable`] and then known); below every one, the smallest's; 1 before any.
    /// Where the measured count above is more than [`FAR`] times the one below (a prefill
    /// chunk's above a decode step's), it says little of the rows between: up to twice the one
    /// below, when that is no more than one sequence's pass of [`super::MAX_DRAFT`] drafts, they
    /// are guessed at its cost too, as above every count, and the line starts there.
    pub fn estimate(&self, rows: usize) -> f64 {
        let at = rows.clamp(1, self.cost.len()) - 1;
        let below = self.cost[..=at]
            .iter()
            .enumerate()
            .rev()
            .find_map(|(index, cost)| cost.map(|cost| (index, cost)));
        let above = self.cost[at..]
            .iter()
            .enumerate()
            .find_map(|(offset, cost)| cost.map(|cost| (at + offset, cost)));
        match (below, above) {
            (Some((low, low_cost)), Some((high, high_cost))) if high > low => {
                // Indices are rows - 1. Only passes of one sequence's size are guessed so: each
                // guess is a pass tried once, and a batch's is as costly as it is large.
                let guessed = 2 * (low + 1);
                let low = match high + 1 > FAR * (low + 1) && guessed <= super::MAX_DRAFT + 1 {
                    true => guessed - 1,
                    false => low,
                };
                let share = at.saturating_sub(low) as f64 / (high - low) as f64;
                low_cost + share * (high_cost - low_cost)
            }
            (Some((_, cost)), _) | (None, Some((_, cost))) => cost,
            (None, None) => 1.0,
        }
    }
}

/// How often one sequence's drafts were accepted, per match length.
#[derive(Clone, Debug)]
pub struct Acceptance {
    /// Per match length `n` at `n - 1`: (accepted, tried) drafted tokens, decayed.
    by_match: Vec<(f64, f64)>,
}

impl Acceptance {
    /// Acceptance of drafts found by matches of up to `max_match` tokens.
    pub fn new(max_match: usize) -> Self {
        Acceptance {
            by_match: vec![(0.0, 0.0); max_match.max(1)],
        }
    }

    /// Records that of the tokens drafted from a match of length `matched`, the first
    /// `accepted` were accepted; `rejected` says whether the next one was refused (a stop or the
    /// token limit ends a run with no verdict on the rest).
    pub fn record(&mut self, matched: usize, accepted: usize, rejected: bool) {
        let at = matched.clamp(1, self.by_match.len()) - 1;
        let (kept, tried) = &mut self.by_match[at];
        *kept = *kept * ACCEPTANCE_DECAY + accepted as f64;
        *tried = *tried * ACCEPTANCE_DECAY + (accepted + usize::from(rejected)) as f64;
    }

    /// The estimated chance that a drafted token from a match of length `matched` is accepted
    /// once the ones before it were.
    pub fn rate(&self, matched: usize) -> f64 {
        self.rate_with(matched, None)
    }

    /// [`Self::rate`], with `shared`'s counts (the record of every answer a server decodes,
    /// this one's included) added at a weight of at most [`LEARNT_WEIGHT`] tried: answers of a
    /// workload draft alike, so a short answer, and each sequence of a batch after its first
    /// verdicts, is paced by what the workload's drafts measured rather than the prior alone.
    pub fn rate_with(&self, matched: usize, shared: Option<&Acceptance>) -> f64 {
        let at = matched.clamp(1, self.by_match.len()) - 1;
        let (kept, tried) = self.by_match[at];
        let (shared_kept, shared_tried) = shared
            .and_then(|shared| shared.by_match.get(at).copied())
            .unwrap_or((0.0, 0.0));
        let scale = (LEARNT_WEIGHT / shared_tried.max(f64::MIN_POSITIVE)).min(1.0);
        let (prior_kept, prior_tried) = prior(at + 1);
        (kept + shared_kept * scale + prior_kept) / (tried + shared_tried * scale + prior_tried)
    }
}

/// One sequence's offer to a pass: drafted tokens `available` after its own, each accepted with
/// chance `alpha` once the ones before it were.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftOffer {
    pub alpha: f64,
    pub available: usize,
}

/// How many of each offer's drafts a pass should verify: `base_rows` rows run anyway and
/// decide `base_tokens` tokens (a decoding sequence's own row decides one); a draft adds a row
/// and, with the chance that it and the drafts before it are accepted, a token. Takes the
/// drafts of highest chance first, as many as give the most expected tokens per second. Until
/// a pass of `base_rows` alone was measured, none: a plain pass priced from a larger one (a
/// prefill chunk's, or one that verified drafts) would make every draft look free, and would
/// never be measured.
pub fn draft_lengths(
    costs: &PassCosts,
    base_rows: usize,
    base_tokens: f64,
    offers: &[DraftOffer],
) -> Vec<usize> {
    if !costs.measured(base_rows) {
        return vec![0; offers.len()];
    }
    // Each offer's j-th draft is worth alpha^j: the lists are decreasing, so a prefix of the
    // merged order holds a prefix of every offer.
    let mut drafts: Vec<(f64, usize)> = offers
        .iter()
        .enumerate()
        .flat_map(|(offer_index, offer)| {
            (1..=offer.available).scan(1.0, move |reach, _| {
                *reach *= offer.alpha;
                Some((*reach, offer_index))
            })
        })
        .collect();
    drafts.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut expected = base_tokens;
    let mut best = (0, expected / costs.estimate(base_rows));
    let explorable = costs.explorable().saturating_sub(base_rows);
    for (taken, &(worth, _)) in drafts.iter().take(explorable).enumerate() {
        expected += worth;
        let rate = expected / costs.estimate(base_rows + taken + 1);
        if rate > best.1 {
            best = (taken + 1, rate);
        }
    }
    let mut lengths = vec![0; offers.len()];
    for &(_, offer_index) in &drafts[..best.0] {
        lengths[offer_index] += 1;
    }
    lengths
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(costs: &PassCosts, alpha: f64, available: usize) -> usize {
        draft_lengths(costs, 1, 1.0, &[DraftOffer { alpha, available }])[0]
    }

    #[test]
    fn cheap_rows_and_accepted_drafts_lengthen_the_draft() {
        let mut costs = PassCosts::new(9);
        let mut acceptance = Acceptance::new(4);
        // Nothing measured: a plain step first, then passes of twice the rows measured.
        assert_eq!(one(&costs, acceptance.rate(3), 8), 0);
        costs.record(1, 0.020);
        assert_eq!(one(&costs, acceptance.rate(3), 8), 1);
        costs.record(2, 0.021);
        assert_eq!(costs.explorable(), 4);
        assert_eq!(one(&costs, acceptance.rate(3), 8), 3);
        // A pass of 9 rows costs 3 steps, of 4 rows barely more than one.
        costs.record(1, 0.020);
        costs.record(4, 0.022);
        costs.record(9, 0.060);
        for _ in 0..10 {
            acceptance.record(3, 8, false);
        }
        let alpha = acceptance.rate(3);
        assert!(alpha > 0.9);
        // Unmeasured 5..8 rows cost the line from 4 rows to 9: 4 rows win.
        assert!((costs.estimate(8) - (0.022 + 0.038 * 4.0 / 5.0)).abs() < 1e-12);
        assert_eq!(one(&costs, alpha, 8), 3);
        // Measured cheaper than the line said, 8 rows win.
        for rows in 5..=8 {
            costs.record(rows, 0.023);
        }
        assert_eq!(one(&costs, alpha, 8), 7);
        for rows in 5..=8 {
            for _ in 0..20 {
                costs.record(rows, 0.050);
            }
        }
        assert_eq!(one(&costs, alpha, 8), 3);
        assert_eq!(one(&costs, alpha, 2), 2);
    }

    #[test]
    fn a_prefill_chunks_cost_far_above_does_not_price_the_few_rows_between() {
        let mut costs = PassCosts::new(64);
        costs.record(1, 0.020);
        costs.record(2, 0.021);
        costs.record(48, 0.300);
        // 3 and 4 rows are guessed at 2 rows' cost, to be tried; the line to 48 rows starts
        // at 4.
        assert_eq!(costs.estimate(4), 0.021);
        assert!((costs.estimate(26) - (0.021 + 0.279 * 22.0 / 44.0)).abs() < 1e-12);
        assert_eq!(one(&costs, 0.9, 7), 3);
        costs.record(4, 0.022);
        assert_eq!(costs.estimate(8), 0.022);
        assert_eq!(one(&costs, 0.9, 7), 7);
        // Measured: 8 rows cost twice 4, and 5..7 the line between.
        costs.record(8, 0.044);
        assert_eq!(one(&costs, 0.9, 7), 3);
        // Past one sequence's pass the line prices the rows between again: 9..16 rows, after
        // 8 (a batch of 8 plain rows) and 48.
        let mut batch = PassCosts::new(64);
        batch.record(8, 0.150);
        batch.record(48, 0.600);
        assert!((batch.estimate(16) - (0.150 + 0.450 * 8.0 / 40.0)).abs() < 1e-12);
    }

    #[test]
    fn a_shared_record_paces_an_answer_until_its_own_verdicts_outweigh_it() {
        let mut shared = Acceptance::new(4);
        for _ in 0..40 {
            shared.record(4, 0, true);
        }
        let mut own = Acceptance::new(4);
        // The workload refused every draft of a 4-token match: the prior's two thirds is gone
        // from the first pass, without the record's whole weight.
        assert!(own.rate(4) > 0.6);
        assert!(own.rate_with(4, Some(&shared)) < 0.3);
        // Untried lengths keep the prior.
        assert_eq!(own.rate_with(2, Some(&shared)), own.rate(2));
        for _ in 0..6 {
            own.record(4, 8, false);
        }
        assert!(own.rate_with(4, Some(&shared)) > 0.8);
    }

    #[test]
    fn rejected_drafts_and_costly_rows_fall_back_to_plain_steps() {
        let mut costs = PassCosts::new(5);
        let mut acceptance = Acceptance::new(4);
        costs.record(1, 0.020);
        costs.record(2, 0.030);
        for _ in 0..10 {
            acceptance.record(1, 0, true);
        }
        // Matches of one token never held: no draft is worth a pass 1.5 times as long.
        assert!(acceptance.rate(1) < 0.2);
        assert_eq!(one(&costs, acceptance.rate(1), 4), 0);
        // Longer matches keep their own record, still the prior.
        assert!((acceptance.rate(4) - 4.0 / 6.0).abs() < 1e-12);
        // Acceptance follows the answer: after a run of accepted drafts, drafting resumes.
        for _ in 0..20 {
            acceptance.record(1, 4, false);
        }
        assert!(one(&costs, acceptance.rate(1), 4) > 0);
    }

    #[test]
    fn a_shared_pass_takes_the_likeliest_drafts_and_backs_off_when_rows_cost() {
        let mut costs = PassCosts::new(64);
        let likely = DraftOffer {
            alpha: 0.9,
            available: 4,
        };
        let unlikely = DraftOffer {
            alpha: 0.2,
            available: 4,
        };
        // Rows up to 8 cost what one does (a memory-bound pass), more cost in proportion.
        for rows in 1..=8 {
            costs.record(rows, 0.020);
        }
        for rows in 9..=64 {
            costs.record(rows, 0.020 * rows as f64 / 8.0);
        }
        // Two sequences, 2 rows of their own: 6 free rows go to the likelier drafts first.
        let lengths = draft_lengths(&costs, 2, 2.0, &[likely, unlikely]);
        assert_eq!(lengths, vec![4, 2]);
        // Until a pass of their own rows alone ran, the rows above are not priced against it.
        let mut unmeasured = PassCosts::new(64);
        unmeasured.record(16, 0.040);
        assert_eq!(
            draft_lengths(&unmeasured, 2, 2.0, &[likely, unlikely]),
            vec![0, 0]
        );
        unmeasured.record(2, 0.020);
        assert_eq!(
            draft_lengths(&unmeasured, 2, 2.0, &[likely, unlikely]),
            vec![4, 0]
        );
        // Eight sequences already fill the free rows: nothing is worth a costlier pass.
        assert_eq!(
            draft_lengths(&costs, 8, 8.0, &[likely; 8]),
            vec![0; 8],
            "a compute-bound pass drafts nothing"
        );
    }

    #[test]
    fn a_pass_cost_is_a_running_mean() {
        let mut costs = PassCosts::new(3);
        costs.record(2, 0.040);
        costs.record(2, 0.080);
        assert!((costs.estimate(2) - 0.050).abs() < 1e-12);
        // Larger measured passes bound smaller unmeasured ones from above.
        assert!((costs.estimate(1) - 0.050).abs() < 1e-12);
        costs.record(0, 1.0);
        costs.record(9, 1.0);
        assert!((costs.estimate(3) - 0.050).abs() < 1e-12);
        // Past the table, the largest row count's estimate.
        assert!((costs.estimate(100) - 0.050).abs() < 1e-12);
    }
}
