//! `haul replay`, the pure half: walk a recorded log, and for each recorded decision
//! set the state before its event beside a candidate's decision and say what differs.
//!
//! Each step is a **one-step what-if on the recorded history**: the candidate decides
//! on the state the log had before the event, at the recorded `decided_at`. After a
//! first difference, the rest of the load's history is still what really happened
//! (the recorded decisions are folded, never the candidate's), so a later difference
//! may follow from an earlier one and a later sameness may not hold had the candidate
//! been in charge. Reading the store, running the decider (which may be a model) and
//! printing live at the edge; here are the walk, the comparison and the counts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind};
use crate::decision::Decision;
use crate::event::InboundEvent;
use crate::ids::LoadId;
use crate::log::Entry;
use crate::projection::{LoadState, Record};
use crate::sop::{Policies, Rule, decide_with_rule};
use crate::time::Timestamp;
use crate::validate::validate_decision;

/// The rule an event falls under: the filter's, else the SOP's with these policies
/// (what replay and shadow mode count their comparisons by).
pub fn rule_for(policies: &Policies, load: &LoadId, state: &LoadState, event: &InboundEvent, now: Timestamp) -> Rule {
    if crate::filter::filter(load, state, event, now).is_some() {
        return Rule::Filter;
    }
    decide_with_rule(policies, load, state, event, now).1
}

/// What every report says first.
pub const ONE_STEP_NOTE: &str = "Each step is a one-step what-if on the recorded history: the candidate decides on the \
    state the log had before the event, at the recorded time. After a first difference, the rest of that load's \
    history is what really happened, not what the candidate would have caused.";

/// What a report of shadow decisions (`haul replay --shadow`) says first.
pub const SHADOW_NOTE: &str = "Shadow decisions were made live, beside the primary's: the shadow decided on the \
    state, event and time the primary decided on. Each is a one-step what-if: after a first difference, the rest of \
    that load's history is what the primary caused, not what the shadow would have. Recorded = the primary's \
    decision, candidate = the shadow's.";

/// One recorded decision with what it was made on.
#[derive(Clone, Debug)]
pub struct Step {
    pub event: InboundEvent,
    pub event_record: Record,
    pub decision_record: Record,
    pub recorded: Decision,
}

/// Walks one load's log record by record, holding only the state folded so far and
/// the event waiting for its decision: a long log is never in memory whole.
#[derive(Debug)]
pub struct Walker {
    load: LoadId,
    state: LoadState,
    /// The last record, when it was an inbound event (its decision comes next).
    pending: Option<Record>,
    /// Decisions that did not follow their event, events without a decision,
    /// records that do not read: folded, not compared.
    pub unpaired: u64,
}

impl Walker {
    pub fn new(load: LoadId) -> Self {
        Walker { load, state: LoadState::default(), pending: None, unpaired: 0 }
    }

    pub fn load(&self) -> &LoadId {
        &self.load
    }

    /// The state folded so far: before a returned [`Step`]'s event until [`finish`](Self::finish).
    pub fn state(&self) -> &LoadState {
        &self.state
    }

    /// Takes the next record (in `seq` order). Returns a step when the record is the
    /// decision of the event just before it; the caller compares, then hands the step
    /// back to [`finish`](Self::finish) to fold it.
    pub fn feed(&mut self, r: Record) -> Option<Step> {
        match &r.entry {
            Entry::Decision(recorded) => {
                let pending = self.pending.take();
                if let Some(event_record) = pending {
                    if let Entry::Event { event_id, body } = &event_record.entry
                        && recorded.event_id == *event_id
                    {
                        let event =
                            InboundEvent { load_id: self.load.clone(), event_id: event_id.clone(), body: body.clone() };
                        let recorded = recorded.clone();
                        return Some(Step { event, event_record, decision_record: r, recorded });
                    }
                    self.unpaired += 1;
                    self.state.apply(&event_record);
                }
                self.unpaired += 1;
                self.state.apply(&r);
            }
            Entry::Event { .. } => {
                self.flush();
                self.pending = Some(r);
            }
            Entry::Unreadable { .. } => {
                self.flush();
                self.unpaired += 1;
                self.state.apply(&r);
            }
        }
        None
    }

    /// Folds a step's event and its recorded decision: the history goes on as it was.
    pub fn finish(&mut self, step: Step) {
        self.state.apply(&step.event_record);
        self.state.apply(&step.decision_record);
    }

    /// The end of the log: an event still waiting for its decision is folded.
    pub fn close(mut self) -> (LoadState, u64) {
        self.flush();
        (self.state, self.unpaired)
    }

    fn flush(&mut self) {
        if let Some(r) = self.pending.take() {
            self.unpaired += 1;
            self.state.apply(&r);
        }
    }
}

/// What the worker records for a decider's answer: the decision when it validates,
/// else the fallback (one urgent Hero task), exactly as a run would.
pub fn accept(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    now: Timestamp,
    decider: &str,
    answer: Result<Decision, String>,
) -> Decision {
    let why = match answer {
        Err(e) => format!("the {decider} decider failed: {e}"),
        Ok(d) => match validate_decision(load, state, event, &d) {
            Ok(()) => return d,
            Err(why) => format!("the {decider} decision did not validate: {why}"),
        },
    };
    Decision::fallback(load, &event.event_id, event.kind(), now, &why)
}

/// One field of an action or ask as recorded and as the candidate has it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    pub field: String,
    pub recorded: Option<String>,
    pub candidate: Option<String>,
}

/// How an action differs: only one side has its key, or both with other fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum ActionChange {
    /// The candidate has it, the record does not.
    Added {
        key: String,
        action_type: String,
    },
    /// The record has it, the candidate does not.
    Removed {
        key: String,
        action_type: String,
    },
    Changed {
        key: String,
        action_type: String,
        fields: Vec<FieldChange>,
    },
}

impl ActionChange {
    pub fn action_type(&self) -> &str {
        match self {
            ActionChange::Added { action_type, .. }
            | ActionChange::Removed { action_type, .. }
            | ActionChange::Changed { action_type, .. } => action_type,
        }
    }

    pub fn key(&self) -> &str {
        match self {
            ActionChange::Added { key, .. } | ActionChange::Removed { key, .. } | ActionChange::Changed { key, .. } => {
                key
            }
        }
    }
}

/// What differs between a recorded decision and a candidate's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// `(recorded, candidate)` when one was filtered and the other not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filtered: Option<(bool, bool)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<ActionChange>,
    /// Per ask: its step and status after the decision, each side.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub asks: Vec<FieldChange>,
}

impl Difference {
    pub fn is_empty(&self) -> bool {
        self.filtered.is_none() && self.actions.is_empty() && self.asks.is_empty()
    }
}

/// The fields of an action that matter to whoever receives it, as text.
pub fn action_fields(a: &Action) -> Vec<(&'static str, String)> {
    let mut f = vec![("type", a.action_type().as_str().to_owned())];
    match &a.kind {
        ActionKind::SendSms { to, body } => {
            f.push(("to", to.clone()));
            f.push(("body", body.clone()));
        }
        ActionKind::CreateHeroTask { title, body, urgency } => {
            f.push(("title", title.clone()));
            f.push(("body", body.clone()));
            f.push(("urgency", urgency.as_str().to_owned()));
        }
        ActionKind::PostHeroSlack { channel, text } => {
            f.push(("to", channel.clone()));
            f.push(("body", text.clone()));
        }
        ActionKind::SetTimer { timer_id, fire_at, ask_id, step } => {
            f.push(("timer_id", timer_id.to_string()));
            f.push(("fire_at", fire_at.to_string()));
            f.push(("timer_ask", format!("{ask_id} step {step}")));
        }
        ActionKind::CancelTimer { timer_id } => f.push(("timer_id", timer_id.to_string())),
        ActionKind::UpdateStage { stage } => f.push(("stage", stage.clone())),
    }
    if let Some(ask) = &a.ask_id {
        f.push(("ask_id", ask.to_string()));
    }
    if let Some(step) = a.step {
        f.push(("step", step.to_string()));
    }
    f
}

/// What differs between `recorded` and `candidate`: filtered or not, the actions (by
/// key: type, recipient, body, urgency, `fire_at`, ...), the ask changes. The decider's
/// name and rationale are context, not differences.
pub fn compare(recorded: &Decision, candidate: &Decision) -> Difference {
    let mut d = Difference::default();
    if recorded.filtered != candidate.filtered {
        d.filtered = Some((recorded.filtered, candidate.filtered));
    }
    fn by_key(ds: &Decision) -> BTreeMap<&str, &Action> {
        ds.actions.iter().map(|a| (a.key.as_str(), a)).collect()
    }
    let (r, c) = (by_key(recorded), by_key(candidate));
    // Record order first, then what only the candidate has, in its order.
    let keys = recorded.actions.iter().chain(&candidate.actions).map(|a| &a.key);
    let mut seen = BTreeSet::new();
    for key in keys {
        if !seen.insert(key.clone()) {
            continue;
        }
        match (r.get(key.as_str()), c.get(key.as_str())) {
            (Some(a), None) => {
                d.actions.push(ActionChange::Removed { key: key.clone(), action_type: a.action_type().to_string() })
            }
            (None, Some(b)) => {
                d.actions.push(ActionChange::Added { key: key.clone(), action_type: b.action_type().to_string() })
            }
            (Some(a), Some(b)) if a != b => {
                let (fa, fb): (BTreeMap<_, _>, BTreeMap<_, _>) =
                    (action_fields(a).into_iter().collect(), action_fields(b).into_iter().collect());
                let names: BTreeSet<&&str> = fa.keys().chain(fb.keys()).collect();
                let fields: Vec<FieldChange> = names
                    .into_iter()
                    .filter(|n| fa.get(**n) != fb.get(**n))
                    .map(|n| FieldChange {
                        field: (*n).to_owned(),
                        recorded: fa.get(*n).cloned(),
                        candidate: fb.get(*n).cloned(),
                    })
                    .collect();
                d.actions.push(ActionChange::Changed {
                    key: key.clone(),
                    action_type: a.action_type().to_string(),
                    fields,
                });
            }
            _ => {}
        }
    }
    let asks = |ds: &Decision| -> BTreeMap<String, String> {
        ds.asks.iter().map(|a| (a.ask_id.to_string(), format!("step {} {}", a.step, a.status.as_str()))).collect()
    };
    let (ra, ca) = (asks(recorded), asks(candidate));
    let ids: BTreeSet<&String> = ra.keys().chain(ca.keys()).collect();
    for id in ids {
        if ra.get(id) != ca.get(id) {
            d.asks.push(FieldChange {
                field: id.clone(),
                recorded: ra.get(id).cloned(),
                candidate: ca.get(id).cloned(),
            });
        }
    }
    d
}

/// One side of a difference, as a reviewer reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionView {
    pub decider: String,
    pub filtered: bool,
    pub rationale: String,
    pub actions: Vec<BTreeMap<String, String>>,
}

impl DecisionView {
    pub fn of(d: &Decision) -> Self {
        let actions = d
            .actions
            .iter()
            .map(|a| {
                let mut m: BTreeMap<String, String> =
                    action_fields(a).into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                m.insert("key".into(), a.key.clone());
                m
            })
            .collect();
        DecisionView { decider: d.decider.clone(), filtered: d.filtered, rationale: d.rationale.clone(), actions }
    }
}

/// A decision that differs, with its context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    pub load_id: String,
    pub event_id: String,
    pub event_kind: String,
    /// `seq` of the event in its load's log.
    pub event_seq: u64,
    pub decided_at: Timestamp,
    pub rule: Rule,
    /// The event as logged (`{event_id, kind, ...payload}`).
    pub event: serde_json::Value,
    pub recorded: DecisionView,
    pub candidate: DecisionView,
    pub difference: Difference,
}

impl Divergence {
    pub fn new(step: &Step, rule: Rule, candidate: &Decision, difference: Difference) -> Self {
        Divergence {
            load_id: step.event.load_id.to_string(),
            event_id: step.event.event_id.to_string(),
            event_kind: step.event.kind().to_owned(),
            event_seq: step.event_record.seq,
            decided_at: step.recorded.decided_at,
            rule,
            event: step.event.to_json(),
            recorded: DecisionView::of(&step.recorded),
            candidate: DecisionView::of(candidate),
            difference,
        }
    }
}

/// Decisions compared and different for one rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCount {
    pub compared: u64,
    pub different: u64,
}

/// Actions that differ, of one type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeCount {
    pub added: u64,
    pub removed: u64,
    pub changed: u64,
}

/// The counts of a replay.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub loads: u64,
    pub records: u64,
    /// Decisions set beside a candidate's.
    pub compared: u64,
    pub same: u64,
    pub different: u64,
    /// Loads with at least one difference.
    pub loads_affected: u64,
    /// Keyed by [`Rule::label`].
    pub by_rule: BTreeMap<String, RuleCount>,
    /// Keyed by action type.
    pub by_action_type: BTreeMap<String, TypeCount>,
    /// Decisions not compared, by why (a record that does not pair, no recorded model
    /// answer, the live call budget spent).
    pub not_compared: BTreeMap<String, u64>,
}

impl Summary {
    /// Counts one compared decision.
    pub fn add(&mut self, rule: Rule, difference: &Difference) {
        self.compared += 1;
        let r = self.by_rule.entry(rule.label().to_owned()).or_default();
        r.compared += 1;
        if difference.is_empty() {
            self.same += 1;
            return;
        }
        self.different += 1;
        r.different += 1;
        for a in &difference.actions {
            let t = self.by_action_type.entry(a.action_type().to_owned()).or_default();
            match a {
                ActionChange::Added { .. } => t.added += 1,
                ActionChange::Removed { .. } => t.removed += 1,
                ActionChange::Changed { .. } => t.changed += 1,
            }
        }
    }

    pub fn skip(&mut self, why: &str, n: u64) {
        if n > 0 {
            *self.not_compared.entry(why.to_owned()).or_default() += n;
        }
    }
}

/// Shadow mode: how a shadow decider's decision stands beside the one the primary
/// recorded for the same state, event and time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// [`compare`] finds no difference.
    Same,
    Different,
    /// The shadow gave no decision to compare: it failed, did not answer in time, or
    /// its decision did not validate. Not the fallback: a failing shadow would
    /// otherwise "disagree" with every decision.
    Error,
}

impl Agreement {
    pub const ALL: [Agreement; 3] = [Agreement::Same, Agreement::Different, Agreement::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Agreement::Same => "same",
            Agreement::Different => "different",
            Agreement::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// What a shadow's answer comes to beside the primary's recorded decision: the
/// agreement, the shadow's decision (when it gave one that validates), and why not.
pub fn shadow_outcome(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    primary: &Decision,
    decider: &str,
    answer: Result<Decision, String>,
) -> (Agreement, Option<Decision>, Option<String>) {
    match answer {
        Err(e) => (Agreement::Error, None, Some(format!("the {decider} shadow failed: {e}"))),
        Ok(d) => match validate_decision(load, state, event, &d) {
            Err(why) => {
                (Agreement::Error, None, Some(format!("the {decider} shadow decision did not validate: {why}")))
            }
            Ok(()) => {
                let agreement = if compare(primary, &d).is_empty() { Agreement::Same } else { Agreement::Different };
                (agreement, Some(d), None)
            }
        },
    }
}

/// The action types a comparison concerns, for counting agreement by action type:
/// the types of either side's actions, `none` when neither has one. Bounded by the
/// action types.
pub fn action_types_of(primary: &Decision, shadow: Option<&Decision>) -> BTreeSet<&'static str> {
    let mut types: BTreeSet<&'static str> = primary
        .actions
        .iter()
        .chain(shadow.map_or(&[][..], |d| &d.actions))
        .map(|a| a.action_type().as_str())
        .collect();
    if types.is_empty() {
        types.insert("none");
    }
    types
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::EventId;
    use crate::sop::{Policies, decide_with_rule};

    fn at(s: &str) -> Timestamp {
        format!("2026-03-02T{s}:00Z").parse().unwrap()
    }

    /// A log the way the worker writes it: each event followed by the SOP's decision.
    fn log(policies: &Policies, events: &[(&str, serde_json::Value)]) -> Vec<Record> {
        let load = LoadId::parse("L1").unwrap();
        let mut state = LoadState::default();
        let mut out = Vec::new();
        for (time, ev) in events {
            let ev = InboundEvent::from_json(load.clone(), ev.clone()).unwrap();
            let now = at(time);
            let d = crate::filter::filter(&load, &state, &ev, now)
                .unwrap_or_else(|| decide_with_rule(policies, &load, &state, &ev, now).0);
            let recs = Record::appended(state.version, &ev, &d, now);
            for r in &recs {
                state.apply(r);
            }
            out.extend(recs);
        }
        out
    }

    fn policies(max_attempts: u32) -> Policies {
        let mut p = Policies::default();
        p.default.max_attempts = max_attempts;
        p
    }

    fn life() -> Vec<(&'static str, serde_json::Value)> {
        let timer = |step: u32| {
            json!({"event_id": format!("evt:tmr:tmr:L1:ask:eta_request:p1:{step}"), "kind": "timer_fired",
                   "timer_id": format!("tmr:L1:ask:eta_request:p1:{step}"), "ask_id": "ask:eta_request:p1", "step": step,
                   "fire_at": "2026-03-02T07:30:00Z"})
        };
        vec![
            ("07:00", json!({"event_id": "load:init", "kind": "load_update", "driver_phone": "+15555550100"})),
            ("07:00", json!({"event_id": "p1", "kind": "location_ping", "lat": 1.0, "lon": 1.0, "risk": "high"})),
            ("07:30", timer(1)),
            ("08:00", timer(2)),
            ("08:30", timer(3)),
        ]
    }

    /// Replays `records` with the SOP under `candidate`: (event id, changes) per difference.
    fn replay(records: &[Record], candidate: &Policies) -> (Summary, Vec<(String, Vec<String>)>) {
        let load = LoadId::parse("L1").unwrap();
        let mut w = Walker::new(load.clone());
        let mut summary = Summary::default();
        let mut diffs = Vec::new();
        for r in records {
            if let Some(step) = w.feed(r.clone()) {
                let now = step.recorded.decided_at;
                let (d, rule) = match crate::filter::filter(&load, w.state(), &step.event, now) {
                    Some(d) => (d, Rule::Filter),
                    None => decide_with_rule(candidate, &load, w.state(), &step.event, now),
                };
                let d = accept(&load, w.state(), &step.event, now, "sop", Ok(d));
                let diff = compare(&step.recorded, &d);
                summary.add(rule, &diff);
                if !diff.is_empty() {
                    let what = diff.actions.iter().map(describe).collect();
                    diffs.push((step.event.event_id.to_string(), what));
                }
                w.finish(step);
            }
        }
        let (state, unpaired) = w.close();
        assert_eq!(state, crate::projection::project(records), "the walk folds the whole log");
        summary.skip("unpaired", unpaired);
        (summary, diffs)
    }

    fn describe(a: &ActionChange) -> String {
        match a {
            ActionChange::Added { action_type, .. } => format!("+{action_type}"),
            ActionChange::Removed { action_type, .. } => format!("-{action_type}"),
            ActionChange::Changed { action_type, fields, .. } => {
                format!("{action_type} {}", fields.iter().map(|f| f.field.as_str()).collect::<Vec<_>>().join(","))
            }
        }
    }

    fn check(recorded_with: u32, candidate: u32, expected: &[(&str, &[&str])]) {
        let records = log(&policies(recorded_with), &life());
        let (summary, diffs) = replay(&records, &policies(candidate));
        let want: Vec<(String, Vec<String>)> =
            expected.iter().map(|(e, c)| (e.to_string(), c.iter().map(|s| s.to_string()).collect())).collect();
        assert_eq!(diffs, want, "recorded with {recorded_with}, candidate {candidate}");
        assert_eq!(summary.compared, 5);
        assert_eq!(summary.different as usize, expected.len());
        assert_eq!(summary.same + summary.different, summary.compared);
        assert_eq!(summary.by_rule.values().map(|r| r.compared).sum::<u64>(), 5);
        assert_eq!(summary.by_rule.values().map(|r| r.different).sum::<u64>(), summary.different);
        let changes: usize = expected.iter().map(|(_, c)| c.len()).sum();
        let counted: u64 = summary.by_action_type.values().map(|t| t.added + t.removed + t.changed).sum();
        assert_eq!(counted as usize, changes);
    }

    #[test]
    fn the_same_sop_differs_nowhere_and_fewer_attempts_escalate_sooner() {
        check(3, 3, &[]);
        check(
            3,
            2,
            &[
                // Step 2's SMS says "attempt 2 of 2".
                ("evt:tmr:tmr:L1:ask:eta_request:p1:1", &["send_sms body"]),
                // Where the record asked a third time, the candidate escalates.
                ("evt:tmr:tmr:L1:ask:eta_request:p1:2", &["-send_sms", "-set_timer", "+create_hero_task"]),
            ],
        );
    }

    #[test]
    fn compare_names_each_field() {
        let e = EventId::parse("e1").unwrap();
        let sms = |body: &str| Action {
            key: "L1/e1/send_sms".into(),
            kind: ActionKind::SendSms { to: "+15555550100".into(), body: body.into() },
            ask_id: None,
            step: None,
            requeue_of: None,
        };
        let d = |actions: Vec<Action>| Decision::new(&e, at("07:00"), "sop", actions, vec![], "why");
        assert!(compare(&d(vec![sms("a")]), &d(vec![sms("a")])).is_empty());
        let changed = compare(&d(vec![sms("a")]), &d(vec![sms("b")]));
        assert_eq!(
            changed.actions,
            vec![ActionChange::Changed {
                key: "L1/e1/send_sms".into(),
                action_type: "send_sms".into(),
                fields: vec![FieldChange {
                    field: "body".into(),
                    recorded: Some("a".into()),
                    candidate: Some("b".into())
                }],
            }]
        );
        fn names(c: &Difference) -> Vec<(&str, &str)> {
            c.actions.iter().map(|a| (a.action_type(), a.key())).collect()
        }
        assert_eq!(names(&changed), [("send_sms", "L1/e1/send_sms")]);
        assert_eq!(names(&compare(&d(vec![]), &d(vec![sms("a")]))), [("send_sms", "L1/e1/send_sms")]);
        assert_eq!(names(&compare(&d(vec![sms("a")]), &d(vec![]))), [("send_sms", "L1/e1/send_sms")]);
        let filtered = compare(&d(vec![]), &Decision::filtered(&e, at("07:00"), "x"));
        assert_eq!(filtered.filtered, Some((false, true)));
        // The rationale and the decider's name are not differences.
        let mut other = d(vec![sms("a")]);
        other.rationale = "other".into();
        other.decider = "llm:m".into();
        assert!(compare(&d(vec![sms("a")]), &other).is_empty());
    }

    #[test]
    fn a_shadow_agrees_differs_or_errs_and_a_failure_is_never_the_fallback() {
        let records = log(&policies(3), &life());
        let load = LoadId::parse("L1").unwrap();
        let mut w = Walker::new(load.clone());
        let mut seen = Vec::new();
        for r in records {
            let Some(step) = w.feed(r) else { continue };
            let now = step.recorded.decided_at;
            if crate::filter::filter(&load, w.state(), &step.event, now).is_none() {
                let answer = |max| decide_with_rule(&policies(max), &load, w.state(), &step.event, now).0;
                let outcome = |a| shadow_outcome(&load, w.state(), &step.event, &step.recorded, "sop", a);
                let (same, d, why) = outcome(Ok(answer(3)));
                assert_eq!((same, why), (Agreement::Same, None));
                let types = action_types_of(&step.recorded, d.as_ref());
                let (agreement, _, _) = outcome(Ok(answer(2)));
                seen.push((
                    step.event.event_id.to_string(),
                    agreement,
                    types.into_iter().collect::<Vec<_>>().join(","),
                ));
                let (failed, d, why) = outcome(Err("boom".into()));
                assert_eq!((failed, d), (Agreement::Error, None));
                assert_eq!(why.as_deref(), Some("the sop shadow failed: boom"));
                // A decision that does not validate (an action key of another load) is an error too.
                let mut bad = answer(3);
                if let Some(a) = bad.actions.first_mut() {
                    a.key = format!("L2/{}", a.key);
                    assert_eq!(outcome(Ok(bad)).0, Agreement::Error);
                }
            }
            w.finish(step);
        }
        let want = [
            ("load:init", Agreement::Same, "none"),
            ("p1", Agreement::Same, "send_sms,set_timer"),
            ("evt:tmr:tmr:L1:ask:eta_request:p1:1", Agreement::Different, "send_sms,set_timer"),
            ("evt:tmr:tmr:L1:ask:eta_request:p1:2", Agreement::Different, "send_sms,set_timer"),
            ("evt:tmr:tmr:L1:ask:eta_request:p1:3", Agreement::Same, "create_hero_task"),
        ];
        let want: Vec<_> = want.iter().map(|(e, a, t)| (e.to_string(), *a, t.to_string())).collect();
        assert_eq!(seen, want);
        for a in Agreement::ALL {
            assert_eq!(Agreement::parse(a.as_str()), Some(a));
        }
    }

    #[test]
    fn records_that_do_not_pair_are_folded_not_compared() {
        let records = log(&policies(3), &life());
        // Drop the first decision: its event has none, and nothing is compared for it.
        let mut broken = records.clone();
        broken.remove(1);
        let (summary, _) = replay(&broken, &policies(3));
        assert_eq!(summary.compared, 4);
        assert_eq!(summary.not_compared.get("unpaired"), Some(&1));
        // A reason with nothing skipped is not listed.
        let (whole, _) = replay(&records, &policies(3));
        assert_eq!(whole.not_compared.get("unpaired"), None);
    }

    #[test]
    fn each_record_that_does_not_pair_counts_once() {
        let records = log(&policies(3), &life());
        let unpaired = |drop: &[usize], extra: Option<Record>| {
            let mut w = Walker::new(LoadId::parse("L1").unwrap());
            let kept = records.iter().enumerate().filter(|(i, _)| !drop.contains(i)).map(|(_, r)| r.clone());
            for r in kept.chain(extra) {
                if let Some(step) = w.feed(r) {
                    w.finish(step);
                }
            }
            w.close().1
        };
        assert_eq!(unpaired(&[], None), 0);
        // A decision with no event before it.
        assert_eq!(unpaired(&[0], None), 1);
        // An event, then another event's decision: neither pairs.
        assert_eq!(unpaired(&[1, 2], None), 2);
        // A record this build cannot read; an event at the end with no decision yet.
        let unreadable = Record::decode(99, "x".into(), "teleport", json!({}), at("09:00"));
        assert_eq!(unpaired(&[], Some(unreadable)), 1);
        assert_eq!(unpaired(&[records.len() - 1], None), 1);
    }
}
