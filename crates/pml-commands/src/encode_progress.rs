//! The progress bar of module encoding: tokens encoded so far out of the schema's, and units
//! done, on stderr (indicatif draws nothing when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use pml_runtime::encode::EncodeEvent;

/// Follows the events of one schema's encoding.
pub struct EncodeProgress {
    schema_name: String,
    bar: Option<ProgressBar>,
    n_units: usize,
}

impl EncodeProgress {
    pub fn new(schema_name: &str) -> Self {
        Self {
            schema_name: schema_name.to_owned(),
            bar: None,
            n_units: 0,
        }
    }

    pub fn observe(&mut self, event: EncodeEvent<'_>) {
        match event {
            EncodeEvent::Start { n_units, n_tokens } => {
                let bar = ProgressBar::with_draw_target(
                    Some(n_tokens as u64),
                    ProgressDrawTarget::stderr(),
                );
                let style = ProgressStyle::with_template(
                    "{msg} {wide_bar} {pos}/{len} tokens {rate} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .with_key(
                    "rate",
                    |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = out.write_str(&token_rate(state.per_sec()));
                    },
                );
                bar.set_style(style);
                self.n_units = n_units;
                bar.set_message(format!(
                    "encoding `{}`: 0/{n_units} units",
                    self.schema_name
                ));
                self.bar = Some(bar);
            }
            EncodeEvent::Waiting { unit } => {
                if let Some(bar) = &self.bar {
                    bar.set_message(format!(
                        "encoding `{}`: waiting for another process encoding {}",
                        self.schema_name,
                        pml_runtime::encode::describe(unit)
                    ));
                }
            }
            EncodeEvent::Unit { index, unit, .. } => {
                if let Some(bar) = &self.bar {
                    bar.inc(unit.tokens.len() as u64);
                    bar.set_message(format!(
                        "encoding `{}`: {}/{} units",
                        self.schema_name,
                        index + 1,
                        self.n_units
                    ));
                }
            }
        }
    }

    /// Removes the bar (the summary line replaces it).
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `27 tokens/s`: whole tokens (indicatif's `{per_sec}` prints `26.8162/s`), one decimal below 10.
fn token_rate(per_sec: f64) -> String {
    if !per_sec.is_finite() || per_sec <= 0.0 {
        "- tokens/s".to_string()
    } else if per_sec < 10.0 {
        format!("{per_sec:.1} tokens/s")
    } else {
        format!("{per_sec:.0} tokens/s")
    }
}

#[cfg(test)]
mod tests {
    use super::token_rate;

    #[test]
    fn rates_are_rounded_for_reading() {
        assert_eq!(token_rate(26.8162), "27 tokens/s");
        assert_eq!(token_rate(4.26), "4.3 tokens/s");
        assert_eq!(token_rate(0.0), "- tokens/s");
        assert_eq!(token_rate(f64::INFINITY), "- tokens/s");
    }
}
