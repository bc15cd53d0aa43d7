//! Identifiers and the deterministic id functions of docs/design.md.
//!
//! Every id is a validated string: a value outside its form is rejected here, at the
//! edge, and never reaches the store. Derived ids (`evt:…`, `dec:…`, action keys,
//! timer ids) are built only by the functions in this module, so the same inputs give
//! the same ids in every process, eval and replay.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::{BadInput, clip};
use crate::outcome::OutcomeStatus;

/// Longest derived id we accept (an outcome event id embeds an action key that embeds
/// an event id that may itself be derived). Bounds the size of every id we store.
pub const MAX_DERIVED_ID_LEN: usize = 1024;

fn is_load_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn is_event_char(c: char) -> bool {
    is_load_char(c) || c == '.' || c == ':'
}

macro_rules! string_id {
    ($name:ident) => {
        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::parse(&s).map_err(serde::de::Error::custom)
            }
        }
        impl std::str::FromStr for $name {
            type Err = BadInput;
            fn from_str(s: &str) -> Result<Self, BadInput> {
                $name::parse(s)
            }
        }
    };
}

/// A load id: `[A-Za-z0-9_-]{1,64}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoadId(String);
string_id!(LoadId);

impl LoadId {
    pub fn parse(s: &str) -> Result<Self, BadInput> {
        if s.is_empty() || s.len() > 64 || !s.chars().all(is_load_char) {
            return Err(BadInput::new(
                "bad_load_id",
                format!("load id {:?} is not of the form [A-Za-z0-9_-]{{1,64}}", clip(s)),
            ));
        }
        Ok(LoadId(s.to_owned()))
    }
}

/// The prefix of the event ids the Twilio webhook gives inbound SMS, `sms:{MessageSid}`.
/// Reserved: an outside caller who could post `sms:SM…` first would take a real SMS's
/// id, and the real SMS would then be refused as a reused id.
pub const TWILIO_SMS_PREFIX: &str = "sms:";

/// Longest Twilio MessageSid accepted (Twilio's are 34 characters).
pub const MAX_MESSAGE_SID_LEN: usize = 64;

/// A Twilio MessageSid as haul takes one: 1 to [`MAX_MESSAGE_SID_LEN`] ASCII letters
/// and digits (Twilio's are `SM` or `MM` and 32 hex digits).
pub fn is_message_sid(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_MESSAGE_SID_LEN && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The prefix of operator actions' event ids, `op:{request id}` (and, for one row of a
/// bulk requeue, `op:{request id}:{row hash}`). Reserved: only the operator routes make
/// them, and an `operator_action` carries no other.
pub const OPERATOR_PREFIX: &str = "op:";

/// Longest request id an operator may give (`[A-Za-z0-9_.-]{1,64}`).
pub const MAX_REQUEST_ID_LEN: usize = 64;

/// An event id: one given by a source (`[A-Za-z0-9_.:-]{1,128}`, not starting with a
/// reserved prefix), one the Twilio webhook gives an SMS (`sms:{MessageSid}`), one an
/// operator action gets from its request id (`op:…`), or one haul derives itself
/// (`evt:…`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);
string_id!(EventId);

impl EventId {
    /// Accepts every form: what may appear in a log or on the load queue.
    pub fn parse(s: &str) -> Result<Self, BadInput> {
        if s.starts_with("evt:") {
            if s.len() > MAX_DERIVED_ID_LEN || s.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(BadInput::new(
                    "bad_event_id",
                    format!("derived event id {:?} is too long or has control characters", clip(s)),
                ));
            }
            return Ok(EventId(s.to_owned()));
        }
        check_inbound_form(s)?;
        // `dec:` names decisions, never events. `sms:` ids written before the prefix
        // was reserved (in any inbound form) stay readable.
        if s.starts_with("dec:") {
            return Err(reserved(s));
        }
        Ok(EventId(s.to_owned()))
    }

    /// Only the form an outside source may use: the reserved prefixes are refused so
    /// nobody can pre-empt a timer's, an outcome's or an SMS's event id.
    pub fn parse_inbound(s: &str) -> Result<Self, BadInput> {
        check_inbound_form(s)?;
        if ["evt:", "dec:", TWILIO_SMS_PREFIX, OPERATOR_PREFIX].iter().any(|p| s.starts_with(p)) {
            return Err(reserved(s));
        }
        Ok(EventId(s.to_owned()))
    }

    /// What a scenario file may use for the kinds an outside source sends: the
    /// inbound form, and the Twilio webhook's `sms:` ids too. A scenario file is the
    /// harness's own input, like the webhook's: it plays an SMS as the webhook routed
    /// it, and files written before the prefix was reserved run unchanged. The other
    /// reserved prefixes are still refused.
    pub fn parse_scenario(s: &str) -> Result<Self, BadInput> {
        check_inbound_form(s)?;
        if ["evt:", "dec:", OPERATOR_PREFIX].iter().any(|p| s.starts_with(p)) {
            return Err(reserved(s));
        }
        Ok(EventId(s.to_owned()))
    }

    /// What an operator may use: the inbound form, `op:` ids included (the other
    /// reserved prefixes are still refused).
    pub fn parse_operator(s: &str) -> Result<Self, BadInput> {
        check_inbound_form(s)?;
        if ["evt:", "dec:", TWILIO_SMS_PREFIX].iter().any(|p| s.starts_with(p)) {
            return Err(reserved(s));
        }
        Ok(EventId(s.to_owned()))
    }

    /// `sms:{MessageSid}`: the event id of an inbound SMS, which only the Twilio
    /// webhook makes.
    pub fn twilio_sms(message_sid: &str) -> Result<Self, BadInput> {
        if !is_message_sid(message_sid) {
            return Err(BadInput::new(
                "bad_message_sid",
                format!(
                    "MessageSid {:?} is not a Twilio message id ([A-Za-z0-9]{{1,{MAX_MESSAGE_SID_LEN}}})",
                    clip(message_sid)
                ),
            ));
        }
        Ok(EventId(format!("{TWILIO_SMS_PREFIX}{message_sid}")))
    }

    /// `op:{request id}`: the event id of an operator action, the same for every retry
    /// of one request, so a retried request is a duplicate and does nothing twice.
    pub fn operator(request_id: &str) -> Result<Self, BadInput> {
        check_request_id(request_id)?;
        Ok(EventId(format!("{OPERATOR_PREFIX}{request_id}")))
    }

    /// `op:{request id}:{16 hex digits}`: the event id of one row of a bulk requeue,
    /// derived from the request and the row's key, so a retried bulk request names
    /// every row's event as the first try did, whatever order the rows come in.
    pub fn operator_bulk(request_id: &str, outbox_id: &str) -> Result<Self, BadInput> {
        check_request_id(request_id)?;
        Ok(EventId(format!("{OPERATOR_PREFIX}{request_id}:{:016x}", fnv1a64(outbox_id.as_bytes()))))
    }

    pub fn is_derived(&self) -> bool {
        self.0.starts_with("evt:")
    }

    pub fn is_operator(&self) -> bool {
        self.0.starts_with(OPERATOR_PREFIX)
    }
}

/// A request id an operator gives: `[A-Za-z0-9_.-]{1,64}`.
pub fn check_request_id(s: &str) -> Result<(), BadInput> {
    let ok = !s.is_empty()
        && s.len() <= MAX_REQUEST_ID_LEN
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if !ok {
        return Err(BadInput::new(
            "bad_request_id",
            format!("request id {:?} is not of the form [A-Za-z0-9_.-]{{1,{MAX_REQUEST_ID_LEN}}}", clip(s)),
        ));
    }
    Ok(())
}

/// FNV-1a, 64 bits: a stable hash (the same in every process and version), not a
/// secret one; it only spreads a bulk request's rows over distinct event ids.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

fn check_inbound_form(s: &str) -> Result<(), BadInput> {
    if s.is_empty() || s.len() > 128 || !s.chars().all(is_event_char) {
        return Err(BadInput::new(
            "bad_event_id",
            format!("event id {:?} is not of the form [A-Za-z0-9_.:-]{{1,128}}", clip(s)),
        ));
    }
    Ok(())
}

fn reserved(s: &str) -> BadInput {
    BadInput::new(
        "reserved_event_id",
        format!(
            "event id {s:?} uses a prefix reserved for haul (evt:, dec:, sms: for the Twilio webhook's SMS, op: for operator actions)"
        ),
    )
}

/// An ask id: `ask:{kind}:{trigger event id}`, kind `[a-z_]{1,32}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AskId(String);
string_id!(AskId);

impl AskId {
    pub fn new(kind: &str, trigger: &EventId) -> Result<Self, BadInput> {
        Self::parse(&format!("ask:{kind}:{trigger}"))
    }

    pub fn parse(s: &str) -> Result<Self, BadInput> {
        let bad = || {
            BadInput::new("bad_ask_id", format!("ask id {:?} is not of the form ask:{{kind}}:{{event id}}", clip(s)))
        };
        let rest = s.strip_prefix("ask:").ok_or_else(bad)?;
        let (kind, trigger) = rest.split_once(':').ok_or_else(bad)?;
        if kind.is_empty() || kind.len() > 32 || !kind.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            return Err(bad());
        }
        EventId::parse(trigger).map_err(|_| bad())?;
        Ok(AskId(s.to_owned()))
    }

    pub fn kind(&self) -> &str {
        self.0["ask:".len()..].split_once(':').map(|(k, _)| k).unwrap_or("")
    }
}

/// A timer id: `tmr:{load}:{ask id}:{step}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(String);
string_id!(TimerId);

impl TimerId {
    pub fn new(load: &LoadId, ask: &AskId, step: u32) -> Self {
        TimerId(format!("tmr:{load}:{ask}:{step}"))
    }

    pub fn parse(s: &str) -> Result<Self, BadInput> {
        Self::split(s).map(|_| TimerId(s.to_owned()))
    }

    /// The parts of a timer id. A load id has no `:` and the step is the last field,
    /// so the split is unambiguous.
    pub fn parts(&self) -> (LoadId, AskId, u32) {
        Self::split(&self.0).expect("a TimerId is valid by construction")
    }

    fn split(s: &str) -> Result<(LoadId, AskId, u32), BadInput> {
        let bad = || {
            BadInput::new(
                "bad_timer_id",
                format!("timer id {:?} is not of the form tmr:{{load}}:{{ask id}}:{{step}}", clip(s)),
            )
        };
        let rest = s.strip_prefix("tmr:").ok_or_else(bad)?;
        let (load, rest) = rest.split_once(':').ok_or_else(bad)?;
        let (ask, step) = rest.rsplit_once(':').ok_or_else(bad)?;
        let load = LoadId::parse(load).map_err(|_| bad())?;
        let ask = AskId::parse(ask).map_err(|_| bad())?;
        let step: u32 = step.parse().map_err(|_| bad())?;
        if step == 0 {
            return Err(bad());
        }
        Ok((load, ask, step))
    }
}

/// `evt:{timer id}`: the event id of a `timer_fired`, the same for every firing of
/// one timer, so a second publish is dropped by the event store.
pub fn timer_fired_event_id(timer: &TimerId) -> EventId {
    EventId(format!("evt:{timer}"))
}

/// `evt:out:{outbox id}:{status}`: distinct per status, so a delivered and a failed
/// outcome of one key are both recorded (ADR 0003, "late FAILED next to DELIVERED").
pub fn action_outcome_event_id(outbox_id: &str, status: OutcomeStatus) -> EventId {
    EventId(format!("evt:out:{outbox_id}:{}", status.as_str()))
}

/// `alert:{outbox id}`: the idempotency key of a dead row's OpsAlert, so the ops service
/// dedupes an alert the sweep raises again.
pub fn ops_alert_key(outbox_id: &str) -> String {
    format!("alert:{outbox_id}")
}

/// The outbox id an [`ops_alert_key`] names.
pub fn ops_alert_outbox_id(key: &str) -> Option<&str> {
    key.strip_prefix("alert:")
}

/// `dec:{event id}`.
pub fn decision_entry_id(event: &EventId) -> String {
    format!("dec:{event}")
}

/// `{load}/{ask id}/{step}/{action type}`.
pub fn ask_action_key(load: &LoadId, ask: &AskId, step: u32, action_type: &str) -> String {
    format!("{load}/{ask}/{step}/{action_type}")
}

/// `{load}/{event id}/{action type}`: actions that answer an event, not an ask step.
pub fn event_action_key(load: &LoadId, event: &EventId, action_type: &str) -> String {
    format!("{load}/{event}/{action_type}")
}

/// `{load}/{event id}/create_hero_task:fallback`: the one action of a fallback decision.
pub fn fallback_action_key(load: &LoadId, event: &EventId) -> String {
    format!("{load}/{event}/create_hero_task:fallback")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: fmt::Debug>(got: Result<T, BadInput>, expected_ok: bool) {
        assert_eq!(got.is_ok(), expected_ok, "{got:?}");
    }

    #[test]
    fn load_ids() {
        for (s, ok) in [
            ("481207", true),
            ("a_b-C9", true),
            ("", false),
            ("a/b", false),
            ("a:b", false),
            ("é", false),
            (&"x".repeat(64), true),
            (&"x".repeat(65), false),
            ("' OR 1=1 --", false),
        ] {
            check(LoadId::parse(s), ok);
        }
    }

    #[test]
    fn inbound_event_ids() {
        for (s, ok) in [
            ("ping_0700", true),
            ("sms:SM8a1f", false),
            ("op:r1", false),
            ("sms_8a1f", true),
            ("a.b-c_d:e", true),
            ("evt:tmr:1:ask:x:y:1", false),
            ("dec:ping", false),
            ("", false),
            ("a b", false),
            ("a/b", false),
            ("a\0b", false),
            (&"e".repeat(128), true),
            (&"e".repeat(129), false),
        ] {
            check(EventId::parse_inbound(s), ok);
        }
        assert!(EventId::parse("evt:out:481207/ask:eta_request:p/1/send_sms:delivered").is_ok());
        assert!(EventId::parse("evt:bad id").is_err());
        // A derived id is bounded by MAX_DERIVED_ID_LEN bytes, not the inbound 128.
        let derived = |len: usize| format!("evt:{}", "e".repeat(len - 4));
        check(EventId::parse(&derived(MAX_DERIVED_ID_LEN)), true);
        check(EventId::parse(&derived(MAX_DERIVED_ID_LEN + 1)), false);
        check(EventId::parse(&derived(200)), true);
        for (s, derived) in [("evt:tmr:1:ask:x:y:1", true), ("ping_0700", false), ("op:r1:0", false)] {
            assert_eq!(EventId::parse(s).unwrap().is_derived(), derived, "{s}");
        }
        assert_eq!(EventId::parse_inbound("sms:SM8a1f").unwrap_err().code, "reserved_event_id");
        assert!(EventId::parse_inbound("sms:SM8a1f").unwrap_err().message.contains("sms:"));
        // A scenario file plays the webhook's own ids; the other reserved prefixes stay refused.
        for (s, ok) in [
            ("ping_0700", true),
            ("sms:SM8a1f", true),
            ("sms:older_form.1", true),
            ("op:r1", false),
            ("evt:tmr:1:ask:x:y:1", false),
            ("dec:ping", false),
            ("a b", false),
            (&"e".repeat(129), false),
        ] {
            check(EventId::parse_scenario(s), ok);
        }
    }

    #[test]
    fn ask_ids_and_bulk_ids() {
        for (s, ok) in [
            ("ask:eta_request:ping_0700", true),
            ("ask::ping_0700", false),
            ("ask:Eta:ping_0700", false),
            ("ask:eta-request:ping_0700", false),
            ("ask:eta_request:a b", false),
            ("eta_request:ping_0700", false),
        ] {
            check(AskId::parse(s), ok);
        }
        check(AskId::parse(&format!("ask:{}:p", "k".repeat(32))), true);
        check(AskId::parse(&format!("ask:{}:p", "k".repeat(33))), false);
        // FNV-1a's published 64-bit values: a row's event id is the same in every build.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(EventId::operator_bulk("r1", "a").unwrap().as_str(), "op:r1:af63dc4c8601ec8c");
    }

    #[test]
    fn sms_event_ids_are_the_webhooks() {
        let id = EventId::twilio_sms("SM8a1f").unwrap();
        assert_eq!(id.as_str(), "sms:SM8a1f");
        assert_eq!(EventId::parse(id.as_str()), Ok(id), "readable in a log and on the queue");
        assert!(EventId::parse("sms:older_form.1").is_ok(), "ids written before the reservation stay readable");
        assert!(EventId::parse("dec:x").is_err());
        for bad in ["", "SM/../x", "SM 1", "SM\u{0}1", &"S".repeat(MAX_MESSAGE_SID_LEN + 1)] {
            assert_eq!(EventId::twilio_sms(bad).unwrap_err().code, "bad_message_sid", "{bad:?}");
        }
        assert!(EventId::twilio_sms(&"S".repeat(MAX_MESSAGE_SID_LEN)).is_ok());
    }

    #[test]
    fn derived_ids_match_domain_md() {
        let load = LoadId::parse("481207").unwrap();
        let ping = EventId::parse_inbound("ping_0700").unwrap();
        let ask = AskId::new("eta_request", &ping).unwrap();
        assert_eq!(ask.as_str(), "ask:eta_request:ping_0700");
        assert_eq!(ask.kind(), "eta_request");
        let key = ask_action_key(&load, &ask, 1, "send_sms");
        assert_eq!(key, "481207/ask:eta_request:ping_0700/1/send_sms");
        let timer = TimerId::new(&load, &ask, 1);
        assert_eq!(timer.as_str(), "tmr:481207:ask:eta_request:ping_0700:1");
        assert_eq!(timer.parts(), (load.clone(), ask.clone(), 1));
        assert_eq!(timer_fired_event_id(&timer).as_str(), "evt:tmr:481207:ask:eta_request:ping_0700:1");
        assert_eq!(
            action_outcome_event_id(&key, OutcomeStatus::Delivered).as_str(),
            "evt:out:481207/ask:eta_request:ping_0700/1/send_sms:delivered"
        );
        assert_eq!(decision_entry_id(&ping), "dec:ping_0700");
        assert_eq!(ops_alert_key(&key), "alert:481207/ask:eta_request:ping_0700/1/send_sms");
        assert_eq!(ops_alert_outbox_id(&ops_alert_key(&key)), Some(key.as_str()));
        assert_eq!(fallback_action_key(&load, &ping), "481207/ping_0700/create_hero_task:fallback");
    }

    #[test]
    fn operator_event_ids() {
        assert_eq!(EventId::operator("req-1.a_b").unwrap().as_str(), "op:req-1.a_b");
        assert!(EventId::operator("req-1").unwrap().is_operator());
        for bad in ["", "a:b", "a b", "a/b", &"r".repeat(MAX_REQUEST_ID_LEN + 1)] {
            assert_eq!(EventId::operator(bad).unwrap_err().code, "bad_request_id", "{bad:?}");
        }
        let a = EventId::operator_bulk("r1", "481207/ask:eta_request:p/2/create_hero_task").unwrap();
        let b = EventId::operator_bulk("r1", "481207/sms_1/create_hero_task").unwrap();
        assert_ne!(a, b);
        assert_eq!(a, EventId::operator_bulk("r1", "481207/ask:eta_request:p/2/create_hero_task").unwrap());
        assert_eq!(a.as_str().len(), "op:r1:".len() + 16);
        // readable in a log and on the queue, never accepted as an outside source's id
        assert_eq!(EventId::parse(a.as_str()), Ok(a.clone()));
        assert_eq!(EventId::parse_inbound(a.as_str()).unwrap_err().code, "reserved_event_id");
        assert!(EventId::operator(&"r".repeat(MAX_REQUEST_ID_LEN)).is_ok());
        assert!(EventId::operator_bulk(&"r".repeat(MAX_REQUEST_ID_LEN), "x").unwrap().as_str().len() <= 128);
    }

    #[test]
    fn timer_ids() {
        for (s, ok) in [
            ("tmr:481207:ask:eta_request:ping_0700:1", true),
            ("tmr:481207:ask:eta_request:ping_0700:0", false),
            ("tmr:481207:ask:eta_request:ping_0700", false),
            ("tmr:4812/07:ask:eta_request:p:1", false),
            ("481207:ask:eta_request:p:1", false),
        ] {
            check(TimerId::parse(s), ok);
        }
    }
}
