//! `pml bench cache`: time to first token of mode `full` (prefill every prompt token) against mode
//! `reuse` (splice the modules' cached states, compute only the new tokens) on the example prompts
//! and on generated document prompts of chosen sizes. Every schema is compiled first, into a
//! fresh store unless `--store` names one, and its compile time is reported on its own. Each
//! round runs both modes, alternating which goes first. `--peer llama-cpp` times something else:
//! `reuse` in a fresh process against llama.cpp's prompt cache ([`super::peer`]).

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use clap::builder::ArgPredicate;
use pml_commands::compile_command::compile_schema;
use pml_commands::failure::Failure;
use pml_commands::pipeline::{
    BackendArgs, EncodeArg, OpenRuntime, RuntimeArgs, WeightsArg, bind, lay_out, open_runtime,
};
use pml_compiler::plan::BoundPrompt;
use pml_engine::generation::SamplingParams;
use pml_runtime::inference::{InferenceMode, LaidOutSchema, RunStats};

use super::cases::{Case, DEFAULT_DOCUMENT, DEFAULT_QUESTION, document_cases, example_cases};
use super::peer::{Peer, PeerOptions};
use super::report::print_report;
use super::report::{BenchReport, CaseResult, CompileResult, Spread};
use pml_engine::device::{DeviceChoice, Kernels};

#[derive(Args, Debug)]
pub struct CacheArgs {
    /// Model: an id or alias, or a path to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Rounds per prompt; each round runs both modes once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// Sizes of the generated document prompts, in tokens (empty: none; 4096 with `--peer`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1024,2048,4096",
        default_value_if("peer", ArgPredicate::IsPresent, Some("4096"))
    )]
    sizes: Vec<usize>,
    /// Text of the document prompts: paragraphs separated by blank lines (default: the
    /// HotpotQA paragraphs built into the binary, see crates/pml-bench/data/README.md).
    #[arg(long, value_name = "FILE")]
    document: Option<PathBuf>,
    /// The question asked after the document (keep it short: it is computed in both modes).
    #[arg(long, default_value = DEFAULT_QUESTION)]
    question: String,
    /// Folder searched (recursively) for example prompts.
    #[arg(long, value_name = "DIR", default_value = "schemas")]
    schemas: PathBuf,
    /// Time only the example prompts whose path below `--schemas` contains this text.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Skip the example prompts.
    #[arg(long)]
    no_examples: bool,
    /// Module store to compile into (default: a fresh temporary folder, removed afterwards, so
    /// compile times are real encoding times).
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// How the weights are held in memory.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    weights: WeightsArg,
    #[command(flatten)]
    backend: BackendArgs,
    /// Print the results as JSON on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// Compare instead the cached TTFT of `reuse`, in a fresh `pml run` process reading the
    /// document's state from a disk store, with this engine's prompt cache on the same token ids,
    /// on the document prompts only (`llama-cpp` needs scripts/setup-llama-cpp.sh).
    #[arg(long, value_enum, conflicts_with_all = ["filter", "store"])]
    peer: Option<Peer>,
}

pub fn run(args: CacheArgs) -> Result<(), Failure> {
    let document = match &args.document {
        Some(path) => std::fs::read_to_string(path).map_err(|error| {
            Failure::usage(format!(
                "cannot read `--document {}`: {error}",
                path.display()
            ))
        })?,
        None => DEFAULT_DOCUMENT.to_owned(),
    };
    if let Some(Peer::LlamaCpp) = args.peer {
        // llama.cpp runs on the CPU here, so PML does too: another device is refused, not
        // ignored.
        let choice = args.backend.choice()?;
        if choice.device != DeviceChoice::Cpu || choice.kernels == Some(Kernels::Candle) {
            return Err(Failure::usage(
                "`--peer llama-cpp` compares the CPU engines: leave out `--device` and \
                 `--kernels` (or $PML_DEVICE / $PML_KERNELS)",
            ));
        }
        return super::peer::run(&PeerOptions {
            cache_type: args.backend.cache_type,
            model: args.model.as_deref(),
            rounds: usize::from(args.runs),
            sizes: &args.sizes,
            document: &document,
            question: &args.question,
            weights: args.weights,
            json: args.json,
        });
    }
    let mut cases = if args.no_examples {
        Vec::new()
    } else {
        example_cases(&args.schemas, args.filter.as_deref())?
    };
    let temporary_store = match &args.store {
        Some(_) => None,
        None => Some(tempfile_dir()?),
    };
    let store = args
        .store
        .clone()
        .or_else(|| temporary_store.as_ref().map(|dir| dir.path().to_path_buf()))
        .map(|dir| dir.display().to_string());
    let opened = open_runtime(&RuntimeArgs {
        model: args.model.clone(),
        store,
        encode: EncodeArg::Scaffolded,
        weights: args.weights,
        backend: args.backend.clone(),
    })?;
    cases.extend(document_cases(
        &document,
        &args.question,
        &args.sizes,
        opened.runtime.tokenizer(),
    )?);
    if cases.is_empty() {
        return Err(Failure::usage(
            "nothing to time: no example prompts and no `--sizes`",
        ));
    }
    let mut bench = Bench {
        opened: &opened,
        schemas: HashMap::new(),
        compiled: Vec::new(),
    };
    let mut results = Vec::with_capacity(cases.len());
    for (index, case) in cases.iter().enumerate() {
        let progress = format!("[{}/{}] {}", index + 1, cases.len(), case.name);
        match bench.time_case(case, usize::from(args.runs))? {
            Some(result) => {
                eprintln!(
                    "{progress}: full {:.0} ms, reuse {:.0} ms ({:.1}×)",
                    result.full_ttft.median_ms, result.reuse_ttft.median_ms, result.speedup
                );
                results.push(result);
            }
            None => eprintln!("{progress}: skipped (nothing cached to reuse)"),
        }
    }
    let report = BenchReport {
        model: opened.id.clone(),
        runs: usize::from(args.runs),
        compiled: bench.compiled,
        cases: results,
    };
    print_report(&report, args.json, BenchReport::table)?;
    Ok(())
}

fn tempfile_dir() -> Result<tempfile::TempDir, Failure> {
    Ok(tempfile::Builder::new()
        .prefix("pml-bench-store-")
        .tempdir()
        .context("creating a temporary module store")?)
}

/// The runtime, and the schemas laid out and compiled so far (by schema file).
struct Bench<'a> {
    opened: &'a OpenRuntime,
    schemas: HashMap<PathBuf, LaidOutSchema>,
    compiled: Vec<CompileResult>,
}

impl Bench<'_> {
    /// Times `case` in both modes, `runs` rounds; `None` when the prompt reuses nothing.
    fn time_case(&mut self, case: &Case, runs: usize) -> Result<Option<CaseResult>, Failure> {
        let runtime = &self.opened.runtime;
        if !self.schemas.contains_key(&case.schema.path) {
            let laid_out = lay_out(runtime, &case.schema, false)?;
            let summary = compile_schema(runtime, &laid_out.layout, &case.schema)?;
            eprintln!("{summary}");
            self.compiled.push(CompileResult {
                schema: laid_out.layout.schema_name.clone(),
                units: summary.n_units,
                tokens: summary.tokens,
                tokens_encoded: summary.tokens_encoded,
                seconds: summary.elapsed.as_secs_f64(),
            });
            self.schemas.insert(case.schema.path.clone(), laid_out);
        }
        let Some(laid_out) = self.schemas.get(&case.schema.path) else {
            return Err(Failure::Failed(anyhow::anyhow!(
                "schema of {} lost",
                case.name
            )));
        };
        let bound = bind(runtime, laid_out, &case.prompt, false)?;
        if bound.cached.iter().all(|span| span.rows.is_empty()) {
            return Ok(None);
        }
        let mut full = Vec::with_capacity(runs);
        let mut reuse = Vec::with_capacity(runs);
        let mut reuse_load = Vec::with_capacity(runs);
        let mut same_first_token = true;
        let mut counts = None;
        for round in 0..runs {
            let order = if round % 2 == 0 {
                [InferenceMode::Full, InferenceMode::Reuse]
            } else {
                [InferenceMode::Reuse, InferenceMode::Full]
            };
            let mut first_tokens = Vec::with_capacity(2);
            for mode in order {
                let (stats, first_token) = self.first_token(laid_out, &bound, mode, case)?;
                first_tokens.push(first_token);
                match mode {
                    InferenceMode::Full => full.push(stats.time_to_first_token),
                    InferenceMode::Reuse | InferenceMode::Blend(_) => {
                        reuse.push(stats.time_to_first_token);
                        reuse_load.push(stats.prefill.load);
                        counts = Some((stats.prefill.tokens_reused, stats.prefill.tokens_new));
                    }
                }
            }
            same_first_token &= first_tokens[0] == first_tokens[1];
        }
        let (Some(full_ttft), Some(reuse_ttft), Some(load), Some((cached_tokens, new_tokens))) = (
            Spread::of(&full),
            Spread::of(&reuse),
            Spread::of(&reuse_load),
            counts,
        ) else {
            return Err(Failure::Failed(anyhow::anyhow!("no runs of {}", case.name)));
        };
        Ok(Some(CaseResult {
            case: case.name.clone(),
            prompt_tokens: cached_tokens + new_tokens,
            cached_tokens,
            new_tokens,
            full_ttft,
            reuse_ttft,
            reuse_load_ms: load.median_ms,
            speedup: full_ttft.median_ms / reuse_ttft.median_ms.max(1e-9),
            same_first_token,
        }))
    }

    /// One run that stops after the first token (greedy): its statistics and the token.
    fn first_token(
        &self,
        laid_out: &LaidOutSchema,
        bound: &BoundPrompt,
        mode: InferenceMode,
        case: &Case,
    ) -> Result<(RunStats, Option<u32>), Failure> {
        let params = SamplingParams {
            max_tokens: 1,
            ..SamplingParams::default()
        };
        let (generation, stats) = self
            .opened
            .runtime
            .run_bound(&laid_out.layout, bound, mode, &params, &mut |_| {})
            .with_context(|| format!("running {} in mode {mode}", case.name))?;
        Ok((stats, generation.token_ids.first().copied()))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cache: CacheArgs,
    }

    fn parse(args: &[&str]) -> Result<CacheArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("cache").chain(args.iter().copied()))
            .map(|cli| cli.cache)
    }

    #[test]
    fn the_peer_mode_defaults_to_the_4k_document_only() {
        let plain = parse(&[]).expect("no arguments");
        assert_eq!((plain.peer, plain.sizes), (None, vec![1024, 2048, 4096]));
        let peer = parse(&["--peer", "llama-cpp"]).expect("peer");
        assert_eq!((peer.peer, peer.sizes), (Some(Peer::LlamaCpp), vec![4096]));
        let sized = parse(&["--peer", "llama-cpp", "--sizes", "1024,2048"]).expect("sizes");
        assert_eq!(sized.sizes, vec![1024, 2048]);
    }

    #[test]
    fn the_peer_mode_refuses_what_it_does_not_use() {
        assert!(parse(&["--peer", "llama.cpp"]).is_err());
        assert!(parse(&["--peer", "llama-cpp", "--filter", "docqa"]).is_err());
        assert!(parse(&["--peer", "llama-cpp", "--store", "/tmp/s"]).is_err());
    }
}
