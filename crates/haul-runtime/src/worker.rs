//! The load worker: one run per inbound message (ADR 0003).
//!
//! Read the log and its version, project, filter, decide, validate, and append the
//! event, its `decision_recorded` and one outbox row per action in one transaction
//! guarded by the version. The worker is the only writer of a load's log. Whatever
//! goes wrong, the inbound event is never lost: a failing decider becomes the
//! fallback decision, and a run that cannot append leaves the message to the queue.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haul_core::decision::{DECISION_RECORDED, Decision};
use haul_core::derived::Derived;
use haul_core::disposition::{self, Disposition, End, Finish, Happened, Message, Refused};
use haul_core::filter::filter;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, Record};
use haul_core::timers::TimerRoute;
use haul_core::trace::TraceParent;
use haul_core::validate::validate_decision;
use haul_core::{Clock, InboundEvent, QueueMode};
use haul_store::{AppendError, AppendWith, ClaimWith, LoadQueue, NewEntry, NewOutboxRow, Store, StoreError};
use tokio::task::JoinSet;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::decider::Decider;
use crate::faults::{Crash, FaultPoint, Faults};
use crate::projector::Projector;
use crate::queue::{EventQueue, Poison, Received};
use crate::shadow::Shadow;
use crate::spans::{Kind, Span, Spans};

#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// Messages (so loads) in flight at once.
    pub concurrency: usize,
    pub conflict_retries: u32,
    /// A run still going after this is abandoned before it appends.
    pub run_timeout: Duration,
    /// The decider's own time limit (inside `run_timeout`).
    pub decider_timeout: Duration,
    /// The queue's visibility timeout: longer than `run_timeout`.
    pub visibility: Duration,
    pub load_lock: bool,
    /// How long a message left to redelivery waits before it is visible again.
    pub redelivery_delay: Duration,
    /// Where a decision's timers are written: in its append (the TimerStore is the
    /// store's database), or through the outbox.
    pub timers: TimerRoute,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        // The settings' defaults (`haul_config::WorkerConfig`) are the one source.
        let config = haul_config::WorkerConfig::default();
        WorkerSettings {
            concurrency: config.concurrency,
            conflict_retries: config.conflict_retries,
            run_timeout: config.run_timeout,
            decider_timeout: Duration::from_secs(120),
            visibility: Duration::from_secs(360),
            load_lock: false,
            redelivery_delay: Duration::from_secs(1),
            timers: TimerRoute::default(),
        }
    }
}

/// How one run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// Event, decision and outbox rows appended; the message acked.
    Committed { decider: String, filtered: bool, actions: usize },
    /// The event was already in the log (a redelivery): acked, nothing written.
    AlreadyProcessed,
    /// The append found the entry id taken (a concurrent run logged it): acked.
    Duplicate,
    /// Not appended; the queue will redeliver (conflicts spent, store error, late run).
    LeftForRedelivery(String),
    /// Another run of this load holds it (in this process or, with `load_lock`, anywhere).
    Busy,
    /// The message cannot be an event (only a bug upstream makes one): acked and logged.
    Poison(String),
    /// A fault point stopped the run as a dead process would.
    Crashed(Crash),
}

impl RunOutcome {
    fn label(&self) -> &'static str {
        match self {
            RunOutcome::Committed { .. } => "committed",
            RunOutcome::AlreadyProcessed => "already_processed",
            RunOutcome::Duplicate => "duplicate",
            RunOutcome::LeftForRedelivery(_) => "left_for_redelivery",
            RunOutcome::Busy => "busy",
            RunOutcome::Poison(_) => "poison",
            RunOutcome::Crashed(_) => "crashed",
        }
    }
}

pub struct Worker {
    store: Arc<dyn Store>,
    queue: EventQueue,
    decider: Arc<dyn Decider>,
    clock: Arc<dyn Clock>,
    settings: WorkerSettings,
    faults: Faults,
    /// Loads with a run in this process: never two runs of one load here.
    running: Mutex<HashSet<LoadId>>,
    /// Set on shutdown: runs not yet appended give their message back.
    stopping: std::sync::atomic::AtomicBool,
    projector: Projector,
    /// Woken after a commit that wrote outbox rows (in-process dispatchers react at once).
    wake_dispatcher: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// Where the rows it claims with its append go: the dispatcher of this process.
    handoff: std::sync::OnceLock<crate::dispatcher::Handoff>,
    /// The messages this process's publishers received for it (`event_handoff`), until
    /// the worker loop takes the receiver.
    handed_events: Mutex<Option<tokio::sync::mpsc::Receiver<Received>>>,
    /// On the store's own queue a run's ack goes into its append's transaction
    /// (`EventStore::append_acking`); any other queue is acked after the append.
    queue_mode: QueueMode,
    /// Shadow mode: offered each committed decision after the commit.
    shadow: std::sync::OnceLock<Arc<Shadow>>,
    /// Where each attempt's span and its decision's go (off unless set).
    spans: std::sync::OnceLock<Spans>,
}

/// What `Worker::spans` gives before `export_spans`.
static SPANS_OFF: Spans = Spans::OFF;

/// Loads whose snapshot the worker keeps between runs.
const SNAPSHOT_CAPACITY: usize = 1024;

/// Removes the load from `running` however the run ends.
struct Running<'a>(&'a Mutex<HashSet<LoadId>>, LoadId);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

impl Worker {
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn LoadQueue>,
        queue_mode: QueueMode,
        decider: Arc<dyn Decider>,
        clock: Arc<dyn Clock>,
        settings: WorkerSettings,
        faults: Faults,
    ) -> Self {
        Worker {
            decider,
            clock,
            settings,
            faults,
            running: Mutex::new(HashSet::new()),
            stopping: std::sync::atomic::AtomicBool::new(false),
            projector: Projector::new(store.clone(), SNAPSHOT_CAPACITY),
            wake_dispatcher: std::sync::OnceLock::new(),
            handoff: std::sync::OnceLock::new(),
            handed_events: Mutex::new(None),
            shadow: std::sync::OnceLock::new(),
            spans: std::sync::OnceLock::new(),
            queue_mode,
            queue: EventQueue::new(queue),
            store,
        }
    }

    /// Wakes `dispatcher` whenever a run commits outbox rows.
    pub fn wake_on_commit(&self, dispatcher: Arc<tokio::sync::Notify>) {
        let _ = self.wake_dispatcher.set(dispatcher);
    }

    /// Claims the outbox rows of its appends for the dispatcher of this process and
    /// hands them over (`Dispatcher::handoff`): only where that dispatcher's loop runs.
    pub fn hand_claims_to(&self, handoff: crate::dispatcher::Handoff) {
        let _ = self.handoff.set(handoff);
    }

    /// A handoff for this process's publishers (`EventQueue::handing_to`): what they
    /// publish to an idle load comes to this worker received, under its visibility
    /// timeout. Only where the worker loop runs (`loops::worker_loop` takes them).
    pub fn event_handoff(&self) -> crate::queue::EventHandoff {
        let (handoff, from) = crate::queue::EventHandoff::new(self.settings.visibility, self.settings.concurrency);
        *self.handed_events.lock().unwrap_or_else(|e| e.into_inner()) = Some(from);
        handoff
    }

    /// The receiver of the messages handed over, for the worker loop (once).
    pub fn take_handed_events(&self) -> Option<tokio::sync::mpsc::Receiver<Received>> {
        self.handed_events.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// Shadow mode: after each commit, offers the decision to `shadow` (which never
    /// delays the run: `Shadow::offer` does not wait).
    pub fn shadow_with(&self, shadow: Arc<Shadow>) {
        let _ = self.shadow.set(shadow);
    }

    /// Records each run's attempts (CONSUMER spans) and their decisions in `spans`.
    pub fn export_spans(&self, spans: Spans) {
        let _ = self.spans.set(spans);
    }

    fn spans(&self) -> &Spans {
        self.spans.get().unwrap_or(&SPANS_OFF)
    }

    /// From now on, runs that have not appended abandon and give their message back
    /// at once, so another process picks it up: nothing half-done at shutdown.
    pub fn stop(&self) {
        self.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Receives up to `max` messages (for the serve loop, which runs them itself).
    pub async fn receive(&self, max: usize) -> Result<Vec<Received>, StoreError> {
        self.queue.receive(max, self.settings.visibility, self.clock.now()).await
    }

    /// Whether a receive that answered fewer messages than asked drained the queue
    /// (`LoadQueue::short_receive_drains`).
    pub fn short_receive_drains(&self) -> bool {
        self.queue.short_receive_drains()
    }

    pub fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// Receives up to `concurrency` messages and runs them (one per load, at once).
    /// Returns the outcomes; empty when nothing was visible.
    pub async fn run_once(self: &Arc<Self>) -> Result<Vec<RunOutcome>, StoreError> {
        let free =
            self.settings.concurrency.saturating_sub(self.running.lock().unwrap_or_else(|p| p.into_inner()).len());
        if free == 0 {
            return Ok(vec![]);
        }
        let messages = self.queue.receive(free, self.settings.visibility, self.clock.now()).await?;
        let mut runs = JoinSet::new();
        for m in messages {
            let w = self.clone();
            runs.spawn(async move { w.process(m).await });
        }
        let mut outcomes = Vec::new();
        while let Some(r) = runs.join_next().await {
            match r {
                Ok(o) => outcomes.push(o),
                Err(e) => error!(error = %e, "a run panicked; its message will be redelivered"),
            }
        }
        Ok(outcomes)
    }

    /// One run for one message.
    pub async fn process(&self, msg: Received) -> RunOutcome {
        // The trace's id for every line of the run; each attempt records its own span id.
        let trace_id = msg.trace.map(|t| t.trace_id_hex());
        let span = info_span!(
            "run",
            load_id = %msg.load_id,
            event_id = %msg.event_id,
            receive_count = msg.receive_count,
            trace_id = trace_id.as_deref(),
            span_id = tracing::field::Empty,
        );
        let started = Instant::now();
        let outcome = self.process_inner(&msg, started).instrument(span).await;
        // One line per run, its fields at the top level (what a log shipper indexes).
        let (load_id, event_id, outcome_label) = (msg.load_id.as_str(), msg.event_id.as_str(), outcome.label());
        let duration_ms = started.elapsed().as_millis() as u64;
        let trace_id = trace_id.as_deref();
        match &outcome {
            RunOutcome::Committed { decider, filtered, actions } => {
                info!(
                    load_id,
                    event_id,
                    outcome = outcome_label,
                    decider,
                    filtered,
                    actions,
                    duration_ms,
                    trace_id,
                    "run"
                )
            }
            RunOutcome::LeftForRedelivery(why) => {
                warn!(load_id, event_id, outcome = outcome_label, why, duration_ms, trace_id, "run left for redelivery")
            }
            RunOutcome::Poison(why) => {
                error!(
                    load_id,
                    event_id,
                    outcome = outcome_label,
                    why,
                    duration_ms,
                    trace_id,
                    "run dropped a message that is not an event"
                )
            }
            RunOutcome::Crashed(c) => {
                info!(load_id, event_id, outcome = outcome_label, %c, duration_ms, trace_id, "run crashed at a fault point")
            }
            // Another run has the load, or the event is in the log already: no news.
            _ => debug!(load_id, event_id, outcome = outcome_label, duration_ms, trace_id, "run"),
        }
        metrics::counter!("haul_runs_total", "outcome" => outcome.label()).increment(1);
        metrics::histogram!("haul_run_duration_seconds").record(started.elapsed().as_secs_f64());
        outcome
    }

    async fn process_inner(&self, msg: &Received, started: Instant) -> RunOutcome {
        let event = match &msg.event {
            Ok(e) => e,
            Err(Poison(why)) => {
                metrics::counter!("haul_queue_poison_total").increment(1);
                return self.refuse(msg, Refused::Poison(why.clone())).await;
            }
        };
        let load = msg.load_id.clone();
        if !self.running.lock().unwrap_or_else(|p| p.into_inner()).insert(load.clone()) {
            return self.refuse(msg, Refused::BusyHere).await;
        }
        let _running = Running(&self.running, load.clone());
        let lease = if self.settings.load_lock {
            match self.store.try_lock(&load, self.settings.run_timeout, self.clock.now()).await {
                Ok(Some(lease)) => Some(lease),
                Ok(None) => {
                    metrics::counter!("haul_load_lock_busy_total").increment(1);
                    return self.refuse(msg, Refused::LockedElsewhere).await;
                }
                Err(e) => {
                    // The lease is an optimization: without it the version check still holds.
                    warn!(error = %e, "LoadLock unavailable; running without it");
                    None
                }
            }
        } else {
            None
        };
        let outcome = match self.run(msg, event, started).await {
            Ok(o) => o,
            Err(crash) => return RunOutcome::Crashed(crash),
        };
        if let Some(lease) = lease
            && let Err(e) = lease.release().await
        {
            warn!(error = %e, "releasing the LoadLock failed; it lapses on its own");
        }
        outcome
    }

    async fn refuse(&self, msg: &Received, refused: Refused) -> RunOutcome {
        let (context, began) = (msg.trace.map(|t| crate::trace::child(&t)), self.clock.now());
        let outcome = self.finish(msg, disposition::refuse(refused, &self.policy()), None).await;
        self.record_attempt(msg, context, began, 0, Attempt::Ended(&outcome));
        outcome
    }

    /// Attempts until the disposition finishes the run: the first decision, then a
    /// re-decision after each conflict or the fallback after a reused action key.
    async fn run(&self, msg: &Received, event: &InboundEvent, started: Instant) -> Result<RunOutcome, Crash> {
        let mut fallback: Option<String> = None;
        let mut attempt = 0;
        loop {
            // Each attempt is a span of its own in the message's trace: a re-decision
            // after a conflict too. What it appends keeps this context.
            let (context, began) = (msg.trace.map(|t| crate::trace::child(&t)), self.clock.now());
            let prepared = self.prepare(msg, event, fallback.as_deref(), started, context).await?;
            let then = self.go_on(msg, event, prepared, attempt, fallback.is_some()).await?;
            self.record_attempt(msg, context, began, attempt, Attempt::of(&then));
            match then {
                Then::Done(outcome) => return Ok(outcome),
                Then::Redecide => {}
                Then::Fallback(why) => fallback = Some(why),
            }
            attempt += 1;
        }
    }

    /// The attempt's CONSUMER span: a child of the context the message was published
    /// with, and linked to it (the messaging conventions' link to the creation context).
    fn record_attempt(
        &self,
        msg: &Received,
        context: Option<TraceParent>,
        began: haul_core::Timestamp,
        attempt: u32,
        how: Attempt<'_>,
    ) {
        let (Some(context), Some(from)) = (context, msg.trace) else { return };
        let end = self.clock.now();
        self.spans().record(|| {
            let span = Span::new("process loads", Kind::Consumer, context, Some(&from), began, end)
                .link(from)
                .attr("messaging.system", self.queue.system())
                .attr("messaging.operation.type", "process")
                .attr("messaging.operation.name", "process")
                .attr("messaging.destination.name", "loads")
                .attr("messaging.message.id", msg.event_id.as_str())
                .attr("haul.load_id", msg.load_id.as_str())
                .attr("haul.attempt", attempt)
                .attr("haul.receive_count", msg.receive_count)
                .attr("haul.outcome", how.label());
            match how.failure() {
                Some(why) => span.failed(how.label(), why),
                None => span,
            }
        });
    }

    /// Appends a prepared attempt, then carries out the disposition of what happened.
    async fn go_on(
        &self,
        msg: &Received,
        event: &InboundEvent,
        prepared: Prepare,
        attempt: u32,
        fallback: bool,
    ) -> Result<Then, Crash> {
        let (happened, committed) = match prepared {
            Prepare::Done(happened) => (happened, None),
            Prepare::Ready(p) => self.commit(msg, event, p).await?,
        };
        Ok(match disposition::dispose(happened, attempt, fallback, &self.policy()) {
            Disposition::Finish(f) => Then::Done(self.finish(msg, f, committed).await),
            Disposition::Redecide => Then::Redecide,
            Disposition::Fallback(why) => Then::Fallback(why),
        })
    }

    /// Does what the disposition says to the message, then reports how the run ended
    /// (after a commit: the snapshot, the load index and the dispatcher's wake-up).
    async fn finish(
        &self,
        msg: &Received,
        Finish { message, end }: Finish,
        committed: Option<Committed>,
    ) -> RunOutcome {
        match message {
            Message::Ack => self.ack(msg).await,
            Message::Nack { delay } => self.nack(msg, delay).await,
            Message::AckedWithAppend => {}
        }
        match end {
            End::Committed => self.committed(msg, committed.expect("only an append commits")).await,
            End::AlreadyProcessed => RunOutcome::AlreadyProcessed,
            End::Duplicate => RunOutcome::Duplicate,
            End::Left(why) => RunOutcome::LeftForRedelivery(why),
            End::Busy => RunOutcome::Busy,
            End::Poison(why) => RunOutcome::Poison(why),
        }
    }

    fn policy(&self) -> disposition::Policy {
        disposition::Policy {
            conflict_retries: self.settings.conflict_retries,
            redelivery_delay: self.settings.redelivery_delay,
        }
    }

    /// Read, project, filter, decide: everything before the append.
    async fn prepare(
        &self,
        msg: &Received,
        event: &InboundEvent,
        fallback_reason: Option<&str>,
        started: Instant,
        context: Option<TraceParent>,
    ) -> Result<Prepare, Crash> {
        let load = &msg.load_id;
        let state = match self.projector.take(load, msg.log_version).await {
            Ok(s) => s,
            Err(e) => return Ok(Prepare::Done(Happened::ReadFailed(e.to_string()))),
        };
        let version = state.version;
        if state.processed.contains(&event.event_id) {
            self.projector.put(load, state);
            return Ok(Prepare::Done(Happened::AlreadyProcessed));
        }
        self.faults.check(FaultPoint::AfterRead, event.event_id.as_str())?;
        let now = self.clock.now();
        let decision = match fallback_reason {
            Some(why) => Decision::fallback(load, &event.event_id, event.kind(), now, why),
            None => self.decide(load, &state, event, now).await,
        };
        if let Some(attempt) = &context {
            let end = self.clock.now();
            self.spans().record(|| decision_span(crate::trace::child(attempt), attempt, now, end, &decision));
        }
        self.faults.check(FaultPoint::AfterDecide, event.event_id.as_str())?;
        if self.is_stopping() {
            return Ok(Prepare::Done(Happened::Stopping));
        }
        if started.elapsed() > self.settings.run_timeout {
            return Ok(Prepare::Done(Happened::TimedOut));
        }
        Ok(Prepare::Ready(Box::new(Prepared { version, state, decision, now, trace: context })))
    }

    /// The append, guarded by the version the run read. What happened, and the run as
    /// committed when it did.
    async fn commit(
        &self,
        msg: &Received,
        event: &InboundEvent,
        p: Box<Prepared>,
    ) -> Result<(Happened, Option<Committed>), Crash> {
        let ctx = event.event_id.as_str();
        let route = self.settings.timers;
        let settled = match settle_timers(&msg.load_id, route, event, &p) {
            Ok(s) => s,
            Err(key) => {
                error!(%key, decider = %p.decision.decider, "decision reused a timer's action key; falling back to a Hero task");
                return Ok((Happened::DuplicateActionKey(key), None));
            }
        };
        // The run's event and decision, then each settled timer's outcome and noop.
        let pairs: Vec<(&InboundEvent, &Decision)> =
            std::iter::once((event, &p.decision)).chain(settled.iter().map(|(e, d)| (e, d))).collect();
        // The prompts a model call was given, stored with the decision that names them.
        let prompts = match &p.decision.llm {
            Some(u) => self
                .decider
                .prompt_texts(&msg.load_id, &p.state, event, p.now)
                .into_iter()
                .filter(|(hash, _)| *hash == u.prompt_hash || *hash == u.input_hash)
                .collect(),
            None => vec![],
        };
        let trace = p.trace;
        if let Some(t) = &trace {
            tracing::Span::current().record("span_id", t.span_id_hex());
        }
        let (entries, outbox) = match rows(&msg.load_id, route, &pairs, prompts, trace) {
            Ok(r) => r,
            Err(e) => return Ok((Happened::Unencodable(e), None)),
        };
        if self.faults.bugs.ack_before_append {
            // The planted bug: the ack the disposition gives after the append, before it.
            self.ack(msg).await;
            self.faults.check(FaultPoint::AfterAppend, ctx)?;
        }
        let (appended, with_ack, handed) = self.append(msg, entries, p.version, outbox, p.now).await;
        let happened = match appended {
            Ok(_) => {
                if self.faults.check(FaultPoint::AppendAnswerLost, ctx).is_err() {
                    return Ok((Happened::AnswerLost, None));
                }
                self.faults.check(FaultPoint::AfterAppend, ctx)?;
                let records = Record::appended_all(p.version, pairs, p.now);
                let Prepared { state, decision, .. } = *p;
                let committed = Committed { before: state, decision, records, handed };
                return Ok((Happened::Appended { with_ack }, Some(committed)));
            }
            Err(AppendError::ConcurrencyConflict(c)) => {
                metrics::counter!("haul_append_conflicts_total").increment(1);
                debug!(%c, "conflict: re-read, re-project, re-decide");
                // For the operators' query of the loads with the most conflicts; a
                // count that fails to be kept changes nothing else.
                if let Err(e) = self.store.record_conflict(&msg.load_id, p.now).await {
                    debug!(error = %e, "the conflict could not be counted for the load");
                }
                Happened::Conflict
            }
            Err(AppendError::DuplicateEntry(_)) => Happened::DuplicateEntry,
            Err(AppendError::DuplicateActionKey(k)) => {
                error!(key = %k.key, decider = %p.decision.decider, "decision reused an action key; falling back to a Hero task");
                Happened::DuplicateActionKey(k.key)
            }
            Err(AppendError::Store(e)) => Happened::AppendFailed(e.to_string()),
        };
        Ok((happened, None))
    }

    /// The append at `version`; with the ack in its transaction on the store's own
    /// queue (the second value says so), and its outbox rows claimed with it and handed
    /// to this process's dispatcher when there is room for them all (the third). The
    /// planted `skip_version_check` bug appends a stale decision at whatever version the
    /// store has.
    async fn append(
        &self,
        msg: &Received,
        entries: Vec<NewEntry>,
        version: u64,
        outbox: Vec<NewOutboxRow>,
        now: haul_core::Timestamp,
    ) -> (Result<u64, AppendError>, bool, bool) {
        let load = &msg.load_id;
        if self.faults.bugs.skip_version_check {
            let appended = match self.store.append(load, entries.clone(), version, outbox.clone(), now).await {
                Err(AppendError::ConcurrencyConflict(c)) => {
                    self.store.append(load, entries, c.actual, outbox, now).await
                }
                other => other,
            };
            return (appended, false, false);
        }
        // On the store's own queue the ack goes into the append's transaction.
        let receipt = match self.queue_mode {
            QueueMode::StoreQueue => Some(msg.receipt.as_str()),
            QueueMode::Separate => None,
        };
        // Room for every row in the dispatcher's channel, or none is claimed: the room,
        // the claim the rows are written with, and the rows to hand over.
        let handing = self.handoff.get().and_then(|h| {
            let room = h.to.try_reserve_many(outbox.len()).ok()?;
            let claim = ClaimWith { token: h.tokens.next(), lease_until: haul_core::time::add(now, h.lease) };
            Some((room, claim, outbox.clone()))
        });
        let with = AppendWith { receipt, claim: handing.as_ref().map(|(_, claim, _)| claim) };
        let appended = self.store.append_with(load, entries, version, outbox, with, now).await;
        let handed = match (&appended, handing) {
            (Ok(_), Some((room, claim, rows))) => {
                for (slot, row) in room.zip(rows) {
                    slot.send(claim.claim_of(load, row, now));
                }
                true
            }
            _ => false,
        };
        if receipt.is_some()
            && let Ok((_, false)) = appended
        {
            // As a separate ack would have: the event is logged; the new holder's run
            // finds it processed.
            warn!("the message's receipt was stale at the append; it will be redelivered and found processed");
        }
        (appended.map(|(v, _)| v), receipt.is_some(), handed)
    }

    /// After a commit: the load index, the shadow's offer, the snapshot, the
    /// dispatcher's wake-up.
    async fn committed(&self, msg: &Received, c: Committed) -> RunOutcome {
        let load = &msg.load_id;
        let Committed { before, decision: d, records, handed } = c;
        if let (Some(shadow), Ok(event), Some(first)) = (self.shadow.get(), &msg.event, records.first()) {
            shadow.offer(load, &before, event, first.seq, &d);
        }
        let mut state = before;
        for r in &records {
            state.apply(r);
        }
        self.projector.put(load, state);
        // Rows handed over wake the dispatcher's loop themselves; a claim would find them taken.
        if !handed
            && d.actions.iter().any(|a| !self.settings.timers.in_append(a))
            && let Some(w) = self.wake_dispatcher.get()
        {
            w.notify_one();
        }
        metrics::counter!("haul_decisions_total", "decider" => d.decider.clone(), "filtered" => d.filtered.to_string())
            .increment(1);
        spend_committed(load, &d);
        RunOutcome::Committed { decider: d.decider, filtered: d.filtered, actions: d.actions.len() }
    }

    /// Two runs that both read before either appends, as two processes given two
    /// messages of one load at once would (a queue without per-load order, or a
    /// visibility lapse): `self` appends first, `other` second, then `other` goes on
    /// as a run does after a conflict. The simulator drives this; the version check
    /// is what keeps it harmless.
    pub async fn interleave(&self, a: Received, other: &Worker, b: Received) -> (RunOutcome, RunOutcome) {
        let (Ok(ea), Ok(eb)) = (&a.event, &b.event) else {
            return (self.process(a).await, other.process(b).await);
        };
        let started = Instant::now();
        let pa = self.prepare(&a, ea, None, started, a.trace.map(|t| crate::trace::child(&t))).await;
        let pb = other.prepare(&b, eb, None, started, b.trace.map(|t| crate::trace::child(&t))).await;
        let ra = self.go_on_interleaved(&a, ea, pa, started).await;
        let rb = other.go_on_interleaved(&b, eb, pb, started).await;
        (ra, rb)
    }

    /// Appends an interleaved run; after a conflict or a fallback, a run from its
    /// first attempt.
    async fn go_on_interleaved(
        &self,
        msg: &Received,
        event: &InboundEvent,
        prepared: Result<Prepare, Crash>,
        started: Instant,
    ) -> RunOutcome {
        let then = match prepared {
            Ok(p) => self.go_on(msg, event, p, 0, false).await,
            Err(c) => Err(c),
        };
        match then {
            Ok(Then::Done(o)) => o,
            Ok(Then::Redecide | Then::Fallback(_)) => {
                self.run(msg, event, started).await.unwrap_or_else(RunOutcome::Crashed)
            }
            Err(c) => RunOutcome::Crashed(c),
        }
    }
    /// The filter (operator actions included), else the decider under its time limit;
    /// a failed, late or invalid decision becomes the fallback.
    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: haul_core::Timestamp,
    ) -> Decision {
        if let Some(d) = filter(load, state, event, now) {
            // An operator's decision is checked as a decider's is: it names keys.
            if d.decider != haul_core::operator::OPERATOR_DECIDER {
                return d;
            }
            match validate_decision(load, state, event, &d) {
                Ok(()) => return d,
                Err(why) => {
                    let why = format!("the operator decision did not validate: {why}");
                    warn!(why, "fallback decision");
                    return Decision::fallback(load, &event.event_id, event.kind(), now, &why);
                }
            }
        }
        // Inside the run's own limit with room to append the fallback, so a late
        // decider ends in a fallback decision, not an abandoned run.
        let limit = self.settings.decider_timeout.min(self.settings.run_timeout.mul_f64(0.8));
        // A model that answered spent its tokens even when its answer made no decision:
        // the fallback records them.
        let (why, spent) = match tokio::time::timeout(limit, self.decider.decide(load, state, event, now)).await {
            Err(_) => (format!("the {} decider did not answer within {limit:?}", self.decider.name()), None),
            Ok(Err(e)) => {
                let spent = e.downcast_ref::<crate::llm::Spent>().and_then(|s| s.usage.clone());
                (format!("the {} decider failed: {e:#}", self.decider.name()), spent)
            }
            Ok(Ok(d)) => match validate_decision(load, state, event, &d) {
                Ok(()) => return d,
                Err(why) => (format!("the {} decision did not validate: {why}", self.decider.name()), d.llm),
            },
        };
        warn!(why, "fallback decision");
        let mut fallback = Decision::fallback(load, &event.event_id, event.kind(), now, &why);
        fallback.llm = spent;
        fallback
    }

    async fn ack(&self, msg: &Received) {
        if let Err(e) = self.queue.ack(&msg.receipt, self.clock.now()).await {
            // The run's work is durable; a lost ack only means a redelivery, which
            // the log turns into "already processed".
            warn!(error = %e, "ack failed; the message will be redelivered and found processed");
        }
    }

    async fn nack(&self, msg: &Received, delay: Duration) {
        if let Err(e) = self.queue.nack(&msg.receipt, delay, self.clock.now()).await {
            warn!(error = %e, "nack failed; the visibility timeout will redeliver");
        }
    }
}

enum Prepare {
    Ready(Box<Prepared>),
    /// The run stops before its append.
    Done(Happened),
}

/// A decision ready to append at the version it was made on.
struct Prepared {
    version: u64,
    state: LoadState,
    decision: Decision,
    now: haul_core::Timestamp,
    /// The attempt's context, which what it appends keeps.
    trace: Option<TraceParent>,
}

/// A run whose append committed: the state it decided on, its decision, and the
/// records the append wrote.
struct Committed {
    before: LoadState,
    decision: Decision,
    records: Vec<Record>,
    /// Its outbox rows were claimed with the append and handed to the dispatcher.
    handed: bool,
}

/// Where a run goes after an attempt.
enum Then {
    Done(RunOutcome),
    Redecide,
    Fallback(String),
}

/// How an attempt ended, as its span says.
#[derive(Clone, Copy)]
enum Attempt<'a> {
    Ended(&'a RunOutcome),
    /// Its append met a newer version: the run decides again.
    Conflict,
    /// Its decision could not be appended as it was: the fallback is appended instead.
    Fallback(&'a str),
}

impl<'a> Attempt<'a> {
    fn of(then: &'a Then) -> Attempt<'a> {
        match then {
            Then::Done(o) => Attempt::Ended(o),
            Then::Redecide => Attempt::Conflict,
            Then::Fallback(why) => Attempt::Fallback(why),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Attempt::Ended(o) => o.label(),
            Attempt::Conflict => "conflict",
            Attempt::Fallback(_) => "fallback",
        }
    }

    /// What went wrong, when the attempt failed (a conflict is the version check
    /// working, not a failure).
    fn failure(self) -> Option<&'a str> {
        match self {
            Attempt::Ended(RunOutcome::LeftForRedelivery(why) | RunOutcome::Poison(why)) => Some(why),
            Attempt::Fallback(why) => Some(why),
            _ => None,
        }
    }
}

/// The decision's span (a child of its attempt's): who decided and, for a model,
/// what the call was and cost, by OpenTelemetry's GenAI conventions.
fn decision_span(
    context: TraceParent,
    attempt: &TraceParent,
    start: haul_core::Timestamp,
    end: haul_core::Timestamp,
    d: &Decision,
) -> Span {
    let span = Span::new("decide", Kind::Internal, context, Some(attempt), start, end)
        .attr("haul.decider", d.decider.as_str())
        .attr("haul.filtered", d.filtered)
        .attr("haul.actions", d.actions.len() as u64)
        .attr("haul.needs_hero_task", d.needs_hero_task)
        .attr_opt("haul.prompt_version", d.prompt_version.clone());
    let span = match &d.llm {
        None => span,
        Some(u) => span
            .attr("gen_ai.operation.name", "chat")
            .attr("gen_ai.request.model", u.model.as_str())
            .attr_opt("gen_ai.response.model", u.model_version.clone())
            .attr("gen_ai.usage.input_tokens", u.input_tokens)
            .attr("gen_ai.usage.output_tokens", u.output_tokens)
            .attr_opt("gen_ai.response.finish_reasons", u.finish_reason.clone().map(|r| vec![r]))
            .attr_opt("haul.llm.cost_micro_usd", u.cost_micro_usd),
    };
    match &d.budget {
        Some(b) => span.attr("haul.budget_exceeded", b.scope.as_str()),
        None => span,
    }
}

/// The outcomes that settle the decision's timers in its own append, with the
/// filter's noop on each (`haul_core::timers`); none through the outbox. `Err(key)`
/// when the decision reused a timer's key.
fn settle_timers(
    load: &LoadId,
    route: TimerRoute,
    event: &InboundEvent,
    p: &Prepared,
) -> Result<Vec<(InboundEvent, Decision)>, String> {
    if !p.decision.actions.iter().any(|a| route.in_append(a)) {
        return Ok(vec![]);
    }
    let mut after = p.state.clone();
    for r in Record::appended(p.version, event, &p.decision, p.now) {
        after.apply(&r);
    }
    route.settled(load, &after, &p.decision, p.now)
}

/// What a committed decision spent, in the metrics per client and model; the OpsAlert
/// of the first decision past a budget (once per load, once per client and day).
fn spend_committed(load: &LoadId, d: &Decision) {
    if let Some(u) = &d.llm {
        let client = crate::metrics_label::client(u.client.as_deref());
        let model = crate::metrics_label::model(&u.model);
        let labels = |direction: &'static str| {
            [("client", client.clone()), ("model", model.clone()), ("direction", direction.to_owned())]
        };
        metrics::counter!("haul_llm_tokens_total", &labels("input")).increment(u.input_tokens);
        metrics::counter!("haul_llm_tokens_total", &labels("output")).increment(u.output_tokens);
        metrics::counter!("haul_llm_cost_micro_usd_total", "client" => client, "model" => model)
            .increment(u.cost_micro_usd.unwrap_or(0));
    }
    if let Some(b) = &d.budget {
        metrics::counter!("haul_llm_budget_capped_total", "scope" => b.scope.as_str()).increment(1);
        if b.first {
            metrics::counter!("haul_ops_alerts_total", "kind" => "llm_budget").increment(1);
            error!(
                alert = "llm_budget",
                load_id = %load,
                event_id = %d.event_id,
                scope = b.scope.as_str(),
                client = b.client.as_deref().unwrap_or(""),
                limit = b.limit,
                spent = b.spent,
                "OpsAlert: {b}; the SOP decides in the model's place"
            );
        }
    }
}

/// The log entries and the outbox rows of one run from its events and decisions (the
/// run's own, then each settled timer's outcome and noop): a row for each action the
/// append does not carry out itself, and the timers it does in its decision's delta.
/// Each keeps the run's trace context.
fn rows(
    load: &LoadId,
    route: TimerRoute,
    pairs: &[(&InboundEvent, &Decision)],
    prompts: Vec<(String, String)>,
    trace: Option<TraceParent>,
) -> Result<(Vec<NewEntry>, Vec<NewOutboxRow>), String> {
    let mut entries = Vec::with_capacity(2 * pairs.len());
    let mut prompts = Some(prompts);
    for &(e, d) in pairs {
        let decision = serde_json::to_value(d).map_err(|e| format!("cannot encode the decision: {e}"))?;
        let mut derived = Derived::of_decision(d);
        derived.timers = route.writes(load, d);
        // The run's own decision (the first) is the one a model made.
        derived.prompts = prompts.take().unwrap_or_default();
        // Typed here, so what each changes in the load's derived data needs no decoding.
        entries.push(NewEntry {
            entry_id: e.event_id.to_string(),
            kind: e.kind().into(),
            payload: e.body.payload(),
            derived: Derived::of_event(&e.event_id, &e.body),
            trace,
        });
        entries.push(NewEntry {
            entry_id: d.decision_id.clone(),
            kind: DECISION_RECORDED.into(),
            payload: decision,
            derived,
            trace,
        });
    }
    let mut outbox = Vec::new();
    for a in pairs.iter().flat_map(|(_, d)| &d.actions).filter(|a| !route.in_append(a)) {
        let action = serde_json::to_value(a).map_err(|e| format!("cannot encode action {}: {e}", a.key))?;
        outbox.push(NewOutboxRow { id: a.key.clone(), action_type: a.action_type(), action, trace });
    }
    Ok((entries, outbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `outcome` label of `haul_runs_total` (docs/operations.md) per way a run ends.
    #[test]
    fn each_outcome_has_its_metric_label() {
        let crash = Crash { point: FaultPoint::AfterRead, context: String::new() };
        let labels = [
            (RunOutcome::Committed { decider: "sop".into(), filtered: false, actions: 0 }, "committed"),
            (RunOutcome::AlreadyProcessed, "already_processed"),
            (RunOutcome::Duplicate, "duplicate"),
            (RunOutcome::LeftForRedelivery(String::new()), "left_for_redelivery"),
            (RunOutcome::Busy, "busy"),
            (RunOutcome::Poison(String::new()), "poison"),
            (RunOutcome::Crashed(crash), "crashed"),
        ];
        for (outcome, label) in labels {
            assert_eq!(outcome.label(), label, "{outcome:?}");
        }
    }
}
