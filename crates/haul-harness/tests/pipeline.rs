//! The worker's guards (fallbacks, per-load exclusion, LoadLock), the channel clients'
//! status classification over real HTTP, and record mode; on SQLite and PostgreSQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::routing::post;
use common::*;
use haul_config::Config;
use haul_core::action::{Action, ActionKind};
use haul_core::decision::Decision;
use haul_core::ids::{AskId, LoadId};
use haul_core::projection::LoadState;
use haul_core::sop::Policies;
use haul_core::time::Timestamp;
use haul_core::{Clock, FakeClock, InboundEvent, QueueMode};
use haul_runtime::channels::{ChannelClient, Channels, DeliveryError, HttpChannel, RecordChannel};
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::faults::Faults;
use haul_runtime::pipeline::{Parts, Pipeline};
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};
use haul_store::{DeliveryLog, LoadQueue, OutboxStatus, Store};
use serde_json::json;

on_both_backends!(
    failing_decider_gives_the_fallback_decision,
    late_decider_gives_the_fallback_decision,
    sms_to_anyone_but_the_driver_does_not_validate,
    one_process_never_runs_one_load_twice_at_once,
    load_lock_makes_a_second_worker_skip_a_held_load,
    record_mode_records_each_delivery_once,
    snapshot_caught_up_is_the_full_fold,
    a_snapshot_at_the_queues_version_is_not_read_again,
    a_run_on_a_snapshot_behind_the_queues_word_conflicts_and_reads,
);

/// A snapshot at the version the queue gave is taken as it is: nothing is read, so a
/// log that moved on behind the queue's back is not seen (the append's version check
/// is what catches that, below). Any other version, or none, reads the tail.
async fn a_snapshot_at_the_queues_version_is_not_read_again(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let w = h.second_worker();
    assert!(matches!(w.process(h.message(init())).await, RunOutcome::Committed { .. }));
    let projector = haul_runtime::projector::Projector::new(store.clone(), 4);
    let at = projector.take(&h.load, None).await.unwrap();
    let version = at.version;
    projector.put(&h.load, at.clone());
    // The log moves on without this projector.
    assert!(matches!(w.process(h.message(ping("ping_0700"))).await, RunOutcome::Committed { .. }));
    let unread = projector.take(&h.load, Some(version)).await.unwrap();
    assert_eq!(unread, at, "a snapshot at the given version is not read");
    projector.put(&h.load, unread);
    let read = projector.take(&h.load, Some(version + 1)).await.unwrap();
    assert_eq!(read, h.state().await, "any other version reads the tail");
    projector.put(&h.load, read.clone());
    assert_eq!(projector.take(&h.load, None).await.unwrap(), read);
}

/// A run told a version its snapshot is at, while another process appended since (the
/// word came before that append): it decides on the stale snapshot, the append's version
/// check refuses it, and the run reads the log, decides again and commits once.
async fn a_run_on_a_snapshot_behind_the_queues_word_conflicts_and_reads(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let (a, b) = (h.second_worker(), h.second_worker());
    assert!(matches!(a.process(h.message(init())).await, RunOutcome::Committed { .. }));
    let stale = h.state().await.version;
    assert!(matches!(b.process(h.message(ping("ping_0700"))).await, RunOutcome::Committed { .. }));
    let mut msg = h.message(sms("s1", DRIVER, "ETA 9"));
    msg.log_version = Some(stale);
    assert!(matches!(a.process(msg).await, RunOutcome::Committed { .. }));
    let ids: Vec<String> = h.log().await.into_iter().map(|r| r.entry_id).collect();
    assert_eq!(ids.iter().filter(|id| id.as_str() == "s1").count(), 1, "{ids:?}");
    assert_eq!(store.conflict_loads(10).await.unwrap().len(), 1, "the stale decision was refused once");
    // Its snapshot is caught up again: the next message at the true version commits.
    let mut msg = h.message(ping("ping_0800"));
    msg.log_version = Some(h.state().await.version);
    assert!(matches!(a.process(msg).await, RunOutcome::Committed { .. }));
    assert_eq!(store.conflict_loads(10).await.unwrap()[0].conflicts, 1);
}

/// A decider that misbehaves in a chosen way.
enum Bad {
    Fails,
    Sleeps(Duration),
    TextsAStranger,
    /// Says it has started deciding, then waits until the test lets it go on: the
    /// test knows a run holds the load without guessing how long that takes.
    Gated {
        entered: Arc<tokio::sync::Notify>,
        release: Arc<tokio::sync::Notify>,
    },
}

#[async_trait]
impl Decider for Bad {
    fn name(&self) -> String {
        "bad".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        match self {
            Bad::Fails => anyhow::bail!("model unavailable"),
            Bad::Sleeps(d) => {
                tokio::time::sleep(*d).await;
                SopDecider { policies: Policies::default() }.decide(load, state, event, now).await
            }
            Bad::Gated { entered, release } => {
                entered.notify_one();
                release.notified().await;
                SopDecider { policies: Policies::default() }.decide(load, state, event, now).await
            }
            Bad::TextsAStranger => {
                let ask = AskId::new("eta_request", &event.event_id)?;
                let action = Action {
                    key: format!("{load}/{ask}/1/send_sms"),
                    kind: ActionKind::SendSms { to: "+15555550199".into(), body: "hi".into() },
                    ask_id: Some(ask),
                    step: Some(1),
                    requeue_of: None,
                };
                Ok(Decision::new(&event.event_id, now, "bad", vec![action], vec![], "texts a stranger"))
            }
        }
    }
}

async fn expect_fallback(h: &H, why: &str) {
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    let d = h.decision("ping_0700").await;
    assert_eq!(d["decider"], "fallback", "{d}");
    assert!(d["rationale"].as_str().unwrap().contains(why), "{d}");
    assert_eq!(h.svc.sends("hero", "481207/ping_0700/create_hero_task:fallback"), 1);
    assert_eq!(h.svc.effects().iter().filter(|e| e.channel == "sms").count(), 0);
}

async fn failing_decider_gives_the_fallback_decision(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), Some(Arc::new(Bad::Fails))).await;
    expect_fallback(&h, "model unavailable").await;
}

async fn late_decider_gives_the_fallback_decision(store: Arc<dyn Store>) {
    let mut config = Config::default();
    config.decider.llm.timeout = Duration::from_millis(200);
    let h = harness(store, config, Faults::default(), Some(Arc::new(Bad::Sleeps(Duration::from_secs(3))))).await;
    expect_fallback(&h, "did not answer within").await;
}

async fn sms_to_anyone_but_the_driver_does_not_validate(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), Some(Arc::new(Bad::TextsAStranger))).await;
    expect_fallback(&h, "not to the driver's phone").await;
}

async fn one_process_never_runs_one_load_twice_at_once(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    h.publish(init()).await;
    h.settle().await;
    let (entered, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let gated: Arc<dyn Decider> = Arc::new(Bad::Gated { entered: entered.clone(), release: release.clone() });
    let w = Arc::new(Worker::new(
        store,
        h.queue.clone(),
        QueueMode::Separate,
        gated,
        h.clock.clone() as Arc<dyn Clock>,
        WorkerSettings::default(),
        Faults::default(),
    ));
    let (a, b) = (h.message(ping("ping_0700")), h.message(ping("ping_0701")));
    let w2 = w.clone();
    let first = tokio::spawn(async move { w2.process(a).await });
    entered.notified().await; // the first run has the load and is deciding
    assert_eq!(w.process(b).await, RunOutcome::Busy, "the second run of the load waits for the first");
    release.notify_one();
    assert!(matches!(first.await.unwrap(), RunOutcome::Committed { .. }));
}

async fn load_lock_makes_a_second_worker_skip_a_held_load(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    h.publish(init()).await;
    h.settle().await;
    let settings = WorkerSettings { load_lock: true, ..WorkerSettings::default() };
    let sop: Arc<dyn Decider> = Arc::new(SopDecider { policies: Policies::default() });
    let w = Worker::new(
        store.clone(),
        h.queue.clone(),
        QueueMode::Separate,
        sop,
        h.clock.clone() as Arc<dyn Clock>,
        settings,
        Faults::default(),
    );
    // Another process holds the load's lease.
    let held = store.try_lock(&h.load, Duration::from_secs(300), h.now()).await.unwrap().expect("free");
    assert_eq!(w.process(h.message(ping("ping_0700"))).await, RunOutcome::Busy, "skipped: no wasted decision");
    assert!(h.state().await.decided.len() == 1, "nothing appended while the load was held");
    held.release().await.unwrap();
    assert!(matches!(w.process(h.message(ping("ping_0700"))).await, RunOutcome::Committed { .. }));
}

async fn record_mode_records_each_delivery_once(store: Arc<dyn Store>) {
    let clock = Arc::new(FakeClock::new(t0()));
    let log = store.clone() as Arc<dyn DeliveryLog>;
    let channels =
        Channels::build(|c| Ok(Arc::new(RecordChannel::new(c, log.clone())) as Arc<dyn ChannelClient>)).unwrap();
    let parts = Parts {
        store: store.clone(),
        queue: store.clone() as Arc<dyn LoadQueue>,
        queue_mode: QueueMode::StoreQueue,
        channels,
        clock: clock.clone(),
        faults: Faults::default(),
        seed: Some(1),
    };
    let p = Pipeline::new(&Config::default(), parts, None);
    let load = LoadId::parse(LOAD).unwrap();
    for e in [init(), ping("ping_0700")] {
        let ev = InboundEvent::from_json(load.clone(), e).unwrap();
        store.publish(&load, ev.event_id.as_str(), &ev.to_json().to_string(), clock.now()).await.unwrap();
    }
    p.run_until_quiet().await.unwrap();
    let got = store.deliveries(Some(&load), 10).await.unwrap();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].channel.as_str(), got[0].key.as_str()), ("sms", SMS1));
    assert_eq!(got[0].payload["to"], DRIVER);
    assert_eq!(store.get(SMS1).await.unwrap().unwrap().status, OutboxStatus::Dispatched);
    // A resend of the key is deduplicated and answers the first receipt.
    let again = channels_sms(&store).send(SMS1, &load, "/v1/messages", &json!({}), None, clock.now()).await.unwrap();
    assert_eq!(again, got[0].receipt);
    assert_eq!(store.deliveries(Some(&load), 10).await.unwrap().len(), 1);
}

async fn snapshot_caught_up_is_the_full_fold(store: Arc<dyn Store>) {
    // One worker keeps a snapshot; "another process" (the second worker) appends too.
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let sop = || Arc::new(SopDecider { policies: Policies::default() }) as Arc<dyn Decider>;
    let (a, b) = (
        Worker::new(
            store.clone(),
            h.queue.clone(),
            QueueMode::Separate,
            sop(),
            h.clock.clone() as Arc<dyn Clock>,
            WorkerSettings::default(),
            Faults::default(),
        ),
        Worker::new(
            store.clone(),
            h.queue.clone(),
            QueueMode::Separate,
            sop(),
            h.clock.clone() as Arc<dyn Clock>,
            WorkerSettings::default(),
            Faults::default(),
        ),
    );
    let events = [
        init(),
        ping("ping_0700"),
        sms("s1", "+15555550199", "hi"),
        ping("ping_0800"),
        sms("s2", DRIVER, "ETA 9"),
        ping("ping_0900"),
    ];
    let projector = haul_runtime::projector::Projector::new(store.clone(), 4);
    for (i, e) in events.into_iter().enumerate() {
        let w = if i % 3 == 1 { &b } else { &a };
        assert!(matches!(w.process(h.message(e)).await, RunOutcome::Committed { .. }));
        let caught_up = projector.take(&h.load, None).await.unwrap();
        assert_eq!(caught_up, h.state().await, "after event {i}");
        projector.put(&h.load, caught_up);
    }
    let ask = AskId::parse("ask:eta_request:ping_0900").unwrap();
    assert_eq!(
        h.state().await.asks[&ask].status,
        haul_core::AskStatus::Open,
        "the last ping opened an ask on the caught-up state"
    );
}

fn channels_sms(store: &Arc<dyn Store>) -> RecordChannel {
    RecordChannel::new(haul_core::Channel::Sms, store.clone() as Arc<dyn DeliveryLog>)
}

/// A service answering the status its path names, to check the classification.
#[tokio::test]
async fn http_channel_classifies_statuses_as_api_md_says() {
    let app = Router::new()
        .route(
            "/{status}/v1/messages",
            post(|Path(status): Path<u16>, headers: axum::http::HeaderMap| async move {
                assert_eq!(headers["idempotency-key"], "k1");
                assert_eq!(headers["authorization"], "Bearer t0k");
                (StatusCode::from_u16(status).unwrap(), axum::Json(json!({"id": "rcpt-1"})))
            }),
        )
        .route(
            "/wait/{retry_after}/v1/messages",
            post(|Path(retry_after): Path<String>| async move {
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after", retry_after)], "slow down")
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let load = LoadId::parse(LOAD).unwrap();
    let send = |status: u16| {
        let load = load.clone();
        async move {
            let c = HttpChannel::new(&format!("http://{addr}/{status}"), Some("t0k".into()), Duration::from_secs(5))
                .unwrap();
            c.send("k1", &load, "/v1/messages", &json!({"to": DRIVER}), None, t0()).await
        }
    };
    for (status, expected) in [
        (200, "ok"),
        (201, "ok"),
        (408, "retryable"),
        (425, "retryable"),
        (429, "retryable"),
        (500, "retryable"),
        (503, "retryable"),
        (400, "permanent"),
        (401, "permanent"),
        (404, "permanent"),
        (422, "permanent"),
    ] {
        let got = match send(status).await {
            Ok(r) => {
                assert_eq!(r, "rcpt-1");
                "ok"
            }
            Err(DeliveryError::Retryable(_)) => "retryable",
            Err(DeliveryError::Permanent(_)) => "permanent",
            Err(DeliveryError::Throttled(_)) => "throttled",
        };
        assert_eq!(got, expected, "HTTP {status}");
    }
    // A 429 that says when to come back is throttled, for that long; one whose
    // `Retry-After` is a date (or nonsense) is an ordinary retryable failure.
    let wait = |retry_after: &'static str| {
        let load = load.clone();
        async move {
            let c =
                HttpChannel::new(&format!("http://{addr}/wait/{retry_after}"), None, Duration::from_secs(5)).unwrap();
            c.send("k1", &load, "/v1/messages", &json!({}), None, t0()).await
        }
    };
    match wait("7").await {
        Err(DeliveryError::Throttled(t)) => {
            assert_eq!(t.retry_after, Duration::from_secs(7));
            assert!(t.why.starts_with("HTTP 429 Too Many Requests: slow down"), "{}", t.why);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(wait("soon").await, Err(DeliveryError::Retryable(_))));
    // Nobody listening: retryable.
    let closed = HttpChannel::new("http://127.0.0.1:9", None, Duration::from_secs(2)).unwrap();
    assert!(matches!(
        closed.send("k", &load, "/v1/messages", &json!({}), None, t0()).await,
        Err(DeliveryError::Retryable(_))
    ));
}

/// A service that echoes the request back in its error answer: what the error (and so
/// the log, the outcome and the OpsAlert) quotes of it has no token and no whole phone
/// number.
#[tokio::test]
async fn channel_errors_quote_an_echoing_service_without_tokens_or_phone_numbers() {
    const TOKEN: &str = "svc-secret-0123456789";
    let app = Router::new().route(
        "/{status}/v1/messages",
        post(|Path(status): Path<u16>, headers: axum::http::HeaderMap, body: String| async move {
            let auth = headers["authorization"].to_str().unwrap().to_owned();
            (StatusCode::from_u16(status).unwrap(), format!("rejected {{\"auth\": \"{auth}\", \"request\": {body}}}"))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let load = LoadId::parse(LOAD).unwrap();
    for status in [400, 503] {
        let c =
            HttpChannel::new(&format!("http://{addr}/{status}"), Some(TOKEN.into()), Duration::from_secs(5)).unwrap();
        let body = json!({"to": DRIVER, "body": "Call +447700900123 about load 481207", "load_id": LOAD});
        let err = c.send("k1", &load, "/v1/messages", &body, None, t0()).await.unwrap_err().to_string();
        assert!(err.contains(&format!("HTTP {status}")), "{err}");
        assert!(!err.contains(TOKEN), "the token is quoted: {err}");
        assert!(!err.contains(DRIVER) && !err.contains("+447700900123"), "a whole phone number is quoted: {err}");
        assert!(err.contains("Bearer ***") && err.contains("***0100") && err.contains("***0123"), "{err}");
    }
}

/// A decider whose first call waits until the test lets it go: a run held mid-decision.
struct Gate {
    entered: tokio::sync::Notify,
    proceed: tokio::sync::Notify,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Decider for Gate {
    fn name(&self) -> String {
        "sop".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        if self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            self.entered.notify_one();
            self.proceed.notified().await;
        }
        SopDecider { policies: Policies::default() }.decide(load, state, event, now).await
    }
}

/// ADR 0003: LoadLock is an optimization, never the correctness mechanism. Worker A
/// takes the lease and is held mid-decision; the lease is lost (`lose`); the message
/// is redelivered to worker B (another process), which takes the lease and commits;
/// then A's decision comes back late. One decision is committed, and A's is not.
async fn a_lost_load_lock_still_ends_with_one_committed_decision(store: Arc<dyn Store>, lose: impl AsyncFnOnce()) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    h.publish(init()).await;
    h.settle().await;
    let settings = WorkerSettings { load_lock: true, ..WorkerSettings::default() };
    let gate = Arc::new(Gate {
        entered: tokio::sync::Notify::new(),
        proceed: tokio::sync::Notify::new(),
        calls: Default::default(),
    });
    let worker = |decider: Arc<dyn Decider>| {
        Arc::new(Worker::new(
            store.clone(),
            h.queue.clone(),
            QueueMode::Separate,
            decider,
            h.clock.clone() as Arc<dyn Clock>,
            settings.clone(),
            Faults::default(),
        ))
    };
    let (a, b) = (worker(gate.clone()), worker(Arc::new(SopDecider { policies: Policies::default() })));

    h.publish(ping("ping_0700")).await;
    let visibility = settings.visibility;
    let first = h.queue.receive(1, visibility, h.now()).await.unwrap().remove(0);
    let run_a = tokio::spawn({
        let a = a.clone();
        async move { a.process(first.into()).await }
    });
    gate.entered.notified().await;
    assert_eq!(
        b.process(h.message(ping("ping_0700"))).await,
        RunOutcome::Busy,
        "while A holds the lease, B skips the load"
    );

    // The lease lapses (and the message's visibility with it): B gets both.
    h.advance(settings.run_timeout.max(visibility).as_secs() + 1);
    lose().await;
    let again = h.queue.receive(1, visibility, h.now()).await.unwrap().remove(0);
    assert_eq!((again.event_id.as_str(), again.receive_count), ("ping_0700", 2));
    assert!(matches!(b.process(again.into()).await, RunOutcome::Committed { .. }), "B runs once the lease is gone");

    // A's decision comes back late: the version check turns it away.
    gate.proceed.notify_one();
    let outcome_a = run_a.await.unwrap();
    assert!(
        matches!(outcome_a, RunOutcome::AlreadyProcessed | RunOutcome::Duplicate),
        "A must not commit a second decision: {outcome_a:?}"
    );
    assert_eq!(h.entries("ping_0700").await, 1);
    assert_eq!(h.entries("dec:ping_0700").await, 1);
    let seqs: Vec<u64> = h.log().await.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "gapless log");
    h.settle().await;
    assert_eq!(h.svc.sends("sms", "481207/ask:eta_request:ping_0700/1/send_sms"), 1);
    assert_eq!(h.queue.depth().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_load_lock_still_ends_with_one_committed_decision_sqlite() {
    // SQLite's lease is a row with an expiry: advancing the clock past it loses it.
    a_lost_load_lock_still_ends_with_one_committed_decision(sqlite().await, async || {}).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_load_lock_still_ends_with_one_committed_decision_postgres() {
    // PostgreSQL's lease is a session's advisory lock: it is lost when the session dies,
    // as when a connection drops mid-run. Kill the session holding this load's lock.
    let (store, schema) = postgres_in_schema().await;
    let url = haul_postgres::testing::database_url();
    let lose = async || {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        let killed = client
            .query(
                "WITH k AS (SELECT hashtextextended('haul:load:' || $1 || '/' || $2, 0) AS key)
                 SELECT pg_terminate_backend(l.pid) FROM pg_locks l, k
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                   AND l.classid::bigint = ((k.key >> 32) & 4294967295)
                   AND l.objid::bigint = (k.key & 4294967295)",
                &[&schema, &LOAD],
            )
            .await
            .unwrap();
        assert_eq!(killed.len(), 1, "one session held the load's lock");
        // pg_terminate_backend only signals the session; the lock goes when it exits.
        for _ in 0..200 {
            let held: i64 = client
                .query_one(
                    "WITH k AS (SELECT hashtextextended('haul:load:' || $1 || '/' || $2, 0) AS key)
                     SELECT count(*) FROM pg_locks l, k
                     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                       AND l.classid::bigint = ((k.key >> 32) & 4294967295)
                       AND l.objid::bigint = (k.key & 4294967295)",
                    &[&schema, &LOAD],
                )
                .await
                .unwrap()
                .get(0);
            if held == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the killed session still held the load's lock after 10 s");
    };
    a_lost_load_lock_still_ends_with_one_committed_decision(store, lose).await;
}
