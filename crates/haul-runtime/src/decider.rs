//! The `Decider` trait: what the worker asks when the deterministic filter does not
//! decide. It takes the projected state, the event and `now`, and returns a decision;
//! it writes nothing and calls no channel, so a decision can be replayed. (An LLM
//! decider makes one request to its model; the SOP makes none.)

use async_trait::async_trait;
use haul_core::InboundEvent;
use haul_core::decision::Decision;
use haul_core::ids::LoadId;
use haul_core::projection::LoadState;
use haul_core::sop::{self, Policies};
use haul_core::time::Timestamp;

#[async_trait]
pub trait Decider: Send + Sync {
    /// What goes in `decision_recorded.decider` (`sop`, `llm:{model}`).
    fn name(&self) -> String;

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision>;

    /// The prompt texts a decision this decider made on these inputs was given, by
    /// their SHA-256 (`decision.llm`'s hashes): what the worker stores with the
    /// decision. A decider that asks no model gave none.
    fn prompt_texts(
        &self,
        _load: &LoadId,
        _state: &LoadState,
        _event: &InboundEvent,
        _now: Timestamp,
    ) -> Vec<(String, String)> {
        vec![]
    }
}

/// The SOP of docs/design.md with per-client policies.
pub struct SopDecider {
    pub policies: Policies,
}

#[async_trait]
impl Decider for SopDecider {
    fn name(&self) -> String {
        "sop".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        // The worker's filter decides operator actions before any decider; asked
        // anyway, the SOP answers as the filter would.
        if let haul_core::EventBody::OperatorAction(op) = &event.body {
            return Ok(haul_core::operator::decide(load, state, event, op, now));
        }
        Ok(sop::decide(&self.policies, load, state, event, now))
    }
}
