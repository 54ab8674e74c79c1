//! Running the built binaries from tests: with a given stdin, no colour and no `$PML_STORE` from
//! the caller's environment.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `binary` with `args` in `dir`, `stdin` written to it (then closed); waits for it.
///
/// # Panics
/// When the binary cannot be started or its stdin written.
pub fn run(binary: &str, args: &[&str], stdin: Option<&str>, dir: &Path) -> Output {
    let mut child = Command::new(binary)
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("PML_STORE")
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin.unwrap_or_default().as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("the binary finishes")
}

/// Output bytes as text (lossy).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// # Panics
/// When `output`'s process failed, with its exit code and both streams.
pub fn assert_ok(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what}: {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        text(&output.stdout),
        text(&output.stderr)
    );
}
