//! `OutcomeStatus`: what became of an action, delivered or failed.
//!
//! Its own module, below ids and events, because both name it: an outcome's event id
//! carries its status (`evt:out:{key}:{status}`), and the `action_outcome` event
//! carries it as a field.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    Delivered,
    Failed,
}

impl OutcomeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeStatus::Delivered => "delivered",
            OutcomeStatus::Failed => "failed",
        }
    }
}
