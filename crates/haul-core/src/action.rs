//! Actions: data a decision records before anything is sent (docs/design.md, "Actions").
//!
//! Each accepted action becomes one outbox row whose id is the action key; the
//! dispatcher applies it to the service its channel class names.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{AskId, TimerId};
use crate::time::Timestamp;

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
    pub const ALL: [ActionType; 6] = [
        ActionType::SendSms,
        ActionType::CreateHeroTask,
        ActionType::PostHeroSlack,
        ActionType::SetTimer,
        ActionType::CancelTimer,
        ActionType::UpdateStage,
    ];

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
}

/// `{key, type, ask_id?, step?, params}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Action {
    pub key: String,
    #[serde(flatten)]
    pub kind: ActionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_id: Option<AskId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
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

    #[test]
    fn classes() {
        assert_eq!(ActionType::SendSms.class(), ChannelClass::External);
        assert_eq!(ActionType::PostHeroSlack.class(), ChannelClass::HeroChannel);
        assert_eq!(ActionType::UpdateStage.class(), ChannelClass::Internal);
        for t in ActionType::ALL {
            assert_eq!(ActionType::parse(t.as_str()), Some(t));
        }
    }
}
