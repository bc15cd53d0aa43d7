//! Shadow mode (`decider.shadow`): a second decider beside a live worker stores exactly
//! the expected disagreements and changes nothing of the run (log, outbox, sends), and
//! a failing, late or stuck shadow never delays or fails the primary. On SQLite and
//! PostgreSQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use haul_config::Config;
use haul_core::decision::Decision;
use haul_core::ids::LoadId;
use haul_core::projection::LoadState;
use haul_core::replay::Agreement;
use haul_core::sop::{EtaPolicy, Policies};
use haul_core::time::Timestamp;
use haul_core::{Clock, InboundEvent};
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::faults::Faults;
use haul_runtime::shadow::{Shadow, ShadowSettings};
use haul_store::{ShadowCursor, ShadowDecision, Store};

on_both_backends!(
    a_failing_shadow_stores_errors_and_the_run_is_the_same,
    a_late_shadow_stores_errors_and_the_run_is_the_same,
    a_stuck_shadow_never_holds_up_the_primary_and_a_full_queue_drops,
);

/// The SOP with `client_a` asking at most `max_attempts` times.
fn sop(max_attempts: u32) -> (Arc<dyn Decider>, Policies) {
    let mut policies = Policies::default();
    policies.clients.insert("client_a".into(), EtaPolicy { max_attempts, ..EtaPolicy::default() });
    (Arc::new(SopDecider { policies: policies.clone() }), policies)
}

fn shadow(h: &H, decider: Arc<dyn Decider>, policies: Policies, timeout: Duration, capacity: usize) -> Arc<Shadow> {
    let settings = ShadowSettings { capacity, timeout };
    let s = Arc::new(Shadow::start(decider, policies, h.store.clone(), h.clock.clone() as Arc<dyn Clock>, settings));
    h.pipeline.worker.shadow_with(s.clone());
    s
}

/// A load's life: a high-risk ping, then the three timers of its ETA request.
async fn life(h: &H) {
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    for _ in 0..3 {
        h.advance(30 * 60);
        h.settle().await;
    }
}

/// What a run leaves: its log entries, its outbox rows (without claim tokens, random
/// per store) and what the services took, each sorted (the dispatcher sends a
/// decision's actions at once, so their outcomes are logged in either order).
async fn run_of(h: &H) -> (Vec<String>, Vec<String>, Vec<(String, String)>) {
    let mut log: Vec<String> = h
        .log()
        .await
        .into_iter()
        .map(|r| format!("{} {} {} {}", r.entry_id, r.kind(), r.payload(), r.recorded_at))
        .collect();
    let rows = h.store.rows_for_load(&h.load).await.unwrap();
    let mut rows: Vec<String> =
        rows.into_iter().map(|r| format!("{} {} {} {}", r.id, r.action, r.status.as_str(), r.attempts)).collect();
    let mut effects: Vec<(String, String)> = h.svc.effects().into_iter().map(|e| (e.channel, e.key)).collect();
    log.sort();
    rows.sort();
    effects.sort();
    (log, rows, effects)
}

async fn stored(store: &Arc<dyn Store>, load: &LoadId) -> Vec<ShadowDecision> {
    store.shadow_page(load, &ShadowCursor::default(), 1000).await.unwrap()
}

fn timer(n: u32) -> String {
    format!("evt:tmr:{LOAD}:ask:eta_request:ping_0700:{n}")
}

/// (event id, agreement, error?) of each stored shadow decision, in log order.
fn summary(rows: &[ShadowDecision]) -> Vec<(String, Agreement, bool)> {
    rows.iter().map(|r| (r.event_id.clone(), r.agreement, r.error.is_some())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_a_shadow_with_fewer_attempts_disagrees_exactly_where_expected_and_changes_nothing() {
    fewer_attempts(sqlite().await, sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_shadow_with_fewer_attempts_disagrees_exactly_where_expected_and_changes_nothing() {
    fewer_attempts(postgres().await, postgres().await).await;
}

/// `store` runs a load's life with a shadow, `twin` (of the same kind) without.
async fn fewer_attempts(store: Arc<dyn Store>, twin: Arc<dyn Store>) {
    let plain = harness(twin, Config::default(), Faults::default(), None).await;
    life(&plain).await;

    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let (decider, policies) = sop(2);
    let s = shadow(&h, decider, policies, Duration::from_secs(5), 256);
    life(&h).await;
    s.settled().await;

    assert_eq!(run_of(&h).await, run_of(&plain).await, "the log, the outbox and the sends are the run's own");
    let rows = stored(&store, &h.load).await;
    let same = |e: &str| (e.to_owned(), Agreement::Same, false);
    let different = |e: &str| (e.to_owned(), Agreement::Different, false);
    assert_eq!(
        summary(&rows),
        vec![
            same("load:init"),
            same("ping_0700"),
            // "attempt 2 of 2" instead of "2 of 3"
            different(&timer(1)),
            // escalates where the primary asked a third time
            different(&timer(2)),
            same(&timer(3)),
        ],
        "only the events the decider decided; action outcomes are the filter's"
    );
    assert_eq!(s.counts(), (5, 0));
    // Each row holds the primary's decision as logged, and the shadow's.
    let log = h.log().await;
    for r in &rows {
        let logged = log.iter().find(|l| l.entry_id == format!("dec:{}", r.event_id)).unwrap();
        assert_eq!(r.primary, logged.payload(), "{}", r.event_id);
        let event = log.iter().find(|l| l.entry_id == r.event_id).unwrap();
        assert_eq!(r.event_seq, event.seq);
        assert_eq!(r.shadow, "sop");
        assert_eq!(r.decided_at, logged.recorded_at);
    }
    let escalated: Decision = serde_json::from_value(rows[3].decision.clone().unwrap()).unwrap();
    let types: Vec<&str> = escalated.actions.iter().map(|a| a.action_type().as_str()).collect();
    assert_eq!(types, ["create_hero_task"], "the shadow's own decision is kept");
    assert_eq!(rows[3].rule, "rule3");
}

/// A shadow decider that fails, or answers after its time limit.
enum Bad {
    Fails,
    Sleeps(Duration),
}

#[async_trait]
impl Decider for Bad {
    fn name(&self) -> String {
        match self {
            Bad::Fails => "fails".into(),
            Bad::Sleeps(_) => "sleeps".into(),
        }
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        ev: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        match self {
            Bad::Fails => anyhow::bail!("model unavailable"),
            Bad::Sleeps(d) => {
                tokio::time::sleep(*d).await;
                SopDecider { policies: Policies::default() }.decide(load, state, ev, now).await
            }
        }
    }
}

async fn a_failing_shadow_stores_errors_and_the_run_is_the_same(store: Arc<dyn Store>) {
    shadow_errs(store, Bad::Fails, "the fails shadow failed: model unavailable").await;
}

async fn a_late_shadow_stores_errors_and_the_run_is_the_same(store: Arc<dyn Store>) {
    shadow_errs(store, Bad::Sleeps(Duration::from_secs(30)), "the sleeps shadow failed: did not answer within 50ms")
        .await;
}

async fn shadow_errs(store: Arc<dyn Store>, bad: Bad, why: &str) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let s = shadow(&h, Arc::new(bad), Policies::default(), Duration::from_millis(50), 256);
    h.publish(init()).await;
    h.publish(ping("ping_0700")).await;
    h.settle().await;
    s.settled().await;
    let d = h.decision("ping_0700").await;
    assert_eq!(d["decider"], "sop", "the primary decided: {d}");
    assert_eq!(h.svc.sends("sms", &format!("{LOAD}/ask:eta_request:ping_0700/1/send_sms")), 1);
    let rows = stored(&store, &h.load).await;
    assert_eq!(
        summary(&rows),
        [("load:init", true), ("ping_0700", true)].map(|(e, err)| (e.to_owned(), Agreement::Error, err))
    );
    for r in &rows {
        assert_eq!(r.decision, None, "never a fallback");
        assert_eq!(r.error.as_deref(), Some(why));
    }
}

/// A shadow decider that says it has started, then waits to be let go.
struct Gated {
    entered: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl Decider for Gated {
    fn name(&self) -> String {
        "gated".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        ev: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        self.entered.notify_one();
        self.release.notified().await;
        SopDecider { policies: Policies::default() }.decide(load, state, ev, now).await
    }
}

async fn a_stuck_shadow_never_holds_up_the_primary_and_a_full_queue_drops(store: Arc<dyn Store>) {
    let h = harness(store.clone(), Config::default(), Faults::default(), None).await;
    let (entered, release) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
    let gated = Arc::new(Gated { entered: entered.clone(), release: release.clone() });
    // One decision in the shadow's hands, one waiting: the rest are dropped.
    let s = shadow(&h, gated, Policies::default(), Duration::from_secs(3600), 1);
    h.publish(init()).await;
    h.settle().await;
    entered.notified().await; // the shadow is stuck on load:init
    h.publish(ping("ping_0700")).await;
    h.publish(sms("sms_1", DRIVER, "eta 5pm")).await;
    h.settle().await;
    // Every run committed while the shadow was stuck.
    for e in ["load:init", "ping_0700", "sms_1"] {
        assert_eq!(h.decision(e).await["decider"], "sop", "{e}");
    }
    assert!(stored(&store, &h.load).await.is_empty(), "the shadow has stored nothing yet");
    assert_eq!(s.counts(), (2, 1), "load:init taken, ping_0700 waiting, sms_1 dropped");
    release.notify_one();
    entered.notified().await; // on ping_0700
    release.notify_one();
    s.settled().await;
    let rows = stored(&store, &h.load).await;
    assert_eq!(
        summary(&rows),
        vec![("load:init".to_owned(), Agreement::Same, false), ("ping_0700".to_owned(), Agreement::Same, false)]
    );
}
