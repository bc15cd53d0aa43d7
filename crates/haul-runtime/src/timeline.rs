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
    pub what: What<'a>,
}

/// What a record says.
#[derive(Debug)]
pub enum What<'a> {
    /// A decision, with each action's outbox row when the view's page holds it.
    Decision { decision: &'a Decision, actions: Vec<(&'a Action, Option<&'a OutboxRow>)> },
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

/// The items of a page of the log, in `seq` order, each decision's actions with their
/// rows among `outbox` (a view's page of the load's rows).
pub fn items<'a>(log: &'a [Record], outbox: &'a [OutboxRow]) -> Vec<Item<'a>> {
    let rows: HashMap<&str, &OutboxRow> = outbox.iter().map(|r| (r.id.as_str(), r)).collect();
    log.iter().map(|r| item(&rows, r)).collect()
}

fn item<'a>(rows: &HashMap<&str, &'a OutboxRow>, r: &'a Record) -> Item<'a> {
    let what = match &r.entry {
        Entry::Decision(decision) => {
            let actions = decision.actions.iter().map(|a| (a, rows.get(a.key.as_str()).copied())).collect();
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
    Item { seq: r.seq, recorded_at: r.recorded_at, kind: r.kind(), entry_id: &r.entry_id, what }
}

/// What an operator's command acts on: the row, the SMS or the ask.
pub fn target(command: &OperatorCommand) -> &str {
    match command {
        OperatorCommand::Requeue { outbox_id, .. } => outbox_id,
        OperatorCommand::AssignSms { message_sid, .. } => message_sid,
        OperatorCommand::ResolveAsk { ask_id } => ask_id.as_str(),
        OperatorCommand::Dismiss { outbox_id } => outbox_id,
    }
}
