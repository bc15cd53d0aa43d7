//! The contract suite on PostgreSQL, each case in its own schema.
//!
//! PostgreSQL comes from `DATABASE_URL` (`haul_postgres::testing::database_url`). An
//! unreachable server fails every case loudly: these tests never skip.

use std::sync::Arc;

use haul_postgres::testing::{FreshStore, fresh_store};
use haul_store::contract::DynStore;

async fn fresh() -> DynStore {
    let (store, _) = fresh_store(&FreshStore::default()).await.unwrap();
    Arc::new(store)
}

haul_store::contract_tests!(fresh);
