//! `pml lsp` as an editor starts it: the built binary on stdin/stdout, spoken to in JSON-RPC.
//! The lifecycle (initialize … shutdown, exit status 0), diagnostics on open and after
//! incremental edits (with UTF-16 columns, and the same codes and messages as
//! `pmlc check --format json`), debouncing, hover, definition, completion, document symbols and
//! references.

mod lsp_client;

use lsp_client::LspClient;
use pml_lsp::uri::from_path;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

const SCHEMA: &str = r#"<schema name="travel">
  <user>
    <module name="plan">
      A trip of <param name="duration" len="6">one week</param>.
      <union>
        <module name="domestic">City: <param name="city" len="10"/></module>
        <module name="overseas">Abroad.</module>
      </union>
    </module>
    <module name="extra">More.</module>
  </user>
</schema>
"#;

/// Line 1 has an astral character (two UTF-16 units) before the unknown `tokio`.
const PROMPT: &str =
    "<prompt schema=\"travel\">\n  <plan duration=\"𝄞 é\"><tokio/></plan>\n</prompt>\n";

fn folder(name: &str) -> PathBuf {
    let folder = std::env::temp_dir().join(format!("pml-lsp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).expect("create temp folder");
    std::fs::write(folder.join("travel.pml"), SCHEMA).expect("write schema");
    folder
}

fn uri(path: &Path) -> String {
    from_path(path).expect("absolute path").as_str().to_string()
}

fn position(line: u32, character: u32) -> Value {
    json!({"line": line, "character": character})
}

fn at(uri: &str, line: u32, character: u32) -> Value {
    json!({"textDocument": {"uri": uri}, "position": position(line, character)})
}

/// `(code, message)` of each diagnostic `pmlc check --format json` gives for `path`.
fn pmlc_check(path: &Path) -> Vec<(String, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_pmlc"))
        .args(["check", "--format", "json"])
        .arg(path)
        .output()
        .expect("run pmlc");
    let entries: Value = serde_json::from_slice(&output.stdout).expect("JSON output");
    entries
        .as_array()
        .expect("an array")
        .iter()
        .map(code_and_message)
        .collect()
}

/// The `code` and `message` fields, alike in `pmlc check --format json` and in LSP diagnostics.
fn code_and_message(entry: &Value) -> (String, String) {
    let field = |name: &str| entry[name].as_str().unwrap_or("").to_string();
    (field("code"), field("message"))
}

fn codes_and_messages(published: &Value) -> Vec<(String, String)> {
    published["diagnostics"]
        .as_array()
        .expect("diagnostics array")
        .iter()
        .map(code_and_message)
        .collect()
}

#[test]
fn an_editing_session_from_initialize_to_exit() {
    let folder = folder("session");
    let prompt_path = folder.join("trip.pml");
    std::fs::write(&prompt_path, PROMPT).expect("write prompt");
    let prompt = uri(&prompt_path);
    let schema = uri(&folder.join("travel.pml"));
    let (mut client, initialized) =
        LspClient::start(&["--no-model", "--debounce-ms", "20"], &folder);
    let capabilities = &initialized["capabilities"];
    assert_eq!(
        capabilities["textDocumentSync"]["change"], 2,
        "incremental sync"
    );
    assert_eq!(capabilities["positionEncoding"], "utf-16");

    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": prompt, "languageId": "pml", "version": 1, "text": PROMPT}}),
    );
    let published = client.diagnostics(&prompt);
    assert_eq!(published["version"], 1);
    assert_eq!(codes_and_messages(&published), pmlc_check(&prompt_path));
    assert_eq!(codes_and_messages(&published)[0].0, "PML205");
    // `<tokio/>`: `  <plan duration="` is 18 units, `𝄞 é` 4, `"><` 3.
    assert_eq!(
        published["diagnostics"][0]["range"],
        json!({"start": position(1, 25), "end": position(1, 30)})
    );

    // Fix it with an incremental edit in UTF-16 columns: `tokio` → `overseas`.
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": prompt, "version": 2}, "contentChanges": [
            {"range": {"start": position(1, 25), "end": position(1, 30)}, "text": "overseas"}
        ]}),
    );
    let published = client.diagnostics(&prompt);
    assert_eq!(published["version"], 2);
    assert_eq!(published["diagnostics"], json!([]));

    // Hover on the import `overseas` (line 1, after the edit at column 25).
    let hover = client.request("textDocument/hover", at(&prompt, 1, 27));
    let text = hover["contents"]["value"].as_str().expect("markdown");
    assert!(
        text.contains("**module `overseas`** — `plan › overseas`"),
        "{text}"
    );
    assert!(
        text.contains("--no-model"),
        "says why token counts are missing: {text}"
    );
    assert!(text.contains("Abroad."), "shows the module's text: {text}");
    let hover = client.request("textDocument/hover", at(&prompt, 1, 10));
    let text = hover["contents"]["value"].as_str().expect("markdown");
    assert!(text.contains("`len`: 6 tokens"), "{text}");

    // Definition: the import → the module's name in the schema file; `schema="…"` → the file.
    let definition = client.request("textDocument/definition", at(&prompt, 1, 27));
    assert_eq!(definition["uri"], schema);
    assert_eq!(definition["range"]["start"], position(6, 22));
    let definition = client.request("textDocument/definition", at(&prompt, 0, 18));
    assert_eq!(definition["uri"], schema);

    // Completion at the top level after `</plan>`: `extra` only (`plan` is imported).
    let completion = client.request("textDocument/completion", at(&prompt, 1, 50));
    let labels: Vec<&str> = completion
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|item| item["label"].as_str())
        .collect();
    assert_eq!(labels, ["extra"]);

    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": prompt}}),
    );
    assert_eq!(symbols[0]["name"], "plan");
    assert_eq!(symbols[0]["children"][0]["name"], "overseas");

    // Open the schema too: its symbols are the module tree; references of `overseas` include
    // the prompt's import.
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": schema, "languageId": "pml", "version": 1, "text": SCHEMA}}),
    );
    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": schema}}),
    );
    let names: Vec<&str> = symbols
        .as_array()
        .expect("symbols")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["plan", "extra"]);
    let mut params = at(&schema, 6, 25);
    params["context"] = json!({"includeDeclaration": false});
    let references = client.request("textDocument/references", params);
    assert_eq!(
        references,
        json!([{"uri": prompt, "range": {"start": position(1, 25), "end": position(1, 33)}}])
    );

    // A schema edit that removes `overseas` breaks the open prompt: its diagnostics come again.
    client.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": schema, "version": 2}, "contentChanges": [
            {"range": {"start": position(6, 22), "end": position(6, 30)}, "text": "abroad"}
        ]}),
    );
    let published = client.diagnostics(&prompt);
    assert_eq!(published["diagnostics"][0]["code"], "PML205");

    let status = client.shutdown();
    assert!(status.success(), "exit status {status:?}");
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn exit_without_shutdown_is_an_error_status() {
    let folder = folder("exit");
    let (mut client, _) = LspClient::start(&["--no-model"], &folder);
    client.notify("exit", Value::Null);
    // `shutdown` cannot be sent any more; wait for the process through a fresh request-less drop.
    let status = client.wait();
    assert_eq!(status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn hover_shows_token_counts_with_the_fetched_model() {
    let id = pml_models::DEFAULT_MODEL_ID;
    if pml_testkit::fetched_model(id).is_none() {
        return;
    }
    let folder = folder("model");
    let schema = uri(&folder.join("travel.pml"));
    let (mut client, _) = LspClient::start(&[], &folder);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": schema, "languageId": "pml", "version": 1, "text": SCHEMA}}),
    );
    let hover = client.request("textDocument/hover", at(&schema, 5, 25));
    let text = hover["contents"]["value"].as_str().expect("markdown");
    assert!(text.contains("**module `domestic`**"), "{text}");
    assert!(
        text.contains(&format!("With `{id}`:")) && text.contains("tokens of its own, positions"),
        "{text}"
    );
    // With the model's tokenizer, argument lengths are checked as `pml run` checks them.
    let prompt_path = folder.join("long.pml");
    let long = "<prompt schema=\"travel\">\n  <plan duration=\"many many many many many many many many days\"/>\n</prompt>\n";
    std::fs::write(&prompt_path, long).expect("write prompt");
    let prompt = uri(&prompt_path);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": prompt, "languageId": "pml", "version": 1, "text": long}}),
    );
    let published = client.diagnostics(&prompt);
    let codes: Vec<String> = codes_and_messages(&published)
        .into_iter()
        .map(|(code, _)| code)
        .collect();
    assert_eq!(codes, ["PML210"], "{published}");
    assert!(client.shutdown().success());
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn a_burst_of_edits_is_checked_once_after_the_debounce() {
    let folder = folder("debounce");
    let prompt = uri(&folder.join("trip.pml"));
    // A long debounce, so that writing the burst cannot outlast it even on a loaded machine.
    let (mut client, _) = LspClient::start(&["--no-model", "--debounce-ms", "1000"], &folder);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": prompt, "languageId": "pml", "version": 1, "text": PROMPT}}),
    );
    for version in 2..=6 {
        client.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": prompt, "version": version}, "contentChanges": [
                {"range": {"start": position(2, 0), "end": position(2, 0)}, "text": "x"}
            ]}),
        );
    }
    // The first diagnostics published are those of the last version: nothing in between.
    let published = client.diagnostics(&prompt);
    assert_eq!(published["version"], 6);
    assert!(client.shutdown().success());
    let _ = std::fs::remove_dir_all(&folder);
}
