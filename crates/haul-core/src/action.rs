//! Actions: data a decision records before anything is sent (docs/design.md, "Actions").
//!
//! Each accepted action becomes one outbox row whose id is the action key; the
//! dispatcher applies it where [`ActionType::target`] says, with the request
//! [`ActionKind::request`] builds. Both are here, next to the types, and match without
//! a catch-all arm: a new action type is a variant here, its validation and its LLM
//! tool, and the compiler names anything else.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::channel::Channel;
use crate::ids::{AskId, LoadId, TimerId};
use crate::time::Timestamp;

crate::listed_enum! {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum ActionType {
        SendSms,
        CreateHeroTask,
        PostHeroSlack,
        SetTimer,
        CancelTimer,
        UpdateStage,
    }
}

/// Where an action is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The channel service's HTTP API (or record mode).
    Service(Channel),
    /// The TimerStore, inside haul.
    TimerStore,
}

/// Who applies an action, and so what its failure means (ADR 0003): a failed external
/// action is for the agent to handle; a failed Hero-channel or internal action is an
/// infrastructure incident that raises an OpsAlert and never a Hero task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelClass {
    External,
    HeroChannel,
    Internal,
}

impl ActionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ActionType::SendSms => "send_sms",
            ActionType::CreateHeroTask => "create_hero_task",
            ActionType::PostHeroSlack => "post_hero_slack",
            ActionType::SetTimer => "set_timer",
            ActionType::CancelTimer => "cancel_timer",
            ActionType::UpdateStage => "update_stage",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn class(self) -> ChannelClass {
        match self {
            ActionType::SendSms => ChannelClass::External,
            ActionType::CreateHeroTask | ActionType::PostHeroSlack => ChannelClass::HeroChannel,
            ActionType::SetTimer | ActionType::CancelTimer | ActionType::UpdateStage => ChannelClass::Internal,
        }
    }

    pub fn target(self) -> Target {
        match self {
            ActionType::SendSms => Target::Service(Channel::Sms),
            ActionType::CreateHeroTask => Target::Service(Channel::Hero),
            ActionType::PostHeroSlack => Target::Service(Channel::Slack),
            ActionType::UpdateStage => Target::Service(Channel::Tms),
            ActionType::SetTimer | ActionType::CancelTimer => Target::TimerStore,
        }
    }

    /// The channel service that applies this type; `None` for the TimerStore's.
    pub fn channel(self) -> Option<Channel> {
        match self.target() {
            Target::Service(c) => Some(c),
            Target::TimerStore => None,
        }
    }

    /// The types `channel` applies: what its send rate counts.
    pub fn of_channel(channel: Channel) -> Vec<ActionType> {
        ActionType::ALL.into_iter().filter(|t| t.channel() == Some(channel)).collect()
    }
}

impl fmt::Display for ActionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Urgency {
    Normal,
    Urgent,
}

impl Urgency {
    pub fn as_str(self) -> &'static str {
        match self {
            Urgency::Normal => "normal",
            Urgency::Urgent => "urgent",
        }
    }
}

/// The type and params of an action: `{"type": ..., "params": {...}}` on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "params", rename_all = "snake_case", deny_unknown_fields)]
pub enum ActionKind {
    SendSms { to: String, body: String },
    CreateHeroTask { title: String, body: String, urgency: Urgency },
    PostHeroSlack { channel: String, text: String },
    SetTimer { timer_id: TimerId, fire_at: Timestamp, ask_id: AskId, step: u32 },
    CancelTimer { timer_id: TimerId },
    UpdateStage { stage: String },
}

impl ActionKind {
    pub fn action_type(&self) -> ActionType {
        match self {
            ActionKind::SendSms { .. } => ActionType::SendSms,
            ActionKind::CreateHeroTask { .. } => ActionType::CreateHeroTask,
            ActionKind::PostHeroSlack { .. } => ActionType::PostHeroSlack,
            ActionKind::SetTimer { .. } => ActionType::SetTimer,
            ActionKind::CancelTimer { .. } => ActionType::CancelTimer,
            ActionKind::UpdateStage { .. } => ActionType::UpdateStage,
        }
    }

    /// What applying the action asks of its [`ActionType::target`] (docs/api.md).
    pub fn request(&self, load_id: &LoadId) -> Request {
        let send = |channel, path: &str, body| Request::Send(ServiceCall { channel, path: path.to_owned(), body });
        match self {
            ActionKind::SendSms { to, body } => {
                send(Channel::Sms, "/v1/messages", json!({"to": to, "body": body, "load_id": load_id}))
            }
            ActionKind::CreateHeroTask { title, body, urgency } => send(
                Channel::Hero,
                "/v1/tasks",
                json!({"load_id": load_id, "title": title, "body": body, "urgency": urgency}),
            ),
            ActionKind::PostHeroSlack { channel, text } => {
                send(Channel::Slack, "/v1/messages", json!({"load_id": load_id, "channel": channel, "text": text}))
            }
            ActionKind::UpdateStage { stage } => {
                send(Channel::Tms, &format!("/v1/loads/{load_id}/stage"), json!({"stage": stage}))
            }
            ActionKind::SetTimer { timer_id, fire_at, .. } => {
                Request::ScheduleTimer { timer_id: timer_id.clone(), fire_at: *fire_at }
            }
            ActionKind::CancelTimer { timer_id } => Request::CancelTimer { timer_id: timer_id.clone() },
        }
    }
}

/// One action's request: to a channel service (the outbox id goes with it as the
/// idempotency key) or to the TimerStore.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Send(ServiceCall),
    ScheduleTimer { timer_id: TimerId, fire_at: Timestamp },
    CancelTimer { timer_id: TimerId },
}

/// `POST {channel base URL}{path}` with `body` as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceCall {
    pub channel: Channel,
    pub path: String,
    pub body: Value,
}

impl Request {
    pub fn target(&self) -> Target {
        match self {
            Request::Send(call) => Target::Service(call.channel),
            Request::ScheduleTimer { .. } | Request::CancelTimer { .. } => Target::TimerStore,
        }
    }
}

/// `{key, type, ask_id?, step?, requeue_of?, params}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub key: String,
    #[serde(flatten)]
    pub kind: ActionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_id: Option<AskId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// On an operator's requeue: the key of the dead row this action is a copy of (the
    /// dead row stays dead; this is its link to the row that re-drives it). Absent on
    /// every other action, so rows written before it read back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_of: Option<String>,
}

impl Action {
    pub fn action_type(&self) -> ActionType {
        self.kind.action_type()
    }

    pub fn class(&self) -> ChannelClass {
        self.action_type().class()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_form() {
        let a = Action {
            key: "481207/ask:eta_request:p/1/send_sms".into(),
            kind: ActionKind::SendSms { to: "+15555550100".into(), body: "ETA?".into() },
            ask_id: Some(AskId::parse("ask:eta_request:p").unwrap()),
            step: Some(1),
            requeue_of: None,
        };
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(
            v,
            json!({"key":"481207/ask:eta_request:p/1/send_sms","type":"send_sms",
                   "params":{"to":"+15555550100","body":"ETA?"},"ask_id":"ask:eta_request:p","step":1})
        );
        assert_eq!(serde_json::from_value::<Action>(v).unwrap(), a);
        assert!(serde_json::from_value::<Action>(json!({"key":"k","type":"launch","params":{}})).is_err());
    }

    /// One action of each type, with its request's path and body.
    fn sample(t: ActionType) -> (ActionKind, Option<(&'static str, Value)>) {
        let load = LoadId::parse("481207").unwrap();
        let ask = AskId::parse("ask:eta_request:p").unwrap();
        let timer_id = TimerId::new(&load, &ask, 1);
        match t {
            ActionType::SendSms => (
                ActionKind::SendSms { to: "+15555550100".into(), body: "ETA?".into() },
                Some(("/v1/messages", json!({"to": "+15555550100", "body": "ETA?", "load_id": "481207"}))),
            ),
            ActionType::CreateHeroTask => (
                ActionKind::CreateHeroTask { title: "t".into(), body: "b".into(), urgency: Urgency::Urgent },
                Some(("/v1/tasks", json!({"load_id": "481207", "title": "t", "body": "b", "urgency": "urgent"}))),
            ),
            ActionType::PostHeroSlack => (
                ActionKind::PostHeroSlack { channel: "ops".into(), text: "x".into() },
                Some(("/v1/messages", json!({"load_id": "481207", "channel": "ops", "text": "x"}))),
            ),
            ActionType::SetTimer => (
                ActionKind::SetTimer {
                    timer_id,
                    fire_at: "2026-03-02T07:30:00Z".parse().unwrap(),
                    ask_id: ask,
                    step: 1,
                },
                None,
            ),
            ActionType::CancelTimer => (ActionKind::CancelTimer { timer_id }, None),
            ActionType::UpdateStage => (
                ActionKind::UpdateStage { stage: "delivered".into() },
                Some(("/v1/loads/481207/stage", json!({"stage": "delivered"}))),
            ),
        }
    }

    #[test]
    fn requests_go_where_their_type_says() {
        let load = LoadId::parse("481207").unwrap();
        for t in ActionType::ALL {
            let (kind, want) = sample(t);
            assert_eq!(kind.action_type(), t);
            let r = kind.request(&load);
            assert_eq!(r.target(), t.target(), "{t}");
            match (r, want) {
                (Request::Send(c), Some((p, b))) => assert_eq!((c.path.as_str(), c.body), (p, b), "{t}"),
                (Request::ScheduleTimer { .. } | Request::CancelTimer { .. }, None) => {}
                (r, want) => panic!("{t}: {r:?}, expected {want:?}"),
            }
        }
    }

    #[test]
    fn classes() {
        assert_eq!(ActionType::SendSms.class(), ChannelClass::External);
        assert_eq!(ActionType::PostHeroSlack.class(), ChannelClass::HeroChannel);
        assert_eq!(ActionType::UpdateStage.class(), ChannelClass::Internal);
        for t in ActionType::ALL {
            assert_eq!(ActionType::parse(t.as_str()), Some(t));
        }
    }

    #[test]
    fn each_type_names_its_channel_and_urgency_its_wire_name() {
        use ActionType::*;
        let want = [
            (SendSms, Some(Channel::Sms)),
            (CreateHeroTask, Some(Channel::Hero)),
            (PostHeroSlack, Some(Channel::Slack)),
            (UpdateStage, Some(Channel::Tms)),
            (SetTimer, None),
            (CancelTimer, None),
        ];
        assert_eq!(want.len(), ActionType::ALL.len());
        for (t, channel) in want {
            assert_eq!(t.channel(), channel, "{t}");
        }
        assert_eq!(ActionType::of_channel(Channel::Sms), [SendSms]);
        assert_eq!(ActionType::of_channel(Channel::Tms), [UpdateStage]);
        for u in [Urgency::Normal, Urgency::Urgent] {
            assert_eq!(json!(u.as_str()), serde_json::to_value(u).unwrap());
        }
        assert_eq!([Urgency::Normal.as_str(), Urgency::Urgent.as_str()], ["normal", "urgent"]);
    }
}
