//! A throwaway `redis-server` for tests and benchmarks: started on a free local port with its
//! files in a temporary folder and no persistence, stopped (killed) when dropped. Tests call
//! [`start_redis`], which skips (with a notice) when `redis-server` is not installed, unless
//! `PML_REQUIRE_MODELS=1` (CI installs it and sets that), under which a missing server fails the
//! test (it panics); tools call [`try_start_redis`]. [`start_redis_cluster`] starts three such
//! servers in cluster mode and joins them into one Redis Cluster (slots split by `redis-cli
//! --cluster create`).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::models_required;

/// How long a fresh server may take to answer its first `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running `redis-server` owned by a test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    _dir: TempDir,
}

impl RedisServer {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server now (SIGKILL, no shutdown): what a crashed or unplugged Redis looks like.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A client connection (for tests that tamper with entries or read counters).
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("connect to the test redis-server")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh server, or `None` after printing a skip notice when `redis-server` is not installed.
///
/// # Panics
/// When the server is missing and [`models_required`], or when it does not start.
pub fn start_redis() -> Option<RedisServer> {
    let installed = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !installed {
        assert!(
            !models_required(),
            "redis-server is required by this test (apt-get install -y redis-server)"
        );
        eprintln!("skipped: redis-server is not installed (apt-get install -y redis-server)");
        return None;
    }
    match try_start_redis() {
        Ok(server) => Some(server),
        Err(error) => panic!("redis-server did not start: {error}"),
    }
}

/// Why no throwaway server could be started.
#[derive(Debug, thiserror::Error)]
pub enum RedisStartError {
    #[error("could not start redis-server: {0}")]
    Io(#[from] std::io::Error),
    #[error("redis-server exited with {status} (port {port} taken?)")]
    Exited {
        status: std::process::ExitStatus,
        port: u16,
    },
    #[error("redis-server gave no answer on port {port} within {timeout:?}")]
    Silent { port: u16, timeout: Duration },
}

/// A fresh server, or why none could be started (not installed, no free port): for tools such
/// as `pml bench store` that run without one.
pub fn try_start_redis() -> Result<RedisServer, RedisStartError> {
    // Another process may take the free port between our probe and the server's bind: retry,
    // and report the last attempt's failure.
    for _ in 1..START_ATTEMPTS {
        if let Ok(server) = try_start() {
            return Ok(server);
        }
    }
    try_start()
}

/// Tries at starting a server before giving up.
const START_ATTEMPTS: usize = 5;

fn try_start() -> Result<RedisServer, RedisStartError> {
    try_start_with(&[])
}

/// A server started with `extra` arguments after the usual ones.
fn try_start_with(extra: &[&str]) -> Result<RedisServer, RedisStartError> {
    let dir = TempDir::new()?;
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())?
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(extra)
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut server = RedisServer {
        child: Some(child),
        port,
        _dir: dir,
    };
    let started = Instant::now();
    while started.elapsed() < STARTUP_TIMEOUT {
        if let Some(child) = server.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            server.child = None;
            return Err(RedisStartError::Exited { status, port });
        }
        let answered = redis::Client::open(server.url())
            .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut connection| redis::cmd("PING").query::<String>(&mut connection));
        if answered.is_ok() {
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(RedisStartError::Silent {
        port,
        timeout: STARTUP_TIMEOUT,
    })
}

/// A running three-node Redis Cluster owned by a test (every node a primary, no replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// The first node's URL with PML's `cluster=1`: what `--store` takes.
    pub fn store_url(&self) -> String {
        format!("{}?cluster=1", self.nodes[0].url())
    }

    /// A cluster-aware client connection.
    pub fn connection(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(RedisServer::url).collect();
        redis::cluster::ClusterClient::new(urls)
            .and_then(|client| client.get_connection())
            .expect("connect to the test cluster")
    }
}

/// How long the nodes may take to agree that every slot is served.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// A fresh three-node cluster, or `None` after a skip notice when `redis-server` or `redis-cli`
/// is not installed.
///
/// # Panics
/// When either is missing and [`models_required`], or when the cluster does not form.
pub fn start_redis_cluster() -> Option<RedisCluster> {
    let installed = |program: &str| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if !installed("redis-server") || !installed("redis-cli") {
        assert!(
            !models_required(),
            "redis-server and redis-cli are required by this test (apt-get install -y redis-server)"
        );
        eprintln!("skipped: redis-server or redis-cli is not installed");
        return None;
    }
    let config = "--cluster-config-file";
    let nodes = (0..3)
        .map(|_| try_start_with(&["--cluster-enabled", "yes", config, "nodes.conf"]))
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|error| panic!("a cluster node did not start: {error}"));
    let addresses: Vec<String> = nodes
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    let created = Command::new("redis-cli")
        .arg("--cluster")
        .arg("create")
        .args(&addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("redis-cli runs");
    assert!(
        created.status.success(),
        "redis-cli --cluster create failed: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    // Each node must see the whole cluster before a client can route every slot.
    let started = Instant::now();
    for node in &nodes {
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut node.connection())
                .unwrap_or_default();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(
                started.elapsed() < CLUSTER_TIMEOUT,
                "the cluster did not form in {CLUSTER_TIMEOUT:?}: {info}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Some(RedisCluster { nodes })
}
