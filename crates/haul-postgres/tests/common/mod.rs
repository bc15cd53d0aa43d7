//! What the PostgreSQL integration tests share: a store in a fresh schema and a raw
//! client on that schema.

#![allow(dead_code)]

use haul_postgres::{PgConfig, PgStore};

pub fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A store in a new schema of its own, not migrated yet.
pub async fn store_in_fresh_schema() -> (PgStore, String) {
    let url = url();
    let schema = haul_postgres::testing::fresh_schema(&url).await;
    let store = PgStore::connect(&PgConfig { schema: Some(schema.clone()), pool_size: 4, ..PgConfig::new(&url) })
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests (DATABASE_URL={url}): {e}"));
    (store, schema)
}

/// A plain connection whose `search_path` is `schema`.
pub async fn raw_client(schema: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = url().parse().unwrap();
    config.options(format!("-c search_path={schema}"));
    let (client, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}
