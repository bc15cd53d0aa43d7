//! Validation of a decision before it is appended (issue: "validate the decision").
//!
//! A decider's output is untrusted (an LLM's especially): every key must be exactly
//! the key docs/design.md derives for its action, SMS goes only to the driver's phone, and
//! bounds hold. A decision that fails here is replaced by the fallback decision.

use std::collections::BTreeSet;

use crate::action::{ActionKind, ActionType};
use crate::decision::Decision;
use crate::event::{EventBody, InboundEvent, OperatorAction, OperatorCommand};
use crate::ids::{LoadId, TimerId, ask_action_key, event_action_key, fallback_action_key};
use crate::operator::OPERATOR_DECIDER;
use crate::projection::LoadState;

/// Most actions one decision may carry.
pub const MAX_ACTIONS: usize = 16;

pub fn validate_decision(load: &LoadId, state: &LoadState, event: &InboundEvent, d: &Decision) -> Result<(), String> {
    if d.event_id != event.event_id {
        return Err(format!("decision is for event {} but the event is {}", d.event_id, event.event_id));
    }
    if d.actions.len() > MAX_ACTIONS {
        return Err(format!("{} actions (at most {MAX_ACTIONS})", d.actions.len()));
    }
    // The driver's phone as of this event (a load_update may set it).
    let driver_phone = match &event.body {
        EventBody::LoadUpdate(u) if u.driver_phone.is_some() => u.driver_phone.as_deref(),
        _ => state.driver_phone.as_deref(),
    };
    let mut keys = BTreeSet::new();
    for a in &d.actions {
        let t = a.action_type();
        if !keys.insert(a.key.as_str()) {
            return Err(format!("action key {} appears twice", a.key));
        }
        let requeued = match (&a.requeue_of, &event.body) {
            (None, _) => None,
            (
                Some(dead),
                EventBody::OperatorAction(OperatorAction {
                    command: OperatorCommand::Requeue { outbox_id, .. }, ..
                }),
            ) if outbox_id == dead && d.decider == OPERATOR_DECIDER => Some(dead),
            (Some(dead), _) => {
                return Err(format!("action {} claims to requeue {dead}, which this event does not", a.key));
            }
        };
        let expected = match (&a.ask_id, a.step) {
            // An operator's copy of a dead row's action: keyed by the operator's event,
            // whatever ask it belongs to (the dead row keeps the ask's key).
            _ if requeued.is_some() => event_action_key(load, &event.event_id, t.as_str()),
            (Some(ask), Some(step)) if step >= 1 => ask_action_key(load, ask, step, t.as_str()),
            (None, None) if d.decider == "fallback" && t == ActionType::CreateHeroTask => {
                fallback_action_key(load, &event.event_id)
            }
            (None, None) => event_action_key(load, &event.event_id, t.as_str()),
            _ => return Err(format!("action {} has ask_id and step only in part, or step 0", a.key)),
        };
        if a.key != expected {
            return Err(format!("action key {:?} is not of its form (expected {expected:?})", a.key));
        }
        match &a.kind {
            ActionKind::SendSms { to, body } => {
                if Some(to.as_str()) != driver_phone {
                    return Err(format!("send_sms {} is not to the driver's phone", a.key));
                }
                bounded("send_sms body", body, 1600)?;
            }
            ActionKind::CreateHeroTask { title, body, .. } => {
                bounded("hero task title", title, 200)?;
                bounded("hero task body", body, 4000)?;
            }
            ActionKind::PostHeroSlack { channel, text } => {
                bounded("slack channel", channel, 80)?;
                bounded("slack text", text, 4000)?;
            }
            ActionKind::SetTimer { timer_id, fire_at, ask_id, step } => {
                if a.ask_id.as_ref() != Some(ask_id) || a.step != Some(*step) {
                    return Err(format!("set_timer {} params disagree with its ask and step", a.key));
                }
                if *timer_id != TimerId::new(load, ask_id, *step) {
                    return Err(format!("set_timer {} has timer id {timer_id} not of its form", a.key));
                }
                // A requeued timer may be due already: the TimerStore fires it at once.
                if *fire_at < d.decided_at && requeued.is_none() {
                    return Err(format!("set_timer {} fires before the decision", a.key));
                }
            }
            ActionKind::CancelTimer { timer_id } => {
                if timer_id.parts().0 != *load {
                    return Err(format!("cancel_timer {} names another load's timer", a.key));
                }
            }
            ActionKind::UpdateStage { stage } => {
                if stage.is_empty() || stage.len() > 32 || !stage.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    return Err(format!("update_stage {} has a bad stage", a.key));
                }
            }
        }
    }
    for change in &d.asks {
        if change.step == 0 {
            return Err(format!("ask {} moved to step 0", change.ask_id));
        }
    }
    Ok(())
}

fn bounded(what: &str, s: &str, max: usize) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err(format!("{what} is empty"));
    }
    if s.chars().count() > max {
        return Err(format!("{what} is longer than {max} characters"));
    }
    Ok(())
}
