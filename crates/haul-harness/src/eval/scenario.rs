//! Scenario files (docs/scenarios.md): parsing and checking them before anything runs.
//!
//! The format is a contract: files written by other teams must run unchanged. Every
//! problem is reported with the file's line and the key, never a panic: TOML syntax,
//! unknown keys, bad times or durations, time going backwards, bad events.

use std::collections::BTreeMap;
use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, add};
use haul_core::{Channel, InboundEvent, parse_duration};
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::testkit::{FaultKind, FaultRule};
use haul_config::ClientConfig;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    start: Spanned<String>,
    /// Free text for people; ignored by the runner.
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    clients: BTreeMap<String, ClientConfig>,
    #[serde(default)]
    load: Option<LoadSection>,
    #[serde(default)]
    fault: Vec<Spanned<FaultSection>>,
    #[serde(default)]
    step: Vec<StepSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadSection {
    id: String,
    client: Option<String>,
    driver_phone: Option<String>,
    stage: Option<String>,
    next_stop: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultSection {
    channel: String,
    key: String,
    kind: String,
    times: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepSection {
    at: Spanned<String>,
    #[serde(default)]
    inbound: Vec<Spanned<toml::Table>>,
    /// SMS the Twilio webhook kept as unmatched, as it keeps them.
    #[serde(default)]
    unmatched_sms: Vec<Spanned<UnmatchedSection>>,
    /// Operator actions, as `POST /v1/operator/*` makes them.
    #[serde(default)]
    operator: Vec<Spanned<OperatorSection>>,
    #[serde(default)]
    expect: Option<Expect>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnmatchedSection {
    message_sid: String,
    from: String,
    body: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorSection {
    action: String,
    request_id: String,
    actor: String,
    reason: String,
    outbox_id: Option<String>,
    message_sid: Option<String>,
    load: Option<String>,
    ask_id: Option<String>,
    action_type: Option<String>,
    since: Option<String>,
    limit: Option<usize>,
    dry_run: Option<bool>,
    repeat: Option<u32>,
}

/// An SMS the webhook kept as unmatched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnmatchedStep {
    pub message_sid: String,
    pub from: String,
    pub body: String,
}

/// What an operator asks for in a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperatorAsk {
    Requeue { outbox_id: String },
    BulkRequeue { filter: haul_runtime::operator::DeadFilter, dry_run: bool },
    AssignSms { message_sid: String, load: LoadId },
    ResolveAsk { load: LoadId, ask_id: haul_core::ids::AskId },
}

/// One operator action of a step, made `repeat` times (a retried request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorStep {
    pub who: haul_runtime::operator::Requester,
    pub ask: OperatorAsk,
    pub repeat: u32,
}

/// The `expect` keys; each present one is checked.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub sent: Option<Vec<SentExpect>>,
    pub timers_scheduled: Option<Vec<TimerExpect>>,
    pub timers_canceled: Option<Vec<String>>,
    pub asks: Option<Vec<AskExpect>>,
    pub open_asks: Option<Vec<String>>,
    pub stage: Option<String>,
    pub decisions: Option<Vec<DecisionExpect>>,
    pub dead: Option<Vec<String>>,
    pub ops_alerts: Option<Vec<String>>,
    /// Extension: the model calls made since the previous check (0 with the SOP).
    pub llm_calls: Option<usize>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SentExpect {
    pub channel: String,
    pub key: String,
    pub to: Option<String>,
    pub urgency: Option<String>,
    pub body_contains: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimerExpect {
    pub id: String,
    pub fire_at: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskExpect {
    pub id: String,
    pub status: String,
    pub step: Option<u32>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionExpect {
    pub event_id: String,
    pub decider: Option<String>,
    pub filtered: Option<bool>,
    pub actions: Option<Vec<String>>,
}

/// A checked scenario, ready to run.
#[derive(Debug)]
pub struct Scenario {
    pub name: String,
    pub start: Timestamp,
    pub clients: BTreeMap<String, ClientConfig>,
    pub load: Option<LoadId>,
    /// The `[load]` section as its `load:init` event.
    pub init: Option<InboundEvent>,
    pub faults: Vec<FaultRule>,
    pub steps: Vec<Step>,
}

#[derive(Debug)]
pub struct Step {
    pub at: Timestamp,
    /// The `at` as written, for messages.
    pub at_text: String,
    /// Each event with how many times it is published.
    pub inbound: Vec<(InboundEvent, u32)>,
    pub unmatched_sms: Vec<UnmatchedStep>,
    pub operator: Vec<OperatorStep>,
    pub expect: Option<Expect>,
}

/// A problem in a scenario file, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}: {}", self.key, self.message),
            None => write!(f, "{}: {}", self.key, self.message),
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Longest a scenario may be: bounds the work one file can ask for.
const MAX_STEPS: usize = 1000;
const MAX_REPEAT: u32 = 100;

/// Parses `HH:MM` (on the start date), `+90m` / `+1d2h` (from start), or RFC 3339.
pub fn parse_at(s: &str, start: Timestamp) -> Result<Timestamp, String> {
    let s = s.trim();
    if let Some(rel) = s.strip_prefix('+') {
        let d = parse_duration(rel).map_err(|e| e.message)?;
        return Ok(add(start, d));
    }
    let parts: Vec<&str> = s.split(':').collect();
    if (parts.len() == 2 || parts.len() == 3)
        && parts.iter().all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_digit()))
    {
        let n = |i: usize| parts.get(i).map_or(0, |p| p.parse::<u64>().unwrap_or(99));
        let (h, m, sec) = (n(0), n(1), n(2));
        if h > 23 || m > 59 || sec > 59 {
            return Err(format!("{s:?} is not a time of day"));
        }
        // Times of day are UTC, like `start`.
        const DAY_MS: i64 = 86_400_000;
        let midnight = haul_core::time::from_ms(start.as_millisecond().div_euclid(DAY_MS) * DAY_MS);
        return Ok(add(midnight, Duration::from_secs(h * 3600 + m * 60 + sec)));
    }
    s.parse::<Timestamp>()
        .map_err(|_| format!("{s:?} is not HH:MM, +DURATION (e.g. +90m) or an RFC 3339 time (2026-03-02T07:00:00Z)"))
}

/// An operator action as written: the keys its `action` takes, and only those.
fn operator_step(op: &OperatorSection, load: Option<&LoadId>, start: Timestamp) -> Result<OperatorStep, String> {
    let who = haul_runtime::operator::Requester {
        request_id: op.request_id.clone(),
        actor: op.actor.clone(),
        reason: op.reason.clone(),
    };
    let repeat = op.repeat.unwrap_or(1);
    if !(1..=MAX_REPEAT).contains(&repeat) {
        return Err(format!("repeat must be 1 to {MAX_REPEAT}"));
    }
    let given = [
        ("outbox_id", op.outbox_id.is_some()),
        ("message_sid", op.message_sid.is_some()),
        ("load", op.load.is_some()),
        ("ask_id", op.ask_id.is_some()),
        ("action_type", op.action_type.is_some()),
        ("since", op.since.is_some()),
        ("limit", op.limit.is_some()),
        ("dry_run", op.dry_run.is_some()),
    ];
    let (takes, needs): (&[&str], &[&str]) = match op.action.as_str() {
        "requeue" => (&["outbox_id"], &["outbox_id"]),
        "bulk_requeue" => (&["action_type", "since", "limit", "dry_run"], &["action_type", "since"]),
        "assign_sms" => (&["message_sid", "load"], &["message_sid"]),
        "resolve_ask" => (&["ask_id", "load"], &["ask_id"]),
        other => return Err(format!("action {other:?} is not requeue, bulk_requeue, assign_sms or resolve_ask")),
    };
    if let Some((k, _)) = given.iter().find(|(k, on)| *on && !takes.contains(k)) {
        return Err(format!("{} takes no {k} (it takes {})", op.action, takes.join(", ")));
    }
    if let Some(k) = needs.iter().find(|k| !given.iter().any(|(g, on)| g == *k && *on)) {
        return Err(format!("{} needs {k}", op.action));
    }
    let load = || -> Result<LoadId, String> {
        match &op.load {
            Some(l) => LoadId::parse(l).map_err(|e| e.message),
            None => load.cloned().ok_or_else(|| "no load: add a [load] section or `load = ...`".to_owned()),
        }
    };
    let ask = match op.action.as_str() {
        "requeue" => OperatorAsk::Requeue { outbox_id: op.outbox_id.clone().unwrap_or_default() },
        "bulk_requeue" => {
            let t = op.action_type.as_deref().unwrap_or_default();
            let action_type =
                haul_core::ActionType::parse(t).ok_or_else(|| format!("action_type {t:?} is not an action type"))?;
            let since = parse_at(op.since.as_deref().unwrap_or_default(), start)?;
            let limit = op.limit.unwrap_or(haul_runtime::operator::MAX_BULK_ROWS);
            OperatorAsk::BulkRequeue {
                filter: haul_runtime::operator::DeadFilter { action_type, since, limit },
                dry_run: op.dry_run.unwrap_or(false),
            }
        }
        "assign_sms" => {
            OperatorAsk::AssignSms { message_sid: op.message_sid.clone().unwrap_or_default(), load: load()? }
        }
        _ => {
            let ask_id = op.ask_id.as_deref().unwrap_or_default();
            let ask_id = haul_core::ids::AskId::parse(ask_id).map_err(|e| e.message)?;
            OperatorAsk::ResolveAsk { load: load()?, ask_id }
        }
    };
    Ok(OperatorStep { who, ask, repeat })
}

pub fn parse(text: &str) -> Result<Scenario, FileError> {
    let file: File = toml::from_str(text).map_err(|e| FileError {
        line: e.span().map(|s| line_of(text, s.start)),
        key: "toml".into(),
        message: e.message().to_owned(),
    })?;
    let err = |span: std::ops::Range<usize>, key: &str, message: String| FileError {
        line: Some(line_of(text, span.start)),
        key: key.to_owned(),
        message,
    };
    let start: Timestamp = file.start.get_ref().parse().map_err(|_| {
        err(
            file.start.span(),
            "start",
            format!("{:?} is not an RFC 3339 time such as 2026-03-02T07:00:00Z", file.start.get_ref()),
        )
    })?;
    let start = haul_core::time::trunc_ms(start);
    for (name, c) in &file.clients {
        haul_core::event::validate_client(name).map_err(|e| FileError {
            line: None,
            key: format!("clients.{name}"),
            message: e.message,
        })?;
        if c.eta_request.max_attempts.is_some_and(|n| !(1..=20).contains(&n)) {
            return Err(FileError {
                line: None,
                key: format!("clients.{name}.eta_request.max_attempts"),
                message: "must be 1 to 20".into(),
            });
        }
    }
    let (load, init) = match &file.load {
        Some(l) => {
            let id = LoadId::parse(&l.id).map_err(|e| FileError {
                line: None,
                key: "load.id".into(),
                message: e.message,
            })?;
            let mut v = serde_json::json!({"event_id": "load:init", "kind": "load_update"});
            for (k, f) in [
                ("client", &l.client),
                ("driver_phone", &l.driver_phone),
                ("stage", &l.stage),
                ("next_stop", &l.next_stop),
            ] {
                if let Some(x) = f {
                    v[k] = Value::String(x.clone());
                }
            }
            let ev = InboundEvent::from_json(id.clone(), v).map_err(|e| FileError {
                line: None,
                key: "load".into(),
                message: e.message,
            })?;
            (Some(id), Some(ev))
        }
        None => (None, None),
    };
    let mut faults = Vec::new();
    for f in &file.fault {
        let span = f.span();
        let f = f.get_ref();
        let Some(channel) = Channel::from_scenario_name(&f.channel) else {
            let names: Vec<&str> = Channel::ALL.map(Channel::scenario_name).to_vec();
            let (last, rest) = names.split_last().expect("there are channels");
            let message = format!("{:?} is not {} or {last}", f.channel, rest.join(", "));
            return Err(err(span, "fault.channel", message));
        };
        let kind = match f.kind.as_str() {
            "retryable" => FaultKind::Retryable,
            "permanent" => FaultKind::Permanent,
            "rate_limited" => FaultKind::RateLimited,
            "lost_answer" => FaultKind::LostAnswer,
            other => {
                return Err(err(
                    span,
                    "fault.kind",
                    format!("{other:?} is not retryable, permanent, rate_limited or lost_answer"),
                ));
            }
        };
        faults.push(FaultRule { channel: channel.config_name().into(), key: f.key.clone(), kind, times: f.times });
    }
    if file.step.len() > MAX_STEPS {
        return Err(FileError { line: None, key: "step".into(), message: format!("more than {MAX_STEPS} steps") });
    }
    let mut steps = Vec::new();
    let mut last = start;
    for (i, s) in file.step.iter().enumerate() {
        let at = parse_at(s.at.get_ref(), start).map_err(|m| err(s.at.span(), &format!("step[{i}].at"), m))?;
        if at < last {
            return Err(err(s.at.span(), &format!("step[{i}].at"), format!("{:?} goes back in time", s.at.get_ref())));
        }
        last = at;
        let mut inbound = Vec::new();
        for ev in &s.inbound {
            let span = ev.span();
            let key = format!("step[{i}].inbound");
            let mut table = ev.get_ref().clone();
            let repeat = match table.remove("repeat") {
                None => 1,
                Some(toml::Value::Integer(n)) if (1..=i64::from(MAX_REPEAT)).contains(&n) => n as u32,
                Some(_) => {
                    return Err(err(
                        span,
                        &format!("{key}.repeat"),
                        format!("must be an integer from 1 to {MAX_REPEAT}"),
                    ));
                }
            };
            let target = match table.remove("load") {
                None => load.clone().ok_or_else(|| {
                    err(span.clone(), &key, "no load id: add a [load] section or `load = ...`".into())
                })?,
                Some(toml::Value::String(l)) => {
                    LoadId::parse(&l).map_err(|e| err(span.clone(), &format!("{key}.load"), e.message))?
                }
                Some(_) => return Err(err(span, &format!("{key}.load"), "must be a string".into())),
            };
            let mut v = serde_json::to_value(&table).map_err(|e| err(span.clone(), &key, e.to_string()))?;
            if v["kind"] == "location_ping" && v.get("at").is_none() {
                v["at"] = Value::String(at.to_string());
            }
            let event = InboundEvent::from_json(target, v).map_err(|e| err(span, &key, e.message))?;
            inbound.push((event, repeat));
        }
        let unmatched_sms = s
            .unmatched_sms
            .iter()
            .map(|u| {
                let u = u.get_ref();
                UnmatchedStep { message_sid: u.message_sid.clone(), from: u.from.clone(), body: u.body.clone() }
            })
            .collect();
        let mut operator = Vec::new();
        for op in &s.operator {
            let key = format!("step[{i}].operator");
            operator.push(operator_step(op.get_ref(), load.as_ref(), start).map_err(|m| err(op.span(), &key, m))?);
        }
        steps.push(Step {
            at,
            at_text: s.at.get_ref().clone(),
            inbound,
            unmatched_sms,
            operator,
            expect: s.expect.clone(),
        });
    }
    Ok(Scenario { name: file.name, start, clients: file.clients, load, init, faults, steps })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start() -> Timestamp {
        "2026-03-02T07:00:00Z".parse().unwrap()
    }

    #[test]
    fn times() {
        for (s, want) in [
            ("07:31", Some("2026-03-02T07:31:00Z")),
            ("23:59:30", Some("2026-03-02T23:59:30Z")),
            ("+90m", Some("2026-03-02T08:30:00Z")),
            ("+1d2h", Some("2026-03-03T09:00:00Z")),
            ("2026-03-04T10:00:00Z", Some("2026-03-04T10:00:00Z")),
            ("25:00", None),
            ("7:31", None),
            ("+soon", None),
            ("tomorrow", None),
        ] {
            let got = parse_at(s, start()).ok().map(|t| t.to_string());
            assert_eq!(got.as_deref(), want, "{s}");
        }
    }

    fn check(text: &str, want: Result<usize, (&str, Option<usize>)>) {
        match (parse(text), want) {
            (Ok(s), Ok(steps)) => assert_eq!(s.steps.len(), steps),
            (Err(e), Err((key, line))) => {
                assert!(e.key.contains(key), "{e}");
                assert_eq!(e.line, line, "{e}");
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn files() {
        let head = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[load]\nid = \"L1\"\n";
        check(&format!("{head}[[step]]\nat = \"07:00\"\n"), Ok(1));
        check(&format!("{head}[[step]]\nat = \"07:10\"\n[[step]]\nat = \"07:05\"\n"), Err(("step[1].at", Some(8))));
        check(&format!("{head}[[step]]\nat = \"later\"\n"), Err(("step[0].at", Some(6))));
        check(&format!("{head}[[step]]\nat = \"07:00\"\nexpect.sentt = []\n"), Err(("toml", Some(7))));
        check(
            &format!("{head}[[step]]\nat = \"07:00\"\ninbound = [{{ kind = \"teleport\", event_id = \"e\" }}]\n"),
            Err(("inbound", Some(7))),
        );
        check(
            &format!("{head}[[fault]]\nchannel = \"fax\"\nkey = \"*\"\nkind = \"retryable\"\n"),
            Err(("fault.channel", Some(5))),
        );
        check(&format!("{head}[clients.a.eta_request]\nretry_after = \"soon\"\n"), Err(("toml", Some(6))));
        check("name = \"x\"\nstart = \"yesterday\"\n", Err(("start", Some(2))));
        check(
            "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[[step]]\nat = \"07:00\"\ninbound = [{ kind = \"inbound_sms\", event_id = \"s\", from = \"+1\", body = \"x\" }]\n",
            Err(("inbound", Some(5))),
        );
        check("name = \"x\"\nstart = [\n", Err(("toml", Some(2))));
        let op = |fields: &str| {
            format!(
                "{head}[[step]]\nat = \"07:00\"\noperator = [{{ request_id = \"r1\", actor = \"ana\", reason = \"why\", {fields} }}]\n"
            )
        };
        check(&op("action = \"requeue\", outbox_id = \"L1/x/send_sms\""), Ok(1));
        check(&op("action = \"requeue\""), Err(("step[0].operator", Some(7))));
        check(&op("action = \"requeue\", outbox_id = \"k\", ask_id = \"ask:a:b\""), Err(("step[0].operator", Some(7))));
        check(
            &op("action = \"bulk_requeue\", action_type = \"create_hero_task\", since = \"07:00\", dry_run = true"),
            Ok(1),
        );
        check(
            &op("action = \"bulk_requeue\", action_type = \"launch\", since = \"07:00\""),
            Err(("step[0].operator", Some(7))),
        );
        check(&op("action = \"assign_sms\", message_sid = \"SM1\""), Ok(1));
        check(&op("action = \"resolve_ask\", ask_id = \"nope\""), Err(("step[0].operator", Some(7))));
        check(&op("action = \"teleport\""), Err(("step[0].operator", Some(7))));
        check(&op("action = \"requeue\", outbox_id = \"k\", zz = 1"), Err(("toml", Some(7))));
    }
}
