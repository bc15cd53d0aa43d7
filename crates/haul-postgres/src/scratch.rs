//! Scratch schemas: a store in a schema nobody else uses, for what makes many stores of
//! its own in one database (`haul eval --store postgres`, `haul sim`, `haul bench`, the
//! crash test's `haul testkit schema`) and for the tests.
//!
//! Every failure is an error naming the cause and the fix, never a panic: a command
//! run by a person on a stock PostgreSQL says "database "test" does not exist" and how
//! to make it (and makes it when the server lets it). Schema names carry their creation
//! time, and schemas left by runs more than an hour old are dropped when a new one is
//! made.

use haul_store::StoreError;

use crate::{PgConfig, PgStore, SCHEMA_VERSION};

/// The variable that names the database scratch schemas are made in.
pub const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// The database when `DATABASE_URL` is not set: a local server with trust auth (what
/// `scripts/test` and the README assume too).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var(DATABASE_URL_VAR).unwrap_or_else(|_| DEFAULT_DATABASE_URL.into())
}

/// A session on `url`, its connection driven by a task of its own. A database that does
/// not exist is made first when the server lets this user (`CREATE DATABASE`); every
/// other failure says what it was and where.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, StoreError> {
    let config: tokio_postgres::Config =
        url.parse().map_err(|e| StoreError::new(format!("{} is not a PostgreSQL URL: {e}", crate::redact(url))))?;
    match config.connect(tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            Ok(client)
        }
        Err(e) if is_missing_database(&e) => {
            create_database(&config, url).await?;
            let (client, conn) = config.connect(tokio_postgres::NoTls).await.map_err(|e| unreachable(url, &e))?;
            tokio::spawn(conn);
            Ok(client)
        }
        Err(e) => Err(unreachable(url, &e)),
    }
}

fn is_missing_database(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| *d.code() == tokio_postgres::error::SqlState::INVALID_CATALOG_NAME)
}

fn unreachable(url: &str, e: &tokio_postgres::Error) -> StoreError {
    let why = crate::pg_reason(e);
    StoreError::new(format!("cannot use PostgreSQL at {} ({DATABASE_URL_VAR}): {why}", crate::redact(url)))
}

/// Makes the database `config` names, from the server's `postgres` database.
async fn create_database(config: &tokio_postgres::Config, url: &str) -> Result<(), StoreError> {
    let name = config.get_dbname().unwrap_or("postgres").to_owned();
    let refused = |why: String| {
        StoreError::new(format!(
            "database \"{name}\" does not exist at {} and could not be made ({why}): make it with \
             `createdb {name}` (or `CREATE DATABASE \"{name}\"`), or set {DATABASE_URL_VAR} to another",
            crate::redact(url)
        ))
    };
    let mut maintenance = config.clone();
    maintenance.dbname("postgres");
    let (client, conn) = maintenance.connect(tokio_postgres::NoTls).await.map_err(|e| refused(crate::pg_reason(&e)))?;
    let task = tokio::spawn(conn);
    let quoted = name.replace('"', "\"\"");
    let made = client.batch_execute(&format!("CREATE DATABASE \"{quoted}\"")).await;
    drop(client);
    let _ = task.await;
    match made {
        Ok(()) => {
            tracing::info!(database = %name, "made the missing database for scratch schemas");
            Ok(())
        }
        // Another process made it in the meantime.
        Err(e) if e.as_db_error().is_some_and(|d| *d.code() == tokio_postgres::error::SqlState::DUPLICATE_DATABASE) => {
            Ok(())
        }
        Err(e) => Err(refused(crate::pg_reason(&e))),
    }
}

/// A new schema name, after dropping the scratch schemas left by runs more than an hour
/// old (names carry their creation time).
#[allow(clippy::disallowed_methods)] // schema bookkeeping, not domain time
pub async fn fresh_schema(url: &str) -> Result<String, StoreError> {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let name = format!("haul_t{now_s}_{:08x}", fastrand::u32(..));
    let client = connect(url).await?;
    if let Ok(rows) = client.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'haul\\_t%'", &[]).await {
        let old: Vec<String> = rows
            .iter()
            .filter_map(|row| row.try_get::<_, String>(0).ok())
            .filter(|old| {
                let born_s =
                    old.strip_prefix("haul_t").and_then(|s| s.split('_').next()).and_then(|s| s.parse::<u64>().ok());
                born_s.is_some_and(|b| b + 3600 < now_s)
            })
            .collect();
        drop_each(&client, &old).await;
    }
    Ok(name)
}

/// Drops each of `schemas` with everything in it; the ones that could not be dropped,
/// each with why.
async fn drop_each(client: &tokio_postgres::Client, schemas: &[String]) -> Vec<String> {
    let mut failed = Vec::new();
    for schema in schemas {
        if let Err(e) = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await {
            failed.push(format!("{schema}: {e}"));
        }
    }
    failed
}

/// Drops `schemas` (made by [`fresh_schema`], [`fresh_store`] or [`fresh_schema_url`])
/// with everything in them, once their user is done: the ones that could not be
/// dropped, each with why (the hourly sweep of [`fresh_schema`] takes them later).
pub async fn drop_schemas(url: &str, schemas: &[String]) -> Vec<String> {
    if schemas.is_empty() {
        return Vec::new();
    }
    match connect(url).await {
        Ok(client) => drop_each(&client, schemas).await,
        Err(e) => schemas.iter().map(|s| format!("{s}: {e}")).collect(),
    }
}

/// How [`fresh_store`] sets its store up. `FreshStore::default()` suits most uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreshStore {
    /// The database; [`database_url()`] by default.
    pub url: String,
    pub pool_size: usize,
    /// Seed for claim tokens and receipts; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Migrate up to this version: [`SCHEMA_VERSION`] by default; 0 leaves the schema
    /// empty, for an upgrade test that builds an older one itself.
    pub schema_version: i64,
}

impl Default for FreshStore {
    fn default() -> Self {
        FreshStore { url: database_url(), pool_size: 8, seed: None, schema_version: SCHEMA_VERSION }
    }
}

/// A store in a new schema of its own ([`fresh_schema`]), migrated to
/// `options.schema_version`, and the schema's name.
pub async fn fresh_store(options: &FreshStore) -> Result<(PgStore, String), StoreError> {
    let schema = fresh_schema(&options.url).await?;
    let store = PgStore::connect(&PgConfig {
        schema: Some(schema.clone()),
        pool_size: options.pool_size,
        seed: options.seed,
        ..PgConfig::new(&options.url)
    })
    .await?;
    store.migrate_to(options.schema_version).await?;
    Ok((store, schema))
}

/// A new, empty schema of its own in `url`'s database, for processes that take a store
/// URL: the schema's name and a URL whose `search_path` is it.
pub async fn fresh_schema_url(url: &str) -> Result<(String, String), StoreError> {
    let schema = fresh_schema(url).await?;
    let client = connect(url).await?;
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .map_err(|e| StoreError::new(format!("creating schema {schema} at {}: {e}", crate::redact(url))))?;
    let sep = if url.contains('?') { '&' } else { '?' };
    let store_url = format!("{url}{sep}options=-csearch_path%3D{schema}");
    Ok((schema, store_url))
}

/// Migrated scratch schemas of one database, emptied and lent out again: a run of many
/// short users (a library of eval scenarios, a few hundred simulated seeds) migrates a
/// schema once, not once each (a migration makes some 270 tables, partitions and
/// indexes: over a second of the server's time). Each user still gets a store to itself,
/// empty, its sequences restarted.
#[derive(Debug)]
pub struct Reusable {
    url: String,
    idle: std::sync::Mutex<Vec<String>>,
    made: std::sync::Mutex<Vec<String>>,
}

/// A schema a [`Reusable`] lent; it goes back to be emptied for the next user when
/// dropped.
#[derive(Debug)]
pub struct Lent {
    pool: std::sync::Arc<Reusable>,
    schema: Option<String>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(schema) = self.schema.take() {
            self.pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push(schema);
        }
    }
}

impl Reusable {
    pub fn new(url: &str) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Reusable { url: url.to_owned(), idle: Default::default(), made: Default::default() })
    }

    /// A migrated, empty store: a schema lent before and emptied now, or a new one.
    pub async fn store(
        self: &std::sync::Arc<Self>,
        seed: Option<u64>,
        pool_size: usize,
    ) -> Result<(PgStore, Lent), StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        if let Some(schema) = idle {
            // A schema its last user still holds a lock in is left; a new one is made.
            if empty_schema(&self.url, &schema).await.is_ok() {
                let config = PgConfig { schema: Some(schema.clone()), pool_size, seed, ..PgConfig::new(&self.url) };
                let store = PgStore::connect(&config).await?;
                return Ok((store, Lent { pool: self.clone(), schema: Some(schema) }));
            }
        }
        let options = FreshStore { url: self.url.clone(), pool_size, seed, schema_version: SCHEMA_VERSION };
        let (store, schema) = fresh_store(&options).await?;
        self.made.lock().unwrap_or_else(|p| p.into_inner()).push(schema.clone());
        Ok((store, Lent { pool: self.clone(), schema: Some(schema) }))
    }

    /// Drops every schema this pool made; the ones that could not be dropped, each with why.
    pub async fn drop_all(&self) -> Vec<String> {
        let made: Vec<String> = std::mem::take(&mut *self.made.lock().unwrap_or_else(|p| p.into_inner()));
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
        drop_schemas(&self.url, &made).await
    }
}

/// Empties every table of `schema` but the migrations' own, restarting its sequences:
/// in one transaction of deletes (a user leaves few rows; `TRUNCATE` of some 270
/// relations costs five times as long).
async fn empty_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    let client = connect(url).await?;
    let fail =
        |e: tokio_postgres::Error| StoreError::new(format!("emptying schema {schema}: {}", crate::pg_reason(&e)));
    let rows = client
        .query(
            "SELECT CASE WHEN c.relkind = 'S' THEN format('ALTER SEQUENCE %I.%I RESTART', n.nspname, c.relname)
                         ELSE format('DELETE FROM %I.%I', n.nspname, c.relname) END
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'S') AND NOT c.relispartition
               AND c.relname NOT IN ('schema_migrations', 'schema_compat')",
            &[&schema],
        )
        .await
        .map_err(fail)?;
    let statements: Vec<String> = rows.iter().filter_map(|r| r.try_get::<_, String>(0).ok()).collect();
    if !statements.iter().any(|s| s.starts_with("DELETE")) {
        return Err(StoreError::new(format!("schema {schema} holds no haul tables")));
    }
    client
        .batch_execute(&format!("SET lock_timeout = '2s'; BEGIN; {}; COMMIT", statements.join("; ")))
        .await
        .map_err(fail)
}
