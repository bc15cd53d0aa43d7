//! `ReadOnlyLog` on PostgreSQL: the log contract, and a session that cannot write.

use haul_postgres::testing::{database_url, fresh_schema_url};
use haul_postgres::{PgConfig, PgStore, ReadOnlyLog};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_only_log_reads_what_the_store_appended_and_cannot_write() {
    let (_, url) = fresh_schema_url(&database_url()).await;
    let store = PgStore::connect(&PgConfig::new(&url)).await.unwrap();
    store.migrate().await.unwrap();
    let reader = ReadOnlyLog::connect(&url).await.unwrap();
    haul_store::contract::log_reader_reads_what_was_appended(&store, &reader).await;
    assert!(reader.refuses_writes().await.unwrap(), "the reader's session must refuse writes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_without_the_log_is_refused_and_not_migrated() {
    let (_, url) = fresh_schema_url(&database_url()).await;
    let err = ReadOnlyLog::connect(&url).await.err().expect("no log");
    assert!(err.to_string().contains("no haul log"), "{err}");
    // Still nothing there: connecting created no table.
    let reader_again = ReadOnlyLog::connect(&url).await.err().expect("still no log");
    assert!(reader_again.to_string().contains("no haul log"));
}

/// A read-only store opened on a URL that names its schema in `options` (as the crash
/// test's and every split deployment's URLs do) reads that schema, not `public`, and
/// cannot write to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_keeps_the_urls_own_options() {
    use haul_store::{EventStore, NewEntry};
    let (_, url) = fresh_schema_url(&database_url()).await;
    let store = PgStore::connect(&PgConfig::new(&url)).await.unwrap();
    store.migrate().await.unwrap();
    let load = haul_core::ids::LoadId::parse("RO1").unwrap();
    let entry = NewEntry::stored("e1", "load_update", serde_json::json!({}));
    let now = haul_core::time::from_ms(1_772_434_800_000);
    store.append(&load, vec![entry.clone()], 0, vec![], now).await.unwrap();
    let reader = PgStore::connect(&PgConfig { read_only: true, ..PgConfig::new(&url) }).await.unwrap();
    let (records, version) = reader.read(&load).await.unwrap();
    assert_eq!((records.len(), version), (1, 1), "the reader reads the URL's schema");
    let next = NewEntry { entry_id: "e2".into(), ..entry };
    assert!(reader.append(&load, vec![next], 1, vec![], now).await.is_err(), "the reader cannot write");
}
