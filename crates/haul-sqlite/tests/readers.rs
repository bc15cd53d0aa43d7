//! Every read-only method of the SQLite store answers while the writer thread is
//! stuck: reads go to read-only connections (WAL lets them read beside a writer), not
//! to the writer's queue. In memory there is one connection, and reads share it.

use std::path::Path;
use std::time::{Duration, Instant};

use haul_core::action::ActionType;
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::{
    DeliveryLog, EventStore, LoadIndex, LoadQueue, NewEntry, NewOutboxRow, Outbox, OutboxStatus, RowCursor, TimerStore,
};
use serde_json::json;

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

async fn file_store() -> (SqliteStore, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("haul-readers-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("haul.db");
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    store.migrate().await.unwrap();
    (store, path)
}

/// A load with a log, an outbox row, a timer, a queued message, a delivery, facts.
async fn fill(s: &SqliteStore) -> LoadId {
    let l = LoadId::parse("L1").unwrap();
    // A load_update: the append writes the load's facts too.
    let entry = NewEntry::stored("e1", "load_update", json!({"driver_phone": "+15555550100"}));
    let row =
        NewOutboxRow { id: "L1/e1/send_sms".into(), action_type: ActionType::SendSms, action: json!({}), trace: None };
    s.append(&l, vec![entry], 0, vec![row], at(0)).await.unwrap();
    s.schedule(&TimerId::parse("tmr:L1:ask:eta_request:e1:1").unwrap(), at(60), at(0)).await.unwrap();
    s.publish(&l, "e2", "{}", at(0)).await.unwrap();
    s.record_delivery("sms", "L1/e1/send_sms", &l, &json!({}), at(0)).await.unwrap();
    l
}

/// Another connection takes the write lock and keeps it for `hold`.
fn hold_write_lock(path: &Path, hold: Duration) -> std::thread::JoinHandle<()> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        conn.execute_batch("ROLLBACK").unwrap();
    })
}

/// Awaits a read that must not wait for the writer.
async fn quick<T>(what: &str, read: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_millis(500), read)
        .await
        .unwrap_or_else(|_| panic!("{what} waited for the writer"));
    println!("{what}: {:?}", started.elapsed());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_read_answers_while_the_writer_waits_for_a_lock() {
    let (s, path) = file_store().await;
    let l = fill(&s).await;
    let token = s.pending(1, at(0), Duration::from_secs(90)).await.unwrap().remove(0).token;
    let release = hold_write_lock(&path, Duration::from_secs(3));
    // A write: the writer thread takes it and waits in BEGIN IMMEDIATE.
    let write = {
        let s = s.clone();
        tokio::spawn(async move { s.publish(&LoadId::parse("L2").unwrap(), "e1", "{}", at(1)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert_eq!(quick("read", s.read(&l)).await.unwrap().1, 1);
    assert_eq!(quick("read_after", s.read_after(&l, 0)).await.unwrap().0.len(), 1);
    assert_eq!(quick("load_ids", s.load_ids(None, 10)).await.unwrap(), vec![l.clone()]);
    assert_eq!(quick("read_page", s.read_page(&l, 0, 10)).await.unwrap().len(), 1);
    assert!(quick("get", s.get("L1/e1/send_sms")).await.unwrap().is_some());
    let claim = quick("check_claim", s.check_claim("L1/e1/send_sms", &token, at(1))).await;
    assert!(claim.is_ok(), "{claim:?}");
    assert_eq!(quick("rows_for_load_page", s.rows_for_load_page(&l, &RowCursor::start(), 10)).await.unwrap().len(), 1);
    assert_eq!(quick("rows_for_load", s.rows_for_load(&l)).await.unwrap().len(), 1);
    assert_eq!(quick("oldest_pending_created_at", s.oldest_pending_created_at()).await.unwrap(), Some(at(0)));
    assert!(quick("dead", s.dead(at(0), 10)).await.unwrap().is_empty());
    assert_eq!(quick("count_by_status", s.count_by_status(OutboxStatus::Pending)).await.unwrap(), 1);
    assert!(quick("dead_without_outcome", s.dead_without_outcome(10)).await.unwrap().is_empty());
    assert!(quick("unsettled_due", s.unsettled_due(at(1), 10)).await.unwrap().is_empty());
    assert!(quick("ops_alerts", s.ops_alerts(&RowCursor::start(), 10)).await.unwrap().is_empty());
    assert!(quick("due", s.due(at(0), 10)).await.unwrap().is_empty());
    assert_eq!(quick("timers_for_load", s.timers_for_load(&l)).await.unwrap().len(), 1);
    assert_eq!(
        quick("timers_for_load_page", s.timers_for_load_page(&l, &RowCursor::start(), 10)).await.unwrap().len(),
        1
    );
    let timer = TimerId::parse("tmr:L1:ask:eta_request:e1:1").unwrap();
    assert!(quick("get_timer", s.get_timer(&timer)).await.unwrap().is_some());
    assert_eq!(quick("depth", s.depth()).await.unwrap(), 1);
    assert!(quick("published_body", s.published_body(&l, "e2")).await.unwrap().is_some());
    assert_eq!(quick("deliveries", s.deliveries(Some(&l), 10)).await.unwrap().len(), 1);
    assert_eq!(quick("loads_by_phone", s.loads_by_phone("+15555550100")).await.unwrap(), vec![l.clone()]);
    assert!(quick("unmatched_sms", s.unmatched_sms(10)).await.unwrap().is_empty());

    assert!(!write.is_finished(), "the writer was busy all along");
    release.join().unwrap();
    write.await.unwrap().unwrap();
    assert_eq!(s.depth().await.unwrap(), 2, "the write went through once the lock was free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_right_after_a_commit_sees_it() {
    let (s, _path) = file_store().await;
    let l = fill(&s).await;
    // A read right after a commit sees it: the writer answers only after COMMIT.
    for n in 2..50u64 {
        let entry = NewEntry::stored(format!("e{n}"), "inbound_sms", json!({}));
        s.append(&l, vec![entry], n - 1, vec![], at(n)).await.unwrap();
        assert_eq!(s.read(&l).await.unwrap().1, n);
    }
}

#[tokio::test]
async fn in_memory_reads_share_the_one_connection() {
    let s = SqliteStore::open(&SqliteConfig::from_url("sqlite::memory:").unwrap()).unwrap();
    s.migrate().await.unwrap();
    let l = fill(&s).await;
    assert_eq!(s.read(&l).await.unwrap().1, 1);
    assert_eq!(s.depth().await.unwrap(), 1);
}
