//! The contract suite on PostgreSQL, each case in its own schema.
//!
//! PostgreSQL comes from `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`).
//! An unreachable server fails every case loudly: these tests never skip.

use std::sync::Arc;

use haul_postgres::{PgConfig, PgStore};
use haul_store::contract::DynStore;

async fn fresh() -> DynStore {
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = haul_postgres::testing::fresh_schema(&url).await;
    let store = PgStore::connect(&PgConfig { schema: Some(schema), pool_size: 8, ..PgConfig::new(&url) })
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests (DATABASE_URL={url}): {e}"));
    store.migrate().await.unwrap();
    Arc::new(store)
}

haul_store::contract_tests!(fresh);
