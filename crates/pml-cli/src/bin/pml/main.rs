//! `pml`: run prompts, generate, serve, bench. Each subcommand lives in its own module under
//! `commands/` beside it (`bench` and `eval` in the `pml-bench` crate); this file only parses the
//! command line and dispatches.
// A binary: printing is its job (the libraries log through `tracing`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pml_commands::failure::Failure;

#[derive(Parser)]
#[command(name = "pml", version, about = "Prompt modules with cached attention")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download, verify and list models.
    Models(commands::models::ModelsArgs),
    /// The token ids of a text under a model's tokenizer (as llama.cpp's `llama-tokenize`).
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Generate from plain text with a full prefill (no module cache): the baseline.
    Generate(commands::generate::GenerateArgs),
    /// Answer a prompt with its schema's cached modules (compiling the schema on first use).
    ///
    /// Exit status: 0 when answered, 1 when the prompt or its schema has errors or the run failed,
    /// 2 when a file cannot be read or the command is misused.
    Run(pml_commands::run_command::RunArgs),
    /// Benchmarks: time to first token with and without the module cache.
    Bench(pml_bench::bench::BenchArgs),
    /// Language server for editors, on stdin/stdout (see docs/editors.md).
    Lsp(commands::lsp::LspArgs),
    /// Answer quality and fidelity of the cached modes on a QA file (HotpotQA, NQ-open).
    Eval(pml_bench::eval::EvalArgs),
    /// Serve schemas and prompts over HTTP (OpenAI-compatible completions, batched decoding).
    Serve(commands::serve::ServeArgs),
    /// Chat, one user turn per line of stdin; `--session NAME` saves every turn's state to the
    /// store and resumes the conversation from it later.
    Chat(commands::chat::ChatArgs),
}

fn main() -> ExitCode {
    pml_engine::keep_freed_memory();
    let cli = Cli::parse();
    // The server's log is read later and next to other logs: it gets timestamps.
    pml_commands::logging::init(matches!(cli.command, Command::Serve(_)));
    let result = match cli.command {
        Command::Models(args) => commands::models::run(args).map_err(Failure::from),
        Command::Tokenize(args) => commands::tokenize::run(args).map_err(Failure::from),
        Command::Generate(args) => commands::generate::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Bench(args) => pml_bench::bench::run(args),
        Command::Lsp(args) => commands::lsp::run(args),
        Command::Eval(args) => pml_bench::eval::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Chat(args) => commands::chat::run(args),
    };
    // A model file's first load writes its layout cache in the background.
    pml_engine::model::layout_cache::wait_for_writes();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => ExitCode::from(failure.report()),
    }
}
