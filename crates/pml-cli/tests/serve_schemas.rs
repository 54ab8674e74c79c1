//! `pml serve --schemas DIR` loads the schemas of the folder and of its subfolders, each
//! reading its `src=` files from its own folder (the repository's examples sit one to a
//! subfolder), and a folder holding none is said at start rather than left to an empty server.
//! On the tiny chat model.

mod serve_process;
// The server crate's test client (blocking HTTP calls, JSON parsing), shared rather than copied.
#[path = "../../pml-server/tests/support/mod.rs"]
mod support;

use pml_engine::testing::write_tiny_chat_gguf;
use serve_process::ServeProcess;
use support::{call, json};

fn put(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write");
}

#[test]
fn schemas_in_subfolders_are_loaded_with_their_own_sources() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_tiny_chat_gguf(&dir.path().join("tiny.gguf"), 512);
    let schemas = dir.path().join("schemas");
    std::fs::create_dir_all(schemas.join("notes/src")).expect("folders");
    std::fs::create_dir_all(schemas.join(".hidden")).expect("folders");
    put(
        &schemas.join("top.pml"),
        "<schema name=\"top\"><module name=\"a\">A fact.</module></schema>",
    );
    put(
        &schemas.join("notes/notes.pml"),
        "<schema name=\"notes\"><module name=\"memo\" src=\"src/memo.txt\"/></schema>",
    );
    put(&schemas.join("notes/src/memo.txt"), "The meeting moved.");
    put(
        &schemas.join("notes/ask.pml"),
        "<prompt schema=\"notes\"><memo/>When?</prompt>",
    );
    put(
        &schemas.join(".hidden/skipped.pml"),
        "<schema name=\"skipped\">text</schema>",
    );
    let store = format!("disk:{}", dir.path().join("store").display());
    let args = [
        "--model",
        "tiny.gguf",
        "--store",
        &store,
        "--schemas",
        "schemas",
    ];
    let server = ServeProcess::start(&args, dir.path());
    let (status, health) = call("GET", &server.url("/health"), None, None);
    assert_eq!(status, 200);
    assert_eq!(json(&health)["schemas"], 2, "{health}");
    let (status, notes) = call("GET", &server.url("/v1/schemas/notes"), None, None);
    assert_eq!(status, 200, "{notes}");
    let (_, stderr) = server.stop();
    assert!(stderr.contains("schema notes from"), "{stderr}");
    assert!(stderr.contains("schema top from"), "{stderr}");
    assert!(!stderr.contains("skipped"), "{stderr}");

    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("docs")).expect("folders");
    let args = [
        "--model",
        "tiny.gguf",
        "--store",
        &store,
        "--schemas",
        "empty",
    ];
    let (_, stderr) = ServeProcess::start(&args, dir.path()).stop();
    assert!(
        stderr.contains("warning: --schemas empty: no schema found"),
        "{stderr}"
    );
}
