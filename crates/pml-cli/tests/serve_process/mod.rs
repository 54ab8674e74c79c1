//! A `pml serve` child process for the CLI's server tests: started on a free port with the
//! arguments a test gives, its address read from what it prints, stopped with SIGTERM.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server may take to load the model and bind its port.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A `pml serve` child; killed if the test ends without stopping it.
pub struct ServeProcess {
    child: Child,
    pub base: String,
    /// Collects the rest of stderr so the pipe never fills; yields it when the process ends.
    stderr: Option<JoinHandle<String>>,
}

impl ServeProcess {
    /// Starts `pml serve --port 0` with `args` in `dir` and waits for the address it prints.
    pub fn start(args: &[&str], dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pml"))
            .args(["serve", "--port", "0"])
            .args(args)
            .env("NO_COLOR", "1")
            .env_remove("PML_STORE")
            .env_remove("PML_ADMIN_TOKEN")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pml serve starts");
        let pipe = child.stderr.take().expect("stderr is piped");
        let (address, address_found) = mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut seen = String::new();
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(url) = line
                    .split_once(" on http://")
                    .filter(|_| line.starts_with("serving "))
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                {
                    let _ = address.send(format!("http://{url}"));
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            seen
        });
        let mut server = Self {
            child,
            base: String::new(),
            stderr: Some(stderr),
        };
        match address_found.recv_timeout(STARTUP_TIMEOUT) {
            Ok(base) => server.base = base,
            Err(_) => {
                let _ = server.child.kill();
                let _ = server.child.wait();
                panic!("pml serve printed no address:\n{}", server.stderr_text());
            }
        }
        server
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM (graceful shutdown), then the exit status and everything printed to stderr.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let signalled = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(signalled.success(), "kill -TERM failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for pml serve") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("pml serve ignored SIGTERM:\n{}", self.stderr_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        (status, self.stderr_text())
    }

    /// What the process printed to stderr; complete once it has exited.
    pub fn stderr_text(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|reader| reader.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
