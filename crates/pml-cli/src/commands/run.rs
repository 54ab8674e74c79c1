//! `pml run PROMPT.pml`: check the prompt and find its schema (as `pmlc check` does), lay the
//! schema out for the model and compile it on first use, bind the prompt, run it with the cached
//! module states (mode `reuse`), with them repaired by selective recompute (mode `blend`) or with
//! a full prefill (mode `full`), stream the answer to stdout
//! and print the one-line summary (mode, TTFT, tokens reused / recomputed / new, generated tokens,
//! decode speed) to stderr.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use pml_cli::check_command::ColorChoice;
use pml_cli::compile_command::{compile_schema, units_missing};
use pml_cli::failure::Failure;
use pml_cli::pipeline::{CheckedFile, RuntimeArgs, SourceText, bind, check, lay_out, open_runtime};
use pml_runtime::inference::InferenceMode;

use super::answer_stream::AnswerStream;
use super::blend_args::{BlendArgs, ModeArg, RecomputeArg, default_recompute};
use super::plan_view::describe_plan;
use super::sampling::SamplingArgs;

#[derive(Args)]
pub struct RunArgs {
    /// The prompt file.
    prompt: PathBuf,
    /// Bind the prompt to this schema file instead of looking its schema up by name
    /// (`NAME.pml` next to the prompt, then any `.pml` in its folder with that schema name).
    #[arg(long, value_name = "FILE")]
    schema: Option<PathBuf>,
    /// `reuse` splices the modules' cached states and computes only the new tokens; `blend`
    /// also recomputes the cached tokens whose KV deviates most (`--recompute`); `full`
    /// prefills the same tokens at the same positions without any cache (the reference).
    #[arg(long, value_enum, default_value_t = ModeArg::Reuse)]
    mode: ModeArg,
    /// Fraction of the cached tokens recomputed in mode `blend` (0 = reuse, 1 = full), or
    /// `auto`: the largest fraction whose recompute of a layer fits in loading a layer (measured
    /// in this run), at least `--recompute-floor`.
    #[arg(long, value_name = "R|auto", default_value_t = default_recompute())]
    recompute: RecomputeArg,
    #[command(flatten)]
    blend: BlendArgs,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print the bound prompt (cached spans and new tokens, with positions) to stderr first.
    #[arg(long)]
    show_plan: bool,
    /// Print the answer once finished instead of as it is generated.
    #[arg(long)]
    no_stream: bool,
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let color = args.color.enabled();
    let prompt = SourceText::read(&args.prompt)?;
    let schema_path = match check(&prompt, args.schema.as_deref(), color)? {
        CheckedFile::Prompt { schema_path } => schema_path,
        CheckedFile::Schema => {
            return Err(Failure::usage(format!(
                "`{}` is a schema; `pml run` takes a prompt (compile a schema with `pmlc compile`)",
                prompt.name()
            )));
        }
        CheckedFile::Empty => {
            return Err(Failure::usage(format!(
                "`{}` holds neither a schema nor a prompt",
                prompt.name()
            )));
        }
    };
    let schema = SourceText::read(&schema_path)?;
    let opened = open_runtime(&args.runtime)?;
    let runtime = &opened.runtime;
    let laid_out = lay_out(runtime, &schema, color)?;
    let bound = bind(runtime, &laid_out, &prompt, color)?;
    let mode = args.blend.mode(args.mode, args.recompute);
    if mode != InferenceMode::Full {
        let missing = units_missing(runtime, &laid_out.layout)?;
        if missing > 0 {
            eprintln!(
                "schema `{}` is not compiled for {} ({missing} units missing from the store): \
                 compiling it first",
                laid_out.layout.schema_name, opened.spec.id
            );
            let summary = compile_schema(runtime, &laid_out.layout, &schema)?;
            eprintln!("{summary}");
        }
    }
    if args.show_plan {
        eprint!(
            "{}",
            describe_plan(&laid_out.layout, &bound, runtime.tokenizer())
        );
    }
    let params = args.sampling.params();
    let mut answer = AnswerStream::new(!args.no_stream);
    let (generation, stats) = runtime
        .run_bound(&laid_out.layout, &bound, mode, &params, &mut |piece| {
            answer.write(piece)
        })
        .with_context(|| format!("running `{}`", prompt.name()))?;
    answer
        .finish(&generation.text)
        .context("writing the answer to stdout")?;
    for warning in &stats.prefill.warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!(
        "model {} | {stats} | finish {}",
        opened.spec.id, generation.finish_reason
    );
    Ok(())
}
