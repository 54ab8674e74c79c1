//! `pml bench passes`: what one forward pass over `k` tokens costs after a context of `n`,
//! against one decode step — the curve that decides how many drafted tokens a pass should
//! verify — and the decode speedup it projects for drafts accepted at a given rate.
//!
//! A pass of `k` rows reads the weights once, as a step does, and computes `k` times the
//! products: where a step is bound by reading the weights the extra rows are nearly free, where
//! it is bound by compute they cost about what a step does. The passes are the verification's
//! (every row's logits, appended after the context and rolled back), timed after one untimed
//! pass of each size; the median of the rounds is reported.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use pml_commands::failure::Failure;
use pml_commands::model_fetch::{model_file, resolve_model};
use pml_commands::pipeline::{BackendArgs, WeightsArg};
use pml_engine::device::select_backend;
use pml_engine::gguf::GgufFile;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{ForwardContext, ForwardOptions, LogitRows, Model, ModelConfig};

use super::engine::bench_tokens;
use super::load_average::{format_load, load_average};

#[derive(Args, Debug)]
pub struct PassesArgs {
    /// Model: an id or alias, or a path to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Tokens in the cache before each pass.
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Rows of the passes timed (1 is a decode step).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    rows: Vec<usize>,
    /// Timed passes of each size.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: u16,
    /// Acceptance rates of a drafted token (given the ones before it were accepted) to
    /// project the speedup for.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.7,0.9")]
    acceptance: Vec<f64>,
    /// How PML holds the weights.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    weights: WeightsArg,
    #[command(flatten)]
    backend: BackendArgs,
}

pub fn run(args: PassesArgs) -> Result<(), Failure> {
    if args.rows.is_empty() || args.rows.contains(&0) {
        return Err(Failure::usage("--rows takes pass sizes of at least 1 row"));
    }
    if let Some(bad) = args.acceptance.iter().find(|&&a| !(0.0..1.0).contains(&a)) {
        return Err(Failure::usage(format!(
            "--acceptance takes rates from 0 up to (not including) 1, got {bad}"
        )));
    }
    let choice = resolve_model(args.model.as_deref()).map_err(Failure::Usage)?;
    let path = model_file(&choice)?;
    let backend_choice = args.backend.choice()?;
    let format = args.weights.format_for(&backend_choice);
    let backend =
        select_backend(backend_choice).map_err(|error| Failure::usage(error.to_string()))?;
    let gguf = GgufFile::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let config = ModelConfig::from_gguf(&gguf).context("reading the model configuration")?;
    let model = Model::from_source_on(config, &mut &gguf, format, &backend)
        .with_context(|| format!("loading {}", path.display()))?;

    let largest = args.rows.iter().copied().max().unwrap_or(1);
    let context = bench_tokens(args.context.max(1));
    let mut kv = KvCache::with_capacity(model.kv_layout(), model.device(), context.len() + largest)
        .context("making the KV cache")?;
    let positions: Vec<u32> = (0..context.len() as u32).collect();
    model
        .forward(&context, &positions, &mut kv)
        .context("prefilling the context")?;
    let load_before = load_average();
    let mut medians = Vec::with_capacity(args.rows.len());
    for &rows in &args.rows {
        pass(&model, &mut kv, context.len(), rows)?;
        let mut times: Vec<f64> = (0..args.rounds)
            .map(|_| pass(&model, &mut kv, context.len(), rows))
            .collect::<Result<_, _>>()?;
        times.sort_by(f64::total_cmp);
        medians.push(times[times.len() / 2]);
    }
    let step = args
        .rows
        .iter()
        .position(|&rows| rows == 1)
        .map(|at| medians[at]);
    print!(
        "{}",
        report(&choice.id(), &args, &medians, step, load_before)
    );
    Ok(())
}

/// One verification pass of `rows` tokens after the first `context` slots of `kv`, rolled
/// back after; its seconds.
fn pass(model: &Model, kv: &mut KvCache, context: usize, rows: usize) -> Result<f64, Failure> {
    let tokens = bench_tokens(rows);
    let positions: Vec<u32> = (context as u32..(context + rows) as u32).collect();
    let started = Instant::now();
    let forward = ForwardContext::appending(positions, kv);
    let options = ForwardOptions {
        logits: LogitRows::All,
        ..ForwardOptions::default()
    };
    model
        .forward_with(&tokens, &forward, kv, &options)
        .context("a pass")?;
    model.device().synchronize().context("synchronising")?;
    let seconds = started.elapsed().as_secs_f64();
    kv.rollback(context);
    Ok(seconds)
}

/// The table: each pass's median and its cost in decode steps, then for each acceptance rate
/// the best number of drafts and the speedup it projects.
fn report(
    model: &str,
    args: &PassesArgs,
    medians: &[f64],
    step: Option<f64>,
    load_before: [f64; 3],
) -> String {
    let mut out = format!(
        "# pml bench passes: {model}, {} tokens of context, {} rounds (median); load {}, after {}\n\
         | rows | ms | × one step |\n|---|---|---|\n",
        args.context,
        args.rounds,
        format_load(load_before),
        format_load(load_average()),
    );
    for (&rows, &seconds) in args.rows.iter().zip(medians) {
        let relative = step.map_or("-".to_owned(), |step| format!("{:.2}", seconds / step));
        out.push_str(&format!("| {rows} | {:.1} | {relative} |\n", seconds * 1e3));
    }
    let Some(step) = step else {
        return out;
    };
    out.push_str(
        "\n| acceptance | best drafts | tokens per pass | projected speedup |\n|---|---|---|---|\n",
    );
    for &alpha in &args.acceptance {
        let best = args
            .rows
            .iter()
            .zip(medians)
            .map(|(&rows, &seconds)| {
                let tokens = (1.0 - alpha.powi(rows as i32)) / (1.0 - alpha);
                (rows - 1, tokens, tokens * step / seconds)
            })
            .max_by(|a, b| a.2.total_cmp(&b.2));
        if let Some((drafts, tokens, speedup)) = best {
            out.push_str(&format!(
                "| {alpha:.2} | {drafts} | {tokens:.2} | {speedup:.2}× |\n"
            ));
        }
    }
    out
}
