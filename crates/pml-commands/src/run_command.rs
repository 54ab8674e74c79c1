//! `pml run PROMPT.pml` (the binary prints; the Python module calls the same code): check the prompt and find its schema (as `pmlc check` does), lay the
//! schema out for the model and compile it on first use, bind the prompt, run it with the cached
//! module states (mode `reuse`), with them repaired by selective recompute (mode `blend`) or with
//! a full prefill (mode `full`), stream the answer to stdout
//! and print the one-line summary (mode, TTFT, tokens reused / recomputed / new, generated tokens,
//! decode speed) to stderr; with `--json`, one JSON object on stdout instead of the answer
//! ([`RunJson`]), for tools such as `pml bench cache --peer`.
//!
//! A prompt its model's context cannot hold is refused with exit 2 before anything is computed:
//! a file of more bytes than the context could hold (PML306) before it is read, one whose
//! positions and `--max-tokens` are more than the context (PML305) once it is bound.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use pml_engine::generation::Generation;
use pml_runtime::inference::edit::rebind_edited;
use pml_runtime::inference::{InferenceError, InferenceMode, RunStats, SplicePlan};
use pml_runtime::kv_budget::KvBudget;
use serde::{Deserialize, Serialize};

use crate::blend_args::{BlendArgs, ModeArg, RecomputeArg, SelectArg, default_recompute};
use crate::check_command::ColorChoice;
use crate::compile_command::{compile_schema_if_writable, units_missing};
use crate::failure::Failure;
use crate::pipeline::{
    CheckedFile, OpenRuntime, RuntimeArgs, SourceText, bind, check, context_failure, lay_out,
    open_draft_model, open_runtime, read_prompt,
};
use crate::plan_view::describe_plan;
use crate::sampling_args::SamplingArgs;

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// The prompt file.
    pub prompt: PathBuf,
    /// Bind the prompt to this schema file instead of looking its schema up by name
    /// (`NAME.pml` next to the prompt, then any `.pml` in its folder with that schema name).
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// `reuse` splices the modules' cached states and computes only the new tokens; `blend`
    /// also recomputes the cached tokens whose KV deviates most (`--recompute`); `full`
    /// prefills the same tokens at the same positions without any cache (the reference).
    #[arg(long, value_enum, default_value_t = ModeArg::Reuse)]
    pub mode: ModeArg,
    /// Fraction of the cached tokens recomputed in mode `blend` (0 = reuse, 1 = full), or
    /// `auto`: the largest fraction whose recompute of a layer fits in loading a layer (measured
    /// in this run), at least `--recompute-floor`.
    #[arg(long, value_name = "R|auto", default_value_t = default_recompute())]
    pub recompute: RecomputeArg,
    #[command(flatten)]
    pub blend: BlendArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print the bound prompt (cached spans and new tokens, with positions) to stderr first.
    #[arg(long)]
    pub show_plan: bool,
    /// Print the answer once finished instead of as it is generated.
    #[arg(long)]
    pub no_stream: bool,
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Print one JSON object on stdout (the answer, its token ids and the run's timings and
    /// token counts) instead of the answer text; the summary line still goes to stderr.
    #[arg(long)]
    pub json: bool,
    /// A schema changed since it was compiled is compiled first, instead of reusing the stored
    /// states of its changed modules for their unchanged tokens (edit reuse: mode `blend`, in
    /// mode `reuse` ranked by deviation).
    #[arg(long)]
    pub no_edit_reuse: bool,
    /// Decode within at most N KV slots (H2O): after the prefill the prompt's rows are scored
    /// by the attention its last computed tokens pay them, and the first few (attention
    /// sinks), the newest (`--kv-recent`) and the highest scoring are kept; each step's
    /// attention adds to the scores and the others are evicted. Time to first token is the
    /// mode's.
    #[arg(long, value_name = "N")]
    pub kv_budget: Option<usize>,
    /// With `--kv-budget`: the newest slots always kept (default: half the budget, H2O's split).
    #[arg(long, value_name = "N", requires = "kv_budget")]
    pub kv_recent: Option<usize>,
}

/// What `pml run --json` prints: the answer and the run's account. Times are in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunJson {
    pub model: String,
    pub mode: String,
    pub answer: String,
    /// Generated token ids (without the end-of-turn token that ended the answer).
    pub token_ids: Vec<u32>,
    pub finish_reason: String,
    /// Loading the model and opening the store: before the run's work, so not in the TTFT.
    pub model_load_ms: f64,
    /// Units compiled before the run because the store lacked them (not in the TTFT either).
    pub units_compiled_first: usize,
    /// From the start of the prefill (store reads and splice included) to the first token.
    pub ttft_ms: f64,
    pub load_ms: f64,
    pub splice_ms: f64,
    pub compute_ms: f64,
    pub tokens_reused: usize,
    pub tokens_recomputed: usize,
    pub tokens_new: usize,
    /// Module tokens the prompt imports that compressed states (`pmlc compile --keep`) left out.
    #[serde(default)]
    pub tokens_not_kept: usize,
    /// The new tokens in position order: what was computed after the spliced states.
    pub new_token_ids: Vec<u32>,
    /// Every prompt token in position order, the modules' included: what another engine is
    /// given to answer the same prompt.
    #[serde(default)]
    pub prompt_token_ids: Vec<u32>,
    pub units_encoded_on_the_fly: Vec<String>,
    pub tokens_generated: usize,
    pub decode_ms_per_token: Option<f64>,
    /// Tokens drafted ahead of the model (`--speculative`) and the ones it accepted.
    #[serde(default)]
    pub tokens_drafted: usize,
    #[serde(default)]
    pub tokens_accepted: usize,
    /// With `--kv-budget` (and a prompt and answer that could exceed it): slots evicted.
    #[serde(default)]
    pub tokens_evicted: Option<usize>,
    /// Mode `blend`'s estimated fidelity to mode `full` (1 where computed exactly).
    pub estimated_fidelity: Option<f32>,
    /// The repair changed the most likely first token.
    pub first_token_changed: Option<bool>,
    /// The fidelity guard sent the prompt to mode `full`.
    #[serde(default)]
    pub fidelity_guard_fired: bool,
    pub warnings: Vec<String>,
}

impl RunJson {
    pub fn new(
        model: &str,
        generation: &Generation,
        stats: &RunStats,
        plan: &SplicePlan,
        model_load_ms: f64,
        units_compiled_first: usize,
    ) -> Self {
        let prefill = &stats.prefill;
        let ms = |duration: std::time::Duration| duration.as_secs_f64() * 1e3;
        Self {
            model: model.to_owned(),
            mode: prefill.mode.to_string(),
            answer: generation.text.clone(),
            token_ids: generation.token_ids.clone(),
            finish_reason: generation.finish_reason.to_string(),
            model_load_ms,
            units_compiled_first,
            ttft_ms: ms(stats.time_to_first_token),
            load_ms: ms(prefill.load),
            splice_ms: ms(prefill.splice),
            compute_ms: ms(prefill.compute),
            tokens_reused: prefill.tokens_reused,
            tokens_recomputed: prefill.tokens_recomputed,
            tokens_new: prefill.tokens_new,
            tokens_not_kept: prefill.tokens_dropped,
            new_token_ids: plan.new_tokens.clone(),
            prompt_token_ids: plan.all_tokens.clone(),
            units_encoded_on_the_fly: prefill.units_encoded_on_the_fly.clone(),
            tokens_generated: stats.tokens_generated,
            decode_ms_per_token: stats.decode_ms_per_token,
            tokens_drafted: stats.speculation.drafted,
            tokens_accepted: stats.speculation.accepted,
            tokens_evicted: stats.kv_budget.map(|report| report.evicted),
            estimated_fidelity: prefill.blend_estimate().map(|estimate| estimate.fidelity()),
            first_token_changed: prefill
                .blend_estimate()
                .map(|estimate| estimate.first_token_changed),
            fidelity_guard_fired: prefill.guard.is_some(),
            warnings: prefill.warnings.clone(),
        }
    }
}

/// A finished `pml run`: the answer, its account, and what it ran on.
pub struct RunOutcome {
    pub generation: Generation,
    pub stats: RunStats,
    /// The plan the prompt ran under (after edit reuse rebinds it, that one).
    pub plan: SplicePlan,
    /// Units compiled before the run because the store lacked them (not in the TTFT).
    pub units_compiled_first: usize,
}

impl RunOutcome {
    /// The summary line `pml run` prints to stderr.
    pub fn summary(&self, model_id: &str) -> String {
        format!(
            "model {model_id} | {} | finish {}",
            self.stats, self.generation.finish_reason
        )
    }

    /// What `pml run --json` prints.
    pub fn json(&self, model_id: &str, model_load_ms: f64) -> RunJson {
        RunJson::new(
            model_id,
            &self.generation,
            &self.stats,
            &self.plan,
            model_load_ms,
            self.units_compiled_first,
        )
    }
}

impl RunArgs {
    /// Opens the model and the store `--model` and `--store` name (fetching a registered model
    /// if needed), after checking the prompt, so that a broken prompt costs no model load; the
    /// milliseconds the load took.
    pub fn open(&self) -> Result<(OpenRuntime, f64), Failure> {
        let started = Instant::now();
        let mut opened = open_runtime(&self.runtime)?;
        if let Some(draft) = &self.sampling.speculation.draft.draft_model {
            open_draft_model(&self.runtime, draft, &mut opened)?;
        }
        Ok((opened, started.elapsed().as_secs_f64() * 1e3))
    }
}

/// Compiles what the draft model's store lacks of `layout`, so that its prefill splices its
/// own states as the model's does.
fn compile_draft_first(
    draft: &pml_runtime::inference::Runtime,
    layout: &pml_compiler::plan::SchemaLayout,
    schema: &SourceText,
    notice: &mut dyn FnMut(&str),
) -> Result<(), Failure> {
    let missing = units_missing(draft, layout)?;
    if missing == 0 {
        return Ok(());
    }
    notice(&format!(
        "schema `{}` is not compiled for the draft model ({missing} units missing from the \
         store): compiling it first",
        layout.schema_name
    ));
    match compile_schema_if_writable(draft, layout, schema)? {
        Ok(summary) => notice(&summary.to_string()),
        Err(unstored) => notice(&format!(
            "schema `{}` is computed for the draft model for this run only: {unstored}",
            layout.schema_name
        )),
    }
    Ok(())
}

/// Runs `args.prompt`: checks it and finds its schema (diagnostics rendered to stderr), opens
/// the runtime with `open` (an open one may be handed back), compiles what the store lacks
/// (or reuses the stored states of an edited schema), binds and answers it, streaming the text
/// to `on_text`; `notice` receives the lines `pml run` prints to stderr on the way.
pub fn run_prompt<'o>(
    args: &RunArgs,
    open: impl FnOnce(&RunArgs) -> Result<&'o mut OpenRuntime, Failure>,
    on_text: &mut dyn FnMut(&str),
    notice: &mut dyn FnMut(&str),
) -> Result<RunOutcome, Failure> {
    let color = args.color.enabled();
    // Checked before the model loads.
    args.sampling.speculation.check().map_err(Failure::usage)?;
    let kv_budget = args
        .kv_budget
        .map(|slots| KvBudget::h2o(slots, args.kv_recent))
        .transpose()
        .map_err(|error| Failure::usage(error.to_string()))?;
    let prompt = read_prompt(&args.prompt, &args.runtime)?;
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
    let opened = open(args)?;
    prompt.check_bytes(&opened.runtime)?;
    let laid_out = lay_out(&opened.runtime, &schema, color)?;
    let bound = bind(&opened.runtime, &laid_out, &prompt, color)?;
    let params = args.sampling.params();
    // Before anything is computed, compiling the schema's missing units included.
    let plan = SplicePlan::new(&laid_out.layout, &bound)
        .with_context(|| format!("planning `{}`", prompt.name()))?;
    opened
        .runtime
        .check_context(&plan, params.max_tokens)
        .map_err(|error| context_failure(error, Some(&prompt.name())))?;
    // Read the states the last `pmlc compile` stored: whole, or its `--keep` heavy hitters.
    let keep = opened.runtime.compiled_keep(&laid_out.layout.schema_name);
    opened.runtime.set_keep(keep);
    opened.runtime.set_kv_budget(kv_budget);
    let runtime = &opened.runtime;
    let mut mode = args.blend.mode(args.mode, args.recompute);
    let mut units_compiled_first = 0;
    // With edit reuse the prompt runs bound to the layout the stored states were computed under.
    let mut previous = None;
    if mode != InferenceMode::Full {
        let missing = units_missing(runtime, &laid_out.layout)?;
        if missing > 0 && !args.no_edit_reuse {
            previous = runtime
                .previous_layout(&laid_out.layout)
                .context("looking for the schema's previous states")?;
        }
        if let Some(previous) = &previous {
            if mode == InferenceMode::Reuse {
                // Ranked by deviation (CacheBlend's): the probe's fresh first layers show which
                // cached tokens read the edit. On 9 edited HotpotQA questions it gave a first
                // token KL to `full` of 0.0045 against plain attention's 0.0159, greedy-32
                // agreement 0.889 against 0.795 (docs/results/history.md).
                let blend = BlendArgs {
                    select: SelectArg::Deviation,
                    ..args.blend.clone()
                };
                mode = blend.mode(ModeArg::Blend, args.recompute);
            }
            notice(&format!(
                "schema `{}` changed since it was compiled: the stored states of {} are reused \
                 for their unchanged tokens, the changed ones computed and {mode} repairs the \
                 rest (edit reuse; `pmlc compile {}` stores exact states, `--no-edit-reuse` \
                 compiles first)",
                laid_out.layout.schema_name,
                previous.changed.join(", "),
                schema.name()
            ));
        } else if missing > 0 {
            units_compiled_first = missing;
            notice(&format!(
                "schema `{}` is not compiled for {} ({missing} units missing from the store): \
                 compiling it first",
                laid_out.layout.schema_name, opened.id
            ));
            match compile_schema_if_writable(runtime, &laid_out.layout, &schema)? {
                Ok(summary) => notice(&summary.to_string()),
                Err(unstored) => notice(&format!(
                    "schema `{}` is computed for this run only: {unstored}",
                    laid_out.layout.schema_name
                )),
            }
        }
        if let Some(draft) = runtime.draft_model() {
            compile_draft_first(draft, &laid_out.layout, &schema, notice)?;
        }
    }
    let (layout, bound, plan) = match &previous {
        Some(previous) => {
            let bound = rebind_edited(&previous.layout, &laid_out.layout, &bound, false)
                .with_context(|| format!("binding `{}` for edit reuse", prompt.name()))?;
            let plan = SplicePlan::new(&previous.layout, &bound)
                .with_context(|| format!("planning `{}`", prompt.name()))?;
            (&previous.layout, bound, plan)
        }
        None => (&laid_out.layout, bound, plan),
    };
    if args.show_plan {
        notice(describe_plan(layout, &bound, runtime.tokenizer()).trim_end());
    }
    // The cache's memory is faulted in now, outside the time to first token, as llama.cpp
    // does when it creates its context.
    runtime
        .reserve_cache(layout, &bound, &params)
        .with_context(|| format!("planning `{}`", prompt.name()))?;
    let (generation, stats) = runtime
        .run_bound(layout, &bound, mode, &params, on_text)
        .map_err(|error| match error {
            // Bound again for edit reuse, the prompt can take other positions.
            InferenceError::Context(error) => context_failure(error, Some(&prompt.name())),
            error => Failure::Failed(
                anyhow::Error::new(error).context(format!("running `{}`", prompt.name())),
            ),
        })?;
    Ok(RunOutcome {
        generation,
        stats,
        plan,
        units_compiled_first,
    })
}
