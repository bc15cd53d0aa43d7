//! Scenario files (docs/scenarios.md): parsing and checking them before anything runs.
//!
//! The format is a contract: files written by other teams must run unchanged. Every
//! problem is reported with the file's line and the key, never a panic: TOML syntax,
//! unknown keys, bad times or durations, time going backwards, bad events.

use std::collections::BTreeMap;
use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::{AskId, EventId, LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_core::{Channel, InboundEvent, parse_duration};
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::testkit::{FaultKind, FaultRule};
use haul_config::ClientConfig;

/// A channel's send rate in a scenario: `rate` and `burst` as `channels.*` has them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelSection {
    rate: String,
    #[serde(default)]
    burst: Option<i64>,
}

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
    /// `[channels.NAME]`: a channel's send rate, by its scenario name.
    #[serde(default)]
    channels: BTreeMap<String, ChannelSection>,
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
    /// With `rate_limited`: the 429 says `Retry-After` (whole seconds).
    retry_after: Option<String>,
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
    /// Delivery receipts, as Twilio's status callbacks bring them.
    #[serde(default)]
    sms_status: Vec<Spanned<SmsStatusSection>>,
    #[serde(default)]
    expect: Option<ExpectSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SmsStatusSection {
    key: String,
    status: String,
    error_code: Option<String>,
    message_sid: Option<String>,
}

/// A delivery receipt for the SMS of outbox row `key`, as the status webhook takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmsStatusStep {
    pub key: String,
    pub status: String,
    pub error_code: Option<String>,
    /// Unset: the row's receipt, as far as it is of a MessageSid's form.
    pub message_sid: Option<String>,
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
    ReassignSms { message_sid: String, load: LoadId },
    ResolveAsk { load: LoadId, ask_id: haul_core::ids::AskId },
    Dismiss { outbox_id: String },
    DismissSms { message_sid: String },
}

/// One operator action of a step, made `repeat` times (a retried request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorStep {
    pub who: haul_runtime::operator::Requester,
    pub ask: OperatorAsk,
    pub repeat: u32,
}

/// The `expect` keys as written, each entry with where it is, checked by [`parse`]
/// into an [`Expect`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectSection {
    sent: Option<Vec<Spanned<SentExpect>>>,
    timers_scheduled: Option<Vec<Spanned<TimerSection>>>,
    timers_canceled: Option<Vec<Spanned<String>>>,
    asks: Option<Vec<Spanned<AskSection>>>,
    /// A list of ask ids (the `[load]`'s), or `{ load, ids }` tables.
    open_asks: Option<Spanned<toml::Value>>,
    /// A stage (the `[load]`'s), or `{ load, stage }` tables.
    stage: Option<Spanned<toml::Value>>,
    decisions: Option<Vec<Spanned<DecisionExpect>>>,
    dead: Option<Vec<Spanned<String>>>,
    ops_alerts: Option<Vec<Spanned<String>>>,
    llm_calls: Option<usize>,
    opted_out: Option<Vec<Spanned<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerSection {
    id: String,
    fire_at: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AskSection {
    id: String,
    status: String,
    step: Option<u32>,
    load: Option<String>,
}

/// `expect.open_asks = [{ load = "L2", ids = [...] }]`: another load's open asks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenAsksSection {
    load: Option<String>,
    ids: Vec<String>,
}

/// `expect.stage = [{ load = "L2", stage = "delivered" }]`: another load's stage.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StageSection {
    load: Option<String>,
    stage: String,
}

/// The `expect` keys; each present one is checked. Every value was checked when the
/// file was parsed (channels, statuses, urgencies, ids, deciders, action types, times),
/// so a misspelt one fails there, with its line, instead of never matching.
#[derive(Clone, Debug, Default)]
pub struct Expect {
    pub sent: Option<Vec<SentExpect>>,
    pub timers_scheduled: Option<Vec<TimerExpect>>,
    pub timers_canceled: Option<Vec<String>>,
    pub asks: Option<Vec<AskExpect>>,
    pub open_asks: Option<Vec<OpenAsksExpect>>,
    pub stage: Option<Vec<StageExpect>>,
    pub decisions: Option<Vec<DecisionExpect>>,
    pub dead: Option<Vec<String>>,
    pub ops_alerts: Option<Vec<String>>,
    /// Extension: the model calls made since the previous check (0 with the SOP).
    pub llm_calls: Option<usize>,
    /// Extension: exactly the phones the consent ledger holds opted out of SMS now.
    pub opted_out: Option<Vec<String>>,
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

#[derive(Clone, Debug)]
pub struct TimerExpect {
    pub id: String,
    pub fire_at: Timestamp,
}

#[derive(Clone, Debug)]
pub struct AskExpect {
    /// The `[load]`, or the entry's `load`.
    pub load: LoadId,
    pub id: String,
    pub status: String,
    pub step: Option<u32>,
}

#[derive(Clone, Debug)]
pub struct OpenAsksExpect {
    pub load: LoadId,
    pub ids: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct StageExpect {
    pub load: LoadId,
    pub stage: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionExpect {
    pub event_id: String,
    pub decider: Option<String>,
    pub filtered: Option<bool>,
    pub actions: Option<Vec<String>>,
    /// The dead rows it took out of the inbox: `{ outbox_id, state }` (order ignored).
    pub inbox: Option<Vec<InboxExpect>>,
    /// The LLM budget it found spent (`load` or `client_day`), or `none`: the SOP
    /// decided in the model's place.
    pub budget: Option<String>,
}

/// A dead row a decision took out of the inbox, and how (`handled` or `dismissed`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(deny_unknown_fields)]
pub struct InboxExpect {
    pub outbox_id: String,
    pub state: String,
}

/// A checked scenario, ready to run.
#[derive(Debug)]
pub struct Scenario {
    pub name: String,
    pub start: Timestamp,
    pub clients: BTreeMap<String, ClientConfig>,
    /// The channels' send limits (`[channels.NAME]`), as the settings have them.
    pub channels: haul_config::ChannelsConfig,
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
    pub sms_status: Vec<SmsStatusStep>,
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
/// A delivery receipt, checked as the status webhook checks its form.
fn sms_status_step(st: &SmsStatusSection) -> Result<SmsStatusStep, String> {
    if st.key.is_empty() {
        return Err("key is empty: it names the SMS's outbox row".into());
    }
    let sid = st.message_sid.as_deref().unwrap_or("SM0");
    haul_core::receipt::DeliveryReport::new(Some(sid), Some(&st.status), st.error_code.as_deref())?;
    Ok(SmsStatusStep {
        key: st.key.clone(),
        status: st.status.clone(),
        error_code: st.error_code.clone(),
        message_sid: st.message_sid.clone(),
    })
}

fn operator_step(op: &OperatorSection, load: Option<&LoadId>, start: Timestamp) -> Result<OperatorStep, String> {
    let who = haul_runtime::operator::Requester {
        request_id: op.request_id.clone(),
        actor: op.actor.clone(),
        reason: op.reason.clone(),
        trace: None,
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
        "reassign_sms" => (&["message_sid", "load"], &["message_sid", "load"]),
        "resolve_ask" => (&["ask_id", "load"], &["ask_id"]),
        "dismiss" => (&["outbox_id"], &["outbox_id"]),
        "dismiss_sms" => (&["message_sid"], &["message_sid"]),
        other => {
            return Err(format!(
                "action {other:?} is not requeue, bulk_requeue, assign_sms, reassign_sms, resolve_ask, dismiss or \
                 dismiss_sms"
            ));
        }
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
        "reassign_sms" => {
            OperatorAsk::ReassignSms { message_sid: op.message_sid.clone().unwrap_or_default(), load: load()? }
        }
        "resolve_ask" => {
            let ask_id = op.ask_id.as_deref().unwrap_or_default();
            let ask_id = haul_core::ids::AskId::parse(ask_id).map_err(|e| e.message)?;
            OperatorAsk::ResolveAsk { load: load()?, ask_id }
        }
        "dismiss" => OperatorAsk::Dismiss { outbox_id: op.outbox_id.clone().unwrap_or_default() },
        "dismiss_sms" => OperatorAsk::DismissSms { message_sid: op.message_sid.clone().unwrap_or_default() },
        // The list above names every action this match makes; one named there but not
        // here is told so rather than taken for another.
        other => return Err(format!("action {other:?} has no step of its own yet")),
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
        let most = i64::from(haul_core::limit::MAX_WEIGHT);
        if c.send_weight.is_some_and(|w| !(1..=most).contains(&w)) {
            return Err(FileError {
                line: None,
                key: format!("clients.{name}.send_weight"),
                message: format!("must be 1 to {most}"),
            });
        }
    }
    let mut channels = haul_config::ChannelsConfig::default();
    for (name, c) in &file.channels {
        let key = format!("channels.{name}");
        let channel = Channel::ALL.into_iter().find(|ch| ch.scenario_name() == name).ok_or_else(|| {
            let all: Vec<&str> = Channel::ALL.iter().map(|c| c.scenario_name()).collect();
            FileError { line: None, key: key.clone(), message: format!("is not a channel: {}", all.join(", ")) }
        })?;
        let setting = channels.get_mut(channel);
        setting.rate = Some(c.rate.clone());
        setting.burst = c.burst;
        if let Err(e) = setting.limit(name) {
            return Err(FileError { line: None, key, message: e.to_string() });
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
            "rate_limited" => match &f.retry_after {
                None => FaultKind::RateLimited,
                Some(d) => match parse_duration(d) {
                    Ok(d) if d.subsec_nanos() == 0 => FaultKind::Throttled(d),
                    _ => {
                        let message = format!("{d:?} is not a whole number of seconds (\"5s\", \"2m\")");
                        return Err(err(span, "fault.retry_after", message));
                    }
                },
            },
            "lost_answer" => FaultKind::LostAnswer,
            other => {
                return Err(err(
                    span,
                    "fault.kind",
                    format!("{other:?} is not retryable, permanent, rate_limited or lost_answer"),
                ));
            }
        };
        if f.retry_after.is_some() && !matches!(kind, FaultKind::Throttled(_)) {
            let message = format!("retry_after goes with kind = \"rate_limited\", not {:?}", f.kind);
            return Err(err(span, "fault.retry_after", message));
        }
        faults.push(FaultRule { channel: channel.config_name().into(), key: f.key.clone(), kind, times: f.times });
    }
    if file.step.len() > MAX_STEPS {
        return Err(FileError { line: None, key: "step".into(), message: format!("more than {MAX_STEPS} steps") });
    }
    if file.step.is_empty() {
        return Err(FileError {
            line: None,
            key: "step".into(),
            message: "no [[step]]: a scenario with no steps tests nothing".into(),
        });
    }
    if file.step.iter().all(|s| s.expect.is_none()) {
        return Err(FileError {
            line: None,
            key: "expect".into(),
            message: "no step has an `expect`: a scenario that expects nothing tests only the invariants; add one"
                .into(),
        });
    }
    let mut steps = Vec::new();
    let mut last = start;
    for (i, s) in file.step.iter().enumerate() {
        // Counted from 1, as a person counts the `[[step]]` blocks.
        let n = i + 1;
        let at = parse_at(s.at.get_ref(), start).map_err(|m| err(s.at.span(), &format!("step {n}.at"), m))?;
        if at < last {
            return Err(err(s.at.span(), &format!("step {n}.at"), format!("{:?} goes back in time", s.at.get_ref())));
        }
        last = at;
        let inbound = s
            .inbound
            .iter()
            .map(|ev| inbound_event(ev, &format!("step {n}.inbound"), at, load.as_ref(), &err))
            .collect::<Result<Vec<_>, _>>()?;
        let expect = match &s.expect {
            Some(e) => Some(check_expect(e, &Ctx { text, start, load: load.as_ref(), step: n })?),
            None => None,
        };
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
            let key = format!("step {n}.operator");
            operator.push(operator_step(op.get_ref(), load.as_ref(), start).map_err(|m| err(op.span(), &key, m))?);
        }
        let mut sms_status = Vec::new();
        for st in &s.sms_status {
            let key = format!("step {n}.sms_status");
            sms_status.push(sms_status_step(st.get_ref()).map_err(|m| err(st.span(), &key, m))?);
        }
        let at_text = s.at.get_ref().clone();
        steps.push(Step { at, at_text, inbound, unmatched_sms, operator, sms_status, expect });
    }
    Ok(Scenario { name: file.name, start, clients: file.clients, channels, load, init, faults, steps })
}

/// One inline table of a step's `inbound`, as the event it publishes and how often.
fn inbound_event(
    ev: &Spanned<toml::Table>,
    key: &str,
    at: Timestamp,
    load: Option<&LoadId>,
    err: &dyn Fn(std::ops::Range<usize>, &str, String) -> FileError,
) -> Result<(InboundEvent, u32), FileError> {
    let span = ev.span();
    let mut table = ev.get_ref().clone();
    let repeat = match table.remove("repeat") {
        None => 1,
        Some(toml::Value::Integer(n)) if (1..=i64::from(MAX_REPEAT)).contains(&n) => n as u32,
        Some(_) => {
            return Err(err(span, &format!("{key}.repeat"), format!("must be an integer from 1 to {MAX_REPEAT}")));
        }
    };
    let target = match table.remove("load") {
        None => load
            .cloned()
            .ok_or_else(|| err(span.clone(), key, "no load id: add a [load] section or `load = ...`".into()))?,
        Some(toml::Value::String(l)) => {
            LoadId::parse(&l).map_err(|e| err(span.clone(), &format!("{key}.load"), e.message))?
        }
        Some(_) => return Err(err(span, &format!("{key}.load"), "must be a string".into())),
    };
    let mut v = serde_json::to_value(&table).map_err(|e| err(span.clone(), key, e.to_string()))?;
    if v["kind"] == "location_ping" && v.get("at").is_none() {
        v["at"] = Value::String(at.to_string());
    }
    // haul's own kinds carry haul's derived ids (`evt:…`); the kinds an outside
    // source sends take the ids the API takes and the webhook's `sms:` ids, the other
    // reserved prefixes refused.
    let own = matches!(v["kind"].as_str(), Some("timer_fired" | "action_outcome" | "operator_action"));
    let event = if own { InboundEvent::from_json(target, v) } else { InboundEvent::from_scenario(target, v) }
        .map_err(|e| err(span, key, e.message))?;
    Ok((event, repeat))
}

/// What checking one step's `expect` needs to know.
struct Ctx<'a> {
    text: &'a str,
    start: Timestamp,
    load: Option<&'a LoadId>,
    /// The step's number, from 1.
    step: usize,
}

impl Ctx<'_> {
    fn err(&self, span: std::ops::Range<usize>, key: &str, message: String) -> FileError {
        FileError {
            line: Some(line_of(self.text, span.start)),
            key: format!("step {}.expect.{key}", self.step),
            message,
        }
    }

    /// The entry's `load`, or the `[load]`.
    fn load(&self, span: &std::ops::Range<usize>, key: &str, named: Option<&str>) -> Result<LoadId, FileError> {
        match named {
            Some(l) => LoadId::parse(l).map_err(|e| self.err(span.clone(), key, e.message)),
            None => self.load.cloned().ok_or_else(|| {
                self.err(span.clone(), key, "which load? add a [load] section or `load = \"…\"`".into())
            }),
        }
    }
}

/// One of `choices`, or an error listing them.
fn one_of(value: &str, what: &str, choices: &[&str]) -> Result<(), String> {
    if choices.contains(&value) {
        return Ok(());
    }
    let (last, rest) = choices.split_last().expect("there are choices");
    Err(format!("{value:?} is not a {what}: {} or {last}", rest.join(", ")))
}

/// An action key (idempotency key) names its load first: `{load}/…`.
fn action_key(key: &str) -> Result<(), String> {
    match key.split_once('/') {
        Some((l, rest)) if LoadId::parse(l).is_ok() && !rest.is_empty() => Ok(()),
        _ => {
            Err(format!("{key:?} is not an action key ({{load}}/…, e.g. 481207/ask:eta_request:ping_0700/1/send_sms)"))
        }
    }
}

const ASK_STATUSES: [&str; 4] = ["open", "answered", "escalated", "closed"];

fn check_expect(e: &ExpectSection, cx: &Ctx<'_>) -> Result<Expect, FileError> {
    let mut out = Expect { llm_calls: e.llm_calls, ..Expect::default() };
    out.sent = e.sent.as_deref().map(|l| sent_of(l, cx)).transpose()?;
    out.timers_scheduled = e.timers_scheduled.as_deref().map(|l| timers_of(l, cx)).transpose()?;
    out.asks = e.asks.as_deref().map(|l| asks_of(l, cx)).transpose()?;
    out.open_asks = e.open_asks.as_ref().map(|v| open_asks_of(v, cx)).transpose()?;
    out.stage = e.stage.as_ref().map(|v| stage_of(v, cx)).transpose()?;
    out.decisions = e.decisions.as_deref().map(|l| decisions_of(l, cx)).transpose()?;
    if let Some(list) = &e.opted_out {
        for p in list {
            haul_core::event::validate_phone("opted_out", p.get_ref())
                .map_err(|e| cx.err(p.span(), "opted_out", e.message))?;
        }
        out.opted_out = Some(list.iter().map(|p| p.get_ref().clone()).collect());
    }
    for (key, list, slot) in [
        ("timers_canceled", &e.timers_canceled, &mut out.timers_canceled),
        ("dead", &e.dead, &mut out.dead),
        ("ops_alerts", &e.ops_alerts, &mut out.ops_alerts),
    ] {
        if let Some(list) = list {
            for k in list {
                let ok = if key == "timers_canceled" {
                    TimerId::parse(k.get_ref()).map(|_| ()).map_err(|e| e.message)
                } else {
                    action_key(k.get_ref())
                };
                ok.map_err(|m| cx.err(k.span(), key, m))?;
            }
            *slot = Some(list.iter().map(|k| k.get_ref().clone()).collect());
        }
    }
    Ok(out)
}

fn sent_of(list: &[Spanned<SentExpect>], cx: &Ctx<'_>) -> Result<Vec<SentExpect>, FileError> {
    // The channels actions go out on (OpsAlerts have `ops_alerts`).
    let names: Vec<&str> =
        Channel::ALL.into_iter().filter(|c| c.carries_actions()).map(Channel::scenario_name).collect();
    let mut sent = Vec::new();
    for w in list {
        let (span, w) = (w.span(), w.get_ref());
        let bad = |m: String| cx.err(span.clone(), "sent", m);
        if w.channel == Channel::Ops.scenario_name() {
            return Err(bad("OpsAlerts are checked with expect.ops_alerts, not sent".into()));
        }
        one_of(&w.channel, "channel", &names).map_err(bad)?;
        action_key(&w.key).map_err(bad)?;
        if let Some(u) = &w.urgency {
            one_of(u, "urgency", &["normal", "urgent"]).map_err(bad)?;
        }
        if let Some(to) = &w.to
            && w.channel == Channel::Sms.scenario_name()
        {
            haul_core::event::validate_phone("to", to).map_err(|e| bad(e.message))?;
        }
        sent.push(w.clone());
    }
    Ok(sent)
}

fn timers_of(list: &[Spanned<TimerSection>], cx: &Ctx<'_>) -> Result<Vec<TimerExpect>, FileError> {
    let mut timers = Vec::new();
    for t in list {
        let (span, t) = (t.span(), t.get_ref());
        let bad = |m: String| cx.err(span.clone(), "timers_scheduled", m);
        TimerId::parse(&t.id).map_err(|e| bad(e.message))?;
        let fire_at = parse_at(&t.fire_at, cx.start).map_err(bad)?;
        timers.push(TimerExpect { id: t.id.clone(), fire_at });
    }
    Ok(timers)
}

fn asks_of(list: &[Spanned<AskSection>], cx: &Ctx<'_>) -> Result<Vec<AskExpect>, FileError> {
    let mut asks = Vec::new();
    for a in list {
        let (span, a) = (a.span(), a.get_ref());
        let bad = |m: String| cx.err(span.clone(), "asks", m);
        AskId::parse(&a.id).map_err(|e| bad(e.message))?;
        one_of(&a.status, "status", &ASK_STATUSES).map_err(bad)?;
        if a.step == Some(0) {
            return Err(bad("steps of an ask count from 1".into()));
        }
        let load = cx.load(&span, "asks", a.load.as_deref())?;
        asks.push(AskExpect { load, id: a.id.clone(), status: a.status.clone(), step: a.step });
    }
    Ok(asks)
}

fn open_asks_of(v: &Spanned<toml::Value>, cx: &Ctx<'_>) -> Result<Vec<OpenAsksExpect>, FileError> {
    let span = v.span();
    let bad = |m: String| cx.err(span.clone(), "open_asks", m);
    let shape = "a list of ask ids (the [load]'s), or a list of { load, ids } tables";
    let toml::Value::Array(items) = v.get_ref() else { return Err(bad(format!("must be {shape}"))) };
    let sections: Vec<OpenAsksSection> = if items.iter().all(toml::Value::is_str) {
        vec![OpenAsksSection { load: None, ids: items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect() }]
    } else if items.iter().all(toml::Value::is_table) {
        items
            .iter()
            .map(|i| i.clone().try_into().map_err(|e: toml::de::Error| bad(e.message().to_owned())))
            .collect::<Result<_, _>>()?
    } else {
        return Err(bad(format!("must be {shape}")));
    };
    let mut open = Vec::new();
    for s in sections {
        for id in &s.ids {
            AskId::parse(id).map_err(|e| bad(e.message))?;
        }
        open.push(OpenAsksExpect { load: cx.load(&span, "open_asks", s.load.as_deref())?, ids: s.ids });
    }
    Ok(open)
}

fn stage_of(v: &Spanned<toml::Value>, cx: &Ctx<'_>) -> Result<Vec<StageExpect>, FileError> {
    let span = v.span();
    let bad = |m: String| cx.err(span.clone(), "stage", m);
    let shape = "a stage (the [load]'s), or a list of { load, stage } tables";
    let sections: Vec<StageSection> = match v.get_ref() {
        toml::Value::String(s) => vec![StageSection { load: None, stage: s.clone() }],
        toml::Value::Array(items) if !items.is_empty() && items.iter().all(toml::Value::is_table) => items
            .iter()
            .map(|i| i.clone().try_into().map_err(|e: toml::de::Error| bad(e.message().to_owned())))
            .collect::<Result<_, _>>()?,
        _ => return Err(bad(format!("must be {shape}"))),
    };
    let mut stages = Vec::new();
    for s in sections {
        haul_core::event::validate_stage(&s.stage).map_err(|e| bad(e.message))?;
        stages.push(StageExpect { load: cx.load(&span, "stage", s.load.as_deref())?, stage: s.stage });
    }
    Ok(stages)
}

fn decisions_of(list: &[Spanned<DecisionExpect>], cx: &Ctx<'_>) -> Result<Vec<DecisionExpect>, FileError> {
    let types: Vec<&str> = ActionType::ALL.map(ActionType::as_str).to_vec();
    let mut decisions = Vec::new();
    for d in list {
        let (span, d) = (d.span(), d.get_ref());
        let bad = |m: String| cx.err(span.clone(), "decisions", m);
        EventId::parse(&d.event_id).map_err(|e| bad(e.message))?;
        if let Some(decider) = &d.decider
            && decider.strip_prefix("llm:").is_none_or(str::is_empty)
        {
            one_of(decider, "decider", &["sop", "filter", "operator", "consent", "fallback", "llm:MODEL"])
                .map_err(bad)?;
        }
        for t in d.actions.iter().flatten() {
            one_of(t, "action type", &types).map_err(bad)?;
        }
        for c in d.inbox.iter().flatten() {
            one_of(&c.state, "inbox state", &["handled", "dismissed"]).map_err(bad)?;
        }
        decisions.push(d.clone());
    }
    Ok(decisions)
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
        let ok = "expect.sent = []\n";
        check(&format!("{head}[[step]]\nat = \"07:00\"\n{ok}"), Ok(1));
        check(&format!("{head}[[step]]\nat = \"07:10\"\n[[step]]\nat = \"07:05\"\n{ok}"), Err(("step 2.at", Some(8))));
        check(&format!("{head}[[step]]\nat = \"later\"\n{ok}"), Err(("step 1.at", Some(6))));
        check(&format!("{head}[[step]]\nat = \"07:00\"\nexpect.sentt = []\n"), Err(("toml", Some(7))));
        check(
            &format!("{head}[[step]]\nat = \"07:00\"\ninbound = [{{ kind = \"teleport\", event_id = \"e\" }}]\n{ok}"),
            Err(("step 1.inbound", Some(7))),
        );
        check(
            &format!("{head}[[fault]]\nchannel = \"fax\"\nkey = \"*\"\nkind = \"retryable\"\n"),
            Err(("fault.channel", Some(5))),
        );
        check(&format!("{head}[clients.a.eta_request]\nretry_after = \"soon\"\n"), Err(("toml", Some(6))));
        check(&format!("{head}[clients.a]\nsend_weight = 0\n"), Err(("clients.a.send_weight", None)));
        check(&format!("{head}[clients.a]\nsend_weight = 2\n[[step]]\nat = \"07:00\"\n{ok}"), Ok(1));
        check("name = \"x\"\nstart = \"yesterday\"\n", Err(("start", Some(2))));
        check(
            "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[[step]]\nat = \"07:00\"\ninbound = [{ kind = \"inbound_sms\", event_id = \"s\", from = \"+1\", body = \"x\" }]\nexpect.sent = []\n",
            Err(("inbound", Some(5))),
        );
        check("name = \"x\"\nstart = [\n", Err(("toml", Some(2))));
        let op = |fields: &str| {
            format!(
                "{head}[[step]]\nat = \"07:00\"\noperator = [{{ request_id = \"r1\", actor = \"ana\", reason = \"why\", {fields} }}]\nexpect.sent = []\n"
            )
        };
        check(&op("action = \"requeue\", outbox_id = \"L1/x/send_sms\""), Ok(1));
        check(&op("action = \"dismiss\", outbox_id = \"L1/x/send_sms\""), Ok(1));
        check(&op("action = \"dismiss\", message_sid = \"SM1\""), Err(("step 1.operator", Some(7))));
        check(&op("action = \"dismiss_sms\", message_sid = \"SM1\""), Ok(1));
        check(&op("action = \"dismiss_sms\", message_sid = \"SM1\", load = \"L1\""), Err(("step 1.operator", Some(7))));
        check(&op("action = \"requeue\""), Err(("step 1.operator", Some(7))));
        check(&op("action = \"requeue\", outbox_id = \"k\", ask_id = \"ask:a:b\""), Err(("step 1.operator", Some(7))));
        check(
            &op("action = \"bulk_requeue\", action_type = \"create_hero_task\", since = \"07:00\", dry_run = true"),
            Ok(1),
        );
        check(
            &op("action = \"bulk_requeue\", action_type = \"launch\", since = \"07:00\""),
            Err(("step 1.operator", Some(7))),
        );
        check(&op("action = \"assign_sms\", message_sid = \"SM1\""), Ok(1));
        check(&op("action = \"resolve_ask\", ask_id = \"nope\""), Err(("step 1.operator", Some(7))));
        check(&op("action = \"teleport\""), Err(("step 1.operator", Some(7))));
        check(&op("action = \"requeue\", outbox_id = \"k\", zz = 1"), Err(("toml", Some(7))));
    }

    /// A scenario that cannot fail is refused: no steps, or no step expects anything.
    #[test]
    fn a_scenario_that_tests_nothing_is_refused() {
        let head = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[load]\nid = \"L1\"\n";
        check(head, Err(("step", None)));
        check(&format!("{head}[[step]]\nat = \"07:00\"\n[[step]]\nat = \"07:10\"\n"), Err(("expect", None)));
        check(&format!("{head}[[step]]\nat = \"07:00\"\n[[step]]\nat = \"07:10\"\nexpect.stage = \"x\"\n"), Ok(2));
    }

    /// Values inside `expect` are checked when the file is read, with the step (counted
    /// from 1) and the line: a misspelt channel, status or urgency would otherwise
    /// never match and fail (or pass) for the wrong reason.
    #[test]
    fn expect_values_are_checked_at_parse_time() {
        let head = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[load]\nid = \"L1\"\n[[step]]\nat = \"07:00\"\n";
        let at7 = |expect: &str| format!("{head}{expect}\n");
        let no = |key: &'static str| Err((key, Some(7)));
        for (expect, want) in [
            ("expect.sent = [{ channel = \"hero_task\", key = \"L1/e/create_hero_task\" }]", Ok(1)),
            ("expect.sent = [{ channel = \"hero\", key = \"L1/e/create_hero_task\" }]", no("step 1.expect.sent")),
            ("expect.sent = [{ channel = \"ops\", key = \"L1/e/create_hero_task\" }]", no("step 1.expect.sent")),
            (
                "expect.sent = [{ channel = \"sms\", key = \"L1/e/send_sms\", urgency = \"high\" }]",
                no("step 1.expect.sent"),
            ),
            ("expect.sent = [{ channel = \"sms\", key = \"send_sms\" }]", no("step 1.expect.sent")),
            (
                "expect.sent = [{ channel = \"sms\", key = \"L1/e/send_sms\", to = \"555-0100\" }]",
                no("step 1.expect.sent"),
            ),
            ("expect.asks = [{ id = \"ask:eta_request:p\", status = \"answerd\" }]", no("step 1.expect.asks")),
            ("expect.asks = [{ id = \"eta_request:p\", status = \"open\" }]", no("step 1.expect.asks")),
            ("expect.asks = [{ id = \"ask:eta_request:p\", status = \"open\", load = \"L2\" }]", Ok(1)),
            ("expect.open_asks = [\"ask:eta_request:p\"]", Ok(1)),
            ("expect.open_asks = [{ load = \"L2\", ids = [\"ask:eta_request:p\"] }]", Ok(1)),
            ("expect.open_asks = [{ load = \"L2\", idz = [] }]", no("step 1.expect.open_asks")),
            ("expect.open_asks = [\"ask:eta_request:p\", { load = \"L2\", ids = [] }]", no("step 1.expect.open_asks")),
            ("expect.open_asks = [\"p\"]", no("step 1.expect.open_asks")),
            ("expect.stage = \"delivered\"", Ok(1)),
            ("expect.stage = [{ load = \"L2\", stage = \"delivered\" }]", Ok(1)),
            ("expect.stage = \"Delivered\"", no("step 1.expect.stage")),
            ("expect.stage = 3", no("step 1.expect.stage")),
            ("expect.timers_scheduled = [{ id = \"tmr:L1:ask:eta_request:p:1\", fire_at = \"07:30\" }]", Ok(1)),
            (
                "expect.timers_scheduled = [{ id = \"tmr:L1:ask:eta_request:p:1\", fire_at = \"7:30\" }]",
                no("step 1.expect.timers_scheduled"),
            ),
            ("expect.timers_canceled = [\"timer_1\"]", no("step 1.expect.timers_canceled")),
            ("expect.decisions = [{ event_id = \"p\", decider = \"llm:gpt\", actions = [\"send_sms\"] }]", Ok(1)),
            ("expect.decisions = [{ event_id = \"p\", decider = \"sopp\" }]", no("step 1.expect.decisions")),
            ("expect.decisions = [{ event_id = \"p\", actions = [\"sms\"] }]", no("step 1.expect.decisions")),
            (
                "expect.decisions = [{ event_id = \"p\", inbox = [{ outbox_id = \"L1/x/y\", state = \"dismissed\" }] }]",
                Ok(1),
            ),
            (
                "expect.decisions = [{ event_id = \"p\", inbox = [{ outbox_id = \"L1/x/y\", state = \"open\" }] }]",
                no("step 1.expect.decisions"),
            ),
            ("expect.decisions = [{ event_id = \"p\", inbox = [{ outbox_id = \"L1/x/y\" }] }]", no("toml")),
            ("expect.dead = [\"L1/p/send_sms\"]", Ok(1)),
            ("expect.ops_alerts = [\"alert\"]", no("step 1.expect.ops_alerts")),
            ("expect.opted_out = [\"+15555550100\"]", Ok(1)),
            ("expect.opted_out = []", Ok(1)),
            ("expect.opted_out = [\"driver\"]", no("step 1.expect.opted_out")),
        ] {
            check(&at7(expect), want);
        }
        // Without a [load], the state keys must name one.
        let bare = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[[step]]\nat = \"07:00\"\n";
        check(&format!("{bare}expect.stage = \"delivered\"\n"), Err(("step 1.expect.stage", Some(5))));
        check(&format!("{bare}expect.stage = [{{ load = \"L2\", stage = \"delivered\" }}]\n"), Ok(1));
        check(
            &format!("{bare}expect.asks = [{{ id = \"ask:eta_request:p\", status = \"open\" }}]\n"),
            Err(("asks", Some(5))),
        );
    }

    /// The kinds an outside source sends take the event ids the API takes and the
    /// webhook's own `sms:` ids (a scenario plays an SMS as the webhook routed it);
    /// haul's other reserved prefixes are refused; haul's own kinds keep their derived ids.
    #[test]
    fn reserved_event_ids_are_refused_as_the_api_refuses_them_but_sms_ids_play_the_webhook() {
        let head = "name = \"x\"\nstart = \"2026-03-02T07:00:00Z\"\n[load]\nid = \"L1\"\n[[step]]\nat = \"07:00\"\nexpect.sent = []\n";
        for (event, want) in [
            ("{ kind = \"inbound_sms\", event_id = \"s1\", from = \"+15555550100\", body = \"x\" }", Ok(1)),
            ("{ kind = \"inbound_sms\", event_id = \"sms:SM1\", from = \"+15555550100\", body = \"x\" }", Ok(1)),
            ("{ kind = \"inbound_sms\", event_id = \"sms:older_form.1\", from = \"+1555\", body = \"x\" }", Ok(1)),
            (
                "{ kind = \"inbound_sms\", event_id = \"op:r1\", from = \"+15555550100\", body = \"x\" }",
                Err(("step 1.inbound", Some(8))),
            ),
            (
                "{ kind = \"location_ping\", event_id = \"evt:p\", risk = \"high\", lat = 1.0, lon = 2.0 }",
                Err(("step 1.inbound", Some(8))),
            ),
            ("{ kind = \"load_update\", event_id = \"dec:u\", stage = \"x\" }", Err(("step 1.inbound", Some(8)))),
            (
                "{ kind = \"timer_fired\", event_id = \"evt:tmr:L1:ask:eta_request:p:1\", timer_id = \"tmr:L1:ask:eta_request:p:1\", ask_id = \"ask:eta_request:p\", step = 1, fire_at = \"2026-03-02T07:00:00Z\" }",
                Ok(1),
            ),
        ] {
            check(&format!("{head}inbound = [{event}]\n"), want);
        }
        let e = parse(&format!("{head}inbound = [{{ kind = \"location_ping\", event_id = \"dec:p\", risk = \"high\", lat = 1.0, lon = 2.0 }}]\n")).unwrap_err();
        assert!(e.message.contains("reserved"), "{e}");
    }
}
