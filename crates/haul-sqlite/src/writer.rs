//! The writer thread: the only owner of the connection.
//!
//! Units wait in a bounded channel; the thread takes up to `MAX_BATCH` of them per
//! transaction. Each unit runs in a savepoint and gets its answer only after the
//! `COMMIT`, so nobody sees a success that a failed commit undid.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

use haul_store::StoreError;
use rusqlite::Connection;
use tokio::sync::oneshot;

/// Units per transaction at most: bounds the work one commit can lose to a failure
/// and the latency the first unit of a batch waits.
pub const MAX_BATCH: usize = 64;
/// Units waiting for the thread at most; callers wait (asynchronously) beyond it.
const QUEUE_LEN: usize = 4096;

trait Unit: Send {
    /// Runs inside the unit's savepoint; true keeps its changes.
    fn run(&mut self, conn: &Connection) -> bool;
    /// Answers the caller once the transaction ended.
    fn finish(self: Box<Self>, commit: Result<(), StoreError>);
}

struct Typed<T, E, F> {
    f: Option<F>,
    out: Option<Result<T, E>>,
    reply: oneshot::Sender<Result<T, E>>,
}

impl<T, E, F> Unit for Typed<T, E, F>
where
    T: Send,
    E: From<StoreError> + Send,
    F: FnOnce(&Connection) -> Result<T, E> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let Some(f) = self.f.take() else { return false };
        // A panicking unit must not take the thread (and every other caller) down.
        let out = catch_unwind(AssertUnwindSafe(|| f(conn)))
            .unwrap_or_else(|_| Err(E::from(StoreError::new("a store operation panicked; it was rolled back"))));
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn finish(self: Box<Self>, commit: Result<(), StoreError>) {
        let out = match (self.out, commit) {
            (Some(Ok(_)), Err(e)) => Err(E::from(e)),
            (Some(out), _) => out,
            (None, Err(e)) => Err(E::from(e)),
            (None, Ok(())) => Err(E::from(StoreError::new("store operation did not run"))),
        };
        let _ = self.reply.send(out);
    }
}

#[derive(Clone)]
pub(crate) struct Writer {
    tx: mpsc::SyncSender<Box<dyn Unit>>,
}

impl Writer {
    pub(crate) fn spawn(conn: Connection) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Box<dyn Unit>>(QUEUE_LEN);
        std::thread::Builder::new()
            .name("haul-sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx))
            .expect("spawning the SQLite writer thread");
        Writer { tx }
    }

    /// Runs `f` on the writer thread inside a transaction (shared with other units).
    pub(crate) async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let mut unit: Box<dyn Unit> = Box::new(Typed { f: Some(f), out: None, reply });
        // A full channel means the thread is behind: wait for room without blocking
        // the async runtime.
        loop {
            match self.tx.try_send(unit) {
                Ok(()) => break,
                Err(mpsc::TrySendError::Full(u)) => {
                    unit = u;
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    return Err(E::from(StoreError::new("the SQLite writer thread has stopped")));
                }
            }
        }
        rx.await.unwrap_or_else(|_| Err(E::from(StoreError::new("the SQLite writer thread dropped a unit"))))
    }
}

fn writer_loop(conn: Connection, rx: mpsc::Receiver<Box<dyn Unit>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(u) => batch.push(u),
                Err(_) => break,
            }
        }
        let commit = run_batch(&conn, &mut batch);
        for unit in batch {
            unit.finish(commit.clone());
        }
    }
}

fn run_batch(conn: &Connection, batch: &mut [Box<dyn Unit>]) -> Result<(), StoreError> {
    // Through the statement cache: these four run for every unit, and parsing them
    // each time (`execute_batch`) was a tenth of the writer thread's instructions.
    let sql = |s: &str| conn.prepare_cached(s).and_then(|mut st| st.execute([])).map(drop).map_err(crate::db);
    sql("BEGIN IMMEDIATE")?;
    let result = (|| {
        for unit in batch.iter_mut() {
            sql("SAVEPOINT unit")?;
            if unit.run(conn) {
                sql("RELEASE unit")?;
            } else {
                sql("ROLLBACK TO unit")?;
                sql("RELEASE unit")?;
            }
        }
        sql("COMMIT")
    })();
    if result.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}
