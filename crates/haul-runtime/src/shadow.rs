//! Shadow mode (`decider.shadow`): a second decider set beside the primary in a live
//! run, never in charge.
//!
//! After a run commits a decision the primary's decider made (events the filter
//! decides are not handed over: both would run the same filter), the worker offers the
//! state before the event, the event, its `seq` and the recorded decision here, and
//! goes on. The offer is a `try_send` on a bounded channel: when the shadow is behind,
//! the offer is dropped and counted (`haul_shadow_dropped_total`), so a slow or stuck
//! shadow never holds up a run. One task takes the offers in order; each decision runs
//! in a task of its own under a time limit (a panic or a late answer is an error, not
//! the task's end), is compared with the recorded one (`haul_core::replay`), and is
//! stored apart from the log ([`ShadowStore::record_shadow`]): never dispatched, never
//! read by the primary, outside the run's transaction. A failure is logged at warn and
//! counted; nothing of it reaches the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use haul_config::{Config, DeciderKind, policies};
use haul_core::decision::Decision;
use haul_core::filter::filter;
use haul_core::ids::LoadId;
use haul_core::projection::LoadState;
use haul_core::replay;
use haul_core::replay::rule_for;
use haul_core::sop::Policies;
use haul_core::{Clock, InboundEvent};
use haul_store::{ShadowDecision, ShadowStore};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::decider::{Decider, SopDecider};

/// Offers waiting for the shadow at most; past it they are dropped.
pub const SHADOW_QUEUE: usize = 256;

#[derive(Clone, Debug)]
pub struct ShadowSettings {
    /// Offers the channel holds.
    pub capacity: usize,
    /// The shadow decider's time limit per decision.
    pub timeout: Duration,
}

/// One committed decision handed to the shadow.
struct Offer {
    load: LoadId,
    before: LoadState,
    event: InboundEvent,
    event_seq: u64,
    primary: Decision,
}

/// The worker's side of shadow mode: offers decisions to the shadow task.
pub struct Shadow {
    name: String,
    tx: mpsc::Sender<Offer>,
    /// Offers the task has finished with (stored or failed), for [`Shadow::settled`].
    done: watch::Receiver<u64>,
    /// Offers taken by the channel, and offers dropped, by this `Shadow`.
    offered: AtomicU64,
    dropped: AtomicU64,
}

impl Shadow {
    /// Starts the shadow task; it ends when the `Shadow` is dropped.
    pub fn start(
        decider: Arc<dyn Decider>,
        policies: Policies,
        store: Arc<dyn ShadowStore>,
        clock: Arc<dyn Clock>,
        settings: ShadowSettings,
    ) -> Self {
        let (tx, rx) = mpsc::channel(settings.capacity.max(1));
        let (done_tx, done) = watch::channel(0);
        let name = decider.name();
        let task = Task { decider, policies, store, clock, timeout: settings.timeout };
        tokio::spawn(task.run(rx, done_tx));
        Shadow { name, tx, done, offered: AtomicU64::new(0), dropped: AtomicU64::new(0) }
    }

    /// The shadow decider's name (what its stored decisions are keyed by).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hands a committed decision to the shadow, without waiting: the event is not
    /// offered when the filter decides it; a full channel drops the offer. Returns
    /// whether it was offered.
    pub fn offer(
        &self,
        load: &LoadId,
        before: &LoadState,
        event: &InboundEvent,
        event_seq: u64,
        primary: &Decision,
    ) -> bool {
        if filter(load, before, event, primary.decided_at).is_some() {
            return false;
        }
        let offer = Offer {
            load: load.clone(),
            before: before.clone(),
            event: event.clone(),
            event_seq,
            primary: primary.clone(),
        };
        match self.tx.try_send(offer) {
            Ok(()) => {
                self.offered.fetch_add(1, Ordering::SeqCst);
                true
            }
            Err(e) => {
                self.dropped.fetch_add(1, Ordering::SeqCst);
                let reason = match e {
                    mpsc::error::TrySendError::Full(_) => "queue_full",
                    mpsc::error::TrySendError::Closed(_) => "stopped",
                };
                metrics::counter!("haul_shadow_dropped_total", "reason" => reason).increment(1);
                false
            }
        }
    }

    /// Waits until the task has finished with every offer taken so far (stored, or
    /// failed to decide or to store): for tests, which then read what it stored.
    pub async fn settled(&self) {
        let n = self.offered.load(Ordering::SeqCst);
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d >= n).await;
    }

    /// Offers the channel took, and offers dropped (a full channel), so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.offered.load(Ordering::SeqCst), self.dropped.load(Ordering::SeqCst))
    }
}

struct Task {
    decider: Arc<dyn Decider>,
    policies: Policies,
    store: Arc<dyn ShadowStore>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl Task {
    async fn run(self, mut rx: mpsc::Receiver<Offer>, done: watch::Sender<u64>) {
        while let Some(offer) = rx.recv().await {
            self.handle(offer).await;
            done.send_modify(|d| *d += 1);
        }
    }

    async fn handle(&self, o: Offer) {
        let Offer { load, before, event, event_seq, primary } = o;
        let now = primary.decided_at;
        let name = self.decider.name();
        // In a task of its own: a panicking decider is one error, not the shadow's end.
        let mut decide = {
            let (decider, load, before, event) = (self.decider.clone(), load.clone(), before.clone(), event.clone());
            tokio::spawn(async move { decider.decide(&load, &before, &event, now).await })
        };
        let answer = match tokio::time::timeout(self.timeout, &mut decide).await {
            Err(_) => {
                decide.abort(); // a late answer is not waited for
                Err(format!("did not answer within {:?}", self.timeout))
            }
            Ok(Err(join)) => Err(format!("panicked: {join}")),
            Ok(Ok(Err(e))) => Err(format!("{e:#}")),
            Ok(Ok(Ok(d))) => Ok(d),
        };
        let (agreement, decision, error) = replay::shadow_outcome(&load, &before, &event, &primary, &name, answer);
        for t in replay::action_types_of(&primary, decision.as_ref()) {
            metrics::counter!("haul_shadow_decisions_total", "action_type" => t, "agreement" => agreement.as_str())
                .increment(1);
        }
        if let Some(why) = &error {
            warn!(load_id = %load, event_id = %event.event_id, shadow = %name, why, "shadow decision failed");
        }
        let rule = rule_for(&self.policies, &load, &before, &event, now);
        let stored = ShadowDecision {
            load_id: load.clone(),
            event_id: event.event_id.to_string(),
            shadow: name.clone(),
            event_seq,
            event: event.to_json(),
            rule: serde_json::to_value(rule).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            primary: serde_json::to_value(&primary).unwrap_or_default(),
            decision: decision.as_ref().and_then(|d| serde_json::to_value(d).ok()),
            agreement,
            error,
            decided_at: now,
            recorded_at: self.clock.now(),
        };
        if let Err(e) = self.store.record_shadow(&stored).await {
            metrics::counter!("haul_shadow_dropped_total", "reason" => "store_error").increment(1);
            warn!(load_id = %load, event_id = %event.event_id, shadow = %name, error = %e, "storing a shadow decision failed");
        }
    }
}

/// The shadow decider `config.decider.shadow` names, started on `store`; `None` when
/// shadow mode is off. Its time limit is its own file's `decider.llm.timeout`, at most
/// 0.8 × this process's `worker.run_timeout` (the primary's cap).
pub fn from_config(
    config: &Config,
    store: Arc<dyn ShadowStore>,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<Option<Arc<Shadow>>> {
    let Some(shadow) = config.shadow_config()? else { return Ok(None) };
    let policies = policies(&shadow.clients);
    let decider: Arc<dyn Decider> = match shadow.decider.kind {
        DeciderKind::Sop => Arc::new(SopDecider { policies: policies.clone() }),
        DeciderKind::Llm => {
            let d = crate::llm::LlmDecider::from_config(&shadow.decider.llm, &shadow.clients)
                .map_err(|e| anyhow::anyhow!("decider.shadow: {e:#}"))?;
            Arc::new(d.masking(&crate::secrets::configured(config, std::iter::empty::<&str>())))
        }
    };
    let timeout = shadow.decider.llm.timeout.min(config.worker.run_timeout.mul_f64(0.8));
    let settings = ShadowSettings { capacity: SHADOW_QUEUE, timeout };
    let s = Shadow::start(decider, policies, store, clock, settings);
    let file = config.decider.shadow.as_deref().map(|p| p.display().to_string()).unwrap_or_default();
    info!(shadow = s.name(), file, "shadow decider on");
    Ok(Some(Arc::new(s)))
}
