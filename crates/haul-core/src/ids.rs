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

/// An event id: either one given by a source (`[A-Za-z0-9_.:-]{1,128}`, not starting
/// with the reserved `evt:` or `dec:`), or one haul derives itself (`evt:…`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);
string_id!(EventId);

impl EventId {
    /// Accepts both forms: what may appear in a log or on the load queue.
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
        Self::parse_inbound(s)
    }

    /// Only the form an outside source may use: the reserved prefixes are refused so
    /// nobody can pre-empt a timer's or an outcome's event id.
    pub fn parse_inbound(s: &str) -> Result<Self, BadInput> {
        if s.is_empty() || s.len() > 128 || !s.chars().all(is_event_char) {
            return Err(BadInput::new(
                "bad_event_id",
                format!("event id {:?} is not of the form [A-Za-z0-9_.:-]{{1,128}}", clip(s)),
            ));
        }
        if s.starts_with("evt:") || s.starts_with("dec:") {
            return Err(BadInput::new(
                "reserved_event_id",
                format!("event id {s:?} uses a prefix reserved for haul (evt: or dec:)"),
            ));
        }
        Ok(EventId(s.to_owned()))
    }

    pub fn is_derived(&self) -> bool {
        self.0.starts_with("evt:")
    }
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
            ("sms:SM8a1f", true),
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
