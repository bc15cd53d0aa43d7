//! The PostgreSQL backend: production's store.
//!
//! deadpool-postgres pools the connections. Claims (outbox rows, queue heads) use
//! `FOR UPDATE SKIP LOCKED`, so any number of dispatchers and workers in any number of
//! processes never hand one row to two live claims. Appends serialize per load on the
//! `loads` row (an `UPDATE … WHERE version = expected`), so the version is always the
//! first check and racing writers cannot interleave.

mod group;
mod impls;
mod readonly;
mod rows;
pub mod scratch;
pub mod sql;
#[cfg(feature = "testing")]
pub mod testing;
mod units;
pub mod wake;

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use haul_store::StoreError;
use haul_store::backend::{
    Migration, Tokens, check_schema, latest_version, migration_failed, pending_migrations, readable_by,
};
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgConfig {
    pub url: String,
    /// Schema for every table (`search_path`); `None` uses the server's default.
    /// Tests give each case its own.
    pub schema: Option<String>,
    pub pool_size: usize,
    /// Seed for claim tokens and receipts; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Every session reads only (`default_transaction_read_only`): for the commands
    /// that only read, so a bug there cannot write. No schema is created.
    pub read_only: bool,
}

impl PgConfig {
    pub fn new(url: impl Into<String>) -> Self {
        PgConfig { url: url.into(), schema: None, pool_size: 16, seed: None, read_only: false }
    }
}

#[derive(Clone)]
pub struct PgStore {
    pool: Pool,
    /// Sessions with `synchronous_commit = off`, for the writes nobody is told about:
    /// a receive's and a claim's lease. A server crash that loses one only makes the
    /// message or the row visible again sooner, as a lapsed lease does;
    /// every write anyone is acknowledged (a publish, an append, an ack, a mark) goes
    /// through `pool` and waits for its WAL flush. A later flush of any session's
    /// commit makes these durable too (the WAL is one sequence).
    lease_pool: Pool,
    tokens: Tokens,
    /// The committers of appends and publish-and-marks (group commit, `group.rs`).
    group: Arc<group::Group>,
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
        // Options the URL already carries (`options=-csearch_path%3D…`) are kept: the
        // ones added here come after them.
        let mut options: Vec<String> = pg.get_options().map(str::to_owned).into_iter().collect();
        if config.read_only {
            options.push("-c default_transaction_read_only=on".to_owned());
        }
        if let Some(schema) = &config.schema {
            if !is_schema_name(schema) {
                return Err(StoreError::new(format!("bad schema name {schema:?}")));
            }
            let (client, conn) =
                pg.connect(NoTls).await.map_err(|e| connect_failed(&config.url, Some(&e), &pg_reason(&e)))?;
            let task = tokio::spawn(conn);
            client
                .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .await
                .map_err(|e| StoreError::new(format!("cannot create schema {schema}: {e}")))?;
            drop(client);
            let _ = task.await;
            options.push(format!("-c search_path={schema}"));
        }
        // Every statement is a cached prepared one. On the partitioned log and outbox
        // the planner otherwise keeps choosing a custom plan (a generic one lists all
        // partitions, so it looks dearer), planning again on every run: half the
        // server's time per statement on the hot path. A generic plan prunes to the
        // load's partition when it runs; the EXPLAIN test holds every statement to an
        // index under it.
        options.push("-c plan_cache_mode=force_generic_plan".to_owned());
        let mut lease = pg.clone();
        if !options.is_empty() {
            pg.options(options.join(" "));
        }
        options.push("-c synchronous_commit=off".to_owned());
        // A claim and a receive join the few rows their `LIMIT` took back to the
        // table by key. In a generic plan that `LIMIT` is a parameter, which the
        // planner guesses at a tenth of the candidates, so on an outbox of some
        // thousands of rows it hashed the whole table to update eight (5.8 ms against
        // 0.8 ms measured); a nested loop by key is right at every size. These are
        // the only statements the lease sessions run (`tests/explain.rs` checks the
        // claim's plan on one of them).
        options.push("-c enable_hashjoin=off -c enable_mergejoin=off".to_owned());
        lease.options(options.join(" "));
        let pool = build_pool(pg, config.pool_size.max(2))?;
        // Receives and claims are one statement each and brief: a quarter of the pool.
        let lease_pool = build_pool(lease, (config.pool_size / 4).max(2))?;
        // Fail here, with the address and the server's reason, rather than on first use.
        drop(pool.get().await.map_err(|e| {
            let driver = match &e {
                deadpool_postgres::PoolError::Backend(e) => Some(e),
                _ => None,
            };
            connect_failed(&config.url, driver, &pool_reason(&e))
        })?);
        // Each committer keeps one of the pool's connections; the rest serve reads,
        // claims and the other writes.
        let committers = if config.pool_size >= 8 { 2 } else { 1 };
        Ok(PgStore {
            group: Arc::new(group::Group::new(pool.clone(), committers)),
            pool,
            lease_pool,
            tokens: Tokens::new(config.seed),
        })
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
             CREATE TABLE IF NOT EXISTS schema_migrations (version bigint PRIMARY KEY, applied_at bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS schema_compat (id integer PRIMARY KEY CHECK (id = 1), readable_by bigint NOT NULL);",
        )
        .await
        .map_err(pg)?;
        let done = tx.query("SELECT version FROM schema_migrations", &[]).await.map_err(pg)?;
        let mut done = done.iter().map(|r| r.try_get(0)).collect::<Result<Vec<i64>, _>>().map_err(pg)?;
        let kept: Option<i64> = tx
            .query_one("SELECT max(readable_by) FROM schema_compat", &[])
            .await
            .map_err(pg)?
            .try_get(0)
            .map_err(pg)?;
        let version = done.iter().copied().max().unwrap_or(0);
        check_schema(SCHEMA_VERSION, version, kept.unwrap_or(version))?;
        let mut applied = Vec::new();
        for m in pending_migrations(MIGRATIONS, &done, target) {
            tx.batch_execute(m.sql).await.map_err(|e| migration_failed(m.version, e))?;
            tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, 0)", &[&m.version])
                .await
                .map_err(pg)?;
            applied.push(m.version);
        }
        done.extend(&applied);
        tx.execute(
            "INSERT INTO schema_compat (id, readable_by) VALUES (1, $1)
             ON CONFLICT (id) DO UPDATE SET readable_by = excluded.readable_by",
            &[&readable_by(MIGRATIONS, &done, kept)],
        )
        .await
        .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(applied)
    }

    /// The oldest schema version a haul may write and still run on this database
    /// (`haul_store::backend::check_schema`); `None` before any haul kept one.
    pub async fn readable_by(&self) -> Result<Option<i64>, StoreError> {
        let client = self.client().await?;
        let exists = client.query_one("SELECT to_regclass('schema_compat') IS NOT NULL", &[]).await.map_err(pg)?;
        if !exists.try_get::<_, bool>(0).map_err(pg)? {
            return Ok(None);
        }
        let row = client.query_one("SELECT max(readable_by) FROM schema_compat", &[]).await.map_err(pg)?;
        row.try_get(0).map_err(pg)
    }

    /// The newest migration applied, `None` when the schema has no haul tables.
    pub async fn schema_version(&self) -> Result<Option<i64>, StoreError> {
        let client = self.client().await?;
        let exists = client.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[]).await.map_err(pg)?;
        if !exists.try_get::<_, bool>(0).map_err(pg)? {
            return Ok(None);
        }
        let row = client.query_one("SELECT max(version) FROM schema_migrations", &[]).await.map_err(pg)?;
        row.try_get(0).map_err(pg)
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        pool_client(&self.pool).await
    }

    /// `synchronous_commit` as the store's two kinds of session see it: the one every
    /// acknowledged write uses, then the one of receives and claims.
    #[cfg(feature = "testing")]
    pub async fn synchronous_commit(&self) -> Result<(String, String), StoreError> {
        let show = async |c: deadpool_postgres::Object| -> Result<String, StoreError> {
            c.query_one("SHOW synchronous_commit", &[]).await.map_err(pg)?.try_get(0).map_err(pg)
        };
        Ok((show(self.client().await?).await?, show(self.lease_client().await?).await?))
    }

    /// The kind of session a claim and a receive run on, for tests that look at
    /// their plans.
    #[cfg(feature = "testing")]
    pub async fn lease_session(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.lease_client().await
    }

    /// A session whose commits do not wait for the WAL flush (see `lease_pool`).
    pub(crate) async fn lease_client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        pool_client(&self.lease_pool).await
    }
}

fn build_pool(pg: tokio_postgres::Config, size: usize) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(pg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(Duration::from_secs(5)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::new(format!("cannot build the PostgreSQL pool: {e}")))
}

pub(crate) async fn pool_client(pool: &Pool) -> Result<deadpool_postgres::Object, StoreError> {
    pool.get().await.map_err(|e| StoreError::new(format!("PostgreSQL pool: {}", pool_reason(&e))))
}

/// Why a first connection failed, saying whether the server was reached at all (and
/// how to make a database it does not have).
pub(crate) fn connect_failed(url: &str, e: Option<&tokio_postgres::Error>, reason: &str) -> StoreError {
    let url = redact(url);
    match e.and_then(|e| e.as_db_error()) {
        Some(d) if *d.code() == tokio_postgres::error::SqlState::INVALID_CATALOG_NAME => {
            let name = url.rsplit('/').next().unwrap_or("").split('?').next().unwrap_or("");
            StoreError::new(format!(
                "PostgreSQL at {url} answered, and has no such database: {reason}; make it with `createdb {name}` \
                 (or `CREATE DATABASE \"{name}\"`)"
            ))
        }
        Some(_) => StoreError::new(format!("PostgreSQL at {url} refused the connection: {reason}")),
        None => StoreError::new(format!("cannot reach PostgreSQL at {url}: {reason}")),
    }
}

/// Why the pool gave no connection, in one line: the driver's reason, not the pool's
/// wrapper ("Error occurred while creating a new object: db error").
pub fn pool_reason(e: &deadpool_postgres::PoolError) -> String {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => pg_reason(e),
        PoolError::Timeout(t) => format!("timed out ({t:?}) waiting for a connection"),
        other => other.to_string(),
    }
}

/// A driver error in one line, as the server or the OS put it: the server's message
/// (`database "x" does not exist`, `password authentication failed for user "x"`,
/// `role "x" does not exist`) with its SQLSTATE, or the chain of causes down to the
/// OS's (`error connecting to server: Connection refused (os error 111)`), where the
/// driver's own Display says only "db error" or "error connecting to server".
pub fn pg_reason(e: &tokio_postgres::Error) -> String {
    if let Some(d) = e.as_db_error() {
        return format!("{} ({})", d.message(), d.code().code());
    }
    let mut parts = vec![e.to_string()];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ").replace('\n', " ")
}

pub(crate) fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::new(format!("postgres: {}", pg_reason(&e)))
}
