//! Group commit: the committers, the only writers of appends, of publishes to the
//! store's load queue and of the dispatcher's publish-and-mark.
//!
//! Callers hand a unit (one append, one publish, one publish-and-mark) to a bounded channel and wait
//! for its answer. A committer owns one connection; it takes the units waiting, up to
//! `MAX_BATCH`, into one transaction and runs each behind a savepoint: a unit that
//! fails (a version conflict, a duplicate entry or action key, a stale claim) is rolled
//! back without its neighbours, and they commit. Every unit is answered only after
//! the `COMMIT`; a failed `COMMIT` (or a connection lost mid-batch) fails every unit of
//! the batch with a `StoreError`, so nobody sees a success that did not commit. One WAL
//! flush serves the batch, with the server's `synchronous_commit` as configured.
//!
//! Statements are pipelined (issued together on the connection) where their order
//! allows. An append sends all of its statements at once (one round trip) and is only
//! kept when every check passed; any other answer rolls it back to its savepoint and
//! it runs again alone after the batch, step by step, so its answer (a conflict, a
//! duplicate) is exact, as of after the batch. A batch goes out in waves
//! (`run_batch`): the units that take one round trip each are sent together behind one
//! savepoint, so a wave of 64 units costs one round trip, not 64 (and one
//! subtransaction, not 64). When a unit of a wave is not kept, the wave rolls back to
//! that savepoint, the units sent before it run again each behind a savepoint of its
//! own (so its answer is its own), and those sent after it (which ran on its effects)
//! run again in the next wave.
//!
//! A wave of only publishes and publish-and-marks (the dispatcher's units, and the
//! API's publishes) goes out as ONE simple query instead (`text_wave`): `EXECUTE`s of
//! statements the session prepared, their values written as quoted literals. In the
//! extended protocol every statement ends in a `Sync` that the server answers with a
//! packet of its own; as one query, the wave is answered with one. The session sets
//! `standard_conforming_strings`, so doubling quotes is all a literal needs; a value
//! holding a NUL, which no literal can, keeps its unit on the extended protocol. When
//! such a wave is the batch's last, the `COMMIT` goes in the same query: a batch of
//! dispatcher units is then one round trip, not two.
//!
//! A batch never waits on a lock another transaction holds: the committer's session
//! runs with a short `lock_timeout` (`Session`), and a unit that hits it (or a
//! deadlock) rolls back to its savepoint and runs again after the batch, alone in a
//! transaction of its own, exactly as it would without grouping (waiting for the other
//! writer's commit). So a batch is never
//! held up by another process's writes, and two batches cannot deadlock each other.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use deadpool_postgres::{GenericClient, Object, Pool};
use haul_store::backend::{Columns, CorruptRowError, queue_message_row};
use haul_store::{AppendError, ClaimError, Published, QueueMessage, StaleClaimError, StoreError};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::SimpleQueryRow;
use tracing::debug;

use crate::units::{
    AppendArgs, AppendStatements, Fail, Publish, PublishArgs, PublishMarkArgs, PublishMarkStatements,
    PublishStatements, db,
};
use crate::{pg, pool_client};

/// Units per transaction at most: bounds what one failed commit takes down and how
/// long the batch's first unit waits.
pub const MAX_BATCH: usize = 64;
// Each unit's savepoint that writes takes a subtransaction id, and a session keeps 64
// of them in shared memory; beyond that every snapshot in the server gets slower.
const _: () = assert!(MAX_BATCH <= 64, "more units than a session's cached subtransaction ids");
/// Units waiting for a committer at most; callers wait beyond it.
const QUEUE_LEN: usize = 4096;
/// The committer's session settings. `lock_timeout`: how long a batch's statement (or a
/// committer's prepare) may wait for a lock before its unit is put off to run alone;
/// the session therefore never goes back to the pool (`Session`). And the one setting
/// the literals of a wave sent as text rely on: with standard conforming strings, a
/// backslash in a literal is itself, and only a quote needs doubling (`literal`).
const SESSION_SETTINGS: &str = "SET lock_timeout = '20ms'; SET standard_conforming_strings = on";

/// The session's own prepared statements, which a wave sent as text runs (`text_wave`).
fn text_statements() -> String {
    format!(
        "PREPARE haul_publish (text, text, text, text, bigint) AS {};
         PREPARE haul_mark_dispatched (text, text, text, text, bigint) AS {};
         PREPARE haul_publish_set (text[], text[], text[], text[], bigint[]) AS {};
         PREPARE haul_receive_published (text, text, bigint, bigint, text) AS {}",
        crate::sql::QUEUE_PUBLISH,
        crate::sql::OUTBOX_MARK_DISPATCHED,
        crate::sql::QUEUE_PUBLISH_SET,
        crate::sql::QUEUE_RECEIVE_PUBLISHED
    )
}

/// Writes `v` as a literal: quoted, its quotes doubled (`SESSION_SETTINGS`).
fn literal(sql: &mut String, v: &str) {
    sql.push('\'');
    for c in v.chars() {
        if c == '\'' {
            sql.push('\'');
        }
        sql.push(c);
    }
    sql.push('\'');
}

/// Writes `EXECUTE statement('v1','v2',…,now);`: a statement the session prepared
/// (`text_statements`), its text values as literals and `now` last.
fn execute(sql: &mut String, statement: &str, values: &[&str], now: i64) {
    sql.push_str("EXECUTE ");
    sql.push_str(statement);
    sql.push('(');
    for v in values {
        literal(sql, v);
        sql.push(',');
    }
    let _ = write!(sql, "{now});");
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

/// When a batch sends its `COMMIT` (`run_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    /// Behind its last wave of appends, before their answers are read: one round trip
    /// fewer for a batch that ends in appends, which is most batches of the worker.
    Pipelined,
    /// After every wave's answers were read (a batch run again after `Ended::Undone`).
    AfterAnswers,
}

/// How a batch's transaction ended (`run_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Committed,
    /// A unit failed under a pipelined `COMMIT`, which then rolled the whole batch back.
    Undone,
}

type Reply<T, E> = oneshot::Sender<Result<T, E>>;
/// A mark as a set wave sends it: load, outbox id, token, receipt, now.
type Mark<'a> = (&'a str, &'a str, &'a str, &'a str, i64);
/// A publish's receive as a set wave sends it: load, event id, now, until, token.
type Receive<'a> = (&'a str, &'a str, i64, i64, &'a str);

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
        out: Option<Result<(Published, Option<QueueMessage>), StoreError>>,
        reply: Reply<(Published, Option<QueueMessage>), StoreError>,
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

/// A unit's statements, prepared before its batch's transaction began.
#[derive(Clone)]
enum Prepared {
    Append(AppendStatements),
    PublishMark(PublishMarkStatements),
    Publish(PublishStatements),
}

impl Job {
    /// Whether the unit's statements all go out in one round trip: such units share a
    /// wave. Its `run`, given them prepared, sends every one of them on its first poll,
    /// before it waits for anything.
    fn one_trip(&self) -> bool {
        match self {
            Job::Append { args, .. } => crate::units::append_is_one_trip(args),
            Job::PublishMark { .. } | Job::Publish { .. } => true,
        }
    }

    /// Prepares the statements `run` sends (a cache hit on a connection that ran the
    /// unit's kind before: no round trip).
    async fn prepare(&self, client: &impl GenericClient) -> Result<Prepared, tokio_postgres::Error> {
        Ok(match self {
            Job::Append { args, .. } => Prepared::Append(AppendStatements::prepare(client, args, true).await?),
            Job::PublishMark { .. } => Prepared::PublishMark(PublishMarkStatements::prepare(client).await?),
            Job::Publish { args, .. } => Prepared::Publish(PublishStatements::prepare(client, args).await?),
        })
    }

    /// Runs the unit in `tx` (inside its savepoint), with its statements as prepared
    /// before the transaction; when that failed (`None`), it prepares them now: such a
    /// unit is alone in its wave, and meets the error again as its own answer.
    async fn run(&mut self, tx: &impl GenericClient, prepared: Option<Prepared>) -> Step {
        match self {
            Job::Append { args, out, .. } => {
                let r = match prepared {
                    Some(Prepared::Append(statements)) => Ok(statements),
                    _ => AppendStatements::prepare(tx, args, true).await.map_err(db),
                };
                let r = match r {
                    Ok(statements) => crate::units::append_body(tx, args, statements).await,
                    Err(f) => Err(f),
                };
                let (step, o) = settle(r.map(|v| (v, true)));
                *out = o;
                step
            }
            Job::PublishMark { args, out, .. } => {
                let r = match prepared {
                    Some(Prepared::PublishMark(statements)) => Ok(statements),
                    _ => PublishMarkStatements::prepare(tx).await.map_err(db),
                };
                let r = match r {
                    Ok(statements) => crate::units::publish_mark_body(tx, &statements, args).await,
                    Err(f) => Err(f),
                };
                // The publish stands even when the mark finds its claim stale, as it
                // would have as a step of its own: the savepoint is kept either way.
                let (step, o) = match r {
                    Ok(answer) => (Step::Keep, Some(answer)),
                    Err(f) => settle::<Published, ClaimError>(Err(f)),
                };
                *out = o;
                step
            }
            Job::Publish { args, out, .. } => {
                let r = match prepared {
                    Some(Prepared::Publish(statements)) => Ok(statements),
                    _ => PublishStatements::prepare(tx, args).await.map_err(db),
                };
                let r = match r {
                    Ok(statements) => crate::units::publish_body(tx, &statements, args).await,
                    Err(f) => Err(f),
                };
                let (step, o) = settle(r.map(|p| (p, true)));
                *out = o;
                step
            }
        }
    }

    /// Whether the unit can go out as text, in a wave sent as one query (`text_wave`):
    /// a publish or a publish-and-mark, every value of which a literal can hold (a
    /// NUL cannot: such a unit goes the usual way and meets the server's refusal).
    fn as_text(&self) -> bool {
        let plain = |values: &[&str]| values.iter().all(|v| !v.contains('\0'));
        match self {
            Job::Append { .. } => false,
            Job::PublishMark { args: a, .. } => {
                plain(&[&a.id, &a.token, &a.receipt, &a.load_id, &a.event_id, &a.body, &a.trace])
            }
            Job::Publish { args: a, .. } => plain(&[&a.load_id, &a.event_id, &a.body, &a.trace]),
        }
    }

    /// Writes the unit's statements as `EXECUTE`s of the session's prepared statements
    /// (`text_statements`), each ended by `;`; returns how many it wrote.
    fn write_text(&self, sql: &mut String) -> usize {
        match self {
            Job::Append { .. } => 0,
            Job::Publish { args: a, .. } => {
                execute(sql, "haul_publish", &[&a.load_id, &a.event_id, &a.body, &a.trace], a.now);
                match self.receive() {
                    Some(receive) => {
                        execute_receive(sql, receive);
                        2
                    }
                    None => 1,
                }
            }
            Job::PublishMark { args: a, .. } => {
                execute(sql, "haul_publish", &[&a.load_id, &a.event_id, &a.body, &a.trace], a.now);
                let load = haul_store::outbox_key_load(&a.id);
                execute(sql, "haul_mark_dispatched", &[load, &a.id, &a.token, &a.receipt], a.now);
                2
            }
        }
    }

    /// What a wave of set statements (`set_wave`) sends of the unit: its publish (load,
    /// event id, body, trace context, now) and, for a publish-and-mark, its mark (load, outbox id,
    /// token, receipt, now). None for an append.
    fn parts(&self) -> Option<(Publish<'_>, Option<Mark<'_>>)> {
        match self {
            Job::Append { .. } => None,
            Job::Publish { args: a, .. } => Some((a.parts(), None)),
            Job::PublishMark { args: a, .. } => {
                Some((a.publish(), Some((haul_store::outbox_key_load(&a.id), &a.id, &a.token, &a.receipt, a.now))))
            }
        }
    }

    /// A publish's receive (`QUEUE_RECEIVE_PUBLISHED`): load, event id, now, invisible
    /// until, token.
    fn receive(&self) -> Option<Receive<'_>> {
        match self {
            Job::Publish { args: a, .. } => a
                .receive
                .as_ref()
                .map(|(token, until)| (a.load_id.as_str(), a.event_id.as_str(), a.now, *until, token.as_str())),
            Job::Append { .. } | Job::PublishMark { .. } => None,
        }
    }

    /// Takes the unit's answer from what became of its statements sent as text.
    fn take_text(&mut self, ran: TextRan<'_>) -> Step {
        fn fail<E: From<StoreError>>(ran: TextRan<'_>) -> Fail<E> {
            match ran {
                TextRan::Failed(e) => db(e),
                _ => Fail::store(StoreError::new("the server answered fewer statements than a batch sent")),
            }
        }
        let published = |n: u64| if n == 1 { Published::New } else { Published::Duplicate };
        match self {
            Job::Append { .. } => Step::Defer,
            Job::Publish { args, out, .. } => {
                let (step, o) = match (ran, &args.receive) {
                    (TextRan::Counts(&[n], _), None) => (Step::Keep, Some(Ok((published(n), None)))),
                    (TextRan::Counts(&[n, 0], _), Some(_)) => (Step::Keep, Some(Ok((published(n), None)))),
                    (TextRan::Counts(&[n, 1], Some(row)), Some(_)) => match queue_message_row(&TextRow(row)) {
                        Ok((_, m)) => (Step::Keep, Some(Ok((published(n), Some(m))))),
                        Err(e) => (Step::Undo, Some(Err(e))),
                    },
                    (ran, _) => settle::<(Published, Option<QueueMessage>), StoreError>(Err(fail(ran))),
                };
                *out = o;
                step
            }
            Job::PublishMark { args, out, .. } => {
                let (step, o) = match ran {
                    TextRan::Counts(&[n, 1], _) => (Step::Keep, Some(Ok(published(n)))),
                    // The publish stands even when the mark finds its claim stale.
                    TextRan::Counts(&[_, 0], _) => {
                        (Step::Keep, Some(Err(StaleClaimError { outbox_id: args.id.clone() }.into())))
                    }
                    ran => settle::<Published, ClaimError>(Err(fail(ran))),
                };
                *out = o;
                step
            }
        }
    }

    /// Drops the answer of a run whose wave rolled it back: it runs again.
    fn forget(&mut self) {
        match self {
            Job::Append { out, .. } => *out = None,
            Job::PublishMark { out, .. } => *out = None,
            Job::Publish { out, .. } => *out = None,
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
                alone(reply, async move { crate::units::append_solo(&pool, &args).await })
            }
            Job::PublishMark { args, reply, .. } if deferred => {
                let pool = pool.clone();
                alone(reply, async move { crate::units::publish_mark_solo(&pool, &args).await })
            }
            Job::Publish { args, reply, .. } if deferred => {
                let pool = pool.clone();
                alone(reply, async move { crate::units::publish_solo(&pool, &args).await })
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

    pub(crate) async fn publish(&self, args: PublishArgs) -> Result<(Published, Option<QueueMessage>), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::Publish { args, out: None, reply }, rx).await
    }

    pub(crate) async fn publish_mark(&self, args: PublishMarkArgs) -> Result<Published, ClaimError> {
        let (reply, rx) = oneshot::channel();
        self.submit(Job::PublishMark { args, out: None, reply }, rx).await
    }
}

/// A committer's connection. Its session has a `lock_timeout` (`SESSION_SETTINGS`), so
/// it is closed, never handed back to the pool, when the committer drops it (after an
/// error, at the end, in a panic's unwinding).
#[derive(Default)]
pub(crate) struct Session {
    client: Option<Object>,
    /// Whether its `text_statements` are prepared: waves go out as text only then.
    text: bool,
}

impl Session {
    /// The connection, set up on first use, and whether waves may go out as text.
    async fn client(&mut self, pool: &Pool) -> Result<(&Object, bool), StoreError> {
        if self.client.is_none() {
            let client = pool_client(pool).await?;
            let set = client.batch_execute(SESSION_SETTINGS).await;
            let prepared = if set.is_ok() { client.batch_execute(&text_statements()).await } else { Ok(()) };
            // Closed, not pooled, whatever the answers.
            self.client = Some(client);
            set.map_err(pg)?;
            // Without them (a schema this haul cannot prepare them on), every wave goes
            // out in the extended protocol, where each unit meets its own error.
            if let Err(e) = &prepared {
                tracing::warn!(error = %e, "a committer could not prepare its statements; its waves go statement by statement");
            }
            self.text = prepared.is_ok();
        }
        let client = self.client.as_ref().ok_or_else(|| StoreError::new("no PostgreSQL connection"))?;
        Ok((client, self.text))
    }

    fn close(&mut self) {
        self.text = false;
        if let Some(c) = self.client.take() {
            drop(Object::take(c));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

async fn committer(pool: Pool, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    let mut conn = Session::default();
    loop {
        let batch = {
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
        commit_batch(&pool, &mut conn, batch).await;
    }
}

/// Runs `batch` on `conn` (`run_batch`) and answers each of its units; a unit put off
/// runs alone.
async fn commit_batch(pool: &Pool, conn: &mut Session, mut batch: Vec<Job>) {
    publishes_first(&mut batch);
    let mut steps = Vec::with_capacity(batch.len());
    let mut commit = run_batch(pool, conn, &mut batch, &mut steps, Commit::Pipelined).await;
    if let Ok(Ended::Undone) = commit {
        // A unit of the last wave failed under the `COMMIT` sent behind it: nothing of
        // the batch stands. Again, reading every wave's answers before the `COMMIT`,
        // for each unit's own answer.
        debug!(units = batch.len(), "a batch's pipelined COMMIT rolled back; running it again");
        batch.iter_mut().for_each(Job::forget);
        steps.clear();
        commit = run_batch(pool, conn, &mut batch, &mut steps, Commit::AfterAnswers).await;
    }
    let commit = commit.map(|_| ());
    if commit.is_err() {
        // A lost or confused session: close it; the next batch connects afresh.
        conn.close();
    }
    let mut steps = steps.into_iter();
    for job in batch {
        let deferred = steps.next() == Some(Step::Defer);
        job.finish(&commit, deferred, pool);
    }
}

/// Moves to the front of `batch` the publishes and publish-and-marks that can go out as
/// text (`Job::as_text`) and touch loads no other unit of the batch touches, so that
/// they make one set wave (`set_wave`) ahead of the appends, wherever those put them. A
/// unit alone on its loads commutes with every other unit of the batch: the batch's
/// outcome is the one it would have had in the order the units came, and they came
/// concurrently. Units that share a load keep their order.
fn publishes_first(batch: &mut Vec<Job>) {
    fn loads(job: &Job) -> [Option<&str>; 2] {
        match job {
            Job::Append { args, .. } => [Some(args.load_id.as_str()), None],
            Job::Publish { args, .. } => [Some(&args.load_id), None],
            Job::PublishMark { args, .. } => {
                let marked = haul_store::outbox_key_load(&args.id);
                [Some(&args.load_id), (marked != args.load_id).then_some(marked)]
            }
        }
    }
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    for job in batch.iter() {
        for load in loads(job).into_iter().flatten() {
            *seen.entry(load).or_default() += 1;
        }
    }
    let alone: Vec<bool> = batch
        .iter()
        .map(|job| {
            !matches!(job, Job::Append { .. })
                && job.as_text()
                && loads(job).into_iter().flatten().all(|l| seen[l] == 1)
        })
        .collect();
    let moved = alone.iter().filter(|a| **a).count();
    if moved < 2 || alone[..moved].iter().all(|a| *a) {
        return;
    }
    let mut rest = Vec::with_capacity(batch.len() - moved);
    let mut front = Vec::with_capacity(batch.len());
    for (job, alone) in batch.drain(..).zip(alone) {
        if alone { front.push(job) } else { rest.push(job) }
    }
    front.append(&mut rest);
    *batch = front;
}

/// Runs `batch` in one transaction, in waves: a wave is the longest run of one-trip
/// units from where the last one stopped (or one unit that needs more round trips),
/// behind one savepoint, and every statement of the wave sent together, so a wave
/// costs one round trip, not one per unit. The first unit of a wave that is not kept
/// ends it: the wave rolls back to the savepoint it ran under (sent with the next wave,
/// or with the `COMMIT`). When that savepoint was its own, the rollback undoes it and
/// every unit after it (they ran on its effects), and the next wave starts after it.
/// When it shared the savepoint with units before it, they are undone too: the next wave
/// starts at the first of them, each of them (and it) now behind a savepoint of its own,
/// nested in the one before. So each unit's answer is the one it would have had run one
/// after another, and a savepoint (a subtransaction in the server, with its own work at
/// every commit) is paid per unit only around a unit that was not kept.
///
/// The `BEGIN` goes out with the first wave and the `COMMIT` with the last rollback, so
/// a batch of one wave takes two round trips: its statements, then the commit.
///
/// The statements are prepared before `BEGIN`: each unit's future then sends all of its
/// statements on its first poll, and `in_order` polls them in the batch's order. A unit
/// whose statements fail to prepare (a store on an older schema) aborts no transaction:
/// it runs alone in its wave, and meets the error again as its answer.
async fn run_batch(
    pool: &Pool,
    conn: &mut Session,
    batch: &mut [Job],
    steps: &mut Vec<Step>,
    commit_mode: Commit,
) -> Result<Ended, StoreError> {
    let (client, text) = conn.client(pool).await?;
    let mut prepared = Vec::with_capacity(batch.len());
    for job in batch.iter() {
        prepared.push(job.prepare(client).await.ok());
    }
    // A unit that failed to prepare runs alone: its statements would go out late.
    let shares: Vec<bool> = batch.iter().zip(&prepared).map(|(job, p)| job.one_trip() && p.is_some()).collect();
    // Sent in front of the next wave's first statement: the `BEGIN`, then the last
    // wave's rollback. Every error below ends the batch and closes the session, which
    // rolls back what it began.
    let tx: &Object = client;
    let mut prefix = String::from("BEGIN; ");
    // Units that take a savepoint of their own wherever they stand in a wave: a unit
    // not kept under a savepoint it shared sends the whole run back, and on its next
    // try each unit of that run has its own, so its answer is its own.
    let mut own = vec![false; batch.len()];
    let mut start = 0;
    while start < batch.len() {
        let mut end = start + shares[start..].iter().take_while(|s| **s).count().max(1);
        // The wave's first units as a set wave when there are two or more of them on
        // distinct loads (appends after them go in the next wave), and none has been
        // sent back to run behind a savepoint of its own.
        let set = if text { set_run(&batch[start..end]) } else { 0 };
        let as_set = set >= 2 && !own[start..start + set].contains(&true);
        if as_set {
            end = start + set;
        }
        // The batch's last wave, sent as text, carries the `COMMIT` too.
        let mut committed = None;
        let ran = if as_set || (text && batch[start..end].iter().all(Job::as_text)) {
            let commit = end == batch.len();
            let (ran, c) = if as_set {
                set_wave(tx, &prefix, start, &mut batch[start..end], commit).await
            } else {
                text_wave(tx, &prefix, start, &mut batch[start..end], &own[start..end], commit).await
            };
            committed = c;
            ran
        } else {
            // The batch's last wave of one-trip appends takes the `COMMIT` along: their
            // checks fail the transaction rather than answer a count (`append_body`), so
            // a unit not kept is a failed transaction, which that `COMMIT` rolls back.
            let pipelined = commit_mode == Commit::Pipelined
                && end == batch.len()
                && shares[start]
                && batch[start..end].iter().all(|job| matches!(job, Job::Append { .. }));
            // Cloned, not taken: a unit rolled back with its wave runs again, with them.
            let units =
                batch[start..end].iter_mut().zip(&prepared[start..end]).enumerate().map(|(k, (job, statements))| {
                    let i = start + k;
                    let savepoint = (k == 0 || own[i])
                        .then(|| format!("{}SAVEPOINT u{i}", if k == 0 { prefix.as_str() } else { "" }));
                    let statements = statements.clone();
                    async move {
                        let made = async {
                            match &savepoint {
                                Some(savepoint) => tx.batch_execute(savepoint).await,
                                None => Ok(()),
                            }
                        };
                        tokio::join!(made, job.run(tx, statements))
                    }
                });
            if pipelined {
                let (ran, commit) = tokio::join!(in_order(units.collect()), tx.batch_execute("COMMIT"));
                if !ran.iter().all(|(made, step)| made.is_ok() && *step == Step::Keep) {
                    // The failed unit's error aborted the transaction: its `COMMIT` was
                    // a rollback, or the session is gone (then the `COMMIT` says so).
                    return commit.map(|()| Ended::Undone).map_err(pg);
                }
                steps.extend(ran.iter().map(|(_, step)| *step));
                return commit.map(|()| Ended::Committed).map_err(pg);
            }
            in_order(units.collect()).await
        };
        prefix.clear();
        let mut next = end;
        // The unit whose savepoint the current one runs under.
        let mut covering = start;
        for (k, (made, step)) in ran.into_iter().enumerate() {
            let i = start + k;
            if next != end {
                // Sent after the unit not kept: rolled back, it runs again.
                batch[i].forget();
                continue;
            }
            made.map_err(pg)?;
            if k == 0 || own[i] {
                covering = i;
            }
            if step == Step::Keep {
                steps.push(step);
                continue;
            }
            prefix = format!("ROLLBACK TO u{covering}; ");
            if covering == i {
                steps.push(step);
                next = i + 1;
            } else {
                // The kept units before it in its savepoint are undone with it: the run
                // goes again from there, each unit behind a savepoint of its own.
                steps.truncate(steps.len() - (i - covering));
                for j in covering..=i {
                    batch[j].forget();
                    own[j] = true;
                }
                next = covering;
            }
        }
        if let Some(c) = committed {
            // Every unit ran and was kept, and the `COMMIT` after them ran too.
            return c.map(|()| Ended::Committed).map_err(pg);
        }
        start = next;
    }
    prefix.push_str("COMMIT");
    tx.batch_execute(&prefix).await.map(|()| Ended::Committed).map_err(pg)
}

/// Writes `EXECUTE haul_receive_published(…);`: a publish's receive (`text_statements`).
fn execute_receive(sql: &mut String, (load, event_id, now, until, token): Receive<'_>) {
    sql.push_str("EXECUTE haul_receive_published(");
    literal(sql, load);
    sql.push(',');
    literal(sql, event_id);
    let _ = write!(sql, ",{now},{until},");
    literal(sql, token);
    sql.push_str(");");
}

/// What became of a unit's statements in a wave sent as text (`text_wave`).
enum TextRan<'a> {
    /// All ran: each one's count of rows, and the first row of the last one, if any.
    Counts(&'a [u64], Option<&'a SimpleQueryRow>),
    /// One of them failed (the rest did not run).
    Failed(tokio_postgres::Error),
    /// The server's answer ended before theirs, with no error: a broken connection.
    Unanswered,
}

/// Runs a wave of units that go out as text (`Job::as_text`) as ONE simple query: the
/// prefix, the savepoints and every unit's `EXECUTE`s. The server answers it with one
/// packet, not one per statement: each statement of the extended protocol ends in a
/// `Sync`, which the server answers at once, with a send of its own and a wake-up of
/// this process. Measured on the `dispatch` workload, that was half of the server's
/// time for a wave of publish-and-marks.
///
/// Answers as `in_order` does, one per unit: its savepoint's result and its step. The
/// server skips the rest of a query after an error, so the units after a failed one
/// did not run; they are answered `Defer` here, and the caller rolls them back with
/// their wave and runs them again, as it does in the extended protocol.
async fn text_wave(
    tx: &Object,
    prefix: &str,
    start: usize,
    units: &mut [Job],
    own: &[bool],
    commit: bool,
) -> (Vec<(Result<(), tokio_postgres::Error>, Step)>, Option<Result<(), tokio_postgres::Error>>) {
    // Each unit's statements, by their place in the query: its savepoint (for the
    // first unit with the prefix before it: `BEGIN; ` or `ROLLBACK TO uN; `), then its
    // own statements.
    let mut sql = String::from(prefix);
    let mut sent = Vec::with_capacity(units.len());
    let mut at = prefix.matches(';').count();
    for (k, job) in units.iter().enumerate() {
        let control = if k == 0 { 0 } else { at };
        if k == 0 || own[k] {
            let _ = write!(sql, "SAVEPOINT u{};", start + k);
            at += 1;
        }
        let statements = at..at + job.write_text(&mut sql);
        at = statements.end;
        sent.push((control..statements.start, statements));
    }
    if commit {
        sql.push_str("COMMIT;");
    }
    let Answered { counts, rows, mut failed } = simple_query(tx, &sql).await;
    let mut out = Vec::with_capacity(units.len());
    for (job, (control, statements)) in units.iter_mut().zip(sent) {
        if let Some(counts) = counts.get(statements.clone()) {
            let last = statements.end - 1;
            let row = rows.iter().find(|(at, _)| *at == last).map(|(_, row)| row);
            out.push((Ok(()), job.take_text(TextRan::Counts(counts, row))));
            continue;
        }
        // The first statement that did not complete is this unit's.
        match failed.take() {
            Some(e) if counts.len() < control.end => out.push((Err(e), Step::Undo)),
            Some(e) => out.push((Ok(()), job.take_text(TextRan::Failed(e)))),
            None => out.push((Ok(()), job.take_text(TextRan::Unanswered))),
        }
        break;
    }
    // The units after it never ran.
    out.resize_with(units.len(), || (Ok(()), Step::Defer));
    // The `COMMIT` ran when every statement before it did (all of them kept: units sent
    // as text are kept unless one of their statements fails), and failed when the error
    // is still unclaimed.
    let committed = match failed {
        _ if !commit || counts.len() < at => None,
        Some(e) => Some(Err(e)),
        None if counts.len() > at => Some(Ok(())),
        None => None,
    };
    (out, committed)
}

/// How many of `units`, from the first, a set wave can carry: text units (`as_text`)
/// whose publishes name distinct loads and whose marks distinct rows, so that each
/// element of the publish is one unit's and no two statements touch one row.
fn set_run(units: &[Job]) -> usize {
    let mut loads = HashSet::with_capacity(units.len());
    let mut rows = HashSet::new();
    units
        .iter()
        .take_while(|job| {
            let Some(((load, ..), mark)) = job.parts().filter(|_| job.as_text()) else { return false };
            loads.insert(load) && mark.is_none_or(|(_, id, ..)| rows.insert(id))
        })
        .count()
}

/// Runs a wave of publishes and publish-and-marks (`set_run`) as ONE simple query:
/// every unit's publish in one statement (`QUEUE_PUBLISH_SET`, its values as array
/// literals), then each publish's receive when it asks for one
/// (`QUEUE_RECEIVE_PUBLISHED`), then each unit's mark, a statement of its own each.
/// The server starts the publish once for the wave, not once per unit. The receives
/// and marks stay one per row: the same join of an array of keys to the outbox is
/// planned, under the generic plans the sessions use, as a scan of every partition
/// whenever the planner thinks the outbox small (under some 30,000 rows, or never
/// analyzed), and the plan, made once, stays as the table grows (joined to arrays the
/// same way, the receives hashed every head); a publish inserts and joins no table.
/// The units touch distinct
/// loads and rows, so the answers are the ones they would have had one after another: a
/// unit's publish is new when its load comes back from the publish. The elements go in
/// load order, so two waves lock the heads and rows they share in one order.
///
/// Answers as `text_wave` does. When a statement after the savepoint fails (a lock
/// wait that timed out, say), no unit's answer can be told from it: every unit but the
/// last is answered `Keep` and the last `Undo`, so the caller rolls the whole wave back
/// and runs its units again, each behind a savepoint of its own (`text_wave`), for
/// answers of their own.
async fn set_wave(
    tx: &Object,
    prefix: &str,
    start: usize,
    units: &mut [Job],
    commit: bool,
) -> (Vec<(Result<(), tokio_postgres::Error>, Step)>, Option<Result<(), tokio_postgres::Error>>) {
    fn array<T>(sql: &mut String, items: &[T], mut write: impl FnMut(&mut String, &T)) {
        sql.push_str("ARRAY[");
        for (k, item) in items.iter().enumerate() {
            if k > 0 {
                sql.push(',');
            }
            write(sql, item);
        }
        sql.push(']');
    }
    let mut parts: Vec<(Publish<'_>, Option<Mark<'_>>)> = units.iter().filter_map(Job::parts).collect();
    parts.sort_by_key(|((load, ..), _)| *load);
    let publishes: Vec<Publish<'_>> = parts.iter().map(|(p, _)| *p).collect();
    let mut marks: Vec<Mark<'_>> = parts.iter().filter_map(|(_, m)| *m).collect();
    marks.sort_by_key(|(load, id, ..)| (*load, *id));
    let mut receives: Vec<Receive<'_>> = units.iter().filter_map(Job::receive).collect();
    receives.sort_by_key(|(load, ..)| *load);

    let mut sql = String::from(prefix);
    let savepoint = prefix.matches(';').count();
    let _ = write!(sql, "SAVEPOINT u{start};EXECUTE haul_publish_set(");
    array(&mut sql, &publishes, |sql, p| literal(sql, p.0));
    sql.push(',');
    array(&mut sql, &publishes, |sql, p| literal(sql, p.1));
    sql.push(',');
    array(&mut sql, &publishes, |sql, p| literal(sql, p.2));
    sql.push(',');
    array(&mut sql, &publishes, |sql, p| literal(sql, p.3));
    sql.push(',');
    array(&mut sql, &publishes, |sql, p| {
        let _ = write!(sql, "{}", p.4);
    });
    sql.push_str(");");
    // The receives behind the publish, one statement each: a head is found by its key
    // alone (joined to arrays of loads, the generic plan hashed every head, and the
    // heads, updated all the time, are many pages).
    for receive in &receives {
        execute_receive(&mut sql, *receive);
    }
    let received_at = savepoint + 2;
    let marks_at = received_at + receives.len();
    for (load, id, token, receipt, now) in &marks {
        execute(&mut sql, "haul_mark_dispatched", &[load, id, token, receipt], *now);
    }
    let last = marks_at - 1 + marks.len();
    if commit {
        sql.push_str("COMMIT;");
    }

    let Answered { counts, rows, failed } = simple_query(tx, &sql).await;
    let done = counts.len();
    let mut out = Vec::with_capacity(units.len());
    if done <= savepoint {
        // The prefix or the savepoint did not complete: the batch's transaction is lost.
        match failed {
            Some(e) => out.push((Err(e), Step::Undo)),
            None => out.push((Ok(()), units[0].take_text(TextRan::Unanswered))),
        }
        out.resize_with(units.len(), || (Ok(()), Step::Defer));
        return (out, None);
    }
    if done <= last {
        if let Some(e) = &failed {
            tracing::debug!("a wave's set statements failed, its units run again one by one: {e}");
        }
        out.resize_with(units.len() - 1, || (Ok(()), Step::Keep));
        out.push((Ok(()), Step::Undo));
        return (out, None);
    }
    // The loads published (the publish's rows), and the rows marked: the marks'
    // statements follow the publish's, in `marks`' order.
    let published: HashSet<&str> =
        rows.iter().filter(|(at, _)| *at == savepoint + 1).filter_map(|(_, row)| row.get(0)).collect();
    let received: std::collections::HashMap<&str, &SimpleQueryRow> = rows
        .iter()
        .filter(|(at, _)| (received_at..marks_at).contains(at))
        .filter_map(|(_, row)| Some((row.get(1)?, row)))
        .collect();
    let marked: HashSet<&str> =
        marks.iter().zip(counts.iter().skip(marks_at)).filter(|(_, n)| **n == 1).map(|(m, _)| m.1).collect();
    // Each unit's statements' counts as if it had sent them itself, read while the
    // units are only borrowed (the marks point into them).
    let ran: Vec<([u64; 2], usize, Option<&SimpleQueryRow>)> = units
        .iter()
        .map(|job| match (job.parts(), job.receive()) {
            (None, _) => ([0, 0], 0, None),
            (Some(((load, ..), None)), None) => ([u64::from(published.contains(load)), 0], 1, None),
            (Some(((load, ..), None)), Some(_)) => {
                let row = received.get(load).copied();
                ([u64::from(published.contains(load)), u64::from(row.is_some())], 2, row)
            }
            (Some(((load, ..), Some((_, id, ..)))), _) => {
                ([u64::from(published.contains(load)), u64::from(marked.contains(id))], 2, None)
            }
        })
        .collect();
    for (job, (ran, sent, row)) in units.iter_mut().zip(ran) {
        out.push((Ok(()), job.take_text(TextRan::Counts(&ran[..sent], row))));
    }
    let committed = match failed {
        _ if !commit => None,
        Some(e) => Some(Err(e)),
        None if done > last + 1 => Some(Ok(())),
        None => None,
    };
    (out, committed)
}

/// What the server answered to a simple query, up to its first error.
struct Answered {
    /// The row count of each statement that completed, in order.
    counts: Vec<u64>,
    /// The rows answered, each with the place of its statement in the query.
    rows: Vec<(usize, SimpleQueryRow)>,
    /// The error that ended the query (the statements after it did not run).
    failed: Option<tokio_postgres::Error>,
}

/// Sends `sql` as one simple query and reads the whole answer (`text_wave`, `set_wave`),
/// with the rows its statements returned.
async fn simple_query(tx: &Object, sql: &str) -> Answered {
    use futures_util::StreamExt;
    let mut answered = Answered { counts: Vec::new(), rows: Vec::new(), failed: None };
    match tx.simple_query_raw(sql).await {
        Err(e) => answered.failed = Some(e),
        Ok(stream) => {
            let mut stream = std::pin::pin!(stream);
            while let Some(m) = stream.next().await {
                match m {
                    Ok(tokio_postgres::SimpleQueryMessage::CommandComplete(n)) => answered.counts.push(n),
                    Ok(tokio_postgres::SimpleQueryMessage::Row(row)) => {
                        answered.rows.push((answered.counts.len(), row))
                    }
                    Ok(_) => {}
                    Err(e) => {
                        answered.failed = Some(e);
                        break;
                    }
                }
            }
        }
    }
    answered
}

/// A row of a simple query (`text_wave`, `set_wave`): every value as text.
struct TextRow<'a>(&'a SimpleQueryRow);

impl TextRow<'_> {
    fn parsed<T: std::str::FromStr>(&self, index: usize) -> Result<Option<T>, CorruptRowError>
    where
        T::Err: std::fmt::Display,
    {
        let text = self.0.try_get(index).map_err(|e| CorruptRowError::column(index, e))?;
        text.map(|t| t.parse::<T>().map_err(|e| CorruptRowError::column(index, e))).transpose()
    }
}

impl Columns for TextRow<'_> {
    fn string(&self, index: usize) -> Result<String, CorruptRowError> {
        self.opt_string(index)?.ok_or_else(|| CorruptRowError::column(index, "NULL"))
    }

    fn opt_string(&self, index: usize) -> Result<Option<String>, CorruptRowError> {
        self.parsed(index)
    }

    fn i64(&self, index: usize) -> Result<i64, CorruptRowError> {
        self.opt_i64(index)?.ok_or_else(|| CorruptRowError::column(index, "NULL"))
    }

    fn opt_i64(&self, index: usize) -> Result<Option<i64>, CorruptRowError> {
        self.parsed(index)
    }

    fn u32(&self, index: usize) -> Result<u32, CorruptRowError> {
        self.parsed(index)?.ok_or_else(|| CorruptRowError::column(index, "NULL"))
    }
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
        units: Vec<(haul_core::ids::LoadId, Vec<haul_store::NewEntry>, u64, Vec<haul_store::NewOutboxRow>)>,
        now: haul_core::time::Timestamp,
    ) -> Vec<Result<u64, AppendError>> {
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        for (load_id, entries, expected_version, outbox) in units {
            let (reply, rx) = oneshot::channel();
            let now = haul_core::time::to_ms(now);
            let args = AppendArgs { load_id, entries, expected_version, outbox, receipt: None, claim: None, now };
            batch.push(Job::Append { args, out: None, reply });
            answers.push(rx);
        }
        commit_batch(&self.pool, &mut Session::default(), batch).await;
        let mut out = Vec::new();
        for rx in answers {
            out.push(rx.await.unwrap_or_else(|_| Err(StoreError::new("dropped").into())).map(|(v, _)| v));
        }
        out
    }

    /// Runs publishes and publish-and-marks as ONE committer batch, in this order, as
    /// `append_one_batch` does appends; each answer as a line: `new`, `duplicate`,
    /// `stale`, or `store: {error}`, a publish's with ` received {event id} {receipt}`
    /// after it when it asked for its receive and got a message. For tests.
    pub async fn publish_one_batch(&self, units: Vec<TestPublish>, now: haul_core::time::Timestamp) -> Vec<String> {
        let now = haul_core::time::to_ms(now);
        let mut batch = Vec::new();
        let mut answers = Vec::new();
        for u in units {
            let (load_id, event_id, body) = (u.load_id, u.event_id, u.body);
            match u.mark {
                None => {
                    let (reply, rx) = oneshot::channel();
                    let (trace, until) = (String::new(), now + 60_000);
                    let receive = u.receive.then(|| (format!("token-{load_id}-{event_id}"), until));
                    batch.push(Job::Publish {
                        args: PublishArgs { load_id, event_id, body, trace, now, receive },
                        out: None,
                        reply,
                    });
                    answers.push(tokio::spawn(async move {
                        let (published, received) = rx
                            .await
                            .unwrap_or_else(|_| Err(StoreError::new("dropped")))
                            .map_err(|e| format!("store: {e}"))?;
                        let received = received.map(|m| format!(" received {} {}", m.event_id, m.receipt));
                        Ok((published, received.unwrap_or_default()))
                    }));
                }
                Some((id, token)) => {
                    let (reply, rx) = oneshot::channel();
                    let (receipt, trace) = (format!("receipt of {id}"), String::new());
                    let args = PublishMarkArgs { id, token, receipt, load_id, event_id, body, trace, now };
                    batch.push(Job::PublishMark { args, out: None, reply });
                    answers.push(tokio::spawn(async move {
                        let published = rx.await.unwrap_or_else(|_| Err(StoreError::new("dropped").into())).map_err(
                            |e| match e {
                                ClaimError::Stale(_) => "stale".to_owned(),
                                ClaimError::Store(e) => format!("store: {e}"),
                            },
                        )?;
                        Ok((published, String::new()))
                    }));
                }
            }
        }
        commit_batch(&self.pool, &mut Session::default(), batch).await;
        let mut out = Vec::new();
        for a in answers {
            out.push(match a.await {
                Ok(Ok((Published::New, received))) => format!("new{received}"),
                Ok(Ok((Published::Duplicate, received))) => format!("duplicate{received}"),
                Ok(Err(line)) => line,
                Err(e) => format!("panicked: {e}"),
            });
        }
        out
    }
}

/// A unit of `publish_one_batch`: a publish, and with `mark` (outbox id, claim token)
/// the mark of that row as dispatched. For tests.
#[cfg(feature = "testing")]
#[derive(Debug, Clone)]
pub struct TestPublish {
    pub load_id: String,
    pub event_id: String,
    pub body: String,
    pub mark: Option<(String, String)>,
    /// A publish (no `mark`) that asks for its receive (`publish_receiving`).
    pub receive: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch written as units `kind:load` (`a` append, `p` publish, `n` publish of a
    /// body holding a NUL, `m` publish-and-mark of a row of that load), and its order
    /// after `publishes_first`.
    fn check(units: &str, expected: &str) {
        let batch: Vec<Job> = units
            .split_whitespace()
            .map(|unit| {
                let (kind, load) = unit.split_once(':').unwrap();
                let (load_id, event_id, body, now) = (load.to_owned(), "e".to_owned(), "{}".to_owned(), 0);
                match kind {
                    "a" => {
                        let load_id = haul_core::ids::LoadId::parse(load).unwrap();
                        let args = AppendArgs {
                            load_id,
                            entries: vec![],
                            expected_version: 0,
                            outbox: vec![],
                            receipt: None,
                            claim: None,
                            now,
                        };
                        Job::Append { args, out: None, reply: oneshot::channel().0 }
                    }
                    "p" | "n" => Job::Publish {
                        // `n`: a body no literal can hold.
                        args: PublishArgs {
                            load_id,
                            event_id,
                            body: if kind == "n" { "a\0b".into() } else { body },
                            trace: String::new(),
                            now,
                            receive: None,
                        },
                        out: None,
                        reply: oneshot::channel().0,
                    },
                    _ => {
                        let (id, token, receipt) = (format!("{load}/e1/send_sms"), "t".into(), "r".into());
                        let trace = String::new();
                        let args = PublishMarkArgs { id, token, receipt, load_id, event_id, body, trace, now };
                        Job::PublishMark { args, out: None, reply: oneshot::channel().0 }
                    }
                }
            })
            .collect();
        let mut batch = batch;
        publishes_first(&mut batch);
        let got: Vec<String> = batch
            .iter()
            .map(|job| match job {
                Job::Append { args, .. } => format!("a:{}", args.load_id.as_str()),
                Job::Publish { args, .. } if args.body.contains('\0') => format!("n:{}", args.load_id),
                Job::Publish { args, .. } => format!("p:{}", args.load_id),
                Job::PublishMark { args, .. } => format!("m:{}", args.load_id),
            })
            .collect();
        assert_eq!(got.join(" "), expected, "{units}");
    }

    #[test]
    fn publishes_alone_on_their_loads_go_first_and_units_sharing_a_load_keep_their_order() {
        check("a:L1 p:L2 a:L3 p:L1 m:L4 p:L5", "p:L2 m:L4 p:L5 a:L1 a:L3 p:L1");
        // Already in front, or fewer than two to move: as they came.
        check("p:L2 m:L4 a:L1 p:L1", "p:L2 m:L4 a:L1 p:L1");
        check("a:L1 p:L2 a:L3", "a:L1 p:L2 a:L3");
        // Two publishes to one load keep their order, behind the appends before them.
        check("a:L1 p:L2 p:L2 p:L3 m:L4", "p:L3 m:L4 a:L1 p:L2 p:L2");
        // A value no literal can hold keeps the unit where it was.
        check("a:L1 n:L2 m:L3 p:L4", "m:L3 p:L4 a:L1 n:L2");
    }
}
