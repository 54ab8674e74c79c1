//! The results of `pml bench cache`: per-case timings summarised as median (min–max), the table
//! printed for people and the JSON printed for tools.

use std::fmt::Write;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

/// Median, smallest and largest of a set of timings, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
}

impl Spread {
    /// `None` for no samples.
    pub fn of(samples: &[Duration]) -> Option<Self> {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let (&min_ms, &max_ms) = (ms.first()?, ms.last()?);
        let middle = ms.len() / 2;
        let median_ms = if ms.len() % 2 == 1 {
            ms[middle]
        } else {
            (ms[middle - 1] + ms[middle]) / 2.0
        };
        Some(Self {
            median_ms,
            min_ms,
            max_ms,
        })
    }

    pub(crate) fn cell(&self) -> String {
        format!(
            "{} ({}–{})",
            ms(self.median_ms),
            ms(self.min_ms),
            ms(self.max_ms)
        )
    }
}

fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// One timed prompt.
#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub case: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub new_tokens: usize,
    pub full_ttft: Spread,
    pub reuse_ttft: Spread,
    /// Median time `reuse` spent reading states from the store and preparing them.
    pub reuse_load_ms: f64,
    /// Median full TTFT over median reuse TTFT.
    pub speedup: f64,
    /// Whether both modes chose the same first token in every run.
    pub same_first_token: bool,
}

/// One compiled schema.
#[derive(Clone, Debug, Serialize)]
pub struct CompileResult {
    pub schema: String,
    pub units: usize,
    pub tokens: usize,
    pub tokens_encoded: usize,
    pub seconds: f64,
}

/// Everything one benchmark run measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub runs: usize,
    pub compiled: Vec<CompileResult>,
    pub cases: Vec<CaseResult>,
}

impl BenchReport {
    /// The tables printed by default.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "TTFT on {}, median (min–max) of {} runs per mode, ms; modes alternate within a round",
            self.model, self.runs
        );
        let rows: Vec<[String; 9]> = self
            .cases
            .iter()
            .map(|case| {
                [
                    case.case.clone(),
                    case.prompt_tokens.to_string(),
                    case.cached_tokens.to_string(),
                    case.new_tokens.to_string(),
                    case.full_ttft.cell(),
                    case.reuse_ttft.cell(),
                    ms(case.reuse_load_ms),
                    format!("{:.1}×", case.speedup),
                    if case.same_first_token { "yes" } else { "no" }.to_owned(),
                ]
            })
            .collect();
        let header = [
            "prompt",
            "tokens",
            "cached",
            "new",
            "full TTFT",
            "reuse TTFT",
            "of which load",
            "full/reuse",
            "same 1st token",
        ]
        .map(str::to_owned);
        push_table(&mut out, &header, &rows);
        let _ = writeln!(
            out,
            "\ncompile (encoding every module into an empty store):"
        );
        let header = ["schema", "units", "tokens", "encoded", "seconds"].map(str::to_owned);
        let rows: Vec<[String; 5]> = self
            .compiled
            .iter()
            .map(|compiled| {
                [
                    compiled.schema.clone(),
                    compiled.units.to_string(),
                    compiled.tokens.to_string(),
                    compiled.tokens_encoded.to_string(),
                    format!("{:.1}", compiled.seconds),
                ]
            })
            .collect();
        push_table(&mut out, &header, &rows);
        out
    }
}

/// A table with columns padded to their widest cell; the first column left-aligned, the others
/// right-aligned.
pub(crate) fn push_table<const N: usize>(
    out: &mut String,
    header: &[String; N],
    rows: &[[String; N]],
) {
    let mut widths = header.clone().map(|cell| cell.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(header).chain(rows) {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(widths).enumerate() {
            let padding = " ".repeat(width - cell.chars().count());
            if column == 0 {
                let _ = write!(line, "{cell}{padding}");
            } else {
                let _ = write!(line, "  {padding}{cell}");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Prints a benchmark's report: pretty JSON for tools with `json`, else `table`'s text.
pub fn print_report<R: Serialize>(
    report: &R,
    json: bool,
    table: impl FnOnce(&R) -> String,
) -> anyhow::Result<()> {
    if json {
        let json = serde_json::to_string_pretty(report).context("writing JSON")?;
        println!("{json}");
    } else {
        print!("{}", table(report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_middle_sample_or_the_mean_of_the_two_middle_ones() {
        let odd = Spread::of(&[30, 10, 20].map(Duration::from_millis)).expect("samples");
        assert_eq!((odd.median_ms, odd.min_ms, odd.max_ms), (20.0, 10.0, 30.0));
        let even = Spread::of(&[40, 10, 20, 30].map(Duration::from_millis)).expect("samples");
        assert_eq!(
            (even.median_ms, even.min_ms, even.max_ms),
            (25.0, 10.0, 40.0)
        );
        assert_eq!(Spread::of(&[]), None);
    }
}
