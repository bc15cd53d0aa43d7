//! `GET /v1/loads/{id}` on a long load: the log, the outbox rows and the timers come in
//! pages with a cursor for the next one, the answer stays small whatever the log's
//! length, the state is still the fold of the whole log, and on SQLite the read does
//! not wait for the writer thread.

mod common;

use std::time::{Duration, Instant};

use haul_core::Decision;
use haul_core::action::ActionType;
use haul_core::ids::{EventId, LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_store::{NewEntry, NewOutboxRow};
use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{Api, Backend, api};

const LOAD: &str = "481207";
/// Log records of the long load (`EVENTS / 2` events, each with its decision).
const EVENTS: u64 = 3_000;
const OUTBOX_ROWS: usize = 250;
const TIMERS: usize = 250;

fn at(secs: u64) -> Timestamp {
    add("2026-03-02T07:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn load() -> LoadId {
    LoadId::parse(LOAD).unwrap()
}

/// `EVENTS` records: a load_update first, SMS with bodies of 1,600 characters, each
/// with its decision, and a load_update naming the next stop near the end (so the
/// state has it only if the whole log was folded). Outbox rows on the first events,
/// timers created one second apart.
async fn fill_long_load(a: &Api) {
    let body = "ETA? ".repeat(320);
    let mut version = 0;
    let mut outbox_left = OUTBOX_ROWS;
    for batch in 0..EVENTS / 100 {
        let mut entries = Vec::new();
        let mut outbox = Vec::new();
        for i in 0..50 {
            let n = batch * 50 + i;
            let (id, kind, payload) = if n == 0 {
                ("load:init".to_string(), "load_update", json!({"driver_phone": "+15555550100", "stage": "in_transit"}))
            } else if n == EVENTS / 2 - 1 {
                ("load:stop".to_string(), "load_update", json!({"next_stop": "Dock 7"}))
            } else {
                (format!("sms_{n}"), "inbound_sms", json!({"from": "+15555550100", "body": body}))
            };
            let event = EventId::parse(&id).unwrap();
            let decision = Decision::new(&event, at(n), "sop", vec![], vec![], "nothing to do");
            entries.push(NewEntry::stored(id.clone(), kind, payload));
            entries.push(NewEntry::stored(
                format!("dec:{id}"),
                "decision_recorded",
                serde_json::to_value(&decision).unwrap(),
            ));
            if outbox_left > 0 {
                outbox_left -= 1;
                let key = format!("{LOAD}/{id}/send_sms");
                outbox.push(NewOutboxRow {
                    action: json!({"key": key, "type": "send_sms", "params": {"to": "driver", "body": "ETA?"}}),
                    id: key,
                    action_type: ActionType::SendSms,
                    trace: None,
                });
            }
        }
        version = a.store.append(&load(), entries, version, outbox, at(batch)).await.unwrap();
    }
    assert_eq!(version, EVENTS);
    for t in 0..TIMERS {
        let timer = TimerId::parse(&format!("tmr:{LOAD}:ask:eta_request:sms_{t}:1")).unwrap();
        a.store.schedule(&timer, at(10_000), at(t as u64 / 2)).await.unwrap();
    }
}

fn seqs(view: &Value) -> Vec<u64> {
    view["log"].as_array().unwrap().iter().map(|r| r["seq"].as_u64().unwrap()).collect()
}

/// Follows a list's cursor from the first page to the last; the ids in order.
async fn walk(a: &Api, list: &str, id: &str, cursor: &str, param: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut query = String::from("?limit=70");
    for _ in 0..100 {
        let (status, v, _) = a.get(&format!("/v1/loads/{LOAD}{query}")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let page = v[list].as_array().unwrap();
        assert!(page.len() <= 70, "a page holds at most `limit`");
        ids.extend(page.iter().map(|r| r[id].as_str().unwrap().to_string()));
        match v[cursor].as_str() {
            Some(next) => query = format!("?limit=70&{param}={}", urlencode(next)),
            None => return ids,
        }
    }
    panic!("{list}: no last page after 100 pages");
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap().trim_start_matches("x=").to_string()
}

async fn a_long_log_pages_and_the_answer_is_bounded(backend: Backend) {
    let a = api(backend).await;
    fill_long_load(&a).await;
    let (whole, _) = a.store.read(&load()).await.unwrap();
    let whole_bytes = serde_json::to_vec(&whole).unwrap().len();

    let started = Instant::now();
    let (status, first, bytes) = a.get(&format!("/v1/loads/{LOAD}")).await;
    println!(
        "{backend:?}: GET /v1/loads/{LOAD} of a {EVENTS}-record load: {bytes} bytes in {:?} (the whole log is {whole_bytes} bytes)",
        started.elapsed()
    );
    assert_eq!(status, StatusCode::OK);
    assert!(bytes < 512 * 1024, "the default answer is {bytes} bytes");
    assert_eq!(first["version"], EVENTS);
    assert_eq!(seqs(&first), (1..=100).collect::<Vec<_>>(), "the default page is the first 100 records");
    assert_eq!(first["next_after_seq"], 100);
    // The state is the fold of the whole log, not of the page.
    assert_eq!(first["state"]["version"], EVENTS);
    assert_eq!(first["state"]["next_stop"], "Dock 7");
    assert_eq!(first["state"]["stage"], "in_transit");
    assert_eq!(first["state"]["totals"]["processed"], EVENTS / 2, "counted, not listed");
    assert_eq!(first["state"]["totals"]["decided"], EVENTS / 2);
    assert!(first["state"].get("processed").is_none());
    assert_eq!(first["outbox"].as_array().unwrap().len(), 100);
    assert_eq!(first["timers"].as_array().unwrap().len(), 100);

    // The log, page by page at the largest limit: every record once, in order.
    let mut all = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let (status, v, bytes) = a.get(&format!("/v1/loads/{LOAD}?after_seq={after}&limit=1000")).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(bytes < 4 * 1024 * 1024, "a page of 1000 is {bytes} bytes");
        pages += 1;
        all.extend(seqs(&v));
        match v["next_after_seq"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(all, (1..=EVENTS).collect::<Vec<_>>());
    assert_eq!(pages, 3);
    let (_, tail, _) = a.get(&format!("/v1/loads/{LOAD}?after_seq={EVENTS}")).await;
    assert_eq!((seqs(&tail).len(), &tail["next_after_seq"]), (0, &Value::Null), "past the end: an empty page");

    // Outbox rows and timers: every one once, in the order of the store's whole lists.
    let want: Vec<String> = a.store.rows_for_load(&load()).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(want.len(), OUTBOX_ROWS);
    assert_eq!(walk(&a, "outbox", "id", "next_outbox_after", "outbox_after").await, want);
    let want: Vec<String> =
        a.store.timers_for_load(&load()).await.unwrap().into_iter().map(|t| t.timer_id.to_string()).collect();
    assert_eq!(want.len(), TIMERS);
    assert_eq!(walk(&a, "timers", "timer_id", "next_timers_after", "timers_after").await, want);

    // Queries out of form are refused.
    for query in [
        "limit=0",
        "limit=1001",
        "after_seq=-1",
        "after_seq=x",
        "outbox_after=nonsense",
        "timers_after=1",
        "after=100",
        "limit=5&limit=6",
    ] {
        let (status, v, _) = a.get(&format!("/v1/loads/{LOAD}?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {v}");
        assert_eq!(v["error"]["code"], "bad_query", "{query}: {v}");
    }
}

/// The attack of the edge review: 16 looping pollers of one 3,000-record load slowed
/// every other load's page, because each view folded the whole log and every view
/// shared 4 permits. A view now costs what its page shows: the fold is kept and caught
/// up with the log's tail, and views of one load take turns without holding a permit.
async fn views_of_a_long_load_cost_what_their_page_shows(backend: Backend) {
    let a = api(backend).await;
    fill_long_load(&a).await;
    let other = json!({"stage": "in_transit"});
    a.store
        .append(
            &LoadId::parse("481208").unwrap(),
            vec![NewEntry::stored("load:init", "load_update", other)],
            0,
            vec![],
            at(0),
        )
        .await
        .unwrap();
    let views = &a.state.load_views;
    let (status, first, _) = a.get(&format!("/v1/loads/{LOAD}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["state"]["next_stop"], "Dock 7");
    assert_eq!(views.records_read(), EVENTS + 100, "the first view folds the log once and reads its page");

    // 16 pollers, 5 views each, with views of another load among them.
    let before = views.records_read();
    let mut pollers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (client, base) = (a.client.clone(), a.base.clone());
        pollers.spawn(async move {
            for _ in 0..5 {
                let r = client.get(format!("{base}/v1/loads/{LOAD}")).bearer_auth(common::TOKEN).send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["state"]["next_stop"], "Dock 7", "the state is still the whole log's");
            }
        });
    }
    for _ in 0..5 {
        let (status, v, _) = a.get("/v1/loads/481208").await;
        assert_eq!((status, &v["state"]["stage"]), (StatusCode::OK, &json!("in_transit")));
    }
    while let Some(p) = pollers.join_next().await {
        p.unwrap();
    }
    let read = views.records_read() - before;
    assert!(read <= 80 * 100 + 2 * 5, "80 views of the long load and 5 of another read {read} records");

    // The log grows: the next view reads the new records and its page, nothing more.
    let before = views.records_read();
    let next = EventId::parse("sms_late").unwrap();
    let decision = Decision::new(&next, at(9_000), "sop", vec![], vec![], "nothing to do");
    a.store
        .append(
            &load(),
            vec![
                NewEntry::stored("sms_late", "inbound_sms", json!({"from": "+15555550100", "body": "here"})),
                NewEntry::stored("dec:sms_late", "decision_recorded", serde_json::to_value(&decision).unwrap()),
            ],
            EVENTS,
            vec![],
            at(9_000),
        )
        .await
        .unwrap();
    let (_, v, _) = a.get(&format!("/v1/loads/{LOAD}?after_seq={EVENTS}")).await;
    assert_eq!((v["version"].as_u64(), seqs(&v)), (Some(EVENTS + 2), vec![EVENTS + 1, EVENTS + 2]));
    assert_eq!(v["state"]["totals"]["processed"], EVENTS / 2 + 1);
    assert_eq!(views.records_read() - before, 4, "the two new records, then the page of them");
}

on_both_backends!(a_long_log_pages_and_the_answer_is_bounded, views_of_a_long_load_cost_what_their_page_shows);

/// A write lock held by another connection for `hold`, taken before this returns: the
/// store's writer thread waits for it on its next `BEGIN IMMEDIATE`.
fn hold_write_lock(path: &std::path::Path, hold: Duration) -> std::thread::JoinHandle<()> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        conn.execute_batch("ROLLBACK").unwrap();
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_inspect_does_not_wait_for_a_busy_writer() {
    let a = api(Backend::SqliteFile).await;
    let init = json!({"event_id": "load:init", "kind": "load_update", "stage": "in_transit"});
    a.store.append(&load(), vec![NewEntry::stored("load:init", "load_update", init)], 0, vec![], at(0)).await.unwrap();
    let hold = Duration::from_secs(2);
    let release = hold_write_lock(a.sqlite_path.as_deref().unwrap(), hold);
    let held_since = Instant::now();
    // A write: the writer thread takes it and waits for the lock.
    let post = {
        let (client, base) = (a.client.clone(), a.base.clone());
        tokio::spawn(async move {
            let ping =
                json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high"});
            client.post(format!("{base}/v1/loads/{LOAD}/events")).bearer_auth(common::TOKEN).json(&ping).send().await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let (status, view, _) = a.get(&format!("/v1/loads/{LOAD}")).await;
    let waited = started.elapsed();
    println!("SQLite: GET /v1/loads/{LOAD} while the writer waits for a lock held {hold:?}: {waited:?}");
    assert_eq!(status, StatusCode::OK, "{view}");
    assert!(waited < Duration::from_millis(500), "the read waited {waited:?} for the writer");
    assert!(!post.is_finished(), "the write was still waiting: the writer was busy");
    release.join().unwrap();
    let posted = post.await.unwrap().unwrap();
    assert_eq!(posted.status(), StatusCode::ACCEPTED);
    assert!(held_since.elapsed() >= hold);
}
