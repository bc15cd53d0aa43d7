//! The long-running form of the worker, the dispatcher and the timer pump: loops that
//! take work until told to stop, waking early on in-process news and polling for the
//! rest (other processes publish and commit too).
//!
//! `haul serve` runs them per role; the benchmarks run the very same loops.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tracing::warn;

use crate::dispatcher::Dispatcher;
use crate::pump::TimerPump;
use crate::worker::Worker;

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.changed() => {}
    }
}

/// Sleeps up to `d`, less when woken (new work in this process) or stopped.
async fn idle(d: Duration, wake: &tokio::sync::Notify, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = wake.notified() => {}
        _ = stop.changed() => {}
    }
}

/// Keeps up to `concurrency` runs going, one per load; each run holds a permit.
pub async fn worker_loop(
    worker: Arc<Worker>,
    concurrency: usize,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut idle_for = Duration::from_millis(10);
    while !*stop.borrow() {
        let free = permits.available_permits();
        if free == 0 {
            tokio::select! {
                p = permits.clone().acquire_owned() => drop(p),
                _ = stop.changed() => {}
            }
            continue;
        }
        match worker.receive(free).await {
            Ok(msgs) if !msgs.is_empty() => {
                idle_for = Duration::from_millis(10);
                for m in msgs {
                    let Ok(permit) = permits.clone().acquire_owned().await else { break };
                    let w = worker.clone();
                    tokio::spawn(async move {
                        w.process(m).await;
                        drop(permit);
                    });
                }
            }
            Ok(_) => {
                self::idle(idle_for, &wake, &mut stop).await;
                idle_for = (idle_for * 2).min(Duration::from_millis(250));
            }
            Err(e) => {
                warn!(error = %e, "receiving from the load queue failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
    // Let runs in flight finish (they abandon before append once stopping).
    let _ = permits.acquire_many(concurrency as u32).await;
}

pub async fn dispatcher_loop(
    dispatcher: Arc<Dispatcher>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut idle_for = Duration::from_millis(10);
    while !*stop.borrow() {
        match dispatcher.run_once().await {
            Ok(done) if !done.is_empty() => idle_for = Duration::from_millis(10),
            Ok(_) => {
                idle(idle_for, &wake, &mut stop).await;
                idle_for = (idle_for * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                warn!(error = %e, "claiming outbox rows failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
}

/// Polls at least every `poll` (at most 30 s); a full batch polls again at once.
pub async fn pump_loop(pump: Arc<TimerPump>, poll: Duration, batch: usize, mut stop: watch::Receiver<bool>) {
    let poll = poll.min(Duration::from_secs(30));
    while !*stop.borrow() {
        match pump.run_once().await {
            Ok(round) if round.fired >= batch => continue,
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reading due timers failed"),
        }
        sleep_or_stop(poll, &mut stop).await;
    }
}
