//! `pmlc`: check PML schemas and prompts, compile schemas into the module store, and explain
//! diagnostic codes.
// A binary: printing is its job (the libraries log through `tracing`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

use clap::{Parser, Subcommand};
use pml_commands::check_command::{CheckOptions, ColorChoice, EXIT_USAGE, OutputFormat, run_check};
use pml_commands::compile_command::{CompileArgs, run_compile};
use pml_commands::explain_command::{explain, list_rules};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "pmlc",
    version,
    about = "Check and compile PML schemas and prompts"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check schemas and prompts; a prompt is checked against the schema it names.
    ///
    /// Exit status: 0 without errors (warnings allowed), 1 with errors, 2 when a file cannot be
    /// read or the command is misused.
    Check {
        /// Schema or prompt files (which one is decided by the root element).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Check every prompt against this schema instead of looking its schema up by name
        /// (`NAME.pml` or `NAME.xml` next to the prompt, then any `.pml` or `.xml` file in its
        /// folder with that schema name).
        #[arg(long, value_name = "FILE")]
        schema: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
        format: OutputFormat,
        #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
        color: ColorChoice,
        /// Show at most N diagnostics per file (0: all); the rest are counted in a note.
        #[arg(long, value_name = "N", default_value_t = pml_syntax::DEFAULT_MAX_SHOWN)]
        max_diagnostics: usize,
        /// Also check argument lengths (PML210), counted with this model's tokenizer (id or
        /// alias, e.g. qwen2.5-0.5b, fetched first when it is not; or a GGUF file's path).
        #[arg(long, short = 'm', value_name = "MODEL")]
        model: Option<String>,
    },
    /// Check schemas, lay them out for a model and encode every module into the store.
    ///
    /// Units already in the store are reused, so recompiling an unchanged schema encodes nothing.
    /// Exit status: 0 when compiled, 1 with errors, 2 when a file cannot be read or is not a
    /// schema.
    Compile(CompileArgs),
    /// Print the documentation of a diagnostic code (e.g. PML205), or list all codes.
    Explain { code: Option<String> },
}

fn main() -> ExitCode {
    pml_engine::keep_freed_memory();
    let cli = Cli::parse();
    pml_commands::logging::init(false);
    let code = run(cli);
    // A model file's first load writes its layout cache in the background.
    pml_engine::model::layout_cache::wait_for_writes();
    code
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Check {
            files,
            schema,
            format,
            color,
            max_diagnostics,
            model,
        } => ExitCode::from(run_check(&CheckOptions {
            files,
            schema,
            format,
            color,
            max_diagnostics,
            model,
        })),
        Command::Compile(args) => ExitCode::from(run_compile(&args)),
        Command::Explain { code: None } => {
            print!("{}", list_rules());
            ExitCode::SUCCESS
        }
        Command::Explain { code: Some(code) } => match explain(&code) {
            Some(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            None => {
                eprintln!(
                    "error: unknown diagnostic code `{code}` (`pmlc explain` lists them all)"
                );
                ExitCode::from(EXIT_USAGE)
            }
        },
    }
}
