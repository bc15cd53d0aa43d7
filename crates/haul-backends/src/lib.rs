//! Opening a backend from its URL: the one crate that knows every backend (SQLite,
//! PostgreSQL and, with the `sqs` feature, the SQS FIFO queue). The binary opens what
//! the settings name, and the harness what its evals and benchmarks need; the runtime,
//! the server and the rest take the `haul_store` traits they were handed and know no
//! backend.
//!
//! A store is opened for the commands that write (creating or upgrading the schema),
//! or read-only for the ones that only read (`haul inspect`), which must never create a
//! store where there was none.

use std::sync::Arc;

use anyhow::Context;
use haul_config::StoreKind;
use haul_postgres::{PgConfig, PgStore};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::Store;

/// A store error as one line for people: its own message, without the type's
/// "store error:" prefix (the message names the store and the reason).
fn plain(e: haul_store::StoreError) -> anyhow::Error {
    anyhow::anyhow!(e.0)
}

/// Opens the store and brings its schema up to date (creating a SQLite file).
pub async fn open(url: &str, seed: Option<u64>) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match StoreKind::of_url(url)? {
        StoreKind::Sqlite => {
            let mut config = SqliteConfig::from_url(url).map_err(plain)?;
            config.seed = seed;
            let store = SqliteStore::open(&config).map_err(plain)?;
            store.migrate().await.map_err(plain).with_context(|| format!("migrating {}", describe(url)))?;
            newer_but_readable(url, store.schema_version().await.map_err(plain)?);
            Arc::new(store)
        }
        StoreKind::Postgres => {
            let store = PgStore::connect(&PgConfig { seed, ..PgConfig::new(url) }).await.map_err(plain)?;
            store.migrate().await.map_err(plain).with_context(|| format!("migrating {}", describe(url)))?;
            newer_but_readable(url, store.schema_version().await.map_err(plain)?);
            Arc::new(store)
        }
    })
}

/// Says so when a newer haul migrated the database past this one's schema and declared
/// its migrations readable by this one (a deploy with old and new side by side).
fn newer_but_readable(url: &str, version: Option<i64>) {
    if let Some(v) = version.filter(|v| *v > SCHEMA_VERSION) {
        tracing::warn!(
            store = %describe(url),
            "the database's schema is at version {v}, newer than this haul's {SCHEMA_VERSION}; its newer \
             migrations are declared readable by this haul, which runs on it: upgrade it soon"
        );
    }
}

/// Wake-ups across processes (PostgreSQL `LISTEN`/`NOTIFY`, see `haul_postgres::wake`)
/// for a process that runs the worker and dispatcher roles as `runs_worker` and
/// `runs_dispatcher` say: it listens for the wake-ups of the roles it runs and forwards
/// those it raises for roles it does not. `None` on SQLite, whose processes poll.
pub fn spawn_wake_bridge(
    url: &str,
    runs_worker: bool,
    runs_dispatcher: bool,
    wake_worker: Arc<tokio::sync::Notify>,
    wake_dispatcher: Arc<tokio::sync::Notify>,
) -> Option<tokio::task::JoinHandle<()>> {
    use haul_postgres::wake::{Direction, Link, Wake};
    if !matches!(StoreKind::of_url(url), Ok(StoreKind::Postgres)) {
        return None;
    }
    let direction = |runs: bool| if runs { Direction::Listen } else { Direction::Forward };
    let links = vec![
        Link { wake: Wake::Work, direction: direction(runs_worker), local: wake_worker },
        Link { wake: Wake::Dispatch, direction: direction(runs_dispatcher), local: wake_dispatcher },
    ];
    Some(tokio::spawn(haul_postgres::wake::bridge(url.to_owned(), links)))
}

/// Opens an existing store to read it: nothing is created or migrated. A SQLite file
/// is opened read-only (`mode=ro`) and must exist; a PostgreSQL session reads with
/// `default_transaction_read_only`. A store that is missing, empty, or at an older
/// schema is an error naming it (by absolute path for SQLite).
pub async fn open_read_only(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    let (store, version, readable_by, latest): (Arc<dyn Store>, Option<i64>, Option<i64>, i64) =
        match StoreKind::of_url(url)? {
            StoreKind::Sqlite => {
                let config = SqliteConfig::from_url(url).map_err(plain)?;
                let store = SqliteStore::open_read_only(&config).map_err(plain)?;
                let version = store.schema_version().await.map_err(plain)?;
                let readable_by = store.readable_by().await.map_err(plain)?;
                (Arc::new(store), version, readable_by, haul_sqlite::SCHEMA_VERSION)
            }
            StoreKind::Postgres => {
                let store =
                    PgStore::connect(&PgConfig { read_only: true, ..PgConfig::new(url) }).await.map_err(plain)?;
                let version = store.schema_version().await.map_err(plain)?;
                let readable_by = store.readable_by().await.map_err(plain)?;
                (Arc::new(store), version, readable_by, haul_postgres::SCHEMA_VERSION)
            }
        };
    match version {
        None => anyhow::bail!("{} holds no haul store (no schema); haul migrate creates one", describe(url)),
        Some(v) if v < latest => anyhow::bail!(
            "the schema of {} is at version {v}, this haul reads version {latest}: run haul migrate",
            describe(url)
        ),
        Some(v) => {
            haul_store::backend::check_schema(latest, v, readable_by.unwrap_or(v))
                .map_err(plain)
                .with_context(|| describe(url))?;
            Ok(store)
        }
    }
}

/// The schema version this build writes (both backends number their migrations alike).
pub const SCHEMA_VERSION: i64 = haul_sqlite::SCHEMA_VERSION;
const _: () = assert!(haul_sqlite::SCHEMA_VERSION == haul_postgres::SCHEMA_VERSION, "one schema numbering");

/// The store's address for people and logs: PostgreSQL without its password, SQLite
/// by absolute path (`sqlite:///srv/haul/haul.db`), so a message says which file.
pub fn describe(url: &str) -> String {
    match StoreKind::of_url(url) {
        // A path holds no credential, and may hold an `@` the redactor would misread.
        Ok(StoreKind::Sqlite) => match SqliteConfig::from_url(url) {
            Ok(SqliteConfig { path: Some(p), .. }) => {
                let query = url.split_once('?').map(|(_, q)| format!("?{q}")).unwrap_or_default();
                format!("sqlite://{}{query}", std::path::absolute(&p).unwrap_or(p).display())
            }
            _ => url.to_owned(),
        },
        Ok(StoreKind::Postgres) | Err(_) => haul_postgres::redact(url),
    }
}

/// The SQS FIFO load queue of `queue.*`, checked to answer before anything runs.
#[cfg(feature = "sqs")]
pub async fn open_sqs(queue: &haul_config::QueueConfig) -> anyhow::Result<Arc<dyn haul_store::LoadQueue>> {
    let settings = haul_sqs::SqsSettings {
        queue_url: queue.url.clone().unwrap_or_default(),
        endpoint: queue.endpoint.clone(),
        region: queue.region.clone(),
        static_credentials: None,
    };
    let sqs = haul_sqs::SqsQueue::connect(&settings).await;
    sqs.check().await.map_err(|e| anyhow::anyhow!("queue.url: {}", e.0))?;
    Ok(Arc::new(sqs))
}

#[cfg(not(feature = "sqs"))]
pub async fn open_sqs(_queue: &haul_config::QueueConfig) -> anyhow::Result<Arc<dyn haul_store::LoadQueue>> {
    anyhow::bail!("queue.kind \"sqs\" needs a build with SQS (cargo build --features sqs)")
}

/// Opens the logs at `url` read-only ([`haul_store::LogReader`]): SQLite `mode=ro`
/// (never created), PostgreSQL in read-only transactions; no migration either way.
pub async fn open_log_reader(url: &str) -> anyhow::Result<Arc<dyn haul_store::LogReader>> {
    Ok(match StoreKind::of_url(url)? {
        StoreKind::Sqlite => Arc::new(haul_sqlite::ReadOnlyLog::open_url(url)?),
        StoreKind::Postgres => Arc::new(haul_postgres::ReadOnlyLog::connect(url).await?),
    })
}
