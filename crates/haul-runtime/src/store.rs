//! Opening a store from `store.url`.

use std::sync::Arc;

use anyhow::Context;
use haul_config::StoreKind;
use haul_postgres::{PgConfig, PgStore};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::Store;

/// Opens the store and brings its schema up to date.
pub async fn open(url: &str, seed: Option<u64>) -> anyhow::Result<Arc<dyn Store>> {
    Ok(match StoreKind::of_url(url)? {
        StoreKind::Sqlite => {
            let mut config = SqliteConfig::from_url(url).context("store.url")?;
            config.seed = seed;
            let store = SqliteStore::open(&config)?;
            store.migrate().await.context("migrating the SQLite schema")?;
            Arc::new(store)
        }
        StoreKind::Postgres => {
            let store = PgStore::connect(&PgConfig { seed, ..PgConfig::new(url) }).await?;
            store.migrate().await.context("migrating the PostgreSQL schema")?;
            Arc::new(store)
        }
    })
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

/// Opens a store that exists, for commands that only read: never creates a database
/// file or a schema and never migrates. A store that is missing, or whose schema is
/// older than this build, is an error that says what to run.
pub async fn open_existing(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    let (store, unapplied): (Arc<dyn Store>, Vec<i64>) = match StoreKind::of_url(url)? {
        StoreKind::Sqlite => {
            let config = SqliteConfig::from_url(url).context("store.url")?;
            let Some(path) = &config.path else {
                anyhow::bail!("{url} is a new, empty store: name the database to read (--db or store.url)");
            };
            if !path.is_file() {
                anyhow::bail!("no store at {} (haul migrate or haul serve creates one)", path.display());
            }
            let store = SqliteStore::open(&config)?;
            let unapplied = store.unapplied_migrations().await?;
            (Arc::new(store), unapplied)
        }
        StoreKind::Postgres => {
            let store = PgStore::connect(&PgConfig::new(url)).await?;
            let unapplied = store.unapplied_migrations().await?;
            (Arc::new(store), unapplied)
        }
    };
    if !unapplied.is_empty() {
        anyhow::bail!(
            "the schema of {} lacks migrations {unapplied:?} of this build: run haul migrate first (this command only reads)",
            describe(url)
        );
    }
    Ok(store)
}

/// The store's address without a password, for logs.
pub fn describe(url: &str) -> String {
    match StoreKind::of_url(url) {
        // A path holds no credential, and may hold an `@` the redactor would misread.
        Ok(StoreKind::Sqlite) => url.to_owned(),
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
    sqs.check().await.with_context(|| format!("queue.url {}", settings.queue_url))?;
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
