//! The timer pump: publishes `timer_fired` for due timers (ADR 0003).
//!
//! `due(now, limit)` → publish with `timer_fired_event_id(timer_id)` → `mark_fired`.
//! A crash between publish and mark publishes twice; the queue's dedup and the event
//! store's entry ids drop the second copy. Whether the timer still matters is decided
//! later by the worker (`OpenAsk.is_timer_current`), never here.

use std::sync::Arc;

use haul_core::event::{EventBody, TimerFired};
use haul_core::ids::timer_fired_event_id;
use haul_core::time::since;
use haul_core::{Clock, InboundEvent};
use haul_store::{LoadQueue, Store, StoreError};
use tracing::{debug, warn};

use crate::faults::{Crash, FaultPoint, Faults};
use crate::queue::EventQueue;

pub struct TimerPump {
    store: Arc<dyn Store>,
    queue: EventQueue,
    clock: Arc<dyn Clock>,
    faults: Faults,
    /// Timers fired per poll at most.
    batch: usize,
    wake_worker: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
}

/// What one poll did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PumpRound {
    pub fired: usize,
    pub crashed: Option<Crash>,
}

impl TimerPump {
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn LoadQueue>,
        clock: Arc<dyn Clock>,
        faults: Faults,
        batch: usize,
    ) -> Self {
        TimerPump {
            store,
            queue: EventQueue::new(queue),
            clock,
            faults,
            batch: batch.max(1),
            wake_worker: std::sync::OnceLock::new(),
        }
    }

    /// Wakes `worker` whenever a `timer_fired` is published.
    pub fn wake_on_publish(&self, worker: Arc<tokio::sync::Notify>) {
        let _ = self.wake_worker.set(worker);
    }

    pub async fn run_once(&self) -> Result<PumpRound, StoreError> {
        let now = self.clock.now();
        let due = self.store.due(now, self.batch).await?;
        let mut round = PumpRound::default();
        for timer in due {
            let (_, ask_id, step) = timer.timer_id.parts();
            if self.faults.bugs.timer_never_pumped && step >= 2 {
                continue;
            }
            let event = InboundEvent {
                load_id: timer.load_id.clone(),
                event_id: timer_fired_event_id(&timer.timer_id),
                body: EventBody::TimerFired(TimerFired {
                    timer_id: timer.timer_id.clone(),
                    ask_id,
                    step,
                    fire_at: timer.fire_at,
                }),
            };
            // With the context of the run that set the timer: the firing continues it.
            if let Err(e) = self.queue.publish_traced(&event, timer.trace, now).await {
                warn!(error = %e, timer_id = %timer.timer_id, "publishing timer_fired failed; the next poll retries");
                break;
            }
            if let Err(crash) = self.faults.check(FaultPoint::AfterPumpPublish, timer.timer_id.as_str()) {
                round.crashed = Some(crash);
                return Ok(round);
            }
            self.store.mark_fired(&timer.timer_id, now).await?;
            let lag = since(now, timer.fire_at).as_secs_f64();
            metrics::histogram!("haul_timer_pump_lag_seconds").record(lag);
            metrics::gauge!("haul_timer_pump_last_lag_seconds").set(lag);
            debug!(timer_id = %timer.timer_id, lag_s = lag, "timer fired");
            round.fired += 1;
            if let Some(w) = self.wake_worker.get() {
                w.notify_one();
            }
        }
        Ok(round)
    }
}
