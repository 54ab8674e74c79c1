//! The built `pmlc` binary on fixtures: exit statuses 0/1/2, the JSON output shape, the summary
//! line, schema lookup (by file name, by schema name in the folder, and `--schema`) and `explain`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn pmlc(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pmlc"))
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .output()
        .expect("run pmlc")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> Vec<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    value.as_array().expect("a JSON array").clone()
}

fn codes(entries: &[serde_json::Value]) -> Vec<String> {
    entries
        .iter()
        .filter_map(|entry| entry["code"].as_str())
        .map(str::to_string)
        .collect()
}

/// A fresh folder for one test.
fn temp_folder(name: &str) -> PathBuf {
    let folder = std::env::temp_dir().join(format!("pmlc-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).expect("create temp folder");
    folder
}

#[test]
fn clean_schema_exits_0() {
    let output = pmlc(&["check", "tests/fixtures/errors/travel.pml"], &repo_root());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stderr(&output).trim(),
        "checked 1 file: 0 errors, 0 warnings"
    );
}

#[test]
fn warnings_alone_exit_0() {
    let output = pmlc(
        &[
            "check",
            "--color",
            "never",
            "tests/fixtures/errors/PML105_empty_union.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(0));
    let text = stderr(&output);
    assert!(text.contains("union without members"), "{text}");
    assert!(
        text.trim_end()
            .ends_with("checked 1 file: 0 errors, 1 warning"),
        "{text}"
    );
}

#[test]
fn errors_exit_1_and_every_file_is_reported() {
    let files = [
        "tests/fixtures/errors/PML101_missing_name.pml",
        "tests/fixtures/errors/PML209_unknown_argument.pml",
        "tests/fixtures/errors/travel.pml",
    ];
    let output = pmlc(
        &[&["check", "--format", "json"], &files[..]].concat(),
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(1));
    let entries = json(&output);
    assert_eq!(codes(&entries), ["PML101", "PML101", "PML209"]);
    assert!(stderr(&output).contains("checked 3 files: 3 errors, 0 warnings"));
}

#[test]
fn json_shape() {
    let output = pmlc(
        &[
            "check",
            "--format",
            "json",
            "tests/fixtures/errors/PML209_unknown_argument.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(1));
    let entries = json(&output);
    assert_eq!(entries.len(), 1);
    let entry = &entries[0];
    assert_eq!(
        entry["file"],
        "tests/fixtures/errors/PML209_unknown_argument.pml"
    );
    assert_eq!(entry["code"], "PML209");
    assert_eq!(entry["severity"], "error");
    assert_eq!(
        entry["message"],
        "`travel-plan` has no parameter `durration`"
    );
    assert_eq!(entry["help"], "did you mean `duration`?");
    let label = &entry["labels"][0];
    // `  <travel-plan durration="3 days"/>` on line 2: `durration` starts at column 16.
    assert_eq!(label["line"], 2);
    assert_eq!(label["column"], 16);
    assert_eq!(label["end_line"], 2);
    assert_eq!(label["end_column"], 25);
    let start = label["span"]["start"].as_u64().expect("span start") as usize;
    let end = label["span"]["end"].as_u64().expect("span end") as usize;
    let source = std::fs::read_to_string(
        repo_root().join("tests/fixtures/errors/PML209_unknown_argument.pml"),
    )
    .expect("fixture");
    assert_eq!(&source[start..end], "durration");
    assert_eq!(label["message"], "unknown argument");
}

#[test]
fn clean_json_is_an_empty_array() {
    let output = pmlc(
        &[
            "check",
            "--format",
            "json",
            "tests/fixtures/errors/travel.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(0));
    assert!(json(&output).is_empty());
}

#[test]
fn unreadable_files_exit_2_but_the_others_are_checked() {
    let output = pmlc(
        &[
            "check",
            "no/such/file.pml",
            "tests/fixtures/errors/PML101_missing_name.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(text.contains("cannot read `no/such/file.pml`"), "{text}");
    assert!(text.contains("module without a name"), "{text}");
}

/// Runs `pmlc` and waits at most a minute: a run that blocks is killed and fails the test.
fn pmlc_or_hang(args: &[&str], cwd: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pmlc"))
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pmlc");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("wait for pmlc").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pmlc {args:?} did not return");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("pmlc's output")
}

#[cfg(unix)]
#[test]
fn fifos_are_refused_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    for fifo in ["notes.txt", "pipe.pml"] {
        let made = Command::new("mkfifo")
            .arg(dir.path().join(fifo))
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");
    }
    std::fs::write(
        dir.path().join("s.pml"),
        "<schema name=\"s\"><module name=\"m\" src=\"notes.txt\"/></schema>",
    )
    .expect("write");
    let output = pmlc_or_hang(&["check", "--format", "json", "s.pml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let entries = json(&output);
    assert_eq!(codes(&entries), ["PML110"]);
    assert_eq!(
        entries[0]["labels"][0]["message"],
        "`notes.txt` is not a regular file (a FIFO)"
    );
    let output = pmlc_or_hang(&["check", "pipe.pml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("not a regular file (a FIFO)"),
        "{}",
        stderr(&output)
    );
    // A prompt whose schema would be `pipe.pml` beside it looks on and does not block.
    std::fs::write(
        dir.path().join("p.pml"),
        "<prompt schema=\"pipe\"></prompt>",
    )
    .expect("write");
    let output = pmlc_or_hang(&["check", "p.pml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
}

#[test]
fn long_schema_names_are_refused_by_check_and_compile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = "n".repeat(300);
    std::fs::write(
        dir.path().join("long.pml"),
        format!("<schema name=\"{name}\">text</schema>"),
    )
    .expect("write");
    let output = pmlc(&["check", "--format", "json", "long.pml"], dir.path());
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(codes(&json(&output)), ["PML117"]);
    // Refused before any model is loaded, and before the store would need the name as a file name.
    let output = pmlc(
        &[
            "compile",
            "--color",
            "never",
            "--model",
            "no-such-model.gguf",
            "long.pml",
        ],
        dir.path(),
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(stderr(&output).contains("PML117"), "{}", stderr(&output));
}

#[test]
fn a_megabyte_of_unclosed_comment_openers_gives_one_diagnostic() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("comments.pml"),
        format!("<prompt schema=\"s\">{}", "<!--".repeat(250_000)),
    )
    .expect("write");
    let output = pmlc_or_hang(&["check", "--format", "json", "comments.pml"], dir.path());
    let entries = json(&output);
    assert!(entries.len() <= 4, "{:?}", codes(&entries));
    assert_eq!(
        entries
            .iter()
            .filter(|entry| entry["code"] == "PML006")
            .count(),
        1
    );
}

#[test]
fn a_latin1_file_says_where_it_stops_being_utf8_and_a_bom_is_fine() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("latin1.pml"),
        b"<schema name=\"s\">\n  caf\xE9\n</schema>\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("bom.pml"),
        "\u{feff}<schema name=\"b\">text</schema>\n",
    )
    .expect("write");
    let output = pmlc(&["check", "latin1.pml"], dir.path());
    assert_eq!(output.status.code(), Some(2));
    let text = stderr(&output);
    assert!(
        text.contains("byte 0xE9 at offset 23 (line 2, column 6)"),
        "{text}"
    );
    assert!(text.contains("save it as UTF-8"), "{text}");
    let output = pmlc(&["check", "bom.pml"], dir.path());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn code_in_a_prompt_gets_a_cdata_hint() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("s.pml"),
        "<schema name=\"s\"><module name=\"m\">M.</module></schema>",
    )
    .expect("write schema");
    std::fs::write(
        dir.path().join("ask.pml"),
        "<prompt schema=\"s\"><m/> Why is Vec<u8> not a String?</prompt>",
    )
    .expect("write prompt");
    let output = pmlc(&["check", "--format", "json", "ask.pml"], dir.path());
    assert_eq!(output.status.code(), Some(1));
    let entries = json(&output);
    assert_eq!(codes(&entries), ["PML008", "PML205"]);
    for entry in &entries {
        let help = entry["help"].as_str().expect("help");
        assert!(help.contains("looks like code"), "{help}");
        assert!(help.contains("<![CDATA["), "{help}");
    }
}

#[test]
fn output_stays_bounded_on_huge_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One 5 MB line with an unclosed module: the line is clipped around the labels.
    let long_line = format!(
        "<schema name=\"s\"><module name=\"m\">{}</schema>",
        "x".repeat(5_000_000)
    );
    std::fs::write(dir.path().join("long.pml"), long_line).expect("write");
    // 50,000 duplicate imports: the first 50 are shown, the rest counted.
    std::fs::write(
        dir.path().join("s.pml"),
        "<schema name=\"s\"><module name=\"m\">M.</module></schema>",
    )
    .expect("write schema");
    let imports = "<m/>".repeat(50_000);
    std::fs::write(
        dir.path().join("many.pml"),
        format!("<prompt schema=\"s\">{imports}</prompt>"),
    )
    .expect("write prompt");
    for format in ["human", "json"] {
        let long = pmlc(&["check", "--format", format, "long.pml"], dir.path());
        assert_eq!(long.status.code(), Some(1));
        let size = long.stdout.len() + long.stderr.len();
        assert!(size < 200_000, "{format}: {size} bytes");
        let many = pmlc(&["check", "--format", format, "many.pml"], dir.path());
        assert_eq!(many.status.code(), Some(1));
        let size = many.stdout.len() + many.stderr.len();
        assert!(size < 200_000, "{format}: {size} bytes");
        let text = stderr(&many);
        assert!(
            text.contains("many.pml: 49949 more diagnostics (49949 errors, 0 warnings) not shown"),
            "{text}"
        );
        assert!(text.contains("checked 1 file: 49999 errors"), "{text}");
    }
    let long = pmlc(&["check", "long.pml"], dir.path());
    let text = stderr(&long);
    assert!(
        text.contains("long.pml:1:18"),
        "the file's own column: {text}"
    );
    assert!(text.contains("xxx…xxx"), "clipped: {text}");
    let capped = json(&pmlc(
        &["check", "--format", "json", "many.pml"],
        dir.path(),
    ));
    assert_eq!(capped.len(), 50);
    let all = pmlc(
        &[
            "check",
            "--format",
            "json",
            "--max-diagnostics",
            "0",
            "many.pml",
        ],
        dir.path(),
    );
    assert_eq!(json(&all).len(), 49_999);
}

#[test]
fn argument_lengths_are_checked_with_a_model() {
    if pml_testkit::fetched_model(pml_models::DEFAULT_MODEL_ID).is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("t.pml"),
        "<schema name=\"t\"><module name=\"plan\">A trip of <param name=\"days\" len=\"3\"/>.</module></schema>",
    )
    .expect("write schema");
    std::fs::write(
        dir.path().join("long.pml"),
        "<prompt schema=\"t\"><plan days=\"a very long time indeed, more than three tokens\"/></prompt>",
    )
    .expect("write prompt");
    let without = pmlc(&["check", "long.pml"], dir.path());
    assert_eq!(
        without.status.code(),
        Some(0),
        "no tokenizer, no length check"
    );
    let with = pmlc(
        &[
            "check",
            "--format",
            "json",
            "--model",
            "qwen2.5-0.5b",
            "long.pml",
        ],
        dir.path(),
    );
    assert_eq!(with.status.code(), Some(1), "{}", stderr(&with));
    assert_eq!(codes(&json(&with)), ["PML210"]);
    let unknown = pmlc(&["check", "--model", "nope", "long.pml"], dir.path());
    assert_eq!(unknown.status.code(), Some(2));
    assert!(stderr(&unknown).contains("unknown model `nope`"));
}

#[test]
fn usage_errors_exit_2() {
    let root = repo_root();
    assert_eq!(pmlc(&["check"], &root).status.code(), Some(2), "no files");
    assert_eq!(
        pmlc(
            &[
                "check",
                "--format",
                "xml",
                "tests/fixtures/errors/travel.pml"
            ],
            &root
        )
        .status
        .code(),
        Some(2)
    );
    let missing_schema = pmlc(
        &[
            "check",
            "--schema",
            "nowhere.pml",
            "tests/fixtures/errors/PML209_unknown_argument.pml",
        ],
        &root,
    );
    assert_eq!(missing_schema.status.code(), Some(2));
    assert!(stderr(&missing_schema).contains("cannot read `--schema nowhere.pml`"));
    let prompt_as_schema = pmlc(
        &[
            "check",
            "--schema",
            "tests/fixtures/errors/PML209_unknown_argument.pml",
            "tests/fixtures/errors/PML212_import_out_of_order.pml",
        ],
        &root,
    );
    assert_eq!(prompt_as_schema.status.code(), Some(2));
    assert!(stderr(&prompt_as_schema).contains("is not a schema file"));
}

#[test]
fn schema_found_by_name_in_the_prompts_folder() {
    let folder = temp_folder("lookup");
    std::fs::write(
        folder.join("a-file-named-otherwise.pml"),
        "<schema name=\"kitchen\"><module name=\"oven\">Hot.</module></schema>",
    )
    .expect("write schema");
    std::fs::write(
        folder.join("decoy.pml"),
        "<schema name=\"garden\"><module name=\"shed\">Tools.</module></schema>",
    )
    .expect("write decoy");
    std::fs::write(
        folder.join("good.pml"),
        "<prompt schema=\"kitchen\"><oven/> Bake.</prompt>",
    )
    .expect("write prompt");
    std::fs::write(
        folder.join("bad.pml"),
        "<prompt schema=\"kitchen\"><shed/></prompt>",
    )
    .expect("write prompt");
    let good = pmlc(&["check", "good.pml"], &folder);
    assert_eq!(good.status.code(), Some(0), "{}", stderr(&good));
    let bad = pmlc(&["check", "--format", "json", "bad.pml"], &folder);
    assert_eq!(bad.status.code(), Some(1));
    assert_eq!(
        codes(&json(&bad)),
        ["PML205"],
        "checked against kitchen, not garden"
    );
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn prompt_cache_xml_files_find_each_other() {
    // The original Prompt Cache names schemas and prompts `*.xml`.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("personas.xml"),
        "<schema name=\"mbti\"><module name=\"intro\">Types.</module></schema>",
    )
    .expect("write schema");
    std::fs::write(
        dir.path().join("ask.xml"),
        "<prompt schema=\"mbti\"><intro/> Which type am I?</prompt>",
    )
    .expect("write prompt");
    std::fs::write(
        dir.path().join("lost.xml"),
        "<prompt schema=\"nowhere\">Hi.</prompt>",
    )
    .expect("write prompt");
    let found = pmlc(&["check", "ask.xml"], dir.path());
    assert_eq!(found.status.code(), Some(0), "{}", stderr(&found));
    let lost = pmlc(&["check", "--format", "json", "lost.xml"], dir.path());
    assert_eq!(lost.status.code(), Some(1));
    let entries = json(&lost);
    let help = entries[0]["help"].as_str().expect("help");
    assert!(
        help.contains("nowhere.xml` and the other `.pml` and `.xml` files"),
        "{help}"
    );
}

#[test]
fn schema_found_by_file_name_from_another_folder() {
    let output = pmlc(
        &[
            "check",
            "--format",
            "json",
            "errors/PML212_import_out_of_order.pml",
        ],
        &repo_root().join("tests/fixtures"),
    );
    assert_eq!(output.status.code(), Some(0), "a warning only");
    assert_eq!(codes(&json(&output)), ["PML212"]);
}

#[test]
fn schema_not_found() {
    let output = pmlc(
        &[
            "check",
            "--format",
            "json",
            "tests/fixtures/errors/PML203_schema_not_found.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(1));
    let entries = json(&output);
    assert_eq!(codes(&entries), ["PML203"]);
    let help = entries[0]["help"].as_str().expect("help");
    assert!(help.contains("tests/fixtures/errors/travle.pml"), "{help}");
}

#[test]
fn explicit_schema_overrides_lookup() {
    let root = repo_root();
    let folder = temp_folder("explicit");
    std::fs::write(
        folder.join("travel.pml"),
        "<schema name=\"travel\"><module name=\"elsewhere\">x</module></schema>",
    )
    .expect("write");
    std::fs::write(
        folder.join("p.pml"),
        "<prompt schema=\"travel\"><travel-plan/></prompt>",
    )
    .expect("write");
    let by_lookup = pmlc(
        &[
            "check",
            "--format",
            "json",
            &folder.join("p.pml").display().to_string(),
        ],
        &root,
    );
    assert_eq!(
        codes(&json(&by_lookup)),
        ["PML205"],
        "the travel.pml next to the prompt has no travel-plan"
    );
    let explicit = pmlc(
        &[
            "check",
            "--format",
            "json",
            "--schema",
            "tests/fixtures/errors/travel.pml",
            &folder.join("p.pml").display().to_string(),
        ],
        &root,
    );
    assert_eq!(explicit.status.code(), Some(0), "{}", stderr(&explicit));
    let mismatch = pmlc(
        &[
            "check",
            "--format",
            "json",
            "--schema",
            "tests/fixtures/errors/travel.pml",
            "tests/fixtures/errors/PML202_schema_name_mismatch.pml",
        ],
        &root,
    );
    assert_eq!(codes(&json(&mismatch)), ["PML202"]);
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn explain() {
    let root = repo_root();
    let output = pmlc(&["explain", "pml206"], &root);
    assert_eq!(output.status.code(), Some(0));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.starts_with("PML206 import-outside-parent (error)"),
        "{text}"
    );
    let syntax = pmlc(&["explain", "PML001"], &root);
    assert!(
        String::from_utf8_lossy(&syntax.stdout).starts_with("PML001 stray-less-than (warning)")
    );
    let list = pmlc(&["explain"], &root);
    assert!(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .any(|line| line.starts_with("PML213"))
    );
    let long_name = pmlc(&["explain", "PML117"], &root);
    assert!(
        String::from_utf8_lossy(&long_name.stdout)
            .starts_with("PML117 schema-name-too-long (error)")
    );
    let unknown = pmlc(&["explain", "PML999"], &root);
    assert_eq!(unknown.status.code(), Some(2));
}

#[test]
fn a_schema_checked_first_serves_its_prompts() {
    let output = pmlc(
        &[
            "check",
            "--format",
            "json",
            "tests/fixtures/errors/broken.pml",
            "./tests/fixtures/errors/PML204_schema_has_errors.pml",
        ],
        &repo_root(),
    );
    assert_eq!(output.status.code(), Some(1));
    let entries = json(&output);
    assert_eq!(codes(&entries), ["PML101", "PML204"]);
    assert_eq!(
        entries[1]["message"],
        "the schema this prompt uses has 1 error"
    );
}

#[test]
fn a_file_past_the_size_limit_is_refused_unread() {
    let folder = temp_folder("too-large");
    // Sparse: one byte past the limit without writing 8 MiB.
    let path = folder.join("big.pml");
    let file = std::fs::File::create(&path).expect("create");
    file.set_len(pml_compiler::MAX_SOURCE_BYTES + 1)
        .expect("extend");
    let output = pmlc(&["check", "big.pml"], &folder);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("PML307 source-too-large"),
        "{}",
        stderr(&output)
    );
}
