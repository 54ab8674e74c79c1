//! Shared by the server's integration tests: a server on a loopback port (tiny random model
//! unless a runtime is given) and a small blocking HTTP client for it.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pml_engine::model::Arch;
use pml_models::DEFAULT_MODEL_ID;
use pml_runtime::inference::{Runtime, RuntimeOptions};
use pml_runtime::store::{DEFAULT_RAM_BUDGET_BYTES, StoreConfig};
use pml_runtime::testing::tiny_runtime;
use pml_server::{ServerConfig, ServerHandle};
use pml_testkit::fetched_model;
use serde_json::Value;

pub const SCHEMA: &str = r#"<schema name="notes">
  You answer questions about the notes below.
  <module name="notes">The meeting moved to Tuesday; bring the slides.</module>
</schema>"#;

pub const PROMPT: &str = r#"<prompt schema="notes"><notes/>When is the meeting?</prompt>"#;

/// A running server and the temporary directory its store's manifests live in.
pub struct TestServer {
    pub handle: Option<ServerHandle>,
    pub base: String,
    _manifests: Option<tempfile::TempDir>,
}

impl TestServer {
    /// The tiny Qwen2-shaped model with `config`.
    pub fn tiny(config: ServerConfig) -> Self {
        let (runtime, manifests) = tiny_runtime(Arch::Qwen2, 7);
        let mut server = Self::with_runtime(runtime, config);
        server._manifests = Some(manifests);
        server
    }

    /// The real default model, with a private store (RAM over a temporary disk tier, not
    /// `$PML_HOME/store`); `None` (the test skips) when the model is not fetched.
    pub fn default_model(config: ServerConfig) -> Option<Self> {
        let path = fetched_model(DEFAULT_MODEL_ID)?;
        Some(Self::from_gguf(&path, config))
    }

    /// The model of the GGUF file at `path`, with a private store as [`Self::default_model`].
    pub fn from_gguf(path: &std::path::Path, config: ServerConfig) -> Self {
        let store = tempfile::TempDir::new().expect("temporary store");
        let mut options = RuntimeOptions::from_env().expect("runtime options");
        options.store = StoreConfig::local(store.path(), DEFAULT_RAM_BUDGET_BYTES);
        let runtime = Runtime::load(path, &options).expect("the model loads");
        let mut server = Self::with_runtime(runtime, config);
        server._manifests = Some(store);
        server
    }

    pub fn with_runtime(runtime: Runtime, config: ServerConfig) -> Self {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("loopback address");
        let handle = pml_server::start(runtime, config, addr).expect("server starts");
        let base = format!("http://{}", handle.addr());
        Self {
            handle: Some(handle),
            base,
            _manifests: None,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A raw connection to the server that gives up after a while instead of hanging a
    /// failing test.
    pub fn connect(&self) -> std::net::TcpStream {
        let addr = self.base.trim_start_matches("http://");
        let stream = std::net::TcpStream::connect(addr).expect("connects");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        stream
    }

    /// Uploads `schema` and waits until it is compiled.
    pub fn upload_ready(&self, schema: &str) -> Value {
        upload_ready(&self.base, schema, Duration::from_secs(120))
    }

    /// Status and parsed body of a `/v1/completions` request with `body`.
    pub fn complete(&self, body: &Value) -> (u16, Value) {
        self.post("/v1/completions", body)
    }

    /// Status and parsed body of a POST of `body` to `path`.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post(&self.url(path), body)
    }

    /// The value of a metric line (`name{labels}` exactly as rendered).
    pub fn metric(&self, series: &str) -> f64 {
        metric(&self.base, series)
    }

    /// Polls until `series` reaches `value`.
    pub fn wait_for_metric(&self, series: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.metric(series) != value {
            assert!(Instant::now() < deadline, "{series} never reached {value}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let _ = handle.shutdown();
        }
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_read(Duration::from_secs(120))
        .build()
}

/// Status and parsed body of a POST of `body` to `url`.
pub fn post(url: &str, body: &Value) -> (u16, Value) {
    let (status, text) = call("POST", url, Some(&body.to_string()), None);
    (status, json(&text))
}

/// The value of a metric line (`name{labels}` exactly as rendered) of the server at `base`.
pub fn metric(base: &str, series: &str) -> f64 {
    let (status, text) = call("GET", &format!("{base}/metrics"), None, None);
    assert_eq!(status, 200);
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no metric {series} in:\n{text}"))
}

/// Status and body of one request; `token` goes in as a bearer token.
pub fn call(method: &str, url: &str, body: Option<&str>, token: Option<&str>) -> (u16, String) {
    let (status, _, body) = call_with_headers(method, url, body, token);
    (status, body)
}

/// Status, `Retry-After` header and body of one request.
pub fn call_with_headers(
    method: &str,
    url: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, Option<String>, String) {
    let mut request = agent().request(method, url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let result = match body {
        Some(body) => request.send_string(body),
        None => request.call(),
    };
    let response = match result {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(error) => panic!("{method} {url}: {error}"),
    };
    let status = response.status();
    let retry_after = response.header("Retry-After").map(str::to_string);
    let mut text = String::new();
    response
        .into_reader()
        .read_to_string(&mut text)
        .expect("response body");
    (status, retry_after, text)
}

pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// A streamed response, read event by event.
pub struct EventStream {
    pub status: u16,
    pub content_type: String,
    lines: Box<dyn BufRead + Send>,
}

impl EventStream {
    pub fn open(url: &str, body: &str) -> Self {
        let response = match agent().post(url).send_string(body) {
            Ok(response) => response,
            Err(ureq::Error::Status(_, response)) => response,
            Err(error) => panic!("POST {url}: {error}"),
        };
        Self {
            status: response.status(),
            content_type: response.content_type().to_string(),
            lines: Box::new(BufReader::new(response.into_reader())),
        }
    }

    /// The next `data:` payload, `None` at the end of the stream.
    pub fn next_data(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return Some(data.to_string());
            }
        }
    }

    /// Every remaining payload.
    pub fn rest(mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_data()).collect()
    }
}

pub fn completion_body(prompt: &str, max_tokens: usize, stream: bool) -> String {
    serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "stream": stream}).to_string()
}

/// Uploads `schema` to the server at `base` and polls `GET /v1/schemas/{name}` until it is
/// compiled, failing the test after `timeout`.
pub fn upload_ready(base: &str, schema: &str, timeout: Duration) -> Value {
    let (status, body) = call("POST", &format!("{base}/v1/schemas"), Some(schema), None);
    assert_eq!(status, 202, "{body}");
    let name = json(&body)["name"].as_str().expect("name").to_string();
    let deadline = Instant::now() + timeout;
    loop {
        let (status, body) = call("GET", &format!("{base}/v1/schemas/{name}"), None, None);
        assert_eq!(status, 200, "{body}");
        let info = json(&body);
        match info["status"].as_str() {
            Some("ready") => return info,
            Some("failed") => panic!("compilation failed: {body}"),
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "schema never became ready: {body}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything the server logs in this test process, from the first call on (tokio's worker
/// threads log too, so the subscriber is the global one).
pub fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    Arc::clone(LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = LogSink(Arc::clone(&log));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        log
    }))
}

#[derive(Clone)]
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A response read off a raw connection: status, headers (names lower-cased) and body.
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl RawResponse {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Sends `request` (the whole HTTP/1.1 text, `Connection: close` among its headers) to `addr`
/// as written, headers included, and reads the response until the server closes.
pub fn raw(addr: SocketAddr, request: &str) -> RawResponse {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("read timeout");
    stream.write_all(request.as_bytes()).expect("send");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    parse_raw(&text)
}

/// The status, headers and body of a response's text (the body as sent, not de-chunked).
pub fn parse_raw(text: &str) -> RawResponse {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    RawResponse {
        status,
        headers,
        body: body.to_string(),
    }
}
