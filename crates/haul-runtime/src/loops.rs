//! The long-running form of the worker, the dispatcher and the timer pump: loops that
//! take work until told to stop, waking early on in-process news and polling for the
//! rest (other processes publish and commit too).
//!
//! `haul serve` runs them per role; the benchmarks run the very same loops.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tracing::{Instrument, warn};

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

/// Waits until one of `permits` is free again (or until stopped).
async fn until_a_permit_frees(permits: &Arc<Semaphore>, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        p = permits.clone().acquire_owned() => drop(p),
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
            until_a_permit_frees(&permits, &mut stop).await;
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

/// How often the long-running dispatcher looks for dead rows left unsettled (a queue or
/// ops service that was down): they are rare, and the sweep is a read of its own.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How often a busy dispatcher claims from the start instead of after its cursor: the
/// longest a row behind the cursor (a lapsed lease, a row committed late with an
/// earlier `due_at`) waits for the claims to come back to it.
const CLAIM_FROM_START_EVERY: Duration = Duration::from_millis(100);

/// How long a busy dispatcher's claim waits for half of its batch to be free.
const CLAIM_GATHER: Duration = Duration::from_millis(2);

/// Keeps up to `dispatcher.batch` sends going: claims as many rows as sends are free,
/// so a row committed while others are at their services is claimed at once instead
/// of after the slowest send of a batch. Each send holds a permit.
pub async fn dispatcher_loop(
    dispatcher: Arc<Dispatcher>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let batch = dispatcher.settings().batch.max(1);
    let permits = Arc::new(Semaphore::new(batch));
    let mut idle_for = Duration::from_millis(10);
    let mut swept_at: Option<std::time::Instant> = None;
    // Where the last claim that filled every free place ended, and when the last claim
    // from the start ran. The rows this dispatcher holds sort before the cursor: a claim
    // after it does not pass them again (on a backlog, each claim from the start walks
    // every row in flight).
    let mut cursor: Option<haul_store::ClaimCursor> = None;
    let mut from_start_at = std::time::Instant::now();
    while !*stop.borrow() {
        if swept_at.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
            swept_at = Some(std::time::Instant::now());
            if let Err(e) = dispatcher.sweep_dead().await {
                warn!(error = %e, "settling dead rows failed");
            }
        }
        let free = permits.available_permits();
        if free == 0 {
            until_a_permit_frees(&permits, &mut stop).await;
            continue;
        }
        // Much of a claim's cost is paid per claim, not per row (on PostgreSQL it starts
        // a scan of every partition), so while most of the batch is out sending, the
        // next claim waits a moment for more sends to finish and takes their places in
        // one go. Bounded: a row waits at most `CLAIM_GATHER` longer, and only then.
        let gather = (batch / 2).max(1);
        if free < gather {
            let more = permits.clone().acquire_many_owned(gather as u32);
            let _ = tokio::time::timeout(CLAIM_GATHER, more).await;
        }
        let free = permits.available_permits();
        if free == 0 {
            continue;
        }
        let after = cursor.take().filter(|_| from_start_at.elapsed() < CLAIM_FROM_START_EVERY);
        if after.is_none() {
            from_start_at = std::time::Instant::now();
        }
        match dispatcher.claim(free, after.as_ref()).await {
            // Nothing past the cursor: claim from the start at once.
            Ok(Ok(claims)) if claims.is_empty() && after.is_some() => continue,
            Ok(Ok(claims)) if !claims.is_empty() => {
                idle_for = Duration::from_millis(10);
                // A claim that came back short reached the end of the due rows.
                if claims.len() == free {
                    cursor = haul_store::ClaimCursor::after(&claims);
                }
                for claim in claims {
                    let Ok(permit) = permits.clone().acquire_owned().await else { break };
                    let d = dispatcher.clone();
                    let span = Dispatcher::span(&claim);
                    tokio::spawn(
                        async move {
                            d.dispatch(claim).await;
                            drop(permit);
                        }
                        .instrument(span),
                    );
                }
            }
            Ok(Ok(_)) => {
                idle(idle_for, &wake, &mut stop).await;
                idle_for = (idle_for * 2).min(Duration::from_millis(500));
            }
            // A fault point (tests only) stopped the claim: its rows' leases lapse.
            Ok(Err(_crash)) => idle(idle_for, &wake, &mut stop).await,
            Err(e) => {
                warn!(error = %e, "claiming outbox rows failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
    // Let sends in flight settle their rows.
    let _ = permits.acquire_many(batch as u32).await;
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
