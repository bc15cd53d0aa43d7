//! A row the store cannot read back (changed behind its back) is a `StoreError` naming
//! a corrupt row, as on PostgreSQL, and the store keeps working.

use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::{EventStore, NewEntry, NewOutboxRow, Outbox, StoreError, TimerStore};
use serde_json::json;

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn assert_corrupt<T: std::fmt::Debug>(what: &str, got: Result<T, StoreError>) {
    let err = got.expect_err(what);
    assert!(err.0.starts_with("corrupt row: "), "{what}: {err}");
}

#[tokio::test]
async fn wrong_typed_columns_are_corrupt_row_errors() {
    let dir = std::env::temp_dir().join(format!("haul-corrupt-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("haul.db");
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    store.migrate().await.unwrap();
    let (l1, l2) = (LoadId::parse("L1").unwrap(), LoadId::parse("L2").unwrap());
    for l in [&l1, &l2] {
        let id = format!("{l}/e1/send_sms");
        let row = NewOutboxRow { action: json!({"key": id}), id, action_type: ActionType::SendSms, trace: None };
        let entry = NewEntry::stored("e1", "inbound_sms", json!({}));
        store.append(l, vec![entry], 0, vec![row], at(1)).await.unwrap();
    }
    let timer = TimerId::parse("tmr:L1:ask:eta_request:p1:1").unwrap();
    store.schedule(&timer, at(100), at(1)).await.unwrap();

    // SQLite keeps whatever type a value has, so a text where the store wrote an
    // integer is one UPDATE away.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "UPDATE outbox SET due_at = 'soon' WHERE load_id = 'L1';
         UPDATE timers SET fire_at = 'soon';
         UPDATE events SET recorded_at = 'then' WHERE load_id = 'L1';",
    )
    .unwrap();
    drop(raw);

    assert_corrupt("outbox row", store.rows_for_load(&l1).await);
    assert_corrupt("outbox row by id", store.get("L1/e1/send_sms").await);
    assert_corrupt("timer", store.get_timer(&timer).await);
    assert_corrupt("log", store.read(&l1).await);
    // The rows nobody touched still read.
    assert_eq!(store.rows_for_load(&l2).await.unwrap().len(), 1);
    assert_eq!(store.read(&l2).await.unwrap().1, 1);
}
