//! `decision_recorded`: what a run decided about one inbound event.
//!
//! Besides the fields of docs/design.md a decision carries `asks`, the asks it opened or
//! moved (new step or status). The projection applies those, so ask state is a fold
//! of the log and does not depend on which decider wrote it.

use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionKind, ActionType, Urgency};
use crate::ids::{AskId, EventId, LoadId, decision_entry_id, fallback_action_key};
use crate::spend::{BudgetExceeded, LlmUsage};
use crate::time::Timestamp;

pub const DECISION_RECORDED: &str = "decision_recorded";

/// Where an ask stands. Here rather than in the projection, which folds decisions:
/// a decision names the status it moves an ask to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AskStatus {
    Open,
    Answered,
    Escalated,
    Closed,
}

impl AskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AskStatus::Open => "open",
            AskStatus::Answered => "answered",
            AskStatus::Escalated => "escalated",
            AskStatus::Closed => "closed",
        }
    }
}

/// An ask opened or changed by a decision: its step and status after the decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AskChange {
    pub ask_id: AskId,
    pub step: u32,
    pub status: AskStatus,
}

/// Where a dead row stands in the operators' inbox: `open` until a decision marks it
/// `handled` (a copy an operator requeued was delivered) or `dismissed` (an operator
/// said why nothing more is to be done).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    Open,
    Handled,
    Dismissed,
}

impl InboxState {
    pub const ALL: [InboxState; 3] = [InboxState::Open, InboxState::Handled, InboxState::Dismissed];

    pub fn as_str(self) -> &'static str {
        match self {
            InboxState::Open => "open",
            InboxState::Handled => "handled",
            InboxState::Dismissed => "dismissed",
        }
    }

    pub fn parse(s: &str) -> Option<InboxState> {
        InboxState::ALL.into_iter().find(|x| x.as_str() == s)
    }
}

/// A dead row a decision takes out of the inbox, and how.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxChange {
    pub outbox_id: String,
    pub state: InboxState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub decision_id: String,
    pub event_id: EventId,
    pub decided_at: Timestamp,
    pub filtered: bool,
    pub needs_hero_task: bool,
    pub actions: Vec<Action>,
    pub rationale: String,
    pub decider: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asks: Vec<AskChange>,
    /// The dead rows of this load it marks handled or dismissed (absent when none, so
    /// logs written before the inbox existed read back unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inbox: Vec<InboxChange>,
    /// The prompt version an LLM decider decided with; absent for every other decider,
    /// so logs written before it existed (and their snapshots) read back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_version: Option<String>,
    /// What the model call cost and which prompt it was given (by hash); absent for
    /// every decision no model made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmUsage>,
    /// The LLM budget found spent, when the SOP decided in the model's place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetExceeded>,
}

impl Decision {
    /// A decision with the given actions; `needs_hero_task` follows from them.
    pub fn new(
        event: &EventId,
        decided_at: Timestamp,
        decider: impl Into<String>,
        actions: Vec<Action>,
        asks: Vec<AskChange>,
        rationale: impl Into<String>,
    ) -> Self {
        let needs_hero_task = actions.iter().any(|a| a.action_type() == ActionType::CreateHeroTask);
        Decision {
            decision_id: decision_entry_id(event),
            event_id: event.clone(),
            decided_at,
            filtered: false,
            needs_hero_task,
            actions,
            rationale: rationale.into(),
            decider: decider.into(),
            asks,
            inbox: vec![],
            prompt_version: None,
            llm: None,
            budget: None,
        }
    }

    /// The deterministic filter's noop: no actions, no decider call.
    pub fn filtered(event: &EventId, decided_at: Timestamp, rationale: impl Into<String>) -> Self {
        let mut d = Decision::new(event, decided_at, "filter", vec![], vec![], rationale);
        d.filtered = true;
        d
    }

    /// What a run records when the decider failed, was late, returned actions that do
    /// not validate, or reused an action key: one urgent Hero task, so a person looks
    /// at the event and it is never lost.
    pub fn fallback(load: &LoadId, event: &EventId, kind: &str, decided_at: Timestamp, why: &str) -> Self {
        let action = Action {
            key: fallback_action_key(load, event),
            kind: ActionKind::CreateHeroTask {
                title: format!("Load {load}: the agent could not decide on {kind} {event}"),
                body: format!("The decision for event {event} fell back to a person: {why}"),
                urgency: Urgency::Urgent,
            },
            ask_id: None,
            step: None,
            requeue_of: None,
        };
        Decision::new(event, decided_at, "fallback", vec![action], vec![], why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inbox_states_read_back_by_name() {
        for state in InboxState::ALL {
            assert_eq!(InboxState::parse(state.as_str()), Some(state));
        }
        assert_eq!(InboxState::parse("closed"), None);
        assert_eq!(InboxState::parse("Open"), None);
    }
}
