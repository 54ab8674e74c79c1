//! The results of `pml bench engine`: per-size measurements of each engine summarised as median
//! (min–max) over the rounds, the PML/llama.cpp ratios, PML's decode through `pml run`'s
//! generation loop beside its bare-engine decode, the table printed for people and the JSON
//! printed for tools.

use std::fmt::Write;
use std::time::Duration;

use pml_engine::model::WeightFormat;
use serde::Serialize;

use super::engine_rounds::{Measurement, SizeResult};
use super::report::{Spread, push_table};

/// Median, smallest and largest of a rate (higher is better).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RateSpread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// One engine at one size, over the rounds.
#[derive(Clone, Debug, Serialize)]
pub struct EngineSummary {
    pub prefill_tokens_per_s: RateSpread,
    pub ttft_ms: Spread,
    pub decode_ms_per_token: Spread,
    /// The same decode through `pml run`'s generation loop; `None` where it was not measured
    /// (llama.cpp).
    pub run_decode_ms_per_token: Option<Spread>,
    /// Largest peak resident memory (VmHWM) of the rounds' processes.
    pub peak_rss_mib: f64,
    pub load_ms: Spread,
}

impl EngineSummary {
    /// `None` for no rounds.
    fn of(tokens: usize, rounds: &[Measurement]) -> Option<Self> {
        let durations = |seconds: fn(&Measurement) -> f64| -> Vec<Duration> {
            rounds
                .iter()
                .map(|m| Duration::from_secs_f64(seconds(m).max(0.0)))
                .collect()
        };
        let prefill = Spread::of(&durations(|m| m.prefill_s))?;
        let rate = |ms: f64| tokens as f64 / (ms / 1e3);
        Some(Self {
            prefill_tokens_per_s: RateSpread {
                median: rate(prefill.median_ms),
                min: rate(prefill.max_ms),
                max: rate(prefill.min_ms),
            },
            ttft_ms: Spread::of(&durations(|m| m.ttft_s))?,
            decode_ms_per_token: Spread::of(&durations(|m| m.decode_ms_per_token / 1e3))?,
            run_decode_ms_per_token: Spread::of(
                &rounds
                    .iter()
                    .filter_map(|m| m.run_decode_ms_per_token)
                    .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3))
                    .collect::<Vec<_>>(),
            ),
            peak_rss_mib: rounds
                .iter()
                .map(|m| m.peak_rss_bytes as f64 / (1024.0 * 1024.0))
                .fold(0.0, f64::max),
            load_ms: Spread::of(&durations(|m| m.load_s))?,
        })
    }
}

/// Both engines at one size.
#[derive(Clone, Debug, Serialize)]
pub struct SizeSummary {
    pub tokens: usize,
    pub pml: EngineSummary,
    pub llama_cpp: Option<EngineSummary>,
    /// PML's median prefill throughput over llama.cpp's (above 1: PML is faster).
    pub prefill_ratio: Option<f64>,
    /// PML's median decode time per token over llama.cpp's (below 1: PML is faster).
    pub decode_ratio: Option<f64>,
    /// PML's median model load time over llama.cpp's (below 1: PML loads faster).
    pub load_ratio: Option<f64>,
    /// PML's peak resident memory over llama.cpp's (below 1: PML holds less).
    pub peak_rss_ratio: Option<f64>,
    /// PML's median decode time per token through `pml run`'s loop over the bare engine's
    /// (above 1: the run path costs more per token).
    pub run_decode_ratio: Option<f64>,
}

/// Everything one `pml bench engine` run measured.
#[derive(Clone, Debug, Serialize)]
pub struct EngineReport {
    pub model: String,
    pub weights: String,
    pub rounds: usize,
    pub decode_tokens: usize,
    /// Threads given to llama.cpp; `None` when it was not measured.
    pub llama_threads: Option<usize>,
    pub sizes: Vec<SizeSummary>,
}

impl EngineReport {
    pub fn new(
        model: &str,
        weights: WeightFormat,
        rounds: usize,
        decode_tokens: usize,
        llama_threads: Option<usize>,
        results: &[SizeResult],
    ) -> Self {
        let sizes = results
            .iter()
            .filter_map(|result| {
                let pml = EngineSummary::of(result.tokens, &result.pml)?;
                let llama_cpp = EngineSummary::of(result.tokens, &result.llama);
                let prefill_ratio = llama_cpp.as_ref().map(|llama| {
                    pml.prefill_tokens_per_s.median / llama.prefill_tokens_per_s.median
                });
                let decode_ratio = llama_cpp.as_ref().map(|llama| {
                    pml.decode_ms_per_token.median_ms / llama.decode_ms_per_token.median_ms
                });
                let load_ratio = llama_cpp
                    .as_ref()
                    .map(|llama| pml.load_ms.median_ms / llama.load_ms.median_ms);
                let peak_rss_ratio = llama_cpp
                    .as_ref()
                    .map(|llama| pml.peak_rss_mib / llama.peak_rss_mib);
                let run_decode_ratio = pml
                    .run_decode_ms_per_token
                    .map(|run| run.median_ms / pml.decode_ms_per_token.median_ms);
                Some(SizeSummary {
                    tokens: result.tokens,
                    pml,
                    llama_cpp,
                    prefill_ratio,
                    decode_ratio,
                    load_ratio,
                    peak_rss_ratio,
                    run_decode_ratio,
                })
            })
            .collect();
        Self {
            model: model.to_owned(),
            weights: format!("{weights:?}"),
            rounds,
            decode_tokens,
            llama_threads,
            sizes,
        }
    }

    /// The table printed by default: one row per engine and size, then the ratio.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Engine speed on {} ({} weights), median (min–max) of {} rounds, each a fresh \
             process; decode: {} tokens after the prompt (run loop: the same tokens through \
             `pml run`'s generation loop, default sampling)",
            self.model, self.weights, self.rounds, self.decode_tokens
        );
        let header = [
            "tokens",
            "engine",
            "load ms",
            "prefill tok/s",
            "TTFT ms",
            "decode ms/token",
            "run loop ms/token",
            "peak RSS MiB",
        ]
        .map(str::to_owned);
        let mut rows: Vec<[String; 8]> = Vec::new();
        for size in &self.sizes {
            rows.push(engine_row(size.tokens, "pml", &size.pml));
            if let Some(llama) = &size.llama_cpp {
                let name = format!("llama.cpp ({} thr.)", self.llama_threads.unwrap_or(0));
                rows.push(engine_row(size.tokens, &name, llama));
            }
            let ratio = |ratio: Option<f64>| ratio.map(|r| format!("{r:.2}×")).unwrap_or_default();
            if size.llama_cpp.is_some() {
                rows.push([
                    size.tokens.to_string(),
                    "pml / llama.cpp".to_owned(),
                    ratio(size.load_ratio),
                    ratio(size.prefill_ratio),
                    String::new(),
                    ratio(size.decode_ratio),
                    String::new(),
                    ratio(size.peak_rss_ratio),
                ]);
            }
        }
        push_table(&mut out, &header, &rows);
        if self.llama_threads.is_none() {
            let _ = writeln!(
                out,
                "\nllama.cpp not measured (install it with scripts/setup-llama-cpp.sh)"
            );
        }
        out
    }
}

fn engine_row(tokens: usize, engine: &str, summary: &EngineSummary) -> [String; 8] {
    let rate = &summary.prefill_tokens_per_s;
    [
        tokens.to_string(),
        engine.to_owned(),
        summary.load_ms.cell(),
        format!("{:.1} ({:.1}–{:.1})", rate.median, rate.min, rate.max),
        summary.ttft_ms.cell(),
        summary.decode_ms_per_token.cell(),
        summary
            .run_decode_ms_per_token
            .as_ref()
            .map(Spread::cell)
            .unwrap_or_default(),
        format!("{:.0}", summary.peak_rss_mib),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(prefill_s: f64, decode_ms: f64) -> Measurement {
        Measurement {
            load_s: 1.0,
            prefill_s,
            ttft_s: prefill_s,
            decode_ms_per_token: decode_ms,
            run_decode_ms_per_token: None,
            peak_rss_bytes: 1 << 30,
        }
    }

    fn pml_measurement(prefill_s: f64, decode_ms: f64, run_decode_ms: f64) -> Measurement {
        Measurement {
            run_decode_ms_per_token: Some(run_decode_ms),
            ..measurement(prefill_s, decode_ms)
        }
    }

    #[test]
    fn ratios_compare_medians_and_rates_invert_times() {
        let result = SizeResult {
            tokens: 100,
            pml: vec![
                pml_measurement(1.0, 40.0, 44.0),
                pml_measurement(2.0, 60.0, 66.0),
                pml_measurement(4.0, 50.0, 55.0),
            ],
            llama: vec![
                measurement(0.5, 20.0),
                measurement(1.0, 25.0),
                measurement(2.0, 30.0),
            ],
        };
        let report = EngineReport::new("m", WeightFormat::F32, 3, 8, Some(2), &[result]);
        let size = &report.sizes[0];
        assert_eq!(size.pml.prefill_tokens_per_s.median, 50.0);
        assert_eq!(size.pml.prefill_tokens_per_s.min, 25.0);
        assert_eq!(size.pml.prefill_tokens_per_s.max, 100.0);
        assert_eq!(size.prefill_ratio, Some(0.5));
        assert_eq!(size.decode_ratio, Some(2.0));
        assert_eq!(size.pml.peak_rss_mib, 1024.0);
        assert_eq!(
            (size.load_ratio, size.peak_rss_ratio),
            (Some(1.0), Some(1.0))
        );
        assert!(report.table().contains("0.50×"));
        assert!(report.table().contains("1.00×"));
        // The run loop's decode sits beside the engine's, as a median and a ratio to it.
        let run = size.pml.run_decode_ms_per_token.expect("measured");
        assert_eq!((run.median_ms, run.min_ms, run.max_ms), (55.0, 44.0, 66.0));
        assert_eq!(size.run_decode_ratio, Some(1.1));
        assert!(
            size.llama_cpp
                .as_ref()
                .is_some_and(|llama| llama.run_decode_ms_per_token.is_none())
        );
        assert!(report.table().contains("55.0 (44.0–66.0)"));
    }

    #[test]
    fn without_llama_there_is_no_ratio() {
        let result = SizeResult {
            tokens: 10,
            pml: vec![measurement(1.0, 40.0)],
            llama: Vec::new(),
        };
        let report = EngineReport::new("m", WeightFormat::F32, 1, 8, None, &[result]);
        assert_eq!(report.sizes[0].prefill_ratio, None);
        assert!(report.table().contains("llama.cpp not measured"));
    }
}
