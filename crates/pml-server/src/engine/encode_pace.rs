//! How much of a schema's encoding one engine step does. With nothing else to do, a few hundred
//! tokens in passes of their own ([`IDLE_STEP`]); while completions are served, a few of the
//! module's tokens join the step's one pass ([`JoinedPace`]): the weights are read once for the
//! decoding rows and the encoding's, so a token waits for the extra rows' compute only, which
//! the pace holds near half a step.

use std::time::Duration;

use pml_runtime::encode::EncodeStep;

/// A step's piece with the engine otherwise idle: a few hundred tokens (a prompt arriving waits
/// for it as for a prefill chunk), each unit's pass counted as 32 tokens at least (eight small
/// modules a step), and a bound on the units looked up in the store when they are all there.
pub const IDLE_STEP: EncodeStep = EncodeStep {
    max_tokens: 256,
    max_units: 64,
    pass_tokens: 32,
};

/// The encoding's rows in a step's pass before any has been measured: one, as a pass's cost
/// jumps where its rows fill another tile (five rows cost about twice four on two cores).
const FIRST_ROWS: usize = 1;

/// The most encoding rows a pass takes: past this many a step costs about a prefill chunk.
const MAX_ROWS: usize = 64;

/// A step with encoding rows may take this much longer than one without.
const TARGET_STRETCH: f64 = 1.5;

/// How many steps join the encoding before one runs without it, to measure a step without.
const PLAIN_EVERY: u32 = 16;

/// How much each new measurement moves a smoothed step time.
const SMOOTHING: f64 = 0.3;

/// The number of the encoding's rows that join each step's pass, adjusted by what the last
/// joined step took against one without: fewer when it took more than [`TARGET_STRETCH`] times
/// as long, more when clearly less. A pass's cost does not grow linearly with its rows (tiles of
/// rows share each weight block's unpacking), so the rows are searched for, not computed.
#[derive(Debug)]
pub struct JoinedPace {
    rows: usize,
    since_plain: u32,
}

impl Default for JoinedPace {
    fn default() -> Self {
        Self {
            rows: FIRST_ROWS,
            since_plain: 0,
        }
    }
}

impl JoinedPace {
    /// The rows the next step's pass takes; `None` for a step left without them, so that a
    /// step's time without is known (every [`PLAIN_EVERY`] steps, and until one was measured).
    pub fn rows(&self, plain_step: Option<Duration>) -> Option<usize> {
        (plain_step.is_some() && self.since_plain < PLAIN_EVERY).then_some(self.rows)
    }

    /// A step ran: `joined` rows of the encoding in it (`None` or 0: a step without), taking
    /// `elapsed` where a step without takes `plain_step`.
    pub fn observe(&mut self, joined: Option<usize>, elapsed: Duration, plain_step: Duration) {
        let Some(rows) = joined.filter(|&rows| rows > 0) else {
            self.since_plain = 0;
            return;
        };
        self.since_plain += 1;
        let target = plain_step.mul_f64(TARGET_STRETCH);
        if elapsed > target {
            let scale = target.as_secs_f64() / elapsed.as_secs_f64();
            self.rows = ((rows as f64 * scale) as usize).clamp(1, rows.saturating_sub(1).max(1));
        } else if elapsed < target.mul_f64(0.85) {
            self.rows = (rows + (rows / 4).max(1)).min(MAX_ROWS);
        }
    }
}

/// How long the engine's recent steps took, smoothed.
#[derive(Debug, Default)]
pub struct StepTime {
    smoothed: Option<Duration>,
}

impl StepTime {
    pub fn observe(&mut self, elapsed: Duration) {
        self.smoothed = Some(match self.smoothed {
            Some(known) => known.mul_f64(1.0 - SMOOTHING) + elapsed.mul_f64(SMOOTHING),
            None => elapsed,
        });
    }

    pub fn get(&self) -> Option<Duration> {
        self.smoothed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Duration = Duration::from_millis(20);

    #[test]
    fn joined_rows_grow_while_a_step_stays_short_and_shrink_when_it_does_not() {
        let mut pace = JoinedPace::default();
        assert_eq!(pace.rows(None), None, "nothing measured without rows yet");
        let first = pace
            .rows(Some(PLAIN))
            .expect("rows once a plain step is known");
        assert_eq!(first, FIRST_ROWS);
        // Cheap rows: they grow, never past the most a pass takes.
        for _ in 0..40 {
            let rows = pace.rows(Some(PLAIN)).or(Some(0));
            pace.observe(rows, PLAIN + Duration::from_millis(1), PLAIN);
        }
        assert_eq!(pace.rows(Some(PLAIN)), Some(MAX_ROWS));
        // 1 ms a row: 10 ms of rows fit the 1.5× target.
        for _ in 0..40 {
            let rows = pace.rows(Some(PLAIN));
            let cost = Duration::from_millis(rows.unwrap_or(0) as u64);
            pace.observe(rows, PLAIN + cost, PLAIN);
        }
        let settled = pace.rows(Some(PLAIN)).unwrap_or(pace.rows);
        assert!((6..=10).contains(&settled), "{settled} rows");
        // Slow rows shrink to one, never none.
        for _ in 0..40 {
            let rows = pace.rows(Some(PLAIN));
            pace.observe(rows, Duration::from_secs(1), PLAIN);
        }
        assert_eq!(pace.rows, 1);
    }

    #[test]
    fn every_so_many_joined_steps_one_runs_without() {
        let mut pace = JoinedPace::default();
        let joined = (0..PLAIN_EVERY)
            .map(|_| {
                let rows = pace.rows(Some(PLAIN));
                pace.observe(rows, PLAIN, PLAIN);
                rows
            })
            .filter(Option::is_some)
            .count();
        assert_eq!(joined, PLAIN_EVERY as usize);
        assert_eq!(pace.rows(Some(PLAIN)), None);
        pace.observe(None, PLAIN, PLAIN);
        assert!(pace.rows(Some(PLAIN)).is_some());
    }
}
