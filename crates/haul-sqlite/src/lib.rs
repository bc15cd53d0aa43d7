//! The SQLite backend: one file (or memory), nothing to install.
//!
//! One thread owns the connection and runs every unit of work. It takes whatever
//! units are waiting (up to [`MAX_BATCH`]) and runs them in one `BEGIN IMMEDIATE`
//! transaction, each inside its own savepoint: a unit that fails rolls back to its
//! savepoint alone, and one commit (one fsync) serves the batch. That is group
//! commit: under load the hand-off and the fsync are shared by many units, with no
//! weaker durability than one transaction per unit.
//!
//! Reads do not queue behind the writes: in a file, every read-only method runs on
//! one of a few read-only connections ([`READERS`]), which WAL lets read beside the
//! writer. An in-memory database has only the writer's connection, and reads share it.

mod impls;
mod readers;
mod readonly;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use haul_store::StoreError;
use haul_store::backend::{
    Migration, Tokens, check_schema, latest_version, migration_failed, pending_migrations, readable_by,
};
use rusqlite::Connection;

pub use readers::READERS;
pub use readonly::ReadOnlyLog;
pub use writer::MAX_BATCH;

/// Prepared statements a connection keeps: more than the store has.
const STATEMENT_CACHE: usize = 128;

const MIGRATIONS: &[Migration] = &[
    Migration::new(1, include_str!("../migrations/0001_init.sql")),
    Migration::new(2, include_str!("../migrations/0002_deliveries.sql")),
    Migration::new(3, include_str!("../migrations/0003_outcome_published.sql")),
    Migration::new(4, include_str!("../migrations/0004_load_index.sql")),
    Migration::new(5, include_str!("../migrations/0005_retention.sql")),
    Migration::new(6, include_str!("../migrations/0006_message_sids.sql")),
    Migration::new(7, include_str!("../migrations/0007_ops_alerts.sql")),
    Migration::new(8, include_str!("../migrations/0008_operator_actions.sql")),
    Migration::new(9, include_str!("../migrations/0009_ops_queries.sql")),
    Migration::new(10, include_str!("../migrations/0010_shadow_decisions.sql")),
    Migration::new(11, include_str!("../migrations/0011_conflicts.sql")),
    // New tables only: a haul of schema 11 runs beside (it leaves them alone).
    Migration::new(12, include_str!("../migrations/0012_edge.sql")).readable_by(11),
    // New columns only: a haul of schema 12 runs beside (it never reads or writes them).
    Migration::new(13, include_str!("../migrations/0013_inbox.sql")).readable_by(12),
    // A new table only: a haul of schema 13 runs beside (it leaves it alone).
    Migration::new(14, include_str!("../migrations/0014_reassign_sms.sql")).readable_by(13),
    // A new table only: a haul of schema 14 runs beside (it leaves it alone).
    Migration::new(15, include_str!("../migrations/0015_send_rates.sql")).readable_by(14),
    Migration::new(16, include_str!("../migrations/0016_rate_changes.sql")).readable_by(15),
    // A new column only, written with COALESCE: a haul of schema 16 runs beside (its
    // appends leave a load's client as it was).
    Migration::new(17, include_str!("../migrations/0017_client_shares.sql")).readable_by(16),
    // A new table only: a haul of schema 17 runs beside (its appends leave the consent
    // ledger alone; the loads' logs still have every STOP).
    Migration::new(18, include_str!("../migrations/0018_sms_consent.sql")).readable_by(17),
    // A new table only: a haul of schema 18 runs beside (it leaves it alone).
    Migration::new(19, include_str!("../migrations/0019_sms_reports.sql")).readable_by(18),
    // A new table only: a haul of schema 19 runs beside, sending without the cap on
    // sends in flight until it is stopped.
    Migration::new(20, include_str!("../migrations/0020_send_slots.sql")).readable_by(19),
    // New tables only: a haul of schema 20 runs beside (its LLM decisions are not
    // added to the clients' day spend, and keep no prompts).
    Migration::new(21, include_str!("../migrations/0021_llm_spend.sql")).readable_by(20),
    Migration::new(22, include_str!("../migrations/0022_trace_context.sql")).readable_by(21),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = latest_version(MIGRATIONS);

/// Where the database lives and how hard it syncs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteConfig {
    /// `None`: a private in-memory database.
    pub path: Option<PathBuf>,
    /// `PRAGMA synchronous`: `FULL` (the default: a commit survives power loss) or
    /// `NORMAL` (survives a process crash; faster).
    pub synchronous: String,
    /// Seed for claim tokens and receipts; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl SqliteConfig {
    /// Parses `sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`, with an optional
    /// `?synchronous=normal|full`.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let path = if base == "sqlite::memory:" || base == "sqlite://:memory:" {
            None
        } else if let Some(p) = base.strip_prefix("sqlite://").or_else(|| base.strip_prefix("sqlite:")) {
            if p.is_empty() {
                return Err(StoreError::new(format!("store.url {url:?} names no file")));
            }
            Some(PathBuf::from(p))
        } else {
            return Err(StoreError::new(format!("store.url {url:?} is not sqlite://PATH or sqlite::memory:")));
        };
        let mut synchronous = "FULL".to_string();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some(("synchronous", v)) if ["full", "normal"].contains(&v.to_ascii_lowercase().as_str()) => {
                    synchronous = v.to_ascii_uppercase()
                }
                _ => {
                    return Err(StoreError::new(format!(
                        "store.url {url:?}: unknown option {kv:?} (synchronous=full|normal)"
                    )));
                }
            }
        }
        Ok(SqliteConfig { path, synchronous, seed: None })
    }
}

/// An open SQLite store. Cheap to clone; the writer thread ends when the last clone
/// is dropped.
#[derive(Clone)]
pub struct SqliteStore {
    writer: writer::Writer,
    /// `None` in memory: reads run on the writer.
    readers: Option<Arc<readers::Readers>>,
    tokens: Tokens,
}

impl SqliteStore {
    /// Opens the database, creating the file if there is none. Errors name the file by
    /// absolute path and say the OS's reason (permission denied, no such folder), which
    /// SQLite's own "unable to open database file" leaves out.
    pub fn open(config: &SqliteConfig) -> Result<Self, StoreError> {
        let path = config.path.as_deref().map(absolute);
        let conn = match &path {
            Some(p) => Connection::open(p),
            None => Connection::open_in_memory(),
        }
        .map_err(|e| cannot_open(path.as_deref(), &e))?;
        let wal = if path.is_some() { "PRAGMA journal_mode = WAL;" } else { "" };
        conn.execute_batch(&format!(
            "{wal} PRAGMA synchronous = {}; PRAGMA busy_timeout = 5000; PRAGMA foreign_keys = OFF;",
            config.synchronous
        ))
        .map_err(|e| cannot_open(path.as_deref(), &e))?;
        Self::finish(conn, path.as_deref(), config.seed)
    }

    /// Opens an existing database read-only (`SQLITE_OPEN_READ_ONLY`, SQLite's
    /// `mode=ro`): never creates the file, and nothing can write through it. A missing
    /// file is an error naming its absolute path.
    pub fn open_read_only(config: &SqliteConfig) -> Result<Self, StoreError> {
        let Some(path) = config.path.as_deref().map(absolute) else {
            return Err(StoreError::new("an in-memory SQLite database is empty: there is nothing to read"));
        };
        if !path.exists() {
            return Err(StoreError::new(format!(
                "no SQLite database at {}: nothing to read (haul migrate or haul serve creates it)",
                path.display()
            )));
        }
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(|e| cannot_open(Some(&path), &e))?;
        conn.execute_batch("PRAGMA busy_timeout = 5000;").map_err(|e| cannot_open(Some(&path), &e))?;
        Self::finish(conn, Some(&path), config.seed)
    }

    fn finish(conn: Connection, path: Option<&Path>, seed: Option<u64>) -> Result<Self, StoreError> {
        // Every statement the store runs fits (rusqlite keeps 16 by default, fewer than
        // the store's hot statements, so they pushed each other out and were re-parsed).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // After the writer's connection: the file exists and is in WAL mode.
        let readers = match path {
            Some(p) => Some(Arc::new(readers::Readers::open(p, READERS)?)),
            None => None,
        };
        Ok(SqliteStore { writer: writer::Writer::spawn(conn), readers, tokens: Tokens::new(seed) })
    }

    /// The newest migration applied, `None` when the file has no haul tables.
    pub async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        self.writer
            .run(|conn: &Connection| -> Result<Option<i64>, StoreError> {
                let exists: bool = conn
                    .query_row(
                        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(db)?;
                if !exists {
                    return Ok(None);
                }
                conn.query_row("SELECT max(version) FROM schema_migrations", [], |r| r.get(0)).map_err(db)
            })
            .await
    }

    /// The oldest schema version a haul may write and still run on this database
    /// (`haul_store::backend::check_schema`); `None` before any haul kept one.
    pub async fn readable_by(&self) -> Result<Option<i64>, StoreError> {
        self.writer
            .run(|conn: &Connection| -> Result<Option<i64>, StoreError> {
                let exists: bool = conn
                    .query_row(
                        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'schema_compat'",
                        [],
                        |r| r.get(0),
                    )
                    .map_err(db)?;
                if !exists {
                    return Ok(None);
                }
                conn.query_row("SELECT max(readable_by) FROM schema_compat", [], |r| r.get(0)).map_err(db)
            })
            .await
    }

    /// Applies the migrations not yet applied; returns their versions. A database a
    /// newer haul migrated is refused, naming both versions, unless its migrations
    /// were declared readable by this one (then nothing is applied).
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        self.writer
            .run(|conn: &Connection| -> Result<Vec<i64>, StoreError> {
                conn.execute_batch(
                    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);
                     CREATE TABLE IF NOT EXISTS schema_compat (id INTEGER PRIMARY KEY CHECK (id = 1), readable_by INTEGER NOT NULL);",
                )
                .map_err(db)?;
                let mut done: Vec<i64> = conn
                    .prepare("SELECT version FROM schema_migrations")
                    .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                    .map_err(db)?;
                let kept: Option<i64> =
                    conn.query_row("SELECT max(readable_by) FROM schema_compat", [], |r| r.get(0)).map_err(db)?;
                let version = done.iter().copied().max().unwrap_or(0);
                check_schema(SCHEMA_VERSION, version, kept.unwrap_or(version))?;
                let mut applied = Vec::new();
                for m in pending_migrations(MIGRATIONS, &done, latest_version(MIGRATIONS)) {
                    conn.execute_batch(m.sql).map_err(|e| migration_failed(m.version, e))?;
                    conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)", [m.version])
                        .map_err(db)?;
                    applied.push(m.version);
                }
                done.extend(&applied);
                conn.execute(
                    "INSERT INTO schema_compat (id, readable_by) VALUES (1, ?1)
                     ON CONFLICT (id) DO UPDATE SET readable_by = excluded.readable_by",
                    [readable_by(MIGRATIONS, &done, kept)],
                )
                .map_err(db)?;
                Ok(applied)
            })
            .await
    }
}

/// `path` made absolute against the working directory, so messages say which file.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// SQLite's reason, and the OS's where SQLite gives none ("unable to open database
/// file" is every reason at once: a missing folder, a folder not writable, a file not
/// readable), found by trying what SQLite needed.
fn cannot_open(path: Option<&Path>, e: &rusqlite::Error) -> StoreError {
    let Some(path) = path else {
        return StoreError::new(format!("cannot open an in-memory SQLite database: {e}"));
    };
    let what = e.to_string().replace(&format!(": {}", path.display()), "");
    let why = os_reason(path).map(|r| format!(" ({r})")).unwrap_or_default();
    StoreError::new(format!("cannot open SQLite database {}: {what}{why}", path.display()))
}

/// Why the OS would refuse SQLite `path` (and its `-wal` beside it), if it would.
fn os_reason(path: &Path) -> Option<String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    if let Err(e) = std::fs::metadata(dir) {
        return Some(format!("folder {}: {e}", dir.display()));
    }
    if path.exists()
        && let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(path)
    {
        return Some(format!("{}: {e}", path.display()));
    }
    // SQLite creates the file, and the `-wal` and `-shm` files, in the folder.
    let probe = dir.join(format!(".haul-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            None
        }
        Err(e) => Some(format!("cannot create files in {}: {e}", dir.display())),
    }
}

pub(crate) fn db(e: rusqlite::Error) -> StoreError {
    StoreError::new(format!("sqlite: {e}"))
}
