//! `pmlc compile`, `pml run` and `pml bench cache` as built binaries. Without a model: exit
//! statuses for bad input (errors 1, unreadable files and wrong kinds 2), checked before any model
//! is loaded. On the default model (skipped with a notice when it is not fetched, unless
//! `PML_REQUIRE_MODELS=1`): every example schema compiles into one fresh store, compiling again
//! encodes nothing, every example prompt runs in mode `reuse` from that store without encoding
//! anything on the fly, one answer is checked for sense, binding errors are diagnostics, and the cache
//! benchmark reports a reused document.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pml_models::DEFAULT_MODEL_ID;
use pml_syntax::ast::SourceFile;
use pml_testkit::fetched_model;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn command(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .current_dir(repo_root())
        .env("NO_COLOR", "1")
        .output()
        .expect("the binary runs")
}

fn pml(args: &[&str]) -> Output {
    command(env!("CARGO_BIN_EXE_pml"), args)
}

fn pmlc(args: &[&str]) -> Output {
    command(env!("CARGO_BIN_EXE_pmlc"), args)
}

/// The docqa prompt whose answer is checked, and `pml run` on it with more arguments.
const COMPOSER: &str = "schemas/docqa/prompt-composer.pml";

fn run_composer(arguments: &[&str]) -> Output {
    pml(&[&["run", COMPOSER], arguments].concat())
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn assert_status(output: &Output, expected: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(expected),
        "{what}\nstdout:\n{}\nstderr:\n{}",
        stdout(output),
        stderr(output)
    );
}

/// The example `.pml` files under `schemas/` (relative to the repository root), sorted, split
/// into schemas and prompts by their root element.
fn example_files() -> (Vec<String>, Vec<String>) {
    fn walk(folder: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(folder).expect("list schemas/") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|extension| extension == "pml") {
                files.push(path);
            }
        }
    }
    let root = repo_root();
    let mut files = Vec::new();
    walk(&root.join("schemas"), &mut files);
    files.sort();
    let (mut schemas, mut prompts) = (Vec::new(), Vec::new());
    for path in files {
        let source = std::fs::read_to_string(&path).expect("read an example");
        let relative = path
            .strip_prefix(&root)
            .expect("below the root")
            .display()
            .to_string();
        match pml_syntax::parse(&source).file {
            SourceFile::Schema(_) => schemas.push(relative),
            SourceFile::Prompt(_) => prompts.push(relative),
            SourceFile::Empty => panic!("{relative} is neither a schema nor a prompt"),
        }
    }
    (schemas, prompts)
}

#[test]
fn a_prompt_with_errors_exits_1_with_its_diagnostic_before_loading_a_model() {
    let output = pml(&["run", "tests/fixtures/errors/PML205_unknown_module.pml"]);
    assert_status(&output, 1, "a prompt importing an unknown module");
    let text = stderr(&output);
    assert!(text.contains("PML205"), "{text}");
    assert!(!text.contains("TTFT"), "nothing ran: {text}");
    assert!(stdout(&output).is_empty());
}

#[test]
fn a_missing_prompt_file_exits_2() {
    let output = pml(&["run", "schemas/travel/no-such-prompt.pml"]);
    assert_status(&output, 2, "a prompt file that does not exist");
    assert!(
        stderr(&output).contains("cannot read"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn run_refuses_a_schema_and_compile_refuses_a_prompt_with_exit_2() {
    let output = pml(&["run", "schemas/travel/travel.pml"]);
    assert_status(&output, 2, "pml run on a schema");
    assert!(
        stderr(&output).contains("is a schema"),
        "{}",
        stderr(&output)
    );
    let output = pmlc(&["compile", "schemas/travel/prompt-sydney-surf.pml"]);
    assert_status(&output, 2, "pmlc compile on a prompt");
    assert!(
        stderr(&output).contains("is a prompt"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn compiling_a_schema_with_errors_exits_1_and_compiles_nothing() {
    let output = pmlc(&["compile", "tests/fixtures/errors/PML102_duplicate_name.pml"]);
    assert_status(&output, 1, "a schema with a duplicate module name");
    let text = stderr(&output);
    assert!(text.contains("PML102"), "{text}");
    assert!(text.contains("nothing compiled"), "{text}");
}

#[test]
fn examples_compile_once_and_every_prompt_runs_from_the_store() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let store = tempfile::tempdir().expect("a temporary store");
    let store_arg = store.path().to_str().expect("a UTF-8 temp path");
    let (schemas, prompts) = example_files();
    assert!(
        schemas.len() >= 7 && prompts.len() >= 26,
        "{schemas:?} {prompts:?}"
    );
    let compile_args: Vec<&str> = ["compile", "--store", store_arg]
        .into_iter()
        .chain(schemas.iter().map(String::as_str))
        .collect();

    let first = pmlc(&compile_args);
    assert_status(&first, 0, "compiling every example schema");
    let summary = stderr(&first);
    eprintln!("{summary}");
    for schema in &schemas {
        let line = summary
            .lines()
            .find(|line| line.contains(&format!("({schema}, scaffolded)")))
            .unwrap_or_else(|| panic!("no summary line for {schema}:\n{summary}"));
        assert!(line.contains("encoded"), "{line}");
        assert!(!line.contains("nothing to encode"), "{line}");
    }

    let again = pmlc(&compile_args);
    assert_status(&again, 0, "compiling the examples again");
    let summary = stderr(&again);
    let nothing = summary
        .lines()
        .filter(|line| line.contains("nothing to encode: all"))
        .count();
    assert_eq!(
        nothing,
        schemas.len(),
        "recompiling encoded something:\n{summary}"
    );

    for prompt in &prompts {
        let output = pml(&["run", prompt, "--store", store_arg, "--max-tokens", "6"]);
        assert_status(&output, 0, prompt);
        let (answer, summary) = (stdout(&output), stderr(&output));
        eprintln!("{prompt}: {}", answer.trim_end());
        assert!(
            !answer.trim().is_empty(),
            "{prompt} gave no answer:\n{summary}"
        );
        let line = summary
            .lines()
            .find(|line| line.contains("| mode reuse | TTFT"))
            .unwrap_or_else(|| panic!("{prompt}: no summary line:\n{summary}"));
        assert!(line.contains("tokens reused"), "{line}");
        assert!(line.contains(" | generated "), "{line}");
        assert!(
            !summary.contains("compiling it first"),
            "{prompt}: {summary}"
        );
        assert!(!summary.contains("not in the store"), "{prompt}: {summary}");
    }

    // The answer is in one of the five documents the prompt imports (see schemas/docqa/README.md).
    let output = run_composer(&["--store", store_arg, "--max-tokens", "16"]);
    assert_status(&output, 0, "the composer question");
    let answer = stdout(&output);
    assert!(
        answer.contains("Marilyn Manson"),
        "Tyler Bates plays guitar in Marilyn Manson's band: {answer}"
    );

    // Mode `blend` with the loading controller, its modules read from the disk store: the
    // summary names the chosen fraction and the figures behind it, and the streamed layers.
    let output = run_composer(&[
        "--store",
        store_arg,
        "--max-tokens",
        "2",
        "--mode",
        "blend",
        "--recompute",
        "auto",
    ]);
    assert_status(&output, 0, "the composer question, blend r=auto");
    let summary = stderr(&output);
    let line = summary
        .lines()
        .find(|line| line.contains("| mode blend (r=auto (floor 0.15)"))
        .unwrap_or_else(|| panic!("no blend summary line:\n{summary}"));
    assert!(line.contains("(auto: load "), "{line}");
    assert!(line.contains(" ms/layer at r=0.15)"), "{line}");
    assert!(line.contains("| pipelined: "), "{line}");
}

#[test]
fn recompute_takes_a_fraction_or_auto_and_nothing_else() {
    let output = run_composer(&["--mode", "blend", "--recompute", "most"]);
    assert_status(&output, 2, "--recompute most");
    let text = stderr(&output);
    assert!(text.contains("or `auto`"), "{text}");
}

#[test]
fn a_kv_budget_too_small_for_its_sinks_and_recent_slots_exits_2() {
    let output = run_composer(&["--kv-budget", "8"]);
    assert_status(&output, 2, "--kv-budget 8");
    let text = stderr(&output);
    assert!(text.contains("raise --kv-budget"), "{text}");
}

#[test]
fn an_argument_too_long_for_its_parameter_is_a_binding_diagnostic() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let store = tempfile::tempdir().expect("a temporary store");
    let output = pml(&[
        "run",
        "tests/fixtures/errors/PML210_argument_too_long.pml",
        "--store",
        store.path().to_str().expect("a UTF-8 temp path"),
    ]);
    assert_status(&output, 1, "an argument longer than its parameter");
    let text = stderr(&output);
    assert!(text.contains("PML210"), "{text}");
    assert!(stdout(&output).is_empty());
}

#[test]
fn the_cache_benchmark_reports_a_reused_document() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let output = pml(&[
        "bench",
        "cache",
        "--no-examples",
        "--sizes",
        "256",
        "--runs",
        "1",
        "--json",
    ]);
    assert_status(&output, 0, "pml bench cache on one small document");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    assert_eq!(report["model"], DEFAULT_MODEL_ID);
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 1, "{report}");
    let case = &cases[0];
    assert_eq!(case["case"], "document-256");
    let cached = case["cached_tokens"].as_u64().expect("cached tokens");
    let new = case["new_tokens"].as_u64().expect("new tokens");
    assert!(cached > 100 && new < 40, "{case}");
    assert!(case["full_ttft"]["median_ms"].as_f64().is_some(), "{case}");
    assert!(case["reuse_ttft"]["median_ms"].as_f64().is_some(), "{case}");
    let compiled = report["compiled"].as_array().expect("compiled");
    assert_eq!(compiled.len(), 1, "{report}");
    assert_eq!(
        compiled[0]["tokens"], compiled[0]["tokens_encoded"],
        "{report}"
    );
}

/// A one-module schema `facts` and a prompt `ask.pml` asking when its museum opened, in a
/// temporary folder with a disk store of its own.
struct Facts {
    dir: tempfile::TempDir,
    store: String,
}

impl Facts {
    fn new(year: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = format!("disk:{}", dir.path().join("store").display());
        let facts = Self { dir, store };
        facts.write_schema(year);
        facts.write(
            "ask.pml",
            "<prompt schema=\"facts\">\n  <museum/>\n  <user>When did the Harbor Museum open?</user>\n\
             </prompt>\n",
        );
        facts
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.dir.path().join(name), text).expect("write");
    }

    fn write_schema(&self, year: &str) {
        self.write(
            "facts.pml",
            &format!(
                "<schema name=\"facts\">\n  <system>You answer briefly.</system>\n  <user>\n    \
                 <module name=\"museum\">The Harbor Museum opened in {year} and moved twice \
                 before the war. Its founder, Clara Voss, collected maps of the northern coast. \
                 The museum's largest room holds a whale skeleton found in 1887.</module>\n  \
                 </user>\n</schema>\n"
            ),
        );
    }

    /// `binary` with `args` and this folder's store, in this folder.
    fn run(&self, binary: &str, args: &[&str]) -> Output {
        let mut all = args.to_vec();
        all.extend(["--store", &self.store]);
        pml_testkit::cli::run(binary, &all, None, self.dir.path())
    }

    fn compile(&self, extra: &[&str]) -> Output {
        self.run(
            env!("CARGO_BIN_EXE_pmlc"),
            &[&["compile", "facts.pml"], extra].concat(),
        )
    }

    fn ask(&self, extra: &[&str]) -> Output {
        let output = self.run(
            env!("CARGO_BIN_EXE_pml"),
            &[&["run", "ask.pml", "--temperature", "0"], extra].concat(),
        );
        assert_status(&output, 0, "pml run");
        output
    }
}

/// A schema whose module changed after `pmlc compile`: `pml run` reuses the module's stored
/// state for its unchanged tokens (edit reuse, saying so) and answers from the edited text;
/// `--no-edit-reuse` compiles it first instead.
#[test]
fn an_edited_module_is_reused_for_its_unchanged_tokens() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let facts = Facts::new("1901");
    assert_status(&facts.compile(&[]), 0, "pmlc compile");
    facts.write_schema("1923");
    let edited = facts.ask(&[]);
    let notes = stderr(&edited);
    assert!(notes.contains("changed since it was compiled"), "{notes}");
    assert!(notes.contains("module `museum`"), "{notes}");
    assert!(notes.contains("mode blend"), "{notes}");
    assert!(stdout(&edited).contains("1923"), "{}", stdout(&edited));
    let compiled_first = facts.ask(&["--no-edit-reuse"]);
    assert!(
        stderr(&compiled_first).contains("compiling it first"),
        "{}",
        stderr(&compiled_first)
    );
    assert!(stdout(&compiled_first).contains("1923"));
}

/// `pml run --kv-budget` decodes within the budget after the cached prefill: slots are
/// evicted (the summary and `--json` say how many) and the answer still comes.
#[test]
fn an_answer_is_decoded_within_a_kv_budget() {
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let facts = Facts::new("1901");
    assert_status(&facts.compile(&[]), 0, "pmlc compile");
    let output = facts.ask(&["--kv-budget", "24", "--json"]);
    assert_status(&output, 0, "pml run --kv-budget 24");
    let summary = stderr(&output);
    assert!(
        summary.contains("KV budget 24 slots (12 recent, 4 sinks)"),
        "{summary}"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    assert!(json["tokens_evicted"].as_u64() > Some(0), "{json}");
    assert!(json["tokens_generated"].as_u64() > Some(0), "{json}");
}

/// `pmlc compile --keep 0.5` stores each unit's heavy hitters only, and says so; `pml run` reads
/// those compressed states (the manifest says which), leaving the other rows out; compiling
/// without `--keep` again brings back whole states. A fraction outside (0, 1) is refused.
#[test]
fn compressed_modules_are_compiled_and_run_from_what_they_kept() {
    let facts = Facts::new("1901");
    for bad in ["1", "0", "half"] {
        let refused = facts.compile(&["--keep", bad]);
        assert_status(&refused, 2, &format!("--keep {bad}"));
        assert!(
            stderr(&refused).contains("leave --keep out"),
            "{}",
            stderr(&refused)
        );
    }
    if fetched_model(DEFAULT_MODEL_ID).is_none() {
        return;
    }
    // The module's stored bytes, by the manifest the last compile wrote.
    let module_bytes = || -> u64 {
        let manifests = facts.dir.path().join("store/manifests");
        let folder = std::fs::read_dir(&manifests)
            .expect("manifests")
            .next()
            .expect("one model's folder")
            .expect("an entry");
        let text = std::fs::read_to_string(folder.path().join("facts.json")).expect("manifest");
        let manifest: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let units = manifest["units"].as_array().expect("units");
        let museum = units
            .iter()
            .find(|unit| unit["path"] == serde_json::json!(["museum"]))
            .expect("the module's entry");
        museum["bytes"].as_u64().expect("bytes")
    };
    assert_status(&facts.compile(&[]), 0, "pmlc compile");
    let whole_bytes = module_bytes();
    let kept = facts.compile(&["--keep", "0.5"]);
    assert_status(&kept, 0, "pmlc compile --keep 0.5");
    let summary = stderr(&kept);
    assert!(summary.contains("heavy hitters 0.5 of each"), "{summary}");
    let kept_bytes = module_bytes();
    assert!(
        kept_bytes * 10 < whole_bytes * 6 && kept_bytes * 10 > whole_bytes * 4,
        "{kept_bytes} bytes kept of {whole_bytes}"
    );
    let answered = facts.ask(&[]);
    let notes = stderr(&answered);
    assert!(notes.contains("module tokens not kept"), "{notes}");
    assert!(!notes.contains("compiling it first"), "{notes}");
    assert!(!stdout(&answered).trim().is_empty());

    assert_status(&facts.compile(&[]), 0, "pmlc compile without --keep");
    let notes = stderr(&facts.ask(&[]));
    assert!(!notes.contains("not kept"), "{notes}");
    assert!(!notes.contains("compiling it first"), "{notes}");
}
