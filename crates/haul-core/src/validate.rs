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
                if state.sms_opt_out.as_ref().is_some_and(|o| o.phone == *to) {
                    return Err(format!("send_sms {} is to a phone that opted out of SMS (STOP)", a.key));
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
    for change in &d.inbox {
        if !change.outbox_id.strip_prefix(load.as_str()).is_some_and(|rest| rest.starts_with('/')) {
            return Err(format!("inbox change for {}, not a row of load {load}", change.outbox_id));
        }
        if change.state == crate::decision::InboxState::Open {
            return Err(format!("inbox change reopens {}: a decision only takes a row out", change.outbox_id));
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::action::{Action, Urgency};
    use crate::ids::{AskId, EventId};
    use crate::projection::{Record, project};
    use crate::testing::{PHONE, ev, load};
    use crate::time::Timestamp;

    fn now() -> Timestamp {
        "2026-03-02T07:00:00Z".parse().unwrap()
    }

    fn state() -> LoadState {
        let init = ev(json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE}));
        let d = Decision::new(&init.event_id, now(), "sop", vec![], vec![], "r");
        project(&Record::appended(0, &init, &d, now()))
    }

    fn ping() -> InboundEvent {
        ev(json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}))
    }

    fn ask() -> AskId {
        AskId::parse("ask:eta_request:ping_0700").unwrap()
    }

    /// An action of the ask at `step`, keyed as the SOP keys it.
    fn of_ask(step: u32, kind: ActionKind) -> Action {
        let key = ask_action_key(&load(), &ask(), step, kind.action_type().as_str());
        Action { key, kind, ask_id: Some(ask()), step: Some(step), requeue_of: None }
    }

    fn sms(step: u32, to: &str, body: &str) -> Action {
        of_ask(step, ActionKind::SendSms { to: to.into(), body: body.into() })
    }

    fn timer(step: u32, fire_in_s: i64) -> Action {
        let fire_at = crate::time::from_ms(crate::time::to_ms(now()) + fire_in_s * 1000);
        of_ask(
            step,
            ActionKind::SetTimer { timer_id: TimerId::new(&load(), &ask(), step), fire_at, ask_id: ask(), step },
        )
    }

    fn hero(decider: &str, key: String) -> Decision {
        let kind = ActionKind::CreateHeroTask { title: "t".into(), body: "b".into(), urgency: Urgency::Urgent };
        let a = Action { key, kind, ask_id: None, step: None, requeue_of: None };
        Decision::new(&ping().event_id, now(), decider, vec![a], vec![], "r")
    }

    /// `validate_decision` on `event` (the ping when `None`): `Ok` or an error holding `want`.
    fn check(event: Option<InboundEvent>, d: Decision, want: Result<(), &str>) {
        let event = event.unwrap_or_else(ping);
        match (validate_decision(&load(), &state(), &event, &d), want) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(part)) => assert!(e.contains(part), "{e:?} does not say {part:?}"),
            (got, want) => panic!("got {got:?}, want {want:?} for {d:?}"),
        }
    }

    fn of(actions: Vec<Action>) -> Decision {
        Decision::new(&ping().event_id, now(), "sop", actions, vec![], "r")
    }

    #[test]
    fn a_decision_is_appended_only_in_its_own_form() {
        check(None, of(vec![sms(1, PHONE, "ETA?"), timer(1, 1800)]), Ok(()));
        // For another event.
        let other = Decision::new(&EventId::parse("ping_0800").unwrap(), now(), "sop", vec![], vec![], "r");
        check(None, other, Err("decision is for event ping_0800"));
        // At most 16 actions.
        check(None, of((1..=16).map(|n| sms(n, PHONE, "ETA?")).collect()), Ok(()));
        check(None, of((1..=17).map(|n| sms(n, PHONE, "ETA?")).collect()), Err("17 actions (at most 16)"));
        // SMS to the driver only, whose phone an update in the same event may set.
        check(None, of(vec![sms(1, "+15555550199", "ETA?")]), Err("is not to the driver's phone"));
        let update = ev(json!({"event_id": "ping_0700", "kind": "load_update", "driver_phone": "+15555550199"}));
        check(Some(update.clone()), of(vec![sms(1, "+15555550199", "ETA?")]), Ok(()));
        check(Some(update), of(vec![sms(1, PHONE, "ETA?")]), Err("is not to the driver's phone"));
        let no_phone = ev(json!({"event_id": "ping_0700", "kind": "load_update", "stage": "at_pickup"}));
        check(Some(no_phone), of(vec![sms(1, PHONE, "ETA?")]), Ok(()));
        // Bodies: not empty, at most 1,600 characters.
        check(None, of(vec![sms(1, PHONE, " ")]), Err("send_sms body is empty"));
        check(None, of(vec![sms(1, PHONE, &"x".repeat(1600))]), Ok(()));
        check(None, of(vec![sms(1, PHONE, &"x".repeat(1601))]), Err("longer than 1600"));
        // Keys: step 0 is no step, a key twice is refused.
        check(None, of(vec![sms(0, PHONE, "ETA?")]), Err("step 0"));
        check(None, of(vec![sms(1, PHONE, "a"), sms(1, PHONE, "b")]), Err("appears twice"));
        // A fallback's Hero task has its own key, for the fallback decider only.
        let fallback_key = fallback_action_key(&load(), &ping().event_id);
        check(None, hero("fallback", fallback_key.clone()), Ok(()));
        check(None, hero("sop", fallback_key), Err("is not of its form"));
        check(None, hero("sop", event_action_key(&load(), &ping().event_id, "create_hero_task")), Ok(()));
        // Timers: params agree with the ask and step, and fire after the decision.
        check(None, of(vec![timer(1, 0)]), Ok(()));
        check(None, of(vec![timer(1, -1)]), Err("fires before the decision"));
        let mut wrong_step = timer(1, 60);
        if let ActionKind::SetTimer { step, .. } = &mut wrong_step.kind {
            *step = 2;
        }
        check(None, of(vec![wrong_step]), Err("params disagree"));
        // Stages: [a-z_]{1,32}.
        let stage = |s: &str| {
            let kind = ActionKind::UpdateStage { stage: s.into() };
            let key = event_action_key(&load(), &ping().event_id, "update_stage");
            of(vec![Action { key, kind, ask_id: None, step: None, requeue_of: None }])
        };
        check(None, stage("at_pickup"), Ok(()));
        check(None, stage(&"a".repeat(32)), Ok(()));
        check(None, stage(&"a".repeat(33)), Err("bad stage"));
        check(None, stage(""), Err("bad stage"));
        check(None, stage("At_pickup"), Err("bad stage"));
        // Only an operator's requeue of that very row may carry requeue_of.
        let dead = "481207/ask:eta_request:ping_0700/1/send_sms".to_string();
        let requeue = ev(json!({"event_id": "op:r1", "kind": "operator_action", "actor": "ana", "reason": "x",
            "command": {"type": "requeue", "outbox_id": dead, "action": {"key": dead, "type": "send_sms",
            "ask_id": "ask:eta_request:ping_0700", "step": 1, "params": {"to": PHONE, "body": "ETA?"}}}}));
        let copy = |decider: &str, of_row: &str| {
            let mut a = sms(1, PHONE, "ETA?");
            a.key = event_action_key(&load(), &requeue.event_id, "send_sms");
            a.requeue_of = Some(of_row.to_owned());
            Decision::new(&requeue.event_id, now(), decider, vec![a], vec![], "r")
        };
        check(Some(requeue.clone()), copy(OPERATOR_DECIDER, &dead), Ok(()));
        check(Some(requeue.clone()), copy("sop", &dead), Err("claims to requeue"));
        check(Some(requeue.clone()), copy(OPERATOR_DECIDER, "481207/x/send_sms"), Err("claims to requeue"));
    }
}
