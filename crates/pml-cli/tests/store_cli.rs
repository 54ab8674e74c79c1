//! The store tiers and saved conversations through the built binaries, on Gemma-3-270M (the
//! smaller model; skipped with a notice when it is not fetched, unless `PML_REQUIRE_MODELS=1`)
//! and a real `redis-server` started by the test:
//! - two processes with separate disks share a compiled schema through Redis: the second
//!   encodes nothing, compiling or answering;
//! - Redis killed: `pml run` warns and answers from local tiers and recomputation (exit 0);
//! - `pml chat --session`: a two-turn conversation resumed from the store in a second process
//!   answers its second turn as one process that kept it in memory (greedy decoding);
//! - a bad `--store` is a usage error (exit 2).

use std::io::Write;
use std::process::{Command, Stdio};

use pml_testkit::cli::{assert_ok, run, text};
use pml_testkit::fetched_model;
use pml_testkit::redis_server::start_redis;

const MODEL: &str = "gemma3-270m";

const SCHEMA: &str = r#"<schema name="shared">
  <system>
    <module name="facts">Paris is the capital of France. Rome is the capital of Italy.</module>
  </system>
</schema>
"#;

const PROMPT: &str = r#"<prompt schema="shared">
  <facts/>
  <user>What is the capital of Italy?</user>
</prompt>
"#;

#[test]
fn a_bad_store_spec_is_a_usage_error() {
    let home = tempfile::tempdir().expect("tempdir");
    let output = run(
        env!("CARGO_BIN_EXE_pml"),
        &["chat", "--store", "ram:lots", "--model", MODEL],
        Some(""),
        home.path(),
    );
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("invalid store"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn processes_share_a_compiled_schema_through_redis_and_survive_its_death() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let Some(mut server) = start_redis() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let schema = dir.path().join("shared.pml");
    let prompt = dir.path().join("prompt.pml");
    std::fs::write(&schema, SCHEMA).expect("write schema");
    std::fs::write(&prompt, PROMPT).expect("write prompt");
    let redis_url = server.url();
    let store = |disk: &str| {
        format!(
            "ram:64MiB,disk:{},{redis_url}",
            dir.path().join(disk).display()
        )
    };
    let schema = schema.display().to_string();
    let prompt = prompt.display().to_string();
    let compile = |disk: &str| {
        run(
            env!("CARGO_BIN_EXE_pmlc"),
            &[
                "compile",
                &schema,
                "--model",
                MODEL,
                "--store",
                &store(disk),
            ],
            None,
            dir.path(),
        )
    };

    let first = compile("disk-a");
    assert_ok(&first, "first compile");
    assert!(
        text(&first.stderr).contains("encoded"),
        "{}",
        text(&first.stderr)
    );

    // Another process with its own (empty) disk: every unit comes from Redis.
    let second = compile("disk-b");
    assert_ok(&second, "second compile");
    assert!(
        text(&second.stderr).contains("nothing to encode"),
        "the second process encoded: {}",
        text(&second.stderr)
    );
    let answer = run(
        env!("CARGO_BIN_EXE_pml"),
        &[
            "run",
            &prompt,
            "--model",
            MODEL,
            "--store",
            &store("disk-c"),
            "--max-tokens",
            "4",
            "--temperature",
            "0",
        ],
        None,
        dir.path(),
    );
    assert_ok(&answer, "run from Redis");
    let stderr = text(&answer.stderr);
    assert!(!stderr.contains("compiling it first"), "{stderr}");
    assert!(!stderr.contains("not in the store"), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");

    // Redis gone: a fresh process warns once, recomputes what it lacks and still answers.
    server.kill();
    let degraded = run(
        env!("CARGO_BIN_EXE_pml"),
        &[
            "run",
            &prompt,
            "--model",
            MODEL,
            "--store",
            &format!("{}?timeout_ms=300", store("disk-d")),
            "--max-tokens",
            "4",
            "--temperature",
            "0",
        ],
        None,
        dir.path(),
    );
    assert_ok(&degraded, "run with Redis down");
    let stderr = text(&degraded.stderr);
    assert_eq!(stderr.matches("Redis store").count(), 1, "{stderr}");
    assert_eq!(
        text(&degraded.stdout),
        text(&answer.stdout),
        "another answer without Redis"
    );
}

#[test]
fn a_resumed_chat_session_answers_like_one_kept_in_memory() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("disk:{}", dir.path().join("store").display());
    let chat = |session: Option<&str>, input: &str| {
        let mut args = vec![
            "chat",
            "--model",
            MODEL,
            "--store",
            &store,
            "--max-tokens",
            "6",
            "--temperature",
            "0",
            "--plan",
            "kv",
        ];
        if let Some(name) = session {
            args.extend(["--session", name]);
        }
        let output = run(env!("CARGO_BIN_EXE_pml"), &args, Some(input), dir.path());
        assert_ok(&output, "pml chat");
        output
    };
    let in_memory = chat(None, "Name a colour.\nName another one.\n");
    assert_eq!(text(&in_memory.stderr).matches("| TTFT").count(), 2);

    let first = chat(Some("colours"), "Name a colour.\n");
    let resumed = chat(Some("colours"), "Name another one.\n");
    let stderr = text(&resumed.stderr);
    assert!(
        stderr.contains("resuming session `colours`: 1 turn"),
        "{stderr}"
    );
    assert!(!stderr.contains("recomputed"), "{stderr}");
    assert_eq!(
        format!("{}{}", text(&first.stdout), text(&resumed.stdout)),
        text(&in_memory.stdout),
        "{stderr}"
    );
    let first_stderr = text(&first.stderr);
    assert!(
        !first_stderr.contains("restored in"),
        "nothing to restore in a new session: {first_stderr}"
    );
    assert!(
        stderr.contains("restored in") && !stderr.contains("-0.0"),
        "{stderr}"
    );

    // Another system text for a resumed session is refused, not silently dropped.
    let pml = |args: &[&str]| run(env!("CARGO_BIN_EXE_pml"), args, Some(""), dir.path());
    let other_system = pml(&[
        "chat",
        "--model",
        MODEL,
        "--store",
        &store,
        "--session",
        "colours",
        "--system",
        "Be rude.",
    ]);
    assert_eq!(other_system.status.code(), Some(2));
    assert!(
        text(&other_system.stderr).contains("was started with no system text"),
        "{}",
        text(&other_system.stderr)
    );

    // Sessions are listed and deleted without loading the model.
    let listed = pml(&["chat", "--store", &store, "--list-sessions"]);
    assert_ok(&listed, "pml chat --list-sessions");
    let listing = text(&listed.stdout);
    let line = listing
        .lines()
        .find(|line| line.starts_with("colours "))
        .unwrap_or_else(|| panic!("{listing}"));
    assert_eq!(
        line.split_whitespace().nth(1),
        Some("2"),
        "two turns: {line}"
    );
    assert_ok(
        &pml(&["chat", "--store", &store, "--delete-session", "colours"]),
        "pml chat --delete-session",
    );
    let again = pml(&["chat", "--store", &store, "--delete-session", "colours"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(text(&again.stderr).contains("no session `colours`"));
    let empty = pml(&["chat", "--store", &store, "--list-sessions"]);
    assert!(text(&empty.stderr).contains("no saved sessions"));
}

#[test]
fn chat_colours_its_status_lines_when_asked() {
    if fetched_model(MODEL).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("disk:{}", dir.path().join("store").display());
    let chat = |color: &str| {
        let args = [
            "chat",
            "--model",
            MODEL,
            "--store",
            &store,
            "--max-tokens",
            "2",
            "--color",
            color,
        ];
        let output = run(env!("CARGO_BIN_EXE_pml"), &args, Some("Hi.\n"), dir.path());
        assert_ok(&output, "pml chat --color");
        output
    };
    let coloured = chat("always");
    assert!(text(&coloured.stderr).contains("\u{1b}[2mturn 1 |"));
    assert!(
        !text(&coloured.stdout).contains('\u{1b}'),
        "the answer stays plain"
    );
    assert!(!text(&chat("never").stderr).contains('\u{1b}'));
}

/// What a new user types, on a fresh machine: no `--store` (the default store, f16 states, under
/// a `PML_HOME` that holds nothing but the models), no `--plan` (the planner measures this
/// machine's restore costs first), the default model; the second run resumes the session.
#[test]
fn a_session_resumes_with_the_default_store_and_plan_on_a_fresh_home() {
    let Some(model) = fetched_model(pml_models::DEFAULT_MODEL_ID) else {
        return;
    };
    let home = tempfile::tempdir().expect("tempdir");
    let models = model.parent().expect("the models folder");
    std::os::unix::fs::symlink(models, home.path().join("models")).expect("link the models");
    let chat = |input: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pml"))
            .args([
                "chat",
                "--session",
                "s",
                "--max-tokens",
                "4",
                "--temperature",
                "0",
            ])
            .env("PML_HOME", home.path())
            .env("NO_COLOR", "1")
            .env_remove("PML_STORE")
            .current_dir(home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pml runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write stdin");
        let output = child.wait_with_output().expect("pml finishes");
        assert_ok(&output, "pml chat --session s");
        text(&output.stderr)
    };
    let first = chat("What is 2+2?\n");
    assert!(first.contains("restore plan ("), "{first}");
    assert!(
        home.path().join("store").join("restore-costs").is_dir(),
        "the measured costs are kept in the default store: {first}"
    );
    let resumed = chat("And 3+3?\n");
    assert!(
        resumed.contains("resuming session `s`: 1 turn"),
        "{resumed}"
    );
    assert!(resumed.contains("as measured before"), "{resumed}");
    assert!(resumed.contains("restored in"), "{resumed}");
}
