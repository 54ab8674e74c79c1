//! A minimal LSP client for the integration tests: spawns the built `pml lsp`, frames JSON-RPC
//! messages on its stdin, reads its stdout on a thread (so a hung server fails the test after a
//! timeout instead of hanging it), answers requests by id and collects `publishDiagnostics`.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

pub struct LspClient {
    child: Child,
    stdin: Option<ChildStdin>,
    messages: Receiver<Value>,
    next_id: i64,
    /// Notifications received while waiting for something else.
    pending: Vec<Value>,
}

impl LspClient {
    /// Starts `pml lsp ARGS` and completes the `initialize` handshake; returns the result.
    pub fn start(args: &[&str], cwd: &Path) -> (LspClient, Value) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pml"))
            .arg("lsp")
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn pml lsp");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            while let Some(message) = read_message(&mut reader) {
                if sender.send(message).is_err() {
                    return;
                }
            }
        });
        let mut client = LspClient {
            stdin: child.stdin.take(),
            child,
            messages,
            next_id: 0,
            pending: Vec::new(),
        };
        let result = client.request(
            "initialize",
            json!({"processId": null, "rootUri": null, "capabilities": {}}),
        );
        client.notify("initialized", json!({}));
        (client, result)
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request and waits for its response; returns `result` (panics on an error).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let message = self.receive();
            if message.get("id") == Some(&json!(id)) {
                assert!(message.get("error").is_none(), "{method} failed: {message}");
                return message["result"].clone();
            }
            self.pending.push(message);
        }
    }

    /// The next `publishDiagnostics` for `uri` (received earlier or awaited now).
    pub fn diagnostics(&mut self, uri: &str) -> Value {
        let matches = |message: &Value| {
            message["method"] == "textDocument/publishDiagnostics"
                && message["params"]["uri"] == uri
        };
        if let Some(index) = self.pending.iter().position(matches) {
            return self.pending.remove(index)["params"].clone();
        }
        loop {
            let message = self.receive();
            if matches(&message) {
                return message["params"].clone();
            }
            self.pending.push(message);
        }
    }

    /// `shutdown`, `exit`, and the exit status.
    pub fn shutdown(mut self) -> std::process::ExitStatus {
        let result = self.request("shutdown", Value::Null);
        assert_eq!(result, Value::Null);
        self.notify("exit", Value::Null);
        self.wait()
    }

    fn send(&mut self, message: &Value) {
        let body = message.to_string();
        let stdin = self.stdin.as_mut().expect("stdin open");
        write!(stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).expect("write to pml lsp");
        stdin.flush().expect("flush");
    }

    fn receive(&mut self) -> Value {
        match self.messages.recv_timeout(TIMEOUT) {
            Ok(message) => message,
            Err(RecvTimeoutError::Timeout) => panic!("no message from pml lsp in {TIMEOUT:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("pml lsp closed its output"),
        }
    }
}

impl Drop for LspClient {
    fn drop(&mut self) {
        // A test that failed midway must not leave the server running.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_message(reader: &mut impl BufRead) -> Option<Value> {
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("Content-Length: ") {
            length = value.parse::<usize>().ok();
        }
    }
    let mut body = vec![0; length?];
    reader.read_exact(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

impl LspClient {
    /// Closes stdin and waits for the process to end.
    pub fn wait(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for pml lsp") {
                return status;
            }
            assert!(Instant::now() < deadline, "pml lsp did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
