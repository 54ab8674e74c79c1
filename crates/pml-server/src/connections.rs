//! Accepting HTTP/1 connections and serving the router on each, as `axum::serve` does, with what
//! it leaves out: deadlines for a request's headers and for its body (a client that sends either
//! a byte at a time must not hold a connection or a handler), a bound on the connections open at
//! once, answers to clients that half-close after sending their request (`curl --data … | nc
//! -N` style) while a client that closes later, mid-answer, has its request cancelled, and each
//! request tagged with its client's address for the request log. A shutdown stops accepting,
//! then waits for the open connections to finish their responses.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::Request;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;
use tower::ServiceExt;

/// After an accept that failed for want of resources (too many open files), the wait before the
/// next, so the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// While a request's client has sent bytes the server has not read yet, how often the watch for
/// its leaving looks again.
const UNREAD_BYTES_RECHECK: Duration = Duration::from_millis(50);

/// How long a connection refused for the bound may take to receive its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a connection is allowed.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// To send a request's headers.
    pub header_read_timeout: Duration,
    /// To send a request's body, from its headers on.
    pub body_read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// A read side closed within this long of the client's last bytes is a half-close.
    pub half_close_window: Duration,
}

/// The error a request body gives when its client took longer than its deadline to send it.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// The service's error when the client went away before its answer was ready: hyper closes the
/// connection, and the handler (and with it the engine's work) is dropped.
#[derive(Debug, thiserror::Error)]
#[error("the client closed the connection before its answer")]
struct ClientGone;

/// Serves `router` on `listener` until `stop` completes, then waits for the open connections.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let mut stop = pin!(stop);
    loop {
        let (stream, client) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // A connection reset before it was accepted concerns that client alone.
                    if !is_connection_error(&error) {
                        tracing::warn!("accepting a connection failed: {error}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tracing::warn!(
                "refused a connection from {client}: {} are open (the server's bound)",
                limits.max_connections
            );
            tokio::spawn(refuse(stream));
            continue;
        };
        let io = WatchedIo::new(stream);
        let watched = io.clone();
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let mut request =
                request.map(|body| Body::new(DeadlineBody::new(body, limits.body_read_timeout)));
            request.extensions_mut().insert(ConnectInfo(client));
            let answered = router.clone().oneshot(request);
            let gone = client_gone(watched.clone(), limits.half_close_window);
            async move {
                tokio::select! {
                    response = answered => Ok(response.unwrap_or_else(|never| match never {})),
                    () = gone => Err(ClientGone),
                }
            }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .half_close(true)
            .serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("connection from {client}: {error}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answers a connection over the bound with 503, OpenAI-shaped, and closes it.
async fn refuse(mut stream: TcpStream) {
    let body = serde_json::json!({"error": {
        "message": "the server has as many connections open as it takes: try again in a moment",
        "type": "overloaded_error",
        "param": null,
        "code": "too_many_connections",
    }})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: \
         1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

fn is_connection_error(error: &io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// A connection's stream, shared between hyper (reading and writing through it) and the
/// watchers of its requests ([`client_gone`]), with the time of the last bytes read.
#[derive(Clone)]
struct WatchedIo {
    stream: Arc<TcpStream>,
    last_bytes: Arc<Mutex<Instant>>,
}

impl WatchedIo {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream: Arc::new(stream),
            last_bytes: Arc::new(Mutex::new(Instant::now())),
        }
    }

    fn since_last_bytes(&self) -> Duration {
        self.last_bytes
            .lock()
            .map_or(Duration::ZERO, |last| last.elapsed())
    }
}

/// Resolves when the client of `io` has gone while one of its requests is answered. A client
/// that half-closed after its request (its read side ended within `window` of its last bytes)
/// is not gone, nor is one that sent more (a pipelined request): neither can be told from a
/// client that left until the server writes, and a non-streaming answer writes only at its end,
/// so the socket is watched for its end instead.
async fn client_gone(io: WatchedIo, window: Duration) {
    let mut byte = [0u8; 1];
    loop {
        match io.stream.peek(&mut byte).await {
            Ok(0) if io.since_last_bytes() > window => return,
            // Half-closed: it reads the answer.
            Ok(0) => return std::future::pending().await,
            // Bytes hyper has not read yet (the body, or the next request): looked at again
            // once it may have.
            Ok(_) => tokio::time::sleep(UNREAD_BYTES_RECHECK).await,
            Err(_) => return,
        }
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(context))?;
            match self.stream.try_read(buf.initialize_unfilled()) {
                Ok(read) => {
                    if read > 0
                        && let Ok(mut last) = self.last_bytes.lock()
                    {
                        *last = Instant::now();
                    }
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(context))?;
            match self.stream.try_write(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(context))?;
            match self.stream.try_write_vectored(bufs) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = socket2::SockRef::from(&*self.stream).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match shut {
            Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        })
    }
}

/// A request body that fails with [`BodyTimedOut`] when it is not all received within its
/// deadline (counted from the request's headers).
struct DeadlineBody {
    inner: Incoming,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl DeadlineBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(context) {
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        if self.deadline.as_mut().poll(context).is_ready() {
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}
