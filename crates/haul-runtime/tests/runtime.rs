//! The worker, the dispatcher and the operator requests of this crate, run for real on
//! SQLite with a fake clock: what each does with a message, a row or a request, read
//! back from the store, the queue and the logs. The harness's evals and simulator run
//! the same parts end to end; these hold each part's own choices, so a change here is
//! caught by this crate's tests (what `scripts/mutants --runtime` measures).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use haul_core::action::ActionType;
use haul_core::decision::Decision;
use haul_core::ids::{AskId, EventId, LoadId};
use haul_core::projection::LoadState;
use haul_core::time::{Timestamp, add};
use haul_core::timers::TimerRoute;
use haul_core::{Channel, InboundEvent, QueueMode};
use haul_runtime::decider::Decider;
use haul_runtime::dispatcher::{Dispatched, DispatcherSettings};
use haul_runtime::faults::{FaultPoint, Faults, PlantedBugs};
use haul_runtime::operator::{self, DeadFilter, OperatorError, Requester};
use haul_runtime::queue::EventQueue;
use haul_runtime::shadow::{Shadow, ShadowSettings};
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};
use haul_store::{AlertState, NewEntry, OutboxStatus, Published, RowCursor, TimerStatus};
use serde_json::json;

fn committed(actions: usize) -> RunOutcome {
    RunOutcome::Committed { decider: "sop".into(), filtered: false, actions }
}

// ---------------------------------------------------------------------------------
// The worker.

const SMS_ROW: &str = "L1/ask:eta_request:ping_0700/1/send_sms";
const TIMER_ROW: &str = "L1/ask:eta_request:ping_0700/1/set_timer";
const TIMER: &str = "tmr:L1:ask:eta_request:ping_0700:1";
/// What a run that settled its timer in its append logs after the decision.
const SETTLED: [&str; 2] = ["evt:out:L1/ask:eta_request:ping_0700/1/set_timer:delivered", "decision:filter"];

/// One run per message: the event, its decision and its rows in one append, then the
/// ack. With the timer in the append: the timer scheduled, its outcome and the
/// filter's noop logged by the same run, one outbox row. Through the outbox: a row for
/// the timer, and nothing scheduled until the dispatcher applies it.
#[tokio::test]
async fn a_message_is_logged_with_its_decision_and_rows_then_acked_and_found_processed() {
    let logged = ["load:init", "decision:sop", "ping_0700", "decision:sop"];
    let cases: [(TimerRoute, &[&str], &[&str], bool); 2] = [
        (TimerRoute::WithDecision, &SETTLED, &[SMS_ROW], true),
        (TimerRoute::Outbox, &[], &[SMS_ROW, TIMER_ROW], false),
    ];
    for (route, settled, rows, scheduled) in cases {
        let rig = Rig::new().await;
        let worker =
            rig.worker_with(sop(), WorkerSettings { timers: route, ..WorkerSettings::default() }, Faults::default());
        rig.publish("L1", init()).await;
        rig.publish("L1", ping("ping_0700")).await;
        assert_eq!(rig.settle(&worker).await, vec![committed(0), committed(2)]);
        let kinds: Vec<&str> = logged.iter().chain(settled).copied().collect();
        assert_eq!(rig.kinds("L1").await, kinds, "{route:?}");
        let got: Vec<_> = rig.rows("L1").await.iter().map(|r| (r.id.clone(), r.status)).collect();
        let want: Vec<_> = rows.iter().map(|r| (r.to_string(), OutboxStatus::Pending)).collect();
        assert_eq!(got, want, "{route:?}");
        let timer = rig.store.get_timer(&haul_core::ids::TimerId::parse(TIMER).unwrap()).await.unwrap();
        assert_eq!(timer.map(|t| t.status), scheduled.then_some(TimerStatus::Scheduled), "{route:?}");
        assert_eq!(rig.depth().await, 0, "both messages acked");
        // A redelivery of a logged event writes nothing.
        assert_eq!(worker.process(rig.message("L1", ping("ping_0700"))).await, RunOutcome::AlreadyProcessed);
        assert_eq!(rig.log("L1").await.len(), kinds.len());
    }
}

#[tokio::test]
async fn run_once_takes_as_many_loads_as_the_concurrency_leaves() {
    let rig = Rig::new().await;
    for l in ["L1", "L2", "L3"] {
        rig.publish(l, init()).await;
    }
    let settings = WorkerSettings { concurrency: 2, ..WorkerSettings::default() };
    let worker = rig.worker_with(sop(), settings, Faults::default());
    assert_eq!(worker.settings().concurrency, 2);
    assert_eq!(worker.run_once().await.unwrap().len(), 2);
    assert_eq!(worker.run_once().await.unwrap().len(), 1);
    assert_eq!(worker.run_once().await.unwrap(), vec![]);
}

#[tokio::test]
async fn receive_hands_out_the_published_messages() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let got = rig.worker().receive(10).await.unwrap();
    assert_eq!(got.iter().map(|m| m.event_id.as_str()).collect::<Vec<_>>(), ["load:init"]);
}

#[tokio::test]
async fn a_stopped_worker_gives_its_message_back_and_appends_nothing() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let worker = rig.worker();
    worker.stop();
    let outcomes = worker.run_once().await.unwrap();
    assert!(matches!(outcomes[..], [RunOutcome::LeftForRedelivery(_)]), "{outcomes:?}");
    assert_eq!(rig.log("L1").await.len(), 0);
    assert_eq!(rig.depth().await, 1, "the message is still queued");
}

#[tokio::test]
async fn a_run_past_its_time_limit_appends_nothing() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let settings = WorkerSettings { run_timeout: Duration::ZERO, ..WorkerSettings::default() };
    let outcomes = rig.worker_with(sop(), settings, Faults::default()).run_once().await.unwrap();
    assert!(matches!(outcomes[..], [RunOutcome::LeftForRedelivery(_)]), "{outcomes:?}");
    assert_eq!(rig.log("L1").await.len(), 0);
}

#[tokio::test]
async fn a_load_held_elsewhere_is_given_back_for_the_redelivery_delay_only() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let settings = WorkerSettings { load_lock: true, redelivery_delay: Duration::from_secs(2), ..Default::default() };
    let worker = rig.worker_with(sop(), settings, Faults::default());
    let held = rig.store.try_lock(&load("L1"), Duration::from_secs(300), rig.now()).await.unwrap().unwrap();
    assert_eq!(worker.run_once().await.unwrap(), vec![RunOutcome::Busy]);
    assert!(worker.receive(1).await.unwrap().is_empty(), "not visible before the delay");
    held.release().await.unwrap();
    rig.clock.advance(Duration::from_secs(2));
    assert_eq!(
        worker.run_once().await.unwrap(),
        vec![committed(0)],
        "visible again after the delay, not the visibility"
    );
}

/// Decides as the SOP does, after waiting for the test's word.
struct Gated {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Decider for Gated {
    fn name(&self) -> String {
        "sop".into()
    }
    async fn decide(&self, l: &LoadId, s: &LoadState, e: &InboundEvent, now: Timestamp) -> anyhow::Result<Decision> {
        self.entered.notify_one();
        self.release.notified().await;
        sop().decide(l, s, e, now).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_runs_one_load_once_at_a_time_and_again_after() {
    let rig = Rig::new().await;
    let (entered, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let gated = Arc::new(Gated { entered: entered.clone(), release: release.clone() });
    let worker = rig.worker_with(gated, WorkerSettings::default(), Faults::default());
    let w = worker.clone();
    let first = rig.message("L1", init());
    let running = tokio::spawn(async move { w.process(first).await });
    // Bounded waits: a run that never reaches its decider fails the test, never hangs it.
    let within = |what: &'static str| {
        let entered = entered.clone();
        async move { tokio::time::timeout(Duration::from_secs(5), entered.notified()).await.expect(what) }
    };
    within("the first run decides").await;
    assert_eq!(worker.process(rig.message("L1", ping("ping_0700"))).await, RunOutcome::Busy);
    release.notify_one();
    let ends = |what: &'static str, run: tokio::task::JoinHandle<RunOutcome>| async move {
        tokio::time::timeout(Duration::from_secs(5), run).await.expect(what).unwrap()
    };
    assert_eq!(ends("the first run ends", running).await, committed(0));
    // The load is free again once its run ended.
    let next = tokio::spawn({
        let (w, m) = (worker.clone(), rig.message("L1", ping("ping_0700")));
        async move { w.process(m).await }
    });
    within("the next run of the load decides").await;
    release.notify_one();
    assert_eq!(ends("the next run ends", next).await, committed(2));
}

/// Appends a record of its own to the load before it answers, as another process
/// would: every append of the run it decides for meets a newer version.
struct Racing {
    store: Arc<dyn haul_store::Store>,
    calls: AtomicU32,
}

#[async_trait]
impl Decider for Racing {
    fn name(&self) -> String {
        "sop".into()
    }
    async fn decide(&self, l: &LoadId, s: &LoadState, e: &InboundEvent, now: Timestamp) -> anyhow::Result<Decision> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let entry = NewEntry {
            entry_id: format!("other-{n}"),
            kind: "load_update".into(),
            payload: json!({"stage": "in_transit"}),
            derived: Default::default(),
            trace: None,
        };
        self.store.append(l, vec![entry], s.version, vec![], now).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        sop().decide(l, s, e, now).await
    }
}

#[tokio::test]
async fn a_log_that_moves_under_every_attempt_is_redecided_up_to_the_limit_then_left() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let racing = Arc::new(Racing { store: rig.store.clone(), calls: AtomicU32::new(0) });
    let settings = WorkerSettings { conflict_retries: 2, ..WorkerSettings::default() };
    let worker = rig.worker_with(racing.clone(), settings, Faults::default());
    let outcome =
        tokio::time::timeout(Duration::from_secs(20), worker.run_once()).await.expect("the run ends").unwrap();
    assert!(matches!(outcome[..], [RunOutcome::LeftForRedelivery(_)]), "{outcome:?}");
    assert_eq!(racing.calls.load(Ordering::SeqCst), 3, "the first decision and two re-decisions");
    assert_eq!(rig.kinds("L1").await, ["other-0", "other-1", "other-2"], "only the other writer's records");
}

#[tokio::test]
async fn two_runs_read_together_and_the_second_appends_after_deciding_again() {
    let rig = Rig::new().await;
    let (a, b) = (rig.worker(), rig.worker());
    let (ra, rb) = a.interleave(rig.message("L1", init()), &b, rig.message("L1", ping("ping_0700"))).await;
    assert_eq!((ra, rb), (committed(0), committed(2)));
    let kinds = ["load:init", "decision:sop", "ping_0700", "decision:sop", SETTLED[0], SETTLED[1]];
    assert_eq!(rig.kinds("L1").await, kinds);
}

/// Fails every decision.
struct Failing;

#[async_trait]
impl Decider for Failing {
    fn name(&self) -> String {
        "llm:test".into()
    }
    async fn decide(&self, _: &LoadId, _: &LoadState, _: &InboundEvent, _: Timestamp) -> anyhow::Result<Decision> {
        anyhow::bail!("the model is unavailable")
    }
}

#[tokio::test]
async fn a_failing_decider_gives_the_fallback_and_the_filter_does_not_ask_it() {
    let rig = Rig::new().await;
    let worker = rig.worker_with(Arc::new(Failing), WorkerSettings::default(), Faults::default());
    rig.publish("L1", init()).await;
    rig.publish("L1", ping("ping_0700")).await;
    let outcomes = rig.settle(&worker).await;
    let fallback = RunOutcome::Committed { decider: "fallback".into(), filtered: false, actions: 1 };
    assert_eq!(outcomes, vec![fallback.clone(), fallback]);
    assert_eq!(rig.row("L1", "create_hero_task").await.id, "L1/load:init/create_hero_task:fallback");
}

/// A model's decider with its costs: the init decided (SOP actions) at 100 tokens; the
/// 07:00 ping answered with no decision at 200; the 08:00 ping answered with an SMS to
/// a stranger at 300. Its prompt texts name one text no decision refers to.
struct Metered;

fn metered_usage(event: &InboundEvent, input_tokens: u64) -> haul_core::spend::LlmUsage {
    haul_core::spend::LlmUsage {
        model: "m".into(),
        model_version: None,
        input_tokens,
        output_tokens: 1,
        cost_micro_usd: Some(input_tokens),
        finish_reason: Some("tool_calls".into()),
        prompt_hash: "h-fixed".into(),
        input_hash: format!("h-{}", event.event_id),
        client: None,
    }
}

#[async_trait]
impl Decider for Metered {
    fn name(&self) -> String {
        "llm:m".into()
    }
    async fn decide(&self, l: &LoadId, s: &LoadState, e: &InboundEvent, now: Timestamp) -> anyhow::Result<Decision> {
        match e.event_id.as_str() {
            "ping_0700" => Err(haul_runtime::llm::Spent {
                error: haul_runtime::llm::LlmError::Refusal("no".into()),
                usage: Some(metered_usage(e, 200)),
            }
            .into()),
            "ping_0800" => {
                let action = haul_core::Action {
                    key: format!("{l}/ping_0800/send_sms:x"),
                    kind: haul_core::ActionKind::SendSms { to: "+15555550199".into(), body: "hi".into() },
                    ask_id: None,
                    step: None,
                    requeue_of: None,
                };
                let mut d = Decision::new(&e.event_id, now, "llm:m", vec![action], vec![], "text a stranger");
                d.llm = Some(metered_usage(e, 300));
                Ok(d)
            }
            _ => {
                let mut d = sop().decide(l, s, e, now).await?;
                d.decider = "llm:m".into();
                d.llm = Some(metered_usage(e, 100));
                Ok(d)
            }
        }
    }
    fn prompt_texts(&self, _: &LoadId, _: &LoadState, e: &InboundEvent, _: Timestamp) -> Vec<(String, String)> {
        vec![
            ("h-fixed".into(), "the fixed part".into()),
            (format!("h-{}", e.event_id), format!("the input of {}", e.event_id)),
            ("h-other".into(), "named by no decision".into()),
        ]
    }
}

/// A model call's cost is recorded with its decision, and with the fallback when its
/// answer made no decision (it spent the tokens all the same); the prompts a decision
/// names are stored with it, and no other.
#[tokio::test]
async fn what_a_model_call_cost_is_recorded_even_when_it_falls_back() {
    let rig = Rig::new().await;
    let worker = rig.worker_with(Arc::new(Metered), WorkerSettings::default(), Faults::default());
    rig.publish("L1", init()).await;
    rig.publish("L1", ping("ping_0700")).await;
    rig.publish("L1", ping("ping_0800")).await;
    rig.settle(&worker).await;
    let decisions: Vec<(String, Option<u64>)> = rig
        .log("L1")
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            haul_core::log::Entry::Decision(d) if !d.filtered => Some((d.decider, d.llm.map(|u| u.input_tokens))),
            _ => None,
        })
        .collect();
    let want = [("llm:m", Some(100)), ("fallback", Some(200)), ("fallback", Some(300))];
    assert_eq!(decisions, want.map(|(d, t)| (d.to_owned(), t)));
    let spend = haul_core::project(&rig.log("L1").await).spend.spend;
    assert_eq!((spend.input_tokens, spend.cost_micro_usd, spend.calls), (600, 600, 3));
    for (hash, text) in [
        ("h-fixed", Some("the fixed part")),
        ("h-load:init", Some("the input of load:init")),
        ("h-ping_0700", Some("the input of ping_0700")),
        ("h-ping_0800", Some("the input of ping_0800")),
        ("h-other", None),
    ] {
        assert_eq!(rig.store.prompt(hash).await.unwrap().as_deref(), text, "{hash}");
    }
    let day = rig.store.client_day_spend("", "2026-03-02").await.unwrap();
    assert_eq!((day.spend.input_tokens, day.spend.calls), (600, 3));
}

/// Decides by the SOP as if a client's day budget were spent: the first decision
/// says it is the first (the one that raises the OpsAlert), the later ones not.
struct Capped(AtomicU32);

#[async_trait]
impl Decider for Capped {
    fn name(&self) -> String {
        "llm:m".into()
    }
    async fn decide(&self, l: &LoadId, s: &LoadState, e: &InboundEvent, now: Timestamp) -> anyhow::Result<Decision> {
        let mut d = sop().decide(l, s, e, now).await?;
        d.budget = Some(haul_core::spend::BudgetExceeded {
            scope: haul_core::spend::Scope::ClientDay,
            client: Some("acme".into()),
            unit: haul_core::spend::Unit::Tokens,
            limit: 1000,
            spent: 1200,
            first: self.0.fetch_add(1, Ordering::SeqCst) == 0,
        });
        Ok(d)
    }
}

/// The first committed decision past a budget raises the OpsAlert in the log, once.
#[tokio::test]
async fn the_first_decision_past_a_budget_raises_the_ops_alert_once() {
    let rig = Rig::new().await;
    let worker =
        Arc::new(rig.worker_with(Arc::new(Capped(AtomicU32::new(0))), WorkerSettings::default(), Faults::default()));
    rig.publish("L1", init()).await;
    let (_, first) = logs_of(worker.run_once()).await;
    assert!(
        first.contains("OpsAlert: client acme's LLM budget for the day is spent: 1200 of 1000 tokens")
            && first.contains("alert=\"llm_budget\""),
        "{first}"
    );
    rig.publish("L1", ping("ping_0700")).await;
    let (_, second) = logs_of(worker.run_once()).await;
    assert!(!second.contains("OpsAlert"), "{second}");
}

#[tokio::test]
async fn an_operator_decision_that_does_not_validate_gives_the_fallback() {
    let rig = Rig::new().await;
    rig.services.answer(Channel::Sms, Answer::Permanent);
    rig.asked("L1").await;
    rig.dispatcher(QueueMode::Separate, Faults::default()).run_once().await.unwrap();
    rig.settle(&rig.worker()).await;
    let sms = rig.row("L1", "send_sms").await;
    assert_eq!(sms.status, OutboxStatus::Dead);
    // A requeue posted to the ingestion route carries its own copy of the action: a
    // blank text is copied as it is, and the operator's decision is checked as a
    // decider's would be.
    let mut action = sms.action.clone();
    action["params"]["body"] = json!(" ");
    let requeue = json!({"event_id": "op:r1", "kind": "operator_action", "actor": "ana", "reason": "again",
        "command": {"type": "requeue", "outbox_id": sms.id, "action": action}});
    rig.publish("L1", requeue).await;
    let outcomes = rig.settle(&rig.worker()).await;
    let fallback = RunOutcome::Committed { decider: "fallback".into(), filtered: false, actions: 1 };
    assert_eq!(outcomes, vec![fallback]);
    let log = rig.log("L1").await;
    let haul_core::log::Entry::Decision(d) = &log.last().unwrap().entry else { panic!("a decision last") };
    assert!(d.rationale.contains("the operator decision did not validate: send_sms body is empty"), "{}", d.rationale);
}

/// The dispatcher is woken by a commit that wrote outbox rows: not by one with no
/// action, nor by one whose only action its own append carried out (the answer's
/// cancel_timer).
#[tokio::test]
async fn a_commit_with_outbox_rows_wakes_the_dispatcher_and_one_without_does_not() {
    let rig = Rig::new().await;
    let worker = rig.worker();
    let wake = Arc::new(tokio::sync::Notify::new());
    worker.wake_on_commit(wake.clone());
    rig.publish("L1", init()).await;
    rig.settle(&worker).await;
    assert!(!woken(&wake).await, "no rows, no wake-up");
    rig.publish("L1", ping("ping_0700")).await;
    rig.settle(&worker).await;
    assert!(woken(&wake).await, "the SMS's row");
    rig.publish("L1", json!({"event_id": "sms_1", "kind": "inbound_sms", "from": DRIVER, "body": "ETA 8:10"})).await;
    assert_eq!(rig.settle(&worker).await, vec![committed(1)], "the answer cancels the timer");
    assert_eq!(rig.rows("L1").await.len(), 1, "and writes no row");
    assert!(!woken(&wake).await, "a timer canceled in the append wakes no dispatcher");
}

#[tokio::test]
async fn a_worker_waits_after_a_short_receive_only_on_a_stores_own_queue() {
    let rig = Rig::new().await;
    assert!(rig.worker_on_the_stores_queue().short_receive_drains(), "the store's queue table");
    assert!(!rig.worker().short_receive_drains(), "a queue of its own (as SQS) may answer short with more waiting");
}

#[tokio::test]
async fn rows_claimed_with_their_append_are_handed_over_and_sent_without_a_claim() {
    let rig = Rig::new().await;
    let worker = rig.worker();
    let dispatcher = rig.dispatcher(QueueMode::StoreQueue, Faults::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    worker.wake_on_commit(wake.clone());
    worker.hand_claims_to(dispatcher.handoff());
    let mut handed = dispatcher.take_handed().expect("the handoff's receiver");
    rig.publish("L1", init()).await;
    rig.settle(&worker).await;
    rig.publish("L1", ping("ping_0700")).await;
    rig.settle(&worker).await;
    assert!(!woken(&wake).await, "handed over: no claim to wake");
    let claim = handed.try_recv().expect("the SMS's row, handed over");
    assert!(handed.try_recv().is_err(), "one row, handed once");
    assert_eq!(rig.rows("L1").await, vec![claim.row.clone()], "the row handed over is the row stored");
    assert_eq!(dispatcher.run_once().await.unwrap(), vec![], "claimed with the append: no claim takes it");
    // Sent as a claim's rows are: admitted, then dispatched on the handed token.
    let (admitted, _) = dispatcher.take_handed_over(vec![claim]).await.unwrap().unwrap();
    let [claim] = <[_; 1]>::try_from(admitted.claims).unwrap();
    assert_eq!(dispatcher.dispatch(claim).await, Dispatched::Delivered);
    assert_eq!(rig.services.calls(Channel::Sms), ["L1/ask:eta_request:ping_0700/1/send_sms"]);
    assert_eq!(rig.depth().await, 1, "its outcome published");
    // No dispatcher's loop left to take them: the rows are written unclaimed, and the
    // commit wakes the dispatcher for a claim.
    drop(handed);
    rig.settle(&worker).await;
    rig.publish("L2", init()).await;
    rig.publish("L2", ping("ping_0800")).await;
    rig.settle(&worker).await;
    rig.settle(&worker).await;
    assert!(woken(&wake).await, "written unclaimed: the dispatcher is woken");
    let claimed = dispatcher.run_once().await.unwrap();
    assert_eq!(claimed, vec![Dispatched::Delivered], "and a claim takes the row");
}

/// A message published to an idle load goes to this process's worker received: no
/// receive takes it, and the publisher need wake nobody. One published behind a message
/// in flight, or with no worker loop left to take it, waits for a receive.
#[tokio::test]
async fn a_message_published_to_an_idle_load_is_handed_to_the_worker_received() {
    let rig = Rig::new().await;
    let worker = rig.worker_on_the_stores_queue();
    let events = EventQueue::new(rig.sqlite.clone()).handing_to(worker.event_handoff());
    let mut handed = worker.take_handed_events().expect("the handoff's receiver");
    let event = |l: &str, v| InboundEvent::from_json(load(l), v).unwrap();
    let published = events.publish_handing(&event("L1", init()), None, rig.now()).await.unwrap();
    assert_eq!(published, (Published::New, true));
    let m = handed.try_recv().expect("handed over");
    assert_eq!((m.event_id.as_str(), m.receive_count), ("load:init", 1));
    assert!(worker.receive(10).await.unwrap().is_empty(), "in flight: no receive takes it");
    let behind = events.publish_handing(&event("L1", ping("ping_0700")), None, rig.now()).await.unwrap();
    assert_eq!(behind, (Published::New, false), "behind a message in flight: not received");
    assert!(handed.try_recv().is_err());
    assert!(matches!(worker.process(m).await, RunOutcome::Committed { .. }));
    let next = worker.receive(10).await.unwrap();
    assert_eq!(next.iter().map(|m| m.event_id.as_str()).collect::<Vec<_>>(), ["ping_0700"], "then received");
    // No worker loop left to take them: published the usual way, for a receive.
    drop(handed);
    let alone = events.publish_handing(&event("L2", init()), None, rig.now()).await.unwrap();
    assert_eq!(alone, (Published::New, false));
    assert_eq!(worker.receive(10).await.unwrap().len(), 1);
    // As many wait as the worker runs at once: with no room left, published the usual way.
    let clock: Arc<dyn haul_core::Clock> = rig.clock.clone();
    let settings = WorkerSettings { concurrency: 1, ..WorkerSettings::default() };
    let (mode, faults) = (QueueMode::StoreQueue, Faults::default());
    let one = Worker::new(rig.store.clone(), rig.sqlite.clone(), mode, sop(), clock, settings, faults);
    let events = EventQueue::new(rig.sqlite.clone()).handing_to(one.event_handoff());
    assert_eq!(events.publish_handing(&event("L4", init()), None, rig.now()).await.unwrap(), (Published::New, true));
    assert_eq!(events.publish_handing(&event("L5", init()), None, rig.now()).await.unwrap(), (Published::New, false));
    // A queue that cannot receive on publish (here a wrapper of the store) hands nothing.
    let other = rig.worker();
    let wrapped = rig.events().handing_to(other.event_handoff());
    assert_eq!(wrapped.publish_handing(&event("L3", init()), None, rig.now()).await.unwrap(), (Published::New, false));
}

/// The worker loop runs what is handed over without a wake-up or a receive: the message
/// is leased to it (the fake clock never lets the lease lapse), so only the handoff can
/// bring it. Stopped, the loop leaves nothing leased behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_loop_runs_messages_handed_over_without_a_wake_up() {
    let rig = Rig::new().await;
    let worker = rig.worker_on_the_stores_queue();
    let events = EventQueue::new(rig.sqlite.clone()).handing_to(worker.event_handoff());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let never = Arc::new(tokio::sync::Notify::new());
    let looping = tokio::spawn(haul_runtime::loops::worker_loop(worker.clone(), 4, never, stopped));
    for l in ["L1", "L2", "L3"] {
        let event = InboundEvent::from_json(load(l), init()).unwrap();
        assert_eq!(events.publish_handing(&event, None, rig.now()).await.unwrap(), (Published::New, true));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for l in ["L1", "L2", "L3"] {
        while rig.log(l).await.len() < 2 {
            assert!(std::time::Instant::now() < deadline, "{l}'s message handed over was never run");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(rig.depth().await, 0, "each acked with its append");
    worker.stop();
    stop.send(true).unwrap();
    let late = InboundEvent::from_json(load("L4"), init()).unwrap();
    events.publish_handing(&late, None, rig.now()).await.unwrap();
    looping.await.unwrap();
    let left = worker.receive(10).await.unwrap();
    assert_eq!(left.len(), 1, "a message handed over as the loop stopped is given back, not left leased");
}

#[tokio::test]
async fn each_decision_the_decider_made_is_offered_to_the_shadow() {
    let rig = Rig::new().await;
    let worker = rig.worker();
    let clock: Arc<dyn haul_core::Clock> = rig.clock.clone();
    let settings = ShadowSettings { capacity: 8, timeout: Duration::from_secs(5) };
    let shadow = Arc::new(Shadow::start(sop(), Default::default(), rig.store.clone(), clock, settings));
    worker.shadow_with(shadow.clone());
    rig.publish("L1", init()).await;
    rig.publish("L1", ping("ping_0700")).await;
    rig.settle(&worker).await;
    assert_eq!(shadow.counts(), (2, 0));
}

#[tokio::test]
async fn a_message_that_is_not_an_event_is_dropped_and_logged() {
    let rig = Rig::new().await;
    use haul_store::LoadQueue;
    rig.queue.publish(&load("L1"), "e1", "not json", rig.now()).await.unwrap();
    let (outcomes, logs) = logs_of(rig.worker().run_once()).await;
    assert!(matches!(outcomes.unwrap()[..], [RunOutcome::Poison(_)]));
    assert_eq!(rig.depth().await, 0, "acked: it would never be an event");
    assert!(logs.contains("ERROR") && logs.contains("run dropped a message that is not an event"), "{logs}");
}

#[tokio::test]
async fn each_run_logs_one_line_at_the_level_its_end_calls_for() {
    let rig = Rig::new().await;
    rig.publish("L1", init()).await;
    let (_, logs) = logs_of(rig.worker().run_once()).await;
    assert!(logs.contains(" INFO") && logs.contains("outcome=\"committed\"") && logs.contains("actions=0"), "{logs}");
    let stopped = rig.worker();
    stopped.stop();
    rig.publish("L1", ping("ping_0700")).await;
    let (_, logs) = logs_of(stopped.run_once()).await;
    assert!(logs.contains(" WARN") && logs.contains("run left for redelivery"), "{logs}");
    let crashing = rig.worker_with(sop(), WorkerSettings::default(), Faults::new(|p, _| p == FaultPoint::AfterDecide));
    rig.clock.advance(Duration::from_secs(400));
    let (outcomes, logs) = logs_of(crashing.run_once()).await;
    assert!(matches!(outcomes.unwrap()[..], [RunOutcome::Crashed(_)]));
    assert!(logs.contains("run crashed at a fault point"), "{logs}");
}

// ---------------------------------------------------------------------------------
// The dispatcher.

#[tokio::test]
async fn delivered_rows_are_marked_their_outcomes_published_and_the_worker_woken() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let dispatcher = rig.dispatcher(QueueMode::StoreQueue, Faults::default());
    let wake = Arc::new(tokio::sync::Notify::new());
    dispatcher.wake_on_publish(wake.clone());
    let (out, logs) = logs_of(dispatcher.run_once()).await;
    assert_eq!(out.unwrap(), vec![Dispatched::Delivered, Dispatched::Delivered]);
    assert!(woken(&wake).await);
    assert_eq!(rig.services.calls(Channel::Sms), ["L1/ask:eta_request:ping_0700/1/send_sms"]);
    for r in rig.rows("L1").await {
        assert_eq!((r.status, r.attempts), (OutboxStatus::Dispatched, 0), "{}", r.id);
    }
    assert!(
        rig.store
            .get_timer(&haul_core::ids::TimerId::parse("tmr:L1:ask:eta_request:ping_0700:1").unwrap())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(rig.depth().await, 2, "one action_outcome per row");
    assert!(logs.contains("outcome=\"delivered\"") && logs.contains("attempt=1"), "{logs}");
    assert_eq!(dispatcher.run_once().await.unwrap(), vec![], "nothing left to claim");
}

#[tokio::test]
async fn sends_at_once_run_each_in_its_rows_span() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let settings = DispatcherSettings { sequential: false, ..Default::default() };
    let (out, logs) = logs_of(rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default()).run_once()).await;
    assert_eq!(out.unwrap().len(), 2);
    assert!(
        logs.contains("dispatch{outbox_id=L1/ask:eta_request:ping_0700/1/send_sms load_id=L1 attempts=0}"),
        "{logs}"
    );
}

#[tokio::test]
async fn a_retryable_failure_is_due_again_with_its_reason() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    rig.services.answer(Channel::Sms, Answer::Retryable);
    let out = rig.dispatcher(QueueMode::StoreQueue, Faults::default()).run_once().await.unwrap();
    let Dispatched::Retrying { retry_at } = out[0] else { panic!("{out:?}") };
    let sms = rig.row("L1", "send_sms").await;
    assert_eq!((sms.status, sms.attempts), (OutboxStatus::Pending, 1));
    // The store keeps milliseconds.
    assert_eq!(sms.due_at.to_string()[..23], retry_at.to_string()[..23]);
    assert!(retry_at > rig.now());
    assert!(sms.last_failure.unwrap().contains("HTTP 503"));
}

#[tokio::test]
async fn an_outcome_that_cannot_be_published_fails_the_attempt_and_says_so() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    rig.queue.set_down(true);
    let out = rig.dispatcher(QueueMode::Separate, Faults::default()).run_once().await.unwrap();
    assert!(matches!(out[0], Dispatched::Retrying { .. }), "{out:?}");
    let sms = rig.row("L1", "send_sms").await;
    let failure = sms.last_failure.unwrap();
    assert!(failure.contains("publishing the outcome failed: ") && failure.contains("the queue is down"), "{failure}");
}

/// The hero task of rule 6 for a dead SMS, committed and not yet sent.
async fn dead_sms_then_hero_task(rig: &Rig) {
    rig.services.answer(Channel::Sms, Answer::Permanent);
    rig.asked("L1").await;
    let out = rig.dispatcher(QueueMode::Separate, Faults::default()).run_once().await.unwrap();
    assert_eq!(out, vec![Dispatched::Buried, Dispatched::Delivered]);
    rig.settle(&rig.worker()).await;
}

#[tokio::test]
async fn a_dead_hero_task_raises_an_ops_alert_and_a_refused_alert_is_kept_clipped() {
    let rig = Rig::new().await;
    dead_sms_then_hero_task(&rig).await;
    rig.services.answer(Channel::Hero, Answer::Permanent);
    rig.services.answer(Channel::Ops, Answer::Permanent);
    let out = rig.dispatcher(QueueMode::Separate, Faults::default()).run_once().await.unwrap();
    assert_eq!(out, vec![Dispatched::Buried]);
    let hero = rig.row("L1", "create_hero_task").await;
    assert_eq!(rig.services.calls(Channel::Ops).len(), 1);
    let alerts = rig.store.ops_alerts(&RowCursor::start(), 10).await.unwrap();
    assert_eq!((alerts.len(), &alerts[0].outbox_id, alerts[0].state), (1, &hero.id, AlertState::Refused));
    let error = alerts[0].last_error.clone().unwrap();
    assert!(error.starts_with("permanent: HTTP 422: no such number"), "{error}");
    assert_eq!(error.chars().count(), 1000, "kept to its first 1000 characters");
}

#[tokio::test]
async fn a_burial_the_queue_missed_is_settled_by_the_sweep_alert_included() {
    let rig = Rig::new().await;
    dead_sms_then_hero_task(&rig).await;
    rig.services.answer(Channel::Hero, Answer::Permanent);
    let dispatcher = rig.dispatcher(QueueMode::Separate, Faults::default());
    rig.queue.set_down(true);
    let (out, logs) = logs_of(dispatcher.run_once()).await;
    assert_eq!(out.unwrap(), vec![Dispatched::Buried]);
    assert_eq!(rig.row("L1", "create_hero_task").await.status, OutboxStatus::Dead);
    assert!(rig.services.calls(Channel::Ops).is_empty(), "the alert waits for the outcome's publish");
    let before = rig.depth().await;
    assert!(logs.contains("publishing the failed outcome failed; the sweep will retry it"), "{logs}");
    rig.queue.set_down(false);
    rig.clock.advance(Duration::from_secs(60));
    assert_eq!(dispatcher.run_once().await.unwrap(), vec![Dispatched::Buried], "the sweep settled it");
    assert_eq!(rig.depth().await, before + 1, "its failed outcome published");
    assert_eq!(rig.services.calls(Channel::Ops).len(), 1);
    assert_eq!(dispatcher.sweep_dead().await.unwrap(), vec![], "settled once");
}

#[tokio::test]
async fn a_claim_another_dispatcher_took_over_changes_nothing() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let dispatcher = rig.dispatcher(QueueMode::StoreQueue, Faults::default());
    assert_eq!(
        rig.dispatcher_with(
            QueueMode::StoreQueue,
            DispatcherSettings { batch: 3, ..Default::default() },
            Faults::default()
        )
        .settings()
        .batch,
        3
    );
    let mut old = dispatcher.claim(1, None).await.unwrap().unwrap().claims;
    assert_eq!(old.len(), 1);
    rig.clock.advance(dispatcher.settings().lease + Duration::from_secs(1));
    let new = dispatcher.claim(1, None).await.unwrap().unwrap().claims;
    assert_eq!(new[0].row.id, old[0].row.id, "the lapsed lease is claimed again");
    let (out, logs) = logs_of(dispatcher.dispatch(old.remove(0))).await;
    assert_eq!(out, Dispatched::Stale);
    assert!(logs.contains("another dispatcher owns the row"), "{logs}");
    assert!(rig.services.calls(Channel::Sms).is_empty());
}

#[tokio::test]
async fn a_crash_after_the_publish_leaves_the_row_claimed_and_its_outcome_queued() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let faults = Faults::new(|p, _| p == FaultPoint::AfterPublish);
    let out = rig.dispatcher(QueueMode::Separate, faults).run_once().await.unwrap();
    assert!(matches!(out[..], [Dispatched::Crashed(_), Dispatched::Crashed(_)]), "{out:?}");
    for r in rig.rows("L1").await {
        assert_eq!(r.status, OutboxStatus::Pending, "{}", r.id);
    }
    assert_eq!(rig.depth().await, 2);
}

#[tokio::test]
async fn the_planted_bug_marks_before_it_publishes_and_a_crash_between_loses_the_outcome() {
    for (bug, outcomes) in [(false, 2), (true, 0)] {
        let rig = Rig::new().await;
        rig.asked("L1").await;
        let bugs = PlantedBugs { mark_before_publish: bug, ..Default::default() };
        let faults = Faults::new(|p, _| p == FaultPoint::AfterMark).with_bugs(bugs);
        let (out, logs) = logs_of(rig.dispatcher(QueueMode::Separate, faults).run_once()).await;
        assert!(matches!(out.unwrap()[0], Dispatched::Crashed(_)));
        assert!(logs.contains("dispatch crashed at a fault point"), "{logs}");
        assert_eq!(rig.row("L1", "send_sms").await.status, OutboxStatus::Dispatched);
        assert_eq!(rig.depth().await, outcomes, "bug {bug}");
    }
}

#[tokio::test]
async fn a_retry_the_store_cannot_record_is_left_to_the_lease() {
    let rig = Rig::on_file("retry-refused").await;
    rig.asked("L1").await;
    rig.services.answer(Channel::Sms, Answer::Retryable);
    rig.refuse("attempts", "NEW.status = 'pending'");
    let (out, logs) = logs_of(rig.dispatcher(QueueMode::StoreQueue, Faults::default()).run_once()).await;
    let out = out.unwrap();
    let Dispatched::Unsettled(why) = &out[0] else { panic!("{out:?}") };
    assert!(why.starts_with("mark_failed failed: ") && why.contains("the store refused the write"), "{why}");
    assert!(logs.contains(" WARN") && logs.contains("dispatch left for the lease to lapse"), "{logs}");
    let sms = rig.row("L1", "send_sms").await;
    assert_eq!((sms.status, sms.attempts), (OutboxStatus::Pending, 0), "nothing recorded: the lease lapses");
}

#[tokio::test]
async fn a_burial_whose_settling_the_store_cannot_record_is_left_to_the_sweep() {
    let rig = Rig::on_file("settle-refused").await;
    rig.services.answer(Channel::Sms, Answer::Permanent);
    rig.asked("L1").await;
    rig.refuse("outcome_published_at", "1");
    let (out, logs) = logs_of(rig.dispatcher(QueueMode::Separate, Faults::default()).run_once()).await;
    assert_eq!(out.unwrap()[0], Dispatched::Buried);
    assert!(logs.contains("recording the settled burial failed; the sweep repeats it"), "{logs}");
    let dead = rig.store.dead_without_outcome(10).await.unwrap();
    assert_eq!(dead.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["L1/ask:eta_request:ping_0700/1/send_sms"]);
}

/// The simulator's planted liveness bugs live here: a retried row given up, a
/// follow-up timer never fired (`haul sim` catches both at seed 1).
#[tokio::test]
async fn the_planted_never_reclaim_gives_up_a_retried_row_and_sends_a_new_one() {
    for (bug, sends) in [(false, 2), (true, 1)] {
        let rig = Rig::new().await;
        rig.asked("L1").await;
        rig.services.answer(Channel::Sms, Answer::Retryable);
        let faults = Faults::default().with_bugs(PlantedBugs { never_reclaim: bug, ..Default::default() });
        let dispatcher = rig.dispatcher(QueueMode::StoreQueue, faults);
        let first = dispatcher.run_once().await.unwrap();
        assert!(matches!(first[..], [Dispatched::Retrying { .. }, Dispatched::Delivered]), "{first:?}");
        rig.services.answer(Channel::Sms, Answer::Delivered);
        rig.clock.advance(Duration::from_secs(120));
        let again = dispatcher.run_once().await.unwrap();
        assert_eq!(matches!(again[..], [Dispatched::Unsettled(_)]), bug, "bug {bug}: {again:?}");
        assert_eq!(rig.services.calls(Channel::Sms).len(), sends, "bug {bug}");
    }
}

#[tokio::test]
async fn the_planted_timer_never_pumped_fires_first_steps_only() {
    for (bug, fired) in [(false, 2), (true, 1)] {
        let rig = Rig::new().await;
        let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
        for step in [1, 2] {
            let timer = haul_core::ids::TimerId::new(&load("L1"), &ask, step);
            rig.store.schedule(&timer, rig.now(), rig.now()).await.unwrap();
        }
        let faults = Faults::default().with_bugs(PlantedBugs { timer_never_pumped: bug, ..Default::default() });
        let clock: Arc<dyn haul_core::Clock> = rig.clock.clone();
        let pump = haul_runtime::pump::TimerPump::new(rig.store.clone(), rig.queue.clone(), clock, faults, 8);
        assert_eq!(pump.run_once().await.unwrap().fired, fired, "bug {bug}");
    }
}

#[test]
fn settings_come_from_the_config() {
    let config =
        haul_config::DispatcherConfig { batch: 3, in_flight: 5, lease: Duration::from_secs(42), ..Default::default() };
    let s = DispatcherSettings::from_config(&config);
    assert_eq!(
        (s.batch, s.in_flight, s.lease, s.sequential, s.jitter_seed),
        (3, 5, Duration::from_secs(42), false, None)
    );
    assert!(Channel::ALL.iter().all(|c| s.limits.get(*c).is_none()), "no limit unless set");
    let mut channels = haul_config::ChannelsConfig::default();
    channels.sms.rate = Some("12/min".into());
    channels.sms.burst = Some(4);
    channels.hero.in_flight = Some(7);
    let s = s.with_limits(&channels);
    assert_eq!(s.limits.get(Channel::Sms).map(|l| (l.rate.to_string(), l.burst)), Some(("12/min".into(), 4)));
    assert!(s.limits.get(Channel::Hero).is_none());
    assert_eq!((*s.caps.get(Channel::Hero), *s.caps.get(Channel::Sms)), (Some(7), None));
    assert_eq!(s.batch, 3, "the rest kept");
}

// ---------------------------------------------------------------------------------
// Operator requests.

fn requester(id: &str) -> Requester {
    Requester { request_id: id.into(), actor: "ana".into(), reason: "driver called".into(), trace: None }
}

#[tokio::test]
async fn a_load_with_no_records_is_refused_and_nothing_is_published() {
    let rig = Rig::new().await;
    let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
    let e = operator::resolve_ask(&*rig.store, &rig.events(), &requester("r1"), &load("L9"), &ask, rig.now()).await;
    assert!(matches!(e, Err(OperatorError::NoSuchLoad(_))), "{e:?}");
    assert_eq!(rig.depth().await, 0);
}

#[tokio::test]
async fn a_request_is_queued_once_and_its_id_is_its_own() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
    let resolve = |id: &'static str, ask: AskId| {
        let (store, events, now) = (rig.store.clone(), rig.events(), rig.now());
        async move { operator::resolve_ask(&*store, &events, &requester(id), &load("L1"), &ask, now).await }
    };
    let first = resolve("r1", ask.clone()).await.unwrap();
    assert_eq!((first.status, first.is_new()), ("queued", true));
    assert_eq!(first.event_id.as_str(), "op:r1");
    let again = resolve("r1", ask.clone()).await.unwrap();
    assert_eq!((again.status, again.is_new()), ("duplicate", false));
    let other = AskId::parse("ask:eta_request:ping_0900").unwrap();
    let e = resolve("r1", other).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("request_id_reused", 422));
}

#[tokio::test]
async fn an_event_id_taken_on_the_queue_alone_is_a_duplicate_only_for_the_same_event() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
    // The same event posted to the ingestion route first: the queue has it, the
    // store's request table does not.
    let posted = json!({"event_id": "op:r2", "kind": "operator_action", "actor": "ana", "reason": "driver called",
        "command": {"type": "resolve_ask", "ask_id": ask.to_string()}});
    rig.publish("L1", posted).await;
    let same = operator::resolve_ask(&*rig.store, &rig.events(), &requester("r2"), &load("L1"), &ask, rig.now()).await;
    assert_eq!(same.unwrap().status, "duplicate");
    let other = AskId::parse("ask:eta_request:ping_0900").unwrap();
    let e = operator::resolve_ask(&*rig.store, &rig.events(), &requester("r3"), &load("L1"), &other, rig.now()).await;
    assert_eq!(e.unwrap().status, "queued");
    rig.publish(
        "L1",
        json!({"event_id": "op:r4", "kind": "operator_action", "actor": "ana", "reason": "x",
            "command": {"type": "resolve_ask", "ask_id": ask.to_string()}}),
    )
    .await;
    let e = operator::resolve_ask(&*rig.store, &rig.events(), &requester("r4"), &load("L1"), &ask, rig.now()).await;
    assert_eq!(e.unwrap_err().code(), "request_id_reused");
}

#[tokio::test]
async fn a_retry_on_a_queue_that_forgot_the_event_is_still_a_duplicate() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
    let who = requester("r1");
    operator::resolve_ask(&*rig.store, &rig.events(), &who, &load("L1"), &ask, rig.now()).await.unwrap();
    // The store remembers the request; this queue (as SQS past its dedup window) does not.
    let forgetful = Rig::new().await;
    let again = operator::resolve_ask(&*rig.store, &forgetful.events(), &who, &load("L1"), &ask, rig.now()).await;
    assert_eq!(again.unwrap().status, "duplicate");
}

#[tokio::test]
async fn only_a_dead_row_is_requeued() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let sms = rig.row("L1", "send_sms").await;
    let e = operator::requeue(&*rig.store, &rig.events(), &requester("r1"), &sms.id, rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("not_dead", 409));
    let e = operator::requeue(&*rig.store, &rig.events(), &requester("r1"), "L1/nope", rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("no_such_row", 404));
    // Nor is any other dismissed from the inbox.
    let e = operator::dismiss(&*rig.store, &rig.events(), &requester("r1"), &sms.id, rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("not_dead", 409));
    let e = operator::dismiss(&*rig.store, &rig.events(), &requester("r1"), "L1/nope", rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("no_such_row", 404));
}

#[tokio::test]
async fn an_sms_id_out_of_form_is_refused() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let e = operator::assign_sms(&*rig.store, &rig.events(), &requester("r1"), "SM 1", &load("L1"), rig.now()).await;
    let e = e.unwrap_err();
    assert_eq!((e.code(), e.status()), ("bad_message_sid", 400));
    let e = operator::assign_sms(&*rig.store, &rig.events(), &requester("r1"), "SM1", &load("L1"), rig.now()).await;
    assert_eq!(e.unwrap_err().code(), "no_such_sms");
    // A dismissal too: the id's form first, then whether the list holds it.
    let e = operator::dismiss_sms(&*rig.store, &requester("r1"), "SM 1", rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("bad_message_sid", 400));
    let e = operator::dismiss_sms(&*rig.store, &requester("r1"), "SM1", rig.now()).await.unwrap_err();
    assert_eq!((e.code(), e.status()), ("no_such_sms", 404));
    let sms = haul_store::UnmatchedSms {
        message_sid: "SM1".into(),
        from: "+15555550199".into(),
        to: "+15555550000".into(),
        body: "who is this".into(),
        received_at: rig.now(),
        reason: "no single active load has this driver phone".into(),
    };
    rig.store.record_unmatched_sms(&sms).await.unwrap();
    let no_reason = Requester { reason: " ".into(), ..requester("r2") };
    let e = operator::dismiss_sms(&*rig.store, &no_reason, "SM1", rig.now()).await.unwrap_err();
    assert_eq!(e.code(), "bad_payload");
    let first = operator::dismiss_sms(&*rig.store, &requester("r3"), "SM1", rig.now()).await.unwrap();
    let again = operator::dismiss_sms(&*rig.store, &requester("r4"), "SM1", rig.now()).await.unwrap();
    assert_eq!((first.status, again.status, again.by.as_str()), ("dismissed", "already_dismissed", first.by.as_str()));
    let e = operator::assign_sms(&*rig.store, &rig.events(), &requester("r5"), "SM1", &load("L1"), rig.now()).await;
    assert_eq!(e.unwrap_err().code(), "sms_dismissed");
}

/// An SMS an operator assigned to the wrong load, moved to the right one: both loads
/// asked their driver; the right one's ask is answered by it, and the wrong one's ask
/// (answered by it before) goes to a person with an urgent Hero task.
#[tokio::test]
async fn a_moved_sms_answers_the_right_load_and_hands_the_wrong_ones_ask_to_a_person() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    rig.asked("L2").await;
    let sms = haul_store::UnmatchedSms {
        message_sid: "SM7".into(),
        from: DRIVER.into(),
        to: "+15555550000".into(),
        body: "ETA 10:30".into(),
        received_at: rig.now(),
        reason: "2 active loads have this driver phone".into(),
    };
    rig.store.record_unmatched_sms(&sms).await.unwrap();
    let ask = |id: &str| AskId::parse(id).unwrap();
    let status = |state: &LoadState| -> &'static str { state.asks[&ask("ask:eta_request:ping_0700")].status.as_str() };
    let state = |l: &'static str| {
        let rig = &rig;
        async move { haul_core::projection::project(&rig.log(l).await) }
    };
    operator::assign_sms(&*rig.store, &rig.events(), &requester("a1"), "SM7", &load("L1"), rig.now()).await.unwrap();
    rig.settle(&rig.worker()).await;
    assert_eq!(status(&state("L1").await), "answered");

    let (events, who, to) = (rig.events(), requester("m1"), load("L2"));
    let moved = operator::reassign_sms(&*rig.store, &events, &who, "SM7", &to, rig.now()).await.unwrap();
    assert_eq!((moved.from.load_id.as_str(), moved.to.load_id.as_str()), ("L1", "L2"));
    assert_eq!((moved.from.status, moved.to.status), ("queued", "queued"));
    rig.settle(&rig.worker()).await;
    let (l1, l2) = (state("L1").await, state("L2").await);
    assert_eq!((status(&l1), status(&l2)), ("escalated", "answered"));
    assert!(!l1.has_sms("SM7") && l2.has_sms("SM7"));
    let hero = rig.row("L1", "create_hero_task").await;
    assert_eq!(hero.id, "L1/ask:eta_request:ping_0700/2/create_hero_task");
    assert_eq!(hero.action["params"]["urgency"], "urgent", "{}", hero.action);
    // The retry publishes nothing new and decides nothing twice.
    let again = operator::reassign_sms(&*rig.store, &events, &who, "SM7", &to, rig.now()).await.unwrap();
    assert_eq!((again.from.status, again.to.status), ("duplicate", "duplicate"));
    rig.settle(&rig.worker()).await;
    assert_eq!(rig.rows("L1").await.iter().filter(|r| r.action_type == ActionType::CreateHeroTask).count(), 1);
    assert_eq!(state("L1").await.version, l1.version);
}

/// An SMS rate of 2/s (burst 2): five loads ask at once; two SMS go, three are held
/// back with no attempt spent and go out at the rate, one every half second, each
/// once. The Hero channel, with no limit, is not held by it.
#[tokio::test]
async fn a_send_rate_holds_rows_back_without_spending_attempts() {
    let rig = Rig::new().await;
    let loads = ["L1", "L2", "L3", "L4", "L5"];
    for l in loads {
        rig.asked(l).await;
    }
    let settings = rated(Channel::Sms, "2/s", 2);
    let d = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    let sent_by = |at_ms: u64| {
        let rig = &rig;
        let d = d.clone();
        async move {
            rig.clock.set(add(t0(), Duration::from_millis(at_ms)));
            d.run_once().await.unwrap();
            rig.services.calls(Channel::Sms).len()
        }
    };
    assert_eq!(sent_by(0).await, 2, "the burst");
    let held: Vec<_> = rig_rows(&rig, &loads).await.into_iter().filter(|r| r.status == OutboxStatus::Pending).collect();
    assert_eq!(held.len(), 3);
    for r in &held {
        assert_eq!((r.attempts, r.first_attempt_at, r.claim_token.as_deref()), (0, None, None), "{}", r.id);
    }
    let mut due: Vec<_> = held.iter().map(|r| r.due_at).collect();
    due.sort();
    let ms = |m: u64| add(t0(), Duration::from_millis(m));
    assert_eq!(due, vec![ms(500), ms(1_000), ms(1_500)]);
    assert_eq!(sent_by(499).await, 2, "nothing before the rate allows");
    assert_eq!(sent_by(500).await, 3);
    assert_eq!(sent_by(1_000).await, 4);
    assert_eq!(sent_by(1_500).await, 5);
    assert_eq!(sent_by(60_000).await, 5, "each once");
    let calls = rig.services.calls(Channel::Sms);
    assert_eq!(calls.iter().collect::<std::collections::BTreeSet<_>>().len(), 5, "{calls:?}");
    assert!(rig_rows(&rig, &loads).await.iter().all(|r| r.status == OutboxStatus::Dispatched && r.attempts == 0));
}

/// When the Hero channel's rate binds, an urgent Hero task goes before a normal one
/// claimed ahead of it.
#[tokio::test]
async fn an_urgent_hero_task_goes_first_when_the_rate_binds() {
    let rig = Rig::new().await;
    for (l, urgency) in [("L1", "normal"), ("L2", "urgent"), ("L3", "normal")] {
        let key = format!("{l}/e1/create_hero_task");
        let action = json!({"key": key, "type": "create_hero_task",
            "params": {"title": "t", "body": "b", "urgency": urgency}});
        let row = haul_store::NewOutboxRow { id: key, action_type: ActionType::CreateHeroTask, action, trace: None };
        let entries = vec![NewEntry::stored("e1", "location_ping", json!({}))];
        rig.store.append(&load(l), entries, 0, vec![row], rig.now()).await.unwrap();
    }
    let settings = rated(Channel::Hero, "1/min", 1);
    rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default()).run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Hero), vec!["L2/e1/create_hero_task"]);
}

/// An operator's rate change is in force at a running dispatcher within a second,
/// and sends at the new rate; a change with no rate puts the settings' back.
#[tokio::test]
async fn a_rate_changed_while_it_runs_is_in_force_within_a_second() {
    use haul_runtime::rates::{self, RateRequest};
    let rig = Rig::new().await;
    let loads = ["L1", "L2", "L3", "L4"];
    for l in loads {
        rig.asked(l).await;
    }
    let limit =
        |r: &str, b: u32| Some(haul_core::limit::Limit::new(haul_core::limit::Rate::parse(r).unwrap(), b).unwrap());
    let limits = haul_core::PerChannel::from_fn(|c| if c == Channel::Sms { limit("1/min", 1) } else { None });
    let settings =
        DispatcherSettings { sequential: true, jitter_seed: Some(7), limits: limits.clone(), ..Default::default() };
    let d = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    let ms = |m: u64| add(t0(), Duration::from_millis(m));
    assert_eq!(*d.limits(ms(0)).await.get(Channel::Sms), limit("1/min", 1));
    d.run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Sms).len(), 1, "one a minute");
    let faster = RateRequest { channel: "sms".into(), rate: Some("10/s".into()), burst: Some(3) };
    let changed = rates::change_rate(&*rig.store, &limits, &requester("rate1"), &faster, ms(100)).await.unwrap();
    assert_eq!((changed.status, changed.previous, changed.effective), ("changed", limit("1/min", 1), limit("10/s", 3)));
    assert_eq!(changed.held_requeued, 3, "the rows held a minute apart are due again");
    assert_eq!(*d.limits(ms(999)).await.get(Channel::Sms), limit("1/min", 1), "read at most once a second");
    let (now_in_force, logs) = logs_of(d.limits(ms(1_000))).await;
    assert_eq!(*now_in_force.get(Channel::Sms), limit("10/s", 3), "in force within a second");
    assert!(logs.contains("send limit in force") && logs.contains("rate=\"10/s\""), "said once: {logs}");
    let (_, logs) = logs_of(d.limits(ms(2_000))).await;
    assert!(!logs.contains("send limit in force"), "read again, unchanged: nothing said: {logs}");
    // The held rows were due at the old rate (a minute apart): made due again by the
    // change, they go at the new one, three at once, without waiting out the old slots.
    rig.clock.set(ms(1_000));
    d.run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Sms).len(), 4, "the rest at once, within the new burst");
    let back = RateRequest { channel: "sms".into(), rate: None, burst: None };
    rates::change_rate(&*rig.store, &limits, &requester("rate2"), &back, ms(181_000)).await.unwrap();
    assert_eq!(*d.limits(ms(182_000)).await.get(Channel::Sms), limit("1/min", 1), "the settings' again");
}

/// A 429 with `Retry-After`: the rows are held back that long with no attempt spent,
/// their last failure saying so, and their channel with them: after the wait one goes,
/// not the burst. Past the row's 15 minutes a 429 is a failed attempt.
#[tokio::test]
async fn a_429_with_retry_after_holds_the_rows_and_their_channel_back() {
    let rig = Rig::new().await;
    let loads = ["L1", "L2"];
    for l in loads {
        rig.asked(l).await;
    }
    let settings = rated(Channel::Sms, "10/s", 5);
    let d = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    rig.services.answer(Channel::Sms, Answer::Throttled(5));
    let (out, logs) = logs_of(d.run_once()).await;
    let out = out.unwrap();
    assert!(logs.contains("over its rate (429); held back, no attempt spent"), "{logs}");
    let held = Dispatched::Held { until: add(t0(), Duration::from_secs(5)) };
    assert_eq!(out.iter().filter(|d| **d == held).count(), 2, "{out:?}");
    for r in rig_rows(&rig, &loads).await {
        let fields = (r.status, r.attempts, r.first_attempt_at, r.due_at, r.claim_token.as_deref());
        assert_eq!(fields, (OutboxStatus::Pending, 0, None, add(t0(), Duration::from_secs(5)), None), "{}", r.id);
        assert_eq!(r.last_failure.as_deref(), Some("throttled: HTTP 429 Too Many Requests"));
    }
    rig.services.answer(Channel::Sms, Answer::Delivered);
    let sent_at = |ms: u64| {
        let (rig, d) = (&rig, d.clone());
        async move {
            rig.clock.set(add(t0(), Duration::from_millis(ms)));
            d.run_once().await.unwrap();
            rig.services.calls(Channel::Sms).len()
        }
    };
    assert_eq!(sent_at(4_999).await, 2, "nothing before the wait ends");
    assert_eq!(sent_at(5_000).await, 3, "then one: the channel waited too, no burst");
    assert_eq!(sent_at(5_100).await, 4, "and the next an interval on");
    assert!(rig_rows(&rig, &loads).await.iter().all(|r| r.status == OutboxStatus::Dispatched && r.attempts == 0));
    // Made 20 minutes ago: a 429 now is a failed attempt.
    rig.asked("L3").await;
    rig.clock.set(add(t0(), Duration::from_secs(20 * 60)));
    rig.services.answer(Channel::Sms, Answer::Throttled(5));
    let out = d.run_once().await.unwrap();
    assert!(out.iter().any(|d| matches!(d, Dispatched::Retrying { .. })), "{out:?}");
    assert_eq!(rig.row("L3", "send_sms").await.attempts, 1);
}

/// An ask's SMS held back until its ask took its next step is settled unsent
/// (superseded), before it takes a send from its channel's rate; the next step's goes.
#[tokio::test]
async fn an_sms_held_past_its_asks_next_step_is_superseded_not_sent() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let step1 = rig.row("L1", "send_sms").await;
    // Held back by a rate once: due later than it was made.
    let c = rig.store.pending(10, rig.now(), Duration::from_secs(90)).await.unwrap();
    for c in &c {
        rig.store.hold(&c.row.id, &c.token, add(t0(), Duration::from_secs(60)), None, rig.now()).await.unwrap();
    }
    let ask = step1.action["ask_id"].as_str().unwrap().to_owned();
    let key = format!("L1/{ask}/2/send_sms");
    let action = json!({"key": key, "type": "send_sms", "ask_id": ask, "step": 2,
        "params": {"to": "+15555550100", "body": "ETA?"}});
    let row = haul_store::NewOutboxRow { id: key.clone(), action_type: ActionType::SendSms, action, trace: None };
    let version = rig.store.read(&load("L1")).await.unwrap().1;
    let entries = vec![NewEntry::stored("t2", "timer_fired", json!({}))];
    rig.store.append(&load("L1"), entries, version, vec![row], add(t0(), Duration::from_secs(30))).await.unwrap();
    let settings = rated(Channel::Sms, "1/min", 1);
    let d = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    rig.clock.set(add(t0(), Duration::from_secs(60)));
    d.run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Sms), vec![key.clone()], "the one send the rate allows goes to step 2");
    let r = rig.row("L1", "send_sms").await;
    assert_eq!((r.id.as_str(), r.status, r.attempts), (step1.id.as_str(), OutboxStatus::Superseded, 0));
    assert_eq!(r.last_failure, Some(format!("not sent: its ask moved on ({key})")));
    // A row claimed as it was made is not checked: step 2's own row went as it was.
    assert_eq!(rig.store.get(&key).await.unwrap().unwrap().status, OutboxStatus::Dispatched);
}

/// Fair shares of a saturated channel: five loads of client_a, two of client_b and one
/// of client_c ask at once at 1 SMS/s. Held, each client's rows queue behind its own
/// (client_a's 1 s to 4 s in, client_b's 1 s and 2 s, client_c's 1 s), not behind
/// another client's; where a second has rows of several, the client whose queue
/// reaches least far ahead goes, and each row it beat joins the end of its own
/// client's queue. client_c is done 1 s in and client_b 3 s in, not after client_a's.
#[tokio::test]
async fn a_small_clients_asks_are_not_kept_behind_a_big_ones() {
    let rig = Rig::new().await;
    for l in ["A1", "A2", "A3", "A4", "A5"] {
        rig.asked(l).await;
    }
    for (l, client) in [("B1", "client_b"), ("B2", "client_b"), ("C1", "client_c")] {
        rig.publish(
            l,
            json!({"event_id": "load:init", "kind": "load_update", "client": client,
            "driver_phone": "+15555550123", "stage": "in_transit"}),
        )
        .await;
        rig.publish(l, ping("ping_0700")).await;
    }
    let settings = WorkerSettings { timers: TimerRoute::Outbox, ..WorkerSettings::default() };
    rig.settle(&rig.worker_with(sop(), settings, Faults::default())).await;
    let d = rig.dispatcher_with(QueueMode::StoreQueue, rated(Channel::Sms, "1/s", 1), Faults::default());
    let mut sent = vec![];
    for second in 0..10u64 {
        rig.clock.set(add(t0(), Duration::from_secs(second)));
        d.run_once().await.unwrap();
        let calls = rig.services.calls(Channel::Sms);
        sent.extend(calls[sent.len()..].iter().map(|c| format!("{second}:{}", &c[..2])));
    }
    assert_eq!(sent, ["0:A1", "1:C1", "2:B2", "3:B1", "4:A5", "5:A2", "6:A3", "7:A4"]);
}

/// Urgent Hero tasks go before routine ones when the Hero channel's rate binds,
/// whichever client's queue is shorter.
#[tokio::test]
async fn an_urgent_hero_task_goes_first_on_a_saturated_channel() {
    let rig = Rig::new().await;
    let hero = |l: &str, client: &str, urgency: &str| {
        let key = format!("{l}/ask:eta_request:p/2/create_hero_task");
        let action = json!({"key": key, "type": "create_hero_task", "ask_id": "ask:eta_request:p", "step": 2,
            "params": {"title": "Driver not answering", "body": "Call the driver", "urgency": urgency}});
        let entries = vec![NewEntry::stored("u1", "load_update", json!({"client": client}))];
        (
            load(l),
            entries,
            haul_store::NewOutboxRow { id: key, action_type: ActionType::CreateHeroTask, action, trace: None },
        )
    };
    for (l, client, urgency) in [("A1", "client_a", "normal"), ("B1", "client_b", "urgent")] {
        let (l, entries, row) = hero(l, client, urgency);
        rig.store.append(&l, entries, 0, vec![row], rig.now()).await.unwrap();
    }
    let d = rig.dispatcher_with(QueueMode::StoreQueue, rated(Channel::Hero, "1/min", 1), Faults::default());
    d.run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Hero), vec!["B1/ask:eta_request:p/2/create_hero_task".to_owned()]);
}

/// An urgent Hero task goes before a routine one of the same client under the client's
/// own limit, and under the Hero channel's cap on sends in flight.
#[tokio::test]
async fn an_urgent_hero_task_goes_first_under_a_clients_limit_and_a_cap() {
    for (what, settings) in [
        ("a client's limit", {
            let config = haul_config::Config::from_toml("[clients.client_a.rates.hero]\nrate = \"1/min\"").unwrap();
            DispatcherSettings { sequential: true, jitter_seed: Some(7), ..Default::default() }
                .with_weights(&config.clients)
        }),
        ("a cap", {
            let caps = haul_core::PerChannel::from_fn(|c| (c == Channel::Hero).then_some(1));
            DispatcherSettings { sequential: true, jitter_seed: Some(7), caps, ..Default::default() }
        }),
    ] {
        let rig = Rig::new().await;
        for (l, urgency) in [("A1", "normal"), ("A2", "urgent")] {
            let key = format!("{l}/ask:eta_request:p/2/create_hero_task");
            let action = json!({"key": key, "type": "create_hero_task", "ask_id": "ask:eta_request:p", "step": 2,
                "params": {"title": "Driver not answering", "body": "Call the driver", "urgency": urgency}});
            let entries = vec![NewEntry::stored("u1", "load_update", json!({"client": "client_a"}))];
            let row =
                haul_store::NewOutboxRow { id: key, action_type: ActionType::CreateHeroTask, action, trace: None };
            rig.store.append(&load(l), entries, 0, vec![row], rig.now()).await.unwrap();
        }
        let c = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default()).claim(10, None).await.unwrap();
        let c = c.unwrap();
        let ids: Vec<&str> = c.claims.iter().map(|c| c.row.id.as_str()).collect();
        assert_eq!((ids, c.held), (vec!["A2/ask:eta_request:p/2/create_hero_task"], 1), "{what}");
    }
}

/// An SMS overtaken while it was held hands the send the rate allowed it to the step
/// that overtook it, which was held too: that step is due at once, and the slot it held
/// in its client's queue is given back, so the ask's next step is held no longer than
/// the rate needs.
#[tokio::test]
async fn an_overtaken_sms_hands_its_send_and_its_slot_to_the_step_that_overtook_it() {
    let rig = Rig::new().await;
    rig.asked("L0").await;
    rig.asked("L1").await;
    let d = rig.dispatcher_with(QueueMode::StoreQueue, rated(Channel::Sms, "1/min", 1), Faults::default());
    let at = |s: u64| add(t0(), Duration::from_secs(s));
    d.run_once().await.unwrap();
    let step1 = rig.row("L1", "send_sms").await;
    assert_eq!(step1.due_at, at(60), "held to client_a's first slot");
    let ask = step1.action["ask_id"].as_str().unwrap().to_owned();
    let step = |n: u32, t: u64| {
        let key = format!("L1/{ask}/{n}/send_sms");
        let action = json!({"key": key, "type": "send_sms", "ask_id": ask, "step": n,
            "params": {"to": "+15555550100", "body": "ETA?"}});
        (
            key.clone(),
            haul_store::NewOutboxRow { id: key, action_type: ActionType::SendSms, action, trace: None },
            at(t),
        )
    };
    let append = async |row: haul_store::NewOutboxRow, t| {
        let version = rig.store.read(&load("L1")).await.unwrap().1;
        let entries = vec![NewEntry::stored(format!("t{version}"), "timer_fired", json!({}))];
        rig.store.append(&load("L1"), entries, version, vec![row], t).await.unwrap();
    };
    let (step2, row, t) = step(2, 30);
    append(row, t).await;
    rig.clock.set(at(30));
    d.run_once().await.unwrap();
    assert_eq!(rig.store.get(&step2).await.unwrap().unwrap().due_at, at(120), "held behind step 1");
    rig.clock.set(at(60));
    let c = d.claim(10, None).await.unwrap().unwrap();
    assert_eq!((c.claims.len(), c.superseded, c.held, c.took()), (0, 1, 0, 1), "step 1 settled unsent");
    assert_eq!(rig.store.get(&step2).await.unwrap().unwrap().due_at, at(60), "step 2 takes its place");
    let out = d.run_once().await.unwrap();
    assert!(matches!(out[..], [Dispatched::Delivered]), "{out:?}");
    assert_eq!(rig.services.calls(Channel::Sms).last(), Some(&step2), "and its send");
    let (step3, row, t) = step(3, 90);
    append(row, t).await;
    rig.clock.set(at(90));
    d.run_once().await.unwrap();
    assert_eq!(rig.store.get(&step3).await.unwrap().unwrap().due_at, at(120), "step 2's slot was given back");
}

/// A claim whose rows a rate holds back took them all the same: it says so, so the
/// dispatcher's loop claims again at once instead of idling as if nothing were due.
#[tokio::test]
async fn a_claim_says_how_many_rows_it_held_back() {
    let rig = Rig::new().await;
    for l in ["L1", "L2", "L3", "L4", "L5"] {
        rig.asked(l).await;
    }
    let d = rig.dispatcher_with(QueueMode::StoreQueue, rated(Channel::Sms, "2/s", 2), Faults::default());
    let c = d.claim(10, None).await.unwrap().unwrap();
    // Each load's SMS and its set_timer (no rate): 2 SMS and 5 timers go, 3 SMS held.
    assert_eq!((c.claims.len(), c.held, c.superseded, c.took()), (7, 3, 0, 10));
    let c = d.claim(10, None).await.unwrap().unwrap();
    assert_eq!(c.took(), 0, "held: not due again yet");
}

/// A claim takes its sends from a channel's rate for that channel's rows only: the
/// Hero tasks and the timer claimed beside an SMS spend none of the SMS burst, which
/// is left for the next asks.
#[tokio::test]
async fn a_claim_takes_sends_for_its_channels_rows_only() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    for l in ["L2", "L3", "L4"] {
        let key = format!("{l}/e1/create_hero_task");
        let action = json!({"key": key, "type": "create_hero_task",
            "params": {"title": "t", "body": "b", "urgency": "normal"}});
        let row = haul_store::NewOutboxRow { id: key, action_type: ActionType::CreateHeroTask, action, trace: None };
        let entries = vec![NewEntry::stored("e1", "location_ping", json!({}))];
        rig.store.append(&load(l), entries, 0, vec![row], rig.now()).await.unwrap();
    }
    let d = rig.dispatcher_with(QueueMode::StoreQueue, rated(Channel::Sms, "1/min", 3), Faults::default());
    d.run_once().await.unwrap();
    assert_eq!((rig.services.calls(Channel::Sms).len(), rig.services.calls(Channel::Hero).len()), (1, 3));
    for l in ["L5", "L6"] {
        rig.asked(l).await;
    }
    d.run_once().await.unwrap();
    assert_eq!(rig.services.calls(Channel::Sms).len(), 3, "the burst's other two");
}

/// A channel's cap on sends in flight holds across dispatchers: rows past it are held
/// back (no attempt), a send's end frees its slot for the next, and the rows of other
/// channels are not counted.
#[tokio::test]
async fn sends_in_flight_are_capped_across_dispatchers() {
    let rig = Rig::new().await;
    for l in ["L1", "L2", "L3", "L4", "L5"] {
        rig.asked(l).await;
    }
    let caps = haul_core::PerChannel::from_fn(|c| (c == Channel::Sms).then_some(2));
    let settings = DispatcherSettings { sequential: true, jitter_seed: Some(7), caps, ..Default::default() };
    let (d1, d2) = (
        rig.dispatcher_with(QueueMode::StoreQueue, settings.clone(), Faults::default()),
        rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default()),
    );
    let loads = ["L1", "L2", "L3", "L4", "L5"];
    // When the SMS held back are due again, from now (ms).
    let held_due = async || {
        let now = rig.now();
        let mut due: Vec<i64> = rig_rows(&rig, &loads)
            .await
            .iter()
            .filter(|r| r.status == OutboxStatus::Pending && r.due_at > now)
            .map(|r| haul_core::time::to_ms(r.due_at) - haul_core::time::to_ms(now))
            .collect();
        due.sort();
        due
    };
    // Each load's SMS and its set_timer (no cap): 2 SMS and 5 timers go, 3 SMS held,
    // by a call time of 100 ms before any send: 2 sends end each 100 ms.
    let c1 = d1.claim(10, None).await.unwrap().unwrap();
    assert_eq!((c1.claims.len(), c1.held), (7, 3));
    assert_eq!(held_due().await, [100, 150, 200]);
    rig.services.take(rig.clock.clone(), Duration::from_millis(400));
    rig.clock.advance(Duration::from_secs(1));
    let c2 = d2.claim(10, None).await.unwrap().unwrap();
    assert_eq!((c2.claims.len(), c2.held), (0, 3), "the first dispatcher's two sends hold both slots");
    let sms = |c: &haul_runtime::dispatcher::Claimed| {
        c.claims.iter().filter(|c| c.row.action_type == ActionType::SendSms).count()
    };
    let mut ended = 0;
    for claim in c1.claims {
        if claim.row.action_type == ActionType::SendSms && ended == 0 {
            assert_eq!(d1.dispatch(claim).await, Dispatched::Delivered);
            ended += 1;
        }
    }
    rig.clock.advance(Duration::from_secs(1));
    let c3 = d2.claim(10, None).await.unwrap().unwrap();
    assert_eq!((sms(&c3), c3.held), (1, 2), "one send ended: one slot");
    let rows = rig_rows(&rig, &loads).await;
    assert!(rows.iter().all(|r| r.attempts == 0 && r.status != OutboxStatus::Dead), "waiting is not failing");
    // The other of the first dispatcher's sends never ends: its slot is freed when
    // its lease lapses. Its one send took 400 ms: the rows it holds now are spaced by it.
    rig.clock.advance(Duration::from_secs(91));
    let c4 = d1.claim(10, None).await.unwrap().unwrap();
    assert_eq!((sms(&c4), c4.held), (2, 2), "{c4:?}");
    assert_eq!(held_due().await, [400, 600]);
}

/// A client's own send limit (`clients.*.rates`) holds its rows back, no attempt
/// spent, while another client's rows on the same channel go at once; it is shared by
/// every dispatcher.
#[tokio::test]
async fn a_clients_own_limit_holds_its_rows_only() {
    let rig = Rig::new().await;
    for l in ["A1", "A2", "A3", "A4"] {
        rig.asked(l).await;
    }
    for l in ["B1", "B2"] {
        rig.publish(
            l,
            json!({"event_id": "load:init", "kind": "load_update", "client": "client_b",
            "driver_phone": "+15555550123", "stage": "in_transit"}),
        )
        .await;
        rig.publish(l, ping("ping_0700")).await;
    }
    let settings = WorkerSettings { timers: TimerRoute::Outbox, ..WorkerSettings::default() };
    rig.settle(&rig.worker_with(sop(), settings, Faults::default())).await;
    let config = haul_config::Config::from_toml("[clients.client_a.rates.sms]\nrate = \"1/s\"").unwrap();
    let settings = DispatcherSettings { sequential: true, jitter_seed: Some(7), ..Default::default() };
    let settings = settings.with_weights(&config.clients);
    let d1 = rig.dispatcher_with(QueueMode::StoreQueue, settings.clone(), Faults::default());
    let d2 = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    let mut sent = vec![];
    for second in 0..6u64 {
        rig.clock.set(add(t0(), Duration::from_secs(second)));
        let d = if second % 2 == 0 { &d1 } else { &d2 };
        d.run_once().await.unwrap();
        let calls = rig.services.calls(Channel::Sms);
        let mut now: Vec<String> = calls[sent.len()..].iter().map(|c| format!("{second}:{}", &c[..2])).collect();
        now.sort();
        sent.extend(now);
    }
    assert_eq!(sent, ["0:A1", "0:B1", "0:B2", "1:A2", "2:A3", "3:A4"]);
    let rows = rig_rows(&rig, &["A1", "A2", "A3", "A4"]).await;
    let settled: Vec<_> = rows.iter().map(|r| (r.status, r.attempts)).collect();
    assert_eq!(settled, [(OutboxStatus::Dispatched, 0); 4], "sent, no failed attempt: waiting is not failing");
}

/// Each client's weight is read from its settings; a client without one has none.
#[test]
fn the_clients_weights_come_from_their_settings() {
    let config =
        haul_config::Config::from_toml("[clients.a]\nsend_weight = 3\n[clients.b.eta_request]\nmax_attempts = 2")
            .unwrap();
    let weights = DispatcherSettings::default().with_weights(&config.clients).weights;
    assert_eq!(weights, [("a".to_owned(), 3)].into());
}

/// The evals' dispatcher settings with a send limit on `channel`.
fn rated(channel: Channel, rate: &str, burst: u32) -> DispatcherSettings {
    let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse(rate).unwrap(), burst).unwrap();
    let limits = haul_core::PerChannel::from_fn(|c| (c == channel).then_some(limit));
    DispatcherSettings { sequential: true, jitter_seed: Some(7), limits, ..Default::default() }
}

async fn rig_rows(rig: &Rig, loads: &[&str]) -> Vec<haul_store::OutboxRow> {
    let mut all = vec![];
    for l in loads {
        all.extend(rig.rows(l).await.into_iter().filter(|r| r.action_type == ActionType::SendSms));
    }
    all
}

/// A rig whose loads each asked their driver by SMS, and whose SMS service refused
/// each for good: one dead `send_sms` row a load, its failed outcome decided.
async fn with_dead_sms(loads: &[&str]) -> Rig {
    let rig = Rig::new().await;
    rig.services.answer(Channel::Sms, Answer::Permanent);
    for l in loads {
        rig.asked(l).await;
    }
    rig.dispatcher(QueueMode::StoreQueue, Faults::default()).run_once().await.unwrap();
    rig.settle(&rig.worker()).await;
    rig
}

#[tokio::test]
async fn a_bulk_requeue_takes_at_most_its_limit_and_a_dry_run_publishes_nothing() {
    let rig = with_dead_sms(&["L1", "L2", "L3"]).await;
    let filter =
        |limit| DeadFilter { action_type: ActionType::SendSms, since: "2026-01-01T00:00:00Z".parse().unwrap(), limit };
    let bulk = |id: &'static str, limit, dry_run| {
        let (store, events, now) = (rig.store.clone(), rig.events(), rig.now());
        async move { operator::bulk_requeue(&*store, &events, &requester(id), &filter(limit), dry_run, now).await }
    };
    for limit in [0, operator::MAX_BULK_ROWS + 1] {
        assert_eq!(bulk("b0", limit, true).await.unwrap_err().code(), "bad_limit", "limit {limit}");
    }
    assert_eq!(bulk("b0", operator::MAX_BULK_ROWS, true).await.unwrap().rows.len(), 3);
    let before = rig.depth().await;
    let dry = bulk("b1", 2, true).await.unwrap();
    assert_eq!((dry.rows.len(), dry.truncated), (2, true));
    assert!(dry.rows.iter().all(|r| r.status == "would_requeue"));
    assert_eq!(rig.depth().await, before, "a dry run publishes nothing");
    let all = bulk("b2", 3, false).await.unwrap();
    assert_eq!((all.rows.len(), all.truncated), (3, false));
    assert!(all.rows.iter().all(|r| r.status == "queued"), "{:?}", all.rows);
    assert_eq!(rig.depth().await, before + 3);
    assert_eq!(all.rows[0].event_id, EventId::operator_bulk("b2", &all.rows[0].outbox_id).unwrap());
}

#[tokio::test]
async fn a_bulk_requeue_skips_a_row_another_request_requeued_or_dismissed_and_counts_only_the_rest() {
    let rig = with_dead_sms(&["L1", "L2", "L3"]).await;
    let l1_sms = rig.row("L1", "send_sms").await.id;
    operator::requeue(&*rig.store, &rig.events(), &requester("by-hand"), &l1_sms, rig.now()).await.unwrap();
    let l3_sms = rig.row("L3", "send_sms").await.id;
    operator::dismiss(&*rig.store, &rig.events(), &requester("gone"), &l3_sms, rig.now()).await.unwrap();
    rig.settle(&rig.worker()).await;
    let dismissed = rig.store.dead_rows_page(&[], Some(haul_core::InboxState::Dismissed), None, 10).await.unwrap();
    assert_eq!(dismissed.iter().map(|d| d.row.id.as_str()).collect::<Vec<_>>(), [l3_sms.as_str()]);
    let filter =
        DeadFilter { action_type: ActionType::SendSms, since: "2026-01-01T00:00:00Z".parse().unwrap(), limit: 10 };
    let bulk = |id: &'static str, dry_run| {
        let (store, events, now, filter) = (rig.store.clone(), rig.events(), rig.now(), filter.clone());
        async move { operator::bulk_requeue(&*store, &events, &requester(id), &filter, dry_run, now).await.unwrap() }
    };
    let statuses = |a: &operator::BulkAnswer| {
        a.rows.iter().map(|r| (r.load_id.to_string(), r.status.clone(), r.requeued_as.clone())).collect::<Vec<_>>()
    };
    let by_hand = Some("L1/op:by-hand/send_sms".to_owned());
    let dry = bulk("b1", true).await;
    assert_eq!(
        statuses(&dry),
        [
            ("L1".into(), "already_requeued".into(), by_hand.clone()),
            ("L2".into(), "would_requeue".into(), None),
            ("L3".into(), "dismissed".into(), None)
        ]
    );
    let counted = dry.rows.iter().map(operator::BulkRow::goes_out).collect::<Vec<_>>();
    assert_eq!(counted, [false, true, false], "what is counted");
    let before = rig.depth().await;
    let real = bulk("b2", false).await;
    assert_eq!(
        statuses(&real),
        [
            ("L1".into(), "already_requeued".into(), by_hand),
            ("L2".into(), "queued".into(), None),
            ("L3".into(), "dismissed".into(), None)
        ]
    );
    assert_eq!(rig.depth().await, before + 1, "only L2's row is published");
    rig.settle(&rig.worker()).await;
    // The same request again is a retry: its own row is a duplicate, not "requeued already".
    let again = bulk("b2", false).await;
    assert_eq!(statuses(&again)[1], ("L2".into(), "duplicate".into(), None));
    assert!(again.rows[1].goes_out(), "a retry's own row is counted");
    // The JSON answer names the row that carries the action only where there is one.
    let json = serde_json::to_value(&again).unwrap();
    assert_eq!(json["rows"][0]["requeued_as"], "L1/op:by-hand/send_sms");
    assert!(json["rows"][1].get("requeued_as").is_none(), "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_waits_for_the_loads_decision_but_not_past_its_bound() {
    let rig = Rig::new().await;
    rig.asked("L1").await;
    let ask = AskId::parse("ask:eta_request:ping_0700").unwrap();
    let q = operator::resolve_ask(&*rig.store, &rig.events(), &requester("r1"), &load("L1"), &ask, rig.now())
        .await
        .unwrap();
    // No worker: nothing decided, and the wait ends at its bound.
    let started = std::time::Instant::now();
    let none = operator::decided(&*rig.store, &load("L1"), q.event_id.as_str(), Duration::from_millis(300)).await;
    assert!(none.is_none());
    // It waited its bound, and not without end (the upper figure is a hang guard).
    assert!(started.elapsed() >= Duration::from_millis(300) && started.elapsed() < Duration::from_secs(20));
    // A worker decides while the answer waits: the decision is the answer.
    let worker = rig.worker();
    let deciding = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        worker.run_once().await.unwrap()
    });
    let d = operator::decided(&*rig.store, &load("L1"), q.event_id.as_str(), Duration::from_secs(10)).await;
    let d = d.expect("decided within the wait");
    assert_eq!((d.decider.as_str(), d.event_id.as_str()), ("operator", "op:r1"));
    assert_eq!(d.actions.iter().map(|a| a.action_type().as_str()).collect::<Vec<_>>(), ["cancel_timer"]);
    deciding.await.unwrap();
    // Asked again later, the first read finds it: no wait is needed.
    assert!(operator::decided(&*rig.store, &load("L1"), "op:r1", Duration::ZERO).await.is_some());
}

/// A STOP the driver sent on another load, or on none, is in the consent ledger: the
/// dispatcher sends no SMS to that phone. The row is buried unsent, its load learns
/// the opt-out from the failed outcome, and the SOP asks a person to call instead.
#[tokio::test]
async fn no_sms_goes_to_a_phone_the_consent_ledger_opted_out() {
    let rig = Rig::new().await;
    let stop = haul_store::SmsConsent {
        phone: DRIVER.into(),
        opted_out: true,
        event_id: "sms:SMstop".into(),
        load_id: None,
        changed_at: t0(),
    };
    rig.store.record_consent(&stop).await.unwrap();
    rig.asked("L1").await;
    let dispatcher = rig.dispatcher(QueueMode::Separate, Faults::default());
    let claimed = dispatcher.claim(10, None).await.unwrap().unwrap();
    assert_eq!((claimed.refused, claimed.took()), (1, claimed.claims.len() + 1), "{claimed:?}");
    assert!(claimed.claims.iter().all(|c| c.row.action_type != ActionType::SendSms), "{claimed:?}");
    assert!(rig.services.calls(Channel::Sms).is_empty(), "texted an opted-out phone");
    let sms = rig.row("L1", "send_sms").await;
    assert_eq!(sms.status, OutboxStatus::Dead);
    let failure = sms.last_failure.unwrap();
    assert_eq!(failure, haul_core::consent::ledger_refusal("sms:SMstop", t0()));

    rig.settle(&rig.worker()).await;
    let state = haul_core::projection::project(&rig.log("L1").await);
    assert!(state.sms_opted_out(), "the load learned the opt-out from the failed outcome");
    let hero = rig.row("L1", "create_hero_task").await;
    assert!(hero.action.to_string().contains("opted out"), "{}", hero.action);

    // The driver's next load: its ask is refused the same way by a whole run.
    rig.asked("L2").await;
    let out = dispatcher.run_once().await.unwrap();
    assert!(out.contains(&Dispatched::Buried), "{out:?}");
    assert!(rig.services.calls(Channel::Sms).is_empty(), "texted an opted-out phone");

    // Opted back in: the next SMS goes out.
    let start = haul_store::SmsConsent { opted_out: false, event_id: "sms:SMstart".into(), ..stop };
    rig.store.record_consent(&start).await.unwrap();
    assert!(rig.store.opted_out_among(&[DRIVER.to_owned()]).await.unwrap().is_empty());
}

/// A send the service refuses because the phone opted out (Twilio's 21610) opts the
/// phone out in the consent ledger too, by the row's failed outcome; another refusal
/// does not.
#[tokio::test]
async fn a_refusal_as_opted_out_is_kept_in_the_consent_ledger() {
    for (answer, kept) in [(Answer::Permanent, false), (Answer::OptedOut, true)] {
        let rig = Rig::new().await;
        rig.services.answer(Channel::Sms, answer);
        rig.asked("L1").await;
        let out = rig.dispatcher(QueueMode::Separate, Faults::default()).run_once().await.unwrap();
        assert!(out.contains(&Dispatched::Buried), "{out:?}");
        let ledger = rig.store.opted_out_among(&[DRIVER.to_owned()]).await.unwrap();
        let sms = rig.row("L1", "send_sms").await.id;
        let want = if kept { vec![format!("evt:out:{sms}:failed")] } else { vec![] };
        assert_eq!(ledger.into_iter().map(|c| c.event_id).collect::<Vec<_>>(), want, "{answer:?}");
    }
}

/// Warming the claim up (`Dispatcher::warm_up`, before a dispatcher's first claim)
/// claims nothing and takes nothing: the due rows stay unclaimed, and the first claim
/// still gets the rate's whole burst.
#[tokio::test]
async fn warming_the_claim_up_claims_and_takes_nothing() {
    let rig = Rig::new().await;
    let loads = ["L1", "L2", "L3"];
    for l in loads {
        rig.asked(l).await;
    }
    let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse("1/min").unwrap(), 2).unwrap();
    let limits = haul_core::PerChannel::from_fn(|c| (c == Channel::Sms).then_some(limit));
    let settings = DispatcherSettings { sequential: true, jitter_seed: Some(7), limits, ..Default::default() };
    let d = rig.dispatcher_with(QueueMode::StoreQueue, settings, Faults::default());
    d.warm_up().await;
    d.warm_up().await;
    let rows = rig_rows(&rig, &loads).await;
    assert!(rows.iter().all(|r| r.claim_token.is_none() && r.attempts == 0), "{rows:?}");
    let c = d.claim(10, None).await.unwrap().unwrap();
    let sms = c.claims.iter().filter(|c| c.row.action_type == ActionType::SendSms).count();
    assert_eq!((sms, c.held), (2, 1), "a burst of 2 lets 2 SMS go at once");
}

/// With export on, a traced event's run is a CONSUMER span (the child of the context it
/// was queued with, and linked to it), its decision an INTERNAL child, and each send a
/// CLIENT child of the run, the failed one saying why; an untraced event records none.
#[tokio::test]
async fn a_traced_events_run_decision_and_sends_are_spans_in_its_trace() {
    use haul_runtime::spans::{Kept, Kind, Span, Spans, Value};
    let rig = Rig::new().await;
    let kept = Arc::new(Kept::default());
    let (worker, dispatcher) = (rig.worker(), rig.dispatcher(QueueMode::Separate, Faults::default()));
    worker.export_spans(Spans::to(kept.clone()));
    dispatcher.export_spans(Spans::to(kept.clone()));
    rig.publish("481207", init()).await;
    let given =
        haul_core::trace::TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let ping = InboundEvent::from_json(load("481207"), ping("ping_0700")).unwrap();
    rig.events().publish_traced(&ping, Some(given), rig.now()).await.unwrap();
    rig.services.take(rig.clock.clone(), Duration::from_millis(40));
    rig.settle(&worker).await;
    let attr = |s: &Span, key: &str| s.attributes.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
    let text = |v: &str| Some(Value::Str(v.into()));
    let spans = kept.spans();
    assert_eq!(spans.len(), 2, "the untraced init records nothing: {spans:#?}");
    let run = spans.iter().find(|s| s.kind == Kind::Consumer).unwrap();
    assert_eq!((run.name.as_str(), run.context.trace_id), ("process loads", given.trace_id));
    assert_eq!((run.parent_span_id, run.links.clone()), (Some(given.span_id), vec![given]));
    assert_ne!(run.context.span_id, given.span_id);
    for (key, value) in [
        ("messaging.system", text("haul")),
        ("messaging.operation.type", text("process")),
        ("messaging.destination.name", text("loads")),
        ("messaging.message.id", text("ping_0700")),
        ("haul.load_id", text("481207")),
        ("haul.attempt", Some(Value::Int(0))),
        ("haul.receive_count", Some(Value::Int(1))),
        ("haul.outcome", text("committed")),
    ] {
        assert_eq!(attr(run, key), value, "{key}");
    }
    assert_eq!(run.error, None);
    let decide = spans.iter().find(|s| s.kind == Kind::Internal).unwrap();
    assert_eq!((decide.name.as_str(), decide.parent_span_id), ("decide", Some(run.context.span_id)));
    assert_eq!(decide.context.trace_id, given.trace_id);
    assert_ne!(decide.context.span_id, run.context.span_id);
    assert_eq!(attr(decide, "haul.decider"), text("sop"));
    assert_eq!(attr(decide, "haul.filtered"), Some(Value::Bool(false)));
    assert_eq!(attr(decide, "haul.actions"), Some(Value::Int(2)));
    assert_eq!(attr(decide, "haul.needs_hero_task"), Some(Value::Bool(false)));
    // What the run appended keeps the run's context.
    let sms = rig.row("481207", "send_sms").await;
    assert_eq!(sms.trace, Some(run.context));
    // A send that fails, then one that goes: two CLIENT spans, children of the run.
    rig.services.answer(Channel::Sms, Answer::Retryable);
    dispatcher.run_once().await.unwrap();
    rig.clock.advance(Duration::from_secs(600));
    rig.services.answer(Channel::Sms, Answer::Delivered);
    dispatcher.run_once().await.unwrap();
    let sends: Vec<Span> = kept.spans().into_iter().filter(|s| s.kind == Kind::Client).collect();
    assert_eq!(sends.len(), 2, "{sends:#?}");
    for (send, attempt, result) in [(&sends[0], 1, "retryable"), (&sends[1], 2, "delivered")] {
        assert_eq!((send.name.as_str(), send.parent_span_id), ("send sms", Some(run.context.span_id)));
        assert_eq!(send.context.trace_id, given.trace_id);
        assert_eq!(attr(send, "haul.attempt"), Some(Value::Int(attempt)));
        assert_eq!(attr(send, "haul.result"), text(result));
        assert_eq!(attr(send, "haul.channel"), text("sms"));
        assert_eq!(attr(send, "haul.outbox_id"), text(&sms.id));
        assert_eq!(attr(send, "haul.load_id"), text("481207"));
        assert_eq!(send.end, add(send.start, Duration::from_millis(40)), "the call's time");
    }
    assert_eq!(attr(&sends[0], "error.type"), text("retryable"));
    assert!(sends[0].error.as_deref().is_some_and(|e| e.contains("503")), "{:?}", sends[0].error);
    assert_eq!((attr(&sends[1], "error.type"), sends[1].error.clone()), (None, None));
    assert_ne!(sends[0].context.span_id, sends[1].context.span_id);
}

/// The CONSUMER spans a run recorded, in order.
fn attempts(kept: &haul_runtime::spans::Kept) -> Vec<haul_runtime::spans::Span> {
    kept.spans().into_iter().filter(|s| s.kind == haul_runtime::spans::Kind::Consumer).collect()
}

fn outcome_of(s: &haul_runtime::spans::Span) -> Option<haul_runtime::spans::Value> {
    s.attributes.iter().find(|(k, _)| *k == "haul.outcome").map(|(_, v)| v.clone())
}

const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn each_attempt_of_a_run_is_a_span_of_its_own_linked_to_the_events_context() {
    use haul_runtime::spans::{Kept, Spans, Value};
    let rig = Rig::new().await;
    let given = haul_core::trace::TraceParent::parse(GIVEN).unwrap();
    let event = InboundEvent::from_json(load("L1"), init()).unwrap();
    rig.events().publish_traced(&event, Some(given), rig.now()).await.unwrap();
    let racing = Arc::new(Racing { store: rig.store.clone(), calls: AtomicU32::new(0) });
    let settings = WorkerSettings { conflict_retries: 2, ..WorkerSettings::default() };
    let worker = rig.worker_with(racing, settings, Faults::default());
    let kept = Arc::new(Kept::default());
    worker.export_spans(Spans::to(kept.clone()));
    let outcome =
        tokio::time::timeout(Duration::from_secs(20), worker.run_once()).await.expect("the run ends").unwrap();
    assert!(matches!(outcome[..], [RunOutcome::LeftForRedelivery(_)]), "{outcome:?}");
    let runs = attempts(&kept);
    let labels: Vec<_> = runs.iter().map(outcome_of).collect();
    let text = |v: &str| Some(Value::Str(v.into()));
    assert_eq!(labels, [text("conflict"), text("conflict"), text("left_for_redelivery")]);
    // A conflict is the version check at work, not a failure; giving the message back is.
    assert_eq!((runs[0].error.clone(), runs[1].error.clone()), (None, None));
    assert!(runs[2].error.is_some(), "{:?}", runs[2]);
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run.links, vec![given], "each attempt links to the event's context");
        assert_eq!((run.context.trace_id, run.parent_span_id), (given.trace_id, Some(given.span_id)));
        let attempt = run.attributes.iter().find(|(k, _)| *k == "haul.attempt").map(|(_, v)| v.clone());
        assert_eq!(attempt, Some(Value::Int(n as i64)));
    }
    let mut ids: Vec<_> = runs.iter().map(|r| r.context.span_id).collect();
    ids.dedup();
    assert_eq!(ids.len(), 3, "three spans, not one span retried");
}

/// Decides as the SOP does, except that on a load update it sends the load's first
/// ask again under that ask's own key: an action key already in the outbox.
struct Reusing {
    first: std::sync::Mutex<Option<Vec<haul_core::action::Action>>>,
}

#[async_trait]
impl Decider for Reusing {
    fn name(&self) -> String {
        "sop".into()
    }
    async fn decide(&self, l: &LoadId, s: &LoadState, e: &InboundEvent, now: Timestamp) -> anyhow::Result<Decision> {
        let mut d = sop().decide(l, s, e, now).await?;
        let mut first = self.first.lock().unwrap();
        match first.as_ref() {
            None if d.actions.iter().any(|a| a.ask_id.is_some()) => *first = Some(d.actions.clone()),
            Some(actions) if e.kind() == "load_update" => d.actions = actions.clone(),
            _ => {}
        }
        Ok(d)
    }
}

#[tokio::test]
async fn an_attempt_whose_decision_reused_a_key_fails_and_the_fallback_is_the_next() {
    use haul_runtime::spans::{Kept, Spans, Value};
    let rig = Rig::new().await;
    let worker =
        rig.worker_with(Arc::new(Reusing { first: Default::default() }), WorkerSettings::default(), Faults::default());
    rig.publish("L1", init()).await;
    rig.publish("L1", ping("ping_0700")).await;
    rig.settle(&worker).await;
    let kept = Arc::new(Kept::default());
    worker.export_spans(Spans::to(kept.clone()));
    let given = haul_core::trace::TraceParent::parse(GIVEN).unwrap();
    let update = json!({"event_id": "upd_1", "kind": "load_update", "stage": "in_transit"});
    let update = InboundEvent::from_json(load("L1"), update).unwrap();
    rig.events().publish_traced(&update, Some(given), rig.now()).await.unwrap();
    let outcomes = rig.settle(&worker).await;
    let fallback = RunOutcome::Committed { decider: "fallback".into(), filtered: false, actions: 1 };
    assert_eq!(outcomes, vec![fallback]);
    let runs = attempts(&kept);
    let text = |v: &str| Some(Value::Str(v.into()));
    assert_eq!(runs.iter().map(outcome_of).collect::<Vec<_>>(), [text("fallback"), text("committed")]);
    assert!(runs[0].error.as_deref().is_some_and(|e| e.contains("reused action key")), "{:?}", runs[0].error);
    let error_type = runs[0].attributes.iter().find(|(k, _)| *k == "error.type").map(|(_, v)| v.clone());
    assert_eq!(error_type, text("fallback"));
    assert_eq!(runs[1].error, None);
}
