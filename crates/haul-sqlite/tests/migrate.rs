//! Versions 6 and 7 on a filled version-5 database: every MessageSid the webhook had
//! already seen (in a log, on the queue, kept as unmatched) is taken, where it went; a
//! dead row without a published outcome is due for the sweep. Version 9 fills each
//! load's summary from its log; version 13 marks handled the dead rows whose requeued
//! copy was delivered before it.

use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, add};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::{LoadFilter, LoadIndex, OpsQueries, Outbox, SidClaim, SmsRoute};

/// Migrations 1 to 12, in order: a database at version N has the first N.
const MIGRATIONS_TO_12: [&str; 12] = [
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_deliveries.sql"),
    include_str!("../migrations/0003_outcome_published.sql"),
    include_str!("../migrations/0004_load_index.sql"),
    include_str!("../migrations/0005_retention.sql"),
    include_str!("../migrations/0006_message_sids.sql"),
    include_str!("../migrations/0007_ops_alerts.sql"),
    include_str!("../migrations/0008_operator_actions.sql"),
    include_str!("../migrations/0009_ops_queries.sql"),
    include_str!("../migrations/0010_shadow_decisions.sql"),
    include_str!("../migrations/0011_conflicts.sql"),
    include_str!("../migrations/0012_edge.sql"),
];

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn load(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

/// A new database file with `migrations` applied (version 1 first), as the store that
/// wrote them left it: where an upgrade starts.
fn database_at(migrations: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("haul-migrate-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("haul.db");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);")
        .unwrap();
    for (i, sql) in migrations.iter().enumerate() {
        conn.execute_batch(sql).unwrap();
        conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)", [i as i64 + 1]).unwrap();
    }
    path
}

#[tokio::test]
async fn upgrade_to_version_6_takes_the_message_sids_already_seen() {
    // A version-5 database as version 5's store left it.
    let path = database_at(&MIGRATIONS_TO_12[..5]);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "INSERT INTO loads VALUES ('L0', 2, 1000, 1000);
             INSERT INTO events VALUES ('L0', 1, 'sms:SMlog0', 'inbound_sms', '{}', 1000),
                                       ('L0', 2, 'dec:sms:SMlog0', 'decision_recorded', '{}', 1000);
             INSERT INTO queue (load_id, event_id, body, enqueued_at) VALUES ('L1', 'sms:SMqueue1', '{}', 2000);
             INSERT INTO unmatched_sms VALUES ('SMkept2', '+15555550199', '+15555550000', 'hi', 3000);
             INSERT INTO outbox (id, load_id, action_type, action, status, attempts, due_at, created_at, updated_at,
                                 dead_at, last_failure)
                 VALUES ('L0/e1/send_sms', 'L0', 'send_sms', '{}', 'dead', 1, 1000, 1000, 2000, 2000, 'HTTP 400');",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    assert_eq!(store.migrate().await.unwrap().first(), Some(&6), "6 first, then any later version");
    assert_eq!(store.migrate().await.unwrap(), Vec::<i64>::new(), "applied once");
    let elsewhere = SmsRoute::Load(load("L9"));
    let taken = async |sid: &str| store.claim_message_sid(sid, &elsewhere, at(10)).await.unwrap();
    assert_eq!(taken("SMlog0").await, SidClaim::Taken(SmsRoute::Load(load("L0"))));
    assert_eq!(taken("SMqueue1").await, SidClaim::Taken(SmsRoute::Load(load("L1"))));
    assert_eq!(taken("SMkept2").await, SidClaim::Taken(SmsRoute::Unmatched));
    assert_eq!(taken("SMnew3").await, SidClaim::New);
    let kept = store.unmatched_sms(10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].reason, "no single active load has this driver phone");
    // Version 7: a row buried before it is due for the sweep at once; no alert is kept yet.
    let due = store.unsettled_due(at(0), 10).await.unwrap();
    let got: Vec<_> = due.iter().map(|u| (u.row.id.as_str(), u.settle_attempts, u.settle_due_at)).collect();
    assert_eq!(got, vec![("L0/e1/send_sms", 0, None)]);
    assert!(store.ops_alerts(&haul_store::RowCursor::start(), 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn upgrade_to_version_9_fills_each_loads_summary_from_its_log() {
    let path = database_at(&MIGRATIONS_TO_12[..6]);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        // L0: stage set twice, an ask opened then escalated, and a record that is not
        // JSON. L1: two asks, one open and one answered. L2: nothing of either.
        conn.execute_batch(
            r#"INSERT INTO loads VALUES ('L0', 5, 1000, 5000), ('L1', 2, 1000, 2000), ('L2', 1, 1000, 1000);
               INSERT INTO events VALUES
                 ('L0', 1, 'u1', 'load_update', '{"stage":"at_pickup"}', 1000),
                 ('L0', 2, 'dec:u1', 'decision_recorded', '{"asks":[{"ask_id":"ask:eta_request:u1","step":1,"status":"open"}]}', 1000),
                 ('L0', 3, 'u2', 'load_update', '{"stage":"in_transit","client":"c"}', 3000),
                 ('L0', 4, 'dec:t1', 'decision_recorded', '{"asks":[{"ask_id":"ask:eta_request:u1","step":2,"status":"escalated"}]}', 4000),
                 ('L0', 5, 'x1', 'load_update', 'not json', 5000),
                 ('L1', 1, 'u1', 'load_update', '{"client":"c"}', 1000),
                 ('L1', 2, 'dec:u1', 'decision_recorded', '{"asks":[{"ask_id":"ask:eta_request:a","step":1,"status":"open"},{"ask_id":"ask:eta_request:b","step":1,"status":"open"},{"ask_id":"ask:eta_request:b","step":1,"status":"answered"}]}', 2000),
                 ('L2', 1, 'p1', 'location_ping', '{}', 1000);"#,
        )
        .unwrap();
    }
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    assert_eq!(store.migrate().await.unwrap(), (7..=haul_sqlite::SCHEMA_VERSION).collect::<Vec<_>>());
    let page = store.loads_page(&LoadFilter::default(), None, 10).await.unwrap();
    let got: Vec<(String, Option<String>, u32, u32, i64)> = page
        .loads
        .iter()
        .map(|l| {
            let ms = haul_core::time::to_ms(l.last_activity_at);
            (l.load_id.to_string(), l.stage.clone(), l.open_asks, l.escalated_asks, ms)
        })
        .collect();
    let st = |s: &str| Some(s.to_string());
    assert_eq!(
        got,
        vec![
            ("L0".into(), st("in_transit"), 0, 1, 5000),
            ("L1".into(), None, 1, 0, 2000),
            ("L2".into(), None, 0, 0, 1000),
        ]
    );
    // The summary goes on from there with the next append.
    let next = haul_store::contract::decision(
        "y",
        serde_json::json!([{"ask_id": "ask:eta_request:a", "step": 2, "status": "closed"}]),
    );
    haul_store::EventStore::append(&store, &load("L1"), vec![next], 2, vec![], at(9)).await.unwrap();
    let l1 = store.loads_page(&LoadFilter::default(), Some(&load("L0")), 1).await.unwrap().loads.remove(0);
    assert_eq!((l1.open_asks, l1.escalated_asks, l1.version), (0, 0, 3));
}

#[tokio::test]
async fn upgrade_to_version_13_marks_dead_rows_whose_requeued_copy_was_delivered_handled() {
    let path = database_at(&MIGRATIONS_TO_12);
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        // Two dead Hero tasks; one was requeued and its copy delivered, the other's
        // copy is still pending.
        conn.execute_batch(
            "INSERT INTO outbox (id, load_id, action_type, action, status, attempts, due_at, created_at, updated_at, dead_at)
             VALUES ('L0/e1/create_hero_task', 'L0', 'create_hero_task', '{}', 'dead', 3, 1000, 1000, 2000, 2000),
                    ('L0/op:r1/create_hero_task', 'L0', 'create_hero_task',
                     '{\"requeue_of\":\"L0/e1/create_hero_task\"}', 'dispatched', 1, 3000, 3000, 4000, NULL),
                    ('L0/e2/create_hero_task', 'L0', 'create_hero_task', '{}', 'dead', 3, 1000, 1000, 2000, 2000),
                    ('L0/op:r2/create_hero_task', 'L0', 'create_hero_task',
                     '{\"requeue_of\":\"L0/e2/create_hero_task\"}', 'pending', 0, 3000, 3000, 3000, NULL);",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&SqliteConfig::from_url(&format!("sqlite://{}", path.display())).unwrap()).unwrap();
    assert_eq!(store.migrate().await.unwrap(), vec![13, 14, 15, 16, 17, 18, 19, 20, 21, 22]);
    let rows = store.dead_rows_page(&[], None, None, 10).await.unwrap();
    let got: Vec<_> =
        rows.iter().map(|d| (d.row.id.as_str(), d.inbox.state, d.inbox.by.as_deref(), d.inbox.at)).collect();
    use haul_core::InboxState::{Handled, Open};
    assert_eq!(
        got,
        vec![
            ("L0/e2/create_hero_task", Open, None, None),
            ("L0/e1/create_hero_task", Handled, Some("migration 13"), Some(haul_core::time::from_ms(4000))),
        ]
    );
}
