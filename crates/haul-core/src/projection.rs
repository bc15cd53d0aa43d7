//! `project(records) -> LoadState`: load state as a pure fold of the log.
//!
//! The fold is total: a record it cannot read (a corrupt row, a kind from a newer
//! version) is counted in `unreadable` and skipped, never a panic, so one bad row
//! cannot poison a load. `LoadState::apply` is the fold's step, which is what lets a
//! cached snapshot plus the records after it equal the full fold.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::action::ActionType;
use crate::consent::Keyword;
use crate::decision::{AskStatus, Decision, InboxState};
use crate::event::{EventBody, InboundEvent, OperatorCommand, TimerFired};
use crate::ids::{AskId, EventId};
use crate::outcome::OutcomeStatus;
use crate::spend::{LoadSpend, Scope};
use crate::time::Timestamp;

pub use crate::log::{Entry, Record};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAsk {
    pub ask_id: AskId,
    pub kind: String,
    pub step: u32,
    pub opened_at: Timestamp,
    /// `decided_at` of the decision that took the current step: the timer anchor.
    pub step_decided_at: Timestamp,
    pub status: AskStatus,
    /// The event whose decision answered it, while it stays answered: what an
    /// operator's `unassign_sms` finds to undo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<EventId>,
}

impl OpenAsk {
    /// True only when the ask is open and the timer is for its current step. A timer
    /// for a resolved ask, or for a step already passed, is a noop (ADR 0003).
    pub fn is_timer_current(&self, timer: &TimerFired) -> bool {
        self.status == AskStatus::Open && timer.ask_id == self.ask_id && timer.step == self.step
    }
}

/// The latest outcome recorded for one action key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeSeen {
    pub status: OutcomeStatus,
    pub event_id: String,
    pub at: Timestamp,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadState {
    /// `seq` of the last record folded in; 0 for an empty log.
    pub version: u64,
    pub client: Option<String>,
    pub driver_phone: Option<String>,
    pub stage: Option<String>,
    pub next_stop: Option<String>,
    pub asks: BTreeMap<AskId, OpenAsk>,
    /// Latest outcome per action key (outbox id).
    pub outcomes: BTreeMap<String, OutcomeSeen>,
    /// Inbound event ids in the log.
    pub processed: BTreeSet<EventId>,
    /// Event ids that have their `decision_recorded`.
    pub decided: BTreeSet<EventId>,
    /// Records the fold could not read.
    pub unreadable: u64,
    /// Dead rows an operator requeued: the dead row's key, the key of the row that
    /// carries its action again. One requeue per dead row: a second is a noop.
    #[serde(default)]
    pub requeues: BTreeMap<String, String>,
    /// MessageSids of unmatched SMS an operator assigned to this load, so one is
    /// handled once however many requests assign it.
    #[serde(default)]
    pub assigned_sms: BTreeSet<String>,
    /// The operator event that assigned each of `assigned_sms` here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub assigned_sms_by: BTreeMap<String, EventId>,
    /// Dead rows taken out of the operators' inbox, and how (handled or dismissed);
    /// a dead row not here is open.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inbox: BTreeMap<String, InboxState>,
    pub last_recorded_at: Option<Timestamp>,
    /// The driver phone that opted out of SMS (an inbound STOP, or the service's
    /// refusal of an opted-out number), until it opts in again (`crate::consent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms_opt_out: Option<SmsOptOut>,
    /// What the load's model calls cost over its life (`crate::spend`).
    #[serde(default, skip_serializing_if = "LoadSpend::is_zero")]
    pub spend: LoadSpend,
}

/// A phone's opt-out of SMS: which phone, by which event, when.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsOptOut {
    pub phone: String,
    pub event_id: String,
    pub at: Option<Timestamp>,
}

pub const STAGE_DELIVERED: &str = "delivered";

impl LoadState {
    pub fn is_delivered(&self) -> bool {
        self.stage.as_deref() == Some(STAGE_DELIVERED)
    }

    /// Whether the load's driver phone opted out of SMS.
    pub fn sms_opted_out(&self) -> bool {
        self.sms_opt_out.as_ref().is_some_and(|o| self.driver_phone.as_deref() == Some(o.phone.as_str()))
    }

    /// The client a decision on `event` is charged to (`crate::spend`): the load's, or
    /// the one the event itself gives the load (a `load_update` setting it is decided
    /// before it applies).
    pub fn charged_client(&self, event: &InboundEvent) -> Option<String> {
        match &event.body {
            EventBody::LoadUpdate(u) if u.client.is_some() => u.client.clone(),
            _ => self.client.clone(),
        }
    }

    /// The phone an SMS to the driver may go to: the driver's, unless it opted out.
    pub fn sms_phone(&self) -> Option<&str> {
        self.driver_phone.as_deref().filter(|_| !self.sms_opted_out())
    }

    pub fn open_asks(&self) -> impl Iterator<Item = &OpenAsk> {
        self.asks.values().filter(|a| a.status == AskStatus::Open)
    }

    pub fn open_ask_of_kind(&self, kind: &str) -> Option<&OpenAsk> {
        self.open_asks().find(|a| a.kind == kind)
    }

    /// Folds one record in. Records must come in `seq` order.
    pub fn apply(&mut self, r: &Record) {
        self.version = r.seq;
        self.last_recorded_at = Some(r.recorded_at);
        match &r.entry {
            Entry::Event { event_id, body } => self.apply_event(r.recorded_at, event_id, body),
            Entry::Decision(d) => self.apply_decision(d),
            Entry::Unreadable { .. } => self.unreadable += 1,
        }
    }

    fn apply_event(&mut self, recorded_at: Timestamp, event_id: &EventId, body: &EventBody) {
        self.processed.insert(event_id.clone());
        match body {
            EventBody::LoadUpdate(u) => {
                let replace = |old: &mut Option<String>, new: &Option<String>| {
                    if new.is_some() {
                        old.clone_from(new);
                    }
                };
                replace(&mut self.client, &u.client);
                replace(&mut self.driver_phone, &u.driver_phone);
                replace(&mut self.stage, &u.stage);
                replace(&mut self.next_stop, &u.next_stop);
            }
            EventBody::ActionOutcome(o) => {
                let refused = o.failure.as_deref().is_some_and(crate::consent::refused_as_opted_out);
                if o.status == OutcomeStatus::Failed && o.action_type == ActionType::SendSms && refused {
                    self.opt_out(event_id, recorded_at);
                }
                let seen = OutcomeSeen { status: o.status, event_id: event_id.to_string(), at: recorded_at };
                // A delivered outcome proves the effect happened; a later failed one
                // (a second dispatcher's late attempt) does not undo that.
                let keep_delivered =
                    matches!(self.outcomes.get(&o.outbox_id), Some(s) if s.status == OutcomeStatus::Delivered);
                if !keep_delivered {
                    self.outcomes.insert(o.outbox_id.clone(), seen);
                }
            }
            EventBody::OperatorAction(op) => {
                match &op.command {
                    OperatorCommand::AssignSms { message_sid, from, body } => {
                        self.assigned_sms.insert(message_sid.clone());
                        self.assigned_sms_by.insert(message_sid.clone(), event_id.clone());
                        self.consent_of(event_id, recorded_at, from, body);
                    }
                    // The SMS is another load's now: assigned here again later, it is
                    // handled again.
                    OperatorCommand::UnassignSms { message_sid, .. } => {
                        self.assigned_sms.remove(message_sid);
                        self.assigned_sms_by.remove(message_sid);
                    }
                    _ => {}
                }
            }
            EventBody::InboundSms(sms) => self.consent_of(event_id, recorded_at, &sms.from, &sms.body),
            EventBody::LocationPing(_) | EventBody::TimerFired(_) => {}
        }
    }

    /// An SMS `from` the driver that is STOP or START (`crate::consent`), however it
    /// reached the load: the webhook's, or one an operator assigned.
    fn consent_of(&mut self, event_id: &EventId, at: Timestamp, from: &str, body: &str) {
        if self.driver_phone.as_deref() != Some(from) {
            return;
        }
        match crate::consent::keyword(body) {
            Some(Keyword::OptOut) => self.opt_out(event_id, at),
            Some(Keyword::OptIn) => self.sms_opt_out = None,
            Some(Keyword::Help) | None => {}
        }
    }

    /// The driver's phone opts out of SMS (kept from the first opt-out on).
    fn opt_out(&mut self, event_id: &EventId, at: Timestamp) {
        let Some(phone) = self.driver_phone.clone() else { return };
        if self.sms_opted_out() {
            return;
        }
        self.sms_opt_out = Some(SmsOptOut { phone, event_id: event_id.to_string(), at: Some(at) });
    }

    /// True when the SMS with this MessageSid was handled on this load already: it came
    /// from the webhook as `sms:{sid}`, or an operator assigned it here.
    pub fn has_sms(&self, message_sid: &str) -> bool {
        self.assigned_sms.contains(message_sid)
            || EventId::twilio_sms(message_sid).is_ok_and(|id| self.processed.contains(&id))
    }

    /// Where the dead row `key` stands in the operators' inbox.
    pub fn inbox_state(&self, key: &str) -> InboxState {
        self.inbox.get(key).copied().unwrap_or(InboxState::Open)
    }

    /// The rows of `key`'s requeue chain, first the dead row an operator first requeued,
    /// then each copy in turn: one problem, however many times it was sent again.
    pub fn requeue_chain(&self, key: &str) -> Vec<String> {
        let mut root = key;
        // A chain is as long as the requeues; the bound only guards a log whose
        // requeues loop, which no decision makes.
        for _ in 0..=self.requeues.len() {
            match self.requeues.iter().find(|(_, copy)| copy.as_str() == root) {
                Some((dead, _)) => root = dead,
                None => break,
            }
        }
        let mut chain = vec![root.to_owned()];
        while let Some(copy) = self.requeues.get(chain.last().map(String::as_str).unwrap_or_default()) {
            if chain.len() > self.requeues.len() {
                break;
            }
            chain.push(copy.clone());
        }
        chain
    }

    /// The rows of `key`'s requeue chain that failed and are still open in the inbox.
    pub fn open_dead_in_chain(&self, key: &str) -> Vec<String> {
        self.requeue_chain(key)
            .into_iter()
            .filter(|k| self.outcomes.get(k).is_some_and(|o| o.status == OutcomeStatus::Failed))
            .filter(|k| self.inbox_state(k) == InboxState::Open)
            .collect()
    }

    fn apply_decision(&mut self, d: &Decision) {
        self.decided.insert(d.event_id.clone());
        if let Some(u) = &d.llm {
            self.spend.spend.add(u);
        }
        if d.budget.as_ref().is_some_and(|b| b.scope == Scope::Load) {
            self.spend.capped = true;
        }
        for a in &d.actions {
            if let Some(dead) = &a.requeue_of {
                self.requeues.insert(dead.clone(), a.key.clone());
            }
        }
        for change in &d.inbox {
            self.inbox.insert(change.outbox_id.clone(), change.state);
        }
        for change in &d.asks {
            let ask = self.asks.entry(change.ask_id.clone()).or_insert_with(|| OpenAsk {
                ask_id: change.ask_id.clone(),
                kind: change.ask_id.kind().to_owned(),
                step: change.step,
                opened_at: d.decided_at,
                step_decided_at: d.decided_at,
                status: change.status,
                answered_by: None,
            });
            if ask.step != change.step {
                ask.step = change.step;
                ask.step_decided_at = d.decided_at;
            }
            ask.status = change.status;
            ask.answered_by = (change.status == AskStatus::Answered).then(|| d.event_id.clone());
        }
    }
}

/// The state of a load: the fold of its log from the empty state.
pub fn project(records: &[Record]) -> LoadState {
    let mut state = LoadState::default();
    for r in records {
        state.apply(r);
    }
    state
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What the projection counts besides the asks: the version, the records it could
    /// not read (inspect and the console warn with the count), the stage.
    #[test]
    fn the_state_counts_unreadable_records_and_knows_delivery() {
        let at: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let record = |seq: u64, kind: &str, payload: serde_json::Value| Record {
            seq,
            entry_id: format!("e{seq}"),
            entry: Entry::decode(&format!("e{seq}"), kind, payload),
            recorded_at: at,
            trace: None,
        };
        let update = |seq, stage: &str| record(seq, "load_update", json!({"stage": stage}));
        let check = |records: &[Record], want: (u64, u64, bool)| {
            let s = project(records);
            assert_eq!((s.version, s.unreadable, s.is_delivered()), want, "{records:?}");
        };
        check(&[], (0, 0, false));
        check(&[update(1, "in_transit")], (1, 0, false));
        check(&[update(1, "in_transit"), record(2, "no_such_kind", json!({}))], (2, 1, false));
        check(
            &[
                record(1, "no_such_kind", json!({})),
                update(2, "delivered"),
                record(3, "load_update", json!({"stage": 7})),
            ],
            (3, 2, true),
        );
    }

    /// A load's lifetime spend is the fold of its decisions' model calls; a decision the
    /// SOP made past the load's budget marks it capped (a client's day does not).
    #[test]
    fn a_loads_spend_is_the_sum_of_its_model_calls() {
        let at: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let decision = |seq: u64, extra: serde_json::Value| {
            let mut payload = json!({"decision_id": format!("dec:e{seq}"), "event_id": format!("e{seq}"),
                "decided_at": "2026-03-02T07:00:00Z", "decider": "llm:m", "filtered": false,
                "needs_hero_task": false, "rationale": "r", "actions": []});
            for (k, v) in extra.as_object().unwrap() {
                payload[k] = v.clone();
            }
            Record {
                seq,
                entry_id: format!("dec:e{seq}"),
                entry: Entry::decode(&format!("dec:e{seq}"), "decision_recorded", payload),
                recorded_at: at,
                trace: None,
            }
        };
        let usage = |input: u64, cost: Option<u64>| {
            let mut u =
                json!({"model": "m", "input_tokens": input, "output_tokens": 1, "prompt_hash": "p", "input_hash": "i"});
            if let Some(c) = cost {
                u["cost_micro_usd"] = json!(c);
            }
            u
        };
        let budget = |scope: &str| json!({"scope": scope, "unit": "tokens", "limit": 1, "spent": 2, "first": true});
        let check = |records: &[Record], want: (u64, u64, u64, u64, bool)| {
            let s = project(records).spend;
            let got = (s.spend.input_tokens, s.spend.output_tokens, s.spend.cost_micro_usd, s.spend.calls, s.capped);
            assert_eq!(got, want, "{records:?}");
        };
        check(&[], (0, 0, 0, 0, false));
        check(&[decision(1, json!({}))], (0, 0, 0, 0, false));
        check(
            &[decision(1, json!({"llm": usage(10, Some(5))})), decision(2, json!({"llm": usage(7, None)}))],
            (17, 2, 5, 2, false),
        );
        check(
            &[decision(1, json!({"llm": usage(10, Some(5))})), decision(2, json!({"budget": budget("client_day")}))],
            (10, 1, 5, 1, false),
        );
        check(&[decision(1, json!({"budget": budget("load")}))], (0, 0, 0, 0, true));
        assert!(project(&[]).spend.is_zero());
    }

    /// A call is charged to the load's client, or to the one its own event gives it.
    #[test]
    fn a_call_is_charged_to_the_client_the_event_gives_or_the_loads() {
        let event =
            |body: serde_json::Value| InboundEvent::from_json(crate::ids::LoadId::parse("L1").unwrap(), body).unwrap();
        let update = event(json!({"event_id": "u1", "kind": "load_update", "client": "new"}));
        let no_client = event(json!({"event_id": "u2", "kind": "load_update", "stage": "in_transit"}));
        let check = |client: Option<&str>, e: &InboundEvent, want: Option<&str>| {
            let s = LoadState { client: client.map(str::to_owned), ..LoadState::default() };
            assert_eq!(s.charged_client(e).as_deref(), want, "{client:?} {e:?}");
        };
        check(Some("old"), &update, Some("new"));
        check(None, &update, Some("new"));
        check(Some("old"), &no_client, Some("old"));
        check(None, &no_client, None);
    }
}
