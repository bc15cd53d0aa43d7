//! The HTTP listener: haul's own accept loop rather than `axum::serve`, because the API
//! faces the internet and every connection a stranger opens must cost a bounded amount
//! for a bounded time. `axum::serve` has no header, body or idle timeout, no cap on
//! connections, and its graceful shutdown waits for every connection to finish.
//!
//! What a connection that sends nothing useful costs: one descriptor, one small task and
//! a read buffer of at most [`MAX_HEAD_BYTES`], for at most `server.header_read_timeout`
//! (hyper runs that clock whenever a connection waits for a request head, so it also
//! ends idle keep-alive connections). A body that stops coming costs the same for at
//! most `server.body_read_timeout` (the body extractor's clock, `ApiBody`, which answers
//! 408). At most `server.max_connections` are open at once: a connection past the cap is
//! answered 503 without waiting and closed at once, before a task or a buffer is spent on
//! it. At start the soft limit of open files is raised to the hard one, and the cap
//! lowered to what that limit leaves after [`RESERVED_FDS`] for everything else.
//!
//! Shutdown stops accepting at once. A connection with no request in the service (idle,
//! or a head still arriving) is closed within [`IDLE_CLOSE_GRACE`], time to finish
//! writing an answer; one whose request is being served gets until [`SHUTDOWN_DRAIN`],
//! and a body read still waiting on its client ends at once with 503 (`ApiBody`). A
//! request cut short is safe to send again: events are deduplicated by their id.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use haul_config::ServerConfig;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower_service::Service;
use tracing::{info, warn};

/// Largest request head (request line and headers) read; past it hyper answers 431. It
/// also bounds the read buffer every connection holds.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Descriptors kept back from the connection cap: the store's pool, SQLite's files, the
/// channels' and the model's HTTP connections, logs, the runtime's own.
pub const RESERVED_FDS: u64 = 128;

/// How long shutdown waits for a connection with no request being served (an answer
/// still being written) before closing it.
pub const IDLE_CLOSE_GRACE: Duration = Duration::from_millis(250);

/// How long shutdown waits for requests being served before their connections are
/// closed; well inside the process's own ten seconds.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// How long the accept loop waits after a failed accept (out of descriptors): long
/// enough not to spin, short enough to take connections again soon after.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Fewest seconds between two warnings about failed accepts.
const ACCEPT_WARNING_EVERY: Duration = Duration::from_secs(10);

/// What bounds the connections of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most; past it a new one is answered 503 and closed.
    pub max_connections: usize,
    /// How long a request head may take to arrive, and an idle connection may wait for one.
    pub header_read_timeout: Duration,
}

impl ConnectionLimits {
    /// The settings' limits, the cap lowered to what `open_files_limit` (the process's
    /// soft limit, when known) leaves after [`RESERVED_FDS`].
    pub fn new(server: &ServerConfig, open_files_limit: Option<u64>) -> Self {
        let max_connections = match open_files_limit {
            None => server.max_connections,
            Some(limit) => {
                // A tiny limit still leaves half of itself to connections.
                let room = limit.saturating_sub(RESERVED_FDS).max(limit / 2).max(1);
                server.max_connections.min(usize::try_from(room).unwrap_or(usize::MAX))
            }
        };
        ConnectionLimits { max_connections, header_read_timeout: server.header_read_timeout }
    }
}

/// Raises the soft limit of open files to the hard one, and returns the soft limit in
/// force (`None` where there is no such limit).
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        match rlimit::increase_nofile_limit(u64::MAX) {
            Ok(soft) => Some(soft),
            Err(e) => {
                warn!(error = %e, "cannot raise the limit of open files");
                rlimit::getrlimit(rlimit::Resource::NOFILE).ok().map(|(soft, _)| soft)
            }
        }
    }
    #[cfg(not(unix))]
    None
}

/// Serves `app` on `listener` within `limits` until `stop` resolves, then closes every
/// connection within [`SHUTDOWN_DRAIN`] (a second more for the stragglers).
pub async fn serve_http(listener: TcpListener, app: Router, limits: ConnectionLimits, stop: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut warned_at: Option<Instant> = None;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        connections.spawn(serve_connection(stream, app.clone(), limits, closing.clone(), slot));
                    }
                    Err(_) => refuse(stream),
                },
                Err(e) => {
                    if warned_at.is_none_or(|t| t.elapsed() >= ACCEPT_WARNING_EVERY) {
                        warn!(error = %e, "accepting a connection failed; pausing briefly");
                        warned_at = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_DRAIN + Duration::from_secs(1), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        info!(connections = connections.len(), "closing connections still open after the shutdown drain");
        connections.abort_all();
    }
}

/// One connection: HTTP/1.1 with the head timeout, until the client leaves, a timeout
/// ends it, or shutdown does.
async fn serve_connection(
    stream: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let _open = Gauge::open();
    let _ = stream.set_nodelay(true);
    // Requests in the service right now: what shutdown waits for, and only that.
    let in_service = Arc::new(AtomicUsize::new(0));
    let service = {
        let in_service = in_service.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let serving = InService::enter(&in_service);
            let answer = app.clone().call(req.map(Body::new));
            async move {
                let answer: Result<_, Infallible> = answer.await;
                drop(serving);
                answer
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(MAX_HEAD_BYTES);
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        // Done, the client gone, or a timeout: nothing more to do either way.
        _ = conn.as_mut() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    let grace = if in_service.load(Ordering::Acquire) == 0 { IDLE_CLOSE_GRACE } else { SHUTDOWN_DRAIN };
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(grace, conn).await;
}

/// Counts a request into the service and out of it (also when its future is dropped).
struct InService(Arc<AtomicUsize>);

impl InService {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        InService(count.clone())
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `haul_http_connections_open`, up while a connection is served.
struct Gauge;

impl Gauge {
    fn open() -> Self {
        metrics::gauge!("haul_http_connections_open").increment(1.0);
        Gauge
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        metrics::gauge!("haul_http_connections_open").decrement(1.0);
    }
}

/// The answer to a connection past the cap.
fn refusal() -> String {
    let body = r#"{"error":{"code":"too_many_connections","message":"too many open connections; try again shortly"}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         retry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Answers 503 without waiting (a fresh socket's send buffer takes it whole) and closes:
/// a connection past the cap gets neither a task nor a buffer.
fn refuse(stream: TcpStream) {
    metrics::counter!("haul_http_connections_refused_total").increment(1);
    if let Ok(socket) = stream.into_std() {
        let _ = (&socket).write(refusal().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(max_connections: usize, open_files_limit: Option<u64>, expected: usize) {
        let server = ServerConfig { max_connections, ..ServerConfig::default() };
        let got = ConnectionLimits::new(&server, open_files_limit).max_connections;
        assert_eq!(got, expected, "max_connections {max_connections}, open files limit {open_files_limit:?}");
    }

    #[test]
    fn the_cap_leaves_descriptors_for_the_rest() {
        check(1024, None, 1024);
        check(1024, Some(1_048_576), 1024);
        check(1024, Some(1024), 896);
        check(1024, Some(256), 128);
        check(1024, Some(100), 50);
        check(1024, Some(1), 1);
        check(64, Some(256), 64);
    }

    #[test]
    fn the_refusal_is_one_whole_json_answer() {
        let r = refusal();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
