//! Wake-ups across processes: `LISTEN`/`NOTIFY` carries the in-process wake-ups (a
//! publish wakes the worker; a commit with outbox rows wakes the dispatcher) between
//! processes that run different roles on one database.
//!
//! Only what crosses a process boundary is bridged: a process that publishes but runs no
//! worker forwards its worker wake-ups as a `NOTIFY`, and a process that runs a worker
//! `LISTEN`s for them (the same for the dispatcher). A process running every role
//! bridges nothing and pays nothing. Polling stays the fallback: a wake-up lost while the
//! connection is down costs at most one poll interval, and every reconnect wakes the
//! local side once to catch up.
//!
//! `NOTIFY` is sent after the publishing transaction committed, on the bridge's own
//! connection, and coalesced: any number of local wake-ups while one `NOTIFY` is in
//! flight become one more. So the store's transactions never take PostgreSQL's global
//! notify-queue lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};
use tracing::{info, warn};

/// Which wake-up a link carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// Something was published to the load queue: a worker has work.
    Work,
    /// A commit made outbox rows: a dispatcher has work.
    Dispatch,
}

impl Wake {
    fn name(self) -> &'static str {
        match self {
            Wake::Work => "work",
            Wake::Dispatch => "dispatch",
        }
    }
}

/// Which way a link carries its wake-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Local wake-ups become a `NOTIFY` (nobody in this process waits for them).
    Forward,
    /// A `NOTIFY` from another process wakes the local side.
    Listen,
}

#[derive(Clone)]
pub struct Link {
    pub wake: Wake,
    pub direction: Direction,
    pub local: Arc<Notify>,
}

/// Longest wait between reconnects.
const RECONNECT_CAP: Duration = Duration::from_secs(30);

/// Runs the bridge for `links` on the store at `url` until the task is dropped or
/// aborted. Channels are named per schema, so deployments (and tests) sharing one
/// database do not wake each other.
pub async fn bridge(url: String, links: Vec<Link>) {
    if links.is_empty() {
        return;
    }
    let mut backoff = Duration::from_millis(250);
    loop {
        let Err(e) = run(&url, &links).await;
        warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "wake-ups across processes: connection lost; polling meanwhile");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RECONNECT_CAP);
    }
}

fn channel(schema: &str, wake: Wake) -> String {
    format!("haul_{}:{schema}", wake.name())
}

/// One connection's life: `LISTEN`, wake the listeners once (what was missed while
/// down), then forward and receive until the connection fails.
async fn run(url: &str, links: &[Link]) -> Result<std::convert::Infallible, String> {
    let mut pg: tokio_postgres::Config = url.parse().map_err(|e| format!("bad PostgreSQL url: {e}"))?;
    pg.connect_timeout(Duration::from_secs(5));
    let (client, mut conn) = pg.connect(NoTls).await.map_err(|e| e.to_string())?;
    let (notes_tx, mut notes_rx) = tokio::sync::mpsc::channel::<String>(64);
    let (dead_tx, mut dead_rx) = tokio::sync::oneshot::channel::<String>();
    // The connection is driven here: query answers and notifications both come through it.
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    // A full channel means a wake-up is already pending: this one adds nothing.
                    let _ = notes_tx.try_send(n.channel().to_owned());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let _ = dead_tx.send(e.to_string());
                    return;
                }
                None => {
                    let _ = dead_tx.send("connection closed".into());
                    return;
                }
            }
        }
    });
    let _driver = AbortOnDrop(driver);
    let schema: String =
        client.query_one("SELECT current_schema()", &[]).await.and_then(|r| r.try_get(0)).map_err(|e| e.to_string())?;
    let mut listening = Vec::new();
    for l in links.iter().filter(|l| l.direction == Direction::Listen) {
        let ch = channel(&schema, l.wake);
        client.batch_execute(&format!("LISTEN \"{ch}\"")).await.map_err(|e| e.to_string())?;
        listening.push((ch, l.local.clone()));
        l.local.notify_one();
    }
    let forwards: Vec<(String, Arc<Notify>)> = links
        .iter()
        .filter(|l| l.direction == Direction::Forward)
        .map(|l| (channel(&schema, l.wake), l.local.clone()))
        .collect();
    info!(
        listen = %listening.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(","),
        forward = %forwards.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(","),
        "wake-ups across processes: on"
    );
    // One task per forwarded wake-up; each waits for its local signal and sends one NOTIFY.
    let client = Arc::new(client);
    let (fail_tx, mut fail_rx) = tokio::sync::mpsc::channel::<String>(1);
    let mut tasks = Vec::new();
    for (ch, local) in forwards {
        let (client, fail_tx) = (client.clone(), fail_tx.clone());
        tasks.push(AbortOnDrop(tokio::spawn(async move {
            // Prepared on the first wake-up, not parsed again for every one after it.
            let mut notify = None;
            loop {
                local.notified().await;
                let sent = async {
                    let stmt = match &notify {
                        Some(stmt) => stmt,
                        None => notify.insert(client.prepare("SELECT pg_notify($1, '')").await?),
                    };
                    client.execute(stmt, &[&ch]).await
                };
                if let Err(e) = sent.await {
                    let _ = fail_tx.send(e.to_string()).await;
                    return;
                }
            }
        })));
    }
    loop {
        tokio::select! {
            Some(ch) = notes_rx.recv() => {
                if let Some((_, local)) = listening.iter().find(|(c, _)| *c == ch) {
                    local.notify_one();
                }
            }
            Some(e) = fail_rx.recv() => return Err(e),
            e = &mut dead_rx => return Err(e.unwrap_or_else(|_| "connection task ended".into())),
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
