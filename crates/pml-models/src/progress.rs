//! Progress display for downloads, assembly and verification: indicatif bars on stderr, or nothing
//! (tests, or when the caller asks for quiet).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether and where progress is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    visible: bool,
}

impl Progress {
    /// Bars and messages on stderr (indicatif draws bars only when stderr is a terminal).
    pub fn stderr() -> Self {
        Self { visible: true }
    }

    /// No output at all.
    pub fn hidden() -> Self {
        Self { visible: false }
    }

    fn target(&self) -> ProgressDrawTarget {
        if self.visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        }
    }

    /// A byte-counting bar of `total_bytes`.
    pub fn bytes_bar(&self, total_bytes: u64, message: String) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(Some(total_bytes), self.target());
        let style = ProgressStyle::with_template(
            "{msg}\n{wide_bar} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(message);
        bar
    }

    /// A spinner for work of unknown length.
    pub fn spinner(&self, message: String) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(None, self.target());
        let style = ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_message(message);
        bar
    }

    /// A line of text on stderr (when visible), even when stderr is not a terminal.
    pub fn println(&self, message: impl AsRef<str>) {
        if self.visible {
            eprintln!("{}", message.as_ref());
        }
    }
}
