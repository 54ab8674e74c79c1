//! Server metrics in the Prometheus text format: time to first token and time per output token
//! as histograms, queue depth and active sequences as gauges, prompt tokens by origin (reused
//! from the store, recomputed, computed new), store hits and misses per tier, request outcomes.
//! The engine records; the HTTP layer only renders.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use pml_runtime::store::StoreStats;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A cumulative latency histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            if seconds <= *bound {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// How a completion request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// Refused with 503: the queue was full.
    Rejected,
    /// The client went away first.
    Cancelled,
    TimedOut,
    /// Bad input or an engine failure.
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Completed,
        Outcome::Rejected,
        Outcome::Cancelled,
        Outcome::TimedOut,
        Outcome::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Rejected => "rejected",
            Outcome::Cancelled => "cancelled",
            Outcome::TimedOut => "timed_out",
            Outcome::Failed => "failed",
        }
    }
}

/// One tier's lookups as last reported by the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TierHits {
    tier: &'static str,
    hits: u64,
    misses: u64,
}

/// Every metric of one server.
#[derive(Debug, Default)]
pub struct Metrics {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    /// From arrival to admission (the start of the prefill).
    pub queue_time: Histogram,
    /// Plain-prompt tokens looked up in the prefix cache, and those found (vLLM's
    /// `prefix_cache_queries` / `prefix_cache_hits`, in tokens).
    pub prefix_cache_queries: AtomicU64,
    pub prefix_cache_hits: AtomicU64,
    /// Completions accepted and not yet admitted by the engine.
    pub queue_depth: AtomicUsize,
    /// Other requests for the engine (uploads, deletions, tokenizing) not yet handled.
    pub control_queue_depth: AtomicUsize,
    pub active_sequences: AtomicUsize,
    /// The KV pool, `--kv-cache-mib` in bytes (0: no limit), the KV reserved for the admitted
    /// sequences, the bytes their caches hold now, and the most they held at any step.
    pub kv_pool_bytes: AtomicUsize,
    pub kv_reserved_bytes: AtomicUsize,
    pub kv_resident_bytes: AtomicUsize,
    pub kv_resident_peak_bytes: AtomicUsize,
    pub tokens_reused: AtomicU64,
    pub tokens_recomputed: AtomicU64,
    pub tokens_new: AtomicU64,
    pub tokens_generated: AtomicU64,
    /// Completions admitted within `--kv-pressure-budget` because their reservation did not fit.
    pub kv_pressure_admissions: AtomicU64,
    /// KV slots evicted by per-sequence budgets, counted when a sequence ends.
    pub kv_evicted_tokens: AtomicU64,
    /// Engine steps that computed anything, and the forward passes they ran (one per step but
    /// for sequences under a KV budget).
    pub engine_steps: AtomicU64,
    pub forward_passes: AtomicU64,
    /// Tokens of uploaded schemas' modules computed in completions' steps, in their one pass.
    pub encode_joined_tokens: AtomicU64,
    /// Drafted tokens verified in decoding steps, and those accepted.
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    /// Of those, the ones found in earlier answers (`--draft-answers`).
    pub spec_answer_draft_tokens: AtomicU64,
    pub spec_answer_accepted_tokens: AtomicU64,
    /// Of those, the ones the draft model drafted (`--draft-model`).
    pub spec_model_draft_tokens: AtomicU64,
    pub spec_model_accepted_tokens: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    store: Mutex<Vec<TierHits>>,
}

impl Metrics {
    pub fn count_outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn outcome_count(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }

    /// Replaces the store counters with the engine's latest snapshot.
    pub fn set_store(&self, stats: &StoreStats) {
        let tiers = stats
            .tiers
            .iter()
            .map(|tier| TierHits {
                tier: tier.tier,
                hits: tier.hits,
                misses: tier.misses,
            })
            .collect();
        if let Ok(mut store) = self.store.lock() {
            *store = tiers;
        }
    }

    /// Counts a plain prompt's lookup in the prefix cache, in tokens.
    pub fn count_prefix_lookup(&self, queried: usize, hit: usize) {
        self.prefix_cache_queries
            .fetch_add(queried as u64, Ordering::Relaxed);
        self.prefix_cache_hits
            .fetch_add(hit as u64, Ordering::Relaxed);
    }

    /// Counts an engine step that ran `passes` forward passes (none: nothing to compute).
    pub fn count_step(&self, passes: u64) {
        if passes > 0 {
            self.engine_steps.fetch_add(1, Ordering::Relaxed);
            self.forward_passes.fetch_add(passes, Ordering::Relaxed);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_latencies(&mut out);
        self.render_gauges(&mut out);
        self.render_counters(&mut out);
        self.render_labelled(&mut out);
        out
    }

    fn render_latencies(&self, out: &mut String) {
        self.time_to_first_token.render(
            out,
            "pml_time_to_first_token_seconds",
            "From a completion's arrival to its first token (queueing and prefill included).",
        );
        // Named as vLLM's metrics of the same meaning, with PML's prefix.
        self.inter_token_latency.render(
            out,
            "pml_inter_token_latency_seconds",
            "Time of each decode step, per generated token after the first.",
        );
        self.queue_time.render(
            out,
            "pml_request_queue_time_seconds",
            "From a completion's arrival to the start of its prefill.",
        );
    }

    fn render_gauges(&self, out: &mut String) {
        for (name, help, value) in [
            (
                "pml_queue_depth",
                "Completions waiting for the engine.",
                &self.queue_depth,
            ),
            (
                "pml_control_queue_depth",
                "Schema uploads and deletions, tokenize and detokenize requests waiting for the engine.",
                &self.control_queue_depth,
            ),
            (
                "pml_active_sequences",
                "Completions being decoded.",
                &self.active_sequences,
            ),
            (
                "pml_kv_pool_bytes",
                "KV pool the sequences share (--kv-cache-mib; 0: no limit).",
                &self.kv_pool_bytes,
            ),
            (
                "pml_kv_reserved_bytes",
                "KV reserved for the prefilling and decoding sequences (prompt and answer).",
                &self.kv_reserved_bytes,
            ),
            (
                "pml_kv_resident_bytes",
                "KV the prefilling and decoding sequences' caches hold now.",
                &self.kv_resident_bytes,
            ),
            (
                "pml_kv_resident_peak_bytes",
                "The most KV the sequences' caches held at the end of any engine step.",
                &self.kv_resident_peak_bytes,
            ),
        ] {
            let value = value.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
    }

    fn render_counters(&self, out: &mut String) {
        for (name, help, value) in [
            (
                "pml_prefix_cache_queries_total",
                "Plain-prompt tokens looked up in the prefix cache.",
                &self.prefix_cache_queries,
            ),
            (
                "pml_prefix_cache_hits_total",
                "Plain-prompt tokens spliced from the prefix cache.",
                &self.prefix_cache_hits,
            ),
            (
                "pml_generated_tokens_total",
                "Tokens generated.",
                &self.tokens_generated,
            ),
            (
                "pml_kv_pressure_admissions_total",
                "Completions admitted within --kv-pressure-budget because their KV reservation did not fit.",
                &self.kv_pressure_admissions,
            ),
            (
                "pml_kv_evicted_tokens_total",
                "KV slots evicted by per-sequence budgets (H2O), counted when a sequence ends.",
                &self.kv_evicted_tokens,
            ),
            (
                "pml_engine_steps_total",
                "Engine steps that computed anything.",
                &self.engine_steps,
            ),
            (
                "pml_forward_passes_total",
                "Forward passes of the model: one per step, plus one per sequence under a KV budget (its passes observe attention).",
                &self.forward_passes,
            ),
            (
                "pml_encode_joined_tokens_total",
                "Tokens of uploaded schemas' modules computed inside completions' engine steps, in the step's one forward pass.",
                &self.encode_joined_tokens,
            ),
            (
                "pml_spec_draft_tokens_total",
                "Drafted tokens (n-gram lookup over the prompt and the answer) verified in decoding steps.",
                &self.spec_draft_tokens,
            ),
            (
                "pml_spec_accepted_tokens_total",
                "Drafted tokens the model accepted (each a decoding step saved).",
                &self.spec_accepted_tokens,
            ),
            (
                "pml_spec_answer_draft_tokens_total",
                "Drafted tokens found in earlier answers (--draft-answers) verified in decoding steps.",
                &self.spec_answer_draft_tokens,
            ),
            (
                "pml_spec_answer_accepted_tokens_total",
                "Drafted tokens found in earlier answers that the model accepted.",
                &self.spec_answer_accepted_tokens,
            ),
            (
                "pml_spec_model_draft_tokens_total",
                "Drafted tokens of the draft model (--draft-model) verified in decoding steps.",
                &self.spec_model_draft_tokens,
            ),
            (
                "pml_spec_model_accepted_tokens_total",
                "Drafted tokens of the draft model that the model accepted.",
                &self.spec_model_accepted_tokens,
            ),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "Drafted tokens verified (vLLM's name for pml_spec_draft_tokens_total).",
                &self.spec_draft_tokens,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "Drafted tokens accepted (vLLM's name for pml_spec_accepted_tokens_total).",
                &self.spec_accepted_tokens,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
    }

    fn render_labelled(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP pml_prompt_tokens_total Prompt tokens by origin.\n# TYPE pml_prompt_tokens_total counter"
        );
        for (origin, counter) in [
            ("reused", &self.tokens_reused),
            ("recomputed", &self.tokens_recomputed),
            ("new", &self.tokens_new),
        ] {
            let _ = writeln!(
                out,
                "pml_prompt_tokens_total{{origin=\"{origin}\"}} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pml_requests_total Completion requests by outcome.\n# TYPE pml_requests_total counter"
        );
        for outcome in Outcome::ALL {
            let _ = writeln!(
                out,
                "pml_requests_total{{outcome=\"{}\"}} {}",
                outcome.label(),
                self.outcome_count(outcome)
            );
        }
        let _ = writeln!(
            out,
            "# HELP pml_store_lookups_total Module store lookups per tier.\n# TYPE pml_store_lookups_total counter"
        );
        if let Ok(store) = self.store.lock() {
            for tier in store.iter() {
                let _ = writeln!(
                    out,
                    "pml_store_lookups_total{{tier=\"{}\",result=\"hit\"}} {}\npml_store_lookups_total{{tier=\"{}\",result=\"miss\"}} {}",
                    tier.tier, tier.hits, tier.tier, tier.misses
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use pml_runtime::store::TierStats;

    use super::*;

    #[test]
    fn histograms_are_cumulative_and_render_for_prometheus() {
        let metrics = Metrics::default();
        metrics
            .time_to_first_token
            .observe(Duration::from_millis(30));
        metrics.time_to_first_token.observe(Duration::from_secs(3));
        metrics.count_outcome(Outcome::Rejected);
        metrics.set_store(&StoreStats {
            tiers: vec![TierStats {
                tier: "ram",
                hits: 4,
                misses: 1,
                ..TierStats::default()
            }],
            ..StoreStats::default()
        });
        let text = metrics.render();
        assert!(text.contains("pml_time_to_first_token_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("pml_time_to_first_token_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("pml_time_to_first_token_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("pml_time_to_first_token_seconds_count 2"));
        assert!(text.contains("pml_requests_total{outcome=\"rejected\"} 1"));
        assert!(text.contains("pml_store_lookups_total{tier=\"ram\",result=\"hit\"} 4"));
    }
}
