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
use pml_commands::check_command::ColorChoice;
use pml_commands::failure::Failure;
use pml_commands::pipeline::{RuntimeArgs, open_draft_model, open_runtime, store_config};
use pml_runtime::conversation::{ChatParts, Conversation, SessionStore, TurnReport};
use pml_runtime::kv_budget::{HeavyHitters, KvBudget};
use pml_runtime::restore::{CostCache, LayerForm, RestorePlan, plan_restore};

use super::answer_stream::AnswerStream;
use pml_commands::sampling_args::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    /// Save every turn under this name and resume it if it exists.
    #[arg(long, value_name = "NAME")]
    session: Option<String>,
    /// System text for a new conversation (a resumed one keeps its own: another text is refused).
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// List the saved sessions of the store (name, turns, model, last turn) and exit.
    #[arg(long, conflicts_with_all = ["session", "delete_session"])]
    list_sessions: bool,
    /// Delete a saved session and exit (its turns' states stay in the store until evicted).
    #[arg(long, value_name = "NAME", conflicts_with = "session")]
    delete_session: Option<String>,
    /// Colour the prompt and the status lines on stderr (the answer on stdout stays plain).
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// How saved turns are stored per layer: `auto` asks the restore planner (measured costs of
    /// the slowest store tier), the others store every layer one way.
    #[arg(long, value_enum, default_value_t = PlanArg::Auto)]
    plan: PlanArg,
    /// Positions the conversation may use (llama.cpp's `-c`); default and most: the model's
    /// context. Without `--kv-budget` the conversation ends there.
    #[arg(long, short = 'c', value_name = "N")]
    ctx_size: Option<u32>,
    /// Hold at most N KV slots (H2O): the first few (attention sinks), the newest
    /// (`--kv-recent`) and those that received the most attention; the others are evicted, and
    /// at the end of the context the kept slots move back to position 0, so the conversation
    /// goes on. Not with `--session` (a saved history is held whole).
    #[arg(long, value_name = "N", conflicts_with = "session")]
    kv_budget: Option<usize>,
    /// With `--kv-budget`: the newest slots always kept (default: half the budget, H2O's split).
    #[arg(long, value_name = "N", requires = "kv_budget")]
    kv_recent: Option<usize>,
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
    let sessions = SessionStore::new(&store_root);
    if args.list_sessions {
        return list_sessions(&sessions);
    }
    if let Some(name) = &args.delete_session {
        return delete_session(&sessions, name);
    }
    let paint = Paint {
        enabled: args.color.enabled(),
    };
    // Checked before the model loads.
    let budget = args
        .kv_budget
        .map(|slots| KvBudget::h2o(slots, args.kv_recent))
        .transpose()
        .map_err(|error| Failure::usage(error.to_string()))?;
    if args.ctx_size == Some(0) {
        return Err(Failure::usage("--ctx-size must be at least 1"));
    }
    args.sampling.speculation.check().map_err(Failure::usage)?;
    let draft_model = args.sampling.speculation.draft.draft_model.as_deref();
    if draft_model.is_some() && args.kv_budget.is_some() {
        return Err(Failure::usage(
            "`--draft-model` does not draft within a `--kv-budget` (each step is the budget's \
             own pass of one token): drop one of them",
        ));
    }
    let mut opened = open_runtime(&args.runtime)?;
    if let Some(draft) = draft_model {
        open_draft_model(&args.runtime, draft, &mut opened)?;
    }
    let runtime = &opened.runtime;
    let context = runtime.max_positions();
    let max_positions = args.ctx_size.map_or(context, |size| size.min(context));
    if let Some(size) = args.ctx_size
        && size > context
    {
        eprintln!(
            "{}",
            paint.warning(&format!(
                "warning: --ctx-size {size} is past the model's context of {context} positions; \
                 using {context}"
            ))
        );
    }
    let hitters = budget
        .map(|budget| HeavyHitters::new(budget).with_position_limit(max_positions))
        .transpose()
        .map_err(|error| Failure::usage(error.to_string()))?;
    let parts = ChatParts {
        model: runtime.model(),
        tokenizer: runtime.tokenizer(),
        template: runtime.template(),
        store: runtime.store(),
        max_positions,
        draft: runtime.draft_model().map(|draft| draft.model()),
    };
    let fingerprint = runtime.store().spec().model_fingerprint.clone();
    let mut conversation = start_conversation(&args, &sessions, &fingerprint, paint)?;
    if let Some(hitters) = hitters {
        conversation = conversation.with_kv_budget(hitters);
    }
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
            eprint!("{}", paint.prompt("> "));
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
        for fallback in report
            .restored
            .iter()
            .filter_map(|unit| unit.fallback.as_ref())
        {
            eprintln!(
                "{}",
                paint.warning(&format!("warning: a saved turn was recomputed: {fallback}"))
            );
        }
        let status = turn_status(conversation.turns(), &report, budget);
        eprintln!("{}", paint.dim(&status));
    }
    Ok(())
}

/// The conversation `--session` resumes (its system text kept: another one is refused), or a
/// new one.
fn start_conversation(
    args: &ChatArgs,
    sessions: &SessionStore,
    fingerprint: &str,
    paint: Paint,
) -> Result<Conversation, Failure> {
    let Some(name) = &args.session else {
        return Ok(Conversation::new(args.system.clone()));
    };
    let Some(session) = sessions
        .read(name, fingerprint)
        .context("reading the session")?
    else {
        return Ok(Conversation::new(args.system.clone()));
    };
    if let Some(system) = &args.system
        && session.system.as_deref() != Some(system.as_str())
    {
        return Err(Failure::usage(format!(
            "session `{name}` was started with {}; a resumed session keeps its own: drop \
             `--system`, or start a new session (`--delete-session {name}` removes this one)",
            match &session.system {
                Some(_) => "another system text",
                None => "no system text",
            }
        )));
    }
    eprintln!(
        "{}",
        paint.dim(&format!(
            "resuming session `{name}`: {} turn(s) to restore from the store",
            session.units.len()
        ))
    );
    Ok(Conversation::resume(&session))
}

/// The line each turn ends with on stderr: the history (and what was restored), the KV budget's
/// account, the prefill, TTFT, the answer's length and what was saved.
fn turn_status(turns: usize, report: &TurnReport, budget: Option<KvBudget>) -> String {
    let restored: usize = report.restored.iter().map(|unit| unit.n_tokens).sum();
    let restore_ms: f64 = report
        .restored
        .iter()
        .map(|unit| unit.elapsed.as_secs_f64() * 1e3)
        .fold(0.0, |total, ms| total + ms);
    let restored = if restored > 0 {
        format!(" ({restored} restored in {restore_ms:.1} ms)")
    } else {
        String::new()
    };
    let saved = report
        .saved
        .as_ref()
        .map(|saved| {
            format!(
                " | saved {} entries ({} bytes)",
                saved.entries, saved.tensor_bytes
            )
        })
        .unwrap_or_default();
    let kv = match budget {
        Some(budget) => format!(
            " | KV {} of {} slots ({} evicted{})",
            report.kv_slots,
            budget.slots,
            report.evicted,
            match report.position_moves {
                0 => String::new(),
                moves => format!(", moved to position 0 {moves}×"),
            }
        ),
        None => String::new(),
    };
    let speculation = &report.generation.speculation;
    let drafted = match speculation.drafted {
        0 => String::new(),
        _ => format!(" | {speculation}"),
    };
    format!(
        "turn {turns} | history {} tokens{restored}{kv} | prefill {} tokens | TTFT {:.1} ms | {} tokens, finish {}{drafted}{saved}",
        report.history_tokens,
        report.prefill_tokens,
        report.time_to_first_token.as_secs_f64() * 1e3,
        report.generation.token_ids.len(),
        report.generation.finish_reason,
    )
}

/// `--list-sessions`: one line per saved session, on stdout.
fn list_sessions(sessions: &SessionStore) -> Result<(), Failure> {
    let listed = sessions.list().context("listing the sessions")?;
    if listed.is_empty() {
        eprintln!("no saved sessions (`pml chat --session NAME` saves one)");
        return Ok(());
    }
    println!(
        "{:<24} {:>5}  {:<14} last turn",
        "session", "turns", "model"
    );
    for entry in listed {
        let turns = entry
            .turns
            .map_or_else(|| "?".to_string(), |turns| turns.to_string());
        let model = entry
            .model_fingerprint
            .as_deref()
            .map_or("unreadable", |fingerprint| {
                fingerprint.get(..12).unwrap_or(fingerprint)
            });
        let age = entry
            .modified
            .and_then(|modified| modified.elapsed().ok())
            .map_or_else(|| "?".to_string(), |age| format!("{} ago", short_age(age)));
        println!("{:<24} {turns:>5}  {model:<14} {age}", entry.name);
    }
    Ok(())
}

/// `--delete-session NAME`.
fn delete_session(sessions: &SessionStore, name: &str) -> Result<(), Failure> {
    if sessions.delete(name).context("deleting the session")? {
        eprintln!("deleted session `{name}`");
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "no session `{name}` (`pml chat --list-sessions` lists them)"
        )))
    }
}

/// `42 s`, `5 min`, `3 h`, `2 days`.
fn short_age(age: std::time::Duration) -> String {
    let seconds = age.as_secs();
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min", seconds / 60),
        3600..86400 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86400),
    }
}

/// ANSI styles for stderr when colour is on (`--color`), as llama.cpp's `--color` sets the
/// conversation apart from its logs.
#[derive(Clone, Copy)]
struct Paint {
    enabled: bool,
}

impl Paint {
    fn style(&self, code: &str, text: &str) -> String {
        if self.enabled {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn prompt(&self, text: &str) -> String {
        self.style("1;32", text)
    }

    fn dim(&self, text: &str) -> String {
        self.style("2", text)
    }

    fn warning(&self, text: &str) -> String {
        self.style("33", text)
    }
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
