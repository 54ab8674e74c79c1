//! A module store on a disk that takes no more (a file-size limit below a state's size, which
//! fails writes as a full disk does, with the process ignoring SIGXFSZ as it does ENOSPC):
//! `pmlc compile` fails naming the units it could not store instead of saying it compiled
//! them, and `pml run` answers, saying what it could not store rather than "stored for next
//! time". On the tiny chat model.

use std::path::Path;
use std::process::{Command, Output};

use pml_engine::testing::write_tiny_chat_gguf;

const SCHEMA: &str = "<schema name=\"facts\">\n  <module name=\"museum\">The Harbor Museum opened \
                      in 1921 and moved twice before the war; its founder collected maps of the \
                      northern coast.</module>\n  <module name=\"harbor\">The harbor freezes in \
                      February.</module>\n</schema>\n";

const PROMPT: &str = "<prompt schema=\"facts\"><museum/><harbor/>When did it open?</prompt>\n";

/// `binary args…` in `dir` under bash with files limited to 1 KiB (SIGXFSZ ignored, so a write
/// past it fails with EFBIG rather than killing the process).
fn on_a_full_disk(binary: &str, args: &[&str], dir: &Path) -> Output {
    Command::new("bash")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1; exec \"$@\"")
        .arg("bash")
        .arg(binary)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("PML_HOME", dir.join("home"))
        .env_remove("PML_STORE")
        .output()
        .expect("bash runs")
}

#[test]
fn a_store_that_takes_no_states_fails_the_compile_and_is_said_by_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_chat_gguf(&dir.path().join("tiny.gguf"), 512);
    std::fs::write(dir.path().join("facts.pml"), SCHEMA).expect("write the schema");
    std::fs::write(dir.path().join("ask.pml"), PROMPT).expect("write the prompt");
    let store = format!("disk:{}", dir.path().join("store").display());
    let common = ["--model", "tiny.gguf", "--store", &store];

    let compiled = on_a_full_disk(
        env!("CARGO_BIN_EXE_pmlc"),
        &[&["compile", "facts.pml"], &common[..]].concat(),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&compiled.stderr);
    assert_eq!(compiled.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`facts` is not compiled: the module store cannot be written")
            && stderr.contains("module `museum`"),
        "{stderr}"
    );

    let ran = on_a_full_disk(
        env!("CARGO_BIN_EXE_pml"),
        &[
            &["run", "ask.pml", "--max-tokens", "2", "--temperature", "0"],
            &common[..],
        ]
        .concat(),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("stored for next time"), "{stderr}");
    assert!(
        stderr.contains("the module store cannot be written"),
        "{stderr}"
    );
}
