//! Inbound events (docs/design.md, "Inbound event kinds") and their validation.
//!
//! An event is `{event_id, kind, ...payload}` on the wire and on the load queue; in the
//! log it is a record with `entry_id = event_id`, `kind`, and the payload fields.
//! Parsing is strict: unknown kinds, unknown or missing fields, wrong types and values
//! outside their range are `BadInput` naming what was wrong.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::action::{Action, ActionType};
use crate::error::{BadInput, clip};
use crate::ids::{AskId, EventId, LoadId, TimerId};
use crate::outcome::OutcomeStatus;
use crate::time::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Low,
    Medium,
    High,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LoadUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_stop: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocationPing {
    /// When the ping was taken; the edge fills in the receive time when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Timestamp>,
    pub lat: f64,
    pub lon: f64,
    pub risk: Risk,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboundSms {
    pub from: String,
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerFired {
    pub timer_id: TimerId,
    pub ask_id: AskId,
    pub step: u32,
    pub fire_at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionOutcome {
    pub outbox_id: String,
    pub action_type: ActionType,
    pub status: OutcomeStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    #[serde(default)]
    pub hero_channel: bool,
    #[serde(default)]
    pub internal: bool,
}

/// `operator_action`: what a person asked haul to do about a load, with who asked and
/// why. It goes through the load queue and the load worker like any other input, so
/// the log is the audit trail and the version check guards it (docs/design.md,
/// "Operator actions"); the deterministic path decides it, never a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorAction {
    /// Who asked (`[A-Za-z0-9_.@+-]{1,64}`, e.g. a login or an email address).
    pub actor: String,
    /// Why, in the operator's words (1 to 500 characters).
    pub reason: String,
    pub command: OperatorCommand,
}

/// What an operator asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OperatorCommand {
    /// A new outbox row carrying `action`, the action of the dead row `outbox_id`
    /// (read from the outbox by whoever made the event). The dead row stays dead.
    Requeue { outbox_id: String, action: Action },
    /// An SMS the webhook could not route, handed to this load: the SOP takes it as
    /// the load's `inbound_sms`.
    AssignSms { message_sid: String, from: String, body: String },
    /// The ask is settled by hand (the driver called in): closed, its timer canceled.
    ResolveAsk { ask_id: AskId },
    /// The dead row `outbox_id` (with the rest of its requeue chain) leaves the
    /// operators' inbox: nothing more is to be done about it, for the reason given.
    Dismiss { outbox_id: String },
    /// The SMS `message_sid` an operator assigned to this load is load `to_load`'s
    /// (a wrong assignment undone): the asks it answered here are unanswered again
    /// and take their next step, as if their timers had fired.
    UnassignSms { message_sid: String, to_load: LoadId },
}

impl OperatorCommand {
    pub fn name(&self) -> &'static str {
        match self {
            OperatorCommand::Requeue { .. } => "requeue",
            OperatorCommand::AssignSms { .. } => "assign_sms",
            OperatorCommand::ResolveAsk { .. } => "resolve_ask",
            OperatorCommand::Dismiss { .. } => "dismiss",
            OperatorCommand::UnassignSms { .. } => "unassign_sms",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum EventBody {
    LoadUpdate(LoadUpdate),
    LocationPing(LocationPing),
    InboundSms(InboundSms),
    TimerFired(TimerFired),
    ActionOutcome(ActionOutcome),
    OperatorAction(OperatorAction),
}

crate::listed_enum! {
    /// The kind of an inbound event: one per [`EventBody`] variant (its `kind()` is an
    /// exhaustive match onto this list).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum EventKind {
        LoadUpdate,
        LocationPing,
        InboundSms,
        TimerFired,
        ActionOutcome,
        OperatorAction,
    }
}

impl EventKind {
    /// As named on the wire and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::LoadUpdate => "load_update",
            EventKind::LocationPing => "location_ping",
            EventKind::InboundSms => "inbound_sms",
            EventKind::TimerFired => "timer_fired",
            EventKind::ActionOutcome => "action_outcome",
            EventKind::OperatorAction => "operator_action",
        }
    }
}

/// Every inbound kind's name, in [`EventKind::ALL`] order.
pub fn event_kinds() -> impl Iterator<Item = &'static str> {
    EventKind::ALL.into_iter().map(EventKind::as_str)
}

/// Longest operator reason, in characters.
pub const MAX_OPERATOR_REASON_CHARS: usize = 500;
/// Longest operator name, in characters.
pub const MAX_OPERATOR_ACTOR_CHARS: usize = 64;

impl EventBody {
    pub fn kind(&self) -> &'static str {
        self.event_kind().as_str()
    }

    pub fn event_kind(&self) -> EventKind {
        match self {
            EventBody::LoadUpdate(_) => EventKind::LoadUpdate,
            EventBody::LocationPing(_) => EventKind::LocationPing,
            EventBody::InboundSms(_) => EventKind::InboundSms,
            EventBody::TimerFired(_) => EventKind::TimerFired,
            EventBody::ActionOutcome(_) => EventKind::ActionOutcome,
            EventBody::OperatorAction(_) => EventKind::OperatorAction,
        }
    }

    /// The payload as a JSON object (without `kind` and `event_id`).
    pub fn payload(&self) -> Value {
        let v = match self {
            EventBody::LoadUpdate(p) => serde_json::to_value(p),
            EventBody::LocationPing(p) => serde_json::to_value(p),
            EventBody::InboundSms(p) => serde_json::to_value(p),
            EventBody::TimerFired(p) => serde_json::to_value(p),
            EventBody::ActionOutcome(p) => serde_json::to_value(p),
            EventBody::OperatorAction(p) => serde_json::to_value(p),
        };
        v.expect("payload structs always serialize")
    }

    /// Parses and validates a payload of the given kind.
    pub fn from_payload(kind: &str, payload: Value) -> Result<Self, BadInput> {
        fn de<T: DeserializeOwned>(kind: &str, v: Value) -> Result<T, BadInput> {
            serde_json::from_value(v).map_err(|e| {
                // serde quotes the offending name or value whole; a caller may have sent 60 KB of it.
                BadInput::new("bad_payload", format!("{kind} payload: {}", crate::mask::clip_quotes(&e.to_string())))
            })
        }
        let Some(known) = EventKind::ALL.into_iter().find(|k| k.as_str() == kind) else {
            return Err(BadInput::new(
                "unknown_kind",
                format!(
                    "unknown event kind {:?} (expected one of {})",
                    clip(kind),
                    event_kinds().collect::<Vec<_>>().join(", ")
                ),
            ));
        };
        // Exhaustive over the list, so a new kind cannot be refused as unknown.
        let body = match known {
            EventKind::LoadUpdate => EventBody::LoadUpdate(de(kind, payload)?),
            EventKind::LocationPing => EventBody::LocationPing(de(kind, payload)?),
            EventKind::InboundSms => EventBody::InboundSms(de(kind, payload)?),
            EventKind::TimerFired => EventBody::TimerFired(de(kind, payload)?),
            EventKind::ActionOutcome => EventBody::ActionOutcome(de(kind, payload)?),
            EventKind::OperatorAction => EventBody::OperatorAction(de(kind, payload)?),
        };
        body.validate()?;
        Ok(body)
    }

    fn validate(&self) -> Result<(), BadInput> {
        match self {
            EventBody::LoadUpdate(u) => {
                if let Some(c) = &u.client {
                    validate_client(c)?;
                }
                if let Some(p) = &u.driver_phone {
                    validate_phone("driver_phone", p)?;
                }
                if let Some(s) = &u.stage {
                    validate_stage(s)?;
                }
                if let Some(n) = &u.next_stop {
                    validate_text("next_stop", n, 256)?;
                }
            }
            EventBody::LocationPing(p) => {
                if !p.lat.is_finite() || !(-90.0..=90.0).contains(&p.lat) {
                    return Err(BadInput::new(
                        "bad_payload",
                        format!("location_ping lat {} is outside -90..90", p.lat),
                    ));
                }
                if !p.lon.is_finite() || !(-180.0..=180.0).contains(&p.lon) {
                    return Err(BadInput::new(
                        "bad_payload",
                        format!("location_ping lon {} is outside -180..180", p.lon),
                    ));
                }
            }
            EventBody::InboundSms(s) => {
                validate_text("from", &s.from, MAX_SMS_FROM_CHARS)?;
                if s.from.is_empty() {
                    return Err(BadInput::new("bad_payload", "inbound_sms from is empty"));
                }
                validate_text("body", &s.body, MAX_SMS_BODY_CHARS)?;
            }
            EventBody::TimerFired(t) => {
                let (_, ask, step) = t.timer_id.parts();
                if ask != t.ask_id || step != t.step {
                    return Err(BadInput::new("bad_payload", "timer_fired ask_id/step do not match timer_id"));
                }
            }
            EventBody::ActionOutcome(o) => {
                validate_text("outbox_id", &o.outbox_id, crate::ids::MAX_DERIVED_ID_LEN)?;
                if let Some(r) = &o.receipt {
                    validate_text("receipt", r, 256)?;
                }
                if let Some(f) = &o.failure {
                    validate_text("failure", f, 2048)?;
                }
            }
            EventBody::OperatorAction(op) => validate_operator_action(op)?,
        }
        Ok(())
    }
}

/// An event that arrives on the load queue: `{event_id, kind, ...payload}` for a load.
#[derive(Clone, Debug, PartialEq)]
pub struct InboundEvent {
    pub load_id: LoadId,
    pub event_id: EventId,
    pub body: EventBody,
}

impl InboundEvent {
    pub fn kind(&self) -> &'static str {
        self.body.kind()
    }

    /// `{event_id, kind, ...payload}`: the form on the queue and on the API.
    pub fn to_json(&self) -> Value {
        let mut obj = match self.body.payload() {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        obj.insert("event_id".into(), Value::String(self.event_id.to_string()));
        obj.insert("kind".into(), Value::String(self.kind().into()));
        Value::Object(obj)
    }

    /// Parses `{event_id, kind, ...payload}` for `load_id`. Accepts derived event ids
    /// (haul's own pump and dispatcher publish those); edges that take outside input
    /// use [`InboundEvent::from_outside`].
    pub fn from_json(load_id: LoadId, v: Value) -> Result<Self, BadInput> {
        Self::parse(load_id, v, EventId::parse)
    }

    /// Parses input from outside haul: only the inbound id form, and only the kinds an
    /// outside source may send (`timer_fired` and `action_outcome` are haul's own,
    /// `operator_action` needs an operator: [`InboundEvent::from_operator`]).
    pub fn from_outside(load_id: LoadId, v: Value) -> Result<Self, BadInput> {
        Self::outside_kind(Self::parse(load_id, v, EventId::parse_inbound)?)
    }

    /// Parses an outside source's event as a scenario file gives it: what
    /// [`InboundEvent::from_outside`] takes, and the webhook's own `sms:` ids too
    /// ([`EventId::parse_scenario`]).
    pub fn from_scenario(load_id: LoadId, v: Value) -> Result<Self, BadInput> {
        Self::outside_kind(Self::parse(load_id, v, EventId::parse_scenario)?)
    }

    /// `ev` when its kind is one an outside source may send.
    fn outside_kind(ev: Self) -> Result<Self, BadInput> {
        if let EventBody::OperatorAction(_) = ev.body {
            return Err(BadInput::new(
                "kind_not_accepted",
                "operator_action events need an operator token (HAUL_OPERATOR_TOKEN)",
            ));
        }
        Self::not_hauls_own(ev)
    }

    /// Parses input from a caller holding an operator token: what
    /// [`InboundEvent::from_outside`] takes, and `operator_action` events, whose ids
    /// are `op:` ids (and only theirs).
    pub fn from_operator(load_id: LoadId, v: Value) -> Result<Self, BadInput> {
        let ev = Self::parse(load_id, v, EventId::parse_operator)?;
        let operator = matches!(ev.body, EventBody::OperatorAction(_));
        if operator && !ev.event_id.is_operator() {
            return Err(BadInput::new(
                "bad_event_id",
                format!("an operator_action's event id is op:{{request id}}, not {:?}", clip(ev.event_id.as_str())),
            ));
        }
        if !operator && ev.event_id.is_operator() {
            return Err(BadInput::new(
                "reserved_event_id",
                format!("event id {:?}: op: ids are for operator_action events only", clip(ev.event_id.as_str())),
            ));
        }
        Self::not_hauls_own(ev)
    }

    fn not_hauls_own(ev: Self) -> Result<Self, BadInput> {
        if matches!(ev.body, EventBody::TimerFired(_) | EventBody::ActionOutcome(_)) {
            return Err(BadInput::new("kind_not_accepted", format!("{} events come only from haul itself", ev.kind())));
        }
        Ok(ev)
    }

    fn parse(load_id: LoadId, v: Value, parse_id: fn(&str) -> Result<EventId, BadInput>) -> Result<Self, BadInput> {
        let Value::Object(mut obj) = v else {
            return Err(BadInput::new("bad_json", "an event must be a JSON object"));
        };
        let event_id = match obj.remove("event_id") {
            Some(Value::String(s)) => parse_id(&s)?,
            Some(_) => return Err(BadInput::new("bad_payload", "event_id must be a string")),
            None => return Err(BadInput::new("bad_payload", "missing field `event_id`")),
        };
        let kind = match obj.remove("kind") {
            Some(Value::String(s)) => s,
            Some(_) => return Err(BadInput::new("bad_payload", "kind must be a string")),
            None => return Err(BadInput::new("bad_payload", "missing field `kind`")),
        };
        // `load_id` may be repeated in the body; it must agree with the path.
        if let Some(l) = obj.remove("load_id")
            && l.as_str() != Some(load_id.as_str())
        {
            return Err(BadInput::new("bad_payload", "load_id in the body differs from the load"));
        }
        let body = EventBody::from_payload(&kind, Value::Object(obj))?;
        Ok(InboundEvent { load_id, event_id, body })
    }
}

impl fmt::Display for InboundEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.load_id, self.event_id, self.kind())
    }
}

/// Who acts and why, as every operator action checks them (also an unmatched SMS's
/// dismissal, which is no event).
pub fn validate_actor_and_reason(actor: &str, reason: &str) -> Result<(), BadInput> {
    let actor_ok = !actor.is_empty()
        && actor.chars().count() <= MAX_OPERATOR_ACTOR_CHARS
        && actor.chars().all(|c| c.is_ascii_alphanumeric() || "_.@+-".contains(c));
    if !actor_ok {
        return Err(BadInput::new(
            "bad_payload",
            format!(
                "operator_action actor {:?} is not of the form [A-Za-z0-9_.@+-]{{1,{MAX_OPERATOR_ACTOR_CHARS}}}",
                clip(actor)
            ),
        ));
    }
    if reason.trim().is_empty() {
        return Err(BadInput::new("bad_payload", "operator_action reason is empty: say why"));
    }
    validate_text("reason", reason, MAX_OPERATOR_REASON_CHARS)
}

fn validate_operator_action(op: &OperatorAction) -> Result<(), BadInput> {
    validate_actor_and_reason(&op.actor, &op.reason)?;
    match &op.command {
        OperatorCommand::Requeue { outbox_id, action } => {
            validate_text("outbox_id", outbox_id, crate::ids::MAX_DERIVED_ID_LEN)?;
            if action.key != *outbox_id {
                return Err(BadInput::new(
                    "bad_payload",
                    "operator_action requeue: the action's key is not the outbox id it requeues",
                ));
            }
        }
        OperatorCommand::AssignSms { message_sid, from, body } => {
            validate_message_sid(message_sid)?;
            validate_text("from", from, MAX_SMS_FROM_CHARS)?;
            if from.is_empty() {
                return Err(BadInput::new("bad_payload", "assign_sms from is empty"));
            }
            validate_text("body", body, MAX_SMS_BODY_CHARS)?;
        }
        OperatorCommand::Dismiss { outbox_id } => {
            validate_text("outbox_id", outbox_id, crate::ids::MAX_DERIVED_ID_LEN)?;
        }
        OperatorCommand::UnassignSms { message_sid, .. } => validate_message_sid(message_sid)?,
        OperatorCommand::ResolveAsk { .. } => {}
    }
    Ok(())
}

fn validate_message_sid(message_sid: &str) -> Result<(), BadInput> {
    if !crate::ids::is_message_sid(message_sid) {
        return Err(BadInput::new(
            "bad_message_sid",
            format!("MessageSid {:?} is not a Twilio message id", clip(message_sid)),
        ));
    }
    Ok(())
}

pub fn validate_client(c: &str) -> Result<(), BadInput> {
    if c.is_empty() || c.len() > 64 || !c.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(BadInput::new(
            "bad_payload",
            format!("client {:?} is not of the form [A-Za-z0-9_-]{{1,64}}", clip(c)),
        ));
    }
    Ok(())
}

/// E.164: `+` then 7 to 15 digits, the first not 0.
pub fn validate_phone(field: &str, p: &str) -> Result<(), BadInput> {
    let digits = p.strip_prefix('+').unwrap_or("");
    let ok = (7..=15).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_digit()) && !digits.starts_with('0');
    if !ok {
        return Err(BadInput::new(
            "bad_payload",
            format!("{field} is not an E.164 phone number (+ and 7 to 15 digits)"),
        ));
    }
    Ok(())
}

pub fn validate_stage(s: &str) -> Result<(), BadInput> {
    if s.is_empty() || s.len() > 32 || !s.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
        return Err(BadInput::new("bad_payload", format!("stage {:?} is not of the form [a-z_]{{1,32}}", clip(s))));
    }
    Ok(())
}

/// Longest inbound SMS body, in characters (ten concatenated parts).
pub const MAX_SMS_BODY_CHARS: usize = 1600;
/// Longest inbound SMS sender, in characters.
pub const MAX_SMS_FROM_CHARS: usize = 32;

/// A character free text may not hold: a control character other than newline, tab and
/// carriage return (NUL included).
pub fn is_refused_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t' && c != '\r'
}

/// Free text: bounded, no NUL or other control characters but newline and tab.
fn validate_text(field: &str, s: &str, max_chars: usize) -> Result<(), BadInput> {
    if s.chars().count() > max_chars {
        return Err(BadInput::new("bad_payload", format!("{field} is longer than {max_chars} characters")));
    }
    if s.chars().any(is_refused_control) {
        return Err(BadInput::new("bad_payload", format!("{field} contains a control character")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `input` read by `read` (the public path or the operators'): its kind, or the
    /// error's code; a read event's wire form round-trips.
    fn check_read(
        read: fn(LoadId, Value) -> Result<InboundEvent, BadInput>,
        input: Value,
        expected: Result<&str, &str>,
    ) {
        let load = LoadId::parse("481207").unwrap();
        match (read(load, input.clone()), expected) {
            (Ok(ev), Ok(kind)) => {
                assert_eq!(ev.kind(), kind);
                let again = InboundEvent::from_json(ev.load_id.clone(), ev.to_json()).unwrap();
                assert_eq!(again, ev);
            }
            (Err(e), Err(code)) => assert_eq!(e.code, code, "{input}: {e}"),
            (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
        }
    }

    fn check(input: Value, expected: Result<&str, &str>) {
        check_read(InboundEvent::from_outside, input, expected);
    }

    #[test]
    fn outside_events() {
        check(
            json!({"event_id":"p1","kind":"location_ping","lat":41.8,"lon":-87.6,"risk":"high"}),
            Ok("location_ping"),
        );
        check(json!({"event_id":"p1","kind":"location_ping","lat":91,"lon":0,"risk":"high"}), Err("bad_payload"));
        check(json!({"event_id":"p1","kind":"location_ping","lat":"x","lon":0,"risk":"high"}), Err("bad_payload"));
        check(json!({"event_id":"p1","kind":"location_ping","lat":1,"lon":0,"risk":"extreme"}), Err("bad_payload"));
        check(json!({"event_id":"p1","kind":"location_ping","lat":1,"lon":0}), Err("bad_payload"));
        check(
            json!({"event_id":"p1","kind":"location_ping","lat":1,"lon":0,"risk":"low","extra":1}),
            Err("bad_payload"),
        );
        check(
            json!({"event_id":"u1","kind":"load_update","client":"client_a","driver_phone":"+15555550100","stage":"in_transit"}),
            Ok("load_update"),
        );
        check(json!({"event_id":"u1","kind":"load_update","driver_phone":"5555550100"}), Err("bad_payload"));
        check(json!({"event_id":"s1","kind":"inbound_sms","from":"+15555550100","body":"ETA 9:15"}), Ok("inbound_sms"));
        check(json!({"event_id":"s1","kind":"inbound_sms","from":"+15555550100","body":"a\u{0}b"}), Err("bad_payload"));
        check(json!({"event_id":"s1","kind":"inbound_sms","from":"+1","body":"x".repeat(1601)}), Err("bad_payload"));
        check(json!({"event_id":"s1","kind":"inbound_sms","from":"+1","body":"é".repeat(1600)}), Ok("inbound_sms"));
        check(
            json!({"event_id":"s1","kind":"inbound_sms","from":"+1","body":"'; DROP TABLE events; --"}),
            Ok("inbound_sms"),
        );
        check(json!({"event_id":"x","kind":"teleport"}), Err("unknown_kind"));
        check(json!({"event_id":"evt:tmr:x","kind":"inbound_sms","from":"+1","body":""}), Err("reserved_event_id"));
        check(json!({"event_id":"a b","kind":"inbound_sms","from":"+1","body":""}), Err("bad_event_id"));
        check(json!({"kind":"inbound_sms","from":"+1","body":""}), Err("bad_payload"));
        check(
            json!({"event_id":"t","kind":"timer_fired","timer_id":"tmr:481207:ask:eta_request:p:1","ask_id":"ask:eta_request:p","step":1,"fire_at":"2026-03-02T07:30:00Z"}),
            Err("kind_not_accepted"),
        );
        check(json!([1, 2]), Err("bad_json"));
        check(
            json!({"event_id":"op:r1","kind":"operator_action","actor":"ana","reason":"x","command":{"type":"resolve_ask","ask_id":"ask:eta_request:p"}}),
            Err("reserved_event_id"),
        );
        check(
            json!({"event_id":"r1","kind":"operator_action","actor":"ana","reason":"x","command":{"type":"resolve_ask","ask_id":"ask:eta_request:p"}}),
            Err("kind_not_accepted"),
        );
    }

    #[test]
    fn fields_at_their_bounds() {
        let update = |field: &str, value: &str| json!({"event_id": "u1", "kind": "load_update", field: value});
        for (client, ok) in [("client_a-1", true), ("", false), ("a b", false), ("é", false)] {
            check(update("client", client), if ok { Ok("load_update") } else { Err("bad_payload") });
        }
        check(update("client", &"c".repeat(64)), Ok("load_update"));
        check(update("client", &"c".repeat(65)), Err("bad_payload"));
        for (stage, ok) in [("in_transit", true), ("", false), ("In_transit", false), ("at-pickup", false)] {
            check(update("stage", stage), if ok { Ok("load_update") } else { Err("bad_payload") });
        }
        check(update("stage", &"s".repeat(32)), Ok("load_update"));
        check(update("stage", &"s".repeat(33)), Err("bad_payload"));
        let ping =
            |lat: f64, lon: f64| json!({"event_id":"p1","kind":"location_ping","lat":lat,"lon":lon,"risk":"low"});
        check(ping(-90.0, 180.0), Ok("location_ping"));
        check(ping(0.0, 180.5), Err("bad_payload"));
        check(ping(0.0, -181.0), Err("bad_payload"));
        check(ping(-90.5, 0.0), Err("bad_payload"));
        // `load_id` in the body is allowed when it is the path's.
        let with_load = |l: &str| json!({"event_id":"s1","kind":"inbound_sms","from":"+1","body":"x","load_id":l});
        check(with_load("481207"), Ok("inbound_sms"));
        check(with_load("481208"), Err("bad_payload"));
    }

    #[test]
    fn a_timer_fired_names_its_timer_s_ask_and_step() {
        let fired = |ask: &str, step: u32| {
            json!({"event_id":"evt:tmr:481207:ask:eta_request:p:1","kind":"timer_fired",
                   "timer_id":"tmr:481207:ask:eta_request:p:1","ask_id":ask,"step":step,"fire_at":"2026-03-02T07:30:00Z"})
        };
        check_read(InboundEvent::from_json, fired("ask:eta_request:p", 1), Ok("timer_fired"));
        check_read(InboundEvent::from_json, fired("ask:eta_request:q", 1), Err("bad_payload"));
        check_read(InboundEvent::from_json, fired("ask:eta_request:p", 2), Err("bad_payload"));
    }

    #[test]
    fn names() {
        assert_eq!(
            event_kinds().collect::<Vec<_>>(),
            ["load_update", "location_ping", "inbound_sms", "timer_fired", "action_outcome", "operator_action"]
        );
        for r in [Risk::Low, Risk::Medium, Risk::High] {
            assert_eq!(json!(r.as_str()), serde_json::to_value(r).unwrap());
        }
        let ev = InboundEvent::from_outside(
            LoadId::parse("481207").unwrap(),
            json!({"event_id":"s1","kind":"inbound_sms","from":"+1","body":"x"}),
        )
        .unwrap();
        assert_eq!(ev.to_string(), "481207 s1 (inbound_sms)");
    }

    fn check_operator(input: Value, expected: Result<&str, &str>) {
        check_read(InboundEvent::from_operator, input, expected);
    }

    #[test]
    fn operator_events() {
        let op = |command: Value| json!({"event_id":"op:r1","kind":"operator_action","actor":"ana@example.com","reason":"Hero is back","command":command});
        let dead = json!({"key":"481207/sms_1/create_hero_task","type":"create_hero_task",
                          "params":{"title":"t","body":"b","urgency":"normal"}});
        check_operator(
            op(json!({"type":"requeue","outbox_id":"481207/sms_1/create_hero_task","action":dead})),
            Ok("operator_action"),
        );
        check_operator(
            op(json!({"type":"requeue","outbox_id":"481207/other/create_hero_task","action":dead})),
            Err("bad_payload"),
        );
        check_operator(op(json!({"type":"resolve_ask","ask_id":"ask:eta_request:p"})), Ok("operator_action"));
        check_operator(op(json!({"type":"resolve_ask","ask_id":"nope"})), Err("bad_payload"));
        check_operator(
            op(json!({"type":"assign_sms","message_sid":"SM1","from":"+15555550100","body":"ETA 9"})),
            Ok("operator_action"),
        );
        check_operator(
            op(json!({"type":"assign_sms","message_sid":"SM/1","from":"+1","body":"x"})),
            Err("bad_message_sid"),
        );
        check_operator(op(json!({"type":"teleport"})), Err("bad_payload"));
        check_operator(op(json!({"type":"resolve_ask","ask_id":"ask:eta_request:p","extra":1})), Err("bad_payload"));
        let mut v = op(json!({"type":"resolve_ask","ask_id":"ask:eta_request:p"}));
        v["reason"] = json!("  ");
        check_operator(v.clone(), Err("bad_payload"));
        v["reason"] = json!("x".repeat(501));
        check_operator(v.clone(), Err("bad_payload"));
        v["reason"] = json!("ok");
        v["actor"] = json!("a b");
        check_operator(v.clone(), Err("bad_payload"));
        v["actor"] = json!("ana");
        v["event_id"] = json!("r1");
        check_operator(v.clone(), Err("bad_event_id"));
        v["event_id"] = json!("sms:SM1");
        check_operator(v, Err("reserved_event_id"));
        // an operator may post every other outside kind, but not under an op: id
        check_operator(
            json!({"event_id":"p1","kind":"location_ping","lat":1,"lon":0,"risk":"low"}),
            Ok("location_ping"),
        );
        check_operator(
            json!({"event_id":"op:p1","kind":"location_ping","lat":1,"lon":0,"risk":"low"}),
            Err("reserved_event_id"),
        );
        // Each command's name is its wire `type`.
        for command in [
            json!({"type":"requeue","outbox_id":"481207/sms_1/create_hero_task","action":dead}),
            json!({"type":"assign_sms","message_sid":"SM1","from":"+15555550100","body":"ETA 9"}),
            json!({"type":"resolve_ask","ask_id":"ask:eta_request:p"}),
        ] {
            let ev = InboundEvent::from_operator(LoadId::parse("481207").unwrap(), op(command.clone())).unwrap();
            let EventBody::OperatorAction(a) = &ev.body else { panic!("{ev:?}") };
            assert_eq!(a.command.name(), command["type"]);
        }
    }
}
