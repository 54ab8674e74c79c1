//! `pml run PROMPT.pml`: check the prompt and find its schema (as `pmlc check` does), lay the
//! schema out for the model and compile it on first use, bind the prompt, run it with the cached
//! module states (mode `reuse`), with them repaired by selective recompute (mode `blend`) or with
//! a full prefill (mode `full`), stream the answer to stdout
//! and print the one-line summary (mode, TTFT, tokens reused / recomputed / new, generated tokens,
//! decode speed) to stderr; with `--json`, one JSON object on stdout instead of the answer
//! ([`RunJson`]), for tools such as `pml bench cache --peer`.
//! ([`pml_commands::run_command`] does the work; this prints it): the answer streams to stdout, the
//! summary line and the run's notices go to stderr.

use anyhow::Context;
use pml_commands::failure::Failure;
use pml_commands::run_command::{RunArgs, run_prompt};

use super::answer_stream::AnswerStream;

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let mut opened = None;
    let mut model_load_ms = 0.0;
    let mut answer = AnswerStream::new(!args.no_stream && !args.json);
    let outcome = run_prompt(
        &args,
        |args| {
            let (open, load_ms) = args.open()?;
            model_load_ms = load_ms;
            Ok(opened.insert(open))
        },
        &mut |piece| answer.write(piece),
        &mut |notice| eprintln!("{notice}"),
    )?;
    let Some(opened) = opened else {
        return Err(Failure::usage("the model was not opened"));
    };
    if args.json {
        let report = outcome.json(&opened.id, model_load_ms);
        let json = serde_json::to_string(&report).context("writing JSON")?;
        answer.finish(&json).context("writing the JSON to stdout")?;
    } else {
        answer
            .finish(&outcome.generation.text)
            .context("writing the answer to stdout")?;
    }
    for warning in &outcome.stats.prefill.warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!("{}", outcome.summary(&opened.id));
    opened.release_at_exit();
    Ok(())
}
