//! The HTTP listener: haul's own accept loop rather than `axum::serve`, because the API
//! faces the internet and every connection a stranger opens must cost a bounded amount
//! for a bounded time. `axum::serve` has no header, body, write or idle timeout, no cap
//! on connections, and its graceful shutdown waits for every connection to finish.
//!
//! What a connection that sends nothing useful costs: one descriptor, one small task and
//! a read buffer of at most [`MAX_HEAD_BYTES`], for at most `server.header_read_timeout`
//! (hyper runs that clock whenever a connection waits for a request head, so it also
//! ends idle keep-alive connections). A body that stops coming costs the same for at
//! most `server.body_read_timeout` (the body extractor's clock, `ApiBody`, which answers
//! 408). A client that stops reading its answers costs the same for at most
//! `server.write_timeout`: a write that makes no progress that long closes the
//! connection ([`Guarded`]), and while an answer is unsent nothing more is read from
//! it, so pipelined requests wait in the socket, not in haul (read ahead at most the
//! [`MAX_HEAD_BYTES`] buffer).
//!
//! At most `server.max_connections` are open at once. A stranger holds no slot: when
//! every slot is taken, a new connection takes the one of the connection that has had
//! no request in the service for longest (idle, sending a head, or not reading its
//! answer), once that is at least [`EVICTABLE_AFTER`]; only when every connection is
//! serving a request (or became idle just now) is the new one answered 503 at once and
//! closed, before a task or a buffer is spent on it. At start the soft limit of open
//! files is raised to the hard one, and the cap lowered to what that limit leaves after
//! [`RESERVED_FDS`] for everything else.
//!
//! Shutdown stops accepting at once. A connection with no request in the service (idle,
//! or a head still arriving) is closed within [`IDLE_CLOSE_GRACE`], time to finish
//! writing an answer; one whose request is being served gets until [`SHUTDOWN_DRAIN`],
//! and a body read still waiting on its client ends at once with 503 (`ApiBody`). A
//! request cut short is safe to send again: events are deduplicated by their id.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use haul_config::ServerConfig;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
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

/// How long a connection must have had no request in the service before a new
/// connection may take its slot when every slot is taken: long enough that a client
/// between two requests of a burst keeps its connection.
pub const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// How long a connection that took an evicted one's slot waits for the slot to come
/// free before it is refused after all.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

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
    /// How long a write of an answer may make no progress before the connection is closed.
    pub write_timeout: Duration,
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
        ConnectionLimits {
            max_connections,
            header_read_timeout: server.header_read_timeout,
            write_timeout: server.write_timeout,
        }
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
    let open = Arc::new(Open::default());
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut warned_at: Option<Instant> = None;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        connections.spawn(serve_connection(stream, peer, app.clone(), limits, closing.clone(), slot, open.clone()));
                    }
                    // Every slot is taken: the longest-idle connection makes room, if one
                    // has been idle long enough; the new one waits for its slot.
                    Err(_) if open.evict_one() => {
                        let (slots, app, closing, open) = (slots.clone(), app.clone(), closing.clone(), open.clone());
                        connections.spawn(async move {
                            match tokio::time::timeout(EVICTION_WAIT, slots.acquire_owned()).await {
                                Ok(Ok(slot)) => serve_connection(stream, peer, app, limits, closing, slot, open).await,
                                _ => refuse(stream),
                            }
                        });
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

/// The open connections as the accept loop sees them when the cap is reached.
struct Open {
    /// The clock of `Conn::idle_since_ms`.
    started: Instant,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Default for Open {
    fn default() -> Self {
        Open { started: Instant::now(), next_id: AtomicU64::new(0), conns: Mutex::new(HashMap::new()) }
    }
}

/// One open connection's state.
#[derive(Default)]
struct Conn {
    /// Requests in the service now.
    in_service: AtomicUsize,
    /// Since when (ms on `Open::started`'s clock) no request has been in the service:
    /// from the open, then from each request's end.
    idle_since_ms: AtomicU64,
    /// Chosen to make room; its task closes it.
    evicted: AtomicBool,
    evict: Notify,
}

impl Open {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection; it leaves when the guard drops.
    fn register(self: &Arc<Self>) -> (Arc<Conn>, Registered) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::default());
        conn.idle_since_ms.store(self.now_ms(), Ordering::Release);
        self.lock().insert(id, conn.clone());
        (conn, Registered { open: self.clone(), id })
    }

    /// Tells the connection with no request in the service for longest (at least
    /// [`EVICTABLE_AFTER`]) to close; false when there is none.
    fn evict_one(&self) -> bool {
        let now = self.now_ms();
        let conns = self.lock();
        let oldest = conns
            .values()
            .filter(|c| c.in_service.load(Ordering::Acquire) == 0 && !c.evicted.load(Ordering::Acquire))
            .map(|c| (c.idle_since_ms.load(Ordering::Acquire), c))
            .filter(|(since, _)| now.saturating_sub(*since) >= EVICTABLE_AFTER.as_millis() as u64)
            .min_by_key(|(since, _)| *since);
        let Some((_, conn)) = oldest else { return false };
        conn.evicted.store(true, Ordering::Release);
        conn.evict.notify_one();
        metrics::counter!("haul_http_connections_evicted_total").increment(1);
        true
    }
}

/// A connection's place in [`Open`], given up when it closes.
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

/// One connection: HTTP/1.1 with the head and write timeouts, until the client leaves,
/// a timeout ends it, a new connection takes its slot, or shutdown does.
async fn serve_connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    app: Router,
    limits: ConnectionLimits,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    open: Arc<Open>,
) {
    let _open = Gauge::open();
    let (conn_state, _registered) = open.register();
    let _ = stream.set_nodelay(true);
    let service = {
        let (conn_state, open) = (conn_state.clone(), open.clone());
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let serving = InService::enter(&conn_state, &open);
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
            let answer = app.clone().call(req);
            async move {
                let answer: Result<_, Infallible> = answer.await;
                drop(serving);
                answer
            }
        })
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout).max_buf_size(MAX_HEAD_BYTES);
    let io = Guarded::new(stream, limits.write_timeout);
    let conn = http.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        // Done, the client gone, or a timeout: nothing more to do either way.
        _ = conn.as_mut() => return,
        // Its slot went to a new connection: closed at once (dropping it closes the socket).
        () = conn_state.evict.notified() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    let grace = if conn_state.in_service.load(Ordering::Acquire) == 0 { IDLE_CLOSE_GRACE } else { SHUTDOWN_DRAIN };
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(grace, conn).await;
}

/// Counts a request into the service and out of it (also when its future is dropped);
/// the connection's idle clock starts again when its last request leaves.
struct InService {
    conn: Arc<Conn>,
    open: Arc<Open>,
}

impl InService {
    fn enter(conn: &Arc<Conn>, open: &Arc<Open>) -> Self {
        conn.in_service.fetch_add(1, Ordering::AcqRel);
        InService { conn: conn.clone(), open: open.clone() }
    }
}

impl Drop for InService {
    fn drop(&mut self) {
        self.conn.idle_since_ms.store(self.open.now_ms(), Ordering::Release);
        self.conn.in_service.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection's socket with a write timeout: a write (or flush) that makes no
/// progress for `write_timeout` fails, which closes the connection; and while a write
/// waits, nothing is read, so a client that sends requests without reading the
/// answers leaves them in the socket.
struct Guarded<T> {
    inner: T,
    write_timeout: Duration,
    /// Running while a write waits; reset by every write that goes through.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The read that waits for the write to go through.
    parked_read: Option<Waker>,
}

impl<T> Guarded<T> {
    fn new(inner: T, write_timeout: Duration) -> Self {
        Guarded { inner, write_timeout, stall: None, parked_read: None }
    }

    fn written<R>(&mut self, cx: &mut Context<'_>, r: Poll<std::io::Result<R>>) -> Poll<std::io::Result<R>> {
        match r {
            Poll::Ready(r) => {
                self.stall = None;
                if let Some(read) = self.parked_read.take() {
                    read.wake();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let timeout = self.write_timeout;
                let stall = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if stall.as_mut().poll(cx).is_ready() {
                    metrics::counter!("haul_http_write_timeouts_total").increment(1);
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing of the answer within server.write_timeout",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.stall.is_some() {
            this.parked_read = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.written(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.written(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.written(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.written(cx, r)
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
         x-content-type-options: nosniff\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
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
