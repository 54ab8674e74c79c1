//! Internal failures, logged where they happen. A client must not read the server's inner
//! workings (paths, tensor shapes, error chains) in an answer, yet an operator must be able to
//! find what went wrong for a given answer: each failure gets a number, written in full to the
//! log and alone to the client.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers start at 1 in every process: small enough to read out, unique within one log.
static LAST_INCIDENT: AtomicU64 = AtomicU64::new(0);

/// An internal failure, already logged at `error` level under its number.
#[derive(Clone, Debug)]
pub struct Incident {
    number: u64,
    detail: String,
}

impl Incident {
    /// Logs `detail` under a new incident number.
    pub fn report(detail: impl fmt::Display) -> Self {
        let number = LAST_INCIDENT.fetch_add(1, Ordering::Relaxed) + 1;
        let detail = detail.to_string();
        tracing::error!("internal error (incident {number}): {detail}");
        Self { number, detail }
    }

    /// Logs `error` with every cause under it.
    pub fn of_error(error: &(dyn std::error::Error + 'static)) -> Self {
        Self::report(error_chain(error))
    }

    pub fn number(&self) -> u64 {
        self.number
    }

    /// What the client is told instead of the detail.
    pub fn public_message(&self) -> String {
        format!(
            "internal error (incident {}); the server's log has the details",
            self.number
        )
    }
}

/// The detail, for the operator's own tools (the `pml serve` command reports a saved schema it
/// could not load with it).
impl fmt::Display for Incident {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.detail)
    }
}

/// Runs a server thread's `body`, logging a panic before it ends the thread: a dead engine
/// thread leaves the HTTP side answering 500s, and the log must say why from that moment on,
/// not only when the server stops and joins it.
pub fn log_panics<T>(thread: &str, body: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            tracing::error!("the {thread} thread panicked: {message}");
            std::panic::resume_unwind(payload)
        }
    }
}

/// `error: cause: cause…`. Many errors already print their source in their own message; a
/// cause whose text is already there is not repeated.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("saving failed")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("saving failed: {0}")]
    struct Repeating(#[source] std::io::Error);

    #[test]
    fn chains_say_every_cause_once_and_numbers_grow() {
        let cause = || std::io::Error::other("disk full");
        assert_eq!(error_chain(&Outer(cause())), "saving failed: disk full");
        assert_eq!(error_chain(&Repeating(cause())), "saving failed: disk full");
        let first = Incident::of_error(&Outer(cause()));
        let second = Incident::report("again");
        assert!(second.number() > first.number());
        assert_eq!(first.to_string(), "saving failed: disk full");
        assert!(!first.public_message().contains("disk full"));
        assert!(
            first
                .public_message()
                .contains(&format!("incident {}", first.number()))
        );
    }
}
