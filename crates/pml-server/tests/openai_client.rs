//! OpenAI's official Python client (`openai`, installed by scripts/setup-openai-client.sh)
//! against a real server on the default model: `tests/openai_client.py` makes the everyday calls
//! (models, chat and completions plain and streamed with `include_usage`, content parts, `n`,
//! logprobs, `max_completion_tokens`, a PML prompt) and checks the refusals' shape (an image
//! part, an unknown model, a prompt past the context); `tests/openai_client_tools.py` calls tools
//! (required, named and streamed, auto, none, the round trip with a tool result). Skipped with a message when the
//! model or the client's venv is missing, unless `PML_REQUIRE_OPENAI=1` (the test command sets
//! it after installing the client).

mod support;

use std::path::PathBuf;
use std::process::Command;

use pml_server::ServerConfig;
use support::{PROMPT, SCHEMA, TestServer};

/// The client's interpreter: `$PML_OPENAI_PYTHON`, else the venv of the setup script.
fn client_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("PML_OPENAI_PYTHON") {
        return Some(PathBuf::from(python));
    }
    let home = std::env::var_os("PML_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/pml")))?;
    let python = home.join("venv-openai/bin/python");
    python.exists().then_some(python)
}

#[test]
fn the_official_openai_client_gets_what_it_expects() {
    let required = std::env::var("PML_REQUIRE_OPENAI").is_ok_and(|value| value == "1");
    let Some(python) = client_python() else {
        assert!(
            !required,
            "PML_REQUIRE_OPENAI=1 but no client: run scripts/setup-openai-client.sh"
        );
        eprintln!("skipped: no `openai` client venv (scripts/setup-openai-client.sh installs it)");
        return;
    };
    let Some(server) = TestServer::default_model(ServerConfig::default()) else {
        return;
    };
    server.upload_ready(SCHEMA);
    let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
    for script in ["openai_client.py", "openai_client_tools.py"] {
        let output = Command::new(&python)
            .arg(tests.join(script))
            .arg(server.url(""))
            .arg(PROMPT)
            .output()
            .expect("the client's python runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{script} failed:\n{stdout}\n{stderr}"
        );
        assert!(stdout.contains("\"passed\": true"), "{stdout}\n{stderr}");
        eprintln!("{script}:\n{stdout}");
    }
}
