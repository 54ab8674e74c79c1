//! Accepting HTTP/1 connections and serving the router on each, as `axum::serve` does, with what
//! it leaves out: a deadline for a request's headers (a client that opens connections and sends
//! its headers a byte at a time must not hold them open), answers to clients that half-close
//! after sending their request (`curl --data … | nc -N` style), and each request tagged with its
//! client's address for the request log. A shutdown stops accepting, then waits for the open
//! connections to finish their responses.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// After an accept that failed for want of resources (too many open files), the wait before the
/// next, so the loop does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `router` on `listener` until `stop` completes, then waits for the open connections.
/// A client gets `header_read_timeout` to send a request's headers.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
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
        let router = router.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(ConnectInfo(client));
            router.clone().oneshot(request)
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .half_close(true)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!("connection from {client}: {error}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}
