//! OpenAI's official clients (installed by scripts/setup-openai-client.sh) against a real server
//! on the default model. Python (`openai` from PyPI): `tests/openai_client.py` makes the everyday
//! calls (models, chat and completions plain and streamed with `include_usage`, content parts,
//! `n`, logprobs, `max_completion_tokens`, a PML prompt) and checks the refusals' shape (an image
//! part, a prompt past the context) and that any model id is found;
//! `tests/openai_client_tools.py` calls tools (required, named and streamed, auto, none, the
//! round trip with a tool result);
//! `tests/openai_client_responses.py` drives `/v1/responses` (text and items, streamed raw and
//! through the SDK's stream helper, a function tool, `previous_response_id`, `text.format`).
//! `tests/openai_agents.py` runs OpenAI's Agents SDK (`openai-agents`) as a new user does: the
//! default agent with one function tool, no token limit, through both APIs, plain and streamed.
//! Node (`openai` from npm): `tests/openai_client_node.cjs`, tools on chat and the Responses API.
//! Skipped with a message when the model or a client is missing, unless `PML_REQUIRE_OPENAI=1`
//! (the test command sets it after installing the clients).
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use pml_server::ServerConfig;
use support::{PROMPT, SCHEMA, TestServer};

/// `$PML_HOME`, else `~/.cache/pml`.
fn pml_home() -> Option<PathBuf> {
    std::env::var_os("PML_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/pml")))
}

/// The Python client's interpreter: `$PML_OPENAI_PYTHON`, else the venv of the setup script.
fn client_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("PML_OPENAI_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let python = pml_home()?.join("venv-openai/bin/python");
    python.exists().then_some(python)
}

/// The folder holding the Node client's package, when it and `node` are there.
fn node_modules() -> Option<PathBuf> {
    let modules = pml_home()?.join("node-openai/node_modules");
    let node = Command::new("node").arg("--version").output();
    (modules.join("openai").exists() && node.is_ok_and(|output| output.status.success()))
        .then_some(modules)
}

/// Runs one client script against `server`; it must print `"passed": true`.
fn run_script(mut command: Command, script: &Path, server: &TestServer) {
    let output = command
        .arg(script)
        .arg(server.url(""))
        .arg(PROMPT)
        .output()
        .expect("the client's interpreter runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let name = script.display();
    assert!(
        output.status.success(),
        "{name} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.replace(' ', "").contains("\"passed\":true"),
        "{stdout}\n{stderr}"
    );
    eprintln!("{name}:\n{stdout}");
}

#[test]
fn the_official_openai_clients_get_what_they_expect() {
    let required = std::env::var("PML_REQUIRE_OPENAI").is_ok_and(|value| value == "1");
    let (python, node) = (client_python(), node_modules());
    if python.is_none() || node.is_none() {
        assert!(
            !required,
            "PML_REQUIRE_OPENAI=1 but a client is missing (python: {python:?}, node: {node:?}): \
             run scripts/setup-openai-client.sh"
        );
    }
    if python.is_none() && node.is_none() {
        eprintln!("skipped: no `openai` client (scripts/setup-openai-client.sh installs them)");
        return;
    }
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    server.upload_ready(SCHEMA);
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    if let Some(python) = &python {
        for script in [
            "openai_client.py",
            "openai_client_tools.py",
            "openai_client_responses.py",
            "openai_agents.py",
        ] {
            run_script(Command::new(python), &tests.join(script), &server);
        }
    } else {
        eprintln!("skipped the Python client: no venv");
    }
    if let Some(modules) = &node {
        let mut command = Command::new("node");
        command.env("NODE_PATH", modules);
        run_script(command, &tests.join("openai_client_node.cjs"), &server);
    } else {
        eprintln!("skipped the Node client: no `node` or no package");
    }
}
