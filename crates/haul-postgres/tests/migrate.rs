//! Upgrading a filled version-4 schema to the partitioned version 5 loses no row and
//! leaves a store that works: rows written through the store on the old schema are all
//! there, byte for byte, and the log, the outbox, timers and the queue carry on. Version
//! 6 takes every MessageSid the webhook had already seen; version 7 leaves every dead
//! row without a published outcome due for the sweep.

use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_postgres::PgStore;
use haul_postgres::testing::{FreshStore, client_in_schema, fresh_store};
use haul_store::{
    AppendError, DeliveryLog, EventStore, LoadIndex, LoadQueue, NewEntry, NewOutboxRow, OpsQueries, Outbox,
    OutboxStatus, Prune, Published, SidClaim, SmsRoute, TimerStatus, TimerStore,
};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(90);
const VIS: Duration = Duration::from_secs(30);
const LOADS: usize = 24;

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn load(i: usize) -> LoadId {
    LoadId::parse(&format!("L{i}")).unwrap()
}

fn entry(id: &str) -> NewEntry {
    NewEntry::stored(id, "inbound_sms", json!({"from": "+15555550100", "body": id}))
}

fn row(id: String) -> NewOutboxRow {
    NewOutboxRow { action: json!({"key": id}), id, action_type: ActionType::SendSms, trace: None }
}

fn timer(i: usize, n: u32) -> TimerId {
    TimerId::parse(&format!("tmr:L{i}:ask:eta_request:p{n}:1")).unwrap()
}

/// A store in a fresh schema with no migration applied, and a client on that schema.
async fn unmigrated() -> (PgStore, tokio_postgres::Client) {
    let options = FreshStore { pool_size: 4, schema_version: 0, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    let client = client_in_schema(&options.url, &schema).await;
    (s, client)
}

/// Every row of the tables 0005 touches, as text, in a fixed order; without the trace
/// contexts `writable_by_this_build` gave the old schema (0005 makes its tables anew).
async fn dump(client: &tokio_postgres::Client) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (table, order) in [
        ("events", "load_id, seq"),
        ("outbox", "load_id, id"),
        ("loads", "load_id"),
        ("timers", "timer_id"),
        ("queue", "id"),
        ("queue_heads", "load_id"),
        ("deliveries", "id"),
    ] {
        let row = client
            .query_one(
                &format!(
                    "SELECT count(*), coalesce(string_agg((to_jsonb(t) - 'trace')::text, E'\\n' ORDER BY {order}), '')
                     FROM {table} t"
                ),
                &[],
            )
            .await
            .unwrap();
        let n: i64 = row.get(0);
        assert!(n > 0, "the fixture writes rows to {table}");
        out.push((table.to_string(), row.get(1)));
    }
    out
}

/// Gives an old schema the columns this build writes that a build of its time did not
/// (the trace contexts of migration 22, which adds them only where they are missing),
/// so the tests can write the old rows through this build.
async fn writable_by_this_build(client: &tokio_postgres::Client) {
    let sql = "ALTER TABLE queue ADD COLUMN IF NOT EXISTS trace TEXT; ALTER TABLE events ADD COLUMN IF NOT EXISTS trace TEXT;
               ALTER TABLE outbox ADD COLUMN IF NOT EXISTS trace TEXT; ALTER TABLE timers ADD COLUMN IF NOT EXISTS trace TEXT";
    client.batch_execute(sql).await.unwrap();
}

/// Writes through the store on the version-4 schema: logs of every load, outbox rows in
/// every state, timers in every state, queue messages acked, in flight and waiting.
/// Returns the claim token of the row left claimed.
async fn fill(s: &PgStore) -> String {
    for i in 0..LOADS {
        let l = load(i);
        let keys = |e: &str| vec![row(format!("L{i}/{e}/send_sms")), row(format!("L{i}/{e}/set_timer"))];
        s.append(&l, vec![entry("e1"), entry("dec:e1")], 0, keys("e1"), at(1)).await.unwrap();
        s.append(&l, vec![entry("e2"), entry("dec:e2")], 2, keys("e2"), at(2)).await.unwrap();
        s.publish(&l, "q1", "{\"n\":1}", at(3)).await.unwrap();
        s.publish(&l, "q2", "{\"n\":2}", at(3)).await.unwrap();
        s.schedule(&timer(i, 1), at(100), at(3)).await.unwrap();
        s.schedule(&timer(i, 2), at(100), at(3)).await.unwrap();
        s.record_delivery("sms", &format!("L{i}/e1/send_sms"), &l, &json!({"to": "+15555550100"}), at(4))
            .await
            .unwrap();
    }
    // Outbox: 4 rows per load; dispatch, bury (with and without outcome), retry, and one left claimed.
    let claims = s.pending(1000, at(10), LEASE).await.unwrap();
    assert_eq!(claims.len(), LOADS * 4);
    let mut kept_token = String::new();
    for (n, c) in claims.iter().enumerate() {
        match n % 5 {
            0 => s.mark_dispatched(&c.row.id, &c.token, "r", at(11)).await.unwrap(),
            1 => {
                s.mark_failed(&c.row.id, &c.token, "400", None, at(11)).await.unwrap();
                s.mark_outcome_published(&c.row.id, at(12)).await.unwrap();
            }
            2 => s.mark_failed(&c.row.id, &c.token, "400", None, at(11)).await.unwrap(),
            3 => s.mark_failed(&c.row.id, &c.token, "503", Some(at(500)), at(11)).await.unwrap(),
            _ => kept_token = c.token.clone(),
        }
    }
    // Timers: fire one of each load's two, cancel a third before it is scheduled.
    for i in 0..LOADS {
        s.mark_fired(&timer(i, 1), at(101)).await.unwrap();
        s.cancel(&timer(i, 3), at(101)).await.unwrap();
    }
    // Queue: every load's q1 acked; then q2 received and left in flight for half of them.
    for m in s.receive(1000, VIS, at(20)).await.unwrap() {
        s.ack(&m.receipt, at(21)).await.unwrap();
    }
    let in_flight = s.receive(LOADS / 2, VIS, at(22)).await.unwrap();
    assert_eq!(in_flight.len(), LOADS / 2);
    kept_token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_from_version_4_keeps_every_row_and_the_store_works() {
    let (s, client) = unmigrated().await;
    assert_eq!(s.migrate_to(4).await.unwrap(), vec![1, 2, 3, 4]);
    writable_by_this_build(&client).await;
    let kept_token = fill(&s).await;
    let before = dump(&client).await;
    let unpublished = s.dead_without_outcome(1000).await.unwrap().len();
    assert!(unpublished > 0);
    let versions: Vec<u64> = {
        let mut v = Vec::new();
        for i in 0..LOADS {
            v.push(s.read(&load(i)).await.unwrap().1);
        }
        v
    };

    assert_eq!(s.migrate_to(5).await.unwrap(), vec![5]);
    assert_eq!(s.migrate_to(5).await.unwrap(), Vec::<i64>::new(), "applied once");
    writable_by_this_build(&client).await;

    // Every row, byte for byte.
    let after = dump(&client).await;
    for ((table, b), (_, a)) in before.iter().zip(&after) {
        assert!(a == b, "rows of {table} changed in the upgrade");
    }
    // Partitioned, and the rows spread over the partitions.
    for table in ["events", "outbox"] {
        let row = client
            .query_one(
                "SELECT c.relkind::text, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid)
                 FROM pg_class c WHERE c.oid = $1::text::regclass",
                &[&table],
            )
            .await
            .unwrap();
        assert_eq!((row.get::<_, String>(0), row.get::<_, i64>(1)), ("p".into(), 16), "{table}");
        let used: i64 =
            client.query_one(&format!("SELECT count(DISTINCT tableoid) FROM {table}"), &[]).await.unwrap().get(0);
        assert!(used > 4, "{table}: rows of {LOADS} loads spread over the partitions ({used})");
    }
    // No table of the old layout is left behind.
    let left: i64 = client
        .query_one("SELECT count(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE '%_v4'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);

    // The log: appends at the version read before the upgrade, conflicts and duplicates as before.
    for (i, v) in versions.iter().enumerate() {
        assert_eq!(*v, 4);
        let l = load(i);
        let err = s.append(&l, vec![entry("e3")], 2, vec![], at(600)).await.unwrap_err();
        assert!(matches!(err, AppendError::ConcurrencyConflict(_)), "{err:?}");
        let err = s.append(&l, vec![entry("e1")], 4, vec![], at(600)).await.unwrap_err();
        assert!(matches!(err, AppendError::DuplicateEntry(_)), "{err:?}");
        let err =
            s.append(&l, vec![entry("e3")], 4, vec![row(format!("L{i}/e1/send_sms"))], at(600)).await.unwrap_err();
        assert!(matches!(err, AppendError::DuplicateActionKey(_)), "a migrated key is still taken: {err:?}");
        let new = s
            .append(&l, vec![entry("e3"), entry("dec:e3")], 4, vec![row(format!("L{i}/e3/send_sms"))], at(600))
            .await
            .unwrap();
        assert_eq!(new, 6);
        let (records, v) = s.read(&l).await.unwrap();
        assert_eq!((records.len(), v), (6, 6));
        assert_eq!(s.read_after(&l, 4).await.unwrap().0.len(), 2);
    }

    // The outbox: the row claimed before the upgrade is still owned by its token until
    // its lease lapses; claims take the due rows of every load.
    let claimed: Vec<_> = all_rows(&s)
        .await
        .into_iter()
        .filter(|r| r.claim_token.as_deref() == Some(kept_token.as_str()) && r.status == OutboxStatus::Pending)
        .collect();
    let kept = claimed.first().expect("a row left claimed before the upgrade");
    s.check_claim(&kept.id, &kept_token, at(50)).await.unwrap();
    s.mark_dispatched(&kept.id, &kept_token, "r-after", at(50)).await.unwrap();
    let pending_before = s.count_by_status(OutboxStatus::Pending).await.unwrap();
    let claims = s.pending(10_000, at(700), LEASE).await.unwrap();
    assert_eq!(claims.len() as u64, pending_before, "every pending row is claimable");
    for c in &claims {
        s.mark_dispatched(&c.row.id, &c.token, "r", at(701)).await.unwrap();
    }
    assert_eq!(s.count_by_status(OutboxStatus::Pending).await.unwrap(), 0);
    assert_eq!(s.dead_without_outcome(1000).await.unwrap().len(), unpublished, "the sweep finds the same rows");

    // Timers and the queue carry on.
    assert_eq!(s.due(at(200), 1000).await.unwrap().len(), LOADS, "each load's scheduled timer");
    assert_eq!(s.get_timer(&timer(0, 3)).await.unwrap().unwrap().status, TimerStatus::Canceled);
    assert_eq!(s.publish(&load(0), "q1", "{}", at(800)).await.unwrap(), Published::Duplicate);
    let mut received = 0;
    for m in s.receive(1000, VIS, at(800)).await.unwrap() {
        s.ack(&m.receipt, at(801)).await.unwrap();
        received += 1;
    }
    assert_eq!(received, LOADS, "the in-flight messages came back, the waiting ones arrived");
    assert_eq!(s.depth().await.unwrap(), 0);

    // Retention runs on the partitioned tables (after the later migrations: today's
    // prune also deletes from tables they add, as shadow decisions).
    s.migrate().await.unwrap();
    let report = s.prune(at(10_000), 10_000).await.unwrap();
    assert_eq!(report.queue, 2 * LOADS as u64);
    assert_eq!(report.timers, 2 * LOADS as u64);
    assert!(report.outbox > 0);
    assert_eq!(s.read(&load(3)).await.unwrap().1, 6, "never the log");
}

/// Every outbox row of every load.
async fn all_rows(s: &PgStore) -> Vec<haul_store::OutboxRow> {
    let mut all = Vec::new();
    for i in 0..LOADS {
        all.extend(s.rows_for_load(&load(i)).await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_row_outside_its_load_stops_the_upgrade_and_changes_nothing() {
    let (s, client) = unmigrated().await;
    s.migrate_to(4).await.unwrap();
    writable_by_this_build(&client).await;
    s.append(&load(1), vec![entry("e1")], 0, vec![row("L1/e1/send_sms".into())], at(1)).await.unwrap();
    // Written by hand: no store version ever wrote such a row, but an upgrade must not
    // turn it into a silent hole in key uniqueness.
    client
        .execute(
            "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at, updated_at)
             VALUES ('L2/e1/send_sms', 'L1', 'send_sms', '{}', 'pending', 0, 0, 0)",
            &[],
        )
        .await
        .unwrap();
    let err = s.migrate().await.unwrap_err();
    assert!(err.to_string().contains("migration 5"), "{err}");
    let version: i64 = client.query_one("SELECT max(version) FROM schema_migrations", &[]).await.unwrap().get(0);
    assert_eq!(version, 4);
    let rows: i64 = client.query_one("SELECT count(*) FROM outbox", &[]).await.unwrap().get(0);
    assert_eq!(rows, 2, "rolled back whole");
    assert_eq!(s.read(&load(1)).await.unwrap().1, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_to_version_6_takes_the_message_sids_already_seen() {
    let (s, client) = unmigrated().await;
    assert_eq!(s.migrate_to(5).await.unwrap(), vec![1, 2, 3, 4, 5]);
    writable_by_this_build(&client).await;
    // An SMS in a log, one still on the queue, one kept as unmatched (version 5 has no
    // reason column, so it is written as version 5's store wrote it).
    s.append(&load(0), vec![entry("sms:SMlog0"), entry("dec:sms:SMlog0")], 0, vec![], at(1)).await.unwrap();
    s.publish(&load(1), "sms:SMqueue1", "{}", at(2)).await.unwrap();
    client
        .execute(
            "INSERT INTO unmatched_sms (message_sid, from_phone, to_phone, body, received_at)
             VALUES ('SMkept2', '+15555550199', '+15555550000', 'hi', 3000)",
            &[],
        )
        .await
        .unwrap();

    assert_eq!(s.migrate_to(6).await.unwrap(), vec![6]);
    let elsewhere = SmsRoute::Load(load(9));
    let taken = async |sid: &str| s.claim_message_sid(sid, &elsewhere, at(10)).await.unwrap();
    assert_eq!(taken("SMlog0").await, SidClaim::Taken(SmsRoute::Load(load(0))));
    assert_eq!(taken("SMqueue1").await, SidClaim::Taken(SmsRoute::Load(load(1))));
    assert_eq!(taken("SMkept2").await, SidClaim::Taken(SmsRoute::Unmatched));
    assert_eq!(taken("SMnew3").await, SidClaim::New);
    let kept = s.unmatched_sms(10).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].reason, "no single active load has this driver phone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_to_version_9_fills_each_loads_summary_from_its_log() {
    let (s, client) = unmigrated().await;
    s.migrate_to(6).await.unwrap();
    writable_by_this_build(&client).await;
    // L0: stage set twice, an ask opened then escalated, and a record that is not JSON.
    // L1: two asks, one open and one answered. L2: nothing of either.
    client
        .batch_execute(
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
        .await
        .unwrap();
    assert_eq!(s.migrate().await.unwrap(), (7..=haul_postgres::SCHEMA_VERSION).collect::<Vec<_>>());
    let page = s.loads_page(&haul_store::LoadFilter::default(), None, 10).await.unwrap();
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
    let next = haul_store::contract::decision(
        "y",
        serde_json::json!([{"ask_id": "ask:eta_request:a", "step": 2, "status": "closed"}]),
    );
    s.append(&load(1), vec![next], 2, vec![], at(9)).await.unwrap();
    let l1 = s.loads_page(&haul_store::LoadFilter::default(), Some(&load(0)), 1).await.unwrap().loads.remove(0);
    assert_eq!((l1.open_asks, l1.escalated_asks, l1.version), (0, 0, 3));
}

#[tokio::test]
async fn upgrade_to_version_7_leaves_dead_rows_due_for_the_sweep() {
    let (s, client) = unmigrated().await;
    s.migrate_to(6).await.unwrap();
    writable_by_this_build(&client).await;
    let key = format!("{}/e1/send_sms", load(0));
    s.append(&load(0), vec![entry("e1")], 0, vec![row(key.clone())], at(1)).await.unwrap();
    let c = s.pending(1, at(2), Duration::from_secs(90)).await.unwrap().remove(0);
    s.mark_failed(&c.row.id, &c.token, "HTTP 400", None, at(3)).await.unwrap();

    assert_eq!(s.migrate().await.unwrap(), (7..=haul_postgres::SCHEMA_VERSION).collect::<Vec<_>>());
    let due = s.unsettled_due(at(3), 10).await.unwrap();
    let got: Vec<_> = due.iter().map(|u| (u.row.id.as_str(), u.settle_attempts, u.settle_due_at)).collect();
    assert_eq!(got, vec![(key.as_str(), 0, None)], "a row buried before the upgrade is due at once");
    assert!(s.ops_alerts(&haul_store::RowCursor::start(), 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn upgrade_to_version_13_marks_dead_rows_whose_requeued_copy_was_delivered_handled() {
    let (s, client) = unmigrated().await;
    s.migrate_to(12).await.unwrap();
    writable_by_this_build(&client).await;
    let (dead, copy) = (format!("{}/e1/send_sms", load(0)), format!("{}/op:r1/send_sms", load(0)));
    let other = format!("{}/e2/send_sms", load(0));
    s.append(&load(0), vec![entry("e1")], 0, vec![row(dead.clone()), row(other.clone())], at(1)).await.unwrap();
    for c in s.pending(10, at(2), LEASE).await.unwrap() {
        s.mark_failed(&c.row.id, &c.token, "HTTP 400", None, at(3)).await.unwrap();
    }
    let copy_row = NewOutboxRow {
        action: json!({"key": copy, "requeue_of": dead}),
        id: copy.clone(),
        action_type: ActionType::SendSms,
        trace: None,
    };
    s.append(&load(0), vec![entry("op:r1")], 1, vec![copy_row], at(4)).await.unwrap();
    let c = s.pending(1, at(5), LEASE).await.unwrap().remove(0);
    s.mark_dispatched(&c.row.id, &c.token, "SM1", at(6)).await.unwrap();

    assert_eq!(s.migrate().await.unwrap(), vec![13, 14, 15, 16, 17, 18, 19, 20, 21, 22]);
    let rows = s.dead_rows_page(&[], None, None, 10).await.unwrap();
    let got: Vec<_> = rows.iter().map(|d| (d.row.id.clone(), d.inbox.state, d.inbox.by.clone(), d.inbox.at)).collect();
    use haul_core::InboxState::{Handled, Open};
    assert_eq!(got, vec![(other, Open, None, None), (dead, Handled, Some("migration 13".into()), Some(at(6)))]);
}
