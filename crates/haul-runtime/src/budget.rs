//! `decider.llm.budget`: past a budget the SOP decides in the model's place.
//!
//! A decorator over the model's decider, so neither the worker nor the LLM client
//! knows budgets exist: before each call it reads the load's lifetime spend (its
//! projection) and the client's spend of the UTC day (the store's `llm_spend`, which
//! appends keep), and when `haul_core::spend::Budgets::check` finds one spent it asks
//! the SOP instead and says why in the decision (`budget`). The check is before the
//! call, so loads deciding at the same moment may each finish the call they started:
//! a budget can be passed by at most one call per worker run in flight.

use std::sync::Arc;

use async_trait::async_trait;
use haul_core::InboundEvent;
use haul_core::decision::Decision;
use haul_core::ids::LoadId;
use haul_core::projection::LoadState;
use haul_core::spend::{BudgetExceeded, Budgets, day_of};
use haul_core::time::Timestamp;
use haul_store::SpendLedger;

use crate::decider::{Decider, SopDecider};

pub struct Budgeted {
    model: Arc<dyn Decider>,
    sop: SopDecider,
    budgets: Budgets,
    ledger: Arc<dyn SpendLedger>,
}

impl Budgeted {
    pub fn new(model: Arc<dyn Decider>, sop: SopDecider, budgets: Budgets, ledger: Arc<dyn SpendLedger>) -> Self {
        Budgeted { model, sop, budgets, ledger }
    }

    /// The budget a model call for this load would go past, if any.
    async fn spent(
        &self,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Option<BudgetExceeded>> {
        if !self.budgets.any() {
            return Ok(None);
        }
        let client = state.charged_client(event);
        let client = client.as_deref();
        let day = if self.budgets.client_day_of(client).is_set() {
            self.ledger.client_day_spend(client.unwrap_or_default(), &day_of(now)).await?
        } else {
            Default::default()
        };
        Ok(self.budgets.check(client, &state.spend, &day.spend, day.capped_at.is_some()))
    }
}

#[async_trait]
impl Decider for Budgeted {
    fn name(&self) -> String {
        self.model.name()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        let Some(budget) = self.spent(state, event, now).await? else {
            return self.model.decide(load, state, event, now).await;
        };
        let mut d = self.sop.decide(load, state, event, now).await?;
        d.rationale = format!("{budget}; the SOP decided in the model's place: {}", d.rationale);
        d.budget = Some(budget);
        Ok(d)
    }

    fn prompt_texts(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> Vec<(String, String)> {
        self.model.prompt_texts(load, state, event, now)
    }
}
