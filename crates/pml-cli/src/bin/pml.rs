//! `pml`: run prompts, generate, serve, bench. Each subcommand lives in its own module under
//! `src/commands/`; this file only parses the command line and dispatches.

#[path = "../commands/mod.rs"]
mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Generate from plain text with a full prefill (no module cache): the baseline.
    Generate(commands::generate::GenerateArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Models(args) => commands::models::run(args),
        Command::Generate(args) => commands::generate::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
