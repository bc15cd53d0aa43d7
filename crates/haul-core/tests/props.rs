//! Property tests: the retry policy, and the projection over logs the SOP writes.

use std::time::Duration;

use haul_core::decision::{AskStatus, DECISION_RECORDED};
use haul_core::event::{ActionOutcome, EventBody, InboundSms, LoadUpdate, LocationPing, Risk, TimerFired};
use haul_core::filter::filter;
use haul_core::ids::{EventId, LoadId, TimerId, action_outcome_event_id, timer_fired_event_id};
use haul_core::outcome::OutcomeStatus;
use haul_core::projection::{LoadState, Record, project};
use haul_core::sop::{Policies, decide};
use haul_core::time::{Timestamp, add};
use haul_core::{ActionKind, ActionType, InboundEvent, RetryDecision, RetryPolicy};
use proptest::prelude::*;

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn policy() -> impl Strategy<Value = RetryPolicy> {
    (1u64..5_000, 1u64..120_000, 2u32..12, 1u64..600_000).prop_map(|(base, cap, max_attempts, budget)| RetryPolicy {
        base: Duration::from_millis(base),
        cap: Duration::from_millis(cap.max(base)),
        max_attempts,
        budget: Duration::from_millis(budget),
    })
}

proptest! {
    #[test]
    fn backoff_is_capped_and_jittered_within_half(p in policy(), attempts in 1u32..64, jitter in 0.0f64..1.0) {
        let d = p.backoff(attempts, jitter);
        let full = p.base.saturating_mul(1u32 << (attempts - 1).min(30)).min(p.cap);
        prop_assert!(d <= p.cap);
        prop_assert!(d >= full / 2 && d <= full, "{d:?} outside [{:?}, {full:?}]", full / 2);
    }

    #[test]
    fn backoff_never_shrinks(p in policy(), attempts in 1u32..40) {
        prop_assert!(p.backoff(attempts + 1, 1.0) >= p.backoff(attempts, 1.0));
        prop_assert!(p.backoff(attempts + 1, 0.0) >= p.backoff(attempts, 0.0));
    }

    #[test]
    fn first_retry_is_always_allowed(p in policy(), late_s in 0u64..1_000_000, jitter in 0.0f64..1.0) {
        // However long after the first attempt the failure is seen.
        let now = add(t0(), Duration::from_secs(late_s));
        prop_assert!(matches!(p.after_failure(1, t0(), now, jitter), RetryDecision::RetryAt(t) if t > now));
    }

    #[test]
    fn retries_stay_inside_budget_and_attempts(p in policy(), attempts in 2u32..16, elapsed_ms in 0u64..1_000_000, jitter in 0.0f64..1.0) {
        let now = add(t0(), Duration::from_millis(elapsed_ms));
        match p.after_failure(attempts, t0(), now, jitter) {
            RetryDecision::RetryAt(t) => {
                prop_assert!(t > now);
                prop_assert!(attempts < p.max_attempts);
                prop_assert!(t <= add(t0(), p.budget), "retry past the budget");
            }
            RetryDecision::Dead(_) => {
                let would = add(now, p.backoff(attempts, jitter).max(Duration::from_millis(1)));
                prop_assert!(attempts >= p.max_attempts || would > add(t0(), p.budget), "killed a row that had budget");
            }
        }
    }
}

/// What can happen to a load, as the generator draws it.
#[derive(Clone, Debug)]
enum Happening {
    Ping(Risk),
    DriverSms(bool),
    StrangerSms,
    FireTimers,
    FailFirstSms,
    Deliver,
    Update,
    Wait(u16),
}

fn happening() -> impl Strategy<Value = Happening> {
    prop_oneof![
        prop_oneof![Just(Risk::Low), Just(Risk::Medium), Just(Risk::High)].prop_map(Happening::Ping),
        any::<bool>().prop_map(Happening::DriverSms),
        Just(Happening::StrangerSms),
        Just(Happening::FireTimers),
        Just(Happening::FireTimers),
        Just(Happening::FailFirstSms),
        Just(Happening::Deliver),
        Just(Happening::Update),
        (1u16..120).prop_map(Happening::Wait),
    ]
}

const DRIVER: &str = "+15555550100";

/// Runs the filter and the SOP over the drawn happenings, the way the worker does,
/// and returns the log it wrote plus the state it kept step by step.
fn simulate(happenings: &[Happening]) -> (Vec<Record>, LoadState) {
    let load = LoadId::parse("481207").unwrap();
    let policies = Policies::default();
    let mut records: Vec<Record> = Vec::new();
    let mut state = LoadState::default();
    let mut now = t0();
    let mut n = 0;
    let mut timers: Vec<(TimerId, Timestamp)> = Vec::new();
    let mut sms_keys: Vec<String> = Vec::new();
    let push = |records: &mut Vec<Record>,
                state: &mut LoadState,
                now: Timestamp,
                event: InboundEvent,
                timers: &mut Vec<(TimerId, Timestamp)>,
                sms_keys: &mut Vec<String>| {
        if state.processed.contains(&event.event_id) {
            return;
        }
        let decision =
            filter(&load, state, &event, now).unwrap_or_else(|| decide(&policies, &load, state, &event, now));
        for a in &decision.actions {
            match &a.kind {
                ActionKind::SetTimer { timer_id, fire_at, .. } => timers.push((timer_id.clone(), *fire_at)),
                ActionKind::SendSms { .. } => sms_keys.push(a.key.clone()),
                _ => {}
            }
        }
        for (kind, id, payload) in [
            (event.kind().to_string(), event.event_id.to_string(), event.body.payload()),
            (DECISION_RECORDED.to_string(), decision.decision_id.clone(), serde_json::to_value(&decision).unwrap()),
        ] {
            // Through the stored form, as a store hands records up.
            let r = Record::decode(records.len() as u64 + 1, id, &kind, payload, now);
            state.apply(&r);
            records.push(r);
        }
    };
    let ev = |id: String, body: EventBody| InboundEvent {
        load_id: load.clone(),
        event_id: EventId::parse(&id).unwrap(),
        body,
    };
    push(
        &mut records,
        &mut state,
        now,
        ev(
            "load:init".into(),
            EventBody::LoadUpdate(LoadUpdate {
                client: Some("client_a".into()),
                driver_phone: Some(DRIVER.into()),
                stage: Some("in_transit".into()),
                next_stop: None,
            }),
        ),
        &mut timers,
        &mut sms_keys,
    );
    for h in happenings {
        n += 1;
        let event = match h {
            Happening::Ping(risk) => ev(
                format!("ping_{n}"),
                EventBody::LocationPing(LocationPing { at: Some(now), lat: 41.0, lon: -87.0, risk: *risk }),
            ),
            Happening::DriverSms(trouble) => ev(
                format!("sms_{n}"),
                EventBody::InboundSms(InboundSms {
                    from: DRIVER.into(),
                    body: if *trouble { "flat tire, running LATE".into() } else { "ETA 9:15".into() },
                }),
            ),
            Happening::StrangerSms => ev(
                format!("sms_{n}"),
                EventBody::InboundSms(InboundSms { from: "+15555550199".into(), body: "who is this".into() }),
            ),
            Happening::Deliver => ev(
                format!("upd_{n}"),
                EventBody::LoadUpdate(LoadUpdate { stage: Some("delivered".into()), ..Default::default() }),
            ),
            Happening::Update => ev(
                format!("upd_{n}"),
                EventBody::LoadUpdate(LoadUpdate { next_stop: Some("Gary, IN".into()), ..Default::default() }),
            ),
            Happening::Wait(m) => {
                now = add(now, Duration::from_secs(u64::from(*m) * 60));
                continue;
            }
            Happening::FailFirstSms => {
                let Some(key) = sms_keys.first().cloned() else { continue };
                ev(
                    action_outcome_event_id(&key, OutcomeStatus::Failed).to_string(),
                    EventBody::ActionOutcome(ActionOutcome {
                        outbox_id: key,
                        action_type: ActionType::SendSms,
                        status: OutcomeStatus::Failed,
                        receipt: None,
                        failure: Some("400".into()),
                        hero_channel: false,
                        internal: false,
                    }),
                )
            }
            Happening::FireTimers => {
                let due: Vec<(TimerId, Timestamp)> = timers.iter().filter(|(_, at)| *at <= now).cloned().collect();
                timers.retain(|(_, at)| *at > now);
                for (id, fire_at) in due {
                    let (_, ask_id, step) = id.parts();
                    let e = ev(
                        timer_fired_event_id(&id).to_string(),
                        EventBody::TimerFired(TimerFired { timer_id: id, ask_id, step, fire_at }),
                    );
                    push(&mut records, &mut state, now, e, &mut timers, &mut sms_keys);
                }
                continue;
            }
        };
        push(&mut records, &mut state, now, event, &mut timers, &mut sms_keys);
    }
    (records, state)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn projection_is_the_fold_of_the_log(happenings in prop::collection::vec(happening(), 0..60), split in 0usize..200) {
        let (records, live) = simulate(&happenings);
        let full = project(&records);
        // The state the runs kept step by step is the projection of what they wrote.
        prop_assert_eq!(&full, &live);
        // A snapshot at any point plus the records after it is the full fold.
        let split = split.min(records.len());
        let mut snap = project(&records[..split]);
        for r in &records[split..] { snap.apply(r); }
        prop_assert_eq!(&snap, &full);
        // Deterministic.
        prop_assert_eq!(&project(&records), &full);
    }

    #[test]
    fn projected_state_keeps_the_sop_invariants(happenings in prop::collection::vec(happening(), 0..60)) {
        let (records, state) = simulate(&happenings);
        prop_assert_eq!(state.version, records.len() as u64);
        prop_assert_eq!(state.unreadable, 0);
        // Every inbound event has its decision.
        prop_assert_eq!(&state.processed, &state.decided);
        // At most one eta_request ask open, never past max_attempts + 1.
        prop_assert!(state.open_asks().count() <= 1);
        for ask in state.asks.values() {
            prop_assert!(ask.step >= 1 && ask.step <= 4, "{:?}", ask);
            prop_assert!(ask.step_decided_at >= ask.opened_at);
            if ask.status == AskStatus::Escalated { prop_assert_eq!(ask.step, 4); }
        }
        if state.is_delivered() { prop_assert_eq!(state.open_asks().count(), 0); }
    }

    #[test]
    fn projection_never_panics_on_garbage(kinds in prop::collection::vec(prop_oneof![
            Just("load_update"), Just("location_ping"), Just("inbound_sms"), Just("timer_fired"),
            Just("action_outcome"), Just("decision_recorded"), Just("teleport")], 1..20),
        payloads in prop::collection::vec(any::<String>(), 1..20)) {
        let records: Vec<Record> = kinds.iter().zip(payloads.iter().cycle()).enumerate().map(|(i, (k, p))| Record::decode(
            i as u64 + 1, format!("e{i}"), k,
            serde_json::from_str(p).unwrap_or(serde_json::Value::String(p.clone())), t0(),
        )).collect();
        let state = project(&records);
        prop_assert_eq!(state.version, records.len() as u64);
    }
}
