//! The worker, the dispatcher and the timer pump, wired from one config.
//!
//! `serve` runs them as loops; evals and tests step them to quiescence on a fake clock
//! (ADR 0003: "advance the clock, pump timers, process the queue, dispatch the outbox").
//! Both use the same objects and the same code.

use std::sync::Arc;

use anyhow::bail;
use haul_core::timers::TimerRoute;
use haul_core::{Clock, QueueMode};
use haul_store::{LoadQueue, Store};

use crate::channels::Channels;
use crate::decider::{Decider, SopDecider};
use crate::dispatcher::{Dispatched, Dispatcher, DispatcherSettings};
use crate::faults::Faults;
use crate::pump::TimerPump;
use crate::worker::{RunOutcome, Worker, WorkerSettings};
use haul_config::{Config, policies};

/// Rounds of pump + worker + dispatcher before `run_until_quiet` gives up: a pipeline
/// that is still moving after this many is looping.
pub const MAX_ROUNDS: usize = 1000;

pub struct Pipeline {
    pub worker: Arc<Worker>,
    pub dispatcher: Arc<Dispatcher>,
    pub pump: Arc<TimerPump>,
}

/// What moved in one round.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub fired: usize,
    pub runs: Vec<RunOutcome>,
    pub dispatched: Vec<Dispatched>,
}

impl Round {
    pub fn moved(&self) -> bool {
        self.fired > 0 || !self.runs.is_empty() || !self.dispatched.is_empty()
    }
}

pub struct Parts {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn LoadQueue>,
    /// `StoreQueue` when `queue` is `store` itself.
    pub queue_mode: QueueMode,
    pub channels: Channels,
    pub clock: Arc<dyn Clock>,
    pub faults: Faults,
    /// Seeds the dispatcher's jitter and makes its batches sequential (a seeded run
    /// repeats exactly); `None` draws from the OS and sends a batch at once.
    pub seed: Option<u64>,
}

impl Pipeline {
    /// The SOP decider (or the one given) with the config's settings; timers committed
    /// with their decision (the store is the TimerStore).
    pub fn new(config: &Config, parts: Parts, decider: Option<Arc<dyn Decider>>) -> Self {
        Pipeline::with_timers(config, parts, decider, TimerRoute::WithDecision)
    }

    /// `new`, with the decisions' timers written where `timers` says.
    pub fn with_timers(config: &Config, parts: Parts, decider: Option<Arc<dyn Decider>>, timers: TimerRoute) -> Self {
        let decider = decider.unwrap_or_else(|| Arc::new(SopDecider { policies: policies(&config.clients) }));
        let Parts { store, queue, queue_mode, channels, clock, faults, seed } = parts;
        let worker = WorkerSettings {
            concurrency: config.worker.concurrency,
            conflict_retries: config.worker.conflict_retries,
            run_timeout: config.worker.run_timeout,
            decider_timeout: config.decider.llm.timeout,
            visibility: config.visibility(),
            load_lock: config.load_lock.enabled,
            timers,
            ..WorkerSettings::default()
        };
        // A seeded run repeats exactly, the log's order included: its batches' rows are
        // sent one after another, so their outcomes reach the queue in claim order
        // rather than in the order concurrent sends happen to end.
        let dispatcher = DispatcherSettings {
            jitter_seed: seed,
            sequential: seed.is_some(),
            ..DispatcherSettings::from_config(&config.dispatcher)
        }
        .with_limits(&config.channels)
        .with_weights(&config.clients);
        Pipeline {
            worker: Arc::new(Worker::new(
                store.clone(),
                queue.clone(),
                queue_mode,
                decider,
                clock.clone(),
                worker,
                faults.clone(),
            )),
            dispatcher: Arc::new(Dispatcher::new(
                store.clone(),
                queue.clone(),
                queue_mode,
                channels,
                clock.clone(),
                dispatcher,
                faults.clone(),
            )),
            pump: Arc::new(TimerPump::new(store, queue, clock, faults, 256)),
        }
    }

    /// In-process wake-ups: the worker loop wakes on a publish (API, dispatcher, pump),
    /// the dispatcher loop on a commit with outbox rows; polling stays the fallback
    /// (other processes publish and commit too).
    pub fn wakeups(&self) -> (Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
        let (work, dispatch) = (Arc::new(tokio::sync::Notify::new()), Arc::new(tokio::sync::Notify::new()));
        self.worker.wake_on_commit(dispatch.clone());
        self.dispatcher.wake_on_publish(work.clone());
        self.pump.wake_on_publish(work.clone());
        (work, dispatch)
    }

    /// The worker claims its appends' outbox rows for the dispatcher and hands them
    /// over (`Handoff`): for a process that runs both loops (`loops::worker_loop`,
    /// `loops::dispatcher_loop`), never for `round`'s, which take no handed rows.
    pub fn hand_claims_over(&self) {
        self.worker.hand_claims_to(self.dispatcher.handoff());
    }

    /// One round: pump due timers, process the queue, dispatch due rows.
    pub async fn round(&self) -> anyhow::Result<Round> {
        let fired = self.pump.run_once().await?.fired;
        let runs = self.worker.run_once().await?;
        let dispatched = self.dispatcher.run_once().await?;
        Ok(Round { fired, runs, dispatched })
    }

    /// Rounds until nothing moves at this instant; every round's work, in order.
    pub async fn run_until_quiet(&self) -> anyhow::Result<Vec<Round>> {
        let mut rounds = Vec::new();
        for _ in 0..MAX_ROUNDS {
            let r = self.round().await?;
            if !r.moved() {
                return Ok(rounds);
            }
            rounds.push(r);
        }
        bail!("the pipeline was still moving after {MAX_ROUNDS} rounds at one instant")
    }
}
