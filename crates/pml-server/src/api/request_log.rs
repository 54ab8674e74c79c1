//! One log line per request, at `info`, as llama.cpp's server writes them: method, path, client,
//! status, time until the response's last byte, and the tokens a completion counted. The line is
//! written when the response body ends (a stream's last event, or the client leaving), so a
//! streamed answer's line holds its whole time and every token it sent; it is written before
//! the response's last bytes are sent.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

use crate::engine::DraftCounts;

/// The tokens a completion handler counted for its request's log line; handlers find it among
/// the request's extensions (absent where the router runs without this layer, as in tests).
#[derive(Clone, Debug, Default)]
pub struct TokenCounts(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    counted: AtomicBool,
    prompt: AtomicUsize,
    cached: AtomicUsize,
    completion: AtomicUsize,
    drafted: AtomicUsize,
    accepted: AtomicUsize,
}

impl TokenCounts {
    /// The prompt's tokens, and how many of them came from a cache.
    pub fn prompt(&self, prompt_tokens: usize, cached_tokens: usize) {
        self.0.prompt.store(prompt_tokens, Ordering::Relaxed);
        self.0.cached.store(cached_tokens, Ordering::Relaxed);
        self.0.counted.store(true, Ordering::Relaxed);
    }

    /// The answer's tokens and drafts so far (every choice's).
    pub fn completion(&self, completion_tokens: usize, drafts: DraftCounts) {
        let counts = &self.0;
        counts
            .completion
            .store(completion_tokens, Ordering::Relaxed);
        counts.drafted.store(drafts.drafted, Ordering::Relaxed);
        counts.accepted.store(drafts.accepted, Ordering::Relaxed);
    }

    fn describe(&self) -> Option<String> {
        let counts = &self.0;
        counts.counted.load(Ordering::Relaxed).then(|| {
            let drafted = counts.drafted.load(Ordering::Relaxed);
            // Only answers that speculated say so: most lines stay as llama.cpp's.
            let drafts = if drafted > 0 {
                format!(
                    " drafted_tokens={drafted} accepted_tokens={}",
                    counts.accepted.load(Ordering::Relaxed)
                )
            } else {
                String::new()
            };
            format!(
                " prompt_tokens={} cached_tokens={} completion_tokens={}{drafts}",
                counts.prompt.load(Ordering::Relaxed),
                counts.cached.load(Ordering::Relaxed),
                counts.completion.load(Ordering::Relaxed)
            )
        })
    }
}

/// The middleware: hands the handler a [`TokenCounts`] and logs the request once its response
/// body is done.
pub async fn log_requests(mut request: Request, next: Next) -> Response {
    let line = LogLine {
        started: Instant::now(),
        method: request.method().clone(),
        path: request.uri().path().to_owned(),
        client: request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| *addr),
        status: StatusCode::OK,
        tokens: TokenCounts::default(),
    };
    request.extensions_mut().insert(line.tokens.clone());
    // Dropped with this future when the client leaves before the handler answers: written
    // then, as the client's leaving.
    let mut pending = Unanswered(Some(line));
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    let Some(line) = pending.0.take() else {
        return Response::from_parts(parts, body);
    };
    let line = LogLine {
        status: parts.status,
        ..line
    };
    Response::from_parts(
        parts,
        Body::new(LoggedBody {
            inner: body,
            line: Some(line),
        }),
    )
}

#[derive(Debug)]
struct LogLine {
    started: Instant,
    method: Method,
    path: String,
    client: Option<SocketAddr>,
    status: StatusCode,
    tokens: TokenCounts,
}

impl LogLine {
    fn write(self, ended: &str) {
        let client = self
            .client
            .map_or_else(String::new, |addr| format!(" {}", addr.ip()));
        tracing::info!(
            "{} {}{} {} {:.1} ms{}{ended}",
            self.method,
            self.path,
            client,
            self.status.as_u16(),
            self.started.elapsed().as_secs_f64() * 1e3,
            self.tokens.describe().unwrap_or_default(),
        );
    }
}

/// The line of a request whose handler has not answered yet.
struct Unanswered(Option<LogLine>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(line) = self.0.take() {
            // 499, as nginx logs a request its client closed.
            let status = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
            LogLine { status, ..line }.write(" (client gone)");
        }
    }
}

/// A response body that writes its request's line when it ends or is dropped.
struct LoggedBody {
    inner: Body,
    line: Option<LogLine>,
}

impl http_body::Body for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(context);
        // Written before the last bytes go out, so a client holding the whole response finds
        // the line in the log.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => http_body::Body::is_end_stream(&self.inner),
            Poll::Ready(Some(Err(_))) | Poll::Pending => false,
        };
        if ended && let Some(line) = self.line.take() {
            line.write("");
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            // A body dropped before its end (the client left), or one never polled (empty).
            let ended = if http_body::Body::is_end_stream(&self.inner) {
                ""
            } else {
                " (client gone)"
            };
            line.write(ended);
        }
    }
}
