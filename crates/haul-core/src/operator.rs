//! Operator actions (docs/design.md, "Operator actions"): what a decision on an
//! `operator_action` event is.
//!
//! An operator never edits a log or the outbox: the action is an inbound event on the
//! load queue, and the load worker appends it with this decision like any other
//! input, so the log is the audit trail (who, why, what was done) and the version
//! check guards it. The decision is deterministic whichever decider the load runs
//! under (the filter calls it; no model is asked), and a pure function of the state
//! and the event, so an operator request retried or replayed does the same thing.
//! What cannot be done is a noop decision that says why, never an error: the event
//! is in the log either way.

use crate::action::{Action, ActionKind, Urgency};
use crate::decision::{AskChange, AskStatus, Decision, InboxChange, InboxState};
use crate::event::{InboundEvent, InboundSms, OperatorAction, OperatorCommand};
use crate::ids::{LoadId, TimerId, ask_action_key, event_action_key};
use crate::outcome::OutcomeStatus;
use crate::projection::LoadState;
use crate::time::Timestamp;

/// `decision_recorded.decider` of every operator decision.
pub const OPERATOR_DECIDER: &str = "operator";

/// Ok when `outbox_id` is a row of `load` whose failed outcome is in its log (a dead
/// row: what is `done`, requeued or dismissed); else why not, as the noop says it.
fn dead_row_of(load: &LoadId, state: &LoadState, outbox_id: &str, done: &str) -> Result<(), String> {
    if !outbox_id.strip_prefix(load.as_str()).is_some_and(|rest| rest.starts_with('/')) {
        return Err(format!("refused: {outbox_id} is not a row of load {load}"));
    }
    match state.outcomes.get(outbox_id).map(|o| o.status) {
        Some(OutcomeStatus::Failed) => Ok(()),
        Some(OutcomeStatus::Delivered) => Err(format!("refused: {outbox_id} was delivered")),
        None => {
            Err(format!("refused: {outbox_id} has no failed outcome in this load's log (only a dead row is {done})"))
        }
    }
}

/// The decision on `op`, the body of `event`, for `load` in `state` (before the event).
pub fn decide(load: &LoadId, state: &LoadState, event: &InboundEvent, op: &OperatorAction, now: Timestamp) -> Decision {
    let by = format!("{} by {} ({})", op.command.name(), op.actor, op.reason);
    let noop =
        |why: String| Decision::new(&event.event_id, now, OPERATOR_DECIDER, vec![], vec![], format!("{by}: {why}"));
    match &op.command {
        OperatorCommand::Requeue { outbox_id, action } => {
            if let Err(why) = dead_row_of(load, state, outbox_id, "requeued") {
                return noop(why);
            }
            if let Some(again) = state.requeues.get(outbox_id) {
                return noop(format!("{outbox_id} was requeued already, as {again}: nothing more to do"));
            }
            if let ActionKind::SendSms { to, .. } = &action.kind
                && state.driver_phone.as_deref() != Some(to.as_str())
            {
                return noop(format!("refused: {outbox_id} texts a number that is no longer the driver's"));
            }
            // No operator action overrides an opt-out: a person calls instead.
            if let ActionKind::SendSms { .. } = &action.kind
                && state.sms_opted_out()
            {
                return noop(format!("refused: the driver opted out of SMS (STOP), so {outbox_id} is not sent again"));
            }
            let t = action.action_type();
            let copy = Action {
                key: event_action_key(load, &event.event_id, t.as_str()),
                kind: action.kind.clone(),
                ask_id: action.ask_id.clone(),
                step: action.step,
                requeue_of: Some(outbox_id.clone()),
            };
            let why = format!("{by}: the {t} of dead row {outbox_id} goes out again as {}", copy.key);
            Decision::new(&event.event_id, now, OPERATOR_DECIDER, vec![copy], vec![], why)
        }
        OperatorCommand::AssignSms { message_sid, from, body } => {
            if state.has_sms(message_sid) {
                return noop(format!("SMS {message_sid} was handled on this load already: nothing more to do"));
            }
            let sms = InboundSms { from: from.clone(), body: body.clone() };
            let mut d = crate::sop::decide_sms(load, state, event, &sms, now);
            d.decider = OPERATOR_DECIDER.into();
            d.rationale = format!("{by}: SMS {message_sid} is this load's; {}", d.rationale);
            d
        }
        OperatorCommand::Dismiss { outbox_id } => {
            if let Err(why) = dead_row_of(load, state, outbox_id, "dismissed") {
                return noop(why);
            }
            let state_now = state.inbox_state(outbox_id);
            if state_now != InboxState::Open {
                return noop(format!("{outbox_id} is {} already: nothing more to do", state_now.as_str()));
            }
            // The whole problem leaves the inbox: the row, the dead rows it was
            // requeued from and the dead copies made of it.
            let rows = state.open_dead_in_chain(outbox_id);
            let why = format!("{by}: dismissed from the inbox: {}", rows.join(", "));
            let mut d = Decision::new(&event.event_id, now, OPERATOR_DECIDER, vec![], vec![], why);
            d.inbox =
                rows.into_iter().map(|outbox_id| InboxChange { outbox_id, state: InboxState::Dismissed }).collect();
            d
        }
        OperatorCommand::ResolveAsk { ask_id } => {
            let Some(ask) = state.asks.get(ask_id) else {
                return noop(format!("refused: load {load} has no ask {ask_id}"));
            };
            let change = AskChange { ask_id: ask_id.clone(), step: ask.step, status: AskStatus::Closed };
            let actions = match ask.status {
                // Its current step's timer is still due: cancel it.
                AskStatus::Open => {
                    let kind = ActionKind::CancelTimer { timer_id: TimerId::new(load, ask_id, ask.step) };
                    vec![Action {
                        key: ask_action_key(load, ask_id, ask.step, kind.action_type().as_str()),
                        kind,
                        ask_id: Some(ask_id.clone()),
                        step: Some(ask.step),
                        requeue_of: None,
                    }]
                }
                // Escalated: its last timer fired, and the escalation step has none.
                AskStatus::Escalated => vec![],
                status @ (AskStatus::Answered | AskStatus::Closed) => {
                    return noop(format!("{ask_id} is {} already: nothing more to do", status.as_str()));
                }
            };
            let why = format!("{by}: {ask_id} closed by hand at step {}", ask.step);
            Decision::new(&event.event_id, now, OPERATOR_DECIDER, actions, vec![change], why)
        }
        OperatorCommand::UnassignSms { message_sid, to_load } => {
            if to_load == load {
                return noop(format!("refused: SMS {message_sid} cannot move to the load it is on"));
            }
            let Some(assigned_by) = state.assigned_sms_by.get(message_sid) else {
                return noop(format!("refused: SMS {message_sid} was not assigned to load {load} by an operator"));
            };
            let why = format!("{by}: SMS {message_sid} is load {to_load}'s, not this load's");
            unassign(load, state, event, assigned_by, now, why)
        }
    }
}

/// The decision that takes the SMS an operator assigned here (by `assigned_by`) away
/// to `to_load`. The asks it answered are unanswered again: the driver of this load
/// never replied to them. They go to a person (a Hero task each, the ask escalated)
/// rather than to the SOP's next step, because the person who moved the SMS is the one
/// who knows whether to ask again, and the next step's timing is a client policy the
/// operator's rules do not read. What the SMS made here (a Hero task) went out already.
fn unassign(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    assigned_by: &crate::ids::EventId,
    now: Timestamp,
    why: String,
) -> Decision {
    let answered: Vec<_> = state
        .asks
        .values()
        .filter(|a| a.status == AskStatus::Answered && a.answered_by.as_ref() == Some(assigned_by))
        .collect();
    let mut actions = vec![];
    let mut asks = vec![];
    for ask in &answered {
        let step = ask.step + 1;
        let kind = ActionKind::CreateHeroTask {
            title: format!("ETA answer withdrawn on load {load}"),
            body: format!(
                "{why}. It answered {} here, so this load's driver has not answered it: call them.",
                ask.ask_id
            ),
            urgency: Urgency::Urgent,
        };
        actions.push(Action {
            key: ask_action_key(load, &ask.ask_id, step, kind.action_type().as_str()),
            kind,
            ask_id: Some(ask.ask_id.clone()),
            step: Some(step),
            requeue_of: None,
        });
        asks.push(AskChange { ask_id: ask.ask_id.clone(), step, status: AskStatus::Escalated });
    }
    let undone = if answered.is_empty() {
        "it answered no ask here".to_owned()
    } else {
        let ids: Vec<&str> = answered.iter().map(|a| a.ask_id.as_str()).collect();
        format!("{} unanswered again, to a person", ids.join(", "))
    };
    let why = format!("{why}: {undone}");
    Decision::new(&event.event_id, now, OPERATOR_DECIDER, actions, asks, why)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::action::ActionType;
    use crate::decision::DECISION_RECORDED;
    use crate::event::EventBody;
    use crate::ids::{AskId, EventId};
    use crate::projection::{Record, project};
    use crate::validate::validate_decision;

    const LOAD: &str = "481207";
    const PHONE: &str = "+15555550100";
    const DEAD: &str = "481207/ask:eta_request:p/2/create_hero_task";

    fn at(hhmm: &str) -> Timestamp {
        format!("2026-03-02T{hhmm}:00Z").parse().unwrap()
    }

    /// A log built from (entry id, kind, payload), decisions included as given.
    fn state(entries: &[(&str, &str, serde_json::Value)]) -> LoadState {
        let records: Vec<Record> = entries
            .iter()
            .enumerate()
            .map(|(i, (id, kind, payload))| {
                Record::decode(i as u64 + 1, id.to_string(), kind, payload.clone(), at("07:00"))
            })
            .collect();
        project(&records)
    }

    fn load_update() -> (&'static str, &'static str, serde_json::Value) {
        ("load:init", "load_update", json!({"client":"a","driver_phone":PHONE,"stage":"in_transit"}))
    }

    fn ask(status: &str, step: u32) -> (&'static str, &'static str, serde_json::Value) {
        (
            "dec:p",
            DECISION_RECORDED,
            json!({"decision_id":"dec:p","event_id":"p","decided_at":"2026-03-02T07:00:00Z","filtered":false,
                   "needs_hero_task":false,"actions":[],"rationale":"r","decider":"sop",
                   "asks":[{"ask_id":"ask:eta_request:p","step":step,"status":status}]}),
        )
    }

    fn outcome(key: &str, status: &str) -> (String, &'static str, serde_json::Value) {
        (
            format!("evt:out:{key}:{status}"),
            "action_outcome",
            json!({"outbox_id":key,"action_type":"create_hero_task","status":status,"hero_channel":true}),
        )
    }

    fn dead_action() -> Action {
        Action {
            key: DEAD.into(),
            kind: ActionKind::CreateHeroTask { title: "t".into(), body: "call them".into(), urgency: Urgency::Urgent },
            ask_id: Some(AskId::parse("ask:eta_request:p").unwrap()),
            step: Some(2),
            requeue_of: None,
        }
    }

    fn op_event(request: &str, command: OperatorCommand) -> InboundEvent {
        InboundEvent {
            load_id: LoadId::parse(LOAD).unwrap(),
            event_id: EventId::operator(request).unwrap(),
            body: EventBody::OperatorAction(OperatorAction {
                actor: "ana".into(),
                reason: "Hero is back".into(),
                command,
            }),
        }
    }

    /// The decision's action keys and types and ask changes, checked as data; every
    /// decision also validates as the worker validates it.
    fn check(
        state: &LoadState,
        command: OperatorCommand,
        want_actions: &[(&str, ActionType)],
        want_asks: &[(&str, AskStatus)],
    ) -> Decision {
        let load = LoadId::parse(LOAD).unwrap();
        let event = op_event("r1", command);
        let EventBody::OperatorAction(op) = &event.body else { unreachable!() };
        let d = decide(&load, state, &event, op, at("09:00"));
        let got: Vec<(&str, ActionType)> = d.actions.iter().map(|a| (a.key.as_str(), a.action_type())).collect();
        assert_eq!(got, want_actions, "{}", d.rationale);
        let asks: Vec<(&str, AskStatus)> = d.asks.iter().map(|c| (c.ask_id.as_str(), c.status)).collect();
        assert_eq!(asks, want_asks, "{}", d.rationale);
        assert_eq!(d.decider, OPERATOR_DECIDER);
        assert!(d.rationale.contains("by ana (Hero is back)"), "{}", d.rationale);
        validate_decision(&load, state, &event, &d).unwrap();
        d
    }

    fn requeue() -> OperatorCommand {
        OperatorCommand::Requeue { outbox_id: DEAD.into(), action: dead_action() }
    }

    #[test]
    fn requeue_copies_a_dead_rows_action_under_a_new_key() {
        let (id, kind, payload) = outcome(DEAD, "failed");
        let dead = state(&[load_update(), ask("escalated", 2), (&id, kind, payload)]);
        let d = check(&dead, requeue(), &[("481207/op:r1/create_hero_task", ActionType::CreateHeroTask)], &[]);
        assert_eq!(d.actions[0].requeue_of.as_deref(), Some(DEAD));
        assert_eq!(d.actions[0].kind, dead_action().kind);
        assert!(d.needs_hero_task);

        // Only a row whose failed outcome is in the log; never a delivered one.
        check(&state(&[load_update()]), requeue(), &[], &[]);
        let (id, kind, payload) = outcome(DEAD, "delivered");
        check(&state(&[load_update(), (&id, kind, payload)]), requeue(), &[], &[]);
        // Another load's row.
        let other = Action { key: "999/x/create_hero_task".into(), ..dead_action() };
        check(&dead, OperatorCommand::Requeue { outbox_id: other.key.clone(), action: other }, &[], &[]);
        // An SMS to a number that is not the driver's any more.
        let sms_key = "481207/ask:eta_request:p/1/send_sms";
        let (id, kind, mut payload) = outcome(sms_key, "failed");
        payload["action_type"] = json!("send_sms");
        payload["hero_channel"] = json!(false);
        let sms_dead = state(&[load_update(), (&id, kind, payload)]);
        let sms = |to: &str| Action {
            key: sms_key.into(),
            kind: ActionKind::SendSms { to: to.into(), body: "ETA?".into() },
            ask_id: Some(AskId::parse("ask:eta_request:p").unwrap()),
            step: Some(1),
            requeue_of: None,
        };
        check(&sms_dead, OperatorCommand::Requeue { outbox_id: sms_key.into(), action: sms("+15555550199") }, &[], &[]);
        check(
            &sms_dead,
            OperatorCommand::Requeue { outbox_id: sms_key.into(), action: sms(PHONE) },
            &[("481207/op:r1/send_sms", ActionType::SendSms)],
            &[],
        );
        // An SMS to a driver who opted out (STOP) since: no operator overrides that.
        let stop = ("sms:SM9", "inbound_sms", json!({"from": PHONE, "body": "STOP"}));
        let (id, kind, mut payload) = outcome(sms_key, "failed");
        payload["action_type"] = json!("send_sms");
        payload["hero_channel"] = json!(false);
        let opted_out = state(&[load_update(), stop, (&id, kind, payload)]);
        let requeue_sms = OperatorCommand::Requeue { outbox_id: sms_key.into(), action: sms(PHONE) };
        let d = check(&opted_out, requeue_sms, &[], &[]);
        assert!(d.rationale.contains("opted out of SMS"), "{}", d.rationale);
    }

    #[test]
    fn a_dead_row_is_requeued_once() {
        let (id, kind, payload) = outcome(DEAD, "failed");
        let mut entries = vec![load_update(), ask("escalated", 2), (id.as_str(), kind, payload)];
        let first =
            check(&state(&entries), requeue(), &[("481207/op:r1/create_hero_task", ActionType::CreateHeroTask)], &[]);
        let op = op_event("r1", requeue());
        let (op_payload, decision) = (op.body.payload(), serde_json::to_value(&first).unwrap());
        entries.push(("op:r1", "operator_action", op_payload));
        entries.push(("dec:op:r1", DECISION_RECORDED, decision));
        let after = state(&entries);
        assert_eq!(after.requeues.get(DEAD).map(String::as_str), Some("481207/op:r1/create_hero_task"));
        // A second request (another request id) finds it requeued: a noop.
        check(&after, requeue(), &[], &[]);
    }

    /// The entries of an operator event and its decision, as the worker appends them.
    fn appended(
        request: &str,
        command: OperatorCommand,
        d: &Decision,
    ) -> Vec<(String, &'static str, serde_json::Value)> {
        let op = op_event(request, command);
        vec![
            (op.event_id.to_string(), "operator_action", op.body.payload()),
            (d.decision_id.clone(), DECISION_RECORDED, serde_json::to_value(d).unwrap()),
        ]
    }

    const ASK: &str = "ask:eta_request:p";
    const TIMER_1: &str = "481207/ask:eta_request:p/1/cancel_timer";
    const HERO_2: &str = "481207/ask:eta_request:p/2/create_hero_task";

    fn state_of(entries: &[(String, &'static str, serde_json::Value)]) -> LoadState {
        let borrowed: Vec<(&str, &str, serde_json::Value)> =
            entries.iter().map(|(id, kind, p)| (id.as_str(), *kind, p.clone())).collect();
        state(&borrowed)
    }

    fn inbox(d: &Decision) -> Vec<(&str, InboxState)> {
        d.inbox.iter().map(|c| (c.outbox_id.as_str(), c.state)).collect()
    }

    /// A dead row requeued, its copy dead too and requeued again: one problem. The
    /// second copy's delivery marks both dead rows handled; a dismissal takes both out.
    #[test]
    fn a_requeue_chain_leaves_the_inbox_as_one_problem() {
        const COPY: &str = "481207/op:r1/create_hero_task";
        const COPY2: &str = "481207/op:r2/create_hero_task";
        let (lu, (dk, dn, dp)) = (load_update(), ask("escalated", 2));
        let mut log: Vec<(String, &'static str, serde_json::Value)> =
            vec![(lu.0.into(), lu.1, lu.2), (dk.into(), dn, dp), outcome(DEAD, "failed")];
        let first = check(&state_of(&log), requeue(), &[(COPY, ActionType::CreateHeroTask)], &[]);
        log.extend(appended("r1", requeue(), &first));
        log.push(outcome(COPY, "failed"));
        let copy = Action { key: COPY.into(), requeue_of: None, ..dead_action() };
        let again = OperatorCommand::Requeue { outbox_id: COPY.into(), action: copy };
        let load = LoadId::parse(LOAD).unwrap();
        let e2 = op_event("r2", again.clone());
        let EventBody::OperatorAction(op2) = &e2.body else { unreachable!() };
        let second = decide(&load, &state_of(&log), &e2, op2, at("09:05"));
        assert_eq!(second.actions.iter().map(|a| a.key.as_str()).collect::<Vec<_>>(), [COPY2]);
        log.extend(appended("r2", again, &second));
        let s = state_of(&log);
        assert_eq!(s.requeue_chain(COPY), [DEAD, COPY, COPY2]);
        assert_eq!(s.open_dead_in_chain(COPY2), [DEAD, COPY]);

        // The second copy delivered: the filter marks the chain's dead rows handled.
        let (out_id, _, _) = outcome(COPY2, "delivered");
        let delivered = crate::testing::ev(serde_json::json!({"event_id": out_id, "kind": "action_outcome",
            "outbox_id": COPY2, "action_type": "create_hero_task", "status": "delivered", "hero_channel": true}));
        let d = crate::filter::filter(&load, &s, &delivered, at("09:06")).unwrap();
        assert_eq!(inbox(&d), [(DEAD, InboxState::Handled), (COPY, InboxState::Handled)], "{}", d.rationale);
        validate_decision(&load, &s, &delivered, &d).unwrap();
        // A delivery of a row no one requeued changes nothing in the inbox.
        let plain = crate::testing::ev(serde_json::json!({"event_id": "evt:out:481207/x/send_sms:delivered",
            "kind": "action_outcome", "outbox_id": "481207/x/send_sms", "action_type": "send_sms", "status": "delivered"}));
        assert!(crate::filter::filter(&load, &s, &plain, at("09:06")).unwrap().inbox.is_empty());

        // Dismissed instead: either dead row takes the chain's open dead rows out, once.
        let dismiss = |key: &str| OperatorCommand::Dismiss { outbox_id: key.into() };
        for key in [DEAD, COPY] {
            let d = check(&s, dismiss(key), &[], &[]);
            assert_eq!(inbox(&d), [(DEAD, InboxState::Dismissed), (COPY, InboxState::Dismissed)], "{}", d.rationale);
        }
        let d = check(&s, dismiss(DEAD), &[], &[]);
        let mut dismissed = log.clone();
        dismissed.extend(appended("r3", dismiss(DEAD), &d));
        let after = state_of(&dismissed);
        assert_eq!((after.inbox_state(DEAD), after.inbox_state(COPY2)), (InboxState::Dismissed, InboxState::Open));
        let twice = check(&after, dismiss(COPY), &[], &[]);
        assert!(twice.inbox.is_empty() && twice.rationale.contains("is dismissed already"), "{}", twice.rationale);
    }

    #[test]
    fn only_a_dead_row_of_the_load_is_dismissed() {
        let dismiss = |key: &str| OperatorCommand::Dismiss { outbox_id: key.into() };
        let (id, kind, payload) = outcome(DEAD, "failed");
        let dead = state(&[load_update(), (&id, kind, payload)]);
        let d = check(&dead, dismiss(DEAD), &[], &[]);
        assert_eq!(inbox(&d), [(DEAD, InboxState::Dismissed)]);
        for (s, key, why) in [
            (&dead, "999/x/create_hero_task", "is not a row of load 481207"),
            (&dead, "481207x/create_hero_task", "is not a row of load 481207"),
            (&state(&[load_update()]), DEAD, "has no failed outcome"),
        ] {
            let d = check(s, dismiss(key), &[], &[]);
            assert!(d.inbox.is_empty() && d.rationale.contains(why), "{key}: {}", d.rationale);
        }
        let (id, kind, payload) = outcome(DEAD, "delivered");
        let d = check(&state(&[load_update(), (&id, kind, payload)]), dismiss(DEAD), &[], &[]);
        assert!(d.inbox.is_empty() && d.rationale.contains("was delivered"), "{}", d.rationale);
    }

    #[test]
    fn resolve_ask_closes_it_and_cancels_a_live_timer() {
        let resolve = || OperatorCommand::ResolveAsk { ask_id: AskId::parse("ask:eta_request:p").unwrap() };
        check(
            &state(&[load_update(), ask("open", 2)]),
            resolve(),
            &[("481207/ask:eta_request:p/2/cancel_timer", ActionType::CancelTimer)],
            &[("ask:eta_request:p", AskStatus::Closed)],
        );
        check(
            &state(&[load_update(), ask("escalated", 3)]),
            resolve(),
            &[],
            &[("ask:eta_request:p", AskStatus::Closed)],
        );
        check(&state(&[load_update(), ask("answered", 1)]), resolve(), &[], &[]);
        check(&state(&[load_update(), ask("closed", 1)]), resolve(), &[], &[]);
        check(&state(&[load_update()]), resolve(), &[], &[]);
    }

    #[test]
    fn assigned_sms_goes_through_the_sop_once() {
        let assign = |from: &str, body: &str| OperatorCommand::AssignSms {
            message_sid: "SM1".into(),
            from: from.into(),
            body: body.into(),
        };
        // Rule 4: the driver answers the open ask.
        check(
            &state(&[load_update(), ask("open", 1)]),
            assign(PHONE, "ETA 9:15"),
            &[("481207/ask:eta_request:p/1/cancel_timer", ActionType::CancelTimer)],
            &[("ask:eta_request:p", AskStatus::Answered)],
        );
        // Rule 5: no ask open, a person reads it.
        check(
            &state(&[load_update()]),
            assign("+15555550199", "hello?"),
            &[("481207/op:r1/create_hero_task", ActionType::CreateHeroTask)],
            &[],
        );
        // Handled before: assigned by another request, or routed here by the webhook.
        let assigned = op_event("r0", assign(PHONE, "ETA 9:15")).body.payload();
        check(
            &state(&[load_update(), ask("open", 1), ("op:r0", "operator_action", assigned)]),
            assign(PHONE, "x"),
            &[],
            &[],
        );
        let sms = json!({"from": PHONE, "body": "ETA 9:15"});
        check(&state(&[load_update(), ask("open", 1), ("sms:SM1", "inbound_sms", sms)]), assign(PHONE, "x"), &[], &[]);
    }

    /// An SMS assigned here by mistake and moved to its load: the ask it answered goes
    /// to a person, once; an SMS the webhook routed here, or one not here, is refused.
    #[test]
    fn unassigned_sms_hands_its_answered_asks_to_a_person() {
        let assign = OperatorCommand::AssignSms { message_sid: "SM1".into(), from: PHONE.into(), body: "ETA 9".into() };
        let unassign = |sid: &str, to: &str| OperatorCommand::UnassignSms {
            message_sid: sid.into(),
            to_load: LoadId::parse(to).unwrap(),
        };
        // Another ask, answered by the driver's own SMS: not the assignment's to undo.
        let other = json!({"decision_id":"dec:q","event_id":"q","decided_at":"2026-03-02T07:00:00Z","filtered":false,
            "needs_hero_task":false,"actions":[],"rationale":"r","decider":"sop",
            "asks":[{"ask_id":"ask:eta_request:q","step":1,"status":"answered"}]});
        let mut log: Vec<(String, &'static str, serde_json::Value)> =
            [load_update(), ask("open", 1), ("dec:q", DECISION_RECORDED, other)]
                .into_iter()
                .map(|(id, kind, p)| (id.to_owned(), kind, p))
                .collect();
        let answered = check(
            &state_of(&log),
            assign.clone(),
            &[(TIMER_1, ActionType::CancelTimer)],
            &[(ASK, AskStatus::Answered)],
        );
        log.extend(appended("r1", assign.clone(), &answered));
        let s = state_of(&log);
        assert_eq!(s.asks.values().next().unwrap().answered_by.as_ref().map(|e| e.as_str()), Some("op:r1"));

        let d = check(
            &s,
            unassign("SM1", "481208"),
            &[(HERO_2, ActionType::CreateHeroTask)],
            &[(ASK, AskStatus::Escalated)],
        );
        assert!(d.rationale.contains("SMS SM1 is load 481208's") && d.rationale.contains(ASK), "{}", d.rationale);
        let ActionKind::CreateHeroTask { body, .. } = &d.actions[0].kind else { unreachable!() };
        assert!(body.contains("call them"), "{body}");
        for (command, why) in [
            (unassign("SM1", LOAD), "cannot move to the load it is on"),
            (unassign("SM2", "481208"), "was not assigned to load 481207 by an operator"),
        ] {
            let d = check(&s, command, &[], &[]);
            assert!(d.rationale.contains(why), "{}", d.rationale);
        }
        let mut moved = log.clone();
        moved.extend(appended("r1", unassign("SM1", "481208"), &d));
        let after = state_of(&moved);
        assert!(!after.has_sms("SM1") && after.assigned_sms_by.is_empty());
        let again = check(&after, unassign("SM1", "481208"), &[], &[]);
        assert!(again.rationale.contains("was not assigned"), "{}", again.rationale);
        // Assigned back: the SMS is this load's again and the SOP takes it (no ask is open now).
        let back = check(&after, assign, &[("481207/op:r1/create_hero_task", ActionType::CreateHeroTask)], &[]);
        assert!(back.rationale.contains("SMS SM1 is this load's"), "{}", back.rationale);

        // The webhook routed it here: not an operator's to move; an SMS that answered nothing moves alone.
        let sms = json!({"from": PHONE, "body": "ETA 9"});
        let routed = state(&[load_update(), ask("open", 1), ("sms:SM1", "inbound_sms", sms)]);
        check(&routed, unassign("SM1", "481208"), &[], &[]);
        let mut idle: Vec<_> = vec![(String::from("load:init"), "load_update", load_update().2)];
        let rule5 = check(
            &state_of(&idle),
            OperatorCommand::AssignSms { message_sid: "SM1".into(), from: PHONE.into(), body: "hi".into() },
            &[("481207/op:r1/create_hero_task", ActionType::CreateHeroTask)],
            &[],
        );
        idle.extend(appended(
            "r1",
            OperatorCommand::AssignSms { message_sid: "SM1".into(), from: PHONE.into(), body: "hi".into() },
            &rule5,
        ));
        let d = check(&state_of(&idle), unassign("SM1", "481208"), &[], &[]);
        assert!(d.rationale.ends_with("it answered no ask here"), "{}", d.rationale);
    }
}
