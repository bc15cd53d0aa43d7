//! ADR 0003's cases, each on SQLite and PostgreSQL, through the real worker,
//! dispatcher and pump, with the channel services as real HTTP servers on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use haul_config::Config;
use haul_core::action::{Action, ActionKind};
use haul_core::decision::Decision;
use haul_core::ids::{AskId, EventId, LoadId};
use haul_core::projection::LoadState;
use haul_core::sop::Policies;
use haul_core::time::{Timestamp, add};
use haul_core::{Clock, EventBody, InboundEvent, QueueMode};
use haul_harness::testkit::{self, FaultKind, FaultRule};
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::dispatcher::Dispatched;
use haul_runtime::faults::{FaultPoint, Faults};
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};
use haul_store::{AlertState, OutboxStatus, Store, TimerStatus};
use serde_json::json;

on_both_backends!(
    crash_between_send_and_mark_resends_with_one_effect_at_the_service,
    crash_after_publish_before_mark_drops_the_duplicate_outcome,
    crash_between_pump_publish_and_mark_fired_logs_one_timer_fired,
    send_slower_than_the_lease_is_resent_and_both_outcomes_are_recorded,
    retry_budget_counts_from_first_attempt_at_not_from_commit,
    retry_budget_counts_from_the_first_attempt_not_from_each_retry,
    first_retry_is_always_allowed,
    hero_channel_failure_raises_an_ops_alert_and_no_hero_task,
    queue_outage_during_publish_backs_off_buries_and_alerts_only_after_a_publish,
    a_refused_ops_alert_is_recorded_once_and_holds_up_no_later_dead_row,
    timer_for_an_answered_ask_is_a_filtered_noop,
    duplicate_action_key_gives_the_fallback_hero_task,
    duplicate_timer_key_gives_the_fallback_hero_task,
    duplicate_action_key_falls_back_with_no_conflict_retries,
    two_runs_of_one_load_at_once_one_commits_the_other_redecides,
    redelivered_inbound_event_is_already_processed,
);

fn outcome_id(key: &str, status: &str) -> String {
    format!("evt:out:{key}:{status}")
}

async fn start(h: &H) {
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
}

async fn crash_between_send_and_mark_resends_with_one_effect_at_the_service(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), crash_at(FaultPoint::AfterSend, SMS1, 1), None).await;
    start(&h).await;
    h.settle().await;
    assert_eq!(h.svc.sends("sms", SMS1), 1, "the SMS went out before the crash");
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Pending, "not marked: the process died");
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 0);
    // The lease lapses; another pass re-sends with the same key.
    h.advance(91);
    h.settle().await;
    assert_eq!(h.svc.sends("sms", SMS1), 2, "re-sent with the same key");
    assert_eq!(h.svc.deduped_effects("sms", SMS1), 1, "the service deduped: one message to the driver");
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Dispatched);
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 1);
    assert!(h.svc.conflicts().is_empty());
}

async fn crash_after_publish_before_mark_drops_the_duplicate_outcome(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), crash_at(FaultPoint::AfterPublish, SMS1, 1), None).await;
    start(&h).await;
    h.settle().await;
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 1, "published before the crash");
    h.advance(91);
    h.settle().await;
    assert_eq!(h.svc.sends("sms", SMS1), 2, "the unmarked row was sent again");
    assert_eq!(h.svc.deduped_effects("sms", SMS1), 1, "the service deduped: one message to the driver");
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Dispatched);
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 1, "the second publish was dropped");
    // Past any queue's dedup window, the event store drops it: a copy that reaches the
    // worker anyway is "already processed" and writes nothing.
    let before = h.log().await.len();
    let copy = json!({"event_id": outcome_id(SMS1, "delivered"), "kind": "action_outcome", "outbox_id": SMS1,
                      "action_type": "send_sms", "status": "delivered", "receipt": "sms-1"});
    assert_eq!(h.pipeline.worker.process(h.message(copy)).await, RunOutcome::AlreadyProcessed);
    assert_eq!(h.log().await.len(), before);
}

async fn crash_between_pump_publish_and_mark_fired_logs_one_timer_fired(store: Arc<dyn Store>) {
    let timer = "tmr:481207:ask:eta_request:ping_0700:1";
    let h = harness(store, Config::default(), crash_at(FaultPoint::AfterPumpPublish, timer, 1), None).await;
    start(&h).await;
    h.settle().await;
    h.set(h.at_min(31));
    h.settle().await;
    let fired = format!("evt:{timer}");
    assert_eq!(h.entries(&fired).await, 1, "timer_fired logged once");
    let t = h.store.get_timer(&timer.parse().unwrap()).await.unwrap().unwrap();
    assert_eq!(t.status, TimerStatus::Fired, "marked by the pass after the crash");
    assert_eq!(h.svc.sends("sms", "481207/ask:eta_request:ping_0700/2/send_sms"), 1, "step 2 once");
    // A second copy that reaches the worker is dropped by the event store.
    let copy = json!({"event_id": fired, "kind": "timer_fired", "timer_id": timer,
                      "ask_id": "ask:eta_request:ping_0700", "step": 1, "fire_at": "2026-03-02T07:30:00Z"});
    assert_eq!(h.pipeline.worker.process(h.message(copy)).await, RunOutcome::AlreadyProcessed);
    assert_eq!(h.entries(&fired).await, 1);
}

async fn send_slower_than_the_lease_is_resent_and_both_outcomes_are_recorded(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    let gate = testkit::Gate::default();
    h.svc.add_fault(FaultRule {
        channel: "sms".into(),
        key: SMS1.into(),
        kind: FaultKind::Held(gate.clone()),
        times: Some(1),
    });
    h.svc.add_fault(FaultRule { channel: "sms".into(), key: SMS1.into(), kind: FaultKind::Permanent, times: Some(1) });
    start(&h).await;
    for _ in 0..3 {
        h.pipeline.worker.run_once().await.unwrap();
    }
    // Dispatcher A claims and its send is held at the service past the lease.
    let a = h.pipeline.dispatcher.clone();
    let slow = tokio::spawn(async move { a.run_once().await.unwrap() });
    gate.arrived().await; // A has claimed the row and its call is at the service
    h.advance(91);
    // Dispatcher B takes the lapsed row over and re-sends; its attempt fails for good.
    let b = h.second_dispatcher(99);
    let b_results = b.run_once().await.unwrap();
    assert!(b_results.contains(&Dispatched::Buried), "{b_results:?}");
    // A's send completes at the service; A publishes delivered, then its mark is stale.
    gate.release();
    let a_results = slow.await.unwrap();
    assert!(a_results.contains(&Dispatched::Stale), "{a_results:?}");
    assert_eq!(h.svc.sends("sms", SMS1), 1, "the driver got one message");
    h.settle().await;
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 1);
    assert_eq!(h.entries(&outcome_id(SMS1, "failed")).await, 1, "both outcomes recorded");
    let state = h.state().await;
    assert_eq!(state.outcomes[SMS1].status, haul_core::OutcomeStatus::Delivered, "delivered proves the send");
}

async fn retry_budget_counts_from_first_attempt_at_not_from_commit(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    h.svc.add_fault(FaultRule { channel: "sms".into(), key: SMS1.into(), kind: FaultKind::Retryable, times: None });
    start(&h).await;
    for _ in 0..3 {
        h.pipeline.worker.run_once().await.unwrap();
    }
    // A backlog: nothing dispatched for ten minutes, far past the 150 s budget.
    h.advance(600);
    let first_attempt = h.now();
    let mut retry_ats: Vec<Timestamp> = Vec::new();
    loop {
        h.pipeline.dispatcher.run_once().await.unwrap();
        let row = h.row(SMS1).await;
        assert_eq!(row.first_attempt_at, Some(first_attempt), "the budget is anchored at the first claim");
        if row.status == OutboxStatus::Dead {
            break;
        }
        retry_ats.push(row.due_at);
        h.set(row.due_at);
        assert!(retry_ats.len() < 20, "never died");
    }
    assert!(retry_ats.len() >= 3, "a backlog did not spend the budget: {} retries", retry_ats.len());
    let deadline = add(first_attempt, Duration::from_secs(150));
    assert!(retry_ats.iter().all(|t| *t <= deadline), "no retry past the budget");
    h.settle().await;
    assert_eq!(h.entries(&outcome_id(SMS1, "failed")).await, 1);
    let task = format!("481207/{}/create_hero_task", outcome_id(SMS1, "failed"));
    assert_eq!(h.svc.sends("hero", &task), 1, "the agent escalates a failed SMS");
}

/// A backlog between retries: each retry is taken a minute after it was due. The
/// budget (150 s) runs from the row's first attempt, so the fourth attempt's retry
/// would land past it and the row dies for the budget, long before its 8 attempts.
/// Anchored at each attempt's `now` instead, it would retry until the attempts ran out.
async fn retry_budget_counts_from_the_first_attempt_not_from_each_retry(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    h.svc.add_fault(FaultRule { channel: "sms".into(), key: SMS1.into(), kind: FaultKind::Retryable, times: None });
    start(&h).await;
    for _ in 0..3 {
        h.pipeline.worker.run_once().await.unwrap();
    }
    let first_attempt = h.now();
    for _ in 0..20 {
        h.pipeline.dispatcher.run_once().await.unwrap();
        let row = h.row(SMS1).await;
        if row.status == OutboxStatus::Dead {
            let failure = row.last_failure.unwrap_or_default();
            assert!(failure.contains("retry budget of 150s spent"), "{failure}");
            assert_eq!(row.attempts, 4, "{failure}");
            assert!(h.now() > add(first_attempt, Duration::from_secs(150)), "died at {}", h.now());
            return;
        }
        h.set(add(row.due_at, Duration::from_secs(60)));
    }
    panic!("the row never died");
}

async fn first_retry_is_always_allowed(store: Arc<dyn Store>) {
    let mut config = Config::default();
    config.dispatcher.retry.base = Duration::from_secs(1);
    config.dispatcher.retry.cap = Duration::from_secs(1);
    config.dispatcher.retry.budget = Duration::from_millis(1);
    let h = harness(store, config, Faults::default(), None).await;
    h.svc.add_fault(FaultRule { channel: "sms".into(), key: SMS1.into(), kind: FaultKind::Retryable, times: Some(1) });
    start(&h).await;
    h.settle().await;
    let row = h.row(SMS1).await;
    assert_eq!((row.status, row.attempts), (OutboxStatus::Pending, 1), "one transient error never kills a row");
    h.advance(2);
    h.settle().await;
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Dispatched);
    assert_eq!(h.svc.sends("sms", SMS1), 1);
}

async fn hero_channel_failure_raises_an_ops_alert_and_no_hero_task(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    h.svc.add_fault(FaultRule { channel: "hero".into(), key: "*".into(), kind: FaultKind::Permanent, times: None });
    h.publish(init()).await;
    h.publish(sms("sms_x", "+15555550199", "who is this?")).await;
    h.settle().await;
    let key = "481207/sms_x/create_hero_task";
    assert_eq!(h.row(key).await.status, OutboxStatus::Dead);
    assert_eq!(h.svc.sends("ops", &format!("alert:{key}")), 1, "an OpsAlert, independent of Hero tooling");
    let failed = outcome_id(key, "failed");
    let d = h.decision(&failed).await;
    assert_eq!((d["filtered"].as_bool(), d["needs_hero_task"].as_bool()), (Some(true), Some(false)));
    let rows = h.store.rows_for_load(&h.load).await.unwrap();
    assert_eq!(
        rows.len(),
        1,
        "no Hero task about the Hero failure: {:?}",
        rows.iter().map(|r| &r.id).collect::<Vec<_>>()
    );
    assert!(h.svc.effects().iter().all(|e| e.channel != "hero"));
}

async fn queue_outage_during_publish_backs_off_buries_and_alerts_only_after_a_publish(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    h.publish(init()).await;
    h.publish(sms("sms_x", "+15555550199", "who is this?")).await;
    for _ in 0..3 {
        h.pipeline.worker.run_once().await.unwrap();
    }
    let key = "481207/sms_x/create_hero_task";
    h.queue.set_down(true);
    let mut gaps = Vec::new();
    loop {
        let before = h.now();
        h.pipeline.dispatcher.run_once().await.unwrap();
        let row = h.row(key).await;
        if row.status == OutboxStatus::Dead {
            break;
        }
        gaps.push((row.due_at.as_millisecond() - before.as_millisecond()) as u64);
        assert_eq!(h.svc.sends("ops", &format!("alert:{key}")), 0, "no page while the queue is down");
        h.set(row.due_at);
        assert!(gaps.len() < 20);
    }
    assert!(gaps.len() >= 2, "backed off before burying: {gaps:?}");
    // Each gap is within equal jitter of the capped exponential curve (base 1 s).
    for (i, gap) in gaps.iter().enumerate() {
        let full = (1000u64 << i).min(30_000);
        assert!(*gap >= full / 2 && *gap <= full, "gap {i} = {gap} ms outside [{}, {full}]", full / 2);
    }
    assert_eq!(h.svc.deduped_effects("hero", key), 1, "resends were deduped by the Hero service");
    assert_eq!(h.svc.sends("ops", &format!("alert:{key}")), 0, "buried with no publish: no alert yet");
    // The queue comes back: the sweep publishes the failed outcome, then alerts once.
    h.queue.set_down(false);
    h.settle().await;
    assert_eq!(h.svc.sends("ops", &format!("alert:{key}")), 1);
    assert_eq!(h.entries(&outcome_id(key, "failed")).await, 1);
    assert!(h.store.dead_without_outcome(10).await.unwrap().is_empty());
}

/// The ops service refuses (4xx) the OpsAlert of an old dead Hero task; later an SMS
/// dies while the queue is down, so its failed outcome is left to the sweep. The
/// refusal is recorded and not sent again, and the SMS's outcome gets out behind it:
/// rule 6's Hero task is made.
async fn a_refused_ops_alert_is_recorded_once_and_holds_up_no_later_dead_row(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    let hero = "481207/sms_x/create_hero_task";
    let alert = format!("alert:{hero}");
    let permanent = |channel: &str, key: &str| FaultRule {
        channel: channel.into(),
        key: key.into(),
        kind: FaultKind::Permanent,
        times: None,
    };
    h.svc.add_fault(permanent("hero", hero));
    h.svc.add_fault(permanent("ops", &alert));
    h.svc.add_fault(permanent("sms", SMS1));
    h.publish(init()).await;
    h.publish(sms("sms_x", "+15555550199", "who is this?")).await;
    h.settle().await;
    assert_eq!(h.row(hero).await.status, OutboxStatus::Dead);
    // The ask's SMS dies while the queue is down: its outcome is left to the sweep.
    h.advance(60);
    h.publish(ping("ping_0700")).await;
    while !h.pipeline.worker.run_once().await.unwrap().is_empty() {}
    h.queue.set_down(true);
    h.pipeline.dispatcher.run_once().await.unwrap();
    assert_eq!(h.row(SMS1).await.status, OutboxStatus::Dead);
    h.queue.set_down(false);
    for _ in 0..5 {
        h.settle().await;
        h.advance(60);
    }
    let failed = outcome_id(SMS1, "failed");
    assert_eq!(h.entries(&failed).await, 1, "the SMS's failed outcome got out behind the refused alert");
    assert_eq!(h.svc.sends("hero", &format!("{LOAD}/{failed}/create_hero_task")), 1, "rule 6");
    assert_eq!(h.svc.call_count("ops", &alert), 1, "a refused alert is not sent again");
    let alerts = h.store.ops_alerts(&haul_store::RowCursor::start(), 10).await.unwrap();
    let got: Vec<_> = alerts.iter().map(|a| (a.outbox_id.as_str(), a.state, a.sends)).collect();
    assert_eq!(got, vec![(hero, AlertState::Refused, 1)]);
    assert!(alerts[0].last_error.as_deref().unwrap_or("").contains("4"), "{:?}", alerts[0].last_error);
    assert!(h.store.dead_without_outcome(10).await.unwrap().is_empty(), "both rows settled");
}

async fn timer_for_an_answered_ask_is_a_filtered_noop(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    start(&h).await;
    h.settle().await;
    // The driver answers at the instant the timer is due: the answer is first in the
    // load's queue, the timer_fired right behind it.
    h.set(h.at_min(30));
    h.publish(sms("sms_1", DRIVER, "ETA 9:15")).await;
    h.settle().await;
    let fired = "evt:tmr:481207:ask:eta_request:ping_0700:1";
    assert_eq!(h.entries(fired).await, 1, "the timer fired");
    let d = h.decision(fired).await;
    assert_eq!((d["filtered"].as_bool(), d["decider"].as_str()), (Some(true), Some("filter")));
    assert!(d["actions"].as_array().unwrap().is_empty());
    assert_eq!(h.svc.sends("sms", "481207/ask:eta_request:ping_0700/2/send_sms"), 0, "no second ask");
    let ask = &h.state().await.asks[&AskId::parse("ask:eta_request:ping_0700").unwrap()];
    assert_eq!(ask.status, haul_core::AskStatus::Answered);
}

/// Reuses the first ping's action key for every ping: a decision bug. The SMS's key
/// (an outbox row's), or with `timer` the timer's (committed in the append: no row).
#[derive(Default)]
struct ReusesKeys {
    timer: bool,
}

#[async_trait]
impl Decider for ReusesKeys {
    fn name(&self) -> String {
        "reuses-keys".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        let EventBody::LocationPing(_) = event.body else {
            return Ok(Decision::new(&event.event_id, now, "reuses-keys", vec![], vec![], "nothing"));
        };
        let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
        let (key, kind) = if self.timer {
            let timer_id = haul_core::TimerId::new(load, &ask, 1);
            let fire_at = haul_core::time::add(now, Duration::from_secs(1800));
            (
                format!("{load}/{ask}/1/set_timer"),
                ActionKind::SetTimer { timer_id, fire_at, ask_id: ask.clone(), step: 1 },
            )
        } else {
            let phone = state.driver_phone.clone().unwrap();
            (format!("{load}/{ask}/1/send_sms"), ActionKind::SendSms { to: phone, body: "ETA?".into() })
        };
        let action = Action { key, kind, ask_id: Some(ask), step: Some(1), requeue_of: None };
        Ok(Decision::new(&event.event_id, now, "reuses-keys", vec![action], vec![], "always the same key"))
    }
}

async fn duplicate_action_key_gives_the_fallback_hero_task(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), Some(Arc::new(ReusesKeys::default()))).await;
    start(&h).await;
    h.settle().await;
    h.publish(ping("ping_0800")).await;
    h.settle().await;
    let d = h.decision("ping_0800").await;
    assert_eq!(d["decider"], "fallback");
    assert_eq!(d["actions"][0]["key"], "481207/ping_0800/create_hero_task:fallback");
    assert_eq!(d["actions"][0]["params"]["urgency"], "urgent");
    assert!(d["rationale"].as_str().unwrap().contains("reused action key"), "{d}");
    assert_eq!(h.svc.sends("hero", "481207/ping_0800/create_hero_task:fallback"), 1);
    assert_eq!(h.entries("ping_0800").await, 1, "the inbound event was not lost");
}

/// A timer committed with its decision has no outbox row to refuse a reused key: its
/// outcome, already in the log, does, and the run falls back as it would.
async fn duplicate_timer_key_gives_the_fallback_hero_task(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), Some(Arc::new(ReusesKeys { timer: true }))).await;
    start(&h).await;
    h.settle().await;
    h.publish(ping("ping_0800")).await;
    h.settle().await;
    let d = h.decision("ping_0800").await;
    assert_eq!(d["decider"], "fallback", "{d}");
    assert!(
        d["rationale"].as_str().unwrap().contains("reused action key 481207/ask:eta_request:ping_0700/1/set_timer"),
        "{d}"
    );
    assert_eq!(h.svc.sends("hero", "481207/ping_0800/create_hero_task:fallback"), 1);
    assert_eq!(h.entries("ping_0800").await, 1, "the inbound event was not lost");
}

async fn duplicate_action_key_falls_back_with_no_conflict_retries(store: Arc<dyn Store>) {
    let mut config = Config::default();
    config.worker.conflict_retries = 0;
    let h = harness(store, config, Faults::default(), Some(Arc::new(ReusesKeys::default()))).await;
    start(&h).await;
    h.settle().await;
    h.publish(ping("ping_0800")).await;
    // The load's next event waits behind it in the queue.
    h.publish(sms("sms_0801", DRIVER, "ETA 9:15")).await;
    h.settle().await;
    let d = h.decision("ping_0800").await;
    assert_eq!(d["decider"], "fallback", "{d}");
    assert!(d["rationale"].as_str().unwrap().contains("reused action key"), "{d}");
    assert_eq!(h.svc.sends("hero", "481207/ping_0800/create_hero_task:fallback"), 1);
    assert_eq!(h.entries("ping_0800").await, 1, "the inbound event was logged");
    assert_eq!(h.entries("sms_0801").await, 1, "the load's queue moved on");
}

/// The SOP, but the first two calls wait for each other, so two runs read the same
/// version before either appends.
struct Gate {
    sop: SopDecider,
    barrier: tokio::sync::Barrier,
    calls: AtomicUsize,
    versions: std::sync::Mutex<Vec<u64>>,
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
        self.versions.lock().unwrap().push(state.version);
        if self.calls.fetch_add(1, Ordering::SeqCst) < 2 {
            self.barrier.wait().await;
        }
        self.sop.decide(load, state, event, now).await
    }
}

async fn two_runs_of_one_load_at_once_one_commits_the_other_redecides(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    h.publish(init()).await;
    h.settle().await;
    let gate = Arc::new(Gate {
        sop: SopDecider { policies: Policies::default() },
        barrier: tokio::sync::Barrier::new(2),
        calls: AtomicUsize::new(0),
        versions: std::sync::Mutex::new(vec![]),
    });
    // Two worker processes on one store.
    let worker = || {
        Arc::new(Worker::new(
            store.clone(),
            h.queue.clone(),
            QueueMode::Separate,
            gate.clone(),
            h.clock.clone() as Arc<dyn Clock>,
            WorkerSettings::default(),
            Faults::default(),
        ))
    };
    let (w1, w2) = (worker(), worker());
    let m1 = h.message(sms("sms_a", "+15555550199", "first"));
    let m2 = h.message(sms("sms_b", "+15555550198", "second"));
    let (r1, r2) = tokio::join!(w1.process(m1), w2.process(m2));
    let committed = |r: &RunOutcome| matches!(r, RunOutcome::Committed { .. });
    assert!(committed(&r1) && committed(&r2), "{r1:?} {r2:?}");
    let versions = gate.versions.lock().unwrap().clone();
    assert_eq!(versions, vec![2, 2, 4], "both read version 2; the loser re-decided on version 4");
    let seqs: Vec<u64> = h.log().await.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=6).collect::<Vec<_>>(), "gapless");
    // The refusal is counted for the operators' conflicts query, beside the log.
    let conflicts = store.conflict_loads(10).await.unwrap();
    let got: Vec<(String, u64)> = conflicts.iter().map(|c| (c.load_id.to_string(), c.conflicts)).collect();
    assert_eq!(got, [(LOAD.to_owned(), 1)]);
}

async fn redelivered_inbound_event_is_already_processed(store: Arc<dyn Store>) {
    let h = harness(store, Config::default(), Faults::default(), None).await;
    start(&h).await;
    h.settle().await;
    let before = h.log().await.len();
    assert_eq!(h.pipeline.worker.process(h.message(ping("ping_0700"))).await, RunOutcome::AlreadyProcessed);
    // The queue drops a republish of the same event id too.
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    assert_eq!(h.log().await.len(), before);
    assert_eq!(h.svc.sends("sms", SMS1), 1);
    let _ = EventId::parse("ping_0700");
}

/// The SMS is delivered and its outcome published, but marking its row keeps failing
/// (a trigger in the test's schema refuses that one update): each failure is a failed
/// attempt that backs off, and when attempts are spent the row is buried, with no
/// failed outcome (the delivered one is out) and one SMS at the service. PostgreSQL
/// only: the fault is the database's own refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_that_keeps_failing_after_a_send_backs_off_and_buries_the_row_on_postgres() {
    let (store, schema) = postgres_in_schema().await;
    let client = haul_postgres::testing::client_in_schema(&haul_postgres::testing::database_url(), &schema).await;
    client
        .batch_execute(&format!(
            "CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'the test refuses this mark'; END $$;
             CREATE TRIGGER refuse_mark BEFORE UPDATE ON outbox FOR EACH ROW
             WHEN (NEW.id = '{SMS1}' AND NEW.status = 'dispatched') EXECUTE FUNCTION refuse_mark();"
        ))
        .await
        .unwrap();
    let h = harness(store, Config::default(), Faults::default(), None).await;
    start(&h).await;
    let mut gaps = Vec::new();
    for _ in 0..20 {
        let before = h.now();
        h.settle().await;
        let row = h.row(SMS1).await;
        if row.status != OutboxStatus::Pending {
            break;
        }
        gaps.push((row.due_at.as_millisecond() - before.as_millisecond()) as u64);
        h.set(row.due_at);
    }
    let row = h.row(SMS1).await;
    assert_eq!((row.status, row.attempts), (OutboxStatus::Dead, 8), "buried after its attempts: {gaps:?}");
    assert!(row.last_failure.as_deref().unwrap_or("").contains("mark_dispatched failed"), "{row:?}");
    assert_eq!(gaps.len(), 7, "backed off between attempts, not re-sent every lease: {gaps:?}");
    assert!(gaps.iter().all(|g| *g < 90_000), "{gaps:?}");
    assert_eq!(h.svc.deduped_effects("sms", SMS1), 1, "the re-sends were deduplicated");
    assert_eq!(h.entries(&outcome_id(SMS1, "delivered")).await, 1);
    assert_eq!(h.entries(&outcome_id(SMS1, "failed")).await, 0, "no failed outcome for a delivered SMS");
    assert!(h.store.dead_without_outcome(10).await.unwrap().is_empty(), "settled");
}
