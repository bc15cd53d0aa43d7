//! Timers committed with their decision (ADR 0003: "keep timers in the database next
//! to the outbox, where set_timer commits atomically with its decision").
//!
//! When the TimerStore is the store's own database, a decision's `set_timer` and
//! `cancel_timer` need no outbox row, claim, queue message or second worker run: the
//! append writes the timer in its own transaction, and records beside the decision
//! the action's delivered `action_outcome` and the filter's noop on it, the records
//! the dispatcher's path leaves. Every reader of the log (the projection, evals,
//! replay, inspect, export) reads what it read before. A TimerStore outside the
//! store's database keeps the outbox path ([`TimerRoute::Outbox`]).

use crate::action::{Action, ActionType, Request};
use crate::decision::Decision;
use crate::derived::TimerWrite;
use crate::dispatch::{Row, outcome_event};
use crate::event::InboundEvent;
use crate::filter;
use crate::ids::LoadId;
use crate::outcome::OutcomeStatus;
use crate::projection::LoadState;
use crate::time::Timestamp;

/// Where a decision's `set_timer` and `cancel_timer` are carried out; said where the
/// pipeline is wired, as `QueueMode` is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TimerRoute {
    /// In the decision's own append: the TimerStore is the store's database.
    #[default]
    WithDecision,
    /// Through an outbox row the dispatcher applies to the TimerStore.
    Outbox,
}

impl TimerRoute {
    /// Whether the append carries `action` out itself, so it gets no outbox row.
    pub fn in_append(self, action: &Action) -> bool {
        match self {
            TimerRoute::WithDecision => matches!(action.action_type(), ActionType::SetTimer | ActionType::CancelTimer),
            TimerRoute::Outbox => false,
        }
    }

    /// The TimerStore writes the append makes for the decision's timer actions, in
    /// order; none through the outbox.
    pub fn writes(self, load: &LoadId, d: &Decision) -> Vec<TimerWrite> {
        d.actions
            .iter()
            .filter(|a| self.in_append(a))
            .filter_map(|a| match a.kind.request(load) {
                Request::ScheduleTimer { timer_id, fire_at } => Some(TimerWrite::Schedule { timer_id, fire_at }),
                Request::CancelTimer { timer_id } => Some(TimerWrite::Cancel { timer_id }),
                Request::Send(_) => None,
            })
            .collect()
    }

    /// The outcomes that settle `d`'s timer actions the append carries out, each with
    /// the filter's decision on it, decided on `after` (the load's state after `d`; the
    /// decision's keys are distinct, so one outcome never bears on another's); none
    /// through the outbox. `Err(key)` when an action's outcome is in the log already:
    /// the decision reused that key, as a taken outbox key would have said.
    pub fn settled(
        self,
        load: &LoadId,
        after: &LoadState,
        d: &Decision,
        now: Timestamp,
    ) -> Result<Vec<(InboundEvent, Decision)>, String> {
        let mut out = Vec::new();
        for a in d.actions.iter().filter(|a| self.in_append(a)) {
            let row = Row {
                outbox_id: a.key.clone(),
                load_id: load.clone(),
                action_type: a.action_type(),
                attempts: 0,
                first_attempt_at: None,
                created_at: now,
                trace: None,
            };
            let outcome = outcome_event(&row, OutcomeStatus::Delivered, Some(RECEIPT), None);
            if after.processed.contains(&outcome.event_id) {
                return Err(a.key.clone());
            }
            let noop = filter::delivered(after, &outcome.event_id, &a.key, now);
            out.push((outcome, noop));
        }
        Ok(out)
    }
}

/// The receipt of a timer action the append carried out: the TimerStore's write is
/// the decision's commit. Whether a cancel found its timer still scheduled (one that
/// fired first stays fired) is the TimerStore's to say.
pub const RECEIPT: &str = "committed with its decision";

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::log::Record;
    use crate::projection::project;
    use crate::testing::load;

    fn now() -> Timestamp {
        "2026-03-02T07:00:00Z".parse().unwrap()
    }

    fn action(v: serde_json::Value) -> Action {
        serde_json::from_value(v).unwrap()
    }

    const SMS: &str = "L1/ask:eta_request:p1/1/send_sms";
    const SET: &str = "L1/ask:eta_request:p1/1/set_timer";
    const CANCEL: &str = "L1/ask:eta_request:p0/2/cancel_timer";

    /// A decision that sends an SMS, sets a timer and cancels another.
    fn decision() -> Decision {
        let actions = vec![
            action(json!({"key": SMS, "type": "send_sms", "ask_id": "ask:eta_request:p1", "step": 1,
                          "params": {"to": "+15555550100", "body": "ETA?"}})),
            action(json!({"key": SET, "type": "set_timer", "ask_id": "ask:eta_request:p1", "step": 1,
                          "params": {"timer_id": "tmr:L1:ask:eta_request:p1:1", "fire_at": "2026-03-02T07:30:00Z",
                                     "ask_id": "ask:eta_request:p1", "step": 1}})),
            action(json!({"key": CANCEL, "type": "cancel_timer", "ask_id": "ask:eta_request:p0", "step": 2,
                          "params": {"timer_id": "tmr:L1:ask:eta_request:p0:2"}})),
        ];
        Decision::new(&crate::EventId::parse("p1").unwrap(), now(), "sop", actions, vec![], "r")
    }

    #[test]
    fn only_timer_actions_go_into_the_append_and_only_with_the_decision() {
        let d = decision();
        let routed = |route: TimerRoute| d.actions.iter().filter(|a| route.in_append(a)).count();
        assert_eq!((routed(TimerRoute::WithDecision), routed(TimerRoute::Outbox)), (2, 0));
        assert_eq!(TimerRoute::default(), TimerRoute::WithDecision);
    }

    #[test]
    fn a_decision_s_timer_writes_are_its_timer_actions_in_order() {
        assert_eq!(TimerRoute::Outbox.writes(&load(), &decision()), vec![]);
        let writes = TimerRoute::WithDecision.writes(&load(), &decision());
        let want = vec![
            TimerWrite::Schedule {
                timer_id: crate::TimerId::parse("tmr:L1:ask:eta_request:p1:1").unwrap(),
                fire_at: "2026-03-02T07:30:00Z".parse().unwrap(),
            },
            TimerWrite::Cancel { timer_id: crate::TimerId::parse("tmr:L1:ask:eta_request:p0:2").unwrap() },
        ];
        assert_eq!(writes, want);
    }

    /// The records the dispatcher's path would leave for each timer action: its
    /// delivered outcome, then the filter's noop on it.
    #[test]
    fn timer_actions_settle_as_delivered_outcomes_the_filter_takes() {
        let settled = TimerRoute::WithDecision.settled(&load(), &LoadState::default(), &decision(), now()).unwrap();
        assert_eq!(TimerRoute::Outbox.settled(&load(), &LoadState::default(), &decision(), now()), Ok(vec![]));
        let got: Vec<(String, String, bool, usize)> = settled
            .iter()
            .map(|(e, d)| (e.event_id.to_string(), d.decider.clone(), d.filtered, d.actions.len()))
            .collect();
        let want = [SET, CANCEL].map(|k| (format!("evt:out:{k}:delivered"), "filter".to_owned(), true, 0));
        assert_eq!(got, want);
        let (e, d) = &settled[0];
        let crate::EventBody::ActionOutcome(o) = &e.body else { panic!("{e:?}") };
        assert_eq!(
            (o.receipt.as_deref(), o.internal, d.rationale.as_str()),
            (Some(RECEIPT), true, "L1/ask:eta_request:p1/1/set_timer delivered")
        );
    }

    /// An outcome already in the log means the decision reused its key: refused, as
    /// the outbox refuses a taken key.
    #[test]
    fn a_reused_timer_key_is_refused() {
        let settled = |state: &LoadState| TimerRoute::WithDecision.settled(&load(), state, &decision(), now());
        let first = settled(&LoadState::default()).unwrap();
        let mut records = vec![];
        for (e, d) in &first {
            records.extend(Record::appended(records.len() as u64, e, d, now()));
        }
        let mut state = project(&records);
        assert_eq!(settled(&state), Err(SET.to_owned()));
        // The first one new, the second taken: still refused, by the second's key.
        state.processed.remove(&first[0].0.event_id);
        assert_eq!(settled(&state), Err(CANCEL.to_owned()));
    }
}
