//! A row the store cannot read back (its schema changed behind the store's back) is a
//! `StoreError` naming a corrupt row, as on SQLite: never a panic in the worker or the
//! dispatcher that read it. The other rows still read.

use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_postgres::testing::{FreshStore, client_in_schema, fresh_store};
use haul_store::{EventStore, LoadQueue, NewEntry, NewOutboxRow, Outbox, StoreError, TimerStore};
use serde_json::json;

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn assert_corrupt<T: std::fmt::Debug>(what: &str, got: Result<T, StoreError>) {
    let err = got.expect_err(what);
    assert!(err.0.starts_with("corrupt row: column "), "{what}: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_and_null_columns_are_corrupt_row_errors() {
    let options = FreshStore { pool_size: 4, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    let (l1, l2) = (LoadId::parse("L1").unwrap(), LoadId::parse("L2").unwrap());
    for l in [&l1, &l2] {
        let id = format!("{l}/e1/send_sms");
        let row = NewOutboxRow { action: json!({"key": id}), id, action_type: ActionType::SendSms, trace: None };
        let entry = NewEntry::stored("e1", "inbound_sms", json!({}));
        s.append(l, vec![entry], 0, vec![row], at(1)).await.unwrap();
    }
    let timer = TimerId::parse("tmr:L1:ask:eta_request:p1:1").unwrap();
    s.schedule(&timer, at(100), at(1)).await.unwrap();
    s.publish(&l1, "q1", "{}", at(1)).await.unwrap();

    let client = client_in_schema(&options.url, &schema).await;
    client
        .batch_execute(
            "ALTER TABLE timers ALTER COLUMN fire_at TYPE text USING fire_at::text;
             ALTER TABLE outbox ALTER COLUMN attempts TYPE bigint;
             ALTER TABLE queue ALTER COLUMN receive_count TYPE bigint;
             ALTER TABLE events ALTER COLUMN recorded_at DROP NOT NULL;
             UPDATE events SET recorded_at = NULL WHERE load_id = 'L1';",
        )
        .await
        .unwrap();

    // A text where the store reads a bigint, a bigint where it reads an integer, a NULL
    // where it reads a value: each used to panic in `Row::get`.
    assert_corrupt("timer", s.get_timer(&timer).await);
    assert_corrupt("outbox rows", s.rows_for_load(&l2).await);
    assert_corrupt("claim", s.pending(10, at(10), Duration::from_secs(60)).await);
    assert_corrupt("queue message", s.receive(10, Duration::from_secs(30), at(2)).await);
    assert_corrupt("log", s.read(&l1).await);
    assert_eq!(s.read(&l2).await.unwrap().1, 1, "a load nobody touched still reads");
}

/// The summary's asks are folded in SQL when an append changes them; stored asks that
/// are not JSON fail that fold, and the append then runs step by step and reads them as
/// no asks (as on SQLite): the load is not poisoned, and its summary is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_asks_that_are_not_json_do_not_stop_an_append() {
    let options = FreshStore { pool_size: 4, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    let l = LoadId::parse("L1").unwrap();
    let decision = haul_store::contract::decision;
    let ask = |id: &str, status: &str| json!({"ask_id": format!("ask:eta_request:{id}"), "step": 1, "status": status});
    s.append(&l, vec![decision("e1", json!([ask("a1", "open"), ask("a2", "escalated")]))], 0, vec![], at(1))
        .await
        .unwrap();
    let client = client_in_schema(&options.url, &schema).await;
    let summary = async || -> (String, i32, i32) {
        let r = client.query_one("SELECT asks, open_asks, escalated_asks FROM loads WHERE load_id = 'L1'", &[]).await;
        let r = r.unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let (asks, open, escalated) = summary().await;
    let asks: serde_json::Value = serde_json::from_str(&asks).unwrap();
    assert_eq!(
        (asks, open, escalated),
        (json!({"ask:eta_request:a1": "open", "ask:eta_request:a2": "escalated"}), 1, 1)
    );

    client.batch_execute("UPDATE loads SET asks = 'not json' WHERE load_id = 'L1'").await.unwrap();
    s.append(&l, vec![decision("e2", json!([ask("a3", "open")]))], 1, vec![], at(2)).await.unwrap();
    let (asks, open, escalated) = summary().await;
    let asks: serde_json::Value = serde_json::from_str(&asks).unwrap();
    assert_eq!((asks, open, escalated), (json!({"ask:eta_request:a3": "open"}), 1, 0));
    assert_eq!(s.read(&l).await.unwrap().1, 2, "both appends are in the log");
}

/// A load's first append in a batch does not look for taken entry ids or keys (a load
/// without a version row has none). Should the log hold rows of a load whose version
/// row is gone, the append is still refused as a duplicate, and nothing of it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_append_meeting_rows_without_a_version_row_is_refused_as_before() {
    let options = FreshStore { pool_size: 4, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    let l = LoadId::parse("L1").unwrap();
    let entry = |id: &str| NewEntry::stored(id, "inbound_sms", json!({}));
    let row = |id: &str| NewOutboxRow {
        action: json!({"key": id}),
        id: id.into(),
        action_type: ActionType::SendSms,
        trace: None,
    };
    s.append(&l, vec![entry("e1")], 0, vec![row("L1/e1/send_sms")], at(1)).await.unwrap();
    let client = client_in_schema(&options.url, &schema).await;
    client.batch_execute("DELETE FROM loads WHERE load_id = 'L1'").await.unwrap();
    let got = s.append(&l, vec![entry("e1")], 0, vec![], at(2)).await;
    assert!(
        matches!(&got, Err(haul_store::AppendError::DuplicateEntry(d)) if d.entry_id == "e1"),
        "a duplicate entry, not {got:?}"
    );
    let got = s.append(&l, vec![entry("e2")], 0, vec![row("L1/e1/send_sms")], at(2)).await;
    assert!(matches!(&got, Err(haul_store::AppendError::DuplicateActionKey(_))), "a duplicate key, not {got:?}");
    let kept: i64 = client.query_one("SELECT count(*) FROM loads", &[]).await.unwrap().get(0);
    assert_eq!(kept, 0, "the refused appends left no version row");
}
