//! Every hot query of the PostgreSQL store can be served by an index.
//!
//! In its own schema, with some rows of every kind, the test turns `enable_seqscan` off
//! and runs `EXPLAIN (FORMAT JSON)` on the store's own statements (`haul_postgres::sql`)
//! with realistic parameters. The planner then picks a sequential scan only where no
//! index can serve the query, so a `Seq Scan` node fails the test whatever the table
//! sizes are. Each statement is planned twice: with its parameters (a custom plan) and
//! as a prepared statement's generic plan (`EXPLAIN EXECUTE` under `plan_cache_mode =
//! force_generic_plan`), which is what the store's sessions run, so partial indexes
//! must match without the values.
//! Per-load statements must also touch one partition of the log or the outbox.

use haul_core::action::ActionType;
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add, to_ms};
use haul_postgres::sql::*;
use haul_postgres::testing::{FreshStore, client_in_schema, fresh_store};
use haul_store::{
    EventStore, LoadIndex, LoadQueue, NewEntry, NewOutboxRow, OpsQueries, Outbox, SmsRoute, TimerStore, UnmatchedSms,
};
use serde_json::{Value, json};
use std::time::Duration;
use tokio_postgres::types::{FromSql, ToSql, Type};

/// A `json` column as text (the crate is built without tokio-postgres' serde feature).
struct Json(String);

impl<'a> FromSql<'a> for Json {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Json(String::from_utf8(raw.to_vec())?))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON
    }
}

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

/// Some rows of every kind in every table, over 40 loads.
async fn fill(s: &haul_postgres::PgStore) {
    for i in 0..40 {
        let l = LoadId::parse(&format!("L{i}")).unwrap();
        let rows = (0..3)
            .map(|k| {
                let id = format!("L{i}/e1/a{k}");
                NewOutboxRow { action: json!({"key": id}), id, action_type: ActionType::SendSms, trace: None }
            })
            .collect();
        let entries = ["e1", "dec:e1"].iter().map(|e| NewEntry::stored(*e, "inbound_sms", json!({}))).collect();
        s.append(&l, entries, 0, rows, at(1)).await.unwrap();
        let t = TimerId::parse(&format!("tmr:L{i}:ask:eta_request:p:1")).unwrap();
        s.schedule(&t, at(100), at(1)).await.unwrap();
        if i % 2 == 0 {
            s.mark_fired(&t, at(101)).await.unwrap();
        }
        s.publish(&l, "q1", "{}", at(1)).await.unwrap();
        s.publish(&l, "q2", "{}", at(1)).await.unwrap();
        if i % 5 == 0 {
            s.record_conflict(&l, at(2)).await.unwrap();
        }
        let sid = format!("SM{i:032x}");
        let route = if i % 4 == 0 { SmsRoute::Unmatched } else { SmsRoute::Load(l.clone()) };
        s.claim_message_sid(&sid, &route, at(1)).await.unwrap();
        if route == SmsRoute::Unmatched {
            let sms = UnmatchedSms {
                message_sid: sid,
                from: "+15555550199".into(),
                to: "+15555550000".into(),
                body: "hi".into(),
                received_at: at(1),
                reason: "no single active load has this driver phone".into(),
            };
            s.record_unmatched_sms(&sms).await.unwrap();
        }
    }
    let claims = s.pending(1000, at(2), Duration::from_secs(90)).await.unwrap();
    for (n, c) in claims.iter().enumerate() {
        match n % 3 {
            0 => s.mark_dispatched(&c.row.id, &c.token, "r", at(3)).await.unwrap(),
            1 => s.mark_failed(&c.row.id, &c.token, "400", None, at(3)).await.unwrap(),
            _ => {}
        }
    }
    for m in s.receive(20, Duration::from_secs(30), at(4)).await.unwrap() {
        s.ack(&m.receipt, at(5)).await.unwrap();
    }
}

/// The plan nodes under `plan`: (node type, relation name).
fn nodes(plan: &Value, out: &mut Vec<(String, String)>) {
    let name = |k: &str| plan.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    out.push((name("Node Type"), name("Relation Name")));
    for child in plan.get("Plans").and_then(Value::as_array).into_iter().flatten() {
        nodes(child, out);
    }
}

struct Case<'a> {
    name: &'static str,
    sql: &'static str,
    params: Vec<&'a (dyn ToSql + Sync)>,
    /// Names one load: must touch one partition of events / outbox.
    one_load: bool,
}

fn case<'a>(name: &'static str, sql: &'static str, params: Vec<&'a (dyn ToSql + Sync)>) -> Case<'a> {
    Case { name, sql, params, one_load: false }
}

fn per_load<'a>(name: &'static str, sql: &'static str, params: Vec<&'a (dyn ToSql + Sync)>) -> Case<'a> {
    Case { one_load: true, ..case(name, sql, params) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hot_query_is_served_by_an_index() {
    let options = FreshStore { pool_size: 4, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    fill(&s).await;
    let client = client_in_schema(&options.url, &schema).await;
    client
        .batch_execute(
            "ANALYZE events, outbox, loads, timers, queue, queue_heads, message_sids, unmatched_sms, ops_alerts, sms_consent, sms_reports, llm_spend, prompts;
             SET enable_seqscan = off;",
        )
        .await
        .unwrap();

    let (l, key, token, receipt) = ("L7", "L7/e1/a0", "00ff", "3.00ff");
    let timer = "tmr:L7:ask:eta_request:p:1";
    let (now, later, zero, limit, one, version) = (to_ms(at(50)), to_ms(at(140)), 0i64, 32i64, 1i64, 2i64);
    let entry_ids = vec!["e1", "dec:e1"];
    let keys = vec![key];
    let tokens = vec![token];
    let (loads, nows) = (vec![l], vec![now]);
    let (timers, fire_ats) = (vec![timer], vec![later]);
    let seqs = vec![3i64, 4];
    let texts = vec!["x", "y"];
    let traces = vec![None::<&str>, Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")];
    let (pending, empty, hero) = ("pending", "", "create_hero_task");
    let (sid, phone) = ("SM8a1f", "+15555550100");
    let phones = vec![phone];
    let (stage, asks, count, window, last) = (Some("in_transit"), Some(r#"{"a":"open"}"#), Some(1i32), 5000i64, "L9");
    let (no_text, no_ms, no, yes) = (None::<&str>, None::<i64>, false, true);
    let (open, states) = (Some("open"), vec!["dismissed"]);
    let (min, max, types) = (i64::MIN, i64::MAX, ",send_sms,create_hero_task,");
    let (take_types, take_keys, take_us) = (vec!["send_sms"], vec!["sms"], vec![100_000i64]);
    let (day, no_client) = ("2026-03-02", None::<&str>);
    let cases = vec![
        per_load("read / read_after", READ_AFTER, vec![&l, &zero]),
        per_load("read_page", READ_PAGE, vec![&l, &zero, &limit]),
        case("append: first version", LOAD_CREATE, vec![&l, &version, &now]),
        case("append: version check", LOAD_ADVANCE, vec![&l, &seqs[1], &version, &now]),
        case("append in a batch: first version", LOAD_CREATE_OR_FAIL, vec![&l, &version, &now]),
        case("append in a batch: version check", LOAD_ADVANCE_OR_FAIL, vec![&l, &seqs[1], &version, &now]),
        case("append: conflict's version", LOAD_VERSION, vec![&l]),
        per_load("append: entry ids taken", ENTRY_IDS_TAKEN, vec![&l, &entry_ids]),
        per_load("append: outbox keys taken", OUTBOX_KEYS_TAKEN, vec![&l, &keys]),
        per_load("append: events", EVENTS_INSERT, vec![&l, &seqs, &texts, &texts, &texts, &now, &traces]),
        per_load(
            "append: outbox rows",
            OUTBOX_INSERT,
            vec![&l, &keys, &texts, &texts, &now, &traces, &no_text, &no_ms],
        ),
        case("load_ids", LOAD_IDS, vec![&empty, &limit]),
        case("outbox claim of due rows", OUTBOX_CLAIM, vec![&token, &later, &now, &limit]),
        case("outbox claim after a cursor", OUTBOX_CLAIM_AFTER, vec![&token, &later, &now, &limit, &now, &key]),
        case(
            "outbox claim taking sends",
            OUTBOX_CLAIM_TAKING,
            vec![&token, &later, &now, &limit, &take_types, &take_keys, &take_us, &take_us, &now],
        ),
        case(
            "outbox claim after a cursor taking sends",
            OUTBOX_CLAIM_AFTER_TAKING,
            vec![&token, &later, &now, &limit, &now, &key, &take_types, &take_keys, &take_us, &take_us, &now],
        ),
        per_load("check_claim", OUTBOX_OWNS, vec![&l, &key, &token]),
        per_load("mark_dispatched", OUTBOX_MARK_DISPATCHED, vec![&l, &key, &token, &token, &now]),
        per_load("mark_failed (retry)", OUTBOX_MARK_RETRY, vec![&l, &key, &token, &token, &later, &now]),
        per_load("mark_failed (bury)", OUTBOX_MARK_DEAD, vec![&l, &key, &token, &token, &now]),
        per_load("hold (a send rate)", OUTBOX_HOLD, vec![&l, &key, &token, &later, &now, &no_text]),
        case("hold all (a send rate; rows of many loads)", OUTBOX_HOLD_ALL, vec![&loads, &keys, &tokens, &nows, &now]),
        per_load("supersede (its ask moved on)", OUTBOX_SUPERSEDE, vec![&l, &key, &token, &key, &zero, &now]),
        case("send rate take", SEND_RATE_TAKE, vec![&key, &now, &now, &now, &one]),
        case("a client's queue on a send rate", SEND_QUEUE_JOIN, vec![&key, &now, &now, &one]),
        case("a queue's last slot given back", SEND_QUEUE_GIVE_BACK, vec![&key, &now, &now]),
        case("the last slots of queues", SEND_QUEUE_TAILS, vec![&keys]),
        case("a channel's held rows due again (its limit changed)", OUTBOX_REQUEUE_HELD, vec![&now, &keys]),
        case("a rate afresh (its limit changed)", SEND_RATE_AFRESH, vec![&key, &now, &timer]),
        case("send rate pause (a 429)", SEND_RATE_PAUSE, vec![&key, &now, &now, &timer]),
        case("rate change of a request", RATE_CHANGE_GET, vec![&key]),
        case("rate changes, latest", RATE_CHANGES_LATEST, vec![&limit]),
        case("rate changes, each channel's current", RATE_CHANGES_CURRENT, vec![]),
        per_load("outbox get", OUTBOX_GET, vec![&l, &key]),
        per_load("rows_for_load", OUTBOX_FOR_LOAD, vec![&l]),
        per_load("rows_for_load_page", OUTBOX_PAGE, vec![&l, &zero, &key, &limit]),
        case("oldest pending", OUTBOX_OLDEST_PENDING, vec![]),
        case("dead since", OUTBOX_DEAD, vec![&zero, &limit]),
        case("dead of one type since (bulk requeue)", OUTBOX_DEAD_OF_TYPE, vec![&hero, &zero, &limit]),
        per_load("mark_outcome_published", OUTBOX_MARK_OUTCOME_PUBLISHED, vec![&l, &key, &now]),
        case("dead without outcome (sweep)", OUTBOX_DEAD_WITHOUT_OUTCOME, vec![&limit]),
        case("unsettled dead rows due (sweep)", OUTBOX_UNSETTLED_DUE, vec![&now, &limit]),
        per_load("defer_settle", OUTBOX_DEFER_SETTLE, vec![&l, &key, &now, &token]),
        case("ops alert record", OPS_ALERT_RECORD, vec![&key, &l, &empty, &empty, &empty, &pending, &empty, &now]),
        case("ops alerts page", OPS_ALERT_PAGE, vec![&zero, &key, &limit]),
        case("count pending", OUTBOX_COUNT_PENDING, vec![]),
        case("count dead (/metrics)", OUTBOX_COUNT_DEAD, vec![]),
        case("timer schedule", TIMERS_SCHEDULE_ALL, vec![&timers, &loads, &fire_ats, &now, &traces]),
        case("timer cancel", TIMERS_CANCEL_ALL, vec![&timers, &loads, &now]),
        case("timer mark_fired", TIMER_MARK_FIRED, vec![&timer, &now]),
        case("timers due", TIMERS_DUE, vec![&later, &limit]),
        case("timers_for_load", TIMERS_FOR_LOAD, vec![&l]),
        case("timers_for_load_page", TIMERS_PAGE, vec![&l, &zero, &timer, &limit]),
        case("get_timer", TIMER_GET, vec![&timer]),
        case("queue publish", QUEUE_PUBLISH, vec![&l, &key, &token, &empty, &now]),
        case("queue publish of a wave", QUEUE_PUBLISH_SET, vec![&loads, &keys, &keys, &keys, &nows]),
        case("queue receive (heads)", QUEUE_RECEIVE, vec![&now, &limit, &later, &token]),
        case("queue receive of a publish", QUEUE_RECEIVE_PUBLISHED, vec![&l, &key, &now, &later, &token]),
        case("queue lock head", QUEUE_LOCK_HEAD, vec![&one]),
        case("queue ack (and the head's advance)", QUEUE_ACK, vec![&one, &receipt, &now, &l]),
        case("append: the ack's head lock", QUEUE_LOCK_HEAD_OF_LOAD, vec![&one, &l]),
        case("queue nack", QUEUE_NACK, vec![&one, &receipt]),
        case("queue head delay", QUEUE_HEAD_DELAY, vec![&l, &later]),
        case("queue depth", QUEUE_DEPTH, vec![]),
        case("published_body", QUEUE_PUBLISHED_BODY, vec![&l, &key]),
        case("webhook: claim a MessageSid", MESSAGE_SID_CLAIM, vec![&sid, &l, &now]),
        case("webhook: keep an unmatched SMS", UNMATCHED_SMS_RECORD, vec![&sid, &phone, &phone, &token, &now, &token]),
        case("unmatched SMS, newest first", UNMATCHED_SMS_LIST, vec![&limit]),
        per_load("append: the summary's asks", LOAD_SUMMARY_ASKS, vec![&l]),
        case("append: the summary", LOAD_SUMMARY_SET, vec![&l, &stage, &asks, &count, &count]),
        case("append: the summary, asks folded", LOAD_SUMMARY_FOLD, vec![&l, &stage, &asks]),
        case("append: the load's facts", LOAD_FACTS_SET, vec![&l, &phone, &yes, &now, &empty]),
        case("clients of a claim's loads", LOAD_CLIENTS, vec![&loads]),
        case("oldest due timer (/metrics)", TIMERS_OLDEST_DUE, vec![&now]),
        case("loads query: the window", LOADS_SCAN_END, vec![&empty, &window]),
        case(
            "loads query, no filter",
            LOADS_PAGE,
            vec![&empty, &last, &no_text, &no, &no, &no_ms, &no_ms, &no, &no_ms, &no_ms, &limit],
        ),
        case(
            "loads query, every filter",
            LOADS_PAGE,
            vec![&empty, &last, &stage, &yes, &yes, &later, &zero, &yes, &now, &later, &limit],
        ),
        case("dead rows across loads", OUTBOX_DEAD_PAGE, vec![&types, &max, &empty, &limit, &no_text]),
        case("open dead rows across loads", OUTBOX_DEAD_PAGE, vec![&types, &max, &empty, &limit, &open]),
        case("overdue timers", TIMERS_OVERDUE_PAGE, vec![&later, &min, &empty, &limit]),
        case("unmatched SMS pages", UNMATCHED_SMS_PAGE, vec![&max, &empty, &limit, &no_text]),
        case("the opted-out among a claim's phones", CONSENT_OPTED_OUT_AMONG, vec![&phones]),
        case("opted-out pages", CONSENT_OPTED_OUT_PAGE, vec![&max, &empty, &limit]),
        case("open unmatched SMS pages", UNMATCHED_SMS_PAGE, vec![&max, &empty, &limit, &open]),
        case("ops alerts, newest first", OPS_ALERTS_NEWEST, vec![&max, &empty, &limit, &no_text]),
        case("open ops alerts, newest first", OPS_ALERTS_NEWEST, vec![&max, &empty, &limit, &open]),
        per_load("append: the inbox", OUTBOX_INBOX_SET, vec![&l, &keys, &states, &entry_ids, &now]),
        case("inbox: open dead rows", INBOX_DEAD_COUNTS, vec![&limit]),
        case("inbox: open alerts", INBOX_ALERTS_COUNT, vec![&limit]),
        case("inbox: open unmatched SMS", INBOX_SMS_COUNT, vec![&limit]),
        case("operator: dismiss an unmatched SMS", UNMATCHED_SMS_DISMISS, vec![&sid, &l, &key, &now]),
        case("operator: one unmatched SMS", UNMATCHED_SMS_ONE, vec![&sid]),
        case("worker: count a conflict", LOAD_CONFLICT_COUNT, vec![&l, &now]),
        case("loads with the most conflicts", LOADS_MOST_CONFLICTS, vec![&limit]),
        case("operator: assign an unmatched SMS", UNMATCHED_SMS_ASSIGN, vec![&sid, &l, &key, &now]),
        case("operator: an unmatched SMS's assignment", UNMATCHED_SMS_ASSIGNED, vec![&sid]),
        case("prune outbox batch", PRUNE_OUTBOX, vec![&later, &limit]),
        case("prune timers batch", PRUNE_TIMERS, vec![&later, &limit]),
        case("prune queue batch", PRUNE_QUEUE, vec![&later, &limit]),
        case("prune shadow decisions batch", PRUNE_SHADOW, vec![&later, &limit]),
        case("prune delivery reports batch", PRUNE_SMS_REPORTS, vec![&later, &limit]),
        case(
            "shadow decision record",
            SHADOW_RECORD,
            vec![&l, &key, &key, &zero, &empty, &empty, &empty, &empty, &empty, &empty, &now, &now],
        ),
        case("shadow decisions of one load", SHADOW_PAGE, vec![&l, &zero, &empty, &limit]),
        case("LLM budget: a client's day", SPEND_OF_CLIENT_DAY, vec![&key, &day]),
        case("haul query spend", SPEND_PAGE, vec![&day, &day, &no_client, &day, &empty, &limit]),
        case("timeline: a prompt by hash", PROMPT_TEXT, vec![&key]),
    ];

    let mut failures = Vec::new();
    for generic in [false, true] {
        let mode = if generic { "generic" } else { "custom" };
        for (i, c) in cases.iter().enumerate() {
            let explain = if generic {
                // `EXPLAIN <sql>` with bound parameters plans with their values (a
                // custom plan) whatever plan_cache_mode says. The plan the store's
                // sessions run is the prepared statement's generic one, which
                // `EXPLAIN EXECUTE` shows under `force_generic_plan`.
                let types = client.prepare(c.sql).await.unwrap().params().to_vec();
                let name = format!("haul_generic_{i}");
                client
                    .batch_execute(&format!("SET plan_cache_mode = force_generic_plan; PREPARE {name} AS {}", c.sql))
                    .await
                    .unwrap();
                // EXECUTE's arguments cannot be the outer statement's parameters: the
                // server writes each value as a literal of its type.
                let mut args = Vec::new();
                for (n, t) in types.iter().enumerate() {
                    let quote = format!("SELECT quote_nullable($1::{}::text)", t.name());
                    let quote = client.prepare_typed(&quote, std::slice::from_ref(t)).await.unwrap();
                    let literal: String = client.query_one(&quote, &[c.params[n]]).await.unwrap().get(0);
                    args.push(format!("{literal}::{}", t.name()));
                }
                let execute = if args.is_empty() { name } else { format!("{name}({})", args.join(", ")) };
                client.query_one(&format!("EXPLAIN (FORMAT JSON) EXECUTE {execute}"), &[]).await.unwrap()
            } else {
                client.batch_execute("SET plan_cache_mode = force_custom_plan").await.unwrap();
                let stmt = client.prepare(&format!("EXPLAIN (FORMAT JSON) {}", c.sql)).await.unwrap();
                client.query_one(&stmt, &c.params).await.unwrap()
            };
            let Json(text) = explain.get(0);
            let plan: Value = serde_json::from_str(&text).unwrap();
            let mut all = Vec::new();
            nodes(&plan[0]["Plan"], &mut all);
            for (node, rel) in &all {
                if node == "Seq Scan" {
                    failures.push(format!("{mode}: {}: Seq Scan on {rel}\n{text}", c.name));
                }
            }
            // A generic plan keeps the partitions it prunes when it starts; what it
            // shows is what is left, which must be one partition too.
            if c.one_load {
                let parts: std::collections::BTreeSet<&str> = all
                    .iter()
                    .map(|(_, rel)| rel.as_str())
                    .filter(|r| r.starts_with("events_p") || r.starts_with("outbox_p"))
                    .collect();
                if parts.len() > 1 {
                    failures.push(format!("{mode}: {}: touches {} partitions: {parts:?}", c.name, parts.len()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} plan(s) without an index:\n{}", failures.len(), failures.join("\n\n"));
}

/// The claim and the receive take a few rows by `LIMIT` and join them back to their
/// table by key, as a wave's publishes join their heads to their arrays' elements.
/// Under a generic plan that `LIMIT` is a parameter the planner guesses at a tenth of
/// the candidates, and on an outbox of some thousands of rows it chose to hash the
/// whole table (a `Seq Scan` of every partition per claim). Here the tables are
/// large enough for that, analyzed, with sequential scans allowed, and the plans are
/// the generic ones of the sessions the store runs these statements on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_and_the_receive_join_by_key_on_large_tables() {
    let options = FreshStore { pool_size: 4, ..FreshStore::default() };
    let (s, schema) = fresh_store(&options).await.unwrap();
    let client = client_in_schema(&options.url, &schema).await;
    client
        .batch_execute(
            "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at, updated_at)
               SELECT 'L' || i || '/a', 'L' || i, 'send_sms', '{}', 'pending', 1000 + i, 1000, 1000
               FROM generate_series(1, 20000) i;
             INSERT INTO queue (load_id, event_id, body, enqueued_at, acked_at)
               SELECT 'L' || i, 'e' || i, '{}', 1000, CASE WHEN i > 200 THEN 1001 END
               FROM generate_series(1, 20000) i;
             INSERT INTO queue_heads (load_id, message_id, visible_at)
               SELECT load_id, CASE WHEN acked_at IS NULL THEN id END, 1000 FROM queue;
             ANALYZE outbox, queue, queue_heads;",
        )
        .await
        .unwrap();
    let session = s.lease_session().await.unwrap();
    let mut failures = Vec::new();
    for (name, sql, args) in [
        ("claim", OUTBOX_CLAIM, "'t', 2000000::bigint, 1000000::bigint, 8::bigint"),
        ("claim_after", OUTBOX_CLAIM_AFTER, "'t', 2000000::bigint, 1000000::bigint, 8::bigint, 1005::bigint, 'L5/a'"),
        (
            "claim_taking",
            OUTBOX_CLAIM_TAKING,
            "'t', 2000000::bigint, 1000000::bigint, 8::bigint, ARRAY['send_sms'], ARRAY['sms'], ARRAY[100000]::bigint[],
             ARRAY[100000]::bigint[], 1000000000::bigint",
        ),
        ("receive", QUEUE_RECEIVE, "1000000::bigint, 8::bigint, 2000000::bigint, 't'"),
        (
            "publish_set",
            QUEUE_PUBLISH_SET,
            "ARRAY['L5','L6'], ARRAY['x','y'], ARRAY['{}','{}'], ARRAY['',''], ARRAY[1000,1000]::bigint[]",
        ),
    ] {
        session.batch_execute(&format!("PREPARE haul_lease_{name} AS {sql}")).await.unwrap();
        let explain =
            session.query_one(&format!("EXPLAIN (FORMAT JSON) EXECUTE haul_lease_{name}({args})"), &[]).await.unwrap();
        session.batch_execute(&format!("DEALLOCATE haul_lease_{name}")).await.unwrap();
        let Json(text) = explain.get(0);
        let plan: Value = serde_json::from_str(&text).unwrap();
        let mut all = Vec::new();
        nodes(&plan[0]["Plan"], &mut all);
        if all.iter().any(|(node, _)| matches!(node.as_str(), "Seq Scan" | "Hash Join" | "Merge Join")) {
            failures.push(format!("{name}: {all:?}"));
        }
    }
    assert!(failures.is_empty(), "joined by scanning a table:\n{}", failures.join("\n"));
}
