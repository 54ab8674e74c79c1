//! `pml chat`: a conversation with the model, one user turn per line of stdin (interactive at a
//! terminal, scriptable from a pipe). With `--session NAME` every turn's state is saved to the
//! module store in the restore planner's format and the conversation is recorded, so running
//! `pml chat --session NAME` again resumes it: the history is restored from the store (KV
//! loaded, or hidden states projected, layer by layer) instead of recomputed.
//!
//! Answers go to stdout, one per turn followed by a blank line; the plan and a line per turn
//! (history restored, tokens computed, time to first token) go to stderr.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Context;
use clap::Args;
use pml_cli::failure::Failure;
use pml_cli::pipeline::{RuntimeArgs, open_runtime, store_config};
use pml_runtime::conversation::{ChatParts, Conversation, SessionStore};
use pml_runtime::restore::{CostCache, LayerForm, RestorePlan, plan_restore};

use super::answer_stream::AnswerStream;
use super::sampling::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    /// Save every turn under this name and resume it if it exists.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// System text for a new conversation (a resumed one keeps its own).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// How saved turns are stored per layer: `auto` asks the restore planner (measured costs of
    /// the slowest store tier), the others store every layer one way.
    #[arg(long, value_enum, default_value_t = PlanArg::Auto)]
    plan: PlanArg,
    #[command(flatten)]
    runtime: RuntimeArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanArg {
    Auto,
    Kv,
    Hidden,
    Recompute,
}

pub fn run(args: ChatArgs) -> Result<(), Failure> {
    let store_root = store_config(args.runtime.store.as_deref())?.root;
    let opened = open_runtime(&args.runtime)?;
    let runtime = &opened.runtime;
    let parts = ChatParts {
        model: runtime.model(),
        tokenizer: runtime.tokenizer(),
        template: runtime.template(),
        store: runtime.store(),
    };
    let fingerprint = runtime.store().spec().model_fingerprint.clone();
    let sessions = SessionStore::new(&store_root);
    let mut conversation = match &args.session {
        Some(name) => match sessions
            .read(name, &fingerprint)
            .context("reading the session")?
        {
            Some(session) => {
                eprintln!(
                    "resuming session `{name}`: {} turn(s) to restore from the store",
                    session.units.len()
                );
                Conversation::resume(&session)
            }
            None => Conversation::new(args.system.clone()),
        },
        None => Conversation::new(args.system.clone()),
    };
    let plan = match &args.session {
        Some(_) => Some(choose_plan(args.plan, &parts, &store_root)?),
        None => None,
    };

    let params = args.sampling.params();
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|error| Failure::usage(format!("cannot read stdin: {error}")))?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let mut answer = AnswerStream::new(true);
        let report = conversation
            .turn(&parts, text, &params, plan.as_ref(), &mut |piece| {
                answer.write(piece)
            })
            .with_context(|| format!("turn {}", conversation.turns() + 1))?;
        answer
            .finish(&report.generation.text)
            .context("writing the answer to stdout")?;
        println!();
        std::io::stdout()
            .flush()
            .context("writing the answer to stdout")?;
        if let Some(name) = &args.session {
            sessions
                .write(name, &conversation.session(&fingerprint))
                .context("saving the session")?;
        }
        let restored: usize = report.restored.iter().map(|unit| unit.n_tokens).sum();
        let restore_ms: f64 = report
            .restored
            .iter()
            .map(|unit| unit.elapsed.as_secs_f64() * 1e3)
            .sum();
        for fallback in report
            .restored
            .iter()
            .filter_map(|unit| unit.fallback.as_ref())
        {
            eprintln!("warning: a saved turn was recomputed: {fallback}");
        }
        let saved = report
            .saved
            .map(|saved| {
                format!(
                    " | saved {} entries ({} bytes)",
                    saved.entries, saved.tensor_bytes
                )
            })
            .unwrap_or_default();
        eprintln!(
            "turn {} | history {} tokens ({restored} restored in {restore_ms:.1} ms) | prefill {} tokens | TTFT {:.1} ms | {} tokens, finish {}{saved}",
            conversation.turns(),
            report.history_tokens,
            report.prefill_tokens,
            report.time_to_first_token.as_secs_f64() * 1e3,
            report.generation.token_ids.len(),
            report.generation.finish_reason,
        );
    }
    Ok(())
}

/// The plan turns are saved in: a pure form, or the planner's choice from the measured costs of
/// the slowest tier (where a resumed session reads from).
fn choose_plan(
    arg: PlanArg,
    parts: &ChatParts<'_>,
    store_root: &std::path::Path,
) -> Result<RestorePlan, Failure> {
    let n_layers = parts.model.config().n_layers;
    let form = match arg {
        PlanArg::Kv => Some(LayerForm::Kv),
        PlanArg::Hidden => Some(LayerForm::Hidden),
        PlanArg::Recompute => Some(LayerForm::Recompute),
        PlanArg::Auto => None,
    };
    if let Some(form) = form {
        return Ok(RestorePlan::uniform(form, n_layers));
    }
    let Some(tier) = parts.store.tiers().last() else {
        return Ok(RestorePlan::uniform(LayerForm::Recompute, n_layers));
    };
    let (costs, measured) = CostCache::new(store_root)
        .load_or_measure(parts.model, parts.store, tier.as_ref())
        .context("measuring restore costs")?;
    let plan = plan_restore(&costs, n_layers);
    let estimate = plan.estimate(&costs, 1);
    eprintln!(
        "restore plan ({} tier, costs {}): {plan} | per token: compute {:.1} µs, load {:.1} µs",
        tier.name(),
        if measured {
            "measured now"
        } else {
            "as measured before"
        },
        estimate.compute * 1e6,
        estimate.io * 1e6,
    );
    Ok(plan)
}
