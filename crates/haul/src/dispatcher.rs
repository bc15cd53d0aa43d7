//! The dispatcher: claims due outbox rows and applies them (ADR 0003).
//!
//! It calls the owning service with `Idempotency-Key = outbox id`, retries by the
//! `RetryPolicy`, buries dead rows, applies `set_timer`/`cancel_timer` to the
//! TimerStore, and publishes an `action_outcome` to the load queue. It never writes a
//! log: outcomes reach the log through the load worker, the one writer per load.
//! Several dispatchers may run at once; claims and tokens keep them apart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use haul_core::OutcomeStatus;
use haul_core::action::{Action, ActionType, ChannelClass, Request};
use haul_core::event::{ActionOutcome, EventBody};
use haul_core::ids::{action_outcome_event_id, ops_alert_key};
use haul_core::time::Timestamp;
use haul_core::{Channel, Clock, InboundEvent, QueueMode, RetryDecision, RetryPolicy};
use haul_store::{Claim, ClaimError, LoadQueue, OutboxRow, Store, StoreError};
use serde_json::json;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::channels::{Channels, DeliveryError, PermanentDeliveryError, RetryableDeliveryError};
use crate::faults::{Crash, FaultPoint, Faults, Observed};
use crate::queue::{EventQueue, body_of};

#[derive(Clone, Debug)]
pub struct DispatcherSettings {
    pub batch: usize,
    pub lease: Duration,
    pub retry: RetryPolicy,
    /// Send a batch's rows one after another instead of at once (the simulator, whose
    /// runs must repeat exactly).
    pub sequential: bool,
    /// Seeds the retry jitter (evals, the simulator); `None` draws from the OS.
    pub jitter_seed: Option<u64>,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        DispatcherSettings {
            batch: 32,
            lease: Duration::from_secs(90),
            retry: RetryPolicy::default(),
            sequential: false,
            jitter_seed: None,
        }
    }
}

/// How one claimed row ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dispatched {
    Delivered,
    /// A failed attempt; the row is due again at `retry_at`.
    Retrying {
        retry_at: Timestamp,
    },
    /// Dead: permanent failure or attempts spent.
    Buried,
    /// Another dispatcher owns the row: nothing changed.
    Stale,
    /// The store failed around the send; the lease lapses and the row is tried again.
    Unsettled(String),
    Crashed(Crash),
}

impl Dispatched {
    fn label(&self) -> &'static str {
        match self {
            Dispatched::Delivered => "delivered",
            Dispatched::Retrying { .. } => "retrying",
            Dispatched::Buried => "buried",
            Dispatched::Stale => "stale",
            Dispatched::Unsettled(_) => "unsettled",
            Dispatched::Crashed(_) => "crashed",
        }
    }
}

pub struct Dispatcher {
    store: Arc<dyn Store>,
    queue: EventQueue,
    channels: Channels,
    clock: Arc<dyn Clock>,
    settings: DispatcherSettings,
    faults: Faults,
    rng: Mutex<fastrand::Rng>,
    /// Woken after an outcome is published (in-process workers react at once).
    wake_worker: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// On the store's own queue a delivered outcome's publish and the row's mark go in
    /// one transaction (`Outbox::publish_and_mark_dispatched`); any other queue: two steps.
    queue_mode: QueueMode,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn LoadQueue>,
        queue_mode: QueueMode,
        channels: Channels,
        clock: Arc<dyn Clock>,
        settings: DispatcherSettings,
        faults: Faults,
    ) -> Self {
        let rng = settings.jitter_seed.map_or_else(fastrand::Rng::new, fastrand::Rng::with_seed);
        Dispatcher {
            queue_mode,
            store,
            queue: EventQueue::new(queue),
            channels,
            clock,
            settings,
            faults,
            rng: Mutex::new(rng),
            wake_worker: std::sync::OnceLock::new(),
        }
    }

    /// Wakes `worker` whenever an outcome is published.
    pub fn wake_on_publish(&self, worker: Arc<tokio::sync::Notify>) {
        let _ = self.wake_worker.set(worker);
    }

    /// Claims one batch of due rows and dispatches them concurrently; first publishes
    /// the failed outcomes that an earlier burial could not.
    pub async fn run_once(self: &Arc<Self>) -> Result<Vec<Dispatched>, StoreError> {
        let mut out = self.sweep_dead().await?;
        let claims = self.store.pending(self.settings.batch, self.clock.now(), self.settings.lease).await?;
        if let Some(first) = claims.first()
            && let Err(crash) = self.faults.check(FaultPoint::AfterClaim, &first.row.id)
        {
            return Ok(vec![Dispatched::Crashed(crash)]);
        }
        for c in &claims {
            self.faults.observe(Observed::Claimed { outbox_id: &c.row.id, token: &c.token });
        }
        if self.settings.sequential {
            for claim in claims {
                out.push(self.dispatch(claim).await);
            }
            return Ok(out);
        }
        let mut sends = JoinSet::new();
        for claim in claims {
            let d = self.clone();
            let span = info_span!("dispatch", outbox_id = %claim.row.id, load_id = %claim.row.load_id, attempts = claim.row.attempts);
            sends.spawn(async move { d.dispatch(claim).await }.instrument(span));
        }
        while let Some(r) = sends.join_next().await {
            match r {
                Ok(d) => out.push(d),
                Err(e) => error!(error = %e, "a dispatch panicked; its lease will lapse and the row be retried"),
            }
        }
        Ok(out)
    }

    /// Dead rows whose failed outcome never reached the queue (it was down when they
    /// were buried): publish it now, then raise the OpsAlert their class calls for.
    async fn sweep_dead(&self) -> Result<Vec<Dispatched>, StoreError> {
        let mut out = Vec::new();
        for row in self.store.dead_without_outcome(self.settings.batch).await? {
            let why = row.last_failure.clone().unwrap_or_else(|| "unknown failure".into());
            if let Err(e) =
                self.publish(&row, outcome(&row, row.action_type, OutcomeStatus::Failed, None, Some(why.clone()))).await
            {
                debug!(error = %e, outbox_id = %row.id, "the failed outcome still cannot be published");
                break;
            }
            if !self.alert_for(&row, &why).await {
                break;
            }
            self.store.mark_outcome_published(&row.id, self.clock.now()).await?;
            out.push(Dispatched::Buried);
        }
        Ok(out)
    }

    async fn dispatch(&self, claim: Claim) -> Dispatched {
        let result = self.dispatch_inner(&claim).await.unwrap_or_else(Dispatched::Crashed);
        match &result {
            Dispatched::Stale => info!("another dispatcher owns the row; changed nothing"),
            Dispatched::Unsettled(why) => warn!(why, "left for the lease to lapse"),
            Dispatched::Crashed(c) => info!(%c, "dispatch crashed at a fault point"),
            other => debug!(result = other.label()),
        }
        metrics::counter!("haul_dispatches_total", "result" => result.label()).increment(1);
        result
    }

    async fn dispatch_inner(&self, claim: &Claim) -> Result<Dispatched, Crash> {
        let (row, token) = (&claim.row, claim.token.as_str());
        let action: Action = match serde_json::from_value(row.action.clone()) {
            Ok(a) => a,
            Err(e) => return self.bury(row, token, &format!("unreadable action: {e}")).await,
        };
        match self.store.check_claim(&row.id, token, self.clock.now()).await {
            Ok(()) => {}
            Err(ClaimError::Stale(_)) => return Ok(Dispatched::Stale),
            Err(ClaimError::Store(e)) => return Ok(Dispatched::Unsettled(format!("claim check failed: {e}"))),
        }
        let sent = self.apply(row, &action).await;
        self.faults.check(FaultPoint::AfterSend, &row.id)?;
        match sent {
            Ok(receipt) => {
                let outcome = outcome(row, row.action_type, OutcomeStatus::Delivered, Some(receipt.clone()), None);
                if self.faults.bugs.mark_before_publish {
                    let marked = self.mark_dispatched(row, token, &receipt).await;
                    self.faults.check(FaultPoint::AfterMark, &row.id)?;
                    let _ = self.publish(row, outcome).await;
                    return Ok(marked);
                }
                if self.queue_mode.is_fused() {
                    return Ok(self.publish_and_mark(row, token, &receipt, outcome).await);
                }
                if let Err(e) = self.publish(row, outcome).await {
                    // The effect happened but the agent cannot learn it yet: an attempt
                    // like any other (the service dedupes the resend).
                    return self.failed_attempt(row, token, &format!("publishing the outcome failed: {e}")).await;
                }
                self.faults.check(FaultPoint::AfterPublish, &row.id)?;
                let marked = self.mark_dispatched(row, token, &receipt).await;
                self.faults.check(FaultPoint::AfterMark, &row.id)?;
                Ok(marked)
            }
            Err(DeliveryError::Retryable(RetryableDeliveryError(why))) => self.failed_attempt(row, token, &why).await,
            Err(DeliveryError::Permanent(PermanentDeliveryError(why))) => self.bury(row, token, &why).await,
        }
    }

    /// The delivered outcome's publish and the mark in one transaction of the store
    /// that is also the queue: what `publish` then `mark_dispatched` do, one commit.
    async fn publish_and_mark(
        &self,
        row: &OutboxRow,
        token: &str,
        receipt: &str,
        outcome: ActionOutcome,
    ) -> Dispatched {
        let event = outcome_event(row, outcome);
        let now = self.clock.now();
        match self
            .store
            .publish_and_mark_dispatched(
                &row.id,
                token,
                receipt,
                &row.load_id,
                event.event_id.as_str(),
                &body_of(&event),
                now,
            )
            .await
        {
            Ok(_) => {
                self.wake_worker();
                self.faults.observe(Observed::Marked { outbox_id: &row.id, token });
                Dispatched::Delivered
            }
            Err(ClaimError::Stale(_)) => {
                // Published all the same, as the two steps would have.
                self.wake_worker();
                Dispatched::Stale
            }
            Err(ClaimError::Store(e)) => {
                // Nothing changed: an attempt like any other (the service dedupes the resend).
                let why = format!("publishing the outcome failed: {e}");
                self.failed_attempt(row, token, &why).await.unwrap_or_else(Dispatched::Crashed)
            }
        }
    }

    fn wake_worker(&self) {
        if let Some(w) = self.wake_worker.get() {
            w.notify_one();
        }
    }

    async fn mark_dispatched(&self, row: &OutboxRow, token: &str, receipt: &str) -> Dispatched {
        match self.store.mark_dispatched(&row.id, token, receipt, self.clock.now()).await {
            Ok(()) => {
                self.faults.observe(Observed::Marked { outbox_id: &row.id, token });
                Dispatched::Delivered
            }
            Err(ClaimError::Stale(_)) => Dispatched::Stale,
            Err(ClaimError::Store(e)) => Dispatched::Unsettled(format!("mark_dispatched failed: {e}")),
        }
    }

    /// Applies an action: timers to the TimerStore, the rest to its channel service.
    async fn apply(&self, row: &OutboxRow, action: &Action) -> Result<String, DeliveryError> {
        let now = self.clock.now();
        let store_err = |e: StoreError| DeliveryError::from(RetryableDeliveryError(e.to_string()));
        match action.kind.request(&row.load_id) {
            Request::ScheduleTimer { timer_id, fire_at } => {
                let new = self.store.schedule(&timer_id, fire_at, now).await.map_err(store_err)?;
                Ok(if new { "scheduled" } else { "already scheduled" }.into())
            }
            Request::CancelTimer { timer_id } => {
                let canceled = self.store.cancel(&timer_id, now).await.map_err(store_err)?;
                Ok(if canceled { "canceled" } else { "not scheduled" }.into())
            }
            Request::Send { channel, path, body } => {
                self.channels.get(channel).send(&row.id, &row.load_id, &path, &body, now).await
            }
        }
    }

    async fn failed_attempt(&self, row: &OutboxRow, token: &str, why: &str) -> Result<Dispatched, Crash> {
        let now = self.clock.now();
        let attempts = row.attempts + 1;
        let first = row.first_attempt_at.unwrap_or(now);
        let jitter = self.rng.lock().unwrap_or_else(|p| p.into_inner()).f64();
        match self.settings.retry.after_failure(attempts, first, now, jitter) {
            RetryDecision::RetryAt(retry_at) => {
                let failure = format!("attempt {attempts}: {why}");
                info!(attempts, %retry_at, why, "attempt failed; retrying");
                Ok(match self.store.mark_failed(&row.id, token, &failure, Some(retry_at), now).await {
                    Ok(()) => {
                        self.faults.observe(Observed::Marked { outbox_id: &row.id, token });
                        Dispatched::Retrying { retry_at }
                    }
                    Err(ClaimError::Stale(_)) => Dispatched::Stale,
                    Err(ClaimError::Store(e)) => Dispatched::Unsettled(format!("mark_failed failed: {e}")),
                })
            }
            RetryDecision::Dead(spent) => self.bury(row, token, &format!("{why} ({spent})")).await,
        }
    }

    /// Publishes the failed outcome (best effort), marks the row dead, and, once the
    /// outcome is published, raises the OpsAlert a Hero-channel or internal action
    /// calls for. An outcome that cannot be published now (a queue outage) is left to
    /// the sweep, so an outage does not page on every pass.
    async fn bury(&self, row: &OutboxRow, token: &str, why: &str) -> Result<Dispatched, Crash> {
        let now = self.clock.now();
        let published =
            match self.publish(row, outcome(row, row.action_type, OutcomeStatus::Failed, None, Some(why.into()))).await
            {
                Ok(()) => true,
                Err(e) => {
                    warn!(error = %e, "publishing the failed outcome failed; the sweep will retry it");
                    false
                }
            };
        self.faults.check(FaultPoint::AfterPublish, &row.id)?;
        match self.store.mark_failed(&row.id, token, why, None, now).await {
            Ok(()) => self.faults.observe(Observed::Marked { outbox_id: &row.id, token }),
            Err(ClaimError::Stale(_)) => return Ok(Dispatched::Stale),
            Err(ClaimError::Store(e)) => return Ok(Dispatched::Unsettled(format!("burying failed: {e}"))),
        }
        metrics::counter!("haul_outbox_dead_rows_total", "action_type" => row.action_type.as_str()).increment(1);
        warn!(why, action_type = %row.action_type, "row buried");
        self.faults.check(FaultPoint::AfterMark, &row.id)?;
        if published
            && self.alert_for(row, why).await
            && let Err(e) = self.store.mark_outcome_published(&row.id, self.clock.now()).await
        {
            warn!(error = %e, "recording the settled burial failed; the sweep repeats it (deduped)");
        }
        Ok(Dispatched::Buried)
    }

    /// The OpsAlert a dead row's class calls for; true when none is needed or it was
    /// delivered. An undelivered one leaves the row to the sweep, so alerts are
    /// at least once (the ops service dedupes by key).
    async fn alert_for(&self, row: &OutboxRow, why: &str) -> bool {
        let kind = match row.action_type.class() {
            ChannelClass::HeroChannel => "hero_channel_failure",
            ChannelClass::Internal => "internal_failure",
            ChannelClass::External => return true,
        };
        self.alert(kind, row, row.action_type, why).await
    }

    async fn publish(&self, row: &OutboxRow, outcome: ActionOutcome) -> Result<(), StoreError> {
        self.queue.publish(&outcome_event(row, outcome), self.clock.now()).await?;
        self.wake_worker();
        Ok(())
    }

    /// An OpsAlert: to the ops service (HTTP or record mode), the log and the counter.
    /// Independent of the Hero tooling, so a Hero outage cannot loop.
    async fn alert(&self, kind: &'static str, row: &OutboxRow, action_type: ActionType, failure: &str) -> bool {
        metrics::counter!("haul_ops_alerts_total", "kind" => kind).increment(1);
        error!(alert = kind, outbox_id = %row.id, load_id = %row.load_id, %action_type, failure, "OpsAlert");
        let body = json!({
            "kind": kind,
            "load_id": row.load_id,
            "outbox_id": row.id,
            "action_type": action_type,
            "failure": failure,
        });
        let key = ops_alert_key(&row.id);
        match self.channels.get(Channel::Ops).send(&key, &row.load_id, "/v1/alerts", &body, self.clock.now()).await {
            Ok(_) => true,
            Err(e) => {
                error!(error = %e, outbox_id = %row.id, "the OpsAlert could not be delivered; the sweep retries it");
                false
            }
        }
    }
}

/// The outcome as the event the load queue carries.
fn outcome_event(row: &OutboxRow, outcome: ActionOutcome) -> InboundEvent {
    let event_id = action_outcome_event_id(&row.id, outcome.status);
    InboundEvent { load_id: row.load_id.clone(), event_id, body: EventBody::ActionOutcome(outcome) }
}

fn outcome(
    row: &OutboxRow,
    action_type: ActionType,
    status: OutcomeStatus,
    receipt: Option<String>,
    failure: Option<String>,
) -> ActionOutcome {
    let class = action_type.class();
    ActionOutcome {
        outbox_id: row.id.clone(),
        action_type,
        status,
        // Bounded and cleaned as the event validator requires: a service's answer must
        // not turn the outcome into a message the worker cannot read.
        receipt: receipt.map(|r| clean(&r, 256)),
        failure: failure.map(|f| clean(&f, 2000)),
        hero_channel: class == ChannelClass::HeroChannel,
        internal: class == ChannelClass::Internal,
    }
}

fn clean(s: &str, max_chars: usize) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).take(max_chars).collect()
}
