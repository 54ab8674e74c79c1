//! How much of a schema's encoding one engine step does. With nothing else to do, a few hundred
//! tokens ([`IDLE_STEP`]); while completions are decoding, a piece that takes about the time the
//! scheduler gives it (half one of their steps), from the encoding's measured speed, so a token
//! waits for at most one piece: an upload leaves the gaps between a stream's tokens within twice
//! their length.

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

/// The smallest piece beside decoding completions: one pass of a few tokens, the least that
/// moves an encoding on.
const MIN_TOKENS: usize = 8;

/// How much each new measurement moves the speed estimate.
const SMOOTHING: f64 = 0.3;

/// The encoding speed measured so far.
#[derive(Debug, Default)]
pub struct EncodePace {
    tokens_per_second: Option<f64>,
}

impl EncodePace {
    /// The piece for a step that may take `budget` (`None`: the engine has nothing else to do).
    pub fn step(&self, budget: Option<Duration>) -> EncodeStep {
        let Some(budget) = budget else {
            return IDLE_STEP;
        };
        let tokens = match self.tokens_per_second {
            Some(speed) => (speed * budget.as_secs_f64()) as usize,
            // Unmeasured: the smallest piece, which measures it.
            None => MIN_TOKENS,
        };
        let max_tokens = tokens.clamp(MIN_TOKENS, IDLE_STEP.max_tokens);
        EncodeStep {
            max_tokens,
            // A pass costs at least its weights' read: never counted as more than the piece.
            pass_tokens: IDLE_STEP.pass_tokens.min(max_tokens),
            ..IDLE_STEP
        }
    }

    /// A piece of `step` took `elapsed`.
    pub fn observe(&mut self, step: EncodeStep, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if seconds <= 0.0 {
            return;
        }
        let speed = step.max_tokens as f64 / seconds;
        self.tokens_per_second = Some(match self.tokens_per_second {
            Some(known) => known + SMOOTHING * (speed - known),
            None => speed,
        });
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

    #[test]
    fn pieces_follow_the_measured_speed_within_bounds() {
        let mut pace = EncodePace::default();
        assert_eq!(pace.step(None), IDLE_STEP);
        let first = pace.step(Some(Duration::from_millis(50)));
        assert_eq!(first.max_tokens, MIN_TOKENS);
        assert!(first.pass_tokens <= first.max_tokens);
        // 8 tokens in 20 ms: 400 tok/s, so 50 ms hold 20 tokens.
        pace.observe(first, Duration::from_millis(20));
        assert_eq!(pace.step(Some(Duration::from_millis(50))).max_tokens, 20);
        assert_eq!(
            pace.step(Some(Duration::from_secs(10))).max_tokens,
            IDLE_STEP.max_tokens
        );
        // Slower pieces shrink the next ones, never below the least.
        for _ in 0..20 {
            pace.observe(
                pace.step(Some(Duration::from_millis(50))),
                Duration::from_secs(1),
            );
        }
        assert_eq!(
            pace.step(Some(Duration::from_millis(50))).max_tokens,
            MIN_TOKENS
        );
    }
}
