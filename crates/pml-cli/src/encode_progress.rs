//! The progress bar of module encoding: tokens encoded so far out of the schema's, and units
//! done, on stderr (indicatif draws nothing when stderr is not a terminal).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
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
                    "{msg} {wide_bar} {pos}/{len} tokens {per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar());
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
