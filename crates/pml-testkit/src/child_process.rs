//! Child test processes that start together: a test re-invokes its own binary as child processes
//! (each running the same test in child mode, told by an environment variable), and the children
//! start their work at one moment. The barrier is two pipes, no polling and no sleeps: a child
//! prints [`READY`] on stdout when it is set up and then blocks reading its stdin; the parent
//! reads every child's ready line ([`ChildTest::wait_ready`]), then writes each a line
//! ([`ChildTest::go`]).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// The line a child prints when it is ready to start.
pub const READY: &str = "pml-child-ready";

/// A child test process, from the parent's side.
pub struct ChildTest {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<ChildStdout>>,
}

impl ChildTest {
    /// Runs `test` of this test binary in a child process with `env` set to `root`.
    ///
    /// # Panics
    /// When the child cannot be started.
    pub fn spawn(test: &str, env: &str, root: &Path) -> Self {
        let exe = std::env::current_exe().expect("test binary path");
        let mut child = Command::new(exe)
            .args([test, "--exact", "--test-threads=1", "--nocapture"])
            .env(env, root)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("child process starts");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Blocks until the child has printed [`READY`] (the test harness's own lines before it are
    /// passed on to this process's stdout).
    ///
    /// # Panics
    /// When the child ends or closes stdout first.
    pub fn wait_ready(&mut self) {
        let stdout = self.stdout.as_mut().expect("child stdout");
        let mut line = String::new();
        loop {
            line.clear();
            let read = stdout
                .read_line(&mut line)
                .expect("read the child's stdout");
            assert!(read > 0, "the child ended before it was ready");
            // libtest has printed `test NAME ... ` without a newline before the child's line.
            if line.trim_end().ends_with(READY) {
                return;
            }
            print!("{line}");
        }
    }

    /// Lets the child start, and passes the rest of its stdout on from a thread so that it never
    /// blocks on a full pipe.
    ///
    /// # Panics
    /// When the child is gone.
    pub fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("go is said once");
        stdin.write_all(b"go\n").expect("tell the child to go");
        drop(stdin);
        if let Some(mut stdout) = self.stdout.take() {
            std::thread::spawn(move || {
                let mut line = String::new();
                while stdout.read_line(&mut line).is_ok_and(|read| read > 0) {
                    print!("{line}");
                    line.clear();
                }
            });
        }
    }

    /// The child's exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("child status")
    }

    /// Waits for the child to exit.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().expect("child exits")
    }
}

/// Starts every child at once: all ready first, then all told to go.
pub fn start_together(children: &mut [ChildTest]) {
    for child in children.iter_mut() {
        child.wait_ready();
    }
    for child in children.iter_mut() {
        child.go();
    }
}

/// In a child: says it is ready, then blocks until the parent says go.
///
/// # Panics
/// When the parent closes the pipe without saying go.
pub fn ready_then_wait_for_go() {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}").expect("tell the parent");
    stdout.flush().expect("flush stdout");
    drop(stdout);
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read the parent's go");
    assert_eq!(line.trim_end(), "go", "the parent never said go");
}
