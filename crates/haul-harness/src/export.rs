//! `haul export-scenario`: one real load's log as an eval scenario (docs/scenarios.md),
//! so a behaviour seen in production becomes a test that `haul eval` runs.
//!
//! - Every event of the log is published at the time its decision was made (events of
//!   one instant in one step, in log order). haul's own events (`timer_fired`,
//!   `action_outcome`) are published too: the pipeline makes the same ids when it fires
//!   the timer or dispatches the action, and the queue and the log keep one of each.
//! - A failed outcome of an action the load decided becomes a `permanent` `[[fault]]` on
//!   its channel and key, and its outcome comes at the step that decided the action:
//!   the log does not say when the dispatcher's retries happened, so a failure after
//!   retries is played as one at the first attempt (the outcome's text is the recorded
//!   one, so the Hero task it makes reads the same). An action's delivered outcome comes
//!   at that step too (a transient failure the log does not show is not played).
//! - An ask's SMS with no outcome, whose ask took a later step, was superseded while it
//!   was held back (docs/design.md): it becomes a `rate_limited` fault whose
//!   `retry_after` reaches that step, so the replay holds it until it is superseded.
//! - The expectations are what the recorded decisions imply, at each step: the
//!   decisions (decider, filtered, action types), exactly the calls the services took
//!   (the delivered outcomes), the dead rows (the failed ones), the timers scheduled and
//!   canceled, and at the end the open asks and the stage.
//! - Phone numbers become fixed fakes (`+15550000001`, … in order of appearance), the
//!   same number the same fake everywhere in the file; SMS bodies stay unless asked
//!   (`mask_bodies`), and a masked body keeps whether it reports trouble (SOP rule 4).
//!
//! Timing is exact for logs an eval or a fake clock made. A log from production was
//! decided on a real clock: a timer the pump fired seconds after its `fire_at` fires
//! in the scenario at the first step at or after it, which may be an earlier one.

use std::collections::{BTreeMap, BTreeSet};

use haul_config::ClientConfig;
use haul_core::action::{Action, ActionKind};
use haul_core::decision::{DECISION_RECORDED, Decision};
use haul_core::event::{ActionOutcome, EventBody};
use haul_core::ids::{LoadId, TimerId};
use haul_core::projection::{Entry, Record, project};
use haul_core::timers;
use haul_core::{InboundEvent, OutcomeStatus, Timestamp};
use toml::{Table, Value};

/// Steps a scenario may have (the runner's bound).
const MAX_STEPS: usize = 1000;

#[derive(Clone, Copy, Debug, Default)]
pub struct ExportOptions {
    /// Keep phone numbers as they are (default: fixed fakes).
    pub keep_phones: bool,
    /// Replace inbound SMS bodies (default: kept).
    pub mask_bodies: bool,
}

/// One event of the log, with its decision when it has one.
struct Logged {
    event: InboundEvent,
    decision: Option<Decision>,
    at: Timestamp,
}

fn s(v: impl Into<String>) -> Value {
    Value::String(v.into())
}

/// The scenario file for `load`, from its whole log. `clients` are the policies in
/// force (the file carries the ones its load's client needs, so it runs alone).
pub fn scenario(
    load: &LoadId,
    records: &[Record],
    clients: &BTreeMap<String, ClientConfig>,
    opts: ExportOptions,
) -> anyhow::Result<String> {
    anyhow::ensure!(!records.is_empty(), "load {load} has no records");
    let mut logged: Vec<Logged> = Vec::new();
    let mut last = records[0].recorded_at;
    for r in records {
        match &r.entry {
            Entry::Decision(d) => {
                if let Some(l) = logged.last_mut().filter(|l| l.event.event_id == d.event_id && l.decision.is_none()) {
                    l.at = d.decided_at.max(last);
                    last = l.at;
                    l.decision = Some(d.clone());
                }
            }
            // A decision that does not read is left out, as the worker would have.
            Entry::Unreadable { kind, .. } if kind == DECISION_RECORDED => {}
            Entry::Event { event_id, body } => {
                last = r.recorded_at.max(last);
                let event = InboundEvent { load_id: load.clone(), event_id: event_id.clone(), body: body.clone() };
                logged.push(Logged { event, decision: None, at: last });
            }
            Entry::Unreadable { reason, .. } => {
                anyhow::bail!("record {} ({}) of load {load} does not read: {reason}", r.seq, r.entry_id)
            }
        }
    }
    let actions: BTreeMap<String, Action> = logged
        .iter()
        .filter_map(|l| l.decision.as_ref())
        .flat_map(|d| d.actions.iter())
        .map(|a| (a.key.clone(), a.clone()))
        .collect();
    // An outcome comes when the dispatcher first sends the action: in the scenario, at
    // the step that decided it.
    // (Transitively: an action decided on an outcome that came earlier comes earlier too.)
    let mut decided: BTreeMap<String, Timestamp> = BTreeMap::new();
    for l in logged.iter_mut() {
        if let EventBody::ActionOutcome(o) = &l.event.body
            && let Some(at) = decided.get(&o.outbox_id)
        {
            l.at = (*at).min(l.at);
        }
        for a in l.decision.iter().flat_map(|d| d.actions.iter()) {
            decided.insert(a.key.clone(), l.at);
        }
    }
    logged.sort_by_key(|l| l.at);

    let mut doc = Table::new();
    doc.insert("name".into(), s(format!("load {load} as recorded")));
    // `[load]` from the first event when it is the `load:init` the section stands for.
    let init = logged.first().filter(|l| l.event.event_id.as_str() == "load:init").and_then(|l| match &l.event.body {
        EventBody::LoadUpdate(u) => Some(u.clone()),
        _ => None,
    });
    let start = logged.first().map_or(records[0].recorded_at, |l| l.at);
    doc.insert("start".into(), s(start.to_string()));
    let mut client_names: BTreeSet<String> = BTreeSet::new();
    for l in &logged {
        if let EventBody::LoadUpdate(u) = &l.event.body
            && let Some(c) = &u.client
        {
            client_names.insert(c.clone());
        }
    }
    let mut client_table = Table::new();
    for name in &client_names {
        let c = clients.get(name).cloned().unwrap_or_default();
        let p = haul_config::policies(&BTreeMap::from([(name.clone(), c)])).for_client(Some(name));
        let mut eta = Table::new();
        eta.insert("retry_after".into(), s(haul_core::time::format_duration(p.retry_after)));
        eta.insert("max_attempts".into(), Value::Integer(i64::from(p.max_attempts)));
        eta.insert("trigger_risk".into(), s(p.trigger_risk.as_str()));
        client_table
            .insert(name.clone(), Value::Table(Table::from_iter([("eta_request".to_string(), Value::Table(eta))])));
    }
    if !client_table.is_empty() {
        doc.insert("clients".into(), Value::Table(client_table));
    }
    let mut rest: &[Logged] = &logged;
    if let Some(u) = &init {
        let mut t = Table::new();
        t.insert("id".into(), s(load.as_str()));
        for (k, v) in
            [("client", &u.client), ("driver_phone", &u.driver_phone), ("stage", &u.stage), ("next_stop", &u.next_stop)]
        {
            if let Some(v) = v {
                t.insert(k.into(), s(v.clone()));
            }
        }
        doc.insert("load".into(), Value::Table(t));
        rest = &logged[1..];
    }
    // Faults: the failed outcomes.
    let mut faults = Vec::new();
    for l in &logged {
        if let EventBody::ActionOutcome(o) = &l.event.body
            && o.status == OutcomeStatus::Failed
            && !from_a_report(o)
            && actions.contains_key(&o.outbox_id)
            && let Some(channel) = o.action_type.channel()
        {
            let mut f = Table::new();
            f.insert("channel".into(), s(channel.scenario_name()));
            f.insert("key".into(), s(o.outbox_id.clone()));
            f.insert("kind".into(), s("permanent"));
            faults.push(Value::Table(f));
        }
    }
    // An ask's SMS with no outcome at all, whose ask took a later step: it was held back
    // (a send rate, a 429) until it was superseded, never sent. The log does not say by
    // what; the scenario plays a 429 whose `Retry-After` reaches the later step, so the
    // replay holds it and supersedes it too (up to the dispatcher's bounds: a gap past
    // 15 minutes ends in attempts, not a supersession).
    let outcomes: BTreeSet<&str> = logged
        .iter()
        .filter_map(|l| match &l.event.body {
            EventBody::ActionOutcome(o) => Some(o.outbox_id.as_str()),
            _ => None,
        })
        .collect();
    for (key, a) in &actions {
        let (ActionKind::SendSms { .. }, Some(ask), Some(step), Some(at)) =
            (&a.kind, &a.ask_id, a.step, decided.get(key))
        else {
            continue;
        };
        let later = actions
            .values()
            .filter(|b| b.ask_id.as_ref() == Some(ask) && b.step.is_some_and(|s| s > step))
            .filter_map(|b| decided.get(&b.key))
            .min();
        if outcomes.contains(key.as_str()) || later.is_none() {
            continue;
        }
        let gap_ms = later.map_or(0, |l| l.as_millisecond() - at.as_millisecond()).max(0);
        let mut f = Table::new();
        f.insert("channel".into(), s("sms"));
        f.insert("key".into(), s(key.clone()));
        f.insert("kind".into(), s("rate_limited"));
        f.insert("retry_after".into(), s(format!("{}s", (gap_ms + 999) / 1000)));
        faults.push(Value::Table(f));
    }
    if !faults.is_empty() {
        doc.insert("fault".into(), Value::Array(faults));
    }
    // Steps: one per instant.
    let mut steps: Vec<Value> = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        let at = rest[i].at;
        let group: Vec<&Logged> = rest[i..].iter().take_while(|l| l.at == at).collect();
        i += group.len();
        let mut step = Table::new();
        step.insert("at".into(), s(at.to_string()));
        let inbound: Vec<Value> = group.iter().map(|l| inbound(&l.event, init.is_none(), opts)).collect();
        step.insert("inbound".into(), Value::Array(inbound));
        step.insert("expect".into(), Value::Table(expect(&group, &actions)));
        steps.push(Value::Table(step));
    }
    anyhow::ensure!(
        steps.len() <= MAX_STEPS,
        "load {load} makes {} steps; a scenario has at most {MAX_STEPS}",
        steps.len()
    );
    // At the end: the open asks and the stage the log folds to.
    if init.is_some()
        && let Some(Value::Table(last)) = steps.last_mut()
        && let Some(Value::Table(e)) = last.get_mut("expect")
    {
        let state = project(records);
        e.insert("open_asks".into(), Value::Array(state.open_asks().map(|a| s(a.ask_id.to_string())).collect()));
        if let Some(stage) = &state.stage {
            e.insert("stage".into(), s(stage.clone()));
        }
    }
    if !steps.is_empty() {
        doc.insert("step".into(), Value::Array(steps));
    }
    let mut doc = Value::Table(doc);
    if !opts.keep_phones {
        let mut fakes = BTreeMap::new();
        mask_phones(&mut doc, &mut fakes);
    }
    let body = toml::to_string(&doc)?;
    Ok(format!(
        "# Why: load {load} as it was recorded, exported by haul export-scenario: its events at the times they \
         were decided, its failed actions as faults, and what its recorded decisions imply as expectations.\n{}\n",
        body
    ))
}

fn inbound(event: &InboundEvent, with_load: bool, opts: ExportOptions) -> Value {
    let mut v = event.to_json();
    if opts.mask_bodies
        && let EventBody::InboundSms(sms) = &event.body
    {
        let trouble = haul_core::sop::reports_trouble(&sms.body);
        v["body"] = serde_json::json!(if trouble { "masked message: delayed" } else { "masked message" });
    }
    if with_load {
        v["load"] = serde_json::json!(event.load_id.as_str());
    }
    serde_json::from_value(v).unwrap_or(Value::Table(Table::new()))
}

/// Whether a failed outcome came from a delivery report (the service took the message,
/// then said it was not delivered): played as the event it is, not as a fault, and the
/// row it names was sent, not dead.
fn from_a_report(o: &ActionOutcome) -> bool {
    o.failure.as_deref().is_some_and(haul_core::receipt::is_report_failure)
}

/// Whether a delivered `cancel_timer` found its timer scheduled. The dispatcher's
/// receipt says; a cancel committed with its decision (`haul_core::timers`) found it
/// scheduled when it was decided before the timer's fire_at: at or after it, the pump,
/// which runs first in a scenario's step, has fired it.
fn canceled_a_timer(o: &ActionOutcome, timer_id: &TimerId, at: Timestamp, actions: &BTreeMap<String, Action>) -> bool {
    match o.receipt.as_deref() {
        Some("canceled") => true,
        Some(timers::RECEIPT) => actions.values().any(|a| match &a.kind {
            ActionKind::SetTimer { timer_id: set, fire_at, .. } => set == timer_id && at < *fire_at,
            _ => false,
        }),
        _ => false,
    }
}

/// What the step's recorded decisions and outcomes imply.
fn expect(group: &[&Logged], actions: &BTreeMap<String, Action>) -> Table {
    let mut e = Table::new();
    let mut decisions = Vec::new();
    let (mut sent, mut dead, mut scheduled, mut canceled) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in group {
        if let Some(d) = &l.decision {
            let mut t = Table::new();
            t.insert("event_id".into(), s(d.event_id.to_string()));
            t.insert("decider".into(), s(d.decider.clone()));
            t.insert("filtered".into(), Value::Boolean(d.filtered));
            t.insert("actions".into(), Value::Array(d.actions.iter().map(|a| s(a.action_type().as_str())).collect()));
            decisions.push(Value::Table(t));
        }
        let EventBody::ActionOutcome(o) = &l.event.body else { continue };
        match o.status {
            OutcomeStatus::Failed if actions.contains_key(&o.outbox_id) && !from_a_report(o) => {
                dead.push(s(o.outbox_id.clone()))
            }
            OutcomeStatus::Failed => {}
            OutcomeStatus::Delivered => {
                let Some(a) = actions.get(&o.outbox_id) else { continue };
                match (&a.kind, a.action_type().channel()) {
                    (ActionKind::SetTimer { timer_id, fire_at, .. }, _)
                        if matches!(o.receipt.as_deref(), Some("scheduled" | timers::RECEIPT)) =>
                    {
                        let mut t = Table::new();
                        t.insert("id".into(), s(timer_id.to_string()));
                        t.insert("fire_at".into(), s(fire_at.to_string()));
                        scheduled.push(Value::Table(t));
                    }
                    (ActionKind::CancelTimer { timer_id }, _) if canceled_a_timer(o, timer_id, l.at, actions) => {
                        canceled.push(s(timer_id.to_string()));
                    }
                    (kind, Some(channel)) => {
                        let mut t = Table::new();
                        t.insert("channel".into(), s(channel.scenario_name()));
                        t.insert("key".into(), s(a.key.clone()));
                        match kind {
                            ActionKind::SendSms { to, .. } => {
                                t.insert("to".into(), s(to.clone()));
                            }
                            ActionKind::CreateHeroTask { urgency, .. } => {
                                t.insert("urgency".into(), s(urgency.as_str()));
                            }
                            // No `sent` key of the format names these actions' fields
                            // (docs/scenarios.md); a new action type is named here.
                            ActionKind::PostHeroSlack { .. }
                            | ActionKind::UpdateStage { .. }
                            | ActionKind::SetTimer { .. }
                            | ActionKind::CancelTimer { .. } => {}
                        }
                        sent.push(Value::Table(t));
                    }
                    _ => {}
                }
            }
        }
    }
    e.insert("decisions".into(), Value::Array(decisions));
    e.insert("sent".into(), Value::Array(sent));
    e.insert("dead".into(), Value::Array(dead));
    e.insert("timers_scheduled".into(), Value::Array(scheduled));
    e.insert("timers_canceled".into(), Value::Array(canceled));
    e
}

/// Replaces every phone number (`+` and 7 to 15 digits) in every string with a fake,
/// the same fake for the same number.
fn mask_phones(v: &mut Value, fakes: &mut BTreeMap<String, String>) {
    match v {
        Value::String(text) => *text = mask_text(text, fakes),
        Value::Array(a) => a.iter_mut().for_each(|x| mask_phones(x, fakes)),
        Value::Table(t) => t.iter_mut().for_each(|(_, x)| mask_phones(x, fakes)),
        _ => {}
    }
}

fn mask_text(text: &str, fakes: &mut BTreeMap<String, String>) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '+' {
            let digits: String = chars[i + 1..].iter().take_while(|c| c.is_ascii_digit()).collect();
            if (7..=15).contains(&digits.len()) {
                let phone = format!("+{digits}");
                let n = fakes.len() + 1;
                let fake = fakes.entry(phone).or_insert_with(|| format!("+1555000{n:04}")).clone();
                out.push_str(&fake);
                i += 1 + digits.len();
                continue;
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phones_become_the_same_fake_everywhere() {
        let mut fakes = BTreeMap::new();
        let mut check = |input: &str, want: &str| assert_eq!(mask_text(input, &mut fakes), want, "{input}");
        check("+15555550100", "+15550000001");
        check("call +15555550199 or +15555550100", "call +15550000002 or +15550000001");
        check("+1 not a phone, +123456 too short", "+1 not a phone, +123456 too short");
        check("+15555550100", "+15550000001");
    }
}
