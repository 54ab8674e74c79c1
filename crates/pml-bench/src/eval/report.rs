//! The per-mode summary of an evaluation: answer quality (F1, exact match), fidelity to mode
//! `full` (first-token agreement, first-token KL, greedy agreement), time to first token
//! (median, and the median of each question's ratio to `full`, which machine load disturbs less)
//! and how many cached tokens were recomputed.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use anyhow::Context;

use super::averages::{mean, median};
use super::guard::{GuardRow, GuardTable, guard_rows};
use super::runner::QuestionResult;

/// One mode's figures over the questions answered.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModeSummary {
    pub mode: String,
    pub questions: usize,
    pub f1: f64,
    pub exact_match: f64,
    pub first_token_agreement: f64,
    pub first_token_kl: f64,
    pub greedy_agreement: f64,
    pub ttft_median_ms: f64,
    pub ttft_ratio_to_full_median: f64,
    pub tokens_recomputed_mean: f64,
    pub tokens_cached_mean: f64,
    /// Ratio `auto`: the mean fraction the loading controller chose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_chosen_mean: Option<f64>,
    /// Edited questions (`--edits`): the share of answers naming the changed fact, and the
    /// share naming the fact the documents held before the edit (answering from stale KV).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub names_new_fact: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub names_old_fact: Option<f64>,
    /// Modes reading module states: the bytes they take in the store over the whole states'
    /// (summed over the questions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_bytes_ratio: Option<f64>,
    /// First-token agreement over the questions where `full`'s first token leads its runner-up
    /// by at least [`DECIDED_MARGIN`], and how many those are (`None` where no result records
    /// the margin).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_agreement: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_questions: Option<usize>,
    /// Mode `blend`: the fidelity guard at several floors, from the answers' estimates.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub guard: Vec<GuardRow>,
}

/// The probability lead of `full`'s first token over its runner-up from which the question
/// counts as decided: below it the two are near a tie that any rounding may flip.
pub const DECIDED_MARGIN: f64 = 0.1;

/// Every mode's summary, in the order the modes ran.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub modes: Vec<ModeSummary>,
}

impl Summary {
    pub fn of(results: &[QuestionResult]) -> Self {
        let labels: Vec<String> = results
            .first()
            .map(|result| result.modes.iter().map(|mode| mode.mode.clone()).collect())
            .unwrap_or_default();
        let modes = labels
            .iter()
            .enumerate()
            .map(|(index, label)| {
                let rows: Vec<_> = results
                    .iter()
                    .filter_map(|result| Some((result.modes.first()?, result.modes.get(index)?)))
                    .collect();
                let decided = decided(results, index);
                let mean = |value: &dyn Fn(&super::runner::ModeResult) -> f64| {
                    mean(rows.iter().map(|(_, row)| value(row)))
                };
                ModeSummary {
                    mode: label.clone(),
                    questions: rows.len(),
                    f1: mean(&|row| row.f1),
                    exact_match: mean(&|row| row.exact_match),
                    first_token_agreement: mean(&|row| f64::from(u8::from(row.first_token_agrees))),
                    first_token_kl: mean(&|row| row.first_token_kl),
                    greedy_agreement: mean(&|row| row.greedy_agreement),
                    ttft_median_ms: median(rows.iter().map(|(_, row)| row.ttft_ms).collect()),
                    ttft_ratio_to_full_median: median(
                        rows.iter()
                            .map(|(full, row)| row.ttft_ms / full.ttft_ms.max(f64::MIN_POSITIVE))
                            .collect(),
                    ),
                    tokens_recomputed_mean: mean(&|row| row.tokens_recomputed as f64),
                    tokens_cached_mean: mean(&|row| {
                        (row.tokens_reused + row.tokens_recomputed) as f64
                    }),
                    ratio_chosen_mean: {
                        let chosen: Vec<f64> = rows
                            .iter()
                            .filter_map(|(_, row)| row.ratio_chosen)
                            .collect();
                        (!chosen.is_empty()).then(|| self::mean(chosen.into_iter()))
                    },
                    names_new_fact: names_fact(results, index, |result| {
                        result.answers.first().map(String::as_str)
                    }),
                    names_old_fact: names_fact(results, index, |result| {
                        result.edited_from.as_deref()
                    }),
                    store_bytes_ratio: store_bytes_ratio(results, index),
                    decided_agreement: decided.map(|(agreement, _)| agreement),
                    decided_questions: decided.map(|(_, n)| n),
                    guard: guard_rows(results, index),
                }
            })
            .collect();
        Self { modes }
    }
}

/// Mode `index`'s store bytes over the whole states' bytes, summed over the questions that
/// report both (`None` without any).
fn store_bytes_ratio(results: &[QuestionResult], index: usize) -> Option<f64> {
    let (mode, whole) = results
        .iter()
        .filter_map(|result| Some((result.modes.get(index)?.store_bytes?, result.store_bytes?)))
        .fold((0u64, 0u64), |(mode, whole), (bytes, all)| {
            (mode + bytes, whole + all)
        });
    (whole > 0).then(|| mode as f64 / whole as f64)
}

/// Mode `index`'s first-token agreement over the questions whose `full` margin is at least
/// [`DECIDED_MARGIN`], with their number; `None` where no result records the margin.
fn decided(results: &[QuestionResult], index: usize) -> Option<(f64, usize)> {
    if results
        .iter()
        .all(|result| result.first_token_margin.is_none())
    {
        return None;
    }
    let agrees: Vec<f64> = results
        .iter()
        .filter(|result| result.first_token_margin >= Some(DECIDED_MARGIN))
        .filter_map(|result| result.modes.get(index))
        .map(|mode| f64::from(u8::from(mode.first_token_agrees)))
        .collect();
    let n = agrees.len();
    Some((mean(agrees.into_iter()), n))
}

/// Over edited questions only (`None` without any): the share whose mode `index` answer names
/// `fact` (case-insensitive) and not, for the old fact, the new one too.
fn names_fact(
    results: &[QuestionResult],
    index: usize,
    fact: impl Fn(&QuestionResult) -> Option<&str>,
) -> Option<f64> {
    let named: Vec<f64> = results
        .iter()
        .filter(|result| result.edited_from.is_some())
        .filter_map(|result| {
            let answer = result.modes.get(index)?.answer.to_lowercase();
            let new = result.answers.first()?.to_lowercase();
            let fact = fact(result)?.to_lowercase();
            let names = answer.contains(&fact) && (fact == new || !answer.contains(&new));
            Some(f64::from(u8::from(names)))
        })
        .collect();
    (!named.is_empty()).then(|| mean(named.into_iter()))
}

impl fmt::Display for Summary {
    /// A Markdown table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| mode | n | F1 | EM | first-token agree | first-token KL | greedy-32 agree | \
             TTFT median (ms) | TTFT / full (median) | recomputed / cached |"
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|---|---|")?;
        for mode in &self.modes {
            writeln!(
                f,
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.4} | {:.3} | {:.0} | {:.3} | {:.0} / {:.0} |",
                mode.mode,
                mode.questions,
                mode.f1,
                mode.exact_match,
                mode.first_token_agreement,
                mode.first_token_kl,
                mode.greedy_agreement,
                mode.ttft_median_ms,
                mode.ttft_ratio_to_full_median,
                mode.tokens_recomputed_mean,
                mode.tokens_cached_mean,
            )?;
        }
        if self.modes.iter().any(|mode| {
            mode.store_bytes_ratio
                .is_some_and(|ratio| (ratio - 1.0).abs() > 1e-9)
        }) {
            writeln!(f, "\n| mode | store bytes / whole states |")?;
            writeln!(f, "|---|---|")?;
            for mode in &self.modes {
                if let Some(ratio) = mode.store_bytes_ratio {
                    writeln!(f, "| {} | {ratio:.3} |", mode.mode)?;
                }
            }
        }
        if self
            .modes
            .iter()
            .any(|mode| mode.decided_agreement.is_some())
        {
            writeln!(
                f,
                "\n| mode | first-token agree where `full`'s lead is ≥ {DECIDED_MARGIN} | questions |"
            )?;
            writeln!(f, "|---|---|---|")?;
            for mode in &self.modes {
                if let (Some(agreement), Some(n)) = (mode.decided_agreement, mode.decided_questions)
                {
                    writeln!(f, "| {} | {agreement:.3} | {n} |", mode.mode)?;
                }
            }
        }
        for mode in self.modes.iter().filter(|mode| !mode.guard.is_empty()) {
            write!(
                f,
                "{}",
                GuardTable {
                    mode: &mode.mode,
                    rows: &mode.guard
                }
            )?;
        }
        if self.modes.iter().any(|mode| mode.names_new_fact.is_some()) {
            writeln!(f, "\n| mode | names the new fact | names the old fact |")?;
            writeln!(f, "|---|---|---|")?;
            for mode in &self.modes {
                let share = |value: Option<f64>| value.map_or("-".into(), |v| format!("{v:.3}"));
                writeln!(
                    f,
                    "| {} | {} | {} |",
                    mode.mode,
                    share(mode.names_new_fact),
                    share(mode.names_old_fact)
                )?;
            }
        }
        Ok(())
    }
}

/// The results streamed to a `--out` file (several runs may have appended to it): one per
/// question id, the first kept; blank lines skipped, a line that does not parse is an error
/// except a last one cut short by a stopped run.
pub fn read_results(path: &Path) -> anyhow::Result<Vec<QuestionResult>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    let mut seen = HashSet::new();
    let mut results = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        let result: QuestionResult = match serde_json::from_str(line) {
            Ok(result) => result,
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("line {} of {} is not a result", index + 1, path.display())
                });
            }
        };
        if seen.insert(result.id.clone()) {
            results.push(result);
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::runner::ModeResult;

    fn row(mode: &str, f1: f64, ttft_ms: f64, agrees: bool) -> ModeResult {
        ModeResult {
            mode: mode.into(),
            answer: String::new(),
            f1,
            exact_match: f1,
            first_token_agrees: agrees,
            first_token_kl: 0.0,
            greedy_agreement: 1.0,
            ttft_ms,
            tokens_reused: 90,
            tokens_recomputed: 10,
            tokens_new: 5,
            ratio_chosen: None,
            store_bytes: None,
            estimated_fidelity: None,
            first_token_changed: None,
        }
    }

    #[test]
    fn the_guard_is_told_at_each_floor_from_the_estimates() {
        // (estimate, first token changed, agrees with full, F1, TTFT ms); full: F1 1, 100 ms.
        let answers = [
            (0.99, false, true, 1.0, 10.0),
            (0.93, false, true, 0.5, 10.0),
            (0.85, false, false, 0.0, 10.0),
            (0.99, true, false, 0.0, 10.0),
        ];
        let results: Vec<QuestionResult> = answers
            .iter()
            .map(|&(fidelity, changed, agrees, f1, ttft)| QuestionResult {
                id: String::new(),
                question: String::new(),
                answers: Vec::new(),
                encode_ms: 0.0,
                modes: vec![
                    row("full", 1.0, 100.0, true),
                    ModeResult {
                        estimated_fidelity: Some(fidelity),
                        first_token_changed: Some(changed),
                        ..row("blend r=0.15", f1, ttft, agrees)
                    },
                ],
                edited_from: None,
                store_bytes: None,
                first_token_margin: None,
            })
            .collect();
        let summary = Summary::of(&results);
        assert!(summary.modes[0].guard.is_empty());
        let at = |floor: f64| {
            summary.modes[1]
                .guard
                .iter()
                .find(|row| row.floor == floor)
                .expect("a floor")
                .clone()
        };
        // 0.8: only the changed first token fires.
        let low = at(0.8);
        assert!((low.fired - 0.25).abs() < 1e-12);
        assert!((low.passed_agreement.expect("some pass") - 2.0 / 3.0).abs() < 1e-12);
        assert!((low.guarded_f1 - 2.5 / 4.0).abs() < 1e-12);
        // 0.95: two fire; what passes is the first answer alone.
        let high = at(0.95);
        assert!((high.fired - 0.75).abs() < 1e-12);
        assert_eq!(high.passed_agreement, Some(1.0));
        assert!((high.guarded_f1 - 1.0).abs() < 1e-12);
        // TTFT: 10 ms once, 110 ms three times over full's 100: the median is 1.1.
        assert!((high.ttft_ratio_to_full_median - 1.1).abs() < 1e-12);
        assert!(summary.to_string().contains("with `--min-fidelity F`"));
        // A floor that lets nothing through shows no agreement or F1 (not NaN).
        let none_through = GuardRow {
            fired: 1.0,
            passed_agreement: None,
            passed_f1: None,
            ..high
        };
        let table = GuardTable {
            mode: "blend",
            rows: &[none_through],
        }
        .to_string();
        assert!(
            table.contains("| 1.000 | – | – |") && !table.contains("NaN"),
            "{table}"
        );
    }

    #[test]
    fn streamed_results_are_read_back_once_per_question() {
        let dir = tempfile::TempDir::new().expect("temporary directory");
        let path = dir.path().join("results.jsonl");
        let result = |id: &str| QuestionResult {
            id: id.into(),
            question: String::new(),
            answers: Vec::new(),
            encode_ms: 0.0,
            modes: vec![row("full", 1.0, 10.0, true)],
            edited_from: None,
            store_bytes: Some(100),
            first_token_margin: None,
        };
        let line = |id: &str| serde_json::to_string(&result(id)).expect("encodes");
        let text = format!(
            "{}\n\n{}\n{}\n{{\"id\": \"cut",
            line("a"),
            line("b"),
            line("a")
        );
        std::fs::write(&path, text).expect("writes");
        let read = read_results(&path).expect("reads");
        let ids: Vec<&str> = read.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        std::fs::write(&path, format!("not json\n{}\n", line("a"))).expect("writes");
        assert!(read_results(&path).is_err());
    }

    #[test]
    fn the_controllers_choices_are_averaged_where_there_are_any() {
        let auto = |ratio: f64| ModeResult {
            ratio_chosen: Some(ratio),
            ..row("blend r=auto", 1.0, 20.0, true)
        };
        let question = |ratio: f64| QuestionResult {
            id: String::new(),
            question: String::new(),
            answers: Vec::new(),
            encode_ms: 0.0,
            modes: vec![row("full", 1.0, 100.0, true), auto(ratio)],
            edited_from: None,
            store_bytes: Some(100),
            first_token_margin: None,
        };
        let summary = Summary::of(&[question(0.15), question(0.25)]);
        assert_eq!(summary.modes[0].ratio_chosen_mean, None);
        let chosen = summary.modes[1].ratio_chosen_mean.expect("a mean");
        assert!((chosen - 0.2).abs() < 1e-12, "{chosen}");
        let json = serde_json::to_string(&summary).expect("encodes");
        assert_eq!(json.matches("ratio_chosen_mean").count(), 1, "{json}");
    }

    #[test]
    fn summary_means_medians_and_ratios() {
        let question = |full_ms: f64, reuse_ms: f64, agrees: bool| QuestionResult {
            id: String::new(),
            question: String::new(),
            answers: Vec::new(),
            encode_ms: 0.0,
            modes: vec![
                row("full", 1.0, full_ms, true),
                ModeResult {
                    store_bytes: Some(50),
                    ..row("reuse", 0.0, reuse_ms, agrees)
                },
            ],
            edited_from: None,
            store_bytes: Some(100),
            first_token_margin: None,
        };
        let summary = Summary::of(&[
            question(100.0, 10.0, true),
            question(200.0, 40.0, false),
            question(400.0, 40.0, false),
        ]);
        let reuse = &summary.modes[1];
        assert_eq!(reuse.questions, 3);
        assert_eq!(reuse.f1, 0.0);
        assert!((reuse.first_token_agreement - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(reuse.ttft_median_ms, 40.0);
        assert!((reuse.ttft_ratio_to_full_median - 0.1).abs() < 1e-12);
        assert_eq!(reuse.tokens_cached_mean, 100.0);
        assert!(summary.to_string().contains("| reuse | 3 |"));
        assert!(!summary.to_string().contains("names the new fact"));
        assert_eq!(summary.modes[0].store_bytes_ratio, None);
        assert_eq!(reuse.store_bytes_ratio, Some(0.5));
        assert!(summary.to_string().contains("| reuse | 0.500 |"));
    }

    #[test]
    fn agreement_is_also_counted_where_full_was_decided() {
        let question = |margin: Option<f64>, agrees: bool| QuestionResult {
            id: String::new(),
            question: String::new(),
            answers: Vec::new(),
            encode_ms: 0.0,
            modes: vec![row("full", 1.0, 1.0, true), row("blend", 1.0, 1.0, agrees)],
            edited_from: None,
            store_bytes: None,
            first_token_margin: margin,
        };
        let old = Summary::of(&[question(None, false)]);
        assert_eq!(old.modes[1].decided_agreement, None);
        assert!(!old.to_string().contains("lead is"));
        let summary = Summary::of(&[
            question(Some(0.02), false),
            question(Some(0.5), true),
            question(Some(DECIDED_MARGIN), false),
            question(None, false),
        ]);
        assert_eq!(summary.modes[1].first_token_agreement, 0.25);
        assert_eq!(summary.modes[1].decided_agreement, Some(0.5));
        assert_eq!(summary.modes[1].decided_questions, Some(2));
        assert_eq!(summary.modes[0].decided_agreement, Some(1.0));
        assert!(summary.to_string().contains("| blend | 0.500 | 2 |"));
    }

    #[test]
    fn edited_questions_count_answers_naming_the_new_and_the_old_fact() {
        let question = |answers: [&str; 2]| QuestionResult {
            id: String::new(),
            question: String::new(),
            answers: vec!["1908".into()],
            encode_ms: 0.0,
            modes: answers
                .iter()
                .enumerate()
                .map(|(index, answer)| ModeResult {
                    answer: (*answer).into(),
                    ..row(if index == 0 { "full" } else { "edit" }, 0.0, 1.0, true)
                })
                .collect(),
            edited_from: Some("1901".into()),
            store_bytes: Some(100),
            first_token_margin: None,
        };
        let summary = Summary::of(&[
            question(["In 1908.", "In 1901."]),
            question(["1908", "1901 or 1908"]),
        ]);
        assert_eq!(summary.modes[0].names_new_fact, Some(1.0));
        assert_eq!(summary.modes[0].names_old_fact, Some(0.0));
        assert_eq!(summary.modes[1].names_new_fact, Some(0.5));
        assert_eq!(summary.modes[1].names_old_fact, Some(0.5));
        assert!(summary.to_string().contains("| edit | 0.500 | 0.500 |"));
    }
}
