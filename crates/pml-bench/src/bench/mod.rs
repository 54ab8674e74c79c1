//! `pml bench ...`: benchmarks run from the command line on real models. `cache` compares the
//! time to first token with and without the module cache; `engine` times the engine itself
//! against llama.cpp; `store` times restoring a unit's state from each store tier as KV, hidden
//! states, recompute and the restore planner's mix; `pipeline` times mode `blend` from disk with
//! the cached layers spliced up front against streamed during the recompute. `cache --peer
//! llama-cpp` compares PML's cached TTFT with llama.cpp's prompt cache. `passes` times passes
//! of several tokens against a decode step, the cost curve of speculative decoding.

pub mod cache;
pub mod cases;
pub mod engine;
pub mod engine_report;
pub mod engine_rounds;
pub mod load_average;
pub mod passes;
pub mod peer;
pub mod peer_report;
pub mod peer_rounds;
pub mod pipeline;
pub mod report;
pub mod store;

use clap::{Args, Subcommand};
use pml_commands::failure::Failure;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Time to first token of `full` against `reuse`, on the example prompts and on document
    /// prompts of chosen sizes; with `--peer llama-cpp`, `reuse` in a fresh process against
    /// llama.cpp's prompt cache on the document prompts.
    Cache(cache::CacheArgs),
    /// Prefill throughput, TTFT, decode time and peak memory of the engine at several prompt
    /// sizes, side by side with llama.cpp on the same GGUF when it is installed.
    Engine(engine::EngineArgs),
    /// Restore time per store tier (RAM, disk, Redis) for KV, hidden states, recompute and the
    /// restore planner, on the default model (GQA) and a random-weight MHA model.
    Store(store::StoreArgs),
    /// Time to first token of mode `blend` from a disk store, cached layers spliced before the
    /// recompute against streamed during it, and with `--recompute auto`.
    Pipeline(pipeline::PipelineArgs),
    /// The time of a pass over k tokens after a context, against one decode step (what decides
    /// how many drafts a pass verifies), and the speedup it projects per acceptance rate.
    Passes(passes::PassesArgs),
}

pub fn run(args: BenchArgs) -> Result<(), Failure> {
    match args.command {
        BenchCommand::Cache(args) => cache::run(args),
        BenchCommand::Engine(args) => engine::run(args),
        BenchCommand::Store(args) => store::run(args),
        BenchCommand::Pipeline(args) => pipeline::run(args),
        BenchCommand::Passes(args) => passes::run(args),
    }
}

/// The command-line spelling of a flag's value (`--weights`, `--cache-type`), for the `pml`
/// processes a benchmark starts; `what` names the flag in the error.
fn flag_value<T: clap::ValueEnum>(value: &T, what: &str) -> Result<String, Failure> {
    clap::ValueEnum::to_possible_value(value)
        .map(|value| value.get_name().to_owned())
        .ok_or_else(|| Failure::Failed(anyhow::anyhow!("naming {what}")))
}
