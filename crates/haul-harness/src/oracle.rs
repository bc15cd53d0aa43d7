//! A second, deliberately plain reading of the filter and the SOP: the rule table of
//! `docs/design.md` written again, apart from `haul_core::filter` and `haul_core::sop`,
//! over a state of its own (the driver's phone, the stage, each ask's step and status).
//! The simulator holds every decision its runs logged to it, so a wrong decision is
//! caught even when every delivery is right. It reads the driver's consent (STOP,
//! START, HELP) from the rule table too. Decisions it does not model (an operator's, a
//! fallback) are taken as logged.

use std::collections::{BTreeMap, BTreeSet};

use haul_core::Risk;
use haul_core::decision::Decision;
use haul_core::event::{EventBody, InboundEvent, OperatorCommand};
use haul_core::ids::LoadId;
use haul_core::log::{Entry, Record};
use haul_core::outcome::OutcomeStatus;

/// A client's ETA policy as the rules read it.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    pub max_attempts: u32,
    pub trigger_risk: Risk,
}

/// What a decision does, in the terms of the rule table: its action keys and the asks
/// it moves (`ask step status`), both sorted, and whether the filter made it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Expected {
    filtered: bool,
    keys: Vec<String>,
    asks: Vec<String>,
}

impl Expected {
    fn of(d: &Decision) -> Expected {
        let mut keys: Vec<String> = d.actions.iter().map(|a| a.key.clone()).collect();
        let mut asks: Vec<String> =
            d.asks.iter().map(|c| format!("{} {} {}", c.ask_id, c.step, c.status.as_str())).collect();
        keys.sort();
        asks.sort();
        Expected { filtered: d.filtered, keys, asks }
    }
}

impl std::fmt::Display for Expected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.filtered {
            return write!(f, "a filtered noop");
        }
        write!(f, "actions [{}], asks [{}]", self.keys.join(", "), self.asks.join(", "))
    }
}

/// The model's state of one load.
#[derive(Default)]
struct Model {
    client: Option<String>,
    phone: Option<String>,
    delivered: bool,
    /// Ask id → (step, status).
    asks: BTreeMap<String, (u32, String)>,
    assigned_sms: BTreeSet<String>,
    /// The phone that said STOP (or that Twilio refused as opted out), until START.
    opted_out: Option<String>,
}

/// The consent keyword a whole message is: `stop`, `start` or `help`.
fn consent_word(body: &str) -> Option<&'static str> {
    let word = body.trim_matches(|c: char| c.is_whitespace() || c.is_ascii_punctuation()).to_uppercase();
    if ["STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"].contains(&word.as_str()) {
        Some("stop")
    } else if ["START", "UNSTOP", "YES"].contains(&word.as_str()) {
        Some("start")
    } else if ["HELP", "INFO"].contains(&word.as_str()) {
        Some("help")
    } else {
        None
    }
}

impl Model {
    /// The consent keyword `sms` is when consent decides it: from the driver, and a
    /// START only while opted out.
    fn consent_of(&self, sms: &haul_core::event::InboundSms) -> Option<&'static str> {
        if self.phone.as_deref() != Some(sms.from.as_str()) {
            return None;
        }
        consent_word(&sms.body).filter(|w| *w != "start" || self.opted_out())
    }

    fn opted_out(&self) -> bool {
        self.phone.is_some() && self.opted_out == self.phone
    }

    fn open(&self) -> impl Iterator<Item = (&String, u32)> {
        self.asks.iter().filter(|(_, (_, s))| s == "open").map(|(id, (step, _))| (id, *step))
    }

    /// What the rule table decides for `event` on this state.
    fn expect(&self, load: &LoadId, event: &InboundEvent, policy: Policy) -> Expected {
        let ev = event.event_id.as_str();
        let (mut keys, mut asks) = (vec![], vec![]);
        let filtered = |why: bool| Expected { filtered: why, keys: vec![], asks: vec![] };
        let task = format!("{load}/{ev}/create_hero_task");
        let step_keys =
            |ask: &str, step: u32| [format!("{load}/{ask}/{step}/send_sms"), format!("{load}/{ask}/{step}/set_timer")];
        match &event.body {
            EventBody::ActionOutcome(o) if o.status == OutcomeStatus::Delivered => return filtered(true),
            EventBody::ActionOutcome(o) if o.hero_channel || o.internal => return filtered(true),
            // An SMS refused as opted out, the driver's STOP known already: a person
            // was asked then.
            EventBody::ActionOutcome(o) if refused_as_opted_out(o.failure.as_deref()) && self.opted_out() => {
                return filtered(true);
            }
            EventBody::ActionOutcome(_) => keys.push(task),
            EventBody::TimerFired(t) => {
                let current = self.asks.get(t.ask_id.as_str()).filter(|(step, s)| s == "open" && *step == t.step);
                let Some((step, _)) = current else { return filtered(true) };
                let ask = t.ask_id.as_str();
                if *step < policy.max_attempts && self.phone.is_some() && !self.opted_out() {
                    keys.extend(step_keys(ask, step + 1));
                    asks.push(format!("{ask} {} open", step + 1));
                } else {
                    keys.push(format!("{load}/{ask}/{}/create_hero_task", step + 1));
                    asks.push(format!("{ask} {} escalated", step + 1));
                }
            }
            EventBody::InboundSms(_) if ev.strip_prefix("sms:").is_some_and(|sid| self.assigned_sms.contains(sid)) => {
                return filtered(true);
            }
            // Consent: the driver's STOP, their START while opted out, HELP.
            EventBody::InboundSms(sms) if self.consent_of(sms) == Some("stop") && !self.opted_out() => {
                for (ask, step) in self.open() {
                    keys.push(format!("{load}/{ask}/{step}/cancel_timer"));
                    asks.push(format!("{ask} {step} closed"));
                }
                keys.push(task);
            }
            EventBody::InboundSms(sms) if self.consent_of(sms).is_some() => {}
            EventBody::InboundSms(sms) => {
                let open: Vec<_> = self.open().collect();
                if self.phone.as_deref() == Some(sms.from.as_str()) && !open.is_empty() {
                    for (ask, step) in open {
                        keys.push(format!("{load}/{ask}/{step}/cancel_timer"));
                        asks.push(format!("{ask} {step} answered"));
                    }
                    if haul_core::sop::reports_trouble(&sms.body) {
                        keys.push(task);
                    }
                } else {
                    keys.push(task);
                }
            }
            EventBody::LocationPing(p) if p.risk >= policy.trigger_risk && !self.delivered => {
                let eta_open = self.open().any(|(ask, _)| ask.starts_with("ask:eta_request:"));
                match &self.phone {
                    _ if eta_open => {}
                    None => keys.push(task),
                    Some(_) if self.opted_out() => keys.push(task),
                    Some(_) => {
                        let ask = format!("ask:eta_request:{ev}");
                        keys.extend(step_keys(&ask, 1));
                        asks.push(format!("{ask} 1 open"));
                    }
                }
            }
            EventBody::LoadUpdate(u) if u.stage.as_deref() == Some("delivered") => {
                for (ask, step) in self.open() {
                    keys.push(format!("{load}/{ask}/{step}/cancel_timer"));
                    asks.push(format!("{ask} {step} closed"));
                }
            }
            _ => {}
        }
        keys.sort();
        asks.sort();
        Expected { filtered: false, keys, asks }
    }

    fn apply_event(&mut self, event: &InboundEvent) {
        match &event.body {
            EventBody::LoadUpdate(u) => {
                if u.client.is_some() {
                    self.client.clone_from(&u.client);
                }
                if u.driver_phone.is_some() {
                    self.phone.clone_from(&u.driver_phone);
                }
                if let Some(stage) = &u.stage {
                    self.delivered = stage == "delivered";
                }
            }
            EventBody::OperatorAction(op) => {
                if let OperatorCommand::AssignSms { message_sid, from, body } = &op.command {
                    self.assigned_sms.insert(message_sid.clone());
                    self.consent(from, body);
                }
            }
            EventBody::InboundSms(sms) => self.consent(&sms.from, &sms.body),
            EventBody::ActionOutcome(o)
                if o.status == OutcomeStatus::Failed
                    && refused_as_opted_out(o.failure.as_deref())
                    && !self.opted_out() =>
            {
                self.opted_out.clone_from(&self.phone);
            }
            _ => {}
        }
    }

    /// An SMS `from` the driver that is STOP or START, however it reached the load.
    fn consent(&mut self, from: &str, body: &str) {
        if self.phone.as_deref() != Some(from) {
            return;
        }
        match consent_word(body) {
            Some("stop") if !self.opted_out() => self.opted_out.clone_from(&self.phone),
            Some("start") => self.opted_out = None,
            _ => {}
        }
    }

    fn apply_decision(&mut self, d: &Decision) {
        for c in &d.asks {
            self.asks.insert(c.ask_id.to_string(), (c.step, c.status.as_str().to_owned()));
        }
    }
}

/// Checks each SOP and filter decision of `log` (one load's, in `seq` order) against
/// the rule table, with each client's `policy`. The first that differs is the error,
/// naming the event, what the rules say and what was logged.
pub fn check(load: &LoadId, log: &[Record], policy: impl Fn(Option<&str>) -> Policy) -> Result<(), String> {
    let mut model = Model::default();
    let mut events: BTreeMap<&str, InboundEvent> = BTreeMap::new();
    for r in log {
        match &r.entry {
            Entry::Event { event_id, body } => {
                let event = InboundEvent { load_id: load.clone(), event_id: event_id.clone(), body: body.clone() };
                events.insert(r.entry_id.as_str(), event);
            }
            Entry::Decision(d) => {
                let Some(event) = events.get(d.event_id.as_str()) else { continue };
                if matches!(d.decider.as_str(), "sop" | "filter" | "consent") {
                    let want = model.expect(load, event, policy(model.client.as_deref()));
                    let got = Expected::of(d);
                    if got != want {
                        return Err(format!(
                            "the decision for {} of {load} is not the SOP's: the rules say {want}; the log says {got} ({})",
                            d.event_id, d.rationale
                        ));
                    }
                }
                model.apply_event(event);
                model.apply_decision(d);
            }
            Entry::Unreadable { .. } => {}
        }
    }
    Ok(())
}

/// A send refused because the phone opted out: Twilio's 21610, or the dispatcher's
/// consent ledger (written here, not taken from haul_core, as the rest of the table).
fn refused_as_opted_out(failure: Option<&str>) -> bool {
    failure.is_some_and(|f| {
        f.contains("twilio error 21610") || f.starts_with("not sent: the phone opted out of SMS (consent ledger)")
    })
}
