//! Read-only connections: what every read-only method of the store runs on.
//!
//! The writer thread runs units one batch at a time, so a read queued there waits for
//! every write before it, a long one included (an fsync, a lock another process holds,
//! a batch of 64). In WAL mode readers never wait for the writer: each read sees the
//! last commit before it started. So reads go to a small pool of connections opened
//! `SQLITE_OPEN_READ_ONLY` (a read method that tried to write would fail, not write),
//! each used by one read at a time on tokio's blocking threads.
//!
//! A read issued after a write returned sees that write: the writer answers a unit
//! only after its `COMMIT`. An in-memory database is private to its one connection,
//! so it has no readers and its reads stay on the writer.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Mutex};

use haul_store::StoreError;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

/// Read connections per store: reads at once. More than the cores of the machines haul
/// runs on (a read mostly waits for the disk), few enough to keep file handles and page
/// caches small.
pub const READERS: usize = 4;

pub(crate) struct Readers {
    idle: Arc<Mutex<Vec<Connection>>>,
    /// One permit per idle connection: a read waits here, not on the mutex.
    permits: Arc<Semaphore>,
}

impl Readers {
    /// Opens `count` read-only connections to the database at `path`, which the writer
    /// has already opened (and put in WAL mode).
    pub(crate) fn open(path: &Path, count: usize) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conns = (0..count)
            .map(|_| {
                let conn = Connection::open_with_flags(path, flags)?;
                // A reader waits for a lock only while the WAL index is rebuilt.
                conn.execute_batch("PRAGMA busy_timeout = 5000;")?;
                conn.set_prepared_statement_cache_capacity(crate::STATEMENT_CACHE);
                Ok(conn)
            })
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| StoreError::new(format!("cannot open a read connection to {}: {e}", path.display())))?;
        Ok(Readers { permits: Arc::new(Semaphore::new(conns.len())), idle: Arc::new(Mutex::new(conns)) })
    }

    /// Runs `f` on an idle read connection, waiting (asynchronously) for one.
    pub(crate) async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let closed = |_| E::from(StoreError::new("the SQLite read connections are closed"));
        let permit = self.permits.clone().acquire_owned().await.map_err(closed)?;
        let idle = self.idle.clone();
        // The closure gives its connection back itself: a caller that stops waiting
        // (a dropped request) must not take the connection with it.
        let task = tokio::task::spawn_blocking(move || {
            let lock = || idle.lock().unwrap_or_else(|p| p.into_inner());
            let conn = lock().pop().ok_or_else(|| E::from(StoreError::new("no idle SQLite read connection")))?;
            let out = catch_unwind(AssertUnwindSafe(|| f(&conn)));
            lock().push(conn);
            drop(permit);
            out.unwrap_or_else(|_| Err(E::from(StoreError::new("a store read panicked"))))
        });
        task.await.unwrap_or_else(|e| Err(E::from(StoreError::new(format!("a store read did not finish: {e}")))))
    }
}
