//! Starting and stopping a server: the engine thread, then a tokio runtime on a thread of its
//! own serving the router on a bound listener. Shutdown (the handle, or Ctrl-C / SIGTERM when
//! the config asks) stops accepting connections and new completions, refuses the waiting ones,
//! gives running ones `ServerConfig::shutdown_grace` to finish — streams included — and cuts off
//! the rest (503, or an error event in a stream); then the engine stops.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use pml_runtime::inference::Runtime;
use tokio::sync::oneshot;

use crate::api::{AppState, router};
use crate::config::ServerConfig;
use crate::engine::schemas::SchemaInfo;
use crate::engine::{self, EngineHandle, EngineRequest, JobError};
use crate::incident::{Incident, error_chain, log_panics};
use crate::saved_schemas::SavedSchemas;

/// Why a server could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The OS's reason is the error's source, so a report of the chain says it once.
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the server's threads: {0}")]
    Threads(std::io::Error),
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
    #[error("a server thread panicked")]
    Panicked,
}

/// A running server.
#[derive(Debug)]
pub struct ServerHandle {
    addr: SocketAddr,
    restored: Vec<(PathBuf, Result<SchemaInfo, JobError>)>,
    shutdown: Option<oneshot::Sender<()>>,
    /// For [`ServerHandle::load_schema`]; dropped on shutdown so the engine can stop.
    engine_handle: Option<EngineHandle>,
    http: Option<JoinHandle<Result<(), ServerError>>>,
    engine: Option<JoinHandle<()>>,
}

/// Starts serving `runtime` on `addr` (port 0 picks a free port; see [`ServerHandle::addr`]).
pub fn start(
    runtime: Runtime,
    config: ServerConfig,
    addr: SocketAddr,
) -> Result<ServerHandle, ServerError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind { addr, source })?;
    let addr = listener
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServerError::Bind { addr, source })?;
    let (engine, engine_thread) = engine::spawn(runtime, &config).map_err(ServerError::Threads)?;
    let restored = match &config.saved_schemas {
        Some(folder) => restore_schemas(&engine, &SavedSchemas::new(folder)),
        None => Vec::new(),
    };
    let handle_signals = config.handle_signals;
    let grace = config.shutdown_grace;
    let limits = crate::connections::ConnectionLimits {
        header_read_timeout: config.header_read_timeout,
        body_read_timeout: config.body_read_timeout,
        max_connections: config.max_connections,
        half_close_window: config.half_close_window,
    };
    let engine_for_stop = engine.clone();
    let state = AppState {
        engine: engine.clone(),
        config: Arc::new(config),
        responses: Arc::default(),
        checks: Arc::default(),
        bound: addr,
    };
    let (shutdown, shutdown_requested) = oneshot::channel::<()>();
    let http = std::thread::Builder::new()
        .name("pml-http".to_string())
        .spawn(move || {
            log_panics("HTTP", move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(ServerError::Threads)?;
                runtime.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).map_err(ServerError::Serve)?;
                    let stop = async move {
                        if handle_signals {
                            tokio::select! {
                                _ = shutdown_requested => {}
                                _ = termination_signal() => {}
                            }
                        } else {
                            let _ = shutdown_requested.await;
                        }
                        // New work is refused from here; running work gets `grace` to finish.
                        tracing::info!("shutting down; running completions get {grace:?}");
                        engine_for_stop.begin_shutdown(grace);
                    };
                    crate::connections::serve(listener, router(state), limits, stop).await;
                    Ok(())
                })
            })
        })
        .map_err(ServerError::Threads)?;
    tracing::info!("listening on http://{addr}");
    Ok(ServerHandle {
        addr,
        restored,
        shutdown: Some(shutdown),
        engine_handle: Some(engine),
        http: Some(http),
        engine: Some(engine_thread),
    })
}

impl ServerHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The saved schemas loaded at start, each with its layout or why it was refused.
    pub fn restored_schemas(&self) -> &[(PathBuf, Result<SchemaInfo, JobError>)] {
        &self.restored
    }

    /// Stops accepting connections, waits for in-flight requests and the engine to finish.
    pub fn shutdown(mut self) -> Result<(), ServerError> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        self.join()
    }

    /// Loads a schema as an upload would, reading its `src=` includes from `sources_root`
    /// (the operator's own schemas, `--schemas DIR`), and waits for its layout (not its
    /// encoding, which follows in the background).
    pub fn load_schema(
        &self,
        source: String,
        sources_root: PathBuf,
    ) -> Result<SchemaInfo, JobError> {
        let stopped = || JobError::Internal(Incident::report("the engine has stopped"));
        let engine = self.engine_handle.as_ref().ok_or_else(stopped)?;
        let (reply, answer) = oneshot::channel();
        engine
            .send(EngineRequest::Upload {
                source,
                sources_root: Some(sources_root),
                reply,
            })
            .map_err(|_| stopped())?;
        answer.blocking_recv().map_err(|_| stopped())?
    }

    /// Waits until the server stops (by a signal, when the config handles them).
    pub fn join(mut self) -> Result<(), ServerError> {
        self.engine_handle = None;
        let served = match self.http.take() {
            Some(http) => http.join().map_err(|_| ServerError::Panicked)?,
            None => Ok(()),
        };
        // The router (and with it every engine handle) is gone: the engine drains and stops.
        if let Some(engine) = self.engine.take() {
            engine.join().map_err(|_| ServerError::Panicked)?;
        }
        served
    }
}

/// Loads every saved schema as an upload would (no `src=`); the engine encodes them in the
/// background. A folder that cannot be read is reported as one failure.
fn restore_schemas(
    engine: &EngineHandle,
    saved: &SavedSchemas,
) -> Vec<(PathBuf, Result<SchemaInfo, JobError>)> {
    let sources = match saved.load_all() {
        Ok(sources) => sources,
        Err(error) => {
            let folder = saved.folder().to_path_buf();
            let incident = Incident::report(format_args!(
                "reading the saved schemas in {}: {}",
                folder.display(),
                error_chain(&error)
            ));
            return vec![(folder, Err(JobError::Internal(incident)))];
        }
    };
    sources
        .into_iter()
        .map(|(path, source)| {
            let source = match source {
                Ok(source) => source,
                Err(error) => {
                    let incident = Incident::report(format_args!(
                        "reading the saved schema {}: {}",
                        path.display(),
                        error_chain(&error)
                    ));
                    return (path, Err(JobError::Internal(incident)));
                }
            };
            let (reply, answer) = oneshot::channel();
            let sent = engine.send(EngineRequest::Upload {
                source,
                sources_root: None,
                reply,
            });
            let result = match sent {
                Ok(()) => answer.blocking_recv().unwrap_or_else(|_| {
                    Err(JobError::Internal(Incident::report("the engine stopped")))
                }),
                Err(error) => Err(JobError::internal(error)),
            };
            (path, result)
        })
        .collect()
}

/// Ctrl-C, or SIGTERM on Unix.
async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
