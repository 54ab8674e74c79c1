//! What the fidelity guard (`--min-fidelity`) would do at several floors, from each `blend`
//! answer's recorded estimate: the guard's decision depends on the estimate alone and the answer
//! it falls back to is `full`'s, so one run without the guard tells every floor's outcome.

use std::fmt;

use super::runner::{ModeResult, QuestionResult};

/// The floors the summary reports.
pub const FLOORS: [f64; 6] = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95];

/// The guard at one floor over one mode's answers.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GuardRow {
    pub floor: f64,
    /// Share of the answers sent to `full`.
    pub fired: f64,
    /// First-token agreement with `full` of the answers let through (`None` if none is).
    pub passed_agreement: Option<f64>,
    /// F1 of the answers let through (`None` if none is).
    pub passed_f1: Option<f64>,
    /// F1 of every answer, the fired ones `full`'s.
    pub guarded_f1: f64,
    /// Median over the questions of the TTFT with the guard (a fired answer costs blend's
    /// attempt and `full`) over `full`'s.
    pub ttft_ratio_to_full_median: f64,
}

/// Whether the guard at `floor` lets `row` through; `None` where the row has no estimate.
fn passes(row: &ModeResult, floor: f64) -> Option<bool> {
    let fidelity = row.estimated_fidelity?;
    Some(fidelity >= floor && row.first_token_changed != Some(true))
}

/// Mode `index`'s rows at each of [`FLOORS`]; empty where no answer has an estimate.
pub fn guard_rows(results: &[QuestionResult], index: usize) -> Vec<GuardRow> {
    let rows: Vec<(&ModeResult, &ModeResult)> = results
        .iter()
        .filter_map(|result| Some((result.modes.first()?, result.modes.get(index)?)))
        .filter(|(_, row)| row.estimated_fidelity.is_some())
        .collect();
    if rows.is_empty() {
        return Vec::new();
    }
    FLOORS
        .iter()
        .map(|&floor| {
            let passed: Vec<&ModeResult> = rows
                .iter()
                .filter(|(_, row)| passes(row, floor) == Some(true))
                .map(|(_, row)| *row)
                .collect();
            let guarded = |(full, row): &(&ModeResult, &ModeResult)| match passes(row, floor) {
                Some(true) => (row.f1, row.ttft_ms),
                _ => (full.f1, row.ttft_ms + full.ttft_ms),
            };
            GuardRow {
                floor,
                fired: 1.0 - passed.len() as f64 / rows.len() as f64,
                passed_agreement: (!passed.is_empty()).then(|| {
                    super::averages::mean(
                        passed
                            .iter()
                            .map(|row| f64::from(u8::from(row.first_token_agrees))),
                    )
                }),
                passed_f1: (!passed.is_empty())
                    .then(|| super::averages::mean(passed.iter().map(|row| row.f1))),
                guarded_f1: super::averages::mean(rows.iter().map(|pair| guarded(pair).0)),
                ttft_ratio_to_full_median: super::averages::median(
                    rows.iter()
                        .map(|pair| guarded(pair).1 / pair.0.ttft_ms.max(f64::MIN_POSITIVE))
                        .collect(),
                ),
            }
        })
        .collect()
}

/// The guard's table for one mode.
pub struct GuardTable<'a> {
    pub mode: &'a str,
    pub rows: &'a [GuardRow],
}

impl fmt::Display for GuardTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\n{}, with `--min-fidelity F` (fired: answered in `full`):\n\n| F | fired | \
             first-token agree of those let through | their F1 | F1 of all | TTFT / full \
             (median) |\n|---|---|---|---|---|---|",
            self.mode
        )?;
        // A floor that lets nothing through has no agreement or F1 to show.
        let shown =
            |value: Option<f64>| value.map_or("–".to_string(), |value| format!("{value:.3}"));
        for row in self.rows {
            writeln!(
                f,
                "| {} | {:.3} | {} | {} | {:.3} | {:.3} |",
                row.floor,
                row.fired,
                shown(row.passed_agreement),
                shown(row.passed_f1),
                row.guarded_f1,
                row.ttft_ratio_to_full_median
            )?;
        }
        Ok(())
    }
}
