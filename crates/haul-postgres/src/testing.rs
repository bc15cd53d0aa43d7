//! Helpers for tests (this crate's and the runtime's) that need a PostgreSQL of their
//! own: where the test database is, and a migrated store in a schema nobody else uses.
//!
//! Behind the `testing` feature so a production build carries none of it. Every test
//! that needs PostgreSQL gets it from here, so the default address and the "fresh
//! schema, connect, migrate" steps exist once.

use haul_store::StoreError;

pub use crate::group::TestPublish;
use crate::{PgConfig, PgStore, SCHEMA_VERSION};

/// The variable that names the test database.
pub const DATABASE_URL_VAR: &str = "DATABASE_URL";

/// The test database when `DATABASE_URL` is not set: a local server with trust auth
/// (what `scripts/test` and the README assume too).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var(DATABASE_URL_VAR).unwrap_or_else(|_| DEFAULT_DATABASE_URL.into())
}

/// A new schema name for one test, after dropping the test schemas left by runs
/// more than an hour old (names carry their creation time). Panics when the server is
/// unreachable: tests that need PostgreSQL fail loudly, they never skip.
#[allow(clippy::disallowed_methods)] // test bookkeeping, not domain time
pub async fn fresh_schema(url: &str) -> String {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let name = format!("haul_t{now_s}_{:08x}", fastrand::u32(..));
    let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await else {
        panic!("PostgreSQL is required for these tests and is not reachable at {DATABASE_URL_VAR}={url}");
    };
    let task = tokio::spawn(conn);
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
    drop(client);
    let _ = task.await;
    name
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
    let (client, conn) = match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
        Ok(c) => c,
        Err(e) => return schemas.iter().map(|s| format!("{s}: {e}")).collect(),
    };
    let task = tokio::spawn(conn);
    let failed = drop_each(&client, schemas).await;
    drop(client);
    let _ = task.await;
    failed
}

/// How [`fresh_store`] sets its store up. `FreshStore::default()` suits most tests.
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
    let schema = fresh_schema(&options.url).await;
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

/// A plain connection whose `search_path` is `schema`, for a test to look at (or
/// tamper with) the tables under a store. Panics when it cannot connect.
pub async fn client_in_schema(url: &str, schema: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config =
        url.parse().unwrap_or_else(|e| panic!("{DATABASE_URL_VAR}={url} is not a PostgreSQL url: {e}"));
    config.options(format!("-c search_path={schema}"));
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests ({DATABASE_URL_VAR}={url}): {e}"));
    tokio::spawn(conn);
    client
}

/// A new, empty schema of its own in `url`'s database, for processes that take a store
/// URL (the binary under test): the schema's name and a URL whose `search_path` is it.
/// Panics when the server is unreachable.
pub async fn fresh_schema_url(url: &str) -> (String, String) {
    let schema = fresh_schema(url).await;
    let client = client_in_schema(url, "public").await;
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap_or_else(|e| panic!("creating schema {schema} in {DATABASE_URL_VAR}={url}: {e}"));
    let sep = if url.contains('?') { '&' } else { '?' };
    let store_url = format!("{url}{sep}options=-csearch_path%3D{schema}");
    (schema, store_url)
}
