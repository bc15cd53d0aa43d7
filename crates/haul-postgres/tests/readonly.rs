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
