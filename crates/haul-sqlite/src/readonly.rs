//! A SQLite database opened read-only (`mode=ro`), for tools that must never write to
//! a store: `haul replay` and `haul export-scenario` read logs through it.
//!
//! Opened `SQLITE_OPEN_READ_ONLY` with the URI's `mode=ro`, never created (a missing file
//! is an error, not a new empty database), and never migrated: a schema older than the
//! log's tables is refused. One connection, used by one read at a time on tokio's
//! blocking threads.
//!
//! A WAL database's readers share its `-shm` index, and SQLite makes the `-shm` and
//! `-wal` files for a reader when they are missing (and leaves them). They are missing
//! only when no process has the database open, so then it is opened `immutable=1` too:
//! no lock, no file made, the database file read as it is. With a writer running, the
//! files exist and the reader goes through WAL as every reader does.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use haul_core::ids::LoadId;
use haul_core::projection::Record;
use haul_store::backend::{load_id_row, record_row, shadow_row};
use haul_store::{LoadSelection, LogReader, ShadowCursor, ShadowDecision, StoreError, columns};
use rusqlite::{Connection, OpenFlags};

use crate::db;
use crate::impls::rows;

/// The logs of a SQLite database, read-only.
#[derive(Clone)]
pub struct ReadOnlyLog {
    conn: Arc<Mutex<Connection>>,
}

/// `file:` URI of a path, with `mode=ro` (and `immutable=1` when no process has it
/// open: no `-wal` beside it); `%`, `?` and `#` escaped.
fn uri(path: &Path) -> String {
    let p = path.to_string_lossy().replace('%', "%25").replace('?', "%3f").replace('#', "%23");
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let idle = path.exists() && !Path::new(&wal).exists();
    format!("file:{p}?mode=ro{}", if idle { "&immutable=1" } else { "" })
}

impl ReadOnlyLog {
    /// Opens the database at `path` read-only. The file must exist and hold haul's log.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(uri(path), flags)
            .map_err(|e| StoreError::new(format!("cannot open SQLite database {} read-only: {e}", path.display())))?;
        conn.execute_batch("PRAGMA busy_timeout = 5000; PRAGMA query_only = ON;").map_err(db)?;
        conn.set_prepared_statement_cache_capacity(crate::STATEMENT_CACHE);
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('events', 'loads')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| StoreError::new(format!("{} is not a SQLite database: {e}", path.display())))?;
        if tables != 2 {
            return Err(StoreError::new(format!(
                "{} holds no haul log (run haul migrate on it first)",
                path.display()
            )));
        }
        Ok(ReadOnlyLog { conn: Arc::new(Mutex::new(conn)) })
    }

    /// Opens the file a `sqlite://PATH` store URL names.
    pub fn open_url(url: &str) -> Result<Self, StoreError> {
        let config = crate::SqliteConfig::from_url(url)?;
        let path: PathBuf = config
            .path
            .ok_or_else(|| StoreError::new("an in-memory SQLite database has no log to read (name a file)"))?;
        Self::open(&path)
    }

    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || f(&conn.lock().unwrap_or_else(|p| p.into_inner())))
            .await
            .unwrap_or_else(|e| Err(StoreError::new(format!("a read did not finish: {e}"))))
    }
}

#[async_trait]
impl LogReader for ReadOnlyLog {
    async fn select_loads(
        &self,
        filter: &LoadSelection,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<Vec<LoadId>, StoreError> {
        let after = after.map(|a| a.to_string()).unwrap_or_default();
        let since = filter.since.map(haul_core::time::to_ms);
        let client = filter.client.clone();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn| {
            rows(
                conn,
                "SELECT load_id FROM loads WHERE load_id > ?1
                   AND (?2 IS NULL OR updated_at >= ?2)
                   AND (?3 IS NULL OR EXISTS (SELECT 1 FROM events e WHERE e.load_id = loads.load_id
                        AND e.kind = 'load_update' AND json_valid(e.payload) AND json_extract(e.payload, '$.client') = ?3))
                 ORDER BY load_id LIMIT CAST(?4 AS INTEGER)",
                rusqlite::params![after, since, client, limit],
                load_id_row,
            )
        })
        .await
    }

    async fn read_log_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        let (load, limit) = (load_id.to_string(), i64::try_from(limit).unwrap_or(i64::MAX));
        self.run(move |conn| {
            rows(
                conn,
                concat!(
                    "SELECT ",
                    columns!(record_read_only),
                    " FROM events WHERE load_id = CAST(?1 AS TEXT) AND seq > ?2 ORDER BY seq LIMIT CAST(?3 AS INTEGER)"
                ),
                rusqlite::params![load, after_seq as i64, limit],
                record_row,
            )
        })
        .await
    }

    async fn read_shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError> {
        let params = (load_id.to_string(), after.event_seq as i64, after.shadow.clone(), limit_i64(limit));
        self.run(move |conn| {
            rows(conn, crate::impls::SHADOW_PAGE, params, shadow_row).map_err(|e| {
                if e.0.contains("no such table") {
                    StoreError::new("this store has no shadow decisions table: run haul migrate on it (migration 10)")
                } else {
                    e
                }
            })
        })
        .await
    }
}

fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}
