//! The results of `pml bench cache --peer`: every round of both engines, each prompt's medians
//! (min–max), the PML/llama.cpp ratio of the median TTFTs, the table printed for people and the
//! JSON printed for tools.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::load_average::format_load;
use super::peer_rounds::{PeerRound, PeerSize};
use super::report::{Spread, push_table};

/// One prompt's figures over the rounds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeerSummary {
    pub pml_ttft: Spread,
    pub pml_load_ms: f64,
    pub pml_splice_ms: f64,
    pub pml_compute_ms: f64,
    pub pml_model_load: Spread,
    pub pml_process: Spread,
    pub llama_ttft: Spread,
    pub llama_restore_ms: f64,
    pub llama_eval_ms: f64,
    pub llama_wrapper_ttft: Spread,
    /// PML's median TTFT over llama.cpp's (above 1: llama.cpp answers sooner).
    pub ratio: f64,
    /// PML's median TTFT over llama-cpp-python's `load_state` path.
    pub wrapper_ratio: f64,
    /// Whether PML and llama.cpp chose the same first token in every round.
    pub same_first_token: bool,
    /// Whether llama.cpp's restored state gave its own full prefill's first token in every round
    /// (both restore paths).
    pub llama_restore_exact: bool,
    /// Smallest and largest 1-minute load average after the rounds.
    pub load_min: f64,
    pub load_max: f64,
}

impl PeerSummary {
    /// `None` for no rounds.
    pub fn of(size: &PeerSize) -> Option<Self> {
        let rounds = &size.rounds;
        let spread = |ms: fn(&PeerRound) -> f64| -> Option<Spread> {
            let samples: Vec<Duration> = rounds
                .iter()
                .map(|round| Duration::from_secs_f64(ms(round).max(0.0) / 1e3))
                .collect();
            Spread::of(&samples)
        };
        let pml_ttft = spread(|r| r.pml.ttft_ms)?;
        let llama_ttft = spread(|r| r.llama.ttft_s * 1e3)?;
        let llama_wrapper_ttft = spread(|r| r.llama.wrapper_ttft_s * 1e3)?;
        let loads = rounds.iter().map(|round| round.load_average_1min);
        Some(Self {
            pml_ttft,
            pml_load_ms: spread(|r| r.pml.load_ms)?.median_ms,
            pml_splice_ms: spread(|r| r.pml.splice_ms)?.median_ms,
            pml_compute_ms: spread(|r| r.pml.compute_ms)?.median_ms,
            pml_model_load: spread(|r| r.pml.model_load_ms)?,
            pml_process: spread(|r| r.pml.wall_ms)?,
            llama_ttft,
            llama_restore_ms: spread(|r| r.llama.restore_s * 1e3)?.median_ms,
            llama_eval_ms: spread(|r| r.llama.eval_s * 1e3)?.median_ms,
            llama_wrapper_ttft,
            ratio: pml_ttft.median_ms / llama_ttft.median_ms.max(1e-9),
            wrapper_ratio: pml_ttft.median_ms / llama_wrapper_ttft.median_ms.max(1e-9),
            same_first_token: rounds
                .iter()
                .all(|round| round.pml.first_token == Some(round.llama.first_token)),
            llama_restore_exact: rounds.iter().all(|round| {
                round.llama.first_token == size.llama_ready.full_first_token
                    && round.llama.wrapper_first_token == size.llama_ready.full_first_token
            }),
            load_min: loads.clone().fold(f64::INFINITY, f64::min),
            load_max: loads.fold(0.0, f64::max),
        })
    }
}

/// One prompt: its rounds and their summary.
#[derive(Clone, Debug, Serialize)]
pub struct PeerSizeReport {
    #[serde(flatten)]
    pub size: PeerSize,
    pub summary: PeerSummary,
}

/// Everything one `pml bench cache --peer` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PeerReport {
    pub model: String,
    pub peer: String,
    pub threads: usize,
    pub rounds: usize,
    pub prompts: Vec<PeerSizeReport>,
}

impl PeerReport {
    pub fn new(model: &str, threads: usize, rounds: usize, sizes: Vec<PeerSize>) -> Self {
        let prompts = sizes
            .into_iter()
            .filter_map(|size| {
                let summary = PeerSummary::of(&size)?;
                Some(PeerSizeReport { size, summary })
            })
            .collect();
        Self {
            model: model.to_owned(),
            peer: "llama.cpp".to_owned(),
            threads,
            rounds,
            prompts,
        }
    }

    /// The table printed by default: each round, then the medians and the ratio.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Cached TTFT on {} against llama.cpp's prompt cache, {} threads each, {} rounds \
             alternating which engine goes first; ms",
            self.model, self.threads, self.rounds
        );
        for prompt in &self.prompts {
            push_prompt(&mut out, prompt);
        }
        out
    }
}

fn push_prompt(out: &mut String, prompt: &PeerSizeReport) {
    let size = &prompt.size;
    let summary = &prompt.summary;
    let ready = &size.llama_ready;
    let _ = writeln!(
        out,
        "\n{}: prefix {} tokens (PML: its module state read from a disk store by a fresh `pml \
         run --mode reuse`; llama.cpp: its state restored from RAM), question {} tokens. Both \
         engines got the same token ids: exported from PML's plan, checked against every `pml \
         run` and against llama.cpp's counts.",
        size.prompt, size.prefix_tokens, size.question_tokens
    );
    let header = [
        "round",
        "first",
        "PML TTFT",
        "load+splice+compute",
        "PML model load",
        "PML process",
        "llama.cpp TTFT",
        "restore+eval",
        "via Llama.load_state",
        "load avg",
    ]
    .map(str::to_owned);
    let mut rows: Vec<[String; 10]> = size
        .rounds
        .iter()
        .enumerate()
        .map(|(index, round)| {
            let (pml, llama) = (&round.pml, &round.llama);
            [
                (index + 1).to_string(),
                if round.pml_first { "PML" } else { "llama.cpp" }.to_owned(),
                format!("{:.0}", pml.ttft_ms),
                format!(
                    "{:.0}+{:.0}+{:.0}",
                    pml.load_ms, pml.splice_ms, pml.compute_ms
                ),
                format!("{:.0}", pml.model_load_ms),
                format!("{:.0}", pml.wall_ms),
                format!("{:.0}", llama.ttft_s * 1e3),
                format!("{:.0}+{:.0}", llama.restore_s * 1e3, llama.eval_s * 1e3),
                format!("{:.0}", llama.wrapper_ttft_s * 1e3),
                format!("{:.2}", round.load_average_1min),
            ]
        })
        .collect();
    rows.push([
        "median".to_owned(),
        String::new(),
        summary.pml_ttft.cell(),
        format!(
            "{:.0}+{:.0}+{:.0}",
            summary.pml_load_ms, summary.pml_splice_ms, summary.pml_compute_ms
        ),
        summary.pml_model_load.cell(),
        summary.pml_process.cell(),
        summary.llama_ttft.cell(),
        format!(
            "{:.0}+{:.0}",
            summary.llama_restore_ms, summary.llama_eval_ms
        ),
        summary.llama_wrapper_ttft.cell(),
        format!("{:.2}–{:.2}", summary.load_min, summary.load_max),
    ]);
    push_table(out, &header, &rows);
    let _ = writeln!(
        out,
        "PML / llama.cpp, median TTFT: {:.2}× (against llama-cpp-python's Llama.load_state path: \
         {:.2}×)",
        summary.ratio, summary.wrapper_ratio
    );
    let _ = writeln!(
        out,
        "llama.cpp without a cache (the whole prompt, once): {:.0} ms; the prefix alone {:.0} ms; \
         its state {:.1} MiB; model load {:.0} ms",
        ready.full_ttft_s * 1e3,
        ready.prefix_prefill_s * 1e3,
        ready.state_bytes as f64 / (1024.0 * 1024.0),
        ready.load_s * 1e3
    );
    let _ = writeln!(
        out,
        "same first token, PML and llama.cpp: {}; llama.cpp's restored state gives its full \
         prefill's first token ({}): {}",
        yes_no(summary.same_first_token),
        ready.full_first_token,
        yes_no(summary.llama_restore_exact)
    );
    let _ = writeln!(
        out,
        "load average (1, 5, 15 min, as `uptime` prints it): {} before llama.cpp's setup, {} \
         after the rounds",
        format_load(size.load_before),
        format_load(size.load_after)
    );
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::peer_rounds::{LlamaReady, LlamaRound, PmlRound};

    fn round(pml_ms: f64, llama_ms: f64, load: f64, pml_token: u32) -> PeerRound {
        PeerRound {
            pml_first: true,
            pml: PmlRound {
                ttft_ms: pml_ms,
                load_ms: 200.0,
                splice_ms: 60.0,
                compute_ms: pml_ms - 260.0,
                model_load_ms: 300.0,
                wall_ms: pml_ms + 1000.0,
                first_token: Some(pml_token),
            },
            llama: LlamaRound {
                ttft_s: llama_ms / 1e3,
                restore_s: 0.02,
                eval_s: llama_ms / 1e3 - 0.02,
                first_token: 7,
                wrapper_ttft_s: 2.0 * llama_ms / 1e3,
                wrapper_restore_s: 0.2,
                wrapper_first_token: 7,
            },
            load_average_1min: load,
        }
    }

    fn size(rounds: Vec<PeerRound>) -> PeerSize {
        PeerSize {
            prompt: "document-4096".to_owned(),
            prefix_tokens: 4023,
            question_tokens: 20,
            llama_ready: LlamaReady {
                load_s: 0.5,
                prefix_tokens: 4023,
                question_tokens: 20,
                full_ttft_s: 52.9,
                full_first_token: 7,
                prefix_prefill_s: 52.0,
                state_bytes: 48 << 20,
                threads: 2,
            },
            rounds,
            load_before: [4.0, 3.0, 2.0],
            load_after: [5.0, 3.5, 2.1],
        }
    }

    #[test]
    fn the_ratio_divides_the_median_ttfts() {
        let size = size(vec![
            round(900.0, 300.0, 4.5, 7),
            round(1200.0, 250.0, 5.5, 7),
            round(1000.0, 400.0, 4.0, 7),
        ]);
        let summary = PeerSummary::of(&size).expect("rounds");
        assert_eq!(summary.pml_ttft.median_ms, 1000.0);
        assert!((summary.llama_ttft.median_ms - 300.0).abs() < 1e-6);
        assert!((summary.ratio - 1000.0 / 300.0).abs() < 1e-6);
        assert!((summary.wrapper_ratio - 1000.0 / 600.0).abs() < 1e-6);
        assert_eq!((summary.load_min, summary.load_max), (4.0, 5.5));
        assert!(summary.same_first_token);
        assert!(summary.llama_restore_exact);
        let table = PeerReport::new("m", 2, 3, vec![size]).table();
        assert!(table.contains("3.33×"), "{table}");
        assert!(table.contains("4.00, 3.00, 2.00 before"), "{table}");
    }

    #[test]
    fn a_different_first_token_in_any_round_is_reported() {
        let size = size(vec![
            round(900.0, 300.0, 4.5, 7),
            round(950.0, 300.0, 4.5, 8),
        ]);
        let summary = PeerSummary::of(&size).expect("rounds");
        assert!(!summary.same_first_token);
        assert_eq!(summary.pml_ttft.median_ms, 925.0);
    }

    #[test]
    fn no_rounds_no_summary() {
        let report = PeerReport::new("m", 2, 0, vec![size(Vec::new())]);
        assert!(report.prompts.is_empty());
    }
}
