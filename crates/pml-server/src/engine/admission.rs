//! Completions between their arrival at the engine and the start of their prefill. The HTTP side
//! bounds how many may wait ([`super::EngineHandle::submit`]); here they are let in oldest
//! first while the batch has room, and the ones nobody wants any more are dropped instead of
//! computed: a client that left, a deadline that passed, a shutdown that began.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{CompletionJob, DraftCounts, JobEnd, JobError, JobEvent};
use crate::metrics::{Metrics, Outcome};

/// The completions waiting for room in the batch, oldest first.
pub struct Admission {
    waiting: VecDeque<CompletionJob>,
    /// Sequences prefilling or decoding at once: each holds a KV cache, and a decode step's
    /// time grows with their number.
    max_batch: usize,
    metrics: Arc<Metrics>,
}

impl Admission {
    pub fn new(max_batch: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            waiting: VecDeque::new(),
            max_batch,
            metrics,
        }
    }

    pub fn push(&mut self, job: CompletionJob) {
        self.waiting.push_back(job);
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The oldest waiting completion still wanted, when `running` sequences leave room in the
    /// batch for all of its choices (or nothing runs: a request wider than the batch runs
    /// alone); the unwanted ones ahead of it are dropped on the way.
    pub fn next(&mut self, running: usize) -> Option<CompletionJob> {
        if running >= self.max_batch {
            return None;
        }
        let now = Instant::now();
        while let Some(job) = self.waiting.pop_front() {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            if !still_wanted(&job, now, &self.metrics) {
                continue;
            }
            if running > 0 && running + job.width() > self.max_batch {
                self.metrics.queue_depth.fetch_add(1, Ordering::SeqCst);
                self.waiting.push_front(job);
                return None;
            }
            self.metrics.queue_time.observe(job.arrived.elapsed());
            return Some(job);
        }
        None
    }

    /// Refuses every waiting completion: a shutdown lets only running ones finish.
    pub fn refuse_all(&mut self) {
        for job in std::mem::take(&mut self.waiting) {
            self.metrics.queue_depth.fetch_sub(1, Ordering::SeqCst);
            fail(job, JobError::ShuttingDown, &self.metrics);
        }
    }
}

/// Whether `job`, not yet decoding, is still worth computing. A job whose client left is only
/// counted; one past its deadline is also told, as its client still waits.
pub fn still_wanted(job: &CompletionJob, now: Instant, metrics: &Metrics) -> bool {
    if job.events.is_closed() {
        metrics.count_outcome(Outcome::Cancelled);
        return false;
    }
    if now >= job.deadline {
        // Counted before the client hears of it, so the metric is there when it looks.
        metrics.count_outcome(Outcome::TimedOut);
        job.events.send(JobEvent::Done {
            end: JobEnd::TimedOut,
            completion_tokens: 0,
            drafts: DraftCounts::default(),
        });
        return false;
    }
    true
}

/// Reports that `job` cannot run.
pub fn fail(job: CompletionJob, error: JobError, metrics: &Metrics) {
    metrics.count_outcome(Outcome::Failed);
    job.events.send(JobEvent::Failed(error));
}
