//! The contract suite on SQLite, in memory and in a file.

mod memory {
    use std::sync::Arc;

    use haul_sqlite::{SqliteConfig, SqliteStore};
    use haul_store::contract::DynStore;

    async fn fresh() -> DynStore {
        let store = SqliteStore::open(&SqliteConfig::from_url("sqlite::memory:").unwrap()).unwrap();
        store.migrate().await.unwrap();
        Arc::new(store)
    }

    haul_store::contract_tests!(fresh);
}

mod file {
    use std::sync::Arc;

    use haul_sqlite::{SqliteConfig, SqliteStore};
    use haul_store::contract::DynStore;

    async fn fresh() -> DynStore {
        // Each test gets its own file; the directory is left for the OS to clean up.
        let dir = std::env::temp_dir().join(format!("haul-contract-{}-{}", std::process::id(), fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}?synchronous=normal", dir.join("haul.db").display());
        let store = SqliteStore::open(&SqliteConfig::from_url(&url).unwrap()).unwrap();
        store.migrate().await.unwrap();
        Arc::new(store)
    }

    haul_store::contract_tests!(fresh);
}
