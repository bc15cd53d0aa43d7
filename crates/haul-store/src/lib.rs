//! The storage contracts of ADR 0003, with no backend behind them.
//!
//! `EventStore`, `Outbox`, `TimerStore`, `LoadQueue`, `LoadLock` and `Prune` are traits; each
//! backend (haul-sqlite, haul-postgres, later SQS for the queue) implements them and
//! proves it by running [`contract`], the one suite written once. Every method takes
//! `now` from the caller: stores never read a clock, so evals and the simulator drive
//! them with a fake one.

use std::time::Duration;

use async_trait::async_trait;
use haul_core::action::ActionType;
use haul_core::derived::Derived;
use haul_core::dispatch::{Alert, AlertKind};
use haul_core::ids::{LoadId, TimerId};
use haul_core::limit::{Grant, Limit};
use haul_core::log::Entry;
use haul_core::projection::Record;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most loads one `LoadIndex::clients_of` asks about: a claim's batch (at most 1,000).
pub const MAX_CLIENTS_OF: usize = 1_000;
/// Most rows one `Outbox::hold_all` holds: a claim's batch (at most 1,000).
pub const MAX_HOLDS: usize = 1_000;

/// The error of a call given more than its bound.
pub fn too_many(what: &str, n: usize, most: usize) -> StoreError {
    StoreError::new(format!("{n} {what} at once; at most {most}"))
}

pub mod backend;
pub mod contract;
pub mod ops;
pub mod queue_contract;

pub use ops::{
    ConflictLoad, DeadRow, InboxAlert, InboxCounts, InboxMark, InboxSms, LoadFilter, LoadSummary, LoadsPage,
    OpsQueries, SmsDismissal,
};

// ---------------------------------------------------------------------------------
// Errors. Callers branch on these, so each has its own type (the names are ADR 0003's).

/// The store failed (unreachable, IO, a constraint we did not expect). Transient as far
/// as callers know: the run is left to the queue's redelivery.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("store error: {0}")]
pub struct StoreError(pub String);

impl StoreError {
    pub fn new(msg: impl Into<String>) -> Self {
        StoreError(msg.into())
    }
}

/// The log moved on since the run read it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("concurrency conflict on load {load_id}: expected version {expected}, found {actual}")]
pub struct ConcurrencyConflictError {
    pub load_id: String,
    pub expected: u64,
    pub actual: u64,
}

/// An entry id is already in the load's log: the event was already processed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("entry {entry_id} is already in the log of load {load_id}")]
pub struct DuplicateEntryError {
    pub load_id: String,
    pub entry_id: String,
}

/// An outbox key is already taken: a decision bug (ADR 0003); the run falls back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("action key {key} is already in the outbox")]
pub struct DuplicateActionKeyError {
    pub key: String,
}

/// The claim token is not the row's current one: another dispatcher owns the row.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale claim on outbox row {outbox_id}")]
pub struct StaleClaimError {
    pub outbox_id: String,
}

/// What `EventStore::append` can fail with, checked in this order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    #[error(transparent)]
    ConcurrencyConflict(#[from] ConcurrencyConflictError),
    #[error(transparent)]
    DuplicateEntry(#[from] DuplicateEntryError),
    #[error(transparent)]
    DuplicateActionKey(#[from] DuplicateActionKeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error(transparent)]
    Stale(#[from] StaleClaimError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A queue receipt that is no longer the message's current one (its visibility lapsed
/// and it went to another receiver, or it was acked already).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("stale receipt {0}")]
    StaleReceipt(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

// ---------------------------------------------------------------------------------
// The event log.

/// An entry to append, in its stored form, with what it changes in the load's derived
/// data (`haul_core::derived`), which the append writes in its transaction: the store
/// reads no payload. `seq` and `recorded_at` are the store's.
#[derive(Clone, Debug, PartialEq)]
pub struct NewEntry {
    pub entry_id: String,
    pub kind: String,
    pub payload: Value,
    pub derived: Derived,
    /// The trace context of the run that appends it, kept with the entry; the timers
    /// its append schedules keep it too.
    pub trace: Option<TraceParent>,
}

impl NewEntry {
    /// The stored form of a typed entry: what the worker appends.
    pub fn typed(entry_id: &str, entry: &Entry) -> NewEntry {
        NewEntry {
            entry_id: entry_id.to_owned(),
            kind: entry.kind().to_owned(),
            payload: entry.payload(),
            derived: Derived::of(entry),
            trace: None,
        }
    }

    /// The trace context one append's `entries` were written in (one run writes them
    /// all): what the timers the append schedules keep, in every backend.
    pub fn run_trace(entries: &[NewEntry]) -> Option<TraceParent> {
        entries.iter().find_map(|e| e.trace)
    }

    /// A record's entry again: what copying it to another log appends.
    pub fn of(r: &Record) -> NewEntry {
        NewEntry::typed(&r.entry_id, &r.entry)
    }

    /// An entry given in its stored form (a copy, a test): read once for what it
    /// changes; one this build cannot read changes nothing but the log.
    pub fn stored(entry_id: impl Into<String>, kind: impl Into<String>, payload: Value) -> NewEntry {
        let (entry_id, kind) = (entry_id.into(), kind.into());
        let derived = Derived::of(&Entry::decode(&entry_id, &kind, payload.clone()));
        NewEntry { entry_id, kind, payload, derived, trace: None }
    }
}

/// One outbox row to write with a decision; `id` is the action key.
#[derive(Clone, Debug, PartialEq)]
pub struct NewOutboxRow {
    pub id: String,
    pub action_type: ActionType,
    /// The whole action (`{key, type, ask_id?, step?, params}`).
    pub action: Value,
    /// The trace context of the run that decided it: each send continues it.
    pub trace: Option<TraceParent>,
}

#[async_trait]
pub trait EventStore: Send + Sync {
    /// The load's records in `seq` order and its version (last `seq`, 0 when empty).
    async fn read(&self, load_id: &LoadId) -> Result<(Vec<Record>, u64), StoreError>;

    /// The records after `after_seq` and the version: how a cached snapshot at
    /// `after_seq` catches up with the log (the log is append-only, so snapshot plus
    /// tail is the full fold).
    async fn read_after(&self, load_id: &LoadId, after_seq: u64) -> Result<(Vec<Record>, u64), StoreError>;

    /// Appends `entries` and writes `outbox` in one transaction, only if the version is
    /// still `expected_version`. Checks, in order: the version, the entry ids, the
    /// outbox keys; writes nothing when one fails. Returns the new version.
    ///
    /// Every outbox id is an action key, `{load_id}/...` (docs/design.md); a row whose id
    /// names another load is refused with a `StoreError` before anything is checked.
    /// That is what lets PostgreSQL keep the outbox unique per `(load_id, id)`
    /// (partitioned by load) and still have every id unique globally.
    async fn append(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        now: Timestamp,
    ) -> Result<u64, AppendError> {
        Ok(self.append_with(load_id, entries, expected_version, outbox, AppendWith::default(), now).await?.0)
    }

    /// `append`, and in the same transaction the ack of `receipt`, a receipt of this
    /// store's own `LoadQueue` (the message the run is for): the message is acked if
    /// and only if the append commits, so "ack only after the append committed" holds
    /// with one commit instead of two. Returns the new version and whether the receipt
    /// was still current: a stale receipt (redelivered, already acked) acks nothing and
    /// does not stop the append, as a separate ack after the commit would not have.
    /// When the append fails, nothing is acked and the receipt stays good.
    async fn append_acking(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        receipt: &str,
        now: Timestamp,
    ) -> Result<(u64, bool), AppendError> {
        let with = AppendWith { receipt: Some(receipt), claim: None };
        self.append_with(load_id, entries, expected_version, outbox, with, now).await
    }

    /// The append every other is: `append`, with `with.receipt` acked as
    /// `append_acking` acks it, and with `with.claim` every outbox row it writes
    /// claimed in the same transaction, as a dispatcher's claim would take it (first
    /// attempt now, leased until `claim.lease_until`): a dispatcher of the same process
    /// is then handed the rows and sends them without a claim of its own, one statement
    /// and one commit fewer between the decision and its send. Returns the new version
    /// and whether the receipt was acked (false without one).
    async fn append_with(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        with: AppendWith<'_>,
        now: Timestamp,
    ) -> Result<(u64, bool), AppendError>;

    /// At most `limit` records after `after_seq`, in `seq` order: one page of the log,
    /// for readers that must not hold a long log whole (`GET /v1/loads/{id}` folds and
    /// shows a log page by page). Records are gapless from 1, so the last record's `seq`
    /// is where the next page starts.
    async fn read_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// Load ids with a log, in id order, after `after`, at most `limit`.
    async fn load_ids(&self, after: Option<&LoadId>, limit: usize) -> Result<Vec<LoadId>, StoreError>;
}

// ---------------------------------------------------------------------------------
// Reading logs without writing: `haul replay` and `haul export-scenario`.

/// Which loads a read-only tool reads; every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadSelection {
    /// The load's last append is at or after this time.
    pub since: Option<Timestamp>,
    /// A `load_update` in the load's log names this client.
    pub client: Option<String>,
}

/// The logs, read-only: what tools that must never write to a store (a production
/// database included) read through. Backends implement it over a connection that
/// cannot write (SQLite opened `mode=ro`, PostgreSQL read-only transactions) and run
/// no migration. Checked by [`contract::log_reader_reads_what_was_appended`].
#[async_trait]
pub trait LogReader: Send + Sync {
    /// Load ids after `after`, in id order, at most `limit`, that pass `filter`.
    async fn select_loads(
        &self,
        filter: &LoadSelection,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<Vec<LoadId>, StoreError>;

    /// At most `limit` records of the load after `after_seq`, in `seq` order.
    async fn read_log_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// [`ShadowStore::shadow_page`], read-only. A store migrated before shadow mode
    /// has no table for them: an error naming the migration.
    async fn read_shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError>;
}

// ---------------------------------------------------------------------------------
// Shadow mode: a second decider's decisions, kept apart from the log.

/// One shadow decision: what a second decider decided on the state, event and time a
/// committed decision was made on, beside that decision. Never part of the log, never
/// dispatched. Keyed by `(load_id, event_id, shadow)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShadowDecision {
    pub load_id: LoadId,
    pub event_id: String,
    /// The shadow decider's name (`sop`, `llm:{model}`).
    pub shadow: String,
    /// `seq` of the event in its load's log.
    pub event_seq: u64,
    /// The event as logged (`{event_id, kind, ...payload}`).
    pub event: Value,
    /// The SOP rule the event falls under for the shadow's policies (`haul_core::sop::Rule`, as serde names it).
    pub rule: String,
    /// The decision the primary recorded.
    pub primary: Value,
    /// The shadow's decision; `None` when it gave none (`agreement` is `error`).
    pub decision: Option<Value>,
    pub agreement: haul_core::replay::Agreement,
    /// Why the shadow gave no decision.
    pub error: Option<String>,
    /// When the primary decided (the `now` both decided at).
    pub decided_at: Timestamp,
    /// When the shadow's decision was stored.
    pub recorded_at: Timestamp,
}

/// Where a page of one load's shadow decisions starts: after this event `seq` and
/// shadow name (the order pages come in). [`ShadowCursor::default`] is the start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShadowCursor {
    pub event_seq: u64,
    pub shadow: String,
}

impl ShadowCursor {
    /// The position of `d`: the next page starts after it.
    pub fn after(d: &ShadowDecision) -> Self {
        ShadowCursor { event_seq: d.event_seq, shadow: d.shadow.clone() }
    }
}

/// Shadow decisions as the runtime keeps them (`haul replay --shadow` reads them
/// through [`LogReader::read_shadow_page`]).
#[async_trait]
pub trait ShadowStore: Send + Sync {
    /// Stores `d` unless a decision of that shadow for that event is stored already
    /// (idempotent on redelivery: the first stays). Returns whether this call stored it.
    async fn record_shadow(&self, d: &ShadowDecision) -> Result<bool, StoreError>;

    /// At most `limit` of the load's shadow decisions after `after`, by event `seq`
    /// then shadow name.
    async fn shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError>;
}

// ---------------------------------------------------------------------------------
// What the agent's model calls cost.

/// One client's spend on one UTC day (`client` empty: loads without a client).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientDaySpend {
    pub client: String,
    pub day: String,
    #[serde(flatten)]
    pub spend: haul_core::spend::Spend,
    /// When a decision first found the client's day budget spent.
    pub capped_at: Option<Timestamp>,
}

impl ClientDaySpend {
    /// A client's day with no spend: what a day no call was made on reads as.
    pub fn none(client: &str, day: &str) -> Self {
        ClientDaySpend { client: client.to_owned(), day: day.to_owned(), ..ClientDaySpend::default() }
    }

    /// Where a page of days starts: after `after`, or (the first page) after a day
    /// later than any.
    pub fn page_start<'a>(after: Option<(&'a str, &'a str)>) -> (&'a str, &'a str) {
        after.unwrap_or(("9999-99-99", ""))
    }
}

/// The clients' spend per day and the prompts, both written by appends
/// (`Derived::spend`, `Derived::prompts`); read by the budget check, `haul query
/// spend` and the timeline.
#[async_trait]
pub trait SpendLedger: Send + Sync {
    /// `client`'s spend on `day` (`YYYY-MM-DD`); all zero when it has none.
    async fn client_day_spend(&self, client: &str, day: &str) -> Result<ClientDaySpend, StoreError>;

    /// The clients' spend on the days from `from_day` to `to_day` (inclusive), of
    /// `client` only when given: the latest day first, then by client, after the
    /// position `after` names (`(day, client)` of the previous page's last), at most
    /// `limit`.
    async fn spend_page(
        &self,
        from_day: &str,
        to_day: &str,
        client: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ClientDaySpend>, StoreError>;

    /// The prompt text stored under `hash`.
    async fn prompt(&self, hash: &str) -> Result<Option<String>, StoreError>;
}

// ---------------------------------------------------------------------------------
// Pages of one load's outbox rows and timers.

/// Where a page of a load's outbox rows or timers starts: after the position of a row
/// with this creation time and id, in the order those lists come in (`created_at`,
/// then id). A position, not a row: a cursor whose row was pruned since still works.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowCursor {
    pub created_at: Timestamp,
    pub id: String,
}

impl RowCursor {
    /// The position of the first page: before every row.
    pub fn start() -> Self {
        RowCursor { created_at: Timestamp::MIN, id: String::new() }
    }

    /// The cursor of the page after `row`.
    pub fn after_outbox_row(row: &OutboxRow) -> Self {
        RowCursor { created_at: row.created_at, id: row.id.clone() }
    }

    /// The cursor of the page after `timer`.
    pub fn after_timer(timer: &Timer) -> Self {
        RowCursor { created_at: timer.created_at, id: timer.timer_id.to_string() }
    }

    /// Reads the form [`Display`](std::fmt::Display) writes, `{created_at in epoch
    /// ms}.{id}`; `None` for anything else (an id is at most
    /// [`MAX_DERIVED_ID_LEN`](haul_core::ids::MAX_DERIVED_ID_LEN) printable characters).
    pub fn parse(s: &str) -> Option<Self> {
        let (ms, id) = s.split_once('.')?;
        let ok_id = !id.is_empty()
            && id.len() <= haul_core::ids::MAX_DERIVED_ID_LEN
            && !id.chars().any(|c| c.is_control() || c.is_whitespace());
        if !ok_id || ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let created_at = Timestamp::from_millisecond(ms.parse().ok()?).ok()?;
        Some(RowCursor { created_at, id: id.to_owned() })
    }
}

impl std::fmt::Display for RowCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", haul_core::time::to_ms(self.created_at), self.id)
    }
}

// ---------------------------------------------------------------------------------
// The outbox.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxStatus {
    Pending,
    Dispatched,
    Dead,
    /// Never sent: its ask moved on to a later step while it waited (`Outbox::supersede`).
    Superseded,
}

impl OutboxStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Pending => "pending",
            OutboxStatus::Dispatched => "dispatched",
            OutboxStatus::Dead => "dead",
            OutboxStatus::Superseded => "superseded",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [OutboxStatus::Pending, OutboxStatus::Dispatched, OutboxStatus::Dead, OutboxStatus::Superseded]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutboxRow {
    pub id: String,
    pub load_id: LoadId,
    pub action_type: ActionType,
    pub action: Value,
    pub status: OutboxStatus,
    /// Failed attempts so far.
    pub attempts: u32,
    /// When the row may next be claimed (commit time, then each `retry_at`).
    pub due_at: Timestamp,
    pub first_attempt_at: Option<Timestamp>,
    pub claim_token: Option<String>,
    pub lease_until: Option<Timestamp>,
    pub last_failure: Option<String>,
    pub receipt: Option<String>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// The trace context of the run that decided the row (`NewOutboxRow::trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceParent>,
}

impl OutboxRow {
    /// What the pure core's dispatch plans read of the row.
    pub fn facts(&self) -> haul_core::dispatch::Row {
        haul_core::dispatch::Row {
            outbox_id: self.id.clone(),
            load_id: self.load_id.clone(),
            action_type: self.action_type,
            attempts: self.attempts,
            first_attempt_at: self.first_attempt_at,
            created_at: self.created_at,
            trace: self.trace,
        }
    }
}

/// What `Outbox::supersede` did: the later row that overtook the claimed one, and when
/// that later row was due before it took the claimed row's place (it was waiting), if
/// it was moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superseded {
    pub by: String,
    pub by_was_due: Option<Timestamp>,
}

/// A row handed to one dispatcher, with the token that proves the claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    pub row: OutboxRow,
    pub token: String,
}

/// What an append does besides appending (`EventStore::append_with`).
#[derive(Clone, Copy, Debug, Default)]
pub struct AppendWith<'a> {
    /// The receipt of this store's own `LoadQueue` to ack in the append's transaction.
    pub receipt: Option<&'a str>,
    /// The claim to write every outbox row of the append with.
    pub claim: Option<&'a ClaimWith>,
}

/// How an append claims the outbox rows it writes (`AppendWith::claim`): the claim
/// token and the lease, as `Outbox::pending` would give them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimWith {
    pub token: String,
    pub lease_until: Timestamp,
}

impl ClaimWith {
    /// The claim of `row`, written at `now` by an append with this claim: the row as the
    /// store holds it after that append's commit.
    pub fn claim_of(&self, load_id: &LoadId, row: NewOutboxRow, now: Timestamp) -> Claim {
        let row = OutboxRow {
            id: row.id,
            load_id: load_id.clone(),
            action_type: row.action_type,
            action: row.action,
            status: OutboxStatus::Pending,
            attempts: 0,
            due_at: now,
            first_attempt_at: Some(now),
            claim_token: Some(self.token.clone()),
            lease_until: Some(self.lease_until),
            last_failure: None,
            receipt: None,
            created_at: now,
            updated_at: now,
            trace: row.trace,
        };
        Claim { row, token: self.token.clone() }
    }
}

/// Where a claim ended: its last row in claim order, `(due_at, id)`. A busy dispatcher
/// claims after it next, past the rows it holds (they sort before it, and a claim from
/// the start passes every one of them each time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimCursor {
    pub due_at: Timestamp,
    pub id: String,
}

impl ClaimCursor {
    /// The last of `claims` in claim order; `None` when there are none. Ids compare by
    /// their bytes here. Where a store's collation orders them otherwise, the cursor is
    /// still one of the claimed rows, so it never sits past the claim's last row in the
    /// store's order: at worst the next claim passes a few of this claim's rows again.
    pub fn after(claims: &[Claim]) -> Option<ClaimCursor> {
        claims
            .iter()
            .map(|c| (c.row.due_at, &c.row.id))
            .max()
            .map(|(due_at, id)| ClaimCursor { due_at, id: id.clone() })
    }
}

#[async_trait]
pub trait Outbox: Send + Sync {
    /// Claims up to `limit` due rows (pending, `due_at <= now`, no live lease), each
    /// with a fresh claim token and a lease until `now + lease`; sets
    /// `first_attempt_at` on a row's first claim. No row is held by two live claims.
    async fn pending(&self, limit: usize, now: Timestamp, lease: Duration) -> Result<Vec<Claim>, StoreError>;

    /// As `pending`, taking only rows after `after` in claim order (`(due_at, id)`):
    /// what a dispatcher with many rows in flight claims next. Rows before it wait for
    /// a claim from the start (`pending`).
    async fn pending_after(
        &self,
        limit: usize,
        now: Timestamp,
        lease: Duration,
        after: &ClaimCursor,
    ) -> Result<Vec<Claim>, StoreError>;

    /// Ok while `token` is the row's claim and its lease is live at `now`: the check a
    /// dispatcher makes right before a send.
    async fn check_claim(&self, id: &str, token: &str, now: Timestamp) -> Result<(), ClaimError>;

    async fn mark_dispatched(&self, id: &str, token: &str, receipt: &str, now: Timestamp) -> Result<(), ClaimError>;

    /// Publishes the row's delivered outcome to this store's own `LoadQueue` (as
    /// `LoadQueue::publish_traced(load_id, event_id, body, trace, now)`) and then marks the row
    /// dispatched (as `mark_dispatched`), in one transaction: the two steps a
    /// dispatcher takes after a send, with one commit instead of two and no crash
    /// between them. The publish holds whatever the mark finds: `Stale` means the
    /// outcome was published and the row left as it was (another dispatcher owns it,
    /// and publishes the same deduplicated outcome). A `StoreError` changes nothing.
    #[allow(clippy::too_many_arguments)]
    async fn publish_and_mark_dispatched(
        &self,
        id: &str,
        token: &str,
        receipt: &str,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, ClaimError>;

    /// Records a failed attempt: `Some(retry_at)` reschedules the row, `None` buries it.
    async fn mark_failed(
        &self,
        id: &str,
        token: &str,
        failure: &str,
        retry_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), ClaimError>;

    /// Gives a claimed row back unsent, due again at `until`: a send rate held it back
    /// (`SendRates`), or the service answered 429 (`note` then says so and is kept as
    /// the row's last failure). Waiting is not failing: no attempt is counted and none
    /// of the retry budget is spent (a row never sent forgets its first claim; one sent
    /// before has its first attempt moved on by the wait).
    async fn hold(
        &self,
        id: &str,
        token: &str,
        until: Timestamp,
        note: Option<&str>,
        now: Timestamp,
    ) -> Result<(), ClaimError>;

    /// [`Outbox::hold`] for many claimed rows at once, each `(id, token, until)`, no
    /// note, in one write: what a claim whose rate's grant fell short gives back. A row
    /// no longer its token's is left as it is. Answers how many were held. At most
    /// [`MAX_HOLDS`] at a time (a claim's batch); more is an error, nothing held.
    async fn hold_all(&self, holds: &[(String, String, Timestamp)], now: Timestamp) -> Result<usize, StoreError>;

    /// Settles a claimed row unsent if a later step of its ask (`ask_id`, `step`) was
    /// decided on its load meanwhile: a row of that load whose action has the same
    /// `ask_id` and a greater `step`. The row becomes `superseded`, settled (nothing is
    /// published for it), with that later row's id in its last failure; the later
    /// row is returned. That later row, if it waits too (pending, never tried,
    /// unclaimed, due after `now`), takes its place: it is due at `now`, so a rate's
    /// send meant for the step overtaken goes to the step that overtook it, and when it
    /// was due before is returned too. `None`: its
    /// ask has not moved on (or the claim is no longer this token's), and nothing
    /// changed.
    async fn supersede(
        &self,
        id: &str,
        token: &str,
        ask_id: &str,
        step: u32,
        now: Timestamp,
    ) -> Result<Option<Superseded>, StoreError>;

    async fn get(&self, id: &str) -> Result<Option<OutboxRow>, StoreError>;

    async fn rows_for_load(&self, load_id: &LoadId) -> Result<Vec<OutboxRow>, StoreError>;

    /// At most `limit` of the load's rows after `after`, in `rows_for_load`'s order
    /// (`created_at`, then id).
    async fn rows_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError>;

    /// `created_at` of the oldest pending row: its age is the monitoring figure.
    async fn oldest_pending_created_at(&self) -> Result<Option<Timestamp>, StoreError>;

    /// Dead rows that died at or after `since`, oldest first, at most `limit`.
    async fn dead(&self, since: Timestamp, limit: usize) -> Result<Vec<OutboxRow>, StoreError>;

    /// Dead rows of one action type that died at or after `since`, oldest first (by
    /// when they died, then id), at most `limit`: what an operator's bulk requeue
    /// picks from ("every dead `create_hero_task` since 07:00"). Served by an index
    /// on `(action_type, dead_at)` of the dead rows.
    async fn dead_of_type(
        &self,
        action_type: ActionType,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError>;

    async fn count_by_status(&self, status: OutboxStatus) -> Result<u64, StoreError>;

    /// Records that the row's terminal outcome reached the load queue.
    async fn mark_outcome_published(&self, id: &str, now: Timestamp) -> Result<(), StoreError>;

    /// Dead rows whose failed outcome has not reached the load queue, oldest first.
    async fn dead_without_outcome(&self, limit: usize) -> Result<Vec<OutboxRow>, StoreError>;

    /// The dead rows the dispatcher's sweep may settle at `now`: their failed outcome
    /// has not reached the load queue, and their next pass is due (a row just buried is
    /// due at once; [`defer_settle`](Outbox::defer_settle) puts it off). Oldest first
    /// (`dead_at`, then id), at most `limit`. A row put off is left out, so it never
    /// holds up the rows behind it.
    async fn unsettled_due(&self, now: Timestamp, limit: usize) -> Result<Vec<Unsettled>, StoreError>;

    /// A pass of the sweep over a dead row failed with `failure` (the queue or the ops
    /// service is down): one more failed pass is counted and the row is due again at
    /// `retry_at`. Only a dead row whose outcome is not published changes; the row's
    /// `last_failure` (why it died) stays.
    async fn defer_settle(&self, id: &str, failure: &str, retry_at: Timestamp) -> Result<(), StoreError>;

    /// Records a send of a dead row's OpsAlert and how it ended: the first call keeps
    /// the alert (raised at `now`), each later one counts a send; `state` is the
    /// send's result (`Pending` when it failed and will be tried again), `error` what
    /// the ops service or the network said. An alert `Delivered` or `Refused` is final:
    /// a later call changes nothing and returns false. Returns true when this call
    /// recorded the send.
    async fn record_ops_alert(
        &self,
        alert: &Alert,
        state: AlertState,
        error: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// The OpsAlerts raised, in the order they were raised (`raised_at`, then outbox
    /// id), after the position `after` names ([`RowCursor::start`] for the first
    /// page), at most `limit`: what was raised, when, and whether it was delivered,
    /// refused, or is still being tried.
    async fn ops_alerts(&self, after: &RowCursor, limit: usize) -> Result<Vec<OpsAlertRecord>, StoreError>;
}

/// A dead row the sweep has yet to settle.
#[derive(Clone, Debug, PartialEq)]
pub struct Unsettled {
    pub row: OutboxRow,
    /// The sweep's passes over it that failed.
    pub settle_attempts: u32,
    /// When the next pass is due; `None`: at once.
    pub settle_due_at: Option<Timestamp>,
    /// Why the last pass failed.
    pub settle_failure: Option<String>,
}

/// Where an OpsAlert is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// Raised; no send has reached the ops service yet (it is down), and the sweep
    /// tries again.
    Pending,
    /// The ops service took it.
    Delivered,
    /// The ops service refused it (a 4xx): it is not sent again.
    Refused,
}

impl AlertState {
    pub const ALL: [AlertState; 3] = [AlertState::Pending, AlertState::Delivered, AlertState::Refused];

    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Pending => "pending",
            AlertState::Delivered => "delivered",
            AlertState::Refused => "refused",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        AlertState::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// An OpsAlert as the store keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpsAlertRecord {
    /// The dead row it is about (one alert per row).
    pub outbox_id: String,
    pub load_id: LoadId,
    pub kind: AlertKind,
    pub action_type: ActionType,
    /// Why the row died.
    pub failure: String,
    pub state: AlertState,
    /// Sends so far.
    pub sends: u32,
    /// What the last failed send got.
    pub last_error: Option<String>,
    pub raised_at: Timestamp,
    pub updated_at: Timestamp,
}

impl OpsAlertRecord {
    /// The cursor of the page after this alert.
    pub fn cursor(&self) -> RowCursor {
        RowCursor { created_at: self.raised_at, id: self.outbox_id.clone() }
    }
}

// ---------------------------------------------------------------------------------
// Durable timers.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerStatus {
    Scheduled,
    Fired,
    Canceled,
}

impl TimerStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TimerStatus::Scheduled => "scheduled",
            TimerStatus::Fired => "fired",
            TimerStatus::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [TimerStatus::Scheduled, TimerStatus::Fired, TimerStatus::Canceled].into_iter().find(|v| v.as_str() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timer {
    pub timer_id: TimerId,
    pub load_id: LoadId,
    pub fire_at: Timestamp,
    pub status: TimerStatus,
    /// When `schedule` (or a `cancel` before any schedule) first wrote the row.
    pub created_at: Timestamp,
    pub canceled_at: Option<Timestamp>,
    pub fired_at: Option<Timestamp>,
    /// The trace context of the run that set it: its firing continues that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceParent>,
}

#[async_trait]
pub trait TimerStore: Send + Sync {
    /// Schedules a timer; idempotent on `timer_id` (a second call changes nothing and
    /// returns false). A timer canceled before it was scheduled stays canceled.
    async fn schedule(&self, timer_id: &TimerId, fire_at: Timestamp, now: Timestamp) -> Result<bool, StoreError> {
        self.schedule_traced(timer_id, fire_at, None, now).await
    }

    /// `schedule`, the timer keeping `trace` (the context its firing continues).
    async fn schedule_traced(
        &self,
        timer_id: &TimerId,
        fire_at: Timestamp,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Cancels a scheduled timer; idempotent. Returns true when this call canceled it.
    async fn cancel(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError>;

    /// Marks a fired timer; idempotent. Returns true when this call marked it.
    async fn mark_fired(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError>;

    /// Scheduled timers with `fire_at <= now`, earliest first, at most `limit`.
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<Timer>, StoreError>;

    async fn timers_for_load(&self, load_id: &LoadId) -> Result<Vec<Timer>, StoreError>;

    /// At most `limit` of the load's timers after `after`, in `timers_for_load`'s order
    /// (`created_at`, then timer id).
    async fn timers_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError>;

    async fn get_timer(&self, timer_id: &TimerId) -> Result<Option<Timer>, StoreError>;
}

// ---------------------------------------------------------------------------------
// The load queue.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    New,
    /// The event id was already published for this load (the dedup window).
    Duplicate,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueMessage {
    pub load_id: LoadId,
    pub event_id: String,
    /// The event as JSON (`{event_id, kind, ...payload}`).
    pub body: String,
    pub enqueued_at: Timestamp,
    /// The receipt to ack or nack with; only the latest receive's receipt is good.
    pub receipt: String,
    /// 1 on the first delivery.
    pub receive_count: u32,
    /// The version of the load's log when the message was received, from a queue kept
    /// in the log's own store (`None` from SQS, or for a load with no log yet). A worker
    /// whose snapshot of the load is at this version has nothing to read before it
    /// decides; the append's version check still guards the decision.
    pub log_version: Option<u64>,
    /// The trace context the message was published with (its producer's).
    pub trace: Option<TraceParent>,
}

#[async_trait]
pub trait LoadQueue: Send + Sync {
    /// Enqueues an event for a load, deduplicated by `(load_id, event_id)` for at least
    /// five minutes (store-backed queues keep it until pruned).
    async fn publish(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        self.publish_traced(load_id, event_id, body, None, now).await
    }

    /// `publish`, the message keeping `trace`, which its receiver's run continues. A
    /// duplicate keeps the first publish's context (and its body).
    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError>;

    /// `publish_traced`, and in the same transaction a `receive` of that load's head
    /// when the head is a message of this event id never received: the message as
    /// `receive` answers it, invisible until `now + visibility`. That is the message
    /// just published whenever no message of its load was waiting or in flight, and
    /// may be an earlier publish of the same id (a duplicate). `None` otherwise, and
    /// from a queue that cannot (the default, which only publishes; SQS). A publisher
    /// hands the message to a worker of its own process: between the publish and the
    /// run there is then no receive and no wake-up.
    async fn publish_receiving(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        visibility: Duration,
        now: Timestamp,
    ) -> Result<(Published, Option<QueueMessage>), StoreError> {
        let _ = visibility;
        Ok((self.publish_traced(load_id, event_id, body, trace, now).await?, None))
    }

    /// Up to `max` messages, FIFO per load, at most one in flight per load: a load's
    /// next message waits until the one before it is acked. A received message is
    /// invisible until `now + visibility`, then redelivered unless acked.
    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError>;

    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError>;

    /// Gives the message back, visible again at `now + delay` (it stays at its load's
    /// head, so the load waits too).
    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError>;

    /// Messages not yet acked.
    async fn depth(&self) -> Result<u64, StoreError>;

    /// The body an event id was first published with, while the queue remembers it
    /// (`None` when it does not, or cannot say, as SQS cannot).
    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError>;

    /// What the queue is, as OpenTelemetry's `messaging.system` names it: `haul` for a
    /// store's own queue table, `aws_sqs` for SQS.
    fn system(&self) -> &'static str {
        "haul"
    }

    /// Whether a `receive` that answers fewer than `max` messages took every message it
    /// could: true for a store's own queue table (a receive takes the visible heads not
    /// being taken by another receive, up to `max`); false for SQS, which may answer
    /// with fewer than are waiting. A worker told the queue is drained waits to be woken
    /// (or for its poll) instead of asking again at once for nothing.
    fn short_receive_drains(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------------------------
// The optional per-load lease.

/// A held per-load lease; release it when the run ends. Dropping it without release
/// frees it too, later (connection close or lease expiry).
#[async_trait]
pub trait LoadLease: Send + Sync {
    async fn release(self: Box<Self>) -> Result<(), StoreError>;
}

#[async_trait]
pub trait LoadLock: Send + Sync {
    /// Takes the load's lease if nobody holds it; `None` when another holder does.
    /// An optimization only (ADR 0003): correctness rests on the version check.
    async fn try_lock(
        &self,
        load_id: &LoadId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Box<dyn LoadLease>>, StoreError>;
}

// ---------------------------------------------------------------------------------
// Record mode.

/// A delivery recorded in place of a call to a channel service with no URL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedDelivery {
    pub channel: String,
    pub key: String,
    pub load_id: LoadId,
    pub payload: Value,
    pub receipt: String,
    pub created_at: Timestamp,
}

#[async_trait]
pub trait DeliveryLog: Send + Sync {
    /// Records a delivery, deduplicated by `(channel, key)` as the real services dedupe
    /// by idempotency key. Returns the receipt (the first one for a repeated key) and
    /// whether this call recorded it.
    async fn record_delivery(
        &self,
        channel: &str,
        key: &str,
        load_id: &LoadId,
        payload: &Value,
        now: Timestamp,
    ) -> Result<(String, bool), StoreError>;

    /// Recorded deliveries, oldest first, of one load or of all.
    async fn deliveries(&self, load_id: Option<&LoadId>, limit: usize) -> Result<Vec<RecordedDelivery>, StoreError>;
}

// ---------------------------------------------------------------------------------
// Lookups for the API.

/// An inbound SMS that could not go to a load: no single active load has its number, or
/// it did not validate (kept cleaned and clipped, for a person to read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnmatchedSms {
    /// The MessageSid, or a key made from the request when it had no usable one.
    pub message_sid: String,
    pub from: String,
    pub to: String,
    pub body: String,
    pub received_at: Timestamp,
    /// Why it was not routed.
    pub reason: String,
}

/// A phone's consent to SMS as the per-phone ledger keeps it (`sms_consent`): the STOP
/// or START that last changed it, whichever load it reached (none: the webhook kept it
/// unmatched). Only phones that ever opted out are kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsConsent {
    pub phone: String,
    pub opted_out: bool,
    /// The event that changed it (`sms:{MessageSid}` from the webhook).
    pub event_id: String,
    /// The load whose log has that event; `None` when it reached no load.
    pub load_id: Option<LoadId>,
    pub changed_at: Timestamp,
}

/// A delivery report that said how a message ended (Twilio's `delivered`,
/// `undelivered` or `failed`), kept once per message and status: on its outbox row's
/// load for the load's view, or, when it named no SMS of haul's, for a person with the
/// reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsReport {
    pub message_sid: String,
    pub status: String,
    pub error_code: Option<String>,
    /// The outbox row it reported on; `None` when it matched none.
    pub outbox_id: Option<String>,
    pub load_id: Option<LoadId>,
    /// Why it matched no row; `None` when it did.
    pub reason: Option<String>,
    pub reported_at: Timestamp,
}

/// Most phones [`LoadIndex::opted_out_among`] is asked about at once.
pub const MAX_CONSENT_ASKED: usize = 1_000;

/// What [`LoadIndex::assign_unmatched_sms`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmsAssignment {
    /// The SMS is this load's, by this event: assigned now, or by the same event before
    /// (a retried request).
    Assigned(UnmatchedSms),
    /// Assigned before to another load, or to this one by another operator event.
    Taken { load_id: LoadId, event_id: String },
    /// No unmatched SMS has this MessageSid.
    NotFound,
    /// An operator dismissed it (`by`): it goes to no load.
    Dismissed { by: String },
}

/// What [`LoadIndex::move_assigned_sms`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmsMove {
    /// The SMS is the new load's now, by this event, taken from `from` (moved now, or
    /// by the same event before: a retried request).
    Moved { from: LoadId, sms: UnmatchedSms },
    /// Held by the new load already, by another operator event: nothing to move.
    Held { event_id: String },
    /// Taken by this event before and moved on since by another.
    Taken { load_id: LoadId, event_id: String },
    /// Not assigned to any load: an assignment, not a move, is what it needs.
    Unassigned,
    /// No unmatched SMS has this MessageSid.
    NotFound,
    /// An operator dismissed it (`by`): it goes to no load.
    Dismissed { by: String },
}

/// Where the Twilio webhook sent an inbound SMS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmsRoute {
    /// Published to this load's queue as event `sms:{MessageSid}`.
    Load(LoadId),
    /// Kept in the unmatched list.
    Unmatched,
}

/// What [`LoadIndex::claim_message_sid`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SidClaim {
    /// The first time: the sid is now taken, for the route given.
    New,
    /// Taken before, for this route (a replay, or Twilio's retry of a request whose
    /// delivery failed after the claim).
    Taken(SmsRoute),
}

/// Facts derived from logs that the API looks loads up by. The log stays the source
/// of truth; each append writes what its entries change (`NewEntry::derived`: the
/// driver phone a `load_update` set, and active until delivered) in its transaction.
#[async_trait]
pub trait LoadIndex: Send + Sync {
    /// Active loads whose driver phone is `phone`.
    async fn loads_by_phone(&self, phone: &str) -> Result<Vec<LoadId>, StoreError>;

    /// The client of each of `load_ids` that has one (a `load_update` named it), in no
    /// particular order; at most [`MAX_CLIENTS_OF`] loads are asked at once.
    async fn clients_of(&self, load_ids: &[LoadId]) -> Result<Vec<(LoadId, String)>, StoreError>;

    /// Writes what a STOP or START that reached no load (the webhook's, kept unmatched)
    /// changed in its phone's consent, as an append writes its own
    /// (`Derived::consent`): an opt-out is kept until an opt-in clears it (a second
    /// STOP changes nothing), and an opt-in of a phone that never opted out is not kept.
    async fn record_consent(&self, consent: &SmsConsent) -> Result<(), StoreError>;

    /// The ledger's rows of those of `phones` that are opted out now; at most
    /// [`MAX_CONSENT_ASKED`] phones are asked at once.
    async fn opted_out_among(&self, phones: &[String]) -> Result<Vec<SmsConsent>, StoreError>;

    /// Keeps a delivery report, once per message and status; true when new.
    async fn record_sms_report(&self, report: &SmsReport) -> Result<bool, StoreError>;

    /// The delivery reports on `load_id`'s rows, the latest first, at most `limit`.
    async fn sms_reports_for_load(&self, load_id: &LoadId, limit: usize) -> Result<Vec<SmsReport>, StoreError>;

    /// The delivery reports that matched no row, the latest first, at most `limit`.
    async fn unmatched_sms_reports(&self, limit: usize) -> Result<Vec<SmsReport>, StoreError>;

    /// Keeps an unmatched SMS (idempotent on `message_sid`); true when new.
    async fn record_unmatched_sms(&self, sms: &UnmatchedSms) -> Result<bool, StoreError>;

    /// Takes a MessageSid for `route`, once across all loads and for good: `New` the
    /// first time, and from then on `Taken` with the first call's route, whatever
    /// `route` is now. The webhook claims before it publishes or records, so a replayed
    /// request can never reach another load, and a retry after a failed publish goes
    /// to the load the sid was taken for.
    async fn claim_message_sid(
        &self,
        message_sid: &str,
        route: &SmsRoute,
        now: Timestamp,
    ) -> Result<SidClaim, StoreError>;

    /// The most recent unmatched SMS first.
    async fn unmatched_sms(&self, limit: usize) -> Result<Vec<UnmatchedSms>, StoreError>;

    /// Hands the unmatched SMS `message_sid` to `load_id` for the operator event
    /// `event_id`, once: the first call takes it, a call with the same load and event
    /// finds it taken by itself (`Assigned` again, so a retried request goes on), any
    /// other finds `Taken`. The row stays in the unmatched list, marked.
    async fn assign_unmatched_sms(
        &self,
        message_sid: &str,
        load_id: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsAssignment, StoreError>;

    /// Moves the SMS `message_sid`, assigned to a load, to `to` for the operator event
    /// `event_id` (a wrong assignment undone), keeping the load it came from. A retry
    /// (same load, same event) finds it moved by itself and where from, so the old
    /// load is told again; racing moves are taken one after the other.
    async fn move_assigned_sms(
        &self,
        message_sid: &str,
        to: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsMove, StoreError>;
}

// ---------------------------------------------------------------------------------
// The edge's own state.

/// What taking an operator request found ([`EdgeStore::claim_operator_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestClaim {
    /// The first time: taken now.
    New,
    /// Taken before with the same event: a retry.
    Same,
    /// Taken before with another event: the request id was reused.
    Other,
}

/// What the API's edge keeps besides the loads: the console's signing secret, the
/// sessions ended by signing out, and the operator requests taken. Shared by every api
/// process of a deployment through the store.
#[async_trait]
pub trait EdgeStore: Send + Sync {
    /// The console's signing secret: the first call on a store keeps `candidate`, and
    /// every call from then on, from any process, answers the kept one.
    async fn console_secret(&self, candidate: &[u8; 32], now: Timestamp) -> Result<[u8; 32], StoreError>;

    /// Ends the session whose nonce is `nonce` for good: it is kept until `expires_at`,
    /// when its cookie ends anyway. Nonces past their expiry at `now` are dropped.
    async fn revoke_session(&self, nonce: &str, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError>;

    /// Whether the session whose nonce is `nonce` was ended.
    async fn session_revoked(&self, nonce: &str) -> Result<bool, StoreError>;

    /// Takes the operator request whose event `event_id` (with the JSON `body`) goes to
    /// `load_id`: `New` the first time, `Same` when it was taken with this body,
    /// `Other` when with another. What makes a reused request id refused on every
    /// load queue, SQS FIFO included.
    async fn claim_operator_request(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<RequestClaim, StoreError>;
}

/// A console secret as the store keeps it (64 hex digits), read back; anything else is
/// a corrupt row.
pub fn console_secret_from_hex(hex: &str) -> Result<[u8; 32], StoreError> {
    let bytes = hex.as_bytes();
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    if bytes.len() != 64 {
        return Err(StoreError::new("the console secret is not 64 hex digits"));
    }
    for (i, pair) in bytes.chunks(2).enumerate() {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => out[i] = h << 4 | l,
            _ => return Err(StoreError::new("the console secret is not 64 hex digits")),
        }
    }
    Ok(out)
}

/// A console secret in the form the store keeps.
pub fn console_secret_hex(secret: &[u8; 32]) -> String {
    secret.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------
// Retention.

/// Rows one `prune` call deleted, per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    pub outbox: u64,
    pub timers: u64,
    pub queue: u64,
    /// Shadow decisions.
    #[serde(default)]
    pub shadow: u64,
    /// Delivery reports kept (`sms_reports`).
    #[serde(default)]
    pub reports: u64,
}

impl PruneReport {
    pub fn total(&self) -> u64 {
        self.outbox + self.timers + self.queue + self.shadow + self.reports
    }

    /// True when some table gave a whole batch: another call may find more.
    pub fn full(&self, batch_limit: usize) -> bool {
        let limit = batch_limit as u64;
        limit > 0
            && (self.outbox >= limit
                || self.timers >= limit
                || self.queue >= limit
                || self.shadow >= limit
                || self.reports >= limit)
    }

    fn add(&mut self, other: PruneReport) {
        self.outbox += other.outbox;
        self.timers += other.timers;
        self.queue += other.queue;
        self.shadow += other.shadow;
        self.reports += other.reports;
    }
}

/// The load an outbox id (an action key, `{load_id}/...`) belongs to; the whole id when
/// it has no `/` (no stored row has such an id).
pub fn outbox_key_load(id: &str) -> &str {
    id.split_once('/').map_or(id, |(load, _)| load)
}

/// True when `id` is an action key of `load`: it starts with `{load}/`.
pub fn is_key_of_load(id: &str, load: &str) -> bool {
    id.strip_prefix(load).is_some_and(|rest| rest.starts_with('/'))
}

#[async_trait]
pub trait Prune: Send + Sync {
    /// Deletes finished rows that finished before `older_than`, at most `batch_limit`
    /// rows of each table per call (so one call holds its locks briefly):
    ///
    /// - outbox rows `dispatched` or `dead` whose outcome reached the load queue
    ///   (`outcome_published_at` set), last updated and published before the cutoff;
    /// - timers `fired` or `canceled` before the cutoff;
    /// - queue messages acked before the cutoff, and operator requests taken before it
    ///   (counted with them: they are the queue's memory of those requests);
    /// - shadow decisions stored before the cutoff (derived data, never the log).
    ///
    /// Never a log entry, a pending or claimed outbox row, a dead row whose outcome
    /// is not published yet, a scheduled timer or an unacked message. A pruned
    /// message's event id is no longer deduplicated by the queue: the queue's dedup
    /// window is the retention age, and the log's `DuplicateEntryError` stays the
    /// guarantee that an event is processed once.
    async fn prune(&self, older_than: Timestamp, batch_limit: usize) -> Result<PruneReport, StoreError>;
}

/// Prunes in batches of `batch_limit` until a batch comes back short, at most
/// `max_batches` batches; returns the sum. The cutoff is fixed, so every batch deletes
/// rows that cannot come back, and the loop ends.
pub async fn prune_all(
    store: &dyn Prune,
    older_than: Timestamp,
    batch_limit: usize,
    max_batches: usize,
    mut on_batch: impl FnMut(&PruneReport) + Send,
) -> Result<PruneReport, StoreError> {
    let mut sum = PruneReport::default();
    for _ in 0..max_batches {
        let batch = store.prune(older_than, batch_limit).await?;
        on_batch(&batch);
        sum.add(batch);
        if !batch.full(batch_limit) {
            break;
        }
    }
    Ok(sum)
}

/// A change of a channel's send limit made while haul runs, by an operator
/// (`SendRates::change_rate`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateChange {
    /// The operator request's id: a retry with it is the same change.
    pub request_id: String,
    /// The channel's settings name (`sms`, `hero`, …).
    pub channel: String,
    /// The limit from now on; `None`: the settings' (`channels.*.rate`) again.
    pub limit: Option<Limit>,
    pub actor: String,
    pub reason: String,
    pub changed_at: Timestamp,
}

/// A send rate a claim takes from (`SendRates::claim_taking`): the rate's key, the
/// action types sent on it, and its limit.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimTake {
    pub key: String,
    pub action_types: Vec<ActionType>,
    pub limit: Limit,
}

/// What `SendRates::claim_taking` did: the rows claimed, and for each take (in the
/// order given) the claimed rows it counted and what they were granted; `None` when
/// it counted none (nothing was taken).
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedTaking {
    pub claims: Vec<Claim>,
    pub grants: Vec<Option<(u32, Grant)>>,
}

/// Most takes one claim makes: one a channel.
pub const MAX_CLAIM_TAKES: usize = 16;

/// The state of the channels' send rates (`haul_core::limit`), kept in the store so
/// every dispatcher process shares one limit.
#[async_trait]
pub trait SendRates: Send + Sync {
    /// Takes up to `wanted` sends under `limit` for the channel (or sending number)
    /// `key` at `now`: `haul_core::limit::take` on the state kept for `key`, read and
    /// written under its lock, so dispatchers racing for the same key never together
    /// send more than the limit allows.
    /// A grant of fewer than `wanted` also keeps `now` as when rows were last held back.
    async fn take_sends(&self, key: &str, limit: &Limit, wanted: u32, now: Timestamp) -> Result<Grant, StoreError>;

    /// `Outbox::pending` (or `pending_after` when `after` is given) and, in the same
    /// transaction, `take_sends` on each of `takes` for the claimed rows it counts:
    /// those of its action types that are claimed as they were made (`due_at` not
    /// after `created_at`, `haul_core::dispatch::as_made`). A row that waited (held
    /// back, retried) is not counted: the dispatcher first checks whether its ask moved
    /// on, and takes for it after. One store call for the common claim instead of two.
    /// At most [`MAX_CLAIM_TAKES`] takes, each key once; with none, it is the plain
    /// claim.
    async fn claim_taking(
        &self,
        max: usize,
        now: Timestamp,
        lease: Duration,
        after: Option<&ClaimCursor>,
        takes: &[ClaimTake],
    ) -> Result<ClaimedTaking, StoreError>;

    /// Queues `n` (at least 1) held rows on the queue `key` (a client's on a channel,
    /// `haul_core::limit::queue_key`): `haul_core::limit::queued` on the last slot kept
    /// for it, read and written under its lock, so dispatchers holding the same
    /// client's rows at once hand out different slots. Answers the first slot (µs);
    /// the others follow `spacing_us` apart.
    async fn queue_sends(&self, key: &str, from_us: i64, spacing_us: i64, n: u32) -> Result<i64, StoreError>;

    /// A channel's limit changed: its held rows are spaced again at the new rate. The
    /// rate's state starts afresh (no send before counts against the new limit: its
    /// `tat` is at most `now`, or the state its last pause left when that pause runs
    /// past `now`, kept under `haul_core::limit::pause_key`), every client's queue on `rate_key` (`{rate_key}|…`) is
    /// forgotten, and every row of
    /// `action_types` that waits for a send (pending, never tried, unclaimed, due after
    /// `now`) is due at `now`, to be claimed and held again at the rate now in force.
    /// A row in a retry's backoff (tried before) keeps its time. Answers how many rows
    /// were made due.
    async fn requeue_held(
        &self,
        rate_key: &str,
        action_types: &[ActionType],
        now: Timestamp,
    ) -> Result<u64, StoreError>;

    /// The last slot (µs) of each of the queues `keys` that has one: how far behind
    /// its client's held rows reach, what orders clients when a grant falls short.
    async fn queue_tails(&self, keys: &[String]) -> Result<Vec<(String, i64)>, StoreError>;

    /// Gives back the slot `slot_us` of the queue `key` when it is the queue's last
    /// (the row queued on it left before its time, by taking an earlier row's place),
    /// so the next row queued there is not put a spacing further on for nothing. True
    /// when it was given back; a slot no longer last changes nothing. `slot_us` is
    /// the row's due time, which a row keeps to the millisecond: the slot within that
    /// millisecond is meant.
    async fn unqueue_send(&self, key: &str, slot_us: i64, spacing_us: i64) -> Result<bool, StoreError>;

    /// The service behind `key` asked to wait until `until` (a 429's `Retry-After`):
    /// its state becomes `haul_core::limit::paused`, so no dispatcher sends on it before
    /// then, and `now` is kept as when it last held rows back. The paused state is also
    /// kept under `haul_core::limit::pause_key`, so a changed limit keeps the pause.
    async fn pause_sends(&self, key: &str, limit: &Limit, until: Timestamp, now: Timestamp) -> Result<(), StoreError>;

    /// The keys whose rate held rows back at or after `since`, most recent first, with
    /// when: the channels that are saturated.
    async fn saturated(&self, since: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError>;

    /// Takes a send slot under `key` (a channel's sends in flight) for each of `sends`
    /// (outbox id, claim token), in order, while fewer than `cap` slots are held: each
    /// slot held until `until` (the claim's lease), so a dispatcher that dies mid-send
    /// frees its slots when its leases lapse. Slots held past `now` are freed first.
    /// Read and written under the key's lock: dispatchers racing for one key never hold
    /// more than `cap` between them. A send that holds a slot already keeps it (taken
    /// again for its new token). Answers the outbox ids given a slot.
    async fn take_slots(
        &self,
        key: &str,
        cap: u32,
        sends: &[(String, String)],
        until: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<String>, StoreError>;

    /// Frees the slots under `key` of `sends` (outbox id, claim token) whose sends have
    /// ended; a slot since taken for another claim of the row stays.
    async fn free_slots(&self, key: &str, sends: &[(String, String)]) -> Result<(), StoreError>;

    /// Records an operator's change of a channel's send limit and answers the change
    /// as stored, and whether this call made it: the first one made with its request
    /// id (a retry finds that one and records nothing more; the caller compares to
    /// tell a retry from a reuse).
    async fn change_rate(&self, change: &RateChange) -> Result<(RateChange, bool), StoreError>;

    /// Each channel's latest change, by channel name: what overrides its settings.
    async fn current_rates(&self) -> Result<Vec<RateChange>, StoreError>;

    /// The latest `limit` changes of every channel, newest first.
    async fn rate_changes(&self, limit: usize) -> Result<Vec<RateChange>, StoreError>;
}

/// Everything one database provides.
pub trait Store:
    EventStore
    + SendRates
    + Outbox
    + TimerStore
    + LoadQueue
    + LoadLock
    + DeliveryLog
    + LoadIndex
    + OpsQueries
    + ShadowStore
    + SpendLedger
    + EdgeStore
    + Prune
    + Send
    + Sync
    + 'static
{
}

impl<
    T: EventStore
        + SendRates
        + Outbox
        + TimerStore
        + LoadQueue
        + LoadLock
        + DeliveryLog
        + LoadIndex
        + OpsQueries
        + ShadowStore
        + SpendLedger
        + EdgeStore
        + Prune
        + Send
        + Sync
        + 'static,
> Store for T
{
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_cursors_round_trip_and_refuse_other_text() {
        let c =
            RowCursor { created_at: haul_core::time::from_ms(1_772_434_800_123), id: "L1/ask:x:p.1/1/send_sms".into() };
        assert_eq!(c.to_string(), "1772434800123.L1/ask:x:p.1/1/send_sms");
        assert_eq!(RowCursor::parse(&c.to_string()), Some(c));
        for bad in ["", "1772434800123", "1772434800123.", ".L1/a", "-1.L1/a", "x.L1/a", "1.L1 a", "1.L1\u{0}a"] {
            assert_eq!(RowCursor::parse(bad), None, "{bad:?}");
        }
        assert_eq!(RowCursor::parse(&format!("1.{}", "x".repeat(1025))), None, "ids are bounded");
        assert_eq!(RowCursor::parse("99999999999999999999.L1/a"), None, "out of range");
        assert!(RowCursor::start().created_at < haul_core::time::from_ms(0));
    }
}
