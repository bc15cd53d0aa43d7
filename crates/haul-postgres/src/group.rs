//! Group commit: the committers, the only writers of appends, of publishes to the
//! store's load queue and of the dispatcher's publish-and-mark.
//!
//! Callers hand a unit (one append, one publish, one publish-and-mark) to a bounded channel and wait
//! for its answer. A committer owns one connection; it takes the units waiting, up to
//! `MAX_BATCH`, into one transaction and runs each in its own savepoint: a unit that
//! fails (a version conflict, a duplicate entry or action key, a stale claim) rolls back
//! to its savepoint alone, and its neighbours commit. Every unit is answered only after
//! the `COMMIT`; a failed `COMMIT` (or a connection lost mid-batch) fails every unit of
//! the batch with a `StoreError`, so nobody sees a success that did not commit. One WAL
//! flush serves the batch, with the server's `synchronous_commit` as configured.
//!
//! Statements are pipelined (issued together on the connection) where their order
//! allows. An append sends all of its statements at once (one round trip) and is only
//! kept when every check passed; any other answer rolls it back to its savepoint and
//! it runs again alone after the batch, step by step, so its answer (a conflict, a
//! duplicate) is exact, as of after the batch. A batch goes out in waves
//! (`run_batch`): the units that take one round trip each are sent together, each
//! behind a savepoint nested in the one before, so a wave of 64 units costs one round
//! trip, not 64. When a unit of a wave is not kept, the wave rolls back to its
//! savepoint, and the units sent after it (which ran on its effects) run again in the
//! next wave.
//!
//! A batch never waits on a lock another transaction holds: it runs with a short
//! `lock_timeout`, and a unit that hits it (or a deadlock) rolls back to its savepoint
//! and runs again after the batch, alone in a transaction of its own, exactly as it
//! would without grouping (waiting for the other writer's commit). So a batch is never
//! held up by another process's writes, and two batches cannot deadlock each other.

use std::sync::{Arc, OnceLock};

use deadpool_postgres::{Object, Pool, Transaction};
use haul_core::ids::LoadId;
use haul_store::{AppendError, ClaimError, NewEntry, NewOutboxRow, Published, StoreError};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::error::SqlState;

use crate::{pg, pool_client};

/// Units per transaction at most: bounds what one failed commit takes down and how
/// long the batch's first unit waits.
pub const MAX_BATCH: usize = 64;
/// Units waiting for a committer at most; callers wait beyond it.
const QUEUE_LEN: usize = 4096;
/// How long a batch's statement may wait for a row lock before its unit is put off to
/// run alone.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '20ms'";

/// Why a unit's statements stopped.
pub(crate) enum Fail<E> {
    /// The unit's answer: a typed error, or a `StoreError`.
    Typed(E),
    /// A lock wait timed out or deadlocked: run the unit again on its own.
    Busy(tokio_postgres::Error),
    /// An append's one-round-trip form met anything but success: run the unit again on
    /// its own, step by step, for its exact answer (`append_body`).
    Again,
}

impl<E: From<StoreError>> Fail<E> {
    /// The answer when there is no batch to put the unit off from.
    pub(crate) fn into_err(self) -> E {
        match self {
            Fail::Typed(e) => e,
            Fail::Busy(e) => E::from(pg(e)),
            Fail::Again => E::from(StoreError::new("an append's one-round-trip form ran outside a batch")),
        }
    }

    pub(crate) fn typed(e: impl Into<E>) -> Self {
        Fail::Typed(e.into())
    }

    pub(crate) fn store(e: impl Into<StoreError>) -> Self {
        Fail::Typed(E::from(e.into()))
    }
}

/// A driver error as a unit's failure.
pub(crate) fn db<E: From<StoreError>>(e: tokio_postgres::Error) -> Fail<E> {
    match e.code() {
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::T_R_DEADLOCK_DETECTED => Fail::Busy(e),
        _ => Fail::Typed(E::from(pg(e))),
    }
}

/// An append's arguments, owned so the unit can travel to a committer.
pub(crate) struct AppendArgs {
    pub load_id: LoadId,
    pub entries: Vec<NewEntry>,
    pub expected_version: u64,
    pub outbox: Vec<NewOutboxRow>,
    pub receipt: Option<String>,
    pub now: i64,
}

/// `publish_and_mark_dispatched`'s arguments.
pub(crate) struct PublishMarkArgs {
    pub id: String,
    pub token: String,
    pub receipt: String,
    pub load_id: String,
    pub event_id: String,
    pub body: String,
    pub now: i64,
}

/// `LoadQueue::publish`'s arguments.
pub(crate) struct PublishArgs {
    pub load_id: String,
    pub event_id: String,
    pub body: String,
    pub now: i64,
}

/// What becomes of a unit's savepoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    /// Released: its changes commit with the batch.
    Keep,
    /// Rolled back; it is answered with its error.
    Undo,
    /// Rolled back; it runs again alone after the batch.
    Defer,
}

type Reply<T, E> = oneshot::Sender<Result<T, E>>;

enum Job {
    Append {
        args: AppendArgs,
        out: Option<Result<(u64, bool), AppendError>>,
        reply: Reply<(u64, bool), AppendError>,
    },
    PublishMark {
        args: PublishMarkArgs,
        out: Option<Result<Published, ClaimError>>,
        reply: Reply<Published, ClaimError>,
    },
    Publish {
        args: PublishArgs,
        out: Option<Result<Published, StoreError>>,
        reply: Reply<Published, StoreError>,
    },
}

/// How a unit ran: its savepoint's fate and its answer (unless it is put off).
fn settle<T, E>(r: Result<(T, bool), Fail<E>>) -> (Step, Option<Result<T, E>>) {
    match r {
        Ok((v, true)) => (Step::Keep, Some(Ok(v))),
        Ok((v, false)) => (Step::Undo, Some(Ok(v))),
        Err(Fail::Typed(e)) => (Step::Undo, Some(Err(e))),
        Err(Fail::Busy(_) | Fail::Again) => (Step::Defer, None),
    }
}

impl Job {
    /// Whether the unit's statements all go out in one round trip (its `run`, first
    /// polled after `prepare`, sends every one of them before it waits): such units
    /// share a wave.
    fn one_trip(&self) -> bool {
        match self {
            Job::Append { args, .. } => crate::impls::append_is_one_trip(args),
            Job::PublishMark { .. } | Job::Publish { .. } => true,
        }
    }

    /// Prepares the statements `run` uses, so that its prepares are cache hits that do
    /// not wait (after a connection's first batch this prepares nothing). Outside the
    /// batch's transaction: a statement that fails to prepare (a store on an older
    /// schema) aborts no transaction, and its unit runs alone in its savepoint, where it
    /// meets the error again and answers with it.
    async fn prepare(&self, client: &Object) -> bool {
        match self {
            Job::Append { args, .. } => {
                crate::impls::AppendStatements::prepare::<AppendError>(client, args).await.is_ok()
            }
            Job::PublishMark { .. } => {
                client.prepare_cached(crate::sql::OUTBOX_MARK_DISPATCHED).await.is_ok()
                    && client.prepare_cached(crate::sql::QUEUE_PUBLISH).await.is_ok()
            }
            Job::Publish { .. } => client.prepare_cached(crate::sql::QUEUE_PUBLISH).await.is_ok(),
        }
    }

    async fn run(&mut self, tx: &Transaction<'_>) -> Step {
        match self {
            Job::Append { args, out, .. } => {
                let (step, o) = settle(crate::impls::append_body(tx, args, true).await.map(|v| (v, true)));
                *out = o;
                step
            }
            Job::PublishMark { args, out, .. } => {
                // The publish stands even when the mark finds its claim stale, as it
                // would have as a step of its own: the savepoint is kept either way.
                let r = crate::impls::publish_mark_body(tx, args).await;
                let (step, o) = match r {
                    Ok(answer) => (Step::Keep, Some(answer)),
                    Err(f) => settle::<Published, ClaimError>(Err(f)),
                };
                *out = o;
                step
            }
            Job::Publish { args, out, .. } => {
                let r = crate::impls::publish_in(tx, &args.load_id, &args.event_id, &args.body, args.now).await;
                let (step, o) = settle(r.map(|p| (p, true)));
                *out = o;
                step
            }
        }
    }

    /// Answers the caller once the batch's transaction ended; a unit put off runs alone.
    fn finish(self, commit: &Result<(), StoreError>, deferred: bool, pool: &Pool) {
        fn answer<T, E: From<StoreError>>(out: Option<Result<T, E>>, commit: &Result<(), StoreError>) -> Result<T, E> {
            match (out, commit) {
                (Some(Ok(_)), Err(e)) => Err(E::from(e.clone())),
                (Some(out), _) => out,
                (None, Err(e)) => Err(E::from(e.clone())),
                (None, Ok(())) => Err(E::from(StoreError::new("store operation did not run"))),
            }
        }
        /// Runs a unit put off alone, off the committer, and answers with that.
        fn alone<T: Send + 'static, E: Send + 'static>(
            reply: Reply<T, E>,
            run: impl Future<Output = Result<T, E>> + Send + 'static,
        ) {
            tokio::spawn(async move {
                let _ = reply.send(run.await);
            });
        }
        match self {
            Job::Append { args, reply, .. } if deferred => {
                let pool = pool.clone();
                alone(reply, async move { crate::impls::append_solo(&pool, &args).await })
            }
            Job::PublishMark { args, reply, .. } if deferred => {
                let pool = pool.clone();
                alone(reply, async move { crate::impls::publish_mark_solo(&pool, &args).await })
            }
            Job::Publish { args, reply, .. } if deferred => {
                let pool = pool.clone();
                alone(reply, async move { crate::impls::publish_solo(&pool, &args).await })
            }
            Job::Publish { out, reply, .. } => {
                let _ = reply.send(answer(out, commit));
            }
            Job::Append { out, reply, .. } => {
                let _ = reply.send(answer(out, commit));
            }
            Job::PublishMark { out, reply, .. } => {
                let _ = reply.send(answer(out, commit));
            }
        }
    }
}

/// The committers of one store, started on first use.
pub(crate) struct Group {
    pool: Pool,
    committers: usize,
    sender: OnceLock<mpsc::Sender<Job>>,
}

impl Group {
    pub(crate) fn new(pool: Pool, committers: usize) -> Self {
        Group { pool, committers: committers.max(1), sender: OnceLock::new() }
    }

    fn sender(&self) -> &mpsc::Sender<Job> {
        self.sender.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE_LEN);
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..self.committers {
                let (pool, rx) = (self.pool.clone(), rx.clone());
                // A committer that panics loses its batch (those callers get an error,
                // their reply dropped); another takes its place, so the store keeps
                // writing, as the SQLite writer survives a panicking unit.
                tokio::spawn(async move {
                    while let Err(e) = tokio::spawn(committer(pool.clone(), rx.clone())).await {
                        if !e.is_panic() {
                            return;
                        }
                        tracing::error!("a PostgreSQL committer panicked; its batch failed and a new one takes over");
                    }
                });
            }
            tx
        })
    }

    async fn submit<T, E: From<StoreError>>(&self, job: Job, rx: oneshot::Receiver<Result<T, E>>) -> Result<T, E> {
        if self.sender().send(job).await.is_err() {
            return Err(E::from(StoreError::new("the PostgreSQL committers have stopped")));
        }
        rx.await.unwrap_or_else(|_| Err(E::from(StoreError::new("a PostgreSQL committer dropped a unit"))))
    }

    pub(crate) async fn append(&self, args: AppendArgs) -> Result<(u64, bool), AppendError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Append { args, out: None, reply }, rx).await
    }

    pub(crate) async fn publish(&self, args: PublishArgs) -> Result<Published, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Publish { args, out: None, reply }, rx).await
    }

    pub(crate) async fn publish_mark(&self, args: PublishMarkArgs) -> Result<Published, ClaimError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::PublishMark { args, out: None, reply }, rx).await
    }
}

async fn committer(pool: Pool, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    let mut conn: Option<Object> = None;
    loop {
        let mut batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        let mut steps = Vec::with_capacity(batch.len());
        let commit = run_batch(&pool, &mut conn, &mut batch, &mut steps).await;
        if commit.is_err() {
            // A lost or confused session: close it; the next batch connects afresh.
            if let Some(c) = conn.take() {
                drop(Object::take(c));
            }
        }
        let mut steps = steps.into_iter();
        for job in batch {
            let deferred = steps.next() == Some(Step::Defer);
            job.finish(&commit, deferred, &pool);
        }
    }
}

/// Runs `batch` in one transaction, in waves: a wave is the longest run of one-trip
/// units from where the last one stopped (or one unit that needs more round trips),
/// each unit behind a savepoint of its own, nested in the one before, and every
/// statement of the wave sent together, so a wave costs one round trip, not one per
/// unit. The first unit of a wave that is not kept ends it: the wave rolls back to that
/// unit's savepoint, which undoes it and every unit after it (which ran on its
/// effects), and the next wave starts after it. So each unit's answer is the one it
/// would have had run one after another, as before the waves.
async fn run_batch(
    pool: &Pool,
    conn: &mut Option<Object>,
    batch: &mut [Job],
    steps: &mut Vec<Step>,
) -> Result<(), StoreError> {
    if conn.is_none() {
        *conn = Some(pool_client(pool).await?);
    }
    let Some(client) = conn.as_mut() else { return Err(StoreError::new("no PostgreSQL connection")) };
    let mut shares_a_wave = Vec::with_capacity(batch.len());
    for job in batch.iter() {
        shares_a_wave.push(job.one_trip() && job.prepare(client).await);
    }
    let tx = client.transaction().await.map_err(pg)?;
    let mut prefix = format!("{LOCK_TIMEOUT}; ");
    let mut start = 0;
    while start < batch.len() {
        let end = start + shares_a_wave[start..].iter().take_while(|s| **s).count().max(1);
        let units = batch[start..end].iter_mut().enumerate().map(|(k, job)| {
            let savepoint = format!("{}SAVEPOINT u{}", if k == 0 { prefix.as_str() } else { "" }, start + k);
            let tx = &tx;
            async move {
                let (made, step) = tokio::join!(tx.batch_execute(&savepoint), job.run(tx));
                (made, step)
            }
        });
        let ran = in_order(units.collect()).await;
        prefix.clear();
        let mut next = end;
        for (k, (made, step)) in ran.into_iter().enumerate() {
            made.map_err(pg)?;
            steps.push(step);
            if step != Step::Keep {
                tx.batch_execute(&format!("ROLLBACK TO u{}", start + k)).await.map_err(pg)?;
                next = start + k + 1;
                break;
            }
        }
        start = next;
    }
    tx.commit().await.map_err(pg)
}

/// Runs `futures` to the end, polling them in their order each time: the first poll of
/// each sends its statements, so they go out on the connection in this order.
async fn in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (f, out) in futures.iter_mut().zip(outs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        if waiting { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outs.into_iter().flatten().collect()
}

#[cfg(feature = "testing")]
impl crate::PgStore {
    /// Runs `units` (load, entries, expected version, outbox rows) as ONE committer
    /// batch, in this order, on a connection of its own: what a committer does with the
    /// units it found waiting, without depending on how many were waiting. For tests.
    pub async fn append_one_batch(
        &self,
        units: Vec<(LoadId, Vec<NewEntry>, u64, Vec<NewOutboxRow>)>,
        now: haul_core::time::Timestamp,
    ) -> Vec<Result<u64, AppendError>> {
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        for (load_id, entries, expected_version, outbox) in units {
            let (reply, rx) = oneshot::channel();
            let now = haul_core::time::to_ms(now);
            let args = AppendArgs { load_id, entries, expected_version, outbox, receipt: None, now };
            batch.push(Job::Append { args, out: None, reply });
            answers.push(rx);
        }
        let (mut conn, mut steps) = (None, Vec::new());
        let commit = run_batch(&self.pool, &mut conn, &mut batch, &mut steps).await;
        for (job, step) in batch.into_iter().zip(steps.into_iter().map(Some).chain(std::iter::repeat(None))) {
            job.finish(&commit, step == Some(Step::Defer), &self.pool);
        }
        let mut out = Vec::new();
        for rx in answers {
            out.push(rx.await.unwrap_or_else(|_| Err(StoreError::new("dropped").into())).map(|(v, _)| v));
        }
        out
    }
}
