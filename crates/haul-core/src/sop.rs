//! The reference decider: the SOP of docs/design.md (`decider = "sop"`).
//!
//! A pure function of the client policies, the projected state (before the event),
//! the event and `now`. The runtime wraps it in the `Decider` trait.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind, ActionType, Urgency};
use crate::decision::{AskChange, AskStatus, Decision};
use crate::event::{EventBody, InboundEvent, InboundSms, Risk};
use crate::ids::{AskId, LoadId, TimerId, ask_action_key, event_action_key};
use crate::mask::mask_phone;
use crate::outcome::OutcomeStatus;
use crate::projection::{LoadState, OpenAsk};
use crate::time::{Timestamp, add};

pub const ETA_REQUEST: &str = "eta_request";

/// `clients.{name}.eta_request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtaPolicy {
    pub retry_after: Duration,
    pub max_attempts: u32,
    pub trigger_risk: Risk,
}

impl Default for EtaPolicy {
    fn default() -> Self {
        EtaPolicy { retry_after: Duration::from_secs(30 * 60), max_attempts: 3, trigger_risk: Risk::High }
    }
}

/// Policies per client; a load whose client has none (or no client) gets `default`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Policies {
    pub default: EtaPolicy,
    pub clients: BTreeMap<String, EtaPolicy>,
}

impl Policies {
    pub fn for_client(&self, client: Option<&str>) -> EtaPolicy {
        client.and_then(|c| self.clients.get(c)).copied().unwrap_or(self.default)
    }
}

const TROUBLE: [&str; 12] = [
    "breakdown",
    "broke down",
    "accident",
    "crash",
    "flat tire",
    "stuck",
    "delay",
    "delayed",
    "late",
    "cannot make it",
    "can't make it",
    "won't make it",
];

/// Rule 4's trouble words and phrases, case-insensitively, as whole words: the text is
/// cut into words (letters, digits and apostrophes inside a word), and a phrase matches
/// a run of consecutive words. So "LATE." and "running late" report trouble, and
/// "plate", "translate" or "chocolate" do not. Curly apostrophes (phones type them)
/// count as straight ones.
pub fn reports_trouble(text: &str) -> bool {
    let t = text.to_lowercase().replace(['\u{2019}', '\u{2018}'], "'");
    let words: Vec<&str> = t
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
        .collect();
    TROUBLE.iter().any(|phrase| {
        let phrase: Vec<&str> = phrase.split(' ').collect();
        words.windows(phrase.len()).any(|run| run == phrase.as_slice())
    })
}

pub fn decide(policies: &Policies, load: &LoadId, state: &LoadState, event: &InboundEvent, now: Timestamp) -> Decision {
    decide_with_rule(policies, load, state, event, now).0
}

/// Which rule of docs/design.md's SOP decided an event (or the deterministic filter,
/// which runs before it). `haul replay` counts decisions and differences by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The deterministic filter: no decider call.
    Filter,
    /// 1: a ping at or above the trigger risk opens an ETA request.
    Rule1,
    /// 2: a current timer with attempts left asks again.
    Rule2,
    /// 3: a current timer with no attempts left escalates to a person.
    Rule3,
    /// 4: an SMS from the driver answers the open asks.
    Rule4,
    /// 5: any other SMS goes to a person.
    Rule5,
    /// 6: a failed external action goes to a person.
    Rule6,
    /// 7: delivered closes the open asks.
    Rule7,
    /// 8: anything else: nothing to do.
    Rule8,
}

impl Rule {
    pub const ALL: [Rule; 9] = [
        Rule::Filter,
        Rule::Rule1,
        Rule::Rule2,
        Rule::Rule3,
        Rule::Rule4,
        Rule::Rule5,
        Rule::Rule6,
        Rule::Rule7,
        Rule::Rule8,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Rule::Filter => "filter",
            Rule::Rule1 => "rule 1: risk opens an ETA request",
            Rule::Rule2 => "rule 2: no answer, ask again",
            Rule::Rule3 => "rule 3: no answer, escalate",
            Rule::Rule4 => "rule 4: the driver answers",
            Rule::Rule5 => "rule 5: an SMS for a person",
            Rule::Rule6 => "rule 6: a failed action",
            Rule::Rule7 => "rule 7: delivered",
            Rule::Rule8 => "rule 8: nothing to do",
        }
    }
}

/// [`decide`], and the rule that decided.
pub fn decide_with_rule(
    policies: &Policies,
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    now: Timestamp,
) -> (Decision, Rule) {
    let policy = policies.for_client(state.client.as_deref());
    let mut d = Sop { load, state, event, now, policy, actions: vec![], asks: vec![], rule: Rule::Rule8 };
    let rationale = d.rules();
    (Decision::new(&event.event_id, now, "sop", d.actions, d.asks, rationale), d.rule)
}

/// Rules 4 and 5 for `sms` as if it were `event` (an operator assigning an unmatched
/// SMS to the load): its keys are derived from `event`. The SMS rules read no client
/// policy.
pub fn decide_sms(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    sms: &InboundSms,
    now: Timestamp,
) -> Decision {
    // An operator's SMS is the driver's consent as much as the webhook's is.
    if let Some(d) = consent(load, state, event, sms, now) {
        return d;
    }
    let mut d =
        Sop { load, state, event, now, policy: EtaPolicy::default(), actions: vec![], asks: vec![], rule: Rule::Rule8 };
    let rationale = d.sms(sms);
    Decision::new(&event.event_id, now, "sop", d.actions, d.asks, rationale)
}

/// The decision on an SMS from the load's driver that is a keyword; `None` for any
/// other SMS (a decider's).
pub fn consent(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    sms: &InboundSms,
    now: Timestamp,
) -> Option<Decision> {
    if state.driver_phone.as_deref() != Some(sms.from.as_str()) {
        return None;
    }
    let (actions, asks, why) = match crate::consent::keyword(&sms.body)? {
        crate::consent::Keyword::OptOut if state.sms_opted_out() => {
            (vec![], vec![], "the driver opted out of SMS already".to_owned())
        }
        crate::consent::Keyword::OptOut => {
            let mut actions = Vec::new();
            let mut asks = Vec::new();
            for ask in state.open_asks() {
                asks.push(AskChange { ask_id: ask.ask_id.clone(), step: ask.step, status: AskStatus::Closed });
                let timer_id = TimerId::new(load, &ask.ask_id, ask.step);
                actions.push(Action {
                    key: ask_action_key(load, &ask.ask_id, ask.step, ActionType::CancelTimer.as_str()),
                    kind: ActionKind::CancelTimer { timer_id },
                    ask_id: Some(ask.ask_id.clone()),
                    step: Some(ask.step),
                    requeue_of: None,
                });
            }
            let body = format!(
                "The driver of load {load} ({}) replied {:?}: haul sends them no SMS until they reply START. {} Call them.",
                mask_phone(&sms.from),
                sms.body.trim(),
                if asks.is_empty() { "No ask was open." } else { "The open ask is closed." }
            );
            actions.push(Action {
                key: event_action_key(load, &event.event_id, ActionType::CreateHeroTask.as_str()),
                kind: ActionKind::CreateHeroTask {
                    title: format!("Load {load}: driver opted out of SMS, call them"),
                    body,
                    urgency: Urgency::Urgent,
                },
                ask_id: None,
                step: None,
                requeue_of: None,
            });
            (
                actions,
                asks,
                format!(
                    "the driver opted out of SMS: {} open ask(s) closed, a person calls",
                    state.open_asks().count()
                ),
            )
        }
        crate::consent::Keyword::OptIn if state.sms_opted_out() => {
            (vec![], vec![], "the driver opted in to SMS again".to_owned())
        }
        // A YES with nothing to opt back in to is the driver talking: the decider's.
        crate::consent::Keyword::OptIn => return None,
        crate::consent::Keyword::Help => (vec![], vec![], "the driver asked for help: Twilio answers HELP".to_owned()),
    };
    Some(Decision::new(&event.event_id, now, crate::consent::CONSENT_DECIDER, actions, asks, why))
}

struct Sop<'a> {
    load: &'a LoadId,
    state: &'a LoadState,
    event: &'a InboundEvent,
    now: Timestamp,
    policy: EtaPolicy,
    actions: Vec<Action>,
    asks: Vec<AskChange>,
    rule: Rule,
}

impl Sop<'_> {
    fn rules(&mut self) -> String {
        let state = self.state;
        match &self.event.body {
            // Rule 1.
            EventBody::LocationPing(p) if p.risk >= self.policy.trigger_risk && !state.is_delivered() => {
                self.rule = Rule::Rule1;
                if let Some(ask) = state.open_ask_of_kind(ETA_REQUEST) {
                    return format!("risk {} but {} is already open", p.risk.as_str(), ask.ask_id);
                }
                if state.sms_opted_out() {
                    self.event_task(
                        "Driver opted out of SMS, call them for an ETA",
                        format!(
                            "Load {} is at {} risk of arriving late. Its driver opted out of SMS (STOP): call them.",
                            self.load,
                            p.risk.as_str()
                        ),
                        Urgency::Urgent,
                    );
                    return format!("risk {} but the driver opted out of SMS: a person must call", p.risk.as_str());
                }
                let Some(phone) = state.driver_phone.clone() else {
                    self.event_task(
                        "No driver phone to ask for an ETA",
                        format!(
                            "Load {} is at {} risk of arriving late and has no driver phone on record.",
                            self.load,
                            p.risk.as_str()
                        ),
                        Urgency::Urgent,
                    );
                    return "risk high but no driver phone: a person must call".into();
                };
                let ask = match AskId::new(ETA_REQUEST, &self.event.event_id) {
                    Ok(a) => a,
                    Err(e) => return format!("cannot open an ask: {e}"),
                };
                self.take_step(&ask, 1, &phone);
                format!("risk {}: ask the driver for an ETA (step 1 of {})", p.risk.as_str(), self.policy.max_attempts)
            }
            EventBody::TimerFired(t) => {
                let Some(ask) = state.asks.get(&t.ask_id).filter(|a| a.is_timer_current(t)) else {
                    return format!("timer {} is not current", t.timer_id);
                };
                match state.sms_phone().map(str::to_owned) {
                    // Rule 2.
                    Some(phone) if ask.step < self.policy.max_attempts => {
                        self.rule = Rule::Rule2;
                        let step = ask.step + 1;
                        self.take_step(&ask.ask_id, step, &phone);
                        format!("no answer to {}: ask again (step {step} of {})", ask.ask_id, self.policy.max_attempts)
                    }
                    // Rule 3 (and a lost phone number or an opted-out one, which also need a person).
                    _ => {
                        self.rule = Rule::Rule3;
                        self.escalate(ask, state.sms_opted_out());
                        if state.sms_opted_out() {
                            return format!(
                                "the driver opted out of SMS after {} attempts: escalate to a person",
                                ask.step
                            );
                        }
                        format!("no answer after {} attempts: escalate to a person", ask.step)
                    }
                }
            }
            EventBody::InboundSms(sms) => self.sms(sms),
            // Rule 6.
            EventBody::ActionOutcome(o) if o.status == OutcomeStatus::Failed && !o.hero_channel && !o.internal => {
                self.rule = Rule::Rule6;
                let what = if o.action_type == ActionType::SendSms {
                    "SMS to driver failed, call them"
                } else {
                    "an action failed"
                };
                self.event_task(
                    what,
                    format!(
                        "Load {}: {} {} failed: {}",
                        self.load,
                        o.action_type,
                        o.outbox_id,
                        o.failure.as_deref().unwrap_or("unknown failure")
                    ),
                    Urgency::Urgent,
                );
                format!("{} failed: a person follows up", o.outbox_id)
            }
            // Rule 7.
            EventBody::LoadUpdate(u) if u.stage.as_deref() == Some(crate::projection::STAGE_DELIVERED) => {
                self.rule = Rule::Rule7;
                let open: Vec<&OpenAsk> = state.open_asks().collect();
                for ask in &open {
                    self.asks.push(AskChange { ask_id: ask.ask_id.clone(), step: ask.step, status: AskStatus::Closed });
                    self.cancel_timer(ask);
                }
                format!("delivered: {} open ask(s) closed", open.len())
            }
            // Rule 8.
            _ => "nothing to do".into(),
        }
    }

    /// Rules 4 and 5: an SMS on this load, from the webhook or assigned by an operator.
    fn sms(&mut self, sms: &InboundSms) -> String {
        let state = self.state;
        let from_driver = state.driver_phone.as_deref() == Some(sms.from.as_str());
        let open: Vec<&OpenAsk> = state.open_asks().collect();
        if from_driver && !open.is_empty() {
            // Rule 4.
            self.rule = Rule::Rule4;
            for ask in &open {
                self.asks.push(AskChange { ask_id: ask.ask_id.clone(), step: ask.step, status: AskStatus::Answered });
                self.cancel_timer(ask);
            }
            if reports_trouble(&sms.body) {
                self.event_task(
                    "Driver reports trouble",
                    format!("The driver of load {} wrote: {}", self.load, sms.body),
                    Urgency::Urgent,
                );
                return "the driver answered and reports trouble".into();
            }
            return "the driver answered".into();
        }
        // Rule 5.
        self.rule = Rule::Rule5;
        let who = if from_driver { "the driver" } else { "a number that is not the driver's" };
        self.event_task(
            "SMS needs a reply",
            format!("Load {}: SMS from {who} with no ask open: {}", self.load, sms.body),
            Urgency::Normal,
        );
        format!("SMS from {who} with no ask open: a person reads it")
    }

    fn take_step(&mut self, ask: &AskId, step: u32, phone: &str) {
        let body = if step == 1 {
            format!(
                "Hi, this is dispatch for load {}. What is your ETA{}? Please reply with a time.",
                self.load,
                self.next_stop()
            )
        } else {
            format!(
                "Following up on load {} (attempt {step} of {}): what is your ETA{}?",
                self.load,
                self.policy.max_attempts,
                self.next_stop()
            )
        };
        let timer_id = TimerId::new(self.load, ask, step);
        self.push(ask, step, ActionKind::SendSms { to: phone.to_owned(), body });
        self.push(
            ask,
            step,
            ActionKind::SetTimer {
                timer_id,
                fire_at: add(self.now, self.policy.retry_after),
                ask_id: ask.clone(),
                step,
            },
        );
        self.asks.push(AskChange { ask_id: ask.clone(), step, status: AskStatus::Open });
    }

    /// The ask goes to a person: the driver did not answer, or (`opted_out`) cannot be
    /// texted, which the person is told so they call rather than text.
    fn escalate(&mut self, ask: &OpenAsk, opted_out: bool) {
        let step = ask.step + 1;
        let (title, body) = if opted_out {
            (
                format!("Driver opted out of SMS on load {}", self.load),
                format!("The driver opted out of SMS (replied STOP): call them for an ETA on load {}.", self.load),
            )
        } else {
            (
                format!("Driver not answering on load {}", self.load),
                format!("The driver has not answered {} ETA request(s) for load {}: call them.", ask.step, self.load),
            )
        };
        self.push(&ask.ask_id, step, ActionKind::CreateHeroTask { title, body, urgency: Urgency::Urgent });
        self.asks.push(AskChange { ask_id: ask.ask_id.clone(), step, status: AskStatus::Escalated });
    }

    fn cancel_timer(&mut self, ask: &OpenAsk) {
        let timer_id = TimerId::new(self.load, &ask.ask_id, ask.step);
        self.push(&ask.ask_id, ask.step, ActionKind::CancelTimer { timer_id });
    }

    fn push(&mut self, ask: &AskId, step: u32, kind: ActionKind) {
        let key = ask_action_key(self.load, ask, step, kind.action_type().as_str());
        self.actions.push(Action { key, kind, ask_id: Some(ask.clone()), step: Some(step), requeue_of: None });
    }

    fn event_task(&mut self, title: &str, body: String, urgency: Urgency) {
        let key = event_action_key(self.load, &self.event.event_id, ActionType::CreateHeroTask.as_str());
        self.actions.push(Action {
            key,
            kind: ActionKind::CreateHeroTask { title: format!("Load {}: {title}", self.load), body, urgency },
            ask_id: None,
            step: None,
            requeue_of: None,
        });
    }

    fn next_stop(&self) -> String {
        self.state.next_stop.as_deref().map(|s| format!(" to {s}")).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{Record, project};
    use serde_json::{Value, json};

    const PHONE: &str = "+15555550100";
    const ASK: &str = "ask:eta_request:ping_0700";

    fn load() -> LoadId {
        LoadId::parse("481207").unwrap()
    }

    fn at(min: u32) -> Timestamp {
        crate::time::add("2026-03-02T07:00:00Z".parse().unwrap(), std::time::Duration::from_secs(u64::from(min) * 60))
    }

    fn ev(v: Value) -> InboundEvent {
        InboundEvent::from_json(load(), v).unwrap()
    }

    fn timer(step: u32) -> InboundEvent {
        let ask = AskId::parse(ASK).unwrap();
        let t = crate::ids::TimerId::new(&load(), &ask, step);
        ev(json!({"event_id": format!("evt:{t}"), "kind": "timer_fired", "timer_id": t, "ask_id": ask,
                  "step": step, "fire_at": at(30 * step)}))
    }

    fn outcome(action_type: &str, hero_channel: bool, internal: bool) -> InboundEvent {
        let id = format!("481207/x/{action_type}");
        ev(json!({"event_id": format!("evt:out:{id}:failed"), "kind": "action_outcome", "outbox_id": id,
                  "action_type": action_type, "status": "failed", "failure": "HTTP 500",
                  "hero_channel": hero_channel, "internal": internal}))
    }

    /// The state after the SOP decided each event in turn (each at minute `m`).
    fn state_after(events: &[(u32, InboundEvent)]) -> LoadState {
        let mut records: Vec<Record> = vec![];
        for (m, e) in events {
            let d = decide(&Policies::default(), &load(), &project(&records), e, at(*m));
            records.extend(Record::appended(records.len() as u64, e, &d, at(*m)));
        }
        project(&records)
    }

    /// The SOP's decision on `event`, straight (no filter in front), as its action types.
    fn check(state: &LoadState, event: InboundEvent, min: u32, want: &[&str]) {
        let d = decide(&Policies::default(), &load(), state, &event, at(min));
        let got: Vec<&str> = d.actions.iter().map(|a| a.kind.action_type().as_str()).collect();
        assert_eq!(got, want, "{}: {}", event.event_id, d.rationale);
    }

    /// The filter stops stale timers and Hero-channel or internal failures before the
    /// decider; the SOP keeps its own guards for a decider called without it (the LLM
    /// decider's fallback, replays), and these hold them without the filter.
    #[test]
    fn the_sops_own_guards_hold_without_the_filter() {
        let init =
            ev(json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE, "stage": "in_transit"}));
        let ping =
            ev(json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}));
        let open = state_after(&[(0, init.clone()), (0, ping.clone())]);
        // The current timer acts (the control), a timer for another step does not.
        check(&open, timer(1), 30, &["send_sms", "set_timer"]);
        check(&open, timer(2), 30, &[]);
        let at_step_2 = state_after(&[(0, init.clone()), (0, ping.clone()), (30, timer(1))]);
        check(&at_step_2, timer(1), 31, &[]);
        // A timer for an answered ask does nothing.
        let answer = ev(json!({"event_id": "sms_1", "kind": "inbound_sms", "from": PHONE, "body": "ETA 9:15"}));
        let answered = state_after(&[(0, init.clone()), (0, ping), (10, answer)]);
        check(&answered, timer(1), 30, &[]);
        // A failed external action makes a Hero task (the control); a failed Hero-channel
        // or internal one never does: that would loop while the Hero tooling is down.
        let quiet = state_after(&[(0, init)]);
        check(&quiet, outcome("send_sms", false, false), 5, &["create_hero_task"]);
        check(&quiet, outcome("create_hero_task", true, false), 5, &[]);
        check(&quiet, outcome("post_hero_slack", true, false), 5, &[]);
        check(&quiet, outcome("update_stage", false, true), 5, &[]);
        check(&quiet, outcome("set_timer", false, true), 5, &[]);
    }

    /// A decision as the rule table reads it: its action types, the asks it moved
    /// (`ask_id status`) and the Hero task's title, if any.
    type Decided = (Vec<String>, Vec<String>, Option<String>);

    /// A row of the rule table: its name (`rule N: …`, N the rule that decides), the
    /// events before, the event, the decision.
    type Case<'a> = (&'a str, &'a [(u32, InboundEvent)], InboundEvent, Decided);

    /// The SOP's decision on `event` after `before`.
    fn decided(before: &[(u32, InboundEvent)], event: InboundEvent) -> (Decided, Rule) {
        let state = state_after(before);
        let (d, rule) = decide_with_rule(&Policies::default(), &load(), &state, &event, at(40));
        let types = d.actions.iter().map(|a| a.kind.action_type().as_str().to_owned()).collect();
        let asks = d.asks.iter().map(|c| format!("{} {}", c.ask_id, c.status.as_str())).collect();
        let title = d.actions.iter().find_map(|a| match &a.kind {
            ActionKind::CreateHeroTask { title, .. } => Some(title.clone()),
            _ => None,
        });
        ((types, asks, title), rule)
    }

    /// Each rule of the SOP against what `docs/design.md` says it does, with the
    /// neighbouring case that must not trigger it.
    #[test]
    fn each_rule_does_what_the_sop_says_and_no_more() {
        let init =
            ev(json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE, "stage": "in_transit"}));
        let ping = |risk: &str| {
            ev(json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": risk}))
        };
        let update = |v: Value| {
            let mut v = v;
            v["event_id"] = json!("u1");
            v["kind"] = json!("load_update");
            ev(v)
        };
        let sms =
            |from: &str| ev(json!({"event_id": "sms_1", "kind": "inbound_sms", "from": from, "body": "ETA 9:15"}));
        let open = [(0, init.clone()), (0, ping("high"))];
        let quiet = [(0, init.clone())];
        let delivered = [(0, init.clone()), (1, update(json!({"stage": "delivered"})))];
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let title = |t: &str| Some(format!("Load 481207: {t}"));
        let ping_2 =
            ev(json!({"event_id": "ping_0800", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}));
        let cases: Vec<Case> = vec![
            // Rule 1: a high-risk ping opens an ask; a low one, one on a delivered load,
            // or one while an ask is open, does not.
            (
                "rule 1: a high risk",
                &quiet,
                ping("high"),
                (s(&["send_sms", "set_timer"]), s(&[&format!("{ASK} open")]), None),
            ),
            ("rule 1: an ask already open", &open, ping_2, (s(&[]), s(&[]), None)),
            ("rule 8: a low risk", &quiet, ping("low"), (s(&[]), s(&[]), None)),
            ("rule 8: a delivered load", &delivered, ping("high"), (s(&[]), s(&[]), None)),
            // Rule 7: delivery closes the open ask and cancels its timer; any other
            // update (a stage, a next stop) leaves the ask open and asking.
            (
                "rule 7: delivered",
                &open,
                update(json!({"stage": "delivered"})),
                (s(&["cancel_timer"]), s(&[&format!("{ASK} closed")]), None),
            ),
            ("rule 8: another stage", &open, update(json!({"stage": "at_pickup"})), (s(&[]), s(&[]), None)),
            ("rule 8: a next stop", &open, update(json!({"next_stop": "Gary, IN"})), (s(&[]), s(&[]), None)),
            // Rule 4: the driver's SMS answers the open ask. Rule 5: an SMS from another
            // number, or with no ask open, goes to a person and leaves the ask as it is.
            (
                "rule 4: the driver answers",
                &open,
                sms(PHONE),
                (s(&["cancel_timer"]), s(&[&format!("{ASK} answered")]), None),
            ),
            (
                "rule 5: not the driver",
                &open,
                sms("+15555550199"),
                (s(&["create_hero_task"]), s(&[]), title("SMS needs a reply")),
            ),
            ("rule 5: no ask open", &quiet, sms(PHONE), (s(&["create_hero_task"]), s(&[]), title("SMS needs a reply"))),
            // Rule 6: a failed external action makes an urgent Hero task, titled for
            // what failed.
            (
                "rule 6: an SMS",
                &quiet,
                outcome("send_sms", false, false),
                (s(&["create_hero_task"]), s(&[]), title("SMS to driver failed, call them")),
            ),
            (
                "rule 6: another action",
                &quiet,
                outcome("update_stage", false, false),
                (s(&["create_hero_task"]), s(&[]), title("an action failed")),
            ),
            (
                "rule 8: a medium risk",
                &open,
                ev(json!({"event_id": "x1", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "medium"})),
                (s(&[]), s(&[]), None),
            ),
        ];
        for (name, before, event, want) in cases {
            let (got, rule) = decided(before, event);
            assert_eq!(got, want, "{name}");
            let number = |s: &str| s.split(':').next().unwrap_or_default().to_owned();
            assert_eq!(number(rule.label()), number(name), "{name}: decided by {}", rule.label());
        }
        // Every rule has its own label.
        let labels: std::collections::BTreeSet<&str> = Rule::ALL.iter().map(|r| r.label()).collect();
        assert_eq!(labels.len(), Rule::ALL.len());
        assert!(Rule::ALL.iter().all(|r| r.label().starts_with("rule ") || *r == Rule::Filter));
    }

    /// The ask names the next stop when the load has one, and only then.
    #[test]
    fn the_ask_names_the_next_stop() {
        let body = |next_stop: Option<&str>| {
            let mut init = json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE});
            if let Some(stop) = next_stop {
                init["next_stop"] = json!(stop);
            }
            let ping =
                ev(json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}));
            let d = decide(&Policies::default(), &load(), &state_after(&[(0, ev(init))]), &ping, at(1));
            match &d.actions[0].kind {
                ActionKind::SendSms { body, .. } => body.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            body(Some("Gary, IN")),
            "Hi, this is dispatch for load 481207. What is your ETA to Gary, IN? Please reply with a time."
        );
        assert_eq!(body(None), "Hi, this is dispatch for load 481207. What is your ETA? Please reply with a time.");
    }

    #[test]
    fn trouble_words() {
        for (text, trouble) in [
            ("ETA 9:15", false),
            // Inside other words: no trouble.
            ("At the plate scale now, ETA 9:40", false),
            ("Need to translate the BOL, ETA 10", false),
            ("Bringing chocolate, ETA 9", false),
            ("Belated thanks, ETA 9:30", false),
            ("Unstuck now, ETA 9:50", false),
            ("Crash on I-80, ETA 11", true),
            // Whole words and phrases, anywhere, in any case.
            ("running late", true),
            ("LATE.", true),
            ("breakdown", true),
            ("Late, sorry", true),
            ("'late'", true),
            ("Broke  down,\tnear Gary", true),
            ("flat-tire", true),
            ("Broke down near Gary", true),
            ("FLAT TIRE", true),
            ("I can’t make it today", true),
            ("running a bit late", true),
            ("stuck in traffic", true),
            ("all good, on time", false),
            ("", false),
        ] {
            assert_eq!(reports_trouble(text), trouble, "{text}");
        }
    }
}
