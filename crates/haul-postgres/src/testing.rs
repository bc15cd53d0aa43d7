//! Helpers for tests (this crate's and the others') that need a PostgreSQL of their
//! own: the scratch schemas of [`crate::scratch`], failing loudly. A test that needs
//! PostgreSQL panics when it cannot have it: it never skips.
//!
//! Behind the `testing` feature so a build of haul carries none of it.

pub use crate::group::TestPublish;
pub use crate::scratch::{DATABASE_URL_VAR, DEFAULT_DATABASE_URL, FreshStore, database_url, drop_schemas, fresh_store};

/// A new schema name for one test ([`crate::scratch::fresh_schema`]). Panics when the
/// server is unreachable.
pub async fn fresh_schema(url: &str) -> String {
    crate::scratch::fresh_schema(url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests: {}", e.0))
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
    crate::scratch::fresh_schema_url(url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests: {}", e.0))
}
