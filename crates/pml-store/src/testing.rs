//! Test scaffolding for processes that share a store: a test re-invokes its own binary as child
//! processes (each running the same test in child mode, told by an environment variable), and
//! the children start together when the parent creates a "go" file.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The file whose creation starts the children.
pub const GO_FILE: &str = "go";

/// Runs `test` of this test binary in a child process with `env` set to `root`.
pub fn spawn_child_test(test: &str, env: &str, root: &Path) -> Child {
    let exe = std::env::current_exe().expect("test binary path");
    Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(env, root)
        .spawn()
        .expect("child process starts")
}

/// In a child: waits (up to a minute) for the parent's go file in `root`.
pub fn wait_for_go(root: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !root.join(GO_FILE).exists() {
        assert!(Instant::now() < deadline, "parent never said go");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// In the parent: lets the children go.
pub fn say_go(root: &Path) {
    std::fs::write(root.join(GO_FILE), b"").expect("go file");
}
