//! The deterministic filter (docs/design.md): events that need no decider call.
//!
//! It runs before any decider, so no LLM call is ever made for a delivered outcome,
//! a Hero-channel or internal failure (the dispatcher has already raised an OpsAlert),
//! a stale timer, an SMS an operator already assigned to the load, an operator action
//! (decided by [`crate::operator::decide`]), the driver's STOP, START or HELP
//! ([`crate::sop::consent`]) or an SMS refused to a driver known to have opted out,
//! whichever decider the load runs under.

use crate::decision::{Decision, InboxChange, InboxState};
use crate::event::{EventBody, InboundEvent};
use crate::ids::{EventId, LoadId};
use crate::outcome::OutcomeStatus;
use crate::projection::LoadState;
use crate::time::Timestamp;

/// `Some(decision)` when the deterministic path decides (a filtered noop, or an
/// operator action's decision), `None` when the decider must.
pub fn filter(load: &LoadId, state: &LoadState, event: &InboundEvent, now: Timestamp) -> Option<Decision> {
    let why = match &event.body {
        EventBody::OperatorAction(op) => return Some(crate::operator::decide(load, state, event, op, now)),
        // The webhook's copy of an SMS an operator assigned here first (a Twilio
        // retry of a request kept as unmatched never comes here; this is the
        // defence for an SMS that reached the load both ways).
        EventBody::InboundSms(_)
            if event
                .event_id
                .as_str()
                .strip_prefix(crate::ids::TWILIO_SMS_PREFIX)
                .is_some_and(|sid| state.assigned_sms.contains(sid)) =>
        {
            format!("SMS {} was assigned to this load by an operator already", event.event_id)
        }
        // STOP, START and HELP from the driver: consent, whichever decider the load runs
        // under; any other SMS is the decider's.
        EventBody::InboundSms(sms) => return crate::sop::consent(load, state, event, sms, now),
        EventBody::ActionOutcome(o) if o.status == OutcomeStatus::Delivered => {
            return Some(delivered(state, &event.event_id, &o.outbox_id, now));
        }
        // An SMS refused because the driver opted out (Twilio's 21610, the consent
        // ledger) on a load that knew it already: its STOP asked a person, and a
        // second task would say nothing new. Its dead row leaves the inbox with it.
        EventBody::ActionOutcome(o)
            if o.status == OutcomeStatus::Failed
                && state.sms_opted_out()
                && o.failure.as_deref().is_some_and(crate::consent::refused_as_opted_out) =>
        {
            let why = format!("{} not sent: the driver opted out of SMS already, and a person was asked", o.outbox_id);
            let mut d = Decision::filtered(&event.event_id, now, why);
            d.inbox = vec![InboxChange { outbox_id: o.outbox_id.clone(), state: InboxState::Handled }];
            return Some(d);
        }
        EventBody::ActionOutcome(o) if o.hero_channel || o.internal => format!(
            "{} failed on a {} action: an OpsAlert was raised, no Hero task",
            o.outbox_id,
            if o.hero_channel { "Hero-channel" } else { "internal" }
        ),
        EventBody::TimerFired(t) => {
            let current = state.asks.get(&t.ask_id).is_some_and(|a| a.is_timer_current(t));
            if current {
                return None;
            }
            format!("timer {} is not current: its ask is resolved or past step {}", t.timer_id, t.step)
        }
        _ => return None,
    };
    Some(Decision::filtered(&event.event_id, now, why))
}

/// The filtered noop on a delivered outcome of `outbox_id`. A requeued copy
/// delivered: the dead rows it was sent again for are handled.
pub fn delivered(state: &LoadState, event_id: &EventId, outbox_id: &str, now: Timestamp) -> Decision {
    let handled = state.open_dead_in_chain(outbox_id);
    if handled.is_empty() {
        return Decision::filtered(event_id, now, format!("{outbox_id} delivered"));
    }
    let why = format!("{outbox_id} delivered; handled in the inbox: {}", handled.join(", "));
    let mut d = Decision::filtered(event_id, now, why);
    d.inbox = handled.into_iter().map(|outbox_id| InboxChange { outbox_id, state: InboxState::Handled }).collect();
    d
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::projection::{Record, project};
    use crate::testing::{PHONE, ev, load};

    fn now() -> Timestamp {
        "2026-03-02T07:40:00Z".parse().unwrap()
    }

    /// A load with an ask at step 2 (its step-1 timer passed) and SMS SM1 assigned to
    /// it by an operator.
    fn state() -> LoadState {
        let mut records: Vec<Record> = vec![];
        let init =
            ev(json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE, "stage": "in_transit"}));
        let ping =
            ev(json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}));
        for e in [init, ping, timer(1)] {
            let d = crate::sop::decide(&crate::sop::Policies::default(), &load(), &project(&records), &e, now());
            records.extend(Record::appended(records.len() as u64, &e, &d, now()));
        }
        let mut state = project(&records);
        state.assigned_sms.insert("SM1".into());
        state
    }

    fn timer(step: u32) -> InboundEvent {
        let t = format!("tmr:481207:ask:eta_request:ping_0700:{step}");
        ev(json!({"event_id": format!("evt:{t}"), "kind": "timer_fired", "timer_id": t,
                  "ask_id": "ask:eta_request:ping_0700", "step": step, "fire_at": "2026-03-02T07:30:00Z"}))
    }

    fn outcome(action_type: &str, status: &str, hero_channel: bool, internal: bool) -> InboundEvent {
        let id = format!("481207/x/{action_type}");
        ev(json!({"event_id": format!("evt:out:{id}:{status}"), "kind": "action_outcome", "outbox_id": id,
                  "action_type": action_type, "status": status, "failure": "HTTP 500",
                  "hero_channel": hero_channel, "internal": internal}))
    }

    fn sms(event_id: &str) -> InboundEvent {
        ev(json!({"event_id": event_id, "kind": "inbound_sms", "from": PHONE, "body": "ETA 9:15"}))
    }

    /// What the filter does with `event`: `None` when the decider must decide, else the
    /// filtered noop's rationale contains `want`.
    fn check(event: InboundEvent, want: Option<&str>) {
        let got = filter(&load(), &state(), &event, now());
        match (got, want) {
            (None, None) => {}
            (Some(d), Some(part)) => {
                assert!(d.filtered && d.actions.is_empty() && !d.needs_hero_task, "{}: {d:?}", event.event_id);
                assert_eq!(d.decider, "filter");
                assert!(d.rationale.contains(part), "{}: {}", event.event_id, d.rationale);
            }
            (got, want) => panic!("{}: got {got:?}, want {want:?}", event.event_id),
        }
    }

    #[test]
    fn the_filter_stops_only_what_needs_no_decider() {
        // The webhook's copy of an SMS an operator assigned here first; another SMS, or
        // the same SMS under an id that is not the webhook's, goes to the decider.
        check(sms("sms:SM1"), Some("assigned to this load by an operator already"));
        check(sms("sms:SM2"), None);
        check(sms("SM1"), None);
        // Outcomes: every delivered one, and a failure of a Hero-channel or internal
        // action (an OpsAlert, never a Hero task); an external failure is the decider's.
        check(outcome("send_sms", "delivered", false, false), Some("481207/x/send_sms delivered"));
        check(outcome("set_timer", "delivered", false, true), Some("delivered"));
        check(outcome("create_hero_task", "failed", true, false), Some("on a Hero-channel action"));
        check(outcome("cancel_timer", "failed", false, true), Some("internal action: an OpsAlert was raised"));
        check(outcome("send_sms", "failed", false, false), None);
        // Timers: the current one (step 2) is the decider's; a passed step's is stale.
        check(timer(2), None);
        check(timer(1), Some("is not current"));
        check(timer(3), Some("is not current"));
        // An operator's action is decided here too, by the operator's rules, whatever
        // the load's decider: not filtered, and never the decider's.
        let resolve = ev(json!({"event_id": "op:r1", "kind": "operator_action", "actor": "ana", "reason": "called",
                                "command": {"type": "resolve_ask", "ask_id": "ask:eta_request:ping_0700"}}));
        let d = filter(&load(), &state(), &resolve, now()).expect("the operator's rules decide");
        assert_eq!((d.decider.as_str(), d.filtered), ("operator", false), "{d:?}");
        // Anything else is the decider's.
        check(
            ev(json!({"event_id": "ping_0800", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"})),
            None,
        );
        check(ev(json!({"event_id": "u1", "kind": "load_update", "stage": "delivered"})), None);
    }

    /// An SMS refused as opted out is the decider's on a load that did not know (its
    /// SMS-failed rule asks a person), and a filtered noop, its row handled, on one
    /// that knew: the STOP asked a person already.
    #[test]
    fn a_refusal_of_a_driver_known_to_have_opted_out_is_a_noop() {
        let refused = |failure: &str| {
            let id = "481207/ask:eta_request:ping_0700/2/send_sms";
            ev(json!({"event_id": format!("evt:out:{id}:failed"), "kind": "action_outcome", "outbox_id": id,
                      "action_type": "send_sms", "status": "failed", "failure": failure,
                      "hero_channel": false, "internal": false}))
        };
        let ledger = crate::consent::ledger_refusal("sms:SMstop", now());
        let twilio = "HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient";
        let mut knew = state();
        knew.sms_opt_out =
            Some(crate::projection::SmsOptOut { phone: PHONE.into(), event_id: "sms:SMstop".into(), at: Some(now()) });
        for failure in [ledger.as_str(), twilio] {
            assert_eq!(filter(&load(), &state(), &refused(failure), now()), None, "{failure}");
            let d = filter(&load(), &knew, &refused(failure), now()).expect("a noop");
            assert!(d.filtered && d.actions.is_empty(), "{d:?}");
            assert!(d.rationale.contains("opted out of SMS already"), "{}", d.rationale);
            let handled = InboxChange {
                outbox_id: "481207/ask:eta_request:ping_0700/2/send_sms".into(),
                state: InboxState::Handled,
            };
            assert_eq!(d.inbox, [handled]);
        }
        assert_eq!(filter(&load(), &knew, &refused("HTTP 400: twilio error 21211: invalid To"), now()), None);
    }
}
