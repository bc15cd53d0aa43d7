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
