//! The deterministic filter (docs/design.md): events that need no decider call.
//!
//! It runs before any decider, so no LLM call is ever made for a delivered outcome,
//! a Hero-channel or internal failure (the dispatcher has already raised an OpsAlert),
//! or a stale timer.

use crate::decision::Decision;
use crate::event::{EventBody, InboundEvent};
use crate::outcome::OutcomeStatus;
use crate::projection::LoadState;
use crate::time::Timestamp;

/// `Some(filtered noop)` when the filter decides, `None` when the decider must.
pub fn filter(state: &LoadState, event: &InboundEvent, now: Timestamp) -> Option<Decision> {
    let why = match &event.body {
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
