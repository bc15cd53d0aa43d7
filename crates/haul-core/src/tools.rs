//! The LLM decider's pure half: the prompt, the tools offered to the model, and the
//! translation of the model's tool calls into a [`Decision`].
//!
//! It exists so that everything an LLM decision *means* is decided here, without IO:
//! the runtime's client (`haul::llm`) only moves bytes. A model speaks in actions only,
//! one tool per action type plus `no_action`; it never writes an action key, a timer id
//! or a phone number. Keys are derived from `ask_id`/`step` (or the event), timers from
//! the ask and step, the SMS recipient is always the driver, and the ask changes that
//! the projection folds are derived from the actions ([`derive_ask_changes`]), so a
//! decision of the model keeps the log's ask state exactly as a SOP decision would.
//! The result is checked by the same [`validate_decision`] as every decision.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::action::{Action, ActionKind, ActionType, Urgency};
use crate::decision::{AskChange, AskStatus, Decision};
use crate::event::{EventBody, InboundEvent};
use crate::ids::{AskId, LoadId, TimerId, ask_action_key, event_action_key};
use crate::mask::mask_phone;
use crate::projection::LoadState;
use crate::sop::EtaPolicy;
use crate::time::{Timestamp, format_duration};
use crate::validate::validate_decision;

/// Names the system prompt and the tool set below; recorded in every LLM decision
/// (`decision_recorded.prompt_version`). Change it whenever either changes.
pub const PROMPT_VERSION: &str = "haul-sop-tools/2";

/// Most tool calls one answer may carry (as many as a decision may have actions).
pub const MAX_TOOL_CALLS: usize = crate::validate::MAX_ACTIONS;

/// Longest rationale kept from the model's text, in characters.
pub const MAX_RATIONALE_CHARS: usize = 1000;

/// Largest `arguments` string of one tool call, in bytes.
pub const MAX_ARGUMENT_BYTES: usize = 16 * 1024;

/// The last action outcomes the prompt shows (the log keeps them all).
pub const PROMPT_OUTCOMES: usize = 20;

/// The tool a model calls to decide that nothing is to be done.
pub const NO_ACTION: &str = "no_action";

/// The system message: docs/design.md's SOP, said to a model that can only call tools.
pub const SYSTEM_PROMPT: &str = "\
You are the dispatch agent of haul for one freight load. You receive the load's state, \
the client's ETA policy, one new event and the current time `now` as JSON. Decide what \
to do about that one event by calling tools; call `no_action` (alone) when nothing is to \
be done. You never see whole phone numbers; an SMS can only go to the driver (`to` = \"driver\").

Asks: an ETA request is an ask with id `ask:eta_request:{id of the event that opened it}` \
and a step (the attempt number). Pass `ask_id` and `step` to every tool call that belongs to \
an ask step; leave both out for anything else. Timers are named by their ask and step.

The standard operating procedure (SOP):
1. location_ping with risk at or above the policy's trigger_risk, load not delivered, no \
eta_request ask open: open ask `ask:eta_request:{event id}` at step 1: send_sms to the \
driver asking for the ETA, and set_timer for step 1 at now + retry_after. With no driver \
phone: create_hero_task (urgent, no ask) so a person calls.
2. timer_fired for the open ask's current step, step below max_attempts: take step + 1: \
send_sms again and set_timer for the new step.
3. timer_fired for the current step, step equal to max_attempts: escalate: \
create_hero_task (urgent) with the ask and step + 1: the driver has not answered, call them.
4. inbound_sms from the driver (from_driver = true) while an ask is open: the ask is \
answered: cancel_timer for its current step. If the text reports trouble (breakdown, \
accident, flat tire, stuck, delay, late, cannot make it, ...: whole words or phrases, in \
any case, never inside another word, so \"plate\", \"translate\" or \"chocolate\" is not \
\"late\") also create_hero_task (urgent, no ask) carrying the text.
5. inbound_sms with no ask open, or not from the driver: create_hero_task (normal, no \
ask) carrying the text.
6. action_outcome failed for send_sms: create_hero_task (urgent, no ask): the SMS to the \
driver failed, call them.
7. load_update to stage delivered: cancel_timer for the current step of every open ask.
8. Anything else: no_action.
Keep SMS short and polite; give a short reason for the decision as your message text.";

fn ask_params(required: bool) -> (Value, Value) {
    let ask = json!({"type": "string", "description": if required {
        "The ask this belongs to, e.g. ask:eta_request:ping_0700"
    } else {
        "The ask this belongs to (leave out when it belongs to no ask step)"
    }});
    let step = json!({"type": "integer", "minimum": 1, "description": "The ask's step (attempt number)"});
    (ask, step)
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": false,
            },
        },
    })
}

/// The `tools` of the chat-completions request: one per action type, and `no_action`.
pub fn tool_definitions() -> Value {
    let (ask, step) = ask_params(false);
    let (ask_req, step_req) = ask_params(true);
    let mut tools = Vec::new();
    for t in ActionType::ALL {
        tools.push(match t {
            ActionType::SendSms => tool(
                t.as_str(),
                "Text the driver of this load.",
                json!({
                    "to": {"type": "string", "enum": ["driver"]},
                    "body": {"type": "string", "minLength": 1, "maxLength": 1600},
                    "ask_id": ask, "step": step,
                }),
                &["to", "body"],
            ),
            ActionType::CreateHeroTask => tool(
                t.as_str(),
                "Create a task for a person on the Hero team.",
                json!({
                    "title": {"type": "string", "minLength": 1, "maxLength": 200},
                    "body": {"type": "string", "minLength": 1, "maxLength": 4000},
                    "urgency": {"type": "string", "enum": ["normal", "urgent"]},
                    "ask_id": ask, "step": step,
                }),
                &["title", "body", "urgency"],
            ),
            ActionType::PostHeroSlack => tool(
                t.as_str(),
                "Post a message to a Hero team Slack channel.",
                json!({
                    "channel": {"type": "string", "minLength": 1, "maxLength": 80},
                    "text": {"type": "string", "minLength": 1, "maxLength": 4000},
                }),
                &["channel", "text"],
            ),
            ActionType::SetTimer => tool(
                t.as_str(),
                "Wake the agent at fire_at for this ask step, unless the ask is resolved by then.",
                json!({
                    "ask_id": ask_req, "step": step_req,
                    "fire_at": {"type": "string", "format": "date-time", "description": "RFC 3339, UTC"},
                }),
                &["ask_id", "step", "fire_at"],
            ),
            ActionType::CancelTimer => tool(
                t.as_str(),
                "Cancel the timer of this ask step (the ask is answered or closed).",
                json!({"ask_id": ask_req, "step": step_req}),
                &["ask_id", "step"],
            ),
            ActionType::UpdateStage => tool(
                t.as_str(),
                "Move the load to another stage in the TMS.",
                json!({"stage": {"type": "string", "pattern": "^[a-z_]{1,32}$"}}),
                &["stage"],
            ),
        });
    }
    tools.push(tool(
        NO_ACTION,
        "Nothing is to be done about this event. Call it alone.",
        json!({"reason": {"type": "string", "maxLength": 1000}}),
        &["reason"],
    ));
    Value::Array(tools)
}

/// The user message: `{prompt_version, now, load_id, policy, state, event}` as JSON.
///
/// What the model sees of the state: the load's facts (the driver's phone masked), every
/// ask, and the last [`PROMPT_OUTCOMES`] action outcomes. Never whole phone numbers,
/// never the bookkeeping sets (processed and decided event ids).
pub fn prompt_input(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    policy: &EtaPolicy,
    now: Timestamp,
) -> Value {
    let asks: Vec<Value> = state
        .asks
        .values()
        .map(|a| {
            json!({
                "ask_id": a.ask_id, "kind": a.kind, "step": a.step, "status": a.status.as_str(),
                "opened_at": a.opened_at, "step_decided_at": a.step_decided_at,
                "current_timer_id": TimerId::new(load, &a.ask_id, a.step),
            })
        })
        .collect();
    let mut outcomes: Vec<(&String, &crate::projection::OutcomeSeen)> = state.outcomes.iter().collect();
    outcomes.sort_by_key(|(_, o)| o.at);
    let outcomes: Vec<Value> = outcomes
        .iter()
        .rev()
        .take(PROMPT_OUTCOMES)
        .rev()
        .map(|(key, o)| json!({"outbox_id": key, "status": o.status.as_str(), "at": o.at}))
        .collect();
    let mut ev = match event.to_json() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    match &event.body {
        EventBody::InboundSms(sms) => {
            ev.insert("from".into(), Value::String(mask_phone(&sms.from)));
            ev.insert("from_driver".into(), Value::Bool(state.driver_phone.as_deref() == Some(sms.from.as_str())));
        }
        EventBody::LoadUpdate(u) => {
            if let Some(p) = &u.driver_phone {
                ev.insert("driver_phone".into(), Value::String(mask_phone(p)));
            }
        }
        _ => {}
    }
    let mut input = json!({
        "prompt_version": PROMPT_VERSION,
        "now": now,
        "load_id": load,
        "policy": {
            "retry_after": format_duration(policy.retry_after),
            "max_attempts": policy.max_attempts,
            "trigger_risk": policy.trigger_risk.as_str(),
        },
        "state": {
            "client": state.client,
            "driver_phone": state.driver_phone.as_deref().map(mask_phone),
            "stage": state.stage,
            "next_stop": state.next_stop,
            "asks": asks,
            "recent_outcomes": outcomes,
        },
        "event": Value::Object(ev),
    });
    // Only when it holds, so the prompts of loads that never opted out stay as they were.
    if state.sms_opted_out() {
        input["state"]["sms_opted_out"] = json!(true);
    }
    input
}

/// One tool call of the model's answer: the function name and its arguments (JSON text).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// Why tool calls do not make a decision. Each ends in the fallback decision.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolCallError {
    #[error("the answer has no tool call")]
    NoToolCalls,
    #[error("{0} tool calls (at most {MAX_TOOL_CALLS})")]
    TooManyToolCalls(usize),
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    #[error("{tool}: bad arguments: {why}")]
    BadArguments { tool: String, why: String },
    #[error("send_sms to a recipient other than the driver")]
    NotTheDriver,
    #[error("send_sms but the load has no driver phone")]
    NoDriverPhone,
    #[error("no_action must be the only tool call")]
    NoActionWithOthers,
    #[error("ask {ask}: {why}")]
    Ask { ask: String, why: String },
    #[error("the decision does not validate: {0}")]
    Invalid(String),
}

fn bad(tool: &str, why: impl Into<String>) -> ToolCallError {
    ToolCallError::BadArguments { tool: tool.to_owned(), why: why.into() }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendSmsArgs {
    to: String,
    body: String,
    #[serde(default)]
    ask_id: Option<String>,
    #[serde(default)]
    step: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeroTaskArgs {
    title: String,
    body: String,
    urgency: Urgency,
    #[serde(default)]
    ask_id: Option<String>,
    #[serde(default)]
    step: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SlackArgs {
    channel: String,
    text: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TimerArgs {
    ask_id: String,
    step: u32,
    #[serde(default)]
    fire_at: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StageArgs {
    stage: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoActionArgs {
    #[serde(default)]
    reason: Option<String>,
}

fn args<T: for<'de> Deserialize<'de>>(call: &ToolCall) -> Result<T, ToolCallError> {
    if call.arguments.len() > MAX_ARGUMENT_BYTES {
        return Err(bad(&call.name, format!("longer than {MAX_ARGUMENT_BYTES} bytes")));
    }
    // Some models send "" for a call without arguments.
    let text = if call.arguments.trim().is_empty() { "{}" } else { call.arguments.as_str() };
    serde_json::from_str(text).map_err(|e| bad(&call.name, e.to_string()))
}

/// `ask_id` and `step` both or neither; the ask id of its form.
fn ask_step(tool: &str, ask: Option<String>, step: Option<u32>) -> Result<Option<(AskId, u32)>, ToolCallError> {
    match (ask, step) {
        (None, None) => Ok(None),
        (Some(a), Some(s)) => {
            let ask = AskId::parse(&a).map_err(|e| bad(tool, e.message))?;
            if s == 0 {
                return Err(bad(tool, "step must be 1 or more"));
            }
            Ok(Some((ask, s)))
        }
        _ => Err(bad(tool, "ask_id and step go together")),
    }
}

/// The longest a timer may be set ahead: a load lives two weeks at most.
const MAX_TIMER_AHEAD: std::time::Duration = std::time::Duration::from_secs(14 * 86_400);

fn to_action(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    now: Timestamp,
    call: &ToolCall,
) -> Result<Action, ToolCallError> {
    let Some(t) = ActionType::parse(&call.name) else {
        return Err(ToolCallError::UnknownTool(call.name.chars().take(64).collect()));
    };
    let (kind, at) = match t {
        ActionType::SendSms => {
            let a: SendSmsArgs = args(call)?;
            if a.to != "driver" {
                return Err(ToolCallError::NotTheDriver);
            }
            // The driver's phone as of this event (a load_update may set it).
            let phone = match &event.body {
                EventBody::LoadUpdate(u) if u.driver_phone.is_some() => u.driver_phone.clone(),
                _ => state.driver_phone.clone(),
            };
            let Some(to) = phone else { return Err(ToolCallError::NoDriverPhone) };
            (ActionKind::SendSms { to, body: a.body }, ask_step(&call.name, a.ask_id, a.step)?)
        }
        ActionType::CreateHeroTask => {
            let a: HeroTaskArgs = args(call)?;
            let at = ask_step(&call.name, a.ask_id, a.step)?;
            (ActionKind::CreateHeroTask { title: a.title, body: a.body, urgency: a.urgency }, at)
        }
        ActionType::PostHeroSlack => {
            let a: SlackArgs = args(call)?;
            (ActionKind::PostHeroSlack { channel: a.channel, text: a.text }, None)
        }
        ActionType::SetTimer => {
            let a: TimerArgs = args(call)?;
            let (ask, step) = ask_step(&call.name, Some(a.ask_id), Some(a.step))?.expect("both given");
            let fire_at: Timestamp = a
                .fire_at
                .ok_or_else(|| bad(&call.name, "missing field `fire_at`"))?
                .parse()
                .map_err(|e| bad(&call.name, format!("fire_at: {e}")))?;
            if fire_at > crate::time::add(now, MAX_TIMER_AHEAD) {
                return Err(bad(&call.name, "fire_at is more than 14 days ahead"));
            }
            let timer_id = TimerId::new(load, &ask, step);
            (ActionKind::SetTimer { timer_id, fire_at, ask_id: ask.clone(), step }, Some((ask, step)))
        }
        ActionType::CancelTimer => {
            let a: TimerArgs = args(call)?;
            if a.fire_at.is_some() {
                return Err(bad(&call.name, "unknown field `fire_at`"));
            }
            let (ask, step) = ask_step(&call.name, Some(a.ask_id), Some(a.step))?.expect("both given");
            (ActionKind::CancelTimer { timer_id: TimerId::new(load, &ask, step) }, Some((ask, step)))
        }
        ActionType::UpdateStage => {
            let a: StageArgs = args(call)?;
            (ActionKind::UpdateStage { stage: a.stage }, None)
        }
    };
    Ok(match at {
        Some((ask, step)) => Action {
            key: ask_action_key(load, &ask, step, t.as_str()),
            kind,
            ask_id: Some(ask),
            step: Some(step),
            requeue_of: None,
        },
        None => Action {
            key: event_action_key(load, &event.event_id, t.as_str()),
            kind,
            ask_id: None,
            step: None,
            requeue_of: None,
        },
    })
}

/// The ask changes a decision's actions imply, given the state before the event.
///
/// Per ask the actions name (by `ask_id`/`step`):
/// - `send_sms`/`set_timer` at step `s`: the ask is `open` at `s`. A new ask must be
///   named after this event, start at step 1, and be the only open ask of its kind; an
///   open ask moves to its next step only.
/// - `create_hero_task` at step `s` (with, at most, `cancel_timer` of the current step):
///   escalation, `escalated` at `s` = current step + 1.
/// - only `cancel_timer`, of the current step: the ask is resolved: `answered` when the
///   event is an SMS from the driver, `closed` otherwise.
///
/// Anything else (a step skipped, a resolved ask touched, a slack post or stage change
/// tied to an ask) is an error. The SOP's own decisions satisfy this exactly (tested).
pub fn derive_ask_changes(
    state: &LoadState,
    event: &InboundEvent,
    actions: &[Action],
) -> Result<Vec<AskChange>, ToolCallError> {
    let mut by_ask: BTreeMap<&AskId, Vec<&Action>> = BTreeMap::new();
    for a in actions {
        if let Some(ask) = &a.ask_id {
            by_ask.entry(ask).or_default().push(a);
        }
    }
    let mut changes = Vec::new();
    for (ask, acts) in by_ask {
        let err = |why: String| ToolCallError::Ask { ask: ask.to_string(), why };
        let has = |t: ActionType| acts.iter().any(|a| a.action_type() == t);
        let steps = |t: ActionType| acts.iter().filter(move |a| a.action_type() == t).filter_map(|a| a.step);
        if let Some(a) = acts.iter().find(|a| {
            !matches!(
                a.action_type(),
                ActionType::SendSms | ActionType::SetTimer | ActionType::CreateHeroTask | ActionType::CancelTimer
            )
        }) {
            return Err(err(format!("{} cannot belong to an ask step", a.action_type())));
        }
        let existing = state.asks.get(ask);
        let open = existing.filter(|a| a.status == AskStatus::Open);
        if existing.is_some() && open.is_none() {
            return Err(err("is no longer open".into()));
        }
        if has(ActionType::SendSms) || has(ActionType::SetTimer) {
            if has(ActionType::CreateHeroTask) || has(ActionType::CancelTimer) {
                return Err(err("a step and an escalation or cancellation at once".into()));
            }
            let all: Vec<u32> = acts.iter().filter_map(|a| a.step).collect();
            let s = all[0];
            if all.iter().any(|x| *x != s) {
                return Err(err("actions for more than one step".into()));
            }
            match open {
                None => {
                    let named = AskId::new(ask.kind(), &event.event_id).ok();
                    if named.as_ref() != Some(ask) {
                        return Err(err(format!("a new ask must be named after this event ({})", event.event_id)));
                    }
                    if s != 1 {
                        return Err(err(format!("a new ask starts at step 1, not {s}")));
                    }
                    if let Some(other) = state.open_ask_of_kind(ask.kind()) {
                        return Err(err(format!("{} is already open", other.ask_id)));
                    }
                }
                Some(o) if s != o.step + 1 => {
                    return Err(err(format!("is at step {}, so the next step is {}, not {s}", o.step, o.step + 1)));
                }
                Some(_) => {}
            }
            changes.push(AskChange { ask_id: ask.clone(), step: s, status: AskStatus::Open });
            continue;
        }
        let Some(o) = open else {
            return Err(err("is not open".into()));
        };
        if let Some(s) = steps(ActionType::CancelTimer).find(|s| *s != o.step) {
            return Err(err(format!("cancel_timer for step {s}, but the current step is {}", o.step)));
        }
        if has(ActionType::CreateHeroTask) {
            if let Some(s) = steps(ActionType::CreateHeroTask).find(|s| *s != o.step + 1) {
                return Err(err(format!("an escalation is step {}, not {s}", o.step + 1)));
            }
            changes.push(AskChange { ask_id: ask.clone(), step: o.step + 1, status: AskStatus::Escalated });
        } else {
            let from_driver = matches!(&event.body, EventBody::InboundSms(s) if state.driver_phone.as_deref() == Some(s.from.as_str()));
            let status = if from_driver { AskStatus::Answered } else { AskStatus::Closed };
            changes.push(AskChange { ask_id: ask.clone(), step: o.step, status });
        }
    }
    Ok(changes)
}

/// At most [`MAX_RATIONALE_CHARS`] characters, trimmed; `None` when empty.
pub fn bound_rationale(text: &str) -> Option<String> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    if t.chars().count() <= MAX_RATIONALE_CHARS {
        return Some(t.to_owned());
    }
    let mut s: String = t.chars().take(MAX_RATIONALE_CHARS - 1).collect();
    s.push('…');
    Some(s)
}

/// The decision the model's tool calls make: actions, derived ask changes, the
/// model's text as rationale, `prompt_version` set. Validated like every decision.
pub fn decision_from_tool_calls(
    load: &LoadId,
    state: &LoadState,
    event: &InboundEvent,
    now: Timestamp,
    decider: &str,
    calls: &[ToolCall],
    content: Option<&str>,
) -> Result<Decision, ToolCallError> {
    if calls.is_empty() {
        return Err(ToolCallError::NoToolCalls);
    }
    if calls.len() > MAX_TOOL_CALLS {
        return Err(ToolCallError::TooManyToolCalls(calls.len()));
    }
    let text = content.and_then(bound_rationale);
    let mut d = if calls.iter().any(|c| c.name == NO_ACTION) {
        if calls.len() > 1 {
            return Err(ToolCallError::NoActionWithOthers);
        }
        let a: NoActionArgs = args(&calls[0])?;
        let why = text.or_else(|| a.reason.as_deref().and_then(bound_rationale)).unwrap_or_else(|| "no action".into());
        Decision::new(&event.event_id, now, decider, vec![], vec![], why)
    } else {
        let actions = calls.iter().map(|c| to_action(load, state, event, now, c)).collect::<Result<Vec<_>, _>>()?;
        let asks = derive_ask_changes(state, event, &actions)?;
        let why = text.unwrap_or_else(|| {
            let names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
            format!("(no text from the model) {}", names.join(", "))
        });
        Decision::new(&event.event_id, now, decider, actions, asks, why)
    };
    d.prompt_version = Some(PROMPT_VERSION.to_owned());
    validate_decision(load, state, event, &d).map_err(ToolCallError::Invalid)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::{Record, project};
    use crate::sop::{self, Policies};
    use crate::testing::{PHONE, ev, load};

    fn now() -> Timestamp {
        "2026-03-02T07:00:00Z".parse().unwrap()
    }

    fn init() -> InboundEvent {
        ev(json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE, "stage": "in_transit"}))
    }

    fn ping(id: &str) -> InboundEvent {
        ev(json!({"event_id": id, "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"}))
    }

    fn timer(ask: &str, step: u32) -> InboundEvent {
        let ask = AskId::parse(ask).unwrap();
        let t = TimerId::new(&load(), &ask, step);
        ev(
            json!({"event_id": format!("evt:{t}"), "kind": "timer_fired", "timer_id": t, "ask_id": ask, "step": step, "fire_at": now()}),
        )
    }

    fn sms(id: &str, body: &str) -> InboundEvent {
        ev(json!({"event_id": id, "kind": "inbound_sms", "from": PHONE, "body": body}))
    }

    /// Runs the SOP over events, folding each decision in, and checks at every step
    /// that the asks derived from the SOP's actions are the SOP's own ask changes.
    fn sop_agrees(events: &[InboundEvent]) {
        let policies = Policies::default();
        let mut records: Vec<Record> = vec![];
        for e in events {
            let state = project(&records);
            let d = sop::decide(&policies, &load(), &state, e, now());
            let mut derived = derive_ask_changes(&state, e, &d.actions).unwrap();
            let mut want = d.asks.clone();
            derived.sort_by(|a, b| a.ask_id.cmp(&b.ask_id));
            want.sort_by(|a, b| a.ask_id.cmp(&b.ask_id));
            assert_eq!(derived, want, "event {}", e.event_id);
            records.extend(Record::appended(records.len() as u64, e, &d, now()));
        }
    }

    #[test]
    fn derived_asks_agree_with_the_sop() {
        let a = "ask:eta_request:p1";
        // Rules 1, 2, 3 (escalation).
        sop_agrees(&[init(), ping("p1"), timer(a, 1), timer(a, 2), timer(a, 3)]);
        // Rules 1 and 4 (answered, with trouble).
        sop_agrees(&[init(), ping("p1"), sms("s1", "flat tire")]);
        // Rules 1 and 7 (delivered).
        let delivered = ev(json!({"event_id": "u2", "kind": "load_update", "stage": "delivered"}));
        sop_agrees(&[init(), ping("p1"), timer(a, 1), delivered]);
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall { name: name.into(), arguments: args.to_string() }
    }

    fn decide(state: &LoadState, e: &InboundEvent, calls: &[ToolCall]) -> Result<Decision, ToolCallError> {
        decision_from_tool_calls(&load(), state, e, now(), "llm:m", calls, Some("because"))
    }

    fn started() -> LoadState {
        let e = init();
        let mut s = LoadState::default();
        s.apply(&Record::decode(1, "load:init".into(), e.kind(), e.body.payload(), now()));
        s
    }

    #[test]
    fn a_good_answer_opens_the_ask() {
        let s = started();
        let ask = "ask:eta_request:p1";
        let d = decide(
            &s,
            &ping("p1"),
            &[
                call("send_sms", json!({"to": "driver", "body": "ETA?", "ask_id": ask, "step": 1})),
                call("set_timer", json!({"ask_id": ask, "step": 1, "fire_at": "2026-03-02T07:30:00Z"})),
            ],
        )
        .unwrap();
        assert_eq!(d.actions[0].key, "481207/ask:eta_request:p1/1/send_sms");
        assert_eq!(d.actions[0].kind, ActionKind::SendSms { to: PHONE.into(), body: "ETA?".into() });
        assert_eq!(d.actions[1].key, "481207/ask:eta_request:p1/1/set_timer");
        assert_eq!(d.asks, vec![AskChange { ask_id: AskId::parse(ask).unwrap(), step: 1, status: AskStatus::Open }]);
        assert_eq!(d.prompt_version.as_deref(), Some(PROMPT_VERSION));
        assert_eq!(d.rationale, "because");
    }

    #[test]
    fn rule_4_in_the_prompt_reads_trouble_as_the_sop_does() {
        let prompt = SYSTEM_PROMPT.replace('\n', " ");
        assert!(prompt.contains("whole words or phrases"), "{prompt}");
        assert!(prompt.contains("never inside another word"), "{prompt}");
        for (word, inside) in [("late", "plate"), ("late", "translate"), ("late", "chocolate")] {
            assert!(prompt.contains(&format!("\"{inside}\"")), "{inside}");
            assert!(!crate::sop::reports_trouble(inside), "{inside} holds {word} but is no trouble");
        }
    }

    #[test]
    fn bad_answers_are_errors() {
        let s = started();
        let p = ping("p1");
        let sms = |args: Value| call("send_sms", args);
        let cases: Vec<(Vec<ToolCall>, &str)> = vec![
            (vec![], "no tool call"),
            (vec![call("launch_rocket", json!({}))], "unknown tool"),
            (vec![sms(json!({"to": "driver"}))], "missing field `body`"),
            (vec![sms(json!({"to": "+15555550199", "body": "hi"}))], "other than the driver"),
            (vec![sms(json!({"to": "driver", "body": "hi", "cc": "x"}))], "unknown field"),
            (vec![ToolCall { name: "send_sms".into(), arguments: "{not json".into() }], "bad arguments"),
            (
                vec![sms(json!({"to": "driver", "body": "hi", "ask_id": "ask:eta_request:other", "step": 1}))],
                "named after this event",
            ),
            (vec![sms(json!({"to": "driver", "body": "hi", "ask_id": "ask:eta_request:p1", "step": 2}))], "step 1"),
            (vec![sms(json!({"to": "driver", "body": "hi", "ask_id": "eta", "step": 1}))], "not of the form"),
            (vec![sms(json!({"to": "driver", "body": "hi", "ask_id": "ask:eta_request:p1"}))], "go together"),
            (
                vec![sms(json!({"to": "driver", "body": "a"})), sms(json!({"to": "driver", "body": "b"}))],
                "appears twice",
            ),
            (vec![call("no_action", json!({})), sms(json!({"to": "driver", "body": "a"}))], "only tool call"),
            (
                vec![call(
                    "set_timer",
                    json!({"ask_id": "ask:eta_request:p1", "step": 1, "fire_at": "2026-03-02T06:00:00Z"}),
                )],
                "fires before",
            ),
            (vec![call("update_stage", json!({"stage": "Delivered!"}))], "bad stage"),
            ((0..17).map(|i| call("no_action", json!({"reason": i.to_string()}))).collect(), "17 tool calls"),
        ];
        for (calls, want) in cases {
            let e = decide(&s, &p, &calls).unwrap_err().to_string();
            assert!(e.contains(want), "{calls:?}: {e} lacks {want:?}");
        }
    }

    #[test]
    fn no_action_and_rationale_bounds() {
        let s = started();
        let d = decision_from_tool_calls(
            &load(),
            &s,
            &ping("p1"),
            now(),
            "llm:m",
            &[call("no_action", json!({"reason": "low risk"}))],
            None,
        )
        .unwrap();
        assert!(d.actions.is_empty() && d.rationale == "low risk");
        let long = "x".repeat(5000);
        assert_eq!(bound_rationale(&long).unwrap().chars().count(), MAX_RATIONALE_CHARS);
    }

    /// The state after `events`, each decided by the SOP.
    fn after(events: &[InboundEvent]) -> LoadState {
        let mut records: Vec<Record> = vec![];
        for e in events {
            let d = sop::decide(&Policies::default(), &load(), &project(&records), e, now());
            records.extend(Record::appended(records.len() as u64, e, &d, now()));
        }
        project(&records)
    }

    #[test]
    fn bounds_of_an_answer() {
        let s = started();
        let p = ping("p1");
        // Arguments up to 16 KiB are read (padded with spaces here); one byte more is not.
        let padded = |len: usize| {
            let mut a = json!({"to": "driver", "body": "hi"}).to_string();
            a.push_str(&" ".repeat(len - a.len()));
            ToolCall { name: "send_sms".into(), arguments: a }
        };
        assert!(decide(&s, &p, &[padded(16 * 1024)]).is_ok());
        let e = decide(&s, &p, &[padded(16 * 1024 + 1)]).unwrap_err().to_string();
        assert!(e.contains("longer than 16384 bytes"), "{e}");
        // 16 tool calls are not too many (these fail for another reason); 17 are.
        let many = |n: usize| (0..n).map(|i| call("no_action", json!({"reason": i.to_string()}))).collect::<Vec<_>>();
        assert!(!matches!(decide(&s, &p, &many(16)), Err(ToolCallError::TooManyToolCalls(_))));
        assert!(matches!(decide(&s, &p, &many(17)), Err(ToolCallError::TooManyToolCalls(17))));
        // A timer 14 days ahead is set; a millisecond later, or a day later, is refused.
        let ask = "ask:eta_request:p1";
        let timer_at = |at: Timestamp| {
            let sms = call("send_sms", json!({"to": "driver", "body": "ETA?", "ask_id": ask, "step": 1}));
            decide(&s, &p, &[sms, call("set_timer", json!({"ask_id": ask, "step": 1, "fire_at": at}))])
        };
        let days = |d: u64| crate::time::add(now(), std::time::Duration::from_secs(d * 86_400));
        assert!(timer_at(days(14)).is_ok());
        for late in [crate::time::add(days(14), std::time::Duration::from_millis(1)), days(15)] {
            let e = timer_at(late).unwrap_err().to_string();
            assert!(e.contains("more than 14 days ahead"), "{e}");
        }
    }

    #[test]
    fn an_sms_goes_to_the_phone_as_of_its_event() {
        let s = started();
        let to = |e: &InboundEvent| {
            let d = decide(&s, e, &[call("send_sms", json!({"to": "driver", "body": "hi"}))]).unwrap();
            match &d.actions[0].kind {
                ActionKind::SendSms { to, .. } => to.clone(),
                k => panic!("{k:?}"),
            }
        };
        let stage = ev(json!({"event_id": "u2", "kind": "load_update", "stage": "at_pickup"}));
        assert_eq!(to(&stage), PHONE, "an update that sets no phone keeps the load's");
        let new_phone = ev(json!({"event_id": "u3", "kind": "load_update", "driver_phone": "+15555550111"}));
        assert_eq!(to(&new_phone), "+15555550111", "an update that sets one: the new phone");
    }

    #[test]
    fn an_open_ask_moves_one_step_at_a_time_and_never_steps_and_escalates_at_once() {
        let a = "ask:eta_request:p1";
        let s = after(&[init(), ping("p1")]);
        let t = timer(a, 1);
        let sms = |step: u32| call("send_sms", json!({"to": "driver", "body": "ETA?", "ask_id": a, "step": step}));
        assert!(decide(&s, &t, &[sms(2)]).is_ok());
        let e = decide(&s, &t, &[sms(3)]).unwrap_err().to_string();
        assert!(e.contains("is at step 1, so the next step is 2, not 3"), "{e}");
        let hero =
            call("create_hero_task", json!({"title": "t", "body": "b", "urgency": "urgent", "ask_id": a, "step": 2}));
        let e = decide(&s, &t, &[sms(2), hero]).unwrap_err().to_string();
        assert!(e.contains("a step and an escalation or cancellation at once"), "{e}");
        let cancel = call("cancel_timer", json!({"ask_id": a, "step": 1}));
        let e = decide(&s, &t, &[sms(2), cancel]).unwrap_err().to_string();
        assert!(e.contains("a step and an escalation or cancellation at once"), "{e}");
    }

    #[test]
    fn the_prompt_shows_no_whole_phone_number() {
        let s = started();
        let p = prompt_input(&load(), &s, &sms("s1", "ETA 9"), &EtaPolicy::default(), now());
        let text = p.to_string();
        assert!(!text.contains(PHONE), "{text}");
        // An update that sets the phone shows it masked too.
        let update = prompt_input(&load(), &s, &init(), &EtaPolicy::default(), now());
        assert!(!update.to_string().contains(PHONE), "{update}");
        assert_eq!(update["event"]["driver_phone"], "***0100");
        assert_eq!(p["event"]["from_driver"], true);
        assert_eq!(p["event"]["event_id"], "s1");
        assert_eq!(p["load_id"], "481207");
        assert_eq!(p["policy"]["retry_after"], "30m");
        let names: Vec<String> = tool_definitions()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
            .collect();
        for t in ActionType::ALL {
            assert!(names.contains(&t.as_str().to_owned()));
        }
        assert!(names.contains(&NO_ACTION.to_owned()));
        // A timer's ask and step are required and described as such; an SMS's are optional.
        let params = |name: &str| {
            let tools = tool_definitions();
            let t = tools.as_array().unwrap().iter().find(|t| t["function"]["name"] == name).unwrap().clone();
            t["function"]["parameters"].clone()
        };
        let timer = params("set_timer");
        assert_eq!(timer["properties"]["ask_id"]["type"], "string");
        assert!(timer["properties"]["ask_id"]["description"].as_str().unwrap().contains("e.g. ask:eta_request:"));
        assert_eq!(timer["properties"]["step"]["minimum"], 1);
        assert_eq!(timer["required"], json!(["ask_id", "step", "fire_at"]));
        let sms = params("send_sms");
        assert!(sms["properties"]["ask_id"]["description"].as_str().unwrap().contains("leave out"));
        assert_eq!(sms["properties"]["step"]["type"], "integer");
    }
}
