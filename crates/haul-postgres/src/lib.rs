//! The PostgreSQL backend: production's store.
//!
//! deadpool-postgres pools the connections. Claims (outbox rows, queue heads) use
//! `FOR UPDATE SKIP LOCKED`, so any number of dispatchers and workers in any number of
//! processes never hand one row to two live claims. Appends serialize per load on the
//! `loads` row (an `UPDATE … WHERE version = expected`), so the version is always the
//! first check and racing writers cannot interleave.

mod impls;
mod readonly;
pub mod sql;
#[cfg(feature = "testing")]
pub mod testing;
pub mod wake;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use haul_store::StoreError;
use haul_store::backend::{Migration, Tokens, latest_version, migration_failed, pending_migrations};
use tokio_postgres::NoTls;

/// A store URL without its credentials, for logs and errors.
pub use haul_core::redact::redact_url as redact;
pub use readonly::ReadOnlyLog;

const MIGRATIONS: &[Migration] = &[
    Migration::new(1, include_str!("../migrations/0001_init.sql")),
    Migration::new(2, include_str!("../migrations/0002_deliveries.sql")),
    Migration::new(3, include_str!("../migrations/0003_outcome_published.sql")),
    Migration::new(4, include_str!("../migrations/0004_load_index.sql")),
    Migration::new(5, include_str!("../migrations/0005_partition_retention.sql")),
    Migration::new(6, include_str!("../migrations/0006_message_sids.sql")),
    Migration::new(7, include_str!("../migrations/0007_ops_alerts.sql")),
    Migration::new(8, include_str!("../migrations/0008_operator_actions.sql")),
    Migration::new(9, include_str!("../migrations/0009_ops_queries.sql")),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = latest_version(MIGRATIONS);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgConfig {
    pub url: String,
    /// Schema for every table (`search_path`); `None` uses the server's default.
    /// Tests give each case its own.
    pub schema: Option<String>,
    pub pool_size: usize,
    /// Seed for claim tokens and receipts; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl PgConfig {
    pub fn new(url: impl Into<String>) -> Self {
        PgConfig { url: url.into(), schema: None, pool_size: 16, seed: None }
    }
}

#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    tokens: Tokens,
}

fn is_schema_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl PgStore {
    /// Connects (and checks the connection), creating the schema when one is named.
    pub async fn connect(config: &PgConfig) -> Result<Self, StoreError> {
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| StoreError::new(format!("bad PostgreSQL url {}: {e}", redact(&config.url))))?;
        pg.connect_timeout(Duration::from_secs(5));
        if let Some(schema) = &config.schema {
            if !is_schema_name(schema) {
                return Err(StoreError::new(format!("bad schema name {schema:?}")));
            }
            let (client, conn) = pg.connect(NoTls).await.map_err(|e| unreachable_db(&config.url, e))?;
            let task = tokio::spawn(conn);
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await
                .map_err(|e| StoreError::new(format!("cannot create schema {schema}: {e}")))?;
            drop(client);
            let _ = task.await;
            pg.options(format!("-c search_path={schema}"));
        }
        let manager = Manager::from_config(pg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(2))
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::new(format!("cannot build the PostgreSQL pool: {e}")))?;
        // Fail here, with the address, rather than on first use.
        drop(
            pool.get()
                .await
                .map_err(|e| StoreError::new(format!("cannot reach PostgreSQL at {}: {e}", redact(&config.url))))?,
        );
        Ok(PgStore { pool, tokens: Tokens::new(config.seed) })
    }

    /// Applies the migrations not yet applied, under an advisory lock so several
    /// processes starting at once do not race; returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
        self.migrate_to(SCHEMA_VERSION).await
    }

    /// Applies the migrations not yet applied up to `target` (inclusive), all in one
    /// transaction: a failing migration leaves the schema as it was. Upgrade tests use
    /// it to build an older schema and fill it before the rest runs.
    pub async fn migrate_to(&self, target: i64) -> Result<Vec<i64>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.batch_execute(
            "SELECT pg_advisory_xact_lock(7423001);
             CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY, applied_at bigint NOT NULL);",
        )
        .await
        .map_err(pg)?;
        let done = tx.query("SELECT version FROM schema_migrations", &[]).await.map_err(pg)?;
        let done = done.iter().map(|r| r.try_get(0)).collect::<Result<Vec<i64>, _>>().map_err(pg)?;
        let mut applied = Vec::new();
        for m in pending_migrations(MIGRATIONS, &done, target) {
            tx.batch_execute(m.sql).await.map_err(|e| migration_failed(m.version, e))?;
            tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 0)", &[&m.version])
                .await
                .map_err(pg)?;
            applied.push(m.version);
        }
        tx.commit().await.map_err(pg)?;
        Ok(applied)
    }

    /// The migrations this build knows that the database has not applied (all of them
    /// when it has no schema). Reads only: what read-only commands check instead of
    /// migrating.
    pub async fn unapplied_migrations(&self) -> Result<Vec<i64>, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[]).await.map_err(pg)?;
        let exists: bool = row.try_get(0).map_err(pg)?;
        let done = if exists {
            let rows = client.query("SELECT version FROM schema_migrations", &[]).await.map_err(pg)?;
            rows.iter().map(|r| r.try_get(0)).collect::<Result<Vec<i64>, _>>().map_err(pg)?
        } else {
            vec![]
        };
        Ok(pending_migrations(MIGRATIONS, &done, SCHEMA_VERSION).iter().map(|m| m.version).collect())
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| StoreError::new(format!("PostgreSQL pool: {e}")))
    }
}

fn unreachable_db(url: &str, e: tokio_postgres::Error) -> StoreError {
    StoreError::new(format!("cannot reach PostgreSQL at {}: {e}", redact(url)))
}

pub(crate) fn pg(e: tokio_postgres::Error) -> StoreError {
    match e.as_db_error() {
        Some(d) => StoreError::new(format!("postgres: {} ({})", d.message(), d.code().code())),
        None => StoreError::new(format!("postgres: {e}")),
    }
}
