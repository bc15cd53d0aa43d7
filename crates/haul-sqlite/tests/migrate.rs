//! Versions 6 and 7 on a filled version-5 database: every MessageSid the webhook had
//! already seen (in a log, on the queue, kept as unmatched) is taken, where it went; a
//! dead row without a published outcome is due for the sweep.

use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, add};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::{LoadIndex, Outbox, SidClaim, SmsRoute};

const VERSION_5: [&str; 5] = [
    include_str!("../migrations/0001_init.sql"),
    include_str!("../migrations/0002_deliveries.sql"),
    include_str!("../migrations/0003_outcome_published.sql"),
    include_str!("../migrations/0004_load_index.sql"),
    include_str!("../migrations/0005_retention.sql"),
];

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn load(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

#[tokio::test]
async fn upgrade_to_version_6_takes_the_message_sids_already_seen() {
    let dir = std::env::temp_dir().join(format!("haul-migrate-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("haul.db");
    {
        // A version-5 database as version 5's store left it.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);",
        )
        .unwrap();
        for (i, sql) in VERSION_5.iter().enumerate() {
            conn.execute_batch(sql).unwrap();
            conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)", [i as i64 + 1]).unwrap();
        }
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
    assert_eq!(store.migrate().await.unwrap(), vec![6, 7]);
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
