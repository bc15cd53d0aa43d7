//! Group commit on PostgreSQL: one unit's failure stays inside its savepoint, and a
//! unit that would wait for another transaction's lock does not hold up its batch.

use haul_core::action::ActionType;
use haul_core::ids::LoadId;
use haul_core::time::Timestamp;
use haul_postgres::testing::{FreshStore, TestPublish, client_in_schema, database_url, fresh_store};
use haul_store::{AppendError, EventStore, NewEntry, NewOutboxRow, Outbox};
use serde_json::json;

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn load(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

fn entry(id: &str) -> NewEntry {
    NewEntry::stored(id, "inbound_sms", json!({"body": id}))
}

fn row(id: &str) -> NewOutboxRow {
    NewOutboxRow { id: id.into(), action_type: ActionType::SendSms, action: json!({"key": id}), trace: None }
}

fn unit(l: &str, entries: &[&str], expected: u64, keys: &[&str]) -> (LoadId, Vec<NewEntry>, u64, Vec<NewOutboxRow>) {
    (load(l), entries.iter().map(|e| entry(e)).collect(), expected, keys.iter().map(|k| row(k)).collect())
}

/// Waits until a session is blocked by the session `holder` (its backend pid): proof
/// that a statement sent meanwhile is waiting for the holder's lock, not merely late.
async fn blocked_by(schema: &str, holder: i32) {
    let watcher = client_in_schema(&database_url(), schema).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let n: i64 = watcher
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", &[&holder])
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no session waits for the held lock");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

async fn log(s: &impl EventStore, l: &str) -> (Vec<String>, u64) {
    let (records, version) = s.read(&load(l)).await.unwrap();
    (records.into_iter().map(|r| r.entry_id).collect(), version)
}

/// The ids of a load's outbox rows.
async fn keys(s: &impl Outbox, l: &str) -> Vec<String> {
    s.rows_for_load(&load(l)).await.unwrap().into_iter().map(|r| r.id).collect()
}

/// A batch's answers, one line each.
fn answers(answers: &[Result<u64, AppendError>]) -> Vec<String> {
    answers
        .iter()
        .map(|a| match a {
            Ok(v) => format!("ok {v}"),
            Err(AppendError::ConcurrencyConflict(c)) => format!("conflict {}/{}", c.expected, c.actual),
            Err(AppendError::DuplicateEntry(d)) => format!("duplicate entry {}", d.entry_id),
            Err(AppendError::DuplicateActionKey(d)) => format!("duplicate key {}", d.key),
            Err(AppendError::Store(e)) => format!("store {e}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_failing_in_its_savepoint_leaves_its_batch_neighbours_committed() {
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    s.append(&load("OLD"), vec![entry("o1")], 0, vec![row("OLD/o1/send_sms")], t0()).await.unwrap();
    let batch = s
        .append_one_batch(
            vec![
                unit("A", &["a1", "a2"], 0, &["A/a1/send_sms"]),
                unit("OLD", &["o2"], 5, &[]), // stale version
                unit("B", &["b1"], 0, &[]),
                unit("B", &["b2"], 0, &[]),   // B taken by the unit above, same batch
                unit("OLD", &["o1"], 1, &[]), // duplicate entry
                unit("OLD", &["o3"], 1, &["OLD/o1/send_sms"]), // duplicate action key
                unit("C", &["c1", "c1"], 0, &[]), // duplicate within the call
                unit("D", &["d1"], 0, &["D/d1/send_sms"]), // fine, after all those failures
            ],
            t0(),
        )
        .await;
    assert_eq!(
        answers(&batch),
        vec![
            "ok 2",
            "conflict 5/1",
            "ok 1",
            "conflict 0/1",
            "duplicate entry o1",
            "duplicate key OLD/o1/send_sms",
            "duplicate entry c1",
            "ok 1",
        ]
    );
    // The failures left OLD as it was: the next append at its version commits.
    s.append(&load("OLD"), vec![entry("o4")], 1, vec![row("OLD/o4/send_sms")], t0()).await.unwrap();
    assert_eq!(log(&s, "A").await, (vec!["a1".into(), "a2".into()], 2));
    assert_eq!(log(&s, "B").await, (vec!["b1".into()], 1));
    assert_eq!(log(&s, "C").await, (vec![], 0));
    assert_eq!(log(&s, "OLD").await, (vec!["o1".into(), "o4".into()], 2));
    assert_eq!(keys(&s, "A").await, vec!["A/a1/send_sms"]);
    assert_eq!(keys(&s, "D").await, vec!["D/d1/send_sms"]);
    assert_eq!(keys(&s, "OLD").await, vec!["OLD/o1/send_sms", "OLD/o4/send_sms"]);
}

/// A batch's units go out together behind one savepoint; one that is not kept is
/// rolled back with every unit sent after it, and those run again without its effects
/// (the units before it in its savepoint run again first, each behind its own). (The refused one runs again alone after the batch, for its exact answer as
/// of then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_sent_after_a_failed_one_run_again_without_its_effects() {
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    s.append(&load("E"), vec![entry("e0")], 0, vec![], t0()).await.unwrap();
    let batch = s
        .append_one_batch(
            vec![
                // A stale version fails its check, and with it the rest of the wave.
                unit("E", &["e1"], 5, &[]),
                // Sent behind it: rolled back with it, it runs again and commits.
                unit("E", &["e1"], 1, &["E/e1/send_sms"]),
                unit("E", &["e2"], 2, &[]),
                unit("F", &["f1"], 0, &["F/f1/send_sms"]),
            ],
            t0(),
        )
        .await;
    assert_eq!(answers(&batch), vec!["conflict 5/3", "ok 2", "ok 3", "ok 1"]);
    assert_eq!(log(&s, "E").await, (vec!["e0".into(), "e1".into(), "e2".into()], 3));
    assert_eq!(log(&s, "F").await, (vec!["f1".into()], 1));
    assert_eq!(keys(&s, "E").await, vec!["E/e1/send_sms"]);
}

/// A batch that ends in appends sends its `COMMIT` behind them, before their answers are
/// read. When one of them fails, that `COMMIT` rolls the whole batch back (publishes
/// and earlier waves too), and the batch runs again reading every answer first: each
/// unit still gets its own answer, and only the kept ones stand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_pipelined_commit_rolled_back_runs_again_for_each_units_answer() {
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    s.append(&load("OLD"), vec![entry("o1")], 0, vec![], t0()).await.unwrap();
    // Alone: the conflict is the batch's only unit.
    let alone = s.append_one_batch(vec![unit("OLD", &["o2"], 7, &[])], t0()).await;
    assert_eq!(answers(&alone), vec!["conflict 7/1"]);
    // Last: every unit before it is kept, in the same wave.
    let last = s
        .append_one_batch(
            vec![
                unit("A", &["a1"], 0, &["A/a1/send_sms"]),
                unit("B", &["b1", "b2"], 0, &[]),
                unit("OLD", &["o2"], 0, &[]), // a first version, but OLD has one
            ],
            t0(),
        )
        .await;
    assert_eq!(answers(&last), vec!["ok 1", "ok 2", "conflict 0/1"]);
    assert_eq!(log(&s, "A").await, (vec!["a1".into()], 1));
    assert_eq!(log(&s, "B").await, (vec!["b1".into(), "b2".into()], 2));
    assert_eq!(log(&s, "OLD").await, (vec!["o1".into()], 1));
    assert_eq!(keys(&s, "A").await, vec!["A/a1/send_sms"]);
    // The conflict left OLD at its version: the next batch's append at it commits.
    let after = s.append_one_batch(vec![unit("OLD", &["o2"], 1, &[]), unit("A", &["a2"], 1, &[])], t0()).await;
    assert_eq!(answers(&after), vec!["ok 2", "ok 2"]);
    assert_eq!(log(&s, "OLD").await, (vec!["o1".into(), "o2".into()], 2));
}

/// An append that changes asks folds them into the load's summary in SQL, in its
/// wave. Rolled back with a failed unit before it, the fold is undone and runs again on
/// the summary as it really is: nothing is folded twice or on a refused unit's asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_folded_in_a_wave_that_rolls_back_are_folded_once() {
    let ask = |id: &str| format!("ask:eta_request:{id}");
    let (s, schema) = fresh_store(&FreshStore::default()).await.unwrap();
    // Asks `a1`... stand for `ask:eta_request:a1`...
    let decision = |event: &str, asks: &[(&str, &str)]| {
        let asks = asks.iter().map(|(id, status)| json!({"ask_id": ask(id), "step": 1, "status": status}));
        haul_store::contract::decision(event, asks.collect())
    };
    s.append(&load("G"), vec![decision("g1", &[("a1", "open")])], 0, vec![], t0()).await.unwrap();
    let batch = s
        .append_one_batch(
            vec![
                // Stale: its fold runs in the wave, then is rolled back (z9 would stay).
                (load("G"), vec![decision("g2", &[("a1", "escalated"), ("z9", "open")])], 5, vec![]),
                (load("G"), vec![decision("g3", &[("a1", "answered"), ("a2", "open")])], 1, vec![]),
                (load("H"), vec![decision("h1", &[("b1", "escalated")])], 0, vec![]),
            ],
            t0(),
        )
        .await;
    assert_eq!(answers(&batch), vec!["conflict 5/2", "ok 2", "ok 1"]);
    let client = client_in_schema(&database_url(), &schema).await;
    let summary = async |l: &str| -> (serde_json::Value, i32, i32) {
        let r = client
            .query_one("SELECT asks, open_asks, escalated_asks FROM loads WHERE load_id = $1", &[&l])
            .await
            .unwrap();
        (serde_json::from_str(r.get::<_, &str>(0)).unwrap(), r.get(1), r.get(2))
    };
    assert_eq!(summary("G").await, (json!({ask("a1"): "answered", ask("a2"): "open"}), 1, 0));
    assert_eq!(summary("H").await, (json!({ask("b1"): "escalated"}), 0, 1));
    assert_eq!(log(&s, "G").await, (vec!["dec:g1".into(), "dec:g3".into()], 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_waiting_for_a_lock_runs_alone_and_the_others_commit_meanwhile() {
    let (s, schema) = fresh_store(&FreshStore::default()).await.unwrap();
    s.append(&load("HELD"), vec![entry("h1")], 0, vec![], t0()).await.unwrap();
    // Another session holds HELD's version row, as a slow writer elsewhere would.
    let mut other = client_in_schema(&database_url(), &schema).await;
    let holder: i32 = other.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let tx = other.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM loads WHERE load_id = 'HELD' FOR UPDATE", &[]).await.unwrap();

    let held = {
        let s = s.clone();
        tokio::spawn(async move { s.append(&load("HELD"), vec![entry("h2")], 1, vec![], t0()).await })
    };
    blocked_by(&schema, holder).await;
    // Appends to other loads commit while HELD's row stays locked.
    for i in 0..4 {
        let l = format!("FREE{i}");
        assert_eq!(s.append(&load(&l), vec![entry("f1")], 0, vec![], t0()).await.unwrap(), 1);
        assert_eq!(log(&s, &l).await.1, 1);
    }
    assert!(!held.is_finished(), "HELD's append waits for the lock");
    tx.commit().await.unwrap();
    assert_eq!(held.await.unwrap().unwrap(), 2);
    assert_eq!(log(&s, "HELD").await, (vec!["h1".into(), "h2".into()], 2));
}

/// Acknowledged writes wait for their WAL flush as the server is configured; only the
/// leases (receives, claims) skip it, and they still work as the contract says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_receives_and_claims_skip_the_wal_flush() {
    use haul_store::LoadQueue;
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    let server: String = {
        let (client, conn) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0)
    };
    assert_eq!(s.synchronous_commit().await.unwrap(), (server, "off".to_owned()));
    s.append(&load("L1"), vec![entry("e1")], 0, vec![row("L1/e1/send_sms")], t0()).await.unwrap();
    let claims = s.pending(10, t0(), std::time::Duration::from_secs(90)).await.unwrap();
    assert_eq!(claims.len(), 1);
    assert!(s.pending(10, t0(), std::time::Duration::from_secs(90)).await.unwrap().is_empty(), "leased");
    s.publish(&load("L1"), "m1", "{}", t0()).await.unwrap();
    let got = s.receive(10, std::time::Duration::from_secs(60), t0()).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(s.receive(10, std::time::Duration::from_secs(60), t0()).await.unwrap().is_empty(), "invisible");
}

/// A publish of `event_id` to load `l`, marking `mark` (outbox id, claim token) with it.
fn publish(l: &str, event_id: &str, body: &str, mark: Option<(&str, &str)>) -> TestPublish {
    TestPublish {
        load_id: l.into(),
        event_id: event_id.into(),
        body: body.into(),
        mark: mark.map(|(id, token)| (id.into(), token.into())),
        receive: false,
    }
}

/// A publish of `event_id` to load `l` that asks for its receive.
fn publish_receiving(l: &str, event_id: &str) -> TestPublish {
    TestPublish { receive: true, ..publish(l, event_id, "{}", None) }
}

/// Claims every due row; the token of each, by outbox id.
async fn claim_all(s: &haul_postgres::PgStore) -> std::collections::BTreeMap<String, String> {
    let claims = s.pending(100, t0(), std::time::Duration::from_secs(90)).await.unwrap();
    claims.into_iter().map(|c| (c.row.id, c.token)).collect()
}

/// Each row's status, by outbox id.
async fn statuses(s: &haul_postgres::PgStore, loads: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for l in loads {
        for r in s.rows_for_load(&load(l)).await.unwrap() {
            out.push(format!("{} {}", r.id, r.status.as_str()));
        }
    }
    out
}

/// A wave of publishes and publish-and-marks goes to the server as one query, its values
/// written as literals: every answer is still the unit's own, and a body holding
/// quotes, backslashes, semicolons and dollar signs arrives byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_sent_as_one_query_answer_each_unit_and_keep_every_byte() {
    use haul_store::LoadQueue;
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    for l in ["A", "B", "C"] {
        s.append(&load(l), vec![entry("e1")], 0, vec![row(&format!("{l}/e1/send_sms"))], t0()).await.unwrap();
    }
    let tokens = claim_all(&s).await;
    let odd = "it's \\'; DROP TABLE queue; -- $$ $1 \\x00 ☃ \"quoted\"\nline 2";
    let answers = s
        .publish_one_batch(
            vec![
                publish("A", "out:A", odd, Some(("A/e1/send_sms", &tokens["A/e1/send_sms"]))),
                publish("B", "out:B", "{}", Some(("B/e1/send_sms", "not-the-token"))),
                publish("A", "out:A", "{}", None),
                publish("C", "in:C", "{}", None),
                publish("C", "out:C", "{}", Some(("C/e1/send_sms", &tokens["C/e1/send_sms"]))),
            ],
            t0(),
        )
        .await;
    assert_eq!(answers, ["new", "stale", "duplicate", "new", "new"]);
    assert_eq!(
        statuses(&s, &["A", "B", "C"]).await,
        ["A/e1/send_sms dispatched", "B/e1/send_sms pending", "C/e1/send_sms dispatched"]
    );
    // B's publish stands though its mark found the claim stale.
    let got = s.receive(10, std::time::Duration::from_secs(60), t0()).await.unwrap();
    let mut bodies: Vec<(String, String)> = got.into_iter().map(|m| (m.event_id, m.body)).collect();
    bodies.sort();
    assert_eq!(
        bodies,
        [
            ("in:C".to_owned(), "{}".to_owned()),
            ("out:A".to_owned(), odd.to_owned()),
            ("out:B".to_owned(), "{}".to_owned())
        ]
    );
}

/// Publishes that ask for their receive go out with the other publishes of their wave,
/// as one query: on distinct loads (a set wave) each idle load's message comes back
/// received, one behind a message in flight does not, and a duplicate of a head never
/// received is received. Units sharing a load (a text wave of statements one by one)
/// keep their order: the first is received, the second waits behind it. Each receipt
/// acks its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_asking_for_their_receive_go_out_with_their_wave() {
    use haul_store::LoadQueue;
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    s.publish(&load("BUSY"), "b0", "{}", t0()).await.unwrap();
    s.publish(&load("WAITING"), "w0", "{}", t0()).await.unwrap();
    assert_eq!(s.receive(10, std::time::Duration::from_secs(60), t0()).await.unwrap().len(), 2);
    s.publish(&load("HEAD"), "h0", "{}", t0()).await.unwrap();
    let set = s
        .publish_one_batch(
            vec![
                publish_receiving("A", "a1"),
                publish_receiving("BUSY", "b1"),
                publish_receiving("HEAD", "h0"),
                publish("C", "c1", "{}", None),
                publish_receiving("D", "d1"),
            ],
            t0(),
        )
        .await;
    let receipt = |answer: &str| answer.rsplit(' ').next().unwrap().to_owned();
    assert!(set[0].starts_with("new received a1 "), "{set:?}");
    assert_eq!((set[1].as_str(), set[3].as_str()), ("new", "new"), "behind b0 in flight; no receive asked");
    assert!(set[2].starts_with("duplicate received h0 "), "{set:?}");
    assert!(set[4].starts_with("new received d1 "), "{set:?}");
    let text = s.publish_one_batch(vec![publish_receiving("E", "e1"), publish_receiving("E", "e2")], t0()).await;
    assert!(text[0].starts_with("new received e1 "), "{text:?}");
    assert_eq!(text[1], "new", "behind e1 in flight");
    for answer in [&set[0], &set[2], &set[4], &text[0]] {
        s.ack(&receipt(answer), t0()).await.unwrap();
    }
    // Left for a receive: C's message and E's second, behind the acked first.
    let got = s.receive(10, std::time::Duration::from_secs(60), t0()).await.unwrap();
    let mut events: Vec<String> = got.into_iter().map(|m| m.event_id).collect();
    events.sort();
    assert_eq!(events, ["c1", "e2"]);
}

/// A unit of a wave sent as one query that waits for a lock ends the query there: the
/// units before it commit, it runs alone once the lock is free, and the units after it
/// (which the server never ran) run in the next wave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_waiting_for_a_lock_in_a_wave_sent_as_one_query_runs_alone() {
    let (s, schema) = fresh_store(&FreshStore::default()).await.unwrap();
    let loads = ["P0", "P1", "HELD", "P3", "P4"];
    for l in loads {
        s.append(&load(l), vec![entry("e1")], 0, vec![row(&format!("{l}/e1/send_sms"))], t0()).await.unwrap();
    }
    let tokens = claim_all(&s).await;
    let mut other = client_in_schema(&database_url(), &schema).await;
    let holder: i32 = other.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let tx = other.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM outbox WHERE load_id = 'HELD' FOR UPDATE", &[]).await.unwrap();
    let units: Vec<TestPublish> = loads
        .iter()
        .map(|l| {
            let id = format!("{l}/e1/send_sms");
            publish(l, &format!("out:{l}"), "{}", Some((&id, &tokens[&id])))
        })
        .collect();
    let batch = {
        let s = s.clone();
        tokio::spawn(async move { s.publish_one_batch(units, t0()).await })
    };
    blocked_by(&schema, holder).await;
    // The batch commits without HELD's row; HELD's unit waits for the lock.
    let marked = async || statuses(&s, &loads).await.iter().filter(|l| l.ends_with("dispatched")).count();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while marked().await < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the other units did not commit: {:?}",
            statuses(&s, &loads).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(!batch.is_finished(), "HELD's unit waits for the lock");
    assert_eq!(statuses(&s, &["HELD"]).await, ["HELD/e1/send_sms pending"]);
    tx.commit().await.unwrap();
    assert_eq!(batch.await.unwrap(), ["new"; 5]);
    assert_eq!(marked().await, 5);
}

/// A value a literal cannot hold (a NUL) keeps its unit out of the text wave: the
/// server refuses it as it would any statement, and its neighbours commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_holding_a_nul_is_refused_and_its_neighbours_commit() {
    let (s, _) = fresh_store(&FreshStore::default()).await.unwrap();
    let answers = s
        .publish_one_batch(
            vec![publish("N1", "m1", "{}", None), publish("N2", "m1", "a\0b", None), publish("N3", "m1", "{}", None)],
            t0(),
        )
        .await;
    assert_eq!(answers[0], "new");
    assert!(answers[1].starts_with("store: ") && answers[1].contains("0x00"), "{answers:?}");
    assert_eq!(answers[2], "new");
}
