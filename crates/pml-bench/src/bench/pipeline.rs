//! `pml bench pipeline`: time to first token of mode `blend` with its modules read from a
//! disk-only store, the cached layers spliced whole before the recompute (`--pipeline off`)
//! against streamed layer by layer during it (`--pipeline on`), both at a fixed ratio, and with
//! the loading controller choosing the ratio (`--recompute auto`, streamed). Every schema is
//! compiled first into a fresh store (unless `--store` names a folder); one warm-up run of each
//! variant stores the modules per layer and warms the page cache; each round then runs every
//! variant once, rotating which goes first.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pml_commands::compile_command::compile_schema;
use pml_commands::failure::Failure;
use pml_commands::pipeline::{
    BackendArgs, EncodeArg, OpenRuntime, RuntimeArgs, WeightsArg, bind, lay_out, open_runtime,
};
use pml_engine::generation::SamplingParams;
use pml_runtime::inference::{
    BlendOptions, InferenceMode, LaidOutSchema, Pipelining, Ratio, RunStats,
};

use super::cases::{Case, DEFAULT_DOCUMENT, DEFAULT_QUESTION, document_cases, example_cases};
use super::report::Spread;

#[derive(Args, Debug)]
pub struct PipelineArgs {
    /// Model: an id or alias, or a path to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Rounds per prompt; each round runs every variant once.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// Fraction recomputed by the fixed-ratio variants, and the floor of the `auto` one.
    #[arg(long, value_name = "R", default_value_t = pml_commands::blend_args::default_ratio())]
    recompute: Ratio,
    /// Sizes of the generated one-document prompts, in tokens (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "1024,2048")]
    sizes: Vec<usize>,
    /// Folder searched (recursively) for example prompts.
    #[arg(long, value_name = "DIR", default_value = "schemas")]
    schemas: PathBuf,
    /// Time only the example prompts whose path below `--schemas` contains this text.
    #[arg(long, value_name = "TEXT", default_value = "docqa")]
    filter: String,
    /// Disk folder of the module store (default: a fresh temporary folder, removed afterwards).
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// How the weights are held in memory.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    weights: WeightsArg,
    #[command(flatten)]
    backend: BackendArgs,
}

/// The variants timed, in the order of the table.
const VARIANTS: [&str; 3] = ["spliced", "streamed", "streamed, r=auto"];

pub fn run(args: PipelineArgs) -> Result<(), Failure> {
    let mut cases = example_cases(&args.schemas, Some(&args.filter))?;
    let temporary = match &args.store {
        Some(_) => None,
        None => Some(
            tempfile::Builder::new()
                .prefix("pml-bench-pipeline-")
                .tempdir()
                .context("creating a temporary module store")?,
        ),
    };
    let folder = args
        .store
        .clone()
        .or_else(|| temporary.as_ref().map(|dir| dir.path().to_path_buf()))
        .context("no store folder")?;
    // Disk only: every run reads its modules from their files, as a fresh process does.
    let opened = open_runtime(&RuntimeArgs {
        model: args.model.clone(),
        store: Some(format!("ram:0,disk:{}", folder.display())),
        encode: EncodeArg::Scaffolded,
        weights: args.weights,
        backend: args.backend.clone(),
    })?;
    cases.extend(document_cases(
        DEFAULT_DOCUMENT,
        DEFAULT_QUESTION,
        &args.sizes,
        opened.runtime.tokenizer(),
    )?);
    if cases.is_empty() {
        return Err(Failure::usage(
            "nothing to time: no example prompt matches and no `--sizes`",
        ));
    }
    let variants = VARIANTS.map(|name| (name, variant(name, args.recompute)));
    let mut schemas: HashMap<PathBuf, LaidOutSchema> = HashMap::new();
    let mut table = String::from(
        "| prompt | cached / new tokens | spliced TTFT (ms) | streamed TTFT (ms) | streamed / \
         spliced | loader / waited (ms) | r=auto TTFT (ms) | r chosen (median) |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (index, case) in cases.iter().enumerate() {
        let runtime = &opened.runtime;
        if !schemas.contains_key(&case.schema.path) {
            let laid_out = lay_out(runtime, &case.schema, false)?;
            eprintln!(
                "{}",
                compile_schema(runtime, &laid_out.layout, &case.schema)?
            );
            schemas.insert(case.schema.path.clone(), laid_out);
        }
        let Some(laid_out) = schemas.get(&case.schema.path) else {
            continue;
        };
        let bound = bind(runtime, laid_out, &case.prompt, false)?;
        if bound.cached.iter().all(|span| span.rows.is_empty()) {
            continue;
        }
        for (_, mode) in &variants {
            first_token(&opened, laid_out, &bound, *mode, case)?;
        }
        let mut samples: Vec<Vec<RunStats>> = vec![Vec::new(); variants.len()];
        for round in 0..usize::from(args.runs) {
            for offset in 0..variants.len() {
                let which = (round + offset) % variants.len();
                let stats = first_token(&opened, laid_out, &bound, variants[which].1, case)?;
                samples[which].push(stats);
            }
        }
        for (name, runs) in VARIANTS.iter().zip(&samples) {
            let last = runs.last().map(|stats| &stats.prefill);
            for warning in last.map_or(&[][..], |prefill| &prefill.warnings[..]) {
                eprintln!("{}, {name}: warning: {warning}", case.name);
            }
            if let Some(pipeline) = last.and_then(|prefill| prefill.pipeline.as_ref()) {
                eprintln!(
                    "{}, {name}: {} units streamed, {} layers, {} units stored per layer",
                    case.name,
                    pipeline.units_streamed,
                    pipeline.layers_streamed,
                    pipeline.units_layered
                );
            }
        }
        let row = summarize(case, &samples)?;
        eprintln!("[{}/{}] {row}", index + 1, cases.len());
        table.push_str(&row);
        table.push('\n');
    }
    println!(
        "model {}, {} rounds, r={} (floor of auto), modules on disk\n",
        opened.id, args.runs, args.recompute
    );
    print!("{table}");
    Ok(())
}

fn variant(name: &str, recompute: Ratio) -> InferenceMode {
    // The pipeline at this ratio is what is measured: no shortcut to `full` or `reuse`.
    let fixed = BlendOptions {
        recompute,
        shortcuts: false,
        ..BlendOptions::default()
    };
    InferenceMode::Blend(match name {
        "spliced" => BlendOptions {
            pipelining: Pipelining::Never,
            ..fixed
        },
        "streamed" => BlendOptions {
            pipelining: Pipelining::Always,
            ..fixed
        },
        _ => BlendOptions {
            pipelining: Pipelining::Always,
            auto_ratio: true,
            ..fixed
        },
    })
}

/// One table row from every variant's runs (in [`VARIANTS`] order).
fn summarize(case: &Case, samples: &[Vec<RunStats>]) -> Result<String, Failure> {
    let spread = |runs: &[RunStats], of: &dyn Fn(&RunStats) -> Duration| {
        let values: Vec<Duration> = runs.iter().map(of).collect();
        Spread::of(&values).context("no runs")
    };
    let ttft = |runs: &[RunStats]| spread(runs, &|stats| stats.time_to_first_token);
    let [spliced, streamed, auto] = samples else {
        return Err(Failure::Failed(anyhow::anyhow!("expected three variants")));
    };
    let (spliced_ttft, streamed_ttft, auto_ttft) = (ttft(spliced)?, ttft(streamed)?, ttft(auto)?);
    let pipeline =
        |stats: &RunStats, of: &dyn Fn(&pml_runtime::inference::PipelineStats) -> Duration| {
            stats.prefill.pipeline.as_ref().map_or(Duration::ZERO, of)
        };
    let loader = spread(streamed, &|stats| pipeline(stats, &|p| p.fetch))?;
    let waited = spread(streamed, &|stats| pipeline(stats, &|p| p.waited))?;
    let mut ratios: Vec<f64> = auto
        .iter()
        .filter_map(|stats| stats.prefill.ratio_choice.map(|choice| choice.ratio.get()))
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    let first = &spliced[0].prefill;
    let mut row = String::new();
    let _ = write!(
        row,
        "| {} | {} / {} | {} | {} | {:.2} | {:.0} / {:.0} | {} | {ratio:.3} |",
        case.name,
        first.tokens_reused + first.tokens_recomputed,
        first.tokens_new,
        spliced_ttft.cell(),
        streamed_ttft.cell(),
        streamed_ttft.median_ms / spliced_ttft.median_ms.max(1e-9),
        loader.median_ms,
        waited.median_ms,
        auto_ttft.cell(),
    );
    Ok(row)
}

/// One run stopped after the first token; its statistics.
fn first_token(
    opened: &OpenRuntime,
    laid_out: &LaidOutSchema,
    bound: &pml_compiler::plan::BoundPrompt,
    mode: InferenceMode,
    case: &Case,
) -> Result<RunStats, Failure> {
    let params = SamplingParams {
        max_tokens: 1,
        ..SamplingParams::default()
    };
    let (_, stats) = opened
        .runtime
        .run_bound(&laid_out.layout, bound, mode, &params, &mut |_| {})
        .with_context(|| format!("running {} in mode {mode}", case.name))?;
    Ok(stats)
}
