//! The playground page in a real browser (Debian's Chromium, headless, driven over CDP by
//! playwright-core; scripts/setup-browser-test.sh installs both) against a server on the default
//! model with the example schema `schemas/docqa/docqa.pml`: `playground_browser.cjs` loads the
//! page, enters a prompt with an error and sees its diagnostic appear and clear, runs
//! `prompt-composer.pml` in `reuse`, `blend` and `full` and sees the three answers and the
//! coloured strips of tokens, and leaves a screenshot (`$PML_PLAYGROUND_SCREENSHOT`, else a
//! temporary file). Skipped with a message when the model, Chromium or playwright-core is missing,
//! unless `PML_REQUIRE_BROWSER=1` (the test command sets it after installing them).
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use pml_server::ServerConfig;
use support::TestServer;

/// The folder holding playwright-core, when it, `node` and Chromium are there.
fn browser_tools() -> Result<PathBuf, String> {
    let home = std::env::var_os("PML_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/pml")))
        .ok_or("no $PML_HOME or $HOME")?;
    let modules = home.join("node-playwright/node_modules");
    if !modules.join("playwright-core").exists() {
        return Err(format!("no playwright-core in {}", modules.display()));
    }
    let chromium = std::env::var_os("PML_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if !chromium.exists() {
        return Err(format!("no Chromium at {}", chromium.display()));
    }
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|output| output.status.success()) {
        return Err("no `node`".to_string());
    }
    Ok(modules)
}

fn repo_file(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).expect("the example schema and prompt are readable")
}

/// The browser tools, or `None` (the test skips) when they are missing and not required.
fn required_browser_tools() -> Option<PathBuf> {
    let required = std::env::var("PML_REQUIRE_BROWSER").is_ok_and(|value| value == "1");
    match browser_tools() {
        Ok(modules) => Some(modules),
        Err(missing) => {
            assert!(
                !required,
                "PML_REQUIRE_BROWSER=1 but {missing}: run scripts/setup-browser-test.sh"
            );
            eprintln!("skipped: {missing} (scripts/setup-browser-test.sh installs them)");
            None
        }
    }
}

/// Runs `playground_browser.cjs` on `server`'s page; what it printed, once it passed.
fn drive_page(
    modules: &Path,
    server: &TestServer,
    schema_name: &str,
    prompt: &str,
    screenshot: &Path,
) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/playground_browser.cjs");
    let output = Command::new("node")
        .env("NODE_PATH", modules)
        .arg(&script)
        .arg(server.url("/"))
        .arg(schema_name)
        .arg(prompt)
        .arg(screenshot)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.replace(' ', "").contains("\"passed\":true"),
        "{stdout}\n{stderr}"
    );
    stdout
}

#[test]
fn the_playground_checks_runs_and_colours_a_prompt_in_chromium() {
    let Some(modules) = required_browser_tools() else {
        return;
    };
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    server.upload_ready(&repo_file("schemas/docqa/docqa.pml"));
    let prompt = repo_file("schemas/docqa/prompt-composer.pml");
    let scratch = tempfile::TempDir::new().expect("temporary folder");
    let screenshot = std::env::var_os("PML_PLAYGROUND_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| scratch.path().join("playground.png"));
    let stdout = drive_page(&modules, &server, "docqa", &prompt, &screenshot);
    let png = std::fs::read(&screenshot).expect("the screenshot was written");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    eprintln!("{stdout}");
}

/// A server started without schemas: the page starts from its example (no error on an empty
/// editor), and says so.
#[test]
fn a_server_without_schemas_opens_on_an_example() {
    let Some(modules) = required_browser_tools() else {
        return;
    };
    let server = TestServer::tiny(ServerConfig::default());
    let scratch = tempfile::TempDir::new().expect("temporary folder");
    drive_page(
        &modules,
        &server,
        "example",
        "-",
        &scratch.path().join("empty.png"),
    );
}
