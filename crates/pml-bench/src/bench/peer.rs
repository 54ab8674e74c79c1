//! `pml bench cache --peer llama-cpp`: PML's cached time to first token against llama.cpp's
//! prompt cache, on the generated document prompts (a system turn and one document module of about
//! N tokens, then a short question as the only new text).
//!
//! PML: the document is compiled as a module into a temporary disk store; each round runs this
//! binary's `pml run --mode reuse --json` in a fresh process, so the state comes from disk as it
//! would for a new process, and takes the run's TTFT (store read + splice + the question's tokens
//! + first sample, after the model is loaded) and the process's wall time.
//!
//! llama.cpp: scripts/llama_cache_bench.py, one process for all rounds, prefills the same prefix
//! token ids once and keeps their state in RAM (what llama.cpp's server does with `cache_prompt`);
//! each round restores that state, evaluates the same question ids and takes the greedy token.
//!
//! Rounds alternate which engine goes first; both get the same thread count.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::Context;
use pml_commands::compile_command::compile_schema;
use pml_commands::failure::Failure;
use pml_commands::model_fetch::{model_file, resolve_model};
use pml_commands::pipeline::{
    BackendArgs, CacheType, EncodeArg, RuntimeArgs, WeightsArg, bind, lay_out, open_runtime,
};
use pml_runtime::inference::SplicePlan;
use serde::{Deserialize, Serialize};

use super::cases::{Case, document_cases};
use super::engine::{default_threads, find_llama, llama_script, llama_venv_python};
use super::load_average::{format_load, load_average};
use super::peer_report::PeerReport;
use super::peer_rounds::{LlamaReady, LlamaRound, PeerRound, PeerSize, PmlRound};
use super::report::print_report;
use pml_commands::run_command::RunJson;

/// The llama.cpp side, embedded so the binary needs no checkout to find it.
const LLAMA_SCRIPT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/llama_cache_bench.py"
));

/// The engine `pml bench cache --peer` compares with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// llama.cpp (llama-cpp-python built by scripts/setup-llama-cpp.sh) holding the document
    /// prefix's state in RAM, as its server's `cache_prompt` does.
    LlamaCpp,
}

/// What the comparison takes from `pml bench cache`'s arguments.
pub struct PeerOptions<'a> {
    /// The KV cache's dtype in PML (`--cache-type`; llama.cpp keeps its default, f16).
    pub cache_type: CacheType,
    pub model: Option<&'a str>,
    pub rounds: usize,
    pub sizes: &'a [usize],
    pub document: &'a str,
    pub question: &'a str,
    pub weights: WeightsArg,
    pub json: bool,
}

/// The token ids both engines see: the prefix (spliced from the store by PML, kept in RAM by
/// llama.cpp) and the question after it (computed by both in every round).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerTokens {
    pub prefix: Vec<u32>,
    pub question: Vec<u32>,
}

impl PeerTokens {
    /// Splits a bound prompt's plan into the cached prefix and the new tail. llama.cpp numbers
    /// positions by order, so the comparison holds only when the prompt's positions are exactly
    /// 0..n and every new token comes after every cached one; anything else is an error.
    pub fn from_plan(plan: &SplicePlan) -> Result<Self, String> {
        if let Some((index, &position)) = plan
            .all_positions
            .iter()
            .enumerate()
            .find(|&(index, &position)| position as usize != index)
        {
            return Err(format!(
                "the prompt's token {index} sits at position {position}: positions with gaps \
                 cannot be given to llama.cpp, which numbers them by order"
            ));
        }
        let cached = plan
            .all_tokens
            .len()
            .checked_sub(plan.new_tokens.len())
            .ok_or("more new tokens than prompt tokens")?;
        if let Some((index, &position)) = plan
            .new_positions
            .iter()
            .enumerate()
            .find(|&(index, &position)| position as usize != cached + index)
        {
            return Err(format!(
                "new token {index} sits at position {position}, inside the cached prefix of \
                 {cached} tokens: only a new tail can be compared with a prefix cache"
            ));
        }
        Ok(Self {
            prefix: plan.all_tokens[..cached].to_vec(),
            question: plan.new_tokens.clone(),
        })
    }

    /// Whether `run` (a `pml run --json` of the same prompt) spliced exactly this prefix and
    /// computed exactly this question; the reason when not.
    pub fn check_run(&self, run: &RunJson) -> Result<(), String> {
        if run.units_compiled_first > 0 || !run.units_encoded_on_the_fly.is_empty() {
            return Err(format!(
                "the store lacked the document's state ({} units compiled first, encoded on the \
                 fly: [{}]): its TTFT would not be a cached one",
                run.units_compiled_first,
                run.units_encoded_on_the_fly.join(", ")
            ));
        }
        if run.tokens_reused != self.prefix.len() || run.tokens_recomputed != 0 {
            return Err(format!(
                "it reused {} tokens and recomputed {}, where the exported prefix has {}",
                run.tokens_reused,
                run.tokens_recomputed,
                self.prefix.len()
            ));
        }
        if run.new_token_ids != self.question {
            return Err(format!(
                "it computed the new tokens {:?}, where the exported question is {:?}",
                run.new_token_ids, self.question
            ));
        }
        Ok(())
    }
}

/// One document prompt's files for the child processes.
struct PreparedCase {
    case: Case,
    schema_file: PathBuf,
    prompt_file: PathBuf,
    tokens_file: PathBuf,
    tokens: PeerTokens,
}

/// A line the llama.cpp script prints on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LlamaEvent {
    Ready(LlamaReady),
    Round(LlamaRound),
}

impl LlamaEvent {
    /// `None` for a line that is not one of the script's JSON events (library chatter).
    pub fn parse(line: &str) -> Option<Result<Self, String>> {
        let line = line.trim();
        if !line.starts_with('{') || !line.contains("\"event\"") {
            return None;
        }
        Some(
            serde_json::from_str(line)
                .map_err(|error| format!("unreadable llama.cpp event `{line}`: {error}")),
        )
    }
}

/// The last line of `stdout` as `pml run --json`'s object.
pub fn parse_run_json(stdout: &str) -> Result<RunJson, String> {
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .ok_or("`pml run --json` printed nothing")?;
    serde_json::from_str(line)
        .map_err(|error| format!("unreadable `pml run --json` output `{line}`: {error}"))
}

pub fn run(options: &PeerOptions<'_>) -> Result<(), Failure> {
    let Some(python) = find_llama()? else {
        return Err(Failure::usage(format!(
            "`--peer llama-cpp` needs llama-cpp-python in {} (with numpy): build it with \
             scripts/setup-llama-cpp.sh",
            llama_venv_python()?.display()
        )));
    };
    if options.sizes.is_empty() || options.sizes.contains(&0) {
        return Err(Failure::usage("`--sizes` needs positive prompt sizes"));
    }
    let choice = resolve_model(options.model).map_err(Failure::Usage)?;
    let model_path = model_file(&choice)?;
    let work = tempfile::Builder::new()
        .prefix("pml-bench-peer-")
        .tempdir()
        .context("creating a temporary folder for the store and the prompts")?;
    // A disk tier only: every `pml run` reads the state from disk, as a new process would.
    let store = format!("disk:{}", work.path().join("store").display());
    let prepared = prepare_cases(options, &store, work.path())?;

    let exe = std::env::current_exe().context("locating the pml binary")?;
    let weights = super::flag_value(&options.weights, "the weight format")?;
    let cache_type = super::flag_value(&options.cache_type, "the cache type")?;
    let threads = default_threads();
    let mut sizes = Vec::with_capacity(prepared.len());
    for prepared in &prepared {
        let load_before = load_average();
        eprintln!(
            "{}: llama.cpp prefills the whole prompt ({} tokens) once, then the prefix, before \
             the rounds (load average {})",
            prepared.case.name,
            prepared.tokens.prefix.len() + prepared.tokens.question.len(),
            format_load(load_before)
        );
        let mut llama = LlamaSession::start(&python, &model_path, &prepared.tokens_file, threads)?;
        if (llama.ready.prefix_tokens, llama.ready.question_tokens)
            != (prepared.tokens.prefix.len(), prepared.tokens.question.len())
        {
            return Err(Failure::Failed(anyhow::anyhow!(
                "llama.cpp read {} prefix and {} question tokens, where PML exported {} and {}",
                llama.ready.prefix_tokens,
                llama.ready.question_tokens,
                prepared.tokens.prefix.len(),
                prepared.tokens.question.len()
            )));
        }
        let mut rounds = Vec::with_capacity(options.rounds);
        for round in 0..options.rounds {
            let pml_first = round % 2 == 0;
            let mut llama_round = None;
            if !pml_first {
                llama_round = Some(llama.round()?);
            }
            let pml = run_pml(
                &exe,
                prepared,
                &choice.argument(),
                (&weights, &cache_type),
                &store,
            )?;
            if pml_first {
                llama_round = Some(llama.round()?);
            }
            let llama_round = llama_round.context("the llama.cpp round did not run")?;
            let load = load_average()[0];
            eprintln!(
                "[round {}/{}] {}: PML TTFT {:.0} ms (process {:.0} ms), llama.cpp TTFT {:.0} ms \
                 (llama-cpp-python load_state: {:.0} ms), load average {load:.2}",
                round + 1,
                options.rounds,
                prepared.case.name,
                pml.ttft_ms,
                pml.wall_ms,
                llama_round.ttft_s * 1e3,
                llama_round.wrapper_ttft_s * 1e3,
            );
            rounds.push(PeerRound {
                pml_first,
                pml,
                llama: llama_round,
                load_average_1min: load,
            });
        }
        llama.finish()?;
        sizes.push(PeerSize {
            prompt: prepared.case.name.clone(),
            prefix_tokens: prepared.tokens.prefix.len(),
            question_tokens: prepared.tokens.question.len(),
            llama_ready: llama.ready,
            rounds,
            load_before,
            load_after: load_average(),
        });
    }
    let report = PeerReport::new(&choice.id(), threads, options.rounds, sizes);
    print_report(&report, options.json, PeerReport::table)?;
    Ok(())
}

/// Builds each size's document prompt, compiles its schema into `store`, and writes the schema,
/// the prompt and the token ids into `work` for the child processes. The model is dropped
/// before returning, so the rounds do not share the machine's memory with it.
fn prepare_cases(
    options: &PeerOptions<'_>,
    store: &str,
    work: &Path,
) -> Result<Vec<PreparedCase>, Failure> {
    let opened = open_runtime(&RuntimeArgs {
        model: options.model.map(str::to_owned),
        store: Some(store.to_owned()),
        encode: EncodeArg::Scaffolded,
        weights: options.weights,
        // llama.cpp runs on the CPU here, so PML does too (the caller refused another device).
        backend: BackendArgs {
            cache_type: options.cache_type,
            ..BackendArgs::default()
        },
    })?;
    let runtime = &opened.runtime;
    let cases = document_cases(
        options.document,
        options.question,
        options.sizes,
        runtime.tokenizer(),
    )?;
    let mut prepared = Vec::with_capacity(cases.len());
    for case in cases {
        let laid_out = lay_out(runtime, &case.schema, false)?;
        let summary = compile_schema(runtime, &laid_out.layout, &case.schema)?;
        eprintln!("{summary}");
        let bound = bind(runtime, &laid_out, &case.prompt, false)?;
        let plan = SplicePlan::new(&laid_out.layout, &bound)
            .with_context(|| format!("planning {}", case.name))?;
        let tokens = PeerTokens::from_plan(&plan)
            .map_err(|error| Failure::Failed(anyhow::anyhow!("{}: {error}", case.name)))?;
        let schema_file = work.join(format!("{}.schema.pml", case.name));
        let prompt_file = work.join(format!("{}.prompt.pml", case.name));
        let tokens_file = work.join(format!("{}.tokens.json", case.name));
        let json = serde_json::to_string(&tokens).context("writing token ids")?;
        for (path, text) in [
            (&schema_file, &case.schema.text),
            (&prompt_file, &case.prompt.text),
            (&tokens_file, &json),
        ] {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        prepared.push(PreparedCase {
            case,
            schema_file,
            prompt_file,
            tokens_file,
            tokens,
        });
    }
    Ok(prepared)
}

/// One `pml run --mode reuse --json` in a fresh process, checked against the exported tokens.
fn run_pml(
    exe: &Path,
    prepared: &PreparedCase,
    model: &str,
    (weights, cache_type): (&str, &str),
    store: &str,
) -> Result<PmlRound, Failure> {
    let mut command = Command::new(exe);
    command
        .arg("run")
        .arg(&prepared.prompt_file)
        .arg("--schema")
        .arg(&prepared.schema_file)
        .args(["--mode", "reuse", "--model", model, "--weights", weights])
        .args(["--cache-type", cache_type])
        .args(["--store", store, "--max-tokens", "1", "--temperature", "0"])
        .args(["--repeat-penalty", "1", "--color", "never", "--json"]);
    let started = Instant::now();
    let output = command.output().context("starting `pml run`")?;
    let wall = started.elapsed();
    if !output.status.success() {
        return Err(Failure::Failed(anyhow::anyhow!(
            "`pml run` on {} failed ({}): {}",
            prepared.case.name,
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let run = parse_run_json(&String::from_utf8_lossy(&output.stdout))
        .map_err(|error| Failure::Failed(anyhow::anyhow!(error)))?;
    prepared.tokens.check_run(&run).map_err(|error| {
        Failure::Failed(anyhow::anyhow!(
            "`pml run` on {} does not match the exported tokens: {error}",
            prepared.case.name
        ))
    })?;
    Ok(PmlRound::new(&run, wall))
}

/// The llama.cpp script, running: it answers one round per `round` line on its stdin.
struct LlamaSession {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    ready: LlamaReady,
}

impl LlamaSession {
    fn start(
        python: &Path,
        model_path: &Path,
        tokens_file: &Path,
        threads: usize,
    ) -> Result<Self, Failure> {
        let mut child = llama_script(python, LLAMA_SCRIPT, model_path, tokens_file, threads)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the llama.cpp measurement")?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(Failure::Failed(anyhow::anyhow!(
                "the llama.cpp measurement has no stdin/stdout pipes"
            )));
        };
        let mut session = Self {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            ready: LlamaReady {
                load_s: 0.0,
                prefix_tokens: 0,
                question_tokens: 0,
                full_ttft_s: 0.0,
                full_first_token: 0,
                prefix_prefill_s: 0.0,
                state_bytes: 0,
                threads,
            },
        };
        match session.next_event()? {
            LlamaEvent::Ready(ready) => session.ready = ready,
            LlamaEvent::Round(_) => {
                return Err(session.fail("sent a round before it was ready".to_owned()));
            }
        }
        Ok(session)
    }

    fn round(&mut self) -> Result<LlamaRound, Failure> {
        let sent = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "round").and_then(|()| stdin.flush()),
            None => Ok(()),
        };
        if let Err(error) = sent {
            return Err(self.fail(format!("stopped reading its requests ({error})")));
        }
        match self.next_event()? {
            LlamaEvent::Round(round) => Ok(round),
            LlamaEvent::Ready(_) => Err(self.fail("said it was ready twice".to_owned())),
        }
    }

    /// The next event on the script's stdout; other lines go to stderr.
    fn next_event(&mut self) -> Result<LlamaEvent, Failure> {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self.stdout.read_line(&mut line);
            match read {
                Ok(0) => return Err(self.fail("exited before answering".to_owned())),
                Err(error) => return Err(self.fail(format!("cannot be read ({error})"))),
                Ok(_) => match LlamaEvent::parse(&line) {
                    Some(Ok(event)) => return Ok(event),
                    Some(Err(error)) => return Err(self.fail(error)),
                    None => eprint!("llama.cpp: {line}"),
                },
            }
        }
    }

    /// Ends the script and returns an error naming what went wrong and how it exited.
    fn fail(&mut self, what: String) -> Failure {
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .map_or_else(|error| error.to_string(), |status| status.to_string());
        Failure::Failed(anyhow::anyhow!(
            "the llama.cpp measurement {what} ({status}; its errors are above)"
        ))
    }

    /// Closes the script's stdin, which ends it, and waits for it.
    fn finish(&mut self) -> Result<(), Failure> {
        drop(self.stdin.take());
        let status = self
            .child
            .wait()
            .context("waiting for the llama.cpp measurement")?;
        if !status.success() {
            return Err(Failure::Failed(anyhow::anyhow!(
                "the llama.cpp measurement ended with {status}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(all_positions: Vec<u32>, new_positions: Vec<u32>) -> SplicePlan {
        let token = |position: &u32| 100 + position;
        SplicePlan {
            spans: Vec::new(),
            new_tokens: new_positions.iter().map(token).collect(),
            all_tokens: all_positions.iter().map(token).collect(),
            new_positions,
            all_positions,
        }
    }

    #[test]
    fn a_plan_splits_into_the_cached_prefix_and_the_new_tail() {
        let tokens = PeerTokens::from_plan(&plan((0..6).collect(), vec![4, 5])).expect("split");
        assert_eq!(tokens.prefix, vec![100, 101, 102, 103]);
        assert_eq!(tokens.question, vec![104, 105]);
    }

    #[test]
    fn new_tokens_inside_the_prefix_or_position_gaps_are_refused() {
        let inside = PeerTokens::from_plan(&plan((0..6).collect(), vec![2, 5]));
        assert!(
            inside
                .expect_err("inside")
                .contains("inside the cached prefix")
        );
        let gap = PeerTokens::from_plan(&plan(vec![0, 1, 3, 4], vec![4]));
        assert!(gap.expect_err("gap").contains("position 3"));
    }

    fn run_json(tokens_reused: usize, new_token_ids: Vec<u32>) -> RunJson {
        RunJson {
            model: "m".to_owned(),
            mode: "reuse".to_owned(),
            answer: "Yes".to_owned(),
            token_ids: vec![9454],
            finish_reason: "length".to_owned(),
            model_load_ms: 300.0,
            units_compiled_first: 0,
            ttft_ms: 900.0,
            load_ms: 200.0,
            splice_ms: 60.0,
            compute_ms: 500.0,
            tokens_reused,
            tokens_recomputed: 0,
            tokens_new: new_token_ids.len(),
            tokens_not_kept: 0,
            new_token_ids,
            prompt_token_ids: Vec::new(),
            units_encoded_on_the_fly: Vec::new(),
            tokens_generated: 1,
            decode_ms_per_token: None,
            tokens_drafted: 0,
            tokens_accepted: 0,
            tokens_evicted: None,
            estimated_fidelity: None,
            first_token_changed: None,
            fidelity_guard_fired: false,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn a_run_must_splice_the_exported_prefix_and_compute_the_exported_question() {
        let tokens = PeerTokens {
            prefix: vec![1, 2, 3],
            question: vec![4, 5],
        };
        assert_eq!(tokens.check_run(&run_json(3, vec![4, 5])), Ok(()));
        let shorter = tokens.check_run(&run_json(2, vec![4, 5]));
        assert!(shorter.expect_err("prefix").contains("reused 2 tokens"));
        let other = tokens.check_run(&run_json(3, vec![4, 6]));
        assert!(other.expect_err("question").contains("[4, 6]"));
        let mut compiled = run_json(3, vec![4, 5]);
        compiled.units_compiled_first = 2;
        assert!(
            tokens
                .check_run(&compiled)
                .expect_err("compiled")
                .contains("2 units compiled first")
        );
    }

    #[test]
    fn run_json_is_read_from_the_last_line_and_round_trips() {
        let run = run_json(3, vec![4, 5]);
        let line = serde_json::to_string(&run).expect("json");
        let stdout = format!("\n{line}\n\n");
        assert_eq!(parse_run_json(&stdout), Ok(run));
        assert!(parse_run_json("").is_err());
        assert!(parse_run_json("Yes, both were American.\n").is_err());
    }

    #[test]
    fn llama_events_are_parsed_and_chatter_is_skipped() {
        let ready = r#"{"event": "ready", "load_s": 0.5, "prefix_tokens": 4023,
            "question_tokens": 20, "full_ttft_s": 52.9, "full_first_token": 9454,
            "prefix_prefill_s": 52.1, "state_bytes": 49000000, "threads": 2}"#
            .replace('\n', " ");
        let Some(Ok(LlamaEvent::Ready(ready))) = LlamaEvent::parse(&ready) else {
            panic!("not a ready event");
        };
        assert_eq!((ready.prefix_tokens, ready.full_first_token), (4023, 9454));
        let round = r#"{"event": "round", "ttft_s": 0.314, "restore_s": 0.02, "eval_s": 0.29,
            "first_token": 9454, "wrapper_ttft_s": 0.5, "wrapper_restore_s": 0.2,
            "wrapper_first_token": 9454}"#
            .replace('\n', " ");
        let Some(Ok(LlamaEvent::Round(round))) = LlamaEvent::parse(&round) else {
            panic!("not a round event");
        };
        assert_eq!(round.ttft_s, 0.314);
        assert_eq!(
            LlamaEvent::parse("llama_model_loader: loaded meta data"),
            None
        );
        let missing = LlamaEvent::parse(r#"{"event": "round", "ttft_s": 0.3}"#);
        assert!(matches!(missing, Some(Err(error)) if error.contains("missing field")));
    }
}
