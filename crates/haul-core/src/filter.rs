//! The deterministic filter (docs/design.md): events that need no decider call.
//!
//! It runs before any decider, so no LLM call is ever made for a delivered outcome,
//! a Hero-channel or internal failure (the dispatcher has already raised an OpsAlert),
//! a stale timer, an SMS an operator already assigned to the load, or an operator
//! action (decided by [`crate::operator::decide`], whichever decider the load runs under).

use crate::decision::Decision;
use crate::event::{EventBody, InboundEvent};
use crate::ids::LoadId;
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
        EventBody::ActionOutcome(o) if o.status == OutcomeStatus::Delivered => {
            format!("{} delivered", o.outbox_id)
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
