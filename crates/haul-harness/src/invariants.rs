//! What must hold after any run, whatever failed on the way: one checker for the eval
//! runner, the simulator and the crash test, so the three can never disagree about what
//! "nothing lost, nothing done twice" means.
//!
//! Pure functions over what a run left behind (a load's log and outbox rows, and the
//! effects the channel services saw), each returning the first [`Violation`]. Callers
//! pick the checks their setting allows: an eval checks after every step, when rows may
//! still be pending; the simulator and the crash test check once everything drained.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use haul_core::Channel;
use haul_core::OutcomeStatus;
use haul_core::action::{ActionType, ChannelClass};
use haul_core::decision::DECISION_RECORDED;
use haul_core::event::{EventBody, EventKind};
use haul_core::ids::{EventId, LoadId, action_outcome_event_id, decision_entry_id, ops_alert_key};
use haul_core::projection::Record;
use haul_core::time::Timestamp;

use haul_store::{AlertState, Outbox, OutboxRow, OutboxStatus, RowCursor, StoreError};

/// The rule a run broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    /// Every inbound event published or accepted is in the log exactly once.
    EventLoggedOnce,
    /// Every inbound entry is followed by exactly one `decision_recorded` for it.
    DecisionFollows,
    /// No channel service got one idempotency key with two different payloads.
    OnePayloadPerKey,
    /// No Hero task for the outcome of a Hero-channel or internal action.
    NoHeroTaskForInfrastructure,
    /// `seq` runs 1, 2, 3… with no gap.
    GaplessLog,
    /// A timer's `timer_fired` is logged once.
    TimerFiredOnce,
    /// After a drain, no outbox row is still pending.
    NothingPending,
    /// A dispatched row reached its service once and its delivered outcome is logged.
    DispatchedOnce,
    /// A dead row has its failed outcome logged (external) or its OpsAlert delivered, or
    /// refused by the ops service and recorded so (the rest); or, buried because it could
    /// not be marked after its send, its delivered outcome logged.
    DeadRowSettled,
    /// An operator's requeue re-drives a dead row of its load, and a dead row is
    /// requeued at most once however many requests ask.
    RequeuedOnce,
    /// A channel with a send rate saw no more calls in any second than the rate allows.
    SendRateKept,
    /// No `send_sms` was decided to a phone that had opted out of SMS.
    NoSmsAfterOptOut,
    /// An event accepted in a trace is logged in that trace, and so is its decision:
    /// whichever run appended them (after a crash and a redelivery too) continued it.
    TraceContinued,
    /// No span is exported twice (a redelivery's run is a span of its own).
    SpanExportedOnce,
}

impl Invariant {
    /// The name a scenario failure carries: `invariant N` for the four a scenario
    /// file promises, the rule's own name for the rest.
    pub fn key(self) -> &'static str {
        match self {
            Invariant::EventLoggedOnce => "invariant 1",
            Invariant::DecisionFollows => "invariant 2",
            Invariant::OnePayloadPerKey => "invariant 3",
            Invariant::NoHeroTaskForInfrastructure => "invariant 4",
            Invariant::GaplessLog => "gapless log",
            Invariant::TimerFiredOnce => "timer fired once",
            Invariant::NothingPending => "nothing pending",
            Invariant::DispatchedOnce => "dispatched once",
            Invariant::DeadRowSettled => "dead row settled",
            Invariant::RequeuedOnce => "requeued once",
            Invariant::SendRateKept => "send rate kept",
            Invariant::NoSmsAfterOptOut => "no sms after opt-out",
            Invariant::TraceContinued => "trace continued",
            Invariant::SpanExportedOnce => "span exported once",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant.key(), self.message)
    }
}

impl std::error::Error for Violation {}

fn broke(invariant: Invariant, message: String) -> Result<(), Violation> {
    Err(Violation { invariant, message })
}

/// Calls (`at`, in any order) under a limit of `rate` with no burst: no interval of
/// the rate holds more than two calls, one the limit granted and one granted before a
/// clock jump that reached the service after it (a simulator's clock moves while a
/// batch is sent), as for [`sends_within_rate`].
pub fn sends_spaced(what: &str, at: &[Timestamp], rate: &haul_core::limit::Rate) -> Result<(), Violation> {
    let mut at = at.to_vec();
    at.sort();
    let interval = Duration::from_micros(rate.interval_us() as u64);
    for three in at.windows(3) {
        if haul_core::time::since(three[2], three[0]) < interval {
            return broke(
                Invariant::SendRateKept,
                format!(
                    "{what} calls at {}, {} and {}: the rate {rate} allows two within {interval:?}",
                    three[0], three[1], three[2]
                ),
            );
        }
    }
    Ok(())
}

/// A channel's calls (`at`, in any order) under `limit`: no window of one second holds
/// more than the burst, the rate's sends in a second, and `in_flight` more (sends
/// granted before a clock jump that reach the service after it, in a simulator whose
/// clock moves while a batch is sent).
pub fn sends_within_rate(
    channel: &str,
    at: &[Timestamp],
    limit: &haul_core::limit::Limit,
    in_flight: u32,
) -> Result<(), Violation> {
    let mut at = at.to_vec();
    at.sort();
    let per_second = limit.rate.per_second().ceil() as usize;
    let allowed = limit.burst as usize + per_second + in_flight as usize;
    let second = Duration::from_secs(1);
    let mut end = 0;
    for (i, start) in at.iter().enumerate() {
        let until = haul_core::time::add(*start, second);
        end = end.max(i);
        while end < at.len() && at[end] < until {
            end += 1;
        }
        if end - i > allowed {
            return broke(
                Invariant::SendRateKept,
                format!(
                    "{} {channel} calls in the second from {start}: the rate {} (burst {}) allows {allowed}",
                    end - i,
                    limit.rate,
                    limit.burst
                ),
            );
        }
    }
    Ok(())
}

/// Invariant 1 for one load: each of `events` (inbound event ids) is in `log` once.
pub fn events_logged_once<'a>(
    load: &LoadId,
    log: &[Record],
    events: impl IntoIterator<Item = &'a str>,
) -> Result<(), Violation> {
    for id in events {
        let n = log.iter().filter(|r| r.entry_id == id).count();
        if n != 1 {
            return broke(Invariant::EventLoggedOnce, format!("event {id} of load {load} is in the log {n} times"));
        }
    }
    Ok(())
}

/// Each of `traced` (an event id and the trace id, 32 hex digits, it was accepted in) is
/// logged in that trace, with its decision.
pub fn traces_continued<'a>(
    load: &LoadId,
    log: &[Record],
    traced: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), Violation> {
    for (event_id, trace_id) in traced {
        let decision = EventId::parse(event_id).ok().map(|e| decision_entry_id(&e));
        for r in log.iter().filter(|r| r.entry_id == event_id || Some(&r.entry_id) == decision.as_ref()) {
            let kept = r.trace.map(|t| t.trace_id_hex());
            if kept.as_deref() != Some(trace_id) {
                return broke(
                    Invariant::TraceContinued,
                    format!(
                        "record {} of load {load} is in trace {}, not the trace {trace_id} its event came in",
                        r.entry_id,
                        kept.as_deref().unwrap_or("(none)")
                    ),
                );
            }
        }
    }
    Ok(())
}

/// What `spans_continued` counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpanCounts {
    pub spans: usize,
    /// Processes (`process.pid`) that exported spans.
    pub processes: usize,
    /// Worker runs (CONSUMER spans) of accepted events.
    pub runs: usize,
    /// Accepted events run by two or more processes (a run killed, the next elsewhere).
    pub events_run_by_several: usize,
    /// Accepted events with no exported run (a `kill -9` took it before export).
    pub events_without_a_run: usize,
}

/// The spans exported across crashes: none twice, and every worker run of an accepted
/// event (`accepted`: `(load, event id)` to the trace id it came in) in that event's
/// trace, whichever process ran it.
pub fn spans_continued(
    spans: &[crate::testkit_otlp::ReceivedSpan],
    accepted: &std::collections::HashMap<(String, String), String>,
) -> Result<SpanCounts, Violation> {
    let mut seen = HashSet::new();
    for s in spans {
        if !seen.insert((s.trace_id.as_str(), s.span_id.as_str())) {
            let message = format!("span {} of trace {} was exported twice", s.span_id, s.trace_id);
            return Err(Violation { invariant: Invariant::SpanExportedOnce, message });
        }
    }
    let mut run_by: std::collections::HashMap<(&str, &str), HashSet<&str>> = std::collections::HashMap::new();
    for s in spans.iter().filter(|s| s.kind == "CONSUMER") {
        let (Some(load), Some(event)) = (s.attr("haul.load_id"), s.attr("messaging.message.id")) else { continue };
        let Some(trace) = accepted.get(&(load.to_owned(), event.to_owned())) else { continue };
        if &s.trace_id != trace {
            let message = format!(
                "a run of event {event} of load {load} is in trace {}, not the trace {trace} it came in",
                s.trace_id
            );
            return Err(Violation { invariant: Invariant::TraceContinued, message });
        }
        run_by.entry((load, event)).or_default().insert(s.pid.as_str());
    }
    Ok(SpanCounts {
        spans: spans.len(),
        processes: spans.iter().map(|s| s.pid.as_str()).collect::<HashSet<_>>().len(),
        runs: run_by.values().map(HashSet::len).sum(),
        events_run_by_several: run_by.values().filter(|p| p.len() > 1).count(),
        events_without_a_run: accepted.len() - run_by.len(),
    })
}

/// The checks on one load's log alone: invariants 2 and 4, a gapless `seq`, and each
/// timer fired once.
pub fn log_is_sound(load: &LoadId, log: &[Record]) -> Result<(), Violation> {
    if let Some(r) = log.iter().enumerate().find(|(i, r)| r.seq != *i as u64 + 1).map(|(_, r)| r) {
        return broke(Invariant::GaplessLog, format!("the log of load {load} has a gap in seq at {}", r.seq));
    }
    for (i, r) in log.iter().enumerate().filter(|(_, r)| r.kind() != DECISION_RECORDED) {
        let decision = EventId::parse(&r.entry_id).ok().map(|e| decision_entry_id(&e));
        let is_decision = |n: &Record| n.kind() == DECISION_RECORDED && Some(&n.entry_id) == decision.as_ref();
        let next = log.get(i + 1).is_some_and(is_decision);
        if !next || log.iter().filter(|n| is_decision(n)).count() != 1 {
            return broke(
                Invariant::DecisionFollows,
                format!("event {} of load {load} is not followed by exactly one decision", r.entry_id),
            );
        }
    }
    for (i, r) in log.iter().enumerate() {
        let infrastructure =
            matches!(r.event(), Some((_, EventBody::ActionOutcome(o))) if o.hero_channel || o.internal);
        let hero_task = log
            .get(i + 1)
            .and_then(Record::decision)
            .is_some_and(|d| d.actions.iter().any(|a| a.action_type() == ActionType::CreateHeroTask));
        if infrastructure && hero_task {
            return broke(
                Invariant::NoHeroTaskForInfrastructure,
                format!(
                    "a Hero task was created for {} of load {load} (a Hero-channel or internal outcome)",
                    r.entry_id
                ),
            );
        }
    }
    // The state each decision was made on: the log up to its event.
    let mut state = haul_core::projection::LoadState::default();
    for r in log {
        if let Some(d) = r.decision() {
            let opted_out = state.sms_opt_out.as_ref().map(|o| o.phone.as_str());
            let to_opted_out = d.actions.iter().find(
                |a| matches!(&a.kind, haul_core::ActionKind::SendSms { to, .. } if Some(to.as_str()) == opted_out),
            );
            if let Some(a) = to_opted_out {
                return broke(
                    Invariant::NoSmsAfterOptOut,
                    format!("{} of load {load} was decided to a phone that opted out of SMS", a.key),
                );
            }
        }
        state.apply(r);
    }
    let mut fired = BTreeSet::new();
    for r in log.iter().filter(|r| r.kind() == EventKind::TimerFired.as_str()) {
        if !fired.insert(&r.entry_id) {
            return broke(Invariant::TimerFiredOnce, format!("{} is in the log of load {load} twice", r.entry_id));
        }
    }
    Ok(())
}

/// Invariant 3: `conflicts` are the `"{channel} {key}"`s a service saw with two payloads.
pub fn one_payload_per_key(conflicts: &[String]) -> Result<(), Violation> {
    match conflicts.first() {
        Some(c) => broke(Invariant::OnePayloadPerKey, format!("{c} reached its service twice with different payloads")),
        None => Ok(()),
    }
}

/// The outbox ids whose OpsAlert the ops service refused, as the store recorded them
/// (at most `max_pages` pages of 1000), for [`outbox_settled`].
pub async fn refused_alerts(store: &dyn Outbox, max_pages: usize) -> Result<BTreeSet<String>, StoreError> {
    let (mut refused, mut after) = (BTreeSet::new(), RowCursor::start());
    for _ in 0..max_pages {
        let page = store.ops_alerts(&after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = last.cursor();
        refused.extend(page.into_iter().filter(|a| a.state == AlertState::Refused).map(|a| a.outbox_id));
    }
    Ok(refused)
}

/// After a drain: no row pending; a dispatched row had one effect at its service and
/// its delivered outcome is in `log`; a dead row has its failed outcome (external
/// actions) or its OpsAlert (Hero-channel and internal ones: delivered, or `refused`
/// by the ops service, which [`refused_alerts`] reads from the store), or, when it was
/// buried because its mark kept failing after the send, its delivered outcome.
/// actions) or its OpsAlert (Hero-channel and internal ones). `deduped_effects(channel,
/// key)` counts the effects a key had at a channel service that dedupes on it: a key
/// may be sent more than once (crashes, lapsed leases, lost answers are allowed to
/// resend), and the service keeps it to one effect. So "one" here means "reached the
/// service and was kept to one", not "sent once".
pub fn outbox_settled(
    load: &LoadId,
    log: &[Record],
    rows: &[OutboxRow],
    refused: &BTreeSet<String>,
    deduped_effects: impl Fn(Channel, &str) -> usize,
) -> Result<(), Violation> {
    let logged = |id: EventId| log.iter().any(|r| r.entry_id == id.as_str());
    for row in rows {
        match row.status {
            OutboxStatus::Pending => {
                return broke(
                    Invariant::NothingPending,
                    format!("outbox row {} of load {load} is still pending", row.id),
                );
            }
            OutboxStatus::Dispatched => {
                if let Some(c) = row.action_type.channel() {
                    let n = deduped_effects(c, &row.id);
                    if n != 1 {
                        let service = c.config_name();
                        return broke(
                            Invariant::DispatchedOnce,
                            format!(
                                "dispatched row {} of load {load} has {n} effects at the {service} service (which dedupes on the key)",
                                row.id
                            ),
                        );
                    }
                }
                if !logged(action_outcome_event_id(&row.id, OutcomeStatus::Delivered)) {
                    return broke(
                        Invariant::DispatchedOnce,
                        format!("dispatched row {} of load {load} has no delivered outcome in the log", row.id),
                    );
                }
            }
            OutboxStatus::Dead => {
                let settled = logged(action_outcome_event_id(&row.id, OutcomeStatus::Delivered))
                    || match row.action_type.class() {
                        ChannelClass::External => logged(action_outcome_event_id(&row.id, OutcomeStatus::Failed)),
                        ChannelClass::HeroChannel | ChannelClass::Internal => {
                            deduped_effects(Channel::Ops, &ops_alert_key(&row.id)) == 1 || refused.contains(&row.id)
                        }
                    };
                if !settled {
                    return broke(
                        Invariant::DeadRowSettled,
                        format!("dead row {} of load {load} has neither its failed outcome nor an OpsAlert", row.id),
                    );
                }
            }
            OutboxStatus::Superseded => {
                // Settled unsent only because a later step of its own ask is on the load.
                let ask_step =
                    |r: &OutboxRow| (r.action.get("ask_id").cloned(), r.action.get("step").and_then(|s| s.as_u64()));
                let (ask, step) = ask_step(row);
                let later = rows.iter().any(|r| {
                    let (a, s) = ask_step(r);
                    ask.is_some() && a == ask && s > step
                });
                if !later {
                    return broke(
                        Invariant::NothingPending,
                        format!("row {} of load {load} was superseded with no later step of its ask", row.id),
                    );
                }
            }
        }
    }
    Ok(())
}

/// Operator requeues among one load's outbox rows: each row whose action says
/// `requeue_of` names a dead row of the same load, and no dead row is named twice.
pub fn requeued_once(load: &LoadId, rows: &[OutboxRow]) -> Result<(), Violation> {
    let mut named = BTreeSet::new();
    for row in rows {
        let Some(dead) = row.action.get("requeue_of").and_then(|v| v.as_str()) else { continue };
        if !named.insert(dead) {
            return broke(Invariant::RequeuedOnce, format!("dead row {dead} of load {load} was requeued twice"));
        }
        if !rows.iter().any(|r| r.id == dead && r.status == OutboxStatus::Dead) {
            return broke(
                Invariant::RequeuedOnce,
                format!("row {} of load {load} requeues {dead}, which is not a dead row of the load", row.id),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use haul_core::action::{Action, ActionKind, Urgency};
    use haul_core::decision::Decision;
    use haul_core::event::ActionOutcome;
    use haul_core::projection::Entry;
    use serde_json::json;

    use super::*;

    fn load() -> LoadId {
        LoadId::parse("481207").unwrap()
    }

    #[test]
    fn a_second_with_more_calls_than_the_rate_allows_is_caught() {
        let limit = haul_core::limit::Limit::new(haul_core::limit::Rate::parse("2/s").unwrap(), 3).unwrap();
        let ms = |m: &[u64]| -> Vec<Timestamp> {
            let t0: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
            m.iter().map(|m| haul_core::time::add(t0, Duration::from_millis(*m))).collect()
        };
        let check = |calls: &[u64], in_flight: u32, ok: bool| {
            let got = sends_within_rate("sms", &ms(calls), &limit, in_flight);
            assert_eq!(got.is_ok(), ok, "{calls:?} +{in_flight}: {got:?}");
        };
        // Burst 3 and 2 a second: 5 in any second.
        check(&[0, 0, 0, 500, 999], 0, true);
        check(&[0, 0, 0, 500, 999, 999], 0, false);
        check(&[999, 0, 0, 500, 0, 999], 1, true);
        // Any second, not only whole ones: 100 ms to 1.1 s holds six.
        check(&[100, 500, 999, 1000, 1000, 1001], 0, false);
        check(&[0, 0, 0, 1000, 1000, 1000, 2000, 2000, 2000], 0, true);
        check(&[], 0, true);
        let v = sends_within_rate("sms", &ms(&[0; 7]), &limit, 1).unwrap_err();
        assert_eq!(v.invariant, Invariant::SendRateKept);
        assert!(v.message.starts_with("7 sms calls in the second from 2026-03-02T07:00:00Z"), "{v}");
        assert!(v.message.ends_with("allows 6"), "{v}");
    }

    fn rec(seq: u64, entry_id: &str, entry: Entry) -> Record {
        Record {
            seq,
            entry_id: entry_id.into(),
            entry,
            recorded_at: "2026-03-02T07:00:00Z".parse().unwrap(),
            trace: None,
        }
    }

    /// A record of `kind` this build need not read: the checks go by kind and id.
    fn of_kind(seq: u64, entry_id: &str, kind: &str) -> Record {
        rec(seq, entry_id, Entry::Unreadable { kind: kind.into(), payload: json!({}), reason: "a test".into() })
    }

    fn decision(seq: u64, event: &str, actions: &[ActionType]) -> Record {
        let event_id = EventId::parse(event).unwrap();
        let actions = actions
            .iter()
            .map(|t| Action {
                key: format!("481207/{event}/{}", t.as_str()),
                kind: match t {
                    ActionType::SendSms => ActionKind::SendSms { to: "+15555550100".into(), body: "ETA?".into() },
                    _ => ActionKind::CreateHeroTask { title: "t".into(), body: "b".into(), urgency: Urgency::Normal },
                },
                ask_id: None,
                step: None,
                requeue_of: None,
            })
            .collect();
        let at = "2026-03-02T07:00:00Z".parse().unwrap();
        rec(seq, &format!("dec:{event}"), Entry::Decision(Decision::new(&event_id, at, "sop", actions, vec![], "why")))
    }

    /// The invariant `log` breaks, if any.
    fn check(log: Vec<Record>, expected: Option<Invariant>) {
        let got = log_is_sound(&load(), &log).err().map(|v| v.invariant);
        assert_eq!(got, expected, "{log:#?}");
    }

    #[test]
    fn logs() {
        let ping = |seq| of_kind(seq, "ping_1", "location_ping");
        check(vec![ping(1), decision(2, "ping_1", &[ActionType::SendSms])], None);
        check(vec![ping(1)], Some(Invariant::DecisionFollows));
        check(vec![ping(1), decision(3, "ping_1", &[])], Some(Invariant::GaplessLog));
        check(vec![ping(1), decision(2, "ping_1", &[]), decision(3, "ping_1", &[])], Some(Invariant::DecisionFollows));
        let outcome = ActionOutcome {
            outbox_id: "481207/x/create_hero_task".into(),
            action_type: ActionType::CreateHeroTask,
            status: OutcomeStatus::Failed,
            receipt: None,
            failure: Some("HTTP 500".into()),
            hero_channel: true,
            internal: false,
        };
        let id = "evt:out:481207/x/create_hero_task:failed";
        let event_id = EventId::parse(id).unwrap();
        let infra = rec(1, id, Entry::Event { event_id, body: EventBody::ActionOutcome(outcome) });
        check(
            vec![infra.clone(), decision(2, "evt:out:481207/x/create_hero_task:failed", &[ActionType::CreateHeroTask])],
            Some(Invariant::NoHeroTaskForInfrastructure),
        );
        check(vec![infra, decision(2, "evt:out:481207/x/create_hero_task:failed", &[])], None);
        let fired = |seq| of_kind(seq, "evt:tmr:481207:a:1", "timer_fired");
        let dec = |seq| decision(seq, "evt:tmr:481207:a:1", &[]);
        check(vec![fired(1), dec(2), fired(3), dec(4)], Some(Invariant::DecisionFollows));
        // An SMS decided to a phone after its STOP, and after its START.
        let event = |seq, id: &str, v: serde_json::Value| {
            let e = haul_core::InboundEvent::from_json(load(), v).unwrap();
            rec(seq, id, Entry::Event { event_id: e.event_id.clone(), body: e.body })
        };
        let init = event(
            1,
            "load:init",
            json!({"event_id": "load:init", "kind": "load_update", "driver_phone": "+15555550100"}),
        );
        let sms = |seq, id: &str, body: &str| {
            event(seq, id, json!({"event_id": id, "kind": "inbound_sms", "from": "+15555550100", "body": body}))
        };
        let opted_out =
            vec![init, decision(2, "load:init", &[]), sms(3, "sms:SM1", "STOP"), decision(4, "sms:SM1", &[])];
        let ping = |seq| of_kind(seq, "ping_1", "location_ping");
        let texted = [ping(5), decision(6, "ping_1", &[ActionType::SendSms])];
        check([opted_out.clone(), texted.to_vec()].concat(), Some(Invariant::NoSmsAfterOptOut));
        let started = [sms(5, "sms:SM2", "START"), decision(6, "sms:SM2", &[])];
        let texted = [ping(7), decision(8, "ping_1", &[ActionType::SendSms])];
        check([opted_out, started.to_vec(), texted.to_vec()].concat(), None);
    }

    #[test]
    fn events_and_rows() {
        let log = vec![of_kind(1, "ping_1", "location_ping"), decision(2, "ping_1", &[])];
        assert!(events_logged_once(&load(), &log, ["ping_1"]).is_ok());
        let lost = events_logged_once(&load(), &log, ["sms_1"]).unwrap_err();
        assert_eq!(lost.invariant, Invariant::EventLoggedOnce);
        assert_eq!(one_payload_per_key(&["sms k".into()]).unwrap_err().invariant, Invariant::OnePayloadPerKey);

        let at = "2026-03-02T07:00:00Z".parse().unwrap();
        let row = |status, action_type| OutboxRow {
            id: "481207/ping_1/create_hero_task".into(),
            load_id: load(),
            action_type,
            action: json!({}),
            status,
            attempts: 0,
            due_at: at,
            first_attempt_at: None,
            claim_token: None,
            lease_until: None,
            last_failure: None,
            receipt: None,
            created_at: at,
            updated_at: at,
            trace: None,
        };
        let none = BTreeSet::new();
        let settled = |rows: &[OutboxRow], n: usize| {
            outbox_settled(&load(), &log, rows, &none, |_, _| n).err().map(|v| v.invariant)
        };
        assert_eq!(settled(&[row(OutboxStatus::Pending, ActionType::SendSms)], 1), Some(Invariant::NothingPending));
        // Two effects, or none, for one dispatched row: both are broken.
        let dispatched = [row(OutboxStatus::Dispatched, ActionType::CreateHeroTask)];
        assert_eq!(settled(&dispatched, 2), Some(Invariant::DispatchedOnce));
        assert_eq!(settled(&dispatched, 0), Some(Invariant::DispatchedOnce));
        // The effect is there but no delivered outcome is logged.
        assert_eq!(settled(&dispatched, 1), Some(Invariant::DispatchedOnce));
        // A dead Hero task needs its OpsAlert.
        let dead = [row(OutboxStatus::Dead, ActionType::CreateHeroTask)];
        assert_eq!(settled(&dead, 0), Some(Invariant::DeadRowSettled));
        assert_eq!(settled(&dead, 1), None);
        // Or its OpsAlert refused, as the store recorded it.
        let refused = BTreeSet::from([dead[0].id.clone()]);
        assert!(outbox_settled(&load(), &log, &dead, &refused, |_, _| 0).is_ok());
        // Or, buried because it could not be marked after its send, its delivered outcome.
        let delivered = vec![
            of_kind(1, "evt:out:481207/ping_1/create_hero_task:delivered", "action_outcome"),
            decision(2, "evt:out:481207/ping_1/create_hero_task:delivered", &[]),
        ];
        assert!(outbox_settled(&load(), &delivered, &dead, &none, |_, _| 0).is_ok());

        // Requeues: each of a dead row of the load, once.
        let requeue = |id: &str, of: &str| OutboxRow {
            id: id.into(),
            action: json!({"requeue_of": of}),
            ..row(OutboxStatus::Dispatched, ActionType::CreateHeroTask)
        };
        let once = |rows: &[OutboxRow]| requeued_once(&load(), rows).err().map(|v| v.invariant);
        let dead = row(OutboxStatus::Dead, ActionType::CreateHeroTask);
        let first = requeue("481207/op:r1/create_hero_task", &dead.id);
        assert_eq!(once(&[dead.clone(), first.clone()]), None);
        let second = requeue("481207/op:r2/create_hero_task", &dead.id);
        assert_eq!(once(&[dead.clone(), first.clone(), second]), Some(Invariant::RequeuedOnce));
        assert_eq!(once(std::slice::from_ref(&first)), Some(Invariant::RequeuedOnce), "no such dead row");
        let live = row(OutboxStatus::Dispatched, ActionType::CreateHeroTask);
        assert_eq!(once(&[live, first]), Some(Invariant::RequeuedOnce), "not dead");
    }

    #[test]
    fn an_event_and_its_decision_logged_in_another_trace_are_caught() {
        let (given, other) = ("4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c");
        let traced = |id: &str| haul_core::trace::TraceParent::parse(&format!("00-{id}-00f067aa0ba902b7-01"));
        let log = |event: Option<&str>, decision: Option<&str>| {
            vec![
                of_kind(1, "p1", "location_ping").with_trace(event.and_then(traced)),
                of_kind(2, "dec:p1", DECISION_RECORDED).with_trace(decision.and_then(traced)),
                of_kind(3, "p2", "location_ping"),
            ]
        };
        let check = |log: Vec<Record>| traces_continued(&load(), &log, [("p1", given)]);
        assert!(check(log(Some(given), Some(given))).is_ok());
        let v = check(log(Some(given), Some(other))).unwrap_err();
        assert_eq!(v.invariant, Invariant::TraceContinued);
        assert_eq!(
            v.message,
            format!("record dec:p1 of load 481207 is in trace {other}, not the trace {given} its event came in")
        );
        let v = check(log(None, Some(given))).unwrap_err();
        assert!(v.message.starts_with("record p1 of load 481207 is in trace (none)"), "{v}");
        // An event accepted without a trace is not checked.
        assert!(traces_continued(&load(), &log(None, None), []).is_ok());
    }
}

#[cfg(test)]
mod span_tests {
    use std::collections::HashMap;

    use super::*;
    use crate::testkit_otlp::ReceivedSpan;

    fn run(trace: &str, span: &str, event: &str, pid: &str) -> ReceivedSpan {
        ReceivedSpan {
            trace_id: trace.into(),
            span_id: span.into(),
            parent_span_id: String::new(),
            name: "process loads".into(),
            kind: "CONSUMER".into(),
            links: vec![],
            attributes: [("haul.load_id", "C1"), ("messaging.message.id", event)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            error: false,
            start_unix_nano: 0,
            end_unix_nano: 0,
            service: "haul".into(),
            role: "worker".into(),
            pid: pid.into(),
        }
    }

    #[test]
    fn a_span_exported_twice_or_a_run_in_another_trace_is_caught() {
        let (t1, t2) = ("4bf92f3577b34da6a3ce929d0e0e4736", "0af7651916cd43dd8448eb211c80319c");
        let accepted: HashMap<(String, String), String> =
            [(("C1".to_owned(), "p1".to_owned()), t1.to_owned()), (("C1".to_owned(), "p2".to_owned()), t2.to_owned())]
                .into();
        let counts = spans_continued(
            &[run(t1, "a1", "p1", "10"), run(t1, "a2", "p1", "11"), run(t2, "a3", "evt:x", "11")],
            &accepted,
        )
        .unwrap();
        assert_eq!(
            counts,
            SpanCounts { spans: 3, processes: 2, runs: 2, events_run_by_several: 1, events_without_a_run: 1 }
        );
        let v = spans_continued(&[run(t1, "a1", "p1", "10"), run(t1, "a1", "p1", "10")], &accepted).unwrap_err();
        assert_eq!(
            (v.invariant, v.message.as_str()),
            (Invariant::SpanExportedOnce, format!("span a1 of trace {t1} was exported twice").as_str())
        );
        let v = spans_continued(&[run(t2, "a1", "p1", "10")], &accepted).unwrap_err();
        assert_eq!(v.invariant, Invariant::TraceContinued);
        assert!(v.message.starts_with(&format!("a run of event p1 of load C1 is in trace {t2}")), "{v}");
    }
}
