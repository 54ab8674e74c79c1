//! The user's own GGUF by path (`--model ./file.gguf`, `-m`), as a new user types it: the
//! SmolLM2 file copied under another name outside `$PML_HOME` runs `pml run` on the example
//! prompt, `pml tokenize` prints llama-tokenize's ids, `pml models list` remembers the file, and
//! a missing file or an unknown id is one clear error. Skipped (with a notice) when SmolLM2 is
//! not fetched, unless `PML_REQUIRE_MODELS=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pml_testkit::fetched_model;

const SMOLLM: &str = "smollm2-135m";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pml(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pml"))
        .args(args)
        .env("PML_HOME", home)
        .env("NO_COLOR", "1")
        .env_remove("PML_STORE")
        .current_dir(repo_root())
        .output()
        .expect("the pml binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh home and the fetched SmolLM2 linked under a name of the user's own.
fn user_file() -> Option<(tempfile::TempDir, PathBuf)> {
    let fetched = fetched_model(SMOLLM)?;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("My-SmolLM2.Q4_1.gguf");
    std::os::unix::fs::symlink(&fetched, &file).expect("link the model");
    Some((dir, file))
}

#[test]
fn run_answers_the_example_prompt_with_a_gguf_by_path() {
    let Some((dir, file)) = user_file() else {
        return;
    };
    let home = dir.path().join("home");
    let file = file.to_string_lossy().into_owned();
    let output = pml(
        &home,
        &[
            "run",
            "--model",
            &file,
            "schemas/docqa/prompt-composer.pml",
            "--max-tokens",
            "8",
            "--temperature",
            "0",
        ],
    );
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        !text(&output.stdout).trim().is_empty(),
        "no answer: {stderr}"
    );
    // The file's stem is the model's id; nothing was fetched for it.
    assert!(stderr.contains("My-SmolLM2.Q4_1"), "{stderr}");
    assert!(
        !home.join("models").exists(),
        "a file by path is never fetched"
    );

    let listed = pml(&home, &["models", "list"]);
    assert!(
        text(&listed.stdout).contains("My-SmolLM2.Q4_1.gguf"),
        "{}",
        text(&listed.stdout)
    );
}

#[test]
fn tokenize_prints_llama_tokenize_ids() {
    let Some((dir, file)) = user_file() else {
        return;
    };
    let file = file.to_string_lossy().into_owned();
    let home = dir.path().join("home");
    let ids = pml(&home, &["tokenize", "-m", &file, "--ids", "Hello world"]);
    assert!(ids.status.success(), "{}", text(&ids.stderr));
    // SmolLM2's byte-level BPE: "Hello", " world"; no BOS by default.
    assert_eq!(text(&ids.stdout).trim(), "[19556, 905]");
    let special = pml(
        &home,
        &[
            "tokenize",
            "-m",
            &file,
            "--json",
            "--parse-special",
            "<|im_start|>user",
        ],
    );
    assert!(special.status.success(), "{}", text(&special.stderr));
    let tokens: serde_json::Value = serde_json::from_slice(&special.stdout).expect("JSON");
    assert_eq!(tokens[0]["piece"], "<|im_start|>", "{tokens}");
    assert_eq!(tokens.as_array().map(Vec::len), Some(2), "{tokens}");
}

#[test]
fn a_missing_file_or_an_unknown_id_is_one_clear_error() {
    let home = tempfile::tempdir().expect("tempdir");
    let missing = pml(
        home.path(),
        &["generate", "--model", "./no-such-model.gguf", "Hi"],
    );
    assert!(!missing.status.success());
    let stderr = text(&missing.stderr);
    assert!(stderr.contains("no-such-model.gguf"), "{stderr}");
    assert!(stderr.contains("No such file"), "{stderr}");

    let unknown = pml(home.path(), &["generate", "-m", "llama-9000", "Hi"]);
    assert!(!unknown.status.success());
    let stderr = text(&unknown.stderr);
    assert!(stderr.contains("llama-9000"), "{stderr}");
    assert!(
        stderr.contains("qwen2.5-0.5b") && stderr.contains(".gguf"),
        "{stderr}"
    );
}
