//! One load's timeline as a person reads it: what each record of a view's page says,
//! decided once. `haul inspect`'s text (`inspect::timeline`) and the
//! console's HTML (`haul-server`'s `console/pages.rs`) are renderers of these items:
//! neither matches on a record's kind, so a new kind of record is shown by both or
//! by neither.

use std::collections::HashMap;

use haul_core::action::Action;
use haul_core::decision::Decision;
use haul_core::event::{ActionOutcome, EventBody, OperatorAction, OperatorCommand};
use haul_core::projection::{Entry, Record};
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_store::OutboxRow;
use serde_json::Value;

/// One record of the timeline.
#[derive(Debug)]
pub struct Item<'a> {
    pub seq: u64,
    pub recorded_at: Timestamp,
    /// The record's kind as stored (`location_ping`, `decision_recorded`, …).
    pub kind: &'a str,
    pub entry_id: &'a str,
    /// The trace the record was appended in, when it had one.
    pub trace: Option<TraceParent>,
    pub what: What<'a>,
}

/// What a record says.
#[derive(Debug)]
pub enum What<'a> {
    /// A decision, with where each of its actions stands on the view's page.
    Decision { decision: &'a Decision, actions: Vec<(&'a Action, Carried<'a>)> },
    /// An action's outcome; `fields` is the event as stored.
    Outcome { outcome: &'a ActionOutcome, fields: Value },
    /// An operator's action: `target` is the row, SMS or ask it acts on, `fields` its
    /// command as stored.
    Operator { action: &'a OperatorAction, target: &'a str, fields: Value },
    /// Any other event, as stored.
    Event { fields: Value },
    /// A record this build cannot read: why, and the record as stored.
    Unreadable { reason: &'a str, fields: &'a Value },
}

/// Where a decision's action stands on a view's page.
#[derive(Clone, Copy, Debug)]
pub enum Carried<'a> {
    /// Its outbox row.
    Row(&'a OutboxRow),
    /// Carried out by the decision's own append (a timer, `haul_core::timers`): its
    /// outcome, logged in that append.
    WithDecision(&'a ActionOutcome),
    /// Neither its row nor such an outcome is on this page.
    Elsewhere,
}

/// The items of a page of the log, in `seq` order, each decision's actions with their
/// rows among `outbox` (a view's page of the load's rows) or, for those its own append
/// carried out, their outcomes on the page.
pub fn items<'a>(log: &'a [Record], outbox: &'a [OutboxRow]) -> Vec<Item<'a>> {
    let mut carried: HashMap<&str, Carried<'a>> = outbox.iter().map(|r| (r.id.as_str(), Carried::Row(r))).collect();
    for r in log {
        if let Entry::Event { body: EventBody::ActionOutcome(o), .. } = &r.entry
            && o.receipt.as_deref() == Some(haul_core::timers::RECEIPT)
        {
            carried.insert(&o.outbox_id, Carried::WithDecision(o));
        }
    }
    log.iter().map(|r| item(&carried, r)).collect()
}

fn item<'a>(carried: &HashMap<&str, Carried<'a>>, r: &'a Record) -> Item<'a> {
    let what = match &r.entry {
        Entry::Decision(decision) => {
            let at = |a: &Action| carried.get(a.key.as_str()).copied().unwrap_or(Carried::Elsewhere);
            let actions = decision.actions.iter().map(|a| (a, at(a))).collect();
            What::Decision { decision, actions }
        }
        Entry::Event { body: EventBody::ActionOutcome(outcome), .. } => What::Outcome { outcome, fields: r.payload() },
        Entry::Event { body: EventBody::OperatorAction(action), .. } => {
            let fields = serde_json::to_value(&action.command).unwrap_or_default();
            What::Operator { action, target: target(&action.command), fields }
        }
        Entry::Event { .. } => What::Event { fields: r.payload() },
        Entry::Unreadable { payload, reason, .. } => What::Unreadable { reason, fields: payload },
    };
    Item { seq: r.seq, recorded_at: r.recorded_at, kind: r.kind(), entry_id: &r.entry_id, trace: r.trace, what }
}

/// What an operator's command acts on: the row, the SMS or the ask.
pub fn target(command: &OperatorCommand) -> &str {
    match command {
        OperatorCommand::Requeue { outbox_id, .. } => outbox_id,
        OperatorCommand::AssignSms { message_sid, .. } | OperatorCommand::UnassignSms { message_sid, .. } => {
            message_sid
        }
        OperatorCommand::ResolveAsk { ask_id } => ask_id.as_str(),
        OperatorCommand::Dismiss { outbox_id } => outbox_id,
    }
}

#[cfg(test)]
mod tests {
    use haul_core::projection::LoadState;
    use haul_core::timers;
    use serde_json::json;

    use super::*;

    /// A ping's decision: an SMS (an outbox row) and a timer committed with it, whose
    /// outcome its append logged right after it.
    fn log(with_outcome: bool, receipt: &str) -> Vec<Record> {
        let load = haul_core::LoadId::parse("L1").unwrap();
        let at: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let ping = haul_core::InboundEvent::from_json(
            load.clone(),
            json!({"event_id": "p1", "kind": "location_ping", "lat": 41.0, "lon": -87.0, "risk": "high"}),
        )
        .unwrap();
        let action = |key: &str, kind: Value| -> Action {
            let mut a = json!({"key": key, "ask_id": "ask:eta_request:p1", "step": 1});
            a.as_object_mut().unwrap().extend(kind.as_object().unwrap().clone());
            serde_json::from_value(a).unwrap()
        };
        let actions = vec![
            action(
                "L1/ask:eta_request:p1/1/send_sms",
                json!({"type": "send_sms", "params": {"to": "+15555550100", "body": "ETA?"}}),
            ),
            action(
                "L1/ask:eta_request:p1/1/set_timer",
                json!({"type": "set_timer", "params": {"timer_id": "tmr:L1:ask:eta_request:p1:1",
                       "fire_at": "2026-03-02T07:30:00Z", "ask_id": "ask:eta_request:p1", "step": 1}}),
            ),
        ];
        let d = Decision::new(&ping.event_id, at, "sop", actions, vec![], "ask");
        let mut records = Record::appended(0, &ping, &d, at).to_vec();
        let (mut outcome, noop) =
            timers::TimerRoute::WithDecision.settled(&load, &LoadState::default(), &d, at).unwrap().remove(0);
        if let EventBody::ActionOutcome(o) = &mut outcome.body {
            o.receipt = Some(receipt.to_owned());
        }
        if with_outcome {
            records.extend(Record::appended(2, &outcome, &noop, at));
        }
        records
    }

    fn carried(log: &[Record]) -> Vec<String> {
        let items = items(log, &[]);
        let What::Decision { actions, .. } = &items[1].what else { panic!("{:?}", items[1]) };
        actions
            .iter()
            .map(|(a, c)| match c {
                Carried::Row(r) => format!("{} row {}", a.key, r.id),
                Carried::WithDecision(o) => format!("{} with its decision: {:?}", a.key, o.receipt),
                Carried::Elsewhere => format!("{} elsewhere", a.key),
            })
            .collect()
    }

    #[test]
    fn a_timer_committed_with_its_decision_is_shown_by_its_outcome() {
        let sms = "L1/ask:eta_request:p1/1/send_sms elsewhere";
        let with = format!("L1/ask:eta_request:p1/1/set_timer with its decision: Some({:?})", timers::RECEIPT);
        assert_eq!(carried(&log(true, timers::RECEIPT)), [sms.to_owned(), with]);
        let elsewhere = "L1/ask:eta_request:p1/1/set_timer elsewhere".to_owned();
        assert_eq!(
            carried(&log(false, timers::RECEIPT)),
            [sms.to_owned(), elsewhere.clone()],
            "its outcome on another page"
        );
        assert_eq!(carried(&log(true, "scheduled")), [sms.to_owned(), elsewhere], "a dispatched timer row's outcome");
    }
}
