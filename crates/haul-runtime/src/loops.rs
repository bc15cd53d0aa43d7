//! The long-running form of the worker, the dispatcher and the timer pump: loops that
//! take work until told to stop, waking early on in-process news and polling for the
//! rest (other processes publish and commit too).
//!
//! `haul serve` runs them per role; the benchmarks run the very same loops.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{Instrument, warn};

use crate::dispatcher::Dispatcher;
use crate::pump::TimerPump;
use crate::worker::Worker;
use haul_store::Claim;

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

/// `idle` until `until`, woken too by work handed over in this process (a row the
/// worker claimed with its append, `dispatcher::Handoff`; a message a publisher
/// received, `queue::EventHandoff`), which it answers. The poll is a deadline, not a
/// wait: work handed over more often than the poll must not put off the claim or
/// receive that finds the work nobody wakes it for (a retry come due, a lapsed lease).
async fn idle_or_handed<T>(
    until: tokio::time::Instant,
    wake: &tokio::sync::Notify,
    handed: &mut Option<mpsc::Receiver<T>>,
    stop: &mut watch::Receiver<bool>,
) -> Option<T> {
    let handed = async {
        match handed {
            // Closed (nobody left to hand any): nothing more comes this way.
            Some(rx) => match rx.recv().await {
                Some(work) => work,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep_until(until) => None,
        _ = wake.notified() => None,
        _ = stop.changed() => None,
        work = handed => Some(work),
    }
}

/// Waits until one of `permits` is free again (or until stopped).
async fn until_a_permit_frees(permits: &Arc<Semaphore>, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        p = permits.clone().acquire_owned() => drop(p),
        _ = stop.changed() => {}
    }
}

/// What the worker loop does after a receive that took some messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterReceive {
    /// Receive again at once: there may be more waiting.
    Receive,
    /// Wait to be woken (a publish in this process, another process's `NOTIFY`) or for
    /// the poll: the receive took every message it could.
    Wait,
}

/// After a receive that answered `got` of the `asked` messages: a short answer from a
/// queue whose short answer means drained (`LoadQueue::short_receive_drains`) waits,
/// as an empty one does; asked again at once, it would only come back empty (at one
/// caller on PostgreSQL, two empty receives a unit). A publish made meanwhile wakes the
/// loop (`Notify` keeps the wake-up for a waiter to come). A full answer, or a short one
/// from SQS, receives again.
fn after_receive(got: usize, asked: usize, drains: bool) -> AfterReceive {
    if drains && got < asked { AfterReceive::Wait } else { AfterReceive::Receive }
}

/// Keeps up to `concurrency` runs going, one per load; each run holds a permit. Runs
/// the messages this process's publishers received for it (`Worker::event_handoff`)
/// first: they are leased already. Receives when woken (a publish not handed over,
/// another process's `NOTIFY`), after a full receive, and at each poll; a message handed
/// over does not call for a receive, so a caught-up worker fed by its own process sends
/// no statement between runs.
pub async fn worker_loop(
    worker: Arc<Worker>,
    concurrency: usize,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(concurrency));
    let run = |m, permit| {
        let w = worker.clone();
        tokio::spawn(async move {
            w.process(m).await;
            drop(permit);
        });
    };
    let mut idle_for = Duration::from_millis(10);
    let drains = worker.short_receive_drains();
    let mut handed = worker.take_handed_events();
    // When to receive next: `None` at once, else (caught up) at this poll.
    let mut receive_at: Option<tokio::time::Instant> = None;
    while !*stop.borrow() {
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            until_a_permit_frees(&permits, &mut stop).await;
            continue;
        };
        if let Some(m) = handed.as_mut().and_then(|h| h.try_recv().ok()) {
            run(m, permit);
            continue;
        }
        if let Some(at) = receive_at.filter(|at| tokio::time::Instant::now() < *at) {
            drop(permit);
            match idle_or_handed(at, &wake, &mut handed, &mut stop).await {
                Some(m) => {
                    // Free at once: the loop alone takes permits, and it had one.
                    let Ok(permit) = permits.clone().acquire_owned().await else { break };
                    run(m, permit);
                }
                None => receive_at = None,
            }
            continue;
        }
        drop(permit);
        let free = permits.available_permits();
        match worker.receive(free).await {
            Ok(msgs) if !msgs.is_empty() => {
                idle_for = Duration::from_millis(10);
                let next = after_receive(msgs.len(), free, drains);
                for m in msgs {
                    let Ok(permit) = permits.clone().acquire_owned().await else { break };
                    run(m, permit);
                }
                receive_at = (next == AfterReceive::Wait).then(|| tokio::time::Instant::now() + idle_for);
            }
            Ok(_) => {
                receive_at = Some(tokio::time::Instant::now() + idle_for);
                idle_for = (idle_for * 2).min(Duration::from_millis(250));
            }
            Err(e) => {
                warn!(error = %e, "receiving from the load queue failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
    // Messages handed over and not run yet run now: stopping, each gives its message
    // back at once (`Worker::stop`). The channel is closed first, so none comes after;
    // `recv` ends only once publishers holding room have sent (or dropped) theirs.
    if let Some(mut h) = handed {
        h.close();
        while let Some(m) = h.recv().await {
            let Ok(permit) = permits.clone().acquire_owned().await else { break };
            run(m, permit);
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

/// How long, by the rate its sends have been finishing, a row a busy dispatcher claims
/// ahead of a free send should wait for one. Much of a claim's cost is paid per claim,
/// not per row (on PostgreSQL it starts a scan of every partition), so each claim of a
/// busy dispatcher also takes the rows it will start within this horizon, in one go,
/// instead of one claim per send that frees. At 30 ms a busy dispatcher's claims come
/// back full (`dispatcher.batch`). With 4 dispatchers on one PostgreSQL, claims of a
/// 10 ms horizon took 21 rows each on average; at 30 ms the server spent a sixth less
/// on claims for the same rows.
const CLAIM_AHEAD: Duration = Duration::from_millis(30);

/// The rows to claim ahead of free sends: as many as finished, at the rate of the
/// `finished` sends in `elapsed`, within `CLAIM_AHEAD`. Slow sends claim none ahead, so a
/// row is not held behind them while another dispatcher could send it.
fn claim_ahead(finished: usize, elapsed: Duration) -> usize {
    if elapsed.is_zero() {
        return 0;
    }
    (finished as f64 * CLAIM_AHEAD.as_secs_f64() / elapsed.as_secs_f64()) as usize
}

/// Keeps up to `dispatcher.in_flight` sends going: claims as many rows as sends are
/// free and, on top of them, the rows it will start within `CLAIM_AHEAD` (they wait
/// for a permit in claim order), at most `dispatcher.batch` per claim, so a row
/// committed while others are at their services is claimed at once instead of after the
/// slowest send of a batch. Each send holds a permit.
pub async fn dispatcher_loop(
    dispatcher: Arc<Dispatcher>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let batch = dispatcher.settings().batch.max(1);
    let in_flight = dispatcher.settings().in_flight.max(1);
    let permits = Arc::new(Semaphore::new(in_flight));
    let mut idle_for = Duration::from_millis(10);
    let mut swept_at: Option<std::time::Instant> = None;
    // Where the last claim that took every row it asked for ended, and when the last
    // claim from the start ran. The rows this dispatcher holds sort before the cursor: a
    // claim after it does not pass them again (on a backlog, each claim from the start
    // walks every row in flight).
    let mut cursor: Option<haul_store::ClaimCursor> = None;
    let mut from_start_at = std::time::Instant::now();
    // Rows claimed ahead of a free send, in claim order; sends finished so far, and
    // the count and time at the last claim (the rate `claim_ahead` goes by).
    let mut ahead: VecDeque<Claim> = VecDeque::new();
    let finished = Arc::new(AtomicUsize::new(0));
    let mut last_claim = (std::time::Instant::now(), 0usize);
    // A claim from the start that came back short took every row due: the next one is
    // committed later, and its commit wakes this loop (or the poll finds it). Claiming
    // again at once would only come back empty (on PostgreSQL, a walk of every
    // partition's index for nothing).
    let mut caught_up = false;
    // Rows this process's worker claimed with their append and handed over, and those
    // taken from the channel, not yet admitted (`Dispatcher::take_handed_over`).
    let mut handed = dispatcher.take_handed();
    let mut handed_in: Vec<Claim> = Vec::new();
    // When a caught-up loop claims again, whatever is handed over meanwhile.
    let mut poll_at: Option<tokio::time::Instant> = None;
    dispatcher.warm_up().await;
    let send = |claim: Claim, permit| {
        let (d, finished) = (dispatcher.clone(), finished.clone());
        let span = Dispatcher::span(&claim);
        tokio::spawn(
            async move {
                d.dispatch(claim).await;
                finished.fetch_add(1, Ordering::Relaxed);
                drop(permit);
            }
            .instrument(span),
        );
    };
    while !*stop.borrow() {
        if swept_at.is_none_or(|at| at.elapsed() >= SWEEP_EVERY) {
            swept_at = Some(std::time::Instant::now());
            if let Err(e) = dispatcher.sweep_dead().await {
                warn!(error = %e, "settling dead rows failed");
            }
        }
        // Taken only while few rows wait for a send: behind slow sends the channel
        // fills, the worker finds no room and writes its rows unclaimed, and claims
        // take them at the rate sends finish (`claim_ahead`), leases not ticking away.
        if let Some(rx) = handed.as_mut()
            && ahead.len() < batch
        {
            while handed_in.len() < batch {
                let Ok(claim) = rx.try_recv() else { break };
                handed_in.push(claim);
            }
        }
        if !handed_in.is_empty() {
            // Handed over, as a claim's rows: admitted, then sent as permits free.
            match dispatcher.take_handed_over(std::mem::take(&mut handed_in)).await {
                Ok(Ok((c, holds))) => {
                    ahead.extend(c.claims);
                    while !ahead.is_empty() {
                        let Ok(permit) = permits.clone().try_acquire_owned() else { break };
                        send(ahead.pop_front().expect("a row ahead"), permit);
                    }
                    dispatcher.hold(holds).await;
                }
                // A fault point (tests only): their leases lapse.
                Ok(Err(_crash)) => {}
                Err(e) => warn!(error = %e, "admitting the rows handed over failed; their leases will lapse"),
            }
            continue;
        }
        // A row claimed ahead goes out as soon as a send frees.
        if !ahead.is_empty() {
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => p,
                _ = stop.changed() => continue,
            };
            let (Ok(permit), Some(claim)) = (permit, ahead.pop_front()) else { break };
            send(claim, permit);
            continue;
        }
        if caught_up {
            // Rows handed over leave it caught up: they were claimed with their append,
            // and a claim now would come back empty. A wake-up (rows committed unclaimed)
            // or the poll claims again.
            let until = *poll_at.get_or_insert_with(|| tokio::time::Instant::now() + idle_for);
            match idle_or_handed(until, &wake, &mut handed, &mut stop).await {
                Some(claim) => handed_in.push(claim),
                None => (caught_up, poll_at) = (false, None),
            }
            continue;
        }
        let free = permits.available_permits();
        let done = finished.load(Ordering::Relaxed);
        let want = (free + claim_ahead(done - last_claim.1, last_claim.0.elapsed())).min(batch);
        if want == 0 {
            until_a_permit_frees(&permits, &mut stop).await;
            continue;
        }
        last_claim = (std::time::Instant::now(), done);
        let after = cursor.take().filter(|_| from_start_at.elapsed() < CLAIM_FROM_START_EVERY);
        if after.is_none() {
            from_start_at = std::time::Instant::now();
        }
        match dispatcher.claim_holding_later(want, after.as_ref()).await {
            // Nothing past the cursor: claim from the start at once.
            Ok(Ok((c, _))) if c.took() == 0 && after.is_some() => continue,
            // Rows taken, even if all were held back by a rate: claim again at once
            // (a burst's held rows are not an idle store).
            Ok(Ok((c, holds))) if c.took() > 0 => {
                idle_for = Duration::from_millis(10);
                // A claim that came back short reached the end of the due rows.
                if c.took() == want {
                    cursor = haul_store::ClaimCursor::after(&c.claims);
                } else {
                    caught_up = after.is_none();
                }
                ahead.extend(c.claims);
                // The rows a send rate let go start before the others are held back:
                // their permits were taken for now.
                while !ahead.is_empty() {
                    let Ok(permit) = permits.clone().try_acquire_owned() else { break };
                    send(ahead.pop_front().expect("a row ahead"), permit);
                }
                dispatcher.hold(holds).await;
            }
            Ok(Ok(_)) => {
                let until = tokio::time::Instant::now() + idle_for;
                match idle_or_handed(until, &wake, &mut handed, &mut stop).await {
                    // Caught up still, until the poll it was waiting for.
                    Some(claim) => {
                        handed_in.push(claim);
                        (caught_up, poll_at) = (true, Some(until));
                    }
                    None => idle_for = (idle_for * 2).min(Duration::from_millis(500)),
                }
            }
            // A fault point (tests only) stopped the claim: its rows' leases lapse.
            Ok(Err(_crash)) => idle(idle_for, &wake, &mut stop).await,
            Err(e) => {
                warn!(error = %e, "claiming outbox rows failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
    // Rows claimed ahead are this dispatcher's until their leases lapse: send them (the
    // ones handed over too, admitted first), and let every send in flight settle its row.
    if let Some(mut rx) = handed.take() {
        rx.close();
        while let Ok(claim) = rx.try_recv() {
            handed_in.push(claim);
        }
    }
    if !handed_in.is_empty()
        && let Ok(Ok((c, holds))) = dispatcher.take_handed_over(handed_in).await
    {
        ahead.extend(c.claims);
        dispatcher.hold(holds).await;
    }
    while let Some(claim) = ahead.pop_front() {
        let Ok(permit) = permits.clone().acquire_owned().await else { break };
        send(claim, permit);
    }
    let _ = permits.acquire_many(in_flight as u32).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `(sends finished, since the last claim in ms)` → rows claimed ahead.
    fn check(finished: usize, elapsed_ms: u64, expected: usize) {
        assert_eq!(claim_ahead(finished, Duration::from_millis(elapsed_ms)), expected, "{finished} in {elapsed_ms} ms");
    }

    #[test]
    fn rows_are_claimed_ahead_by_the_rate_sends_finish() {
        check(32, 10, 96); // fast sends: what will start within the horizon
        check(32, 40, 24);
        check(3, 1_000, 0); // slow sends: none held behind them
        check(0, 10, 0);
        check(5, 0, 0); // no time has passed: no rate yet
    }

    #[test]
    fn a_short_receive_waits_only_where_short_means_drained() {
        let check = |got, asked, drains, expected| {
            assert_eq!(after_receive(got, asked, drains), expected, "{got} of {asked}, drains {drains}");
        };
        check(1, 16, true, AfterReceive::Wait);
        check(15, 16, true, AfterReceive::Wait);
        check(16, 16, true, AfterReceive::Receive); // full: more may wait
        check(1, 16, false, AfterReceive::Receive); // SQS answers short with more waiting
        check(16, 16, false, AfterReceive::Receive);
    }
}
