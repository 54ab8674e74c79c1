//! Where the libraries' `tracing` events go: standard error, as `warning: …` lines like the
//! commands' own warnings, with a timestamp for the long-running server. `PML_LOG` takes a
//! `RUST_LOG`-style filter (`PML_LOG=debug`, `PML_LOG=pml_server=warn`); the default shows
//! warnings and errors, and for the server also its `info` lines: one per request, as
//! llama.cpp's server logs them.
// Says on stderr when a log filter cannot be parsed (there is no logger yet).
#![allow(clippy::print_stderr)]

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable holding the filter.
pub const LOG_ENV: &str = "PML_LOG";

/// Installs the subscriber; `server` for a server's log (timestamps, and its requests at
/// `info`). A filter that does not parse is said once and the default used: a typo must not
/// silence the warnings.
pub fn init(server: bool) {
    let default = if server {
        "warn,pml_server=info"
    } else {
        "warn"
    };
    let filter = match std::env::var(LOG_ENV) {
        Ok(text) => EnvFilter::try_new(&text).unwrap_or_else(|error| {
            eprintln!(
                "warning: {LOG_ENV}={text:?} is not a log filter ({error}); using `{default}`"
            );
            EnvFilter::new(default)
        }),
        Err(_) => EnvFilter::new(default),
    };
    let timestamps = server;
    // Fails only when a subscriber is already installed (a test calling twice): keep that one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(Lines { timestamps })
        .try_init();
}

/// `[time ]level: message key=value…`, the level worded as the commands word it.
struct Lines {
    timestamps: bool,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        context: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.timestamps {
            SystemTime.format_time(&mut writer)?;
            write!(writer, " ")?;
        }
        write!(writer, "{}: ", level_word(*event.metadata().level()))?;
        context
            .field_format()
            .format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}
