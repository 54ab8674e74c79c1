//! What fetching reports while it works (a download, an assembly, a verification), for a caller
//! that shows it: the library draws nothing and prints nothing. `pml` draws bars on stderr
//! (`pml-cli`'s `fetch_progress`); tests and quiet callers pass [`Silent`].

/// Receives the progress of one fetcher, one task at a time: [`begin`](Self::begin), then
/// advances and message changes, then [`finish`](Self::finish). Notes come between tasks.
pub trait FetchProgress: Send + Sync {
    /// A task starts: `total_bytes` of work (verifying or assembling a file), or `None` for work
    /// of unknown length (a download by pip).
    fn begin(&self, _total_bytes: Option<u64>, _message: &str) {}

    /// The running task's description changes (the next part of an assembly).
    fn set_message(&self, _message: &str) {}

    /// `bytes` more of the running task are done.
    fn advance(&self, _bytes: u64) {}

    /// The running task ended (done or failed).
    fn finish(&self) {}

    /// A line worth telling the user: what was downloaded, where a model was put.
    fn note(&self, _message: &str) {}
}

/// Shows nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl FetchProgress for Silent {}
