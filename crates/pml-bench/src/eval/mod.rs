//! `pml eval DATA`: answer-quality and fidelity evaluation of the cached modes on a QA file
//! (HotpotQA distractor, NQ-open with oracle passages). Each question becomes a schema whose
//! documents are members of a collection, and a prompt that imports them all and asks the
//! question; modes `full` (once, the reference), `reuse`, `blend` at each ratio and, with
//! `--kv-budgets`, every token computed within a KV budget (H2O, `pml_runtime::kv_budget`) run
//! on it, and with `--keeps` mode `reuse` over compressed module states (`pmlc compile --keep`).
//! With `--edits` the questions become the edited-fact set ([`edits`]): each question's answer
//! changed in its documents, the original documents cached, and the edited prompt run in `full`,
//! `prefix` (the rows before the first change reused) and edit reuse in `reuse` and `blend`.
//! Every question's results are appended to `--out` as one JSON line as soon as they exist, so
//! a stopped run keeps what it measured; the summary table (or JSON) follows at the end, and
//! `--summarize FILE` prints it from such a file (runs split in parts, or stopped early).

mod averages;
pub mod data;
pub mod edits;
pub mod guard;
pub mod report;
pub mod runner;
pub mod score;
pub mod sources;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pml_commands::failure::Failure;
use pml_commands::pipeline::{RuntimeArgs, open_runtime};
use pml_engine::kv_cache::ParallelScaling;
use pml_runtime::inference::{InferenceMode, Runtime, Selection};
use pml_runtime::store::{KeepFraction, ManifestStore, MemoryTier, ModuleStore};

use data::{Dataset, Question};
use edits::EditedQuestion;
use pml_commands::blend_args::{BlendArgs, ModeArg, RecomputeArg, SelectArg};
use report::Summary;
use runner::{EvalMode, QuestionResult, run_question};

/// RAM for the evaluation's module states: every question's documents are encoded into it and
/// the oldest are evicted.
const EVAL_STORE_BYTES: u64 = 1 << 30;

#[derive(Args)]
pub struct EvalArgs {
    /// The QA file: HotpotQA distractor `.json` or NQ-open `.jsonl[.gz]` (with `--summarize`, a
    /// results file written by `--out`).
    data: PathBuf,
    /// Print the summary of a results file written by `--out` (one result per question id,
    /// the first kept; a partial or stopped run is fine) instead of evaluating.
    #[arg(long)]
    summarize: bool,
    /// Its format (default: from the extension, `.json` HotpotQA, `.jsonl[.gz]` NQ-open).
    #[arg(long, value_enum)]
    format: Option<Dataset>,
    /// Evaluate only the first N questions (after `--skip`).
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Leave out the first N questions (to run a set in parts; `--summarize` reads them all).
    #[arg(long, value_name = "N", default_value_t = 0)]
    skip: usize,
    /// Seed of the NQ-open distractor choice and the gold passage's place.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// NQ-open: other questions' passages given with each question's gold passage.
    #[arg(long, default_value_t = 9)]
    distractors: usize,
    /// Recompute ratios of mode `blend`, comma-separated; `auto` for the loading controller's
    /// choice (at least `--recompute-floor`).
    #[arg(long, value_delimiter = ',', default_value = "0.05,0.15,0.3")]
    ratios: Vec<RecomputeArg>,
    /// Rankings of mode `blend` to compare, comma-separated (each runs at every ratio); default:
    /// `--select`'s.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "SELECT,...")]
    selections: Vec<SelectArg>,
    /// Skip mode `reuse`.
    #[arg(long)]
    no_reuse: bool,
    /// Skip mode `blend` (every `--ratios`).
    #[arg(long)]
    no_blend: bool,
    /// Also compute every token within a KV budget of each of these fractions of the prompt
    /// (H2O heavy hitters, comma-separated, e.g. `0.5,0.3`).
    #[arg(long, value_delimiter = ',', value_name = "FRACTION,...")]
    kv_budgets: Vec<f64>,
    /// Also run mode `reuse` and every `blend` over compressed module states keeping each of
    /// these fractions of every unit's rows (`pmlc compile --keep`, comma-separated, e.g.
    /// `0.5,0.3`).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "FRACTION,...",
        conflicts_with = "edits"
    )]
    keeps: Vec<f64>,
    /// Also run mode `reuse` attending the documents as parallel contexts with APE's
    /// correction, at each of these attention temperatures and scales (`T:S`, comma-separated,
    /// e.g. `0.9:0.9,0.5:1`).
    #[arg(long, value_delimiter = ',', value_name = "T:S,...", value_parser = parse_scaling)]
    ape: Vec<ParallelScaling>,
    /// The edited-fact set: each question whose answer its documents mention gets it changed
    /// there; the original documents are cached and the edited prompt compared in `full`,
    /// `prefix` and edit reuse (`reuse`, `blend` at each ratio).
    #[arg(long, conflicts_with = "kv_budgets")]
    edits: bool,
    #[command(flatten)]
    blend: BlendArgs,
    /// Greedy tokens compared with mode `full`.
    #[arg(long, default_value_t = 32)]
    horizon: usize,
    /// Append each question's results to this file as JSON lines while running.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// With `--edits`: append each question's original and edited prompt token ids to this
    /// file as JSON lines (to run the same tokens through another engine).
    #[arg(long, value_name = "FILE", requires = "edits")]
    prompts_out: Option<PathBuf>,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

pub fn run(args: EvalArgs) -> Result<(), Failure> {
    if args.summarize {
        return summarize(&args);
    }
    if args.horizon == 0 {
        return Err(Failure::usage("--horizon must be at least 1".to_string()));
    }
    let (questions, edited) = selected_questions(&args)?;
    let modes = eval_modes(&args)?;
    let mut opened = open_runtime(&args.runtime)?;
    // Kept alive for the run: the RAM-only store's manifests live in it.
    let _manifests = use_ram_only_store(&mut opened.runtime)?;
    let mut out = open_to_append(&args.out)?;
    let mut prompts_out = open_to_append(&args.prompts_out)?;

    let count = if args.edits {
        edited.len()
    } else {
        questions.len()
    };
    let bar = ProgressBar::with_draw_target(Some(count as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg} {wide_bar} {pos}/{len} questions, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("eval {}", opened.id));
    let mut results: Vec<QuestionResult> = Vec::with_capacity(questions.len());
    let mut failed = 0usize;
    let edit_modes: Vec<(String, InferenceMode)> = modes
        .iter()
        .filter_map(|(label, mode)| match mode {
            EvalMode::Cached(mode) => Some((format!("edit {label}"), *mode)),
            EvalMode::KvBudget(_) | EvalMode::Kept(..) | EvalMode::Parallel(_) => None,
        })
        .collect();
    for index in 0..count {
        let (id, result) = if args.edits {
            let question = &edited[index];
            let result =
                edits::run_edited_question(&opened.runtime, question, &edit_modes, args.horizon)
                    .and_then(|(result, prompts)| {
                        if let Some(file) = &mut prompts_out {
                            write_line(file, &prompts)?;
                        }
                        Ok(result)
                    });
            (&question.edited.id, result)
        } else {
            let question = &questions[index];
            (
                &question.id,
                run_question(&mut opened.runtime, question, &modes, args.horizon),
            )
        };
        match result {
            Ok(result) => {
                if let Some(out) = &mut out {
                    write_line(out, &result)?;
                }
                results.push(result);
            }
            Err(error) => {
                failed += 1;
                bar.suspend(|| eprintln!("question {id} skipped: {error:#}"));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    print_summary(&Summary::of(&results), args.json)?;
    eprintln!(
        "model {} | {} questions answered, {failed} skipped | check layer {}",
        opened.id,
        results.len(),
        args.blend.check_layer
    );
    if results.is_empty() {
        return Err(Failure::from(anyhow::anyhow!(
            "no question could be evaluated"
        )));
    }
    Ok(())
}

/// `--summarize`: the tables of results saved by earlier runs.
fn summarize(args: &EvalArgs) -> Result<(), Failure> {
    let results = report::read_results(&args.data)?;
    if results.is_empty() {
        return Err(Failure::from(anyhow::anyhow!(
            "{} holds no results",
            args.data.display()
        )));
    }
    print_summary(&Summary::of(&results), args.json)?;
    eprintln!("{} questions", results.len());
    Ok(())
}

/// The questions `--skip` and `--limit` leave, and (with `--edits`) their edited forms.
fn selected_questions(args: &EvalArgs) -> Result<(Vec<Question>, Vec<EditedQuestion>), Failure> {
    let format = match args.format {
        Some(format) => format,
        None => infer_format(&args.data)?,
    };
    let mut questions = data::load(&args.data, format, args.seed, args.distractors)?;
    let mut edited = if args.edits {
        edits::edited_questions(&questions)
    } else {
        Vec::new()
    };
    for list_len in [questions.len(), edited.len()] {
        if args.skip > 0 && args.skip >= list_len && list_len > 0 {
            return Err(Failure::usage(format!(
                "--skip {} leaves none of the {list_len} questions",
                args.skip
            )));
        }
    }
    questions.drain(..args.skip.min(questions.len()));
    edited.drain(..args.skip.min(edited.len()));
    if let Some(limit) = args.limit {
        questions.truncate(limit);
        edited.truncate(limit);
    }
    if args.edits && edited.is_empty() {
        return Err(Failure::usage(format!(
            "no question of {} has an answer its documents mention: nothing to edit",
            args.data.display()
        )));
    }
    Ok((questions, edited))
}

/// Every mode the arguments ask for, labelled as the tables name them: `reuse`, APE, H2O
/// budgets, `blend` at each ratio and selection, and each with kept rows.
fn eval_modes(args: &EvalArgs) -> Result<Vec<(String, EvalMode)>, Failure> {
    if let Some(bad) = args
        .kv_budgets
        .iter()
        .find(|fraction| !(**fraction > 0.0 && **fraction <= 1.0))
    {
        return Err(Failure::usage(format!(
            "--kv-budgets takes fractions of the prompt above 0 and at most 1, not {bad}"
        )));
    }
    let mut modes: Vec<(String, EvalMode)> = Vec::new();
    if !args.no_reuse {
        modes.push(("reuse".into(), EvalMode::Cached(InferenceMode::Reuse)));
    }
    for &scaling in &args.ape {
        modes.push((
            format!("reuse ape T={} S={}", scaling.temperature, scaling.scale),
            EvalMode::Parallel(scaling),
        ));
    }
    for &fraction in &args.kv_budgets {
        modes.push((format!("h2o kv={fraction}"), EvalMode::KvBudget(fraction)));
    }
    let keeps = args
        .keeps
        .iter()
        .map(|&fraction| {
            KeepFraction::new(fraction).ok_or_else(|| {
                Failure::usage(format!(
                    "--keeps takes fractions of each module's rows above 0 and below 1, not \
                     {fraction}"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut kept_modes: Vec<(String, EvalMode)> = keeps
        .iter()
        .map(|&keep| {
            (
                format!("keep {keep}"),
                EvalMode::Kept(keep, InferenceMode::Reuse),
            )
        })
        .collect();
    let selections = match args.selections.is_empty() {
        true => vec![args.blend.select],
        false => args.selections.clone(),
    };
    let ratios = if args.no_blend {
        &[][..]
    } else {
        &args.ratios[..]
    };
    for &ratio in ratios {
        for &select in &selections {
            // Each ratio is what is measured: no shortcut to `full` or `reuse`.
            let blend = BlendArgs {
                select,
                exact_ratio: true,
                ..args.blend.clone()
            };
            let name = match selections.len() {
                1 => format!("blend r={ratio}"),
                _ => format!("blend r={ratio} {}", Selection::from(select).name()),
            };
            let mode = blend.mode(ModeArg::Blend, ratio);
            for &keep in &keeps {
                kept_modes.push((format!("keep {keep} {name}"), EvalMode::Kept(keep, mode)));
            }
            modes.push((name, EvalMode::Cached(mode)));
        }
    }
    modes.extend(kept_modes);
    Ok(modes)
}

/// Has `runtime` encode into RAM only (no question's modules reach the user's store); the
/// folder its manifests go to, to keep for the run.
fn use_ram_only_store(runtime: &mut Runtime) -> Result<tempfile::TempDir, Failure> {
    let manifests = tempfile::TempDir::new().context("creating a folder for manifests")?;
    let spec = runtime.store().spec().clone();
    let store = ModuleStore::with_tiers(
        spec,
        vec![Box::new(MemoryTier::new(EVAL_STORE_BYTES))],
        ManifestStore::new(manifests.path()),
    );
    runtime
        .replace_store(store)
        .context("switching to a RAM-only store")?;
    Ok(manifests)
}

/// `path` opened to append to, where one is given.
fn open_to_append(path: &Option<PathBuf>) -> anyhow::Result<Option<std::fs::File>> {
    path.as_ref()
        .map(|path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))
        })
        .transpose()
}

/// APE's `T:S`: an attention temperature and a scale, both positive.
fn parse_scaling(text: &str) -> Result<ParallelScaling, String> {
    let factor = |part: Option<&str>| -> Option<f32> {
        part?
            .trim()
            .parse::<f32>()
            .ok()
            .filter(|value| value.is_finite() && *value > 0.0)
    };
    let mut parts = text.split(':');
    match (factor(parts.next()), factor(parts.next()), parts.next()) {
        (Some(temperature), Some(scale), None) => Ok(ParallelScaling { temperature, scale }),
        _ => Err(format!(
            "`{text}` is not T:S (two positive numbers, e.g. 0.9:0.9)"
        )),
    }
}

/// `value` as one JSON line, flushed (a stopped run keeps every line written).
fn write_line(file: &mut std::fs::File, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let line = serde_json::to_string(value).context("encoding a result")?;
    writeln!(file, "{line}")
        .and_then(|()| file.flush())
        .context("writing a result line")
}

fn print_summary(summary: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(summary).context("encoding the summary")?
        );
    } else {
        print!("{summary}");
    }
    Ok(())
}

fn infer_format(path: &std::path::Path) -> Result<Dataset, Failure> {
    let name = path.to_string_lossy();
    if name.ends_with(".json") {
        Ok(Dataset::Hotpotqa)
    } else if name.ends_with(".jsonl") || name.ends_with(".jsonl.gz") {
        Ok(Dataset::Nq)
    } else {
        Err(Failure::usage(format!(
            "cannot tell the format of `{name}`: pass --format hotpotqa or --format nq"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_scaling;

    #[test]
    fn ape_factors_are_two_positive_numbers() {
        let scaling = parse_scaling(" 0.9:0.8").expect("parses");
        assert_eq!((scaling.temperature, scaling.scale), (0.9, 0.8));
        for bad in ["0.9", "0.9:", "0:1", "1:-1", "1:1:1", "a:b", "inf:1", ""] {
            assert!(parse_scaling(bad).is_err(), "{bad}");
        }
    }
}
