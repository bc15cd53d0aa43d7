//! The storage contracts on SQLite. A method that writes is one unit on the writer
//! thread; a read-only one runs on a read connection ([`SqliteStore::read`]).

use std::time::Duration;

use async_trait::async_trait;
use haul_core::InboxState;
use haul_core::action::ActionType;
use haul_core::derived::{Derived, TimerWrite};
use haul_core::dispatch::Alert;
use haul_core::ids::{LoadId, TimerId};
use haul_core::limit::{Grant, Limit};
use haul_core::projection::Record;
use haul_core::time::{Timestamp, add, from_ms, to_ms, to_us};
use haul_core::trace::TraceParent;
use haul_store::backend::next_loads_cursor;
use haul_store::backend::{
    Columns, CorruptRowError, check_entry_ids_distinct, check_keys_distinct, check_keys_of_load, check_lease,
    check_takes, claims, conflict_load_row, counted, dead_row, deadline_ms, delivery_receipt, delivery_row,
    inbox_alert_row, inbox_sms_row, llm_spend_row, load_client_row, load_id_row, load_summary_row, ops_alert_row,
    outbox_row, parse_receipt, queue_message_row, rate_change_row, receipt, record_row, saturated_row, shadow_params,
    shadow_row, sms_assignment, sms_consent_row, sms_dismissal, sms_move_step, sms_report_row, sms_route,
    sms_route_load, timer_row, type_count_row, unmatched_sms_row, unsettled_row,
};
use haul_store::ops::{
    InboxAlert, InboxCounts, InboxSms, LOADS_SCANNED_PER_PAGE, SmsDismissal, state_param, types_param,
};
use haul_store::{
    AlertState, AppendError, AppendWith, Claim, ClaimError, ClaimTake, ClaimedTaking, ConcurrencyConflictError,
    DeliveryLog, DuplicateActionKeyError, DuplicateEntryError, EventStore, LoadIndex, LoadLease, LoadLock, LoadQueue,
    MAX_CLIENTS_OF, MAX_CONSENT_ASKED, MAX_HOLDS, NewEntry, NewOutboxRow, OpsAlertRecord, Outbox, OutboxRow,
    OutboxStatus, Prune, PruneReport, Published, QueueError, QueueMessage, RateChange, RecordedDelivery, RowCursor,
    SendRates, ShadowCursor, ShadowDecision, ShadowStore, SidClaim, SmsAssignment, SmsConsent, SmsMove, SmsReport,
    SmsRoute, StaleClaimError, StoreError, Superseded, Timer, TimerStore, UnmatchedSms, Unsettled, alert_inbox,
    columns, sms_inbox_state, too_many,
};
use haul_store::{ClaimCursor, ClaimWith, ConflictLoad, DeadRow, LoadFilter, LoadsPage, OpsQueries};
use haul_store::{ClientDaySpend, SpendLedger};
use haul_store::{EdgeStore, RequestClaim, console_secret_from_hex, console_secret_hex};
use rusqlite::types::FromSql;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::{SqliteStore, db};

/// A rusqlite row, read by haul_store's decoders.
struct SqliteRow<'a, 'stmt>(&'a Row<'stmt>);

impl SqliteRow<'_, '_> {
    fn get<T: FromSql>(&self, index: usize) -> Result<T, CorruptRowError> {
        self.0.get(index).map_err(|e| CorruptRowError::column(index, e))
    }
}

impl Columns for SqliteRow<'_, '_> {
    fn string(&self, index: usize) -> Result<String, CorruptRowError> {
        self.get(index)
    }

    fn opt_string(&self, index: usize) -> Result<Option<String>, CorruptRowError> {
        self.get(index)
    }

    fn i64(&self, index: usize) -> Result<i64, CorruptRowError> {
        self.get(index)
    }

    fn opt_i64(&self, index: usize) -> Result<Option<i64>, CorruptRowError> {
        self.get(index)
    }

    fn u32(&self, index: usize) -> Result<u32, CorruptRowError> {
        self.get(index)
    }
}

impl SqliteStore {
    /// Runs `f`, which only reads, on a read connection; in memory, on the writer.
    async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        match &self.readers {
            Some(readers) => readers.run(f).await,
            None => self.writer.run(f).await,
        }
    }

    /// Runs a (cached) read-only query and decodes each row.
    async fn query_rows<T, P>(
        &self,
        sql: &'static str,
        params: P,
        decode: fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + 'static,
        P: rusqlite::Params + Send + 'static,
    {
        self.read(move |conn: &Connection| rows(conn, sql, params, decode)).await
    }

    /// Runs a (cached) statement that writes and returns rows (`UPDATE … RETURNING`)
    /// on the writer thread, and decodes each row.
    async fn write_rows<T, P>(
        &self,
        sql: &'static str,
        params: P,
        decode: fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError>
    where
        T: Send + 'static,
        P: rusqlite::Params + Send + 'static,
    {
        self.writer.run(move |conn: &Connection| rows(conn, sql, params, decode)).await
    }
}

/// Runs a (cached) query and decodes each row.
pub(crate) fn rows<T>(
    conn: &Connection,
    sql: &str,
    p: impl rusqlite::Params,
    decode: fn(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(db)?;
    let mut rows = stmt.query(p).map_err(db)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(db)? {
        out.push(decode(&SqliteRow(r))?);
    }
    Ok(out)
}

// Statements go through the connection's statement cache (`prepare_cached`, `exec`):
// parsed once, not per call. A `LIMIT` takes its bound value as `CAST(?n AS INTEGER)`:
// SQLite marks a bare `LIMIT ?n` "re-prepare on bind", and as the cache clears a
// statement's bindings when it is put back, every use of it was parsed and planned
// again (the profile in bench/RESULTS.md: a sixth of all instructions of `haul bench
// e2e` went to those re-prepares). The same happens to `col = ?n ... ORDER BY` on a
// key that starts with `col` (SQLite 3.54): there the value is `CAST(?n AS TEXT)`,
// which the planner still serves from the key (`SEARCH ... USING PRIMARY KEY`).

/// A `LIMIT` value: a `usize` past SQLite's integers reads everything.
fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

/// `Connection::execute` through the statement cache.
fn exec(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(p)
}

fn version(conn: &Connection, load_id: &str) -> Result<u64, StoreError> {
    let v: Option<i64> = conn
        .prepare_cached("SELECT version FROM loads WHERE load_id = ?1")
        .and_then(|mut s| s.query_row([load_id], |r| r.get(0)))
        .optional()
        .map_err(db)?;
    Ok(v.unwrap_or(0) as u64)
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn read(&self, load_id: &LoadId) -> Result<(Vec<Record>, u64), StoreError> {
        self.read_after(load_id, 0).await
    }

    async fn read_after(&self, load_id: &LoadId, after_seq: u64) -> Result<(Vec<Record>, u64), StoreError> {
        let records = self
            .query_rows(
                concat!(
                    "SELECT ",
                    columns!(record),
                    " FROM events WHERE load_id = CAST(?1 AS TEXT) AND seq > ?2 ORDER BY seq"
                ),
                (load_id.to_string(), after_seq as i64),
                record_row,
            )
            .await?;
        let version = records.last().map_or(after_seq, |r| r.seq);
        Ok((records, version))
    }

    async fn append_with(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        with: AppendWith<'_>,
        now: Timestamp,
    ) -> Result<(u64, bool), AppendError> {
        let (receipt, claim) = (with.receipt.map(str::to_owned), with.claim.cloned());
        self.append_unit(load_id, entries, expected_version, outbox, receipt, claim, now).await
    }

    async fn read_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(record),
                " FROM events WHERE load_id = CAST(?1 AS TEXT) AND seq > ?2 ORDER BY seq LIMIT CAST(?3 AS INTEGER)"
            ),
            (load_id.to_string(), after_seq as i64, sql_limit(limit)),
            record_row,
        )
        .await
    }

    async fn load_ids(&self, after: Option<&LoadId>, limit: usize) -> Result<Vec<LoadId>, StoreError> {
        let after = after.map(|a| a.to_string()).unwrap_or_default();
        self.query_rows(
            "SELECT load_id FROM loads WHERE load_id > ?1 ORDER BY load_id LIMIT CAST(?2 AS INTEGER)",
            (after, limit as i64),
            load_id_row,
        )
        .await
    }
}

impl SqliteStore {
    /// The append, and with `receipt` the ack of that message, in one unit of work.
    #[allow(clippy::too_many_arguments)]
    async fn append_unit(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        receipt: Option<String>,
        claim: Option<ClaimWith>,
        now: Timestamp,
    ) -> Result<(u64, bool), AppendError> {
        check_keys_of_load(load_id, &outbox)?;
        let load_id = load_id.clone();
        self.writer
            .run(move |conn: &Connection| -> Result<(u64, bool), AppendError> {
                let now = to_ms(now);
                // 1. The version.
                let lid = load_id.as_str();
                let actual = version(conn, lid)?;
                if actual != expected_version {
                    let load_id = lid.to_owned();
                    return Err(ConcurrencyConflictError { load_id, expected: expected_version, actual }.into());
                }
                // 2. The entry ids, within this call and in the log.
                check_entry_ids_distinct(&load_id, &entries)?;
                for e in &entries {
                    let exists: bool = conn
                        .prepare_cached("SELECT EXISTS (SELECT 1 FROM events WHERE load_id = ?1 AND entry_id = ?2)")
                        .and_then(|mut s| s.query_row(params![lid, e.entry_id], |r| r.get(0)))
                        .map_err(db)?;
                    if exists {
                        return Err(DuplicateEntryError { load_id: lid.into(), entry_id: e.entry_id.clone() }.into());
                    }
                }
                // 3. The outbox keys, within this call and in the outbox.
                check_keys_distinct(&outbox)?;
                for o in &outbox {
                    let exists: bool = conn
                        .prepare_cached("SELECT EXISTS (SELECT 1 FROM outbox WHERE id = ?1)")
                        .and_then(|mut s| s.query_row([&o.id], |r| r.get(0)))
                        .map_err(db)?;
                    if exists {
                        return Err(DuplicateActionKeyError { key: o.id.clone() }.into());
                    }
                }
                let new_version = expected_version + entries.len() as u64;
                conn.prepare_cached(
                    "INSERT INTO loads (load_id, version, created_at, updated_at) VALUES (?1, ?2, ?3, ?3)
                     ON CONFLICT (load_id) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at",
                )
                .and_then(|mut s| s.execute(params![lid, new_version as i64, now]))
                .map_err(db)?;
                // What the entries change in the load's summary (stage, asks) and facts
                // (phone, active), in the same transaction.
                let delta = Derived::merged(entries.iter().map(|e| &e.derived));
                if delta.changes_facts() {
                    exec(
                        conn,
                        "INSERT INTO load_facts (load_id, driver_phone, active, updated_at, client)
                           VALUES (?1, ?2, COALESCE(?3, 1), ?4, ?5)
                         ON CONFLICT (load_id) DO UPDATE SET driver_phone = COALESCE(?2, driver_phone),
                           active = COALESCE(?3, active), updated_at = ?4, client = COALESCE(?5, client)",
                        params![lid, delta.driver_phone, delta.active(), now, delta.client],
                    )
                    .map_err(db)?;
                }
                if let Some((consent, event_id)) = &delta.consent {
                    exec(conn, CONSENT_SET, params![consent.phone, consent.opted_out, event_id, lid, now]).map_err(db)?;
                }
                // What its model calls cost the client's day, and their prompts.
                for d in &delta.spend {
                    let s = &d.spend;
                    let capped_at = d.capped.then_some(now);
                    exec(
                        conn,
                        SPEND_ADD,
                        params![
                            d.client,
                            d.day,
                            s.input_tokens as i64,
                            s.output_tokens as i64,
                            s.cost_micro_usd as i64,
                            s.calls as i64,
                            capped_at,
                            now
                        ],
                    )
                    .map_err(db)?;
                }
                for (hash, text) in &delta.prompts {
                    exec(conn, PROMPT_PUT, params![hash, text, now]).map_err(db)?;
                }
                if delta.stage.is_some() || !delta.asks_unchanged() {
                    let (mut asks, mut open, mut escalated) = (None, None, None);
                    if !delta.asks_unchanged() {
                        let before: String = conn
                            .prepare_cached("SELECT asks FROM loads WHERE load_id = ?1")
                            .and_then(|mut s| s.query_row([lid], |r| r.get(0)))
                            .map_err(db)?;
                        let (after, o, e) = delta.fold_asks(&before);
                        (asks, open, escalated) = (Some(after), Some(o), Some(e));
                    }
                    exec(
                        conn,
                        "UPDATE loads SET stage = COALESCE(?2, stage), asks = COALESCE(?3, asks),
                           open_asks = COALESCE(?4, open_asks), escalated_asks = COALESCE(?5, escalated_asks)
                         WHERE load_id = ?1",
                        params![lid, delta.stage, asks, open, escalated],
                    )
                    .map_err(db)?;
                }
                // The dead rows its decisions took out of the operators' inbox.
                for (outbox_id, state, event_id) in &delta.inbox {
                    exec(
                        conn,
                        "UPDATE outbox SET inbox_state = ?3, inbox_event = ?4, inbox_at = ?5
                         WHERE id = ?2 AND load_id = ?1",
                        params![lid, outbox_id, state, event_id, now],
                    )
                    .map_err(db)?;
                }
                let mut ins = conn
                    .prepare_cached(
                        "INSERT INTO events (load_id, seq, entry_id, kind, payload, recorded_at, trace)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )
                    .map_err(db)?;
                for (i, e) in entries.iter().enumerate() {
                    let seq = (expected_version + 1 + i as u64) as i64;
                    let trace = e.trace.map(|t| t.to_string());
                    ins.execute(params![lid, seq, e.entry_id, e.kind, e.payload.to_string(), now, trace]).map_err(db)?;
                }
                let mut ins = conn
                    .prepare_cached(
                        "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at, updated_at, trace,
                           claim_token, lease_until, first_attempt_at)
                         VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?5, ?5, ?6, ?7, ?8, CASE WHEN ?7 IS NULL THEN NULL ELSE ?5 END)",
                    )
                    .map_err(db)?;
                // Claimed with the append (`AppendWith::claim`): as a claim at `now` would.
                let (token, lease_until) = match &claim {
                    Some(c) => (Some(c.token.as_str()), Some(to_ms(c.lease_until))),
                    None => (None, None),
                };
                for o in &outbox {
                    let trace = o.trace.map(|t| t.to_string());
                    let (action_type, action) = (o.action_type.as_str(), o.action.to_string());
                    ins.execute(params![o.id, lid, action_type, action, now, trace, token, lease_until]).map_err(db)?;
                }
                // The timers its decisions schedule and cancel (`TimerRoute::WithDecision`),
                // with the run's trace context.
                let trace = NewEntry::run_trace(&entries).map(|t| t.to_string());
                for t in &delta.timers {
                    match t {
                        TimerWrite::Schedule { timer_id, fire_at } => {
                            schedule_in(conn, timer_id, to_ms(*fire_at), trace.as_deref(), now)?
                        }
                        TimerWrite::Cancel { timer_id } => cancel_in(conn, timer_id, now)?,
                    };
                }
                let acked = match &receipt {
                    Some(r) => ack_in(conn, r, Some(lid), now)?,
                    None => false,
                };
                Ok((new_version, acked))
            })
            .await
    }
}

/// A decision's spend added to its client's day (`?1` client, `?2` day, `?3`-`?6`
/// input and output tokens, cost, calls, `?7` capped at (NULL: not capped), `?8` now).
const SPEND_ADD: &str = "INSERT INTO llm_spend AS s (client, day, input_tokens, output_tokens, cost_micro_usd, calls,
       capped_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
     ON CONFLICT (client, day) DO UPDATE SET input_tokens = s.input_tokens + excluded.input_tokens,
       output_tokens = s.output_tokens + excluded.output_tokens,
       cost_micro_usd = s.cost_micro_usd + excluded.cost_micro_usd, calls = s.calls + excluded.calls,
       capped_at = COALESCE(s.capped_at, excluded.capped_at), updated_at = excluded.updated_at";

/// A prompt, once by its hash (`?1` hash, `?2` text, `?3` now).
const PROMPT_PUT: &str =
    "INSERT INTO prompts (hash, text, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (hash) DO NOTHING";

/// What an SMS changed in its phone's consent (`?1` phone, `?2` opted out, `?3`
/// event, `?4` load or NULL, `?5` now, ms): an opt-out kept until an opt-in clears
/// it, an opt-in kept only over an opt-out.
const CONSENT_SET: &str = "INSERT INTO sms_consent (phone, opted_out, event_id, load_id, changed_at)
       SELECT ?1, ?2, ?3, ?4, ?5 WHERE ?2 = 1 OR EXISTS (SELECT 1 FROM sms_consent WHERE phone = ?1)
     ON CONFLICT (phone) DO UPDATE SET opted_out = excluded.opted_out, event_id = excluded.event_id,
       load_id = excluded.load_id, changed_at = excluded.changed_at
     WHERE sms_consent.opted_out <> excluded.opted_out";

/// Ok when `token` is the row's live-or-lapsed claim on a pending row.
/// The unmatched SMS `sid` with whose it is (`columns!(unmatched_sms), assigned_load,
/// assigned_event, dismissed_by`), read by `f`; `None` when there is no such SMS.
fn sms_holder<T>(
    conn: &Connection,
    sid: &str,
    f: impl FnOnce(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut stmt = conn
        .prepare_cached(concat!(
            "SELECT ",
            columns!(unmatched_sms),
            ", assigned_load, assigned_event, dismissed_by FROM unmatched_sms WHERE message_sid = ?1"
        ))
        .map_err(db)?;
    let mut found = stmt.query([sid]).map_err(db)?;
    match found.next().map_err(db)? {
        Some(row) => f(&SqliteRow(row)).map(Some),
        None => Ok(None),
    }
}

fn owns(conn: &Connection, id: &str, token: &str) -> Result<Option<i64>, ClaimError> {
    let lease: Option<Option<i64>> = conn
        .prepare_cached("SELECT lease_until FROM outbox WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'")
        .and_then(|mut s| s.query_row(params![id, token], |r| r.get(0)).optional())
        .map_err(db)?;
    match lease {
        Some(l) => Ok(l),
        None => Err(StaleClaimError { outbox_id: id.to_owned() }.into()),
    }
}

fn mark_dispatched_in(conn: &Connection, id: &str, token: &str, receipt: &str, now: i64) -> Result<(), ClaimError> {
    owns(conn, id, token)?;
    conn.prepare_cached(
        "UPDATE outbox SET status = 'dispatched', receipt = ?2, updated_at = ?3, lease_until = NULL,
         outcome_published_at = ?3 WHERE id = ?1",
    )
    .and_then(|mut s| s.execute(params![id, receipt, now]))
    .map_err(db)?;
    Ok(())
}

/// A claimed row held back unsent (`Outbox::hold`, `hold_all`): `?1` id, `?2` token,
/// `?3` due again at, `?4` now, `?5` a note for its last failure (none: kept). No
/// attempt counted; the budget's start forgotten (never sent) or moved on by the wait.
const OUTBOX_HOLD: &str = "UPDATE outbox SET due_at = ?3, claim_token = NULL, lease_until = NULL, updated_at = ?4,
     first_attempt_at = CASE WHEN attempts = 0 THEN NULL ELSE first_attempt_at + (?3 - ?4) END,
     last_failure = coalesce(?5, last_failure)
     WHERE id = ?1 AND claim_token = ?2 AND status = 'pending'";

/// The dispatcher's claim of due rows, in due order, `$past` narrowing the rows it
/// takes: `?1` token, `?2` lease until, `?3` now, `?4` limit.
macro_rules! outbox_claim {
    ($past:literal) => {
        concat!(
            "UPDATE outbox SET claim_token = ?1, lease_until = ?2, first_attempt_at = COALESCE(first_attempt_at, ?3)
             WHERE id IN (SELECT id FROM outbox WHERE status = 'pending' AND due_at <= ?3
                          AND (lease_until IS NULL OR lease_until <= ?3)",
            $past,
            " ORDER BY due_at, id LIMIT CAST(?4 AS INTEGER))
             RETURNING ",
            columns!(outbox)
        )
    };
}

impl SqliteStore {
    /// `pending`, or `pending_after` (`?5` due_at, `?6` id of the cursor) when `after`
    /// is given.
    async fn claim_due(
        &self,
        limit: usize,
        now: Timestamp,
        lease: Duration,
        after: Option<&ClaimCursor>,
    ) -> Result<Vec<Claim>, StoreError> {
        let token = self.tokens.next();
        let (now, lease_until, limit) = (to_ms(now), to_ms(add(now, lease)), limit as i64);
        let after = after.map(|a| (to_ms(a.due_at), a.id.clone()));
        let claim = ClaimArgs { token: token.clone(), lease_until, now, limit, after };
        let rows = self.writer.run(move |conn: &Connection| claim_in(conn, claim)).await?;
        Ok(claims(rows, &token))
    }
}

/// One claim's parameters (ms): its token, lease, now, most rows, and the cursor
/// `(due_at, id)` it claims past, if any.
struct ClaimArgs {
    token: String,
    lease_until: i64,
    now: i64,
    limit: i64,
    after: Option<(i64, String)>,
}

/// The claim of `pending` / `pending_after` inside a writer unit.
fn claim_in(conn: &Connection, c: ClaimArgs) -> Result<Vec<OutboxRow>, StoreError> {
    match c.after {
        None => rows(conn, outbox_claim!(""), (c.token, c.lease_until, c.now, c.limit), outbox_row),
        Some((due_at, id)) => {
            let sql = outbox_claim!(" AND (due_at, id) > (?5, ?6)");
            rows(conn, sql, (c.token, c.lease_until, c.now, c.limit, due_at, id), outbox_row)
        }
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    async fn pending(&self, limit: usize, now: Timestamp, lease: Duration) -> Result<Vec<Claim>, StoreError> {
        self.claim_due(limit, now, lease, None).await
    }

    async fn pending_after(
        &self,
        limit: usize,
        now: Timestamp,
        lease: Duration,
        after: &ClaimCursor,
    ) -> Result<Vec<Claim>, StoreError> {
        self.claim_due(limit, now, lease, Some(after)).await
    }

    async fn check_claim(&self, id: &str, token: &str, now: Timestamp) -> Result<(), ClaimError> {
        let (id, token, now) = (id.to_owned(), token.to_owned(), to_ms(now));
        self.read(move |conn: &Connection| Ok(check_lease(&id, owns(conn, &id, &token)?, now)?)).await
    }

    async fn mark_dispatched(&self, id: &str, token: &str, receipt: &str, now: Timestamp) -> Result<(), ClaimError> {
        let (id, token, receipt, now) = (id.to_owned(), token.to_owned(), receipt.to_owned(), to_ms(now));
        self.writer.run(move |conn: &Connection| mark_dispatched_in(conn, &id, &token, &receipt, now)).await
    }

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
    ) -> Result<Published, ClaimError> {
        let (id, token, receipt, now) = (id.to_owned(), token.to_owned(), receipt.to_owned(), to_ms(now));
        let (load_id, event_id, body) = (load_id.to_string(), event_id.to_owned(), body.to_owned());
        let trace = trace.map(|t| t.to_string());
        // A stale claim must not roll the publish back, so the unit itself succeeds
        // and carries the mark's answer.
        self.writer
            .run(move |conn: &Connection| -> Result<Result<Published, ClaimError>, StoreError> {
                let published = publish_in(conn, &load_id, &event_id, &body, trace.as_deref(), now)?;
                match mark_dispatched_in(conn, &id, &token, &receipt, now) {
                    Ok(()) => Ok(Ok(published)),
                    Err(ClaimError::Stale(e)) => Ok(Err(e.into())),
                    Err(ClaimError::Store(e)) => Err(e),
                }
            })
            .await?
    }

    async fn mark_failed(
        &self,
        id: &str,
        token: &str,
        failure: &str,
        retry_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), ClaimError> {
        let (id, token, failure, now) = (id.to_owned(), token.to_owned(), failure.to_owned(), to_ms(now));
        let retry_at = retry_at.map(to_ms);
        self.writer
            .run(move |conn: &Connection| {
                owns(conn, &id, &token)?;
                match retry_at {
                    Some(at) => exec(
                        conn,
                        "UPDATE outbox SET attempts = attempts + 1, last_failure = ?2, due_at = ?3, claim_token = NULL,
                         lease_until = NULL, updated_at = ?4 WHERE id = ?1",
                        params![id, failure, at, now],
                    ),
                    None => exec(
                        conn,
                        "UPDATE outbox SET attempts = attempts + 1, last_failure = ?2, status = 'dead', dead_at = ?3,
                         lease_until = NULL, updated_at = ?3 WHERE id = ?1",
                        params![id, failure, now],
                    ),
                }
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn hold(
        &self,
        id: &str,
        token: &str,
        until: Timestamp,
        note: Option<&str>,
        now: Timestamp,
    ) -> Result<(), ClaimError> {
        let (id, token, until, now) = (id.to_owned(), token.to_owned(), to_ms(until), to_ms(now));
        let note = note.map(str::to_owned);
        self.writer
            .run(move |conn: &Connection| {
                owns(conn, &id, &token)?;
                exec(conn, OUTBOX_HOLD, params![id, token, until, now, note]).map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn hold_all(&self, holds: &[(String, String, Timestamp)], now: Timestamp) -> Result<usize, StoreError> {
        if holds.len() > MAX_HOLDS {
            return Err(too_many("holds", holds.len(), MAX_HOLDS));
        }
        if holds.is_empty() {
            return Ok(0);
        }
        let (holds, now) = (holds.to_vec(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let mut st = conn.prepare_cached(OUTBOX_HOLD).map_err(db)?;
                let mut held = 0;
                for (id, token, until) in &holds {
                    held += st.execute(params![id, token, to_ms(*until), now, None::<String>]).map_err(db)?;
                }
                Ok(held)
            })
            .await
    }

    async fn supersede(
        &self,
        id: &str,
        token: &str,
        ask_id: &str,
        step: u32,
        now: Timestamp,
    ) -> Result<Option<Superseded>, StoreError> {
        let (id, token, ask_id, now) = (id.to_owned(), token.to_owned(), ask_id.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let later: Option<(String, i64, bool)> = conn
                    .prepare_cached(
                        "SELECT l.id, l.due_at, l.status = 'pending' AND l.attempts = 0 AND l.due_at > ?5
                           AND (l.lease_until IS NULL OR l.lease_until <= ?5)
                         FROM outbox o JOIN outbox l ON l.load_id = o.load_id
                         WHERE o.id = ?1 AND o.claim_token = ?2 AND o.status = 'pending'
                           AND json_extract(l.action, '$.ask_id') = ?3 AND json_extract(l.action, '$.step') > ?4
                         ORDER BY l.created_at, l.id LIMIT 1",
                    )
                    .and_then(|mut st| {
                        st.query_row(params![id, token, ask_id, step, now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                            .optional()
                    })
                    .map_err(db)?;
                let Some((later, was_due, waits)) = later else { return Ok(None) };
                exec(
                    conn,
                    "UPDATE outbox SET status = 'superseded', claim_token = NULL, lease_until = NULL,
                     updated_at = ?2, outcome_published_at = ?2, last_failure = ?3 WHERE id = ?1",
                    params![id, now, format!("not sent: its ask moved on ({later})")],
                )
                .map_err(db)?;
                if waits {
                    exec(conn, "UPDATE outbox SET due_at = ?2, updated_at = ?2 WHERE id = ?1", params![later, now])
                        .map_err(db)?;
                }
                Ok(Some(Superseded { by: later, by_was_due: waits.then(|| from_ms(was_due)) }))
            })
            .await
    }

    async fn get(&self, id: &str) -> Result<Option<OutboxRow>, StoreError> {
        Ok(self
            .query_rows(concat!("SELECT ", columns!(outbox), " FROM outbox WHERE id = ?1"), [id.to_owned()], outbox_row)
            .await?
            .pop())
    }

    async fn rows_for_load(&self, load_id: &LoadId) -> Result<Vec<OutboxRow>, StoreError> {
        let load_id = load_id.to_string();
        self.query_rows(
            concat!("SELECT ", columns!(outbox), " FROM outbox WHERE load_id = ?1 ORDER BY created_at, id"),
            [load_id],
            outbox_row,
        )
        .await
    }

    async fn rows_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(outbox),
                " FROM outbox WHERE load_id = CAST(?1 AS TEXT) AND (created_at, id) > (?2, ?3)
                 ORDER BY created_at, id LIMIT CAST(?4 AS INTEGER)"
            ),
            (load_id.to_string(), to_ms(after.created_at), after.id.clone(), sql_limit(limit)),
            outbox_row,
        )
        .await
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<Timestamp>, StoreError> {
        self.read(|conn: &Connection| {
            let v: Option<i64> = conn
                .query_row("SELECT min(created_at) FROM outbox WHERE status = 'pending'", [], |r| r.get(0))
                .map_err(db)?;
            Ok(v.map(from_ms))
        })
        .await
    }

    async fn dead(&self, since: Timestamp, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        let since = to_ms(since);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(outbox),
                " FROM outbox WHERE status = 'dead' AND dead_at >= ?1 ORDER BY dead_at, id LIMIT CAST(?2 AS INTEGER)"
            ),
            (since, limit as i64),
            outbox_row,
        )
        .await
    }

    async fn dead_of_type(
        &self,
        action_type: ActionType,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        // Served by outbox_dead_type (migration 8).
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(outbox),
                " FROM outbox WHERE status = 'dead' AND action_type = CAST(?1 AS TEXT) AND dead_at >= ?2
                 ORDER BY dead_at, id LIMIT CAST(?3 AS INTEGER)"
            ),
            (action_type.as_str(), to_ms(since), sql_limit(limit)),
            outbox_row,
        )
        .await
    }

    async fn mark_outcome_published(&self, id: &str, now: Timestamp) -> Result<(), StoreError> {
        self.outcome_published(id, now).await
    }

    async fn dead_without_outcome(&self, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.dead_unpublished(limit).await
    }

    async fn unsettled_due(&self, now: Timestamp, limit: usize) -> Result<Vec<Unsettled>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(unsettled),
                " FROM outbox WHERE status = 'dead' AND outcome_published_at IS NULL
                 AND (settle_due_at IS NULL OR settle_due_at <= ?1) ORDER BY dead_at, id LIMIT CAST(?2 AS INTEGER)"
            ),
            (to_ms(now), sql_limit(limit)),
            unsettled_row,
        )
        .await
    }

    async fn defer_settle(&self, id: &str, failure: &str, retry_at: Timestamp) -> Result<(), StoreError> {
        let (id, failure, retry_at) = (id.to_owned(), failure.to_owned(), to_ms(retry_at));
        self.writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "UPDATE outbox SET settle_attempts = settle_attempts + 1, settle_due_at = ?2, settle_failure = ?3
                     WHERE id = ?1 AND status = 'dead' AND outcome_published_at IS NULL",
                    params![id, retry_at, failure],
                )
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn record_ops_alert(
        &self,
        alert: &Alert,
        state: AlertState,
        error: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let params = (
            alert.outbox_id.clone(),
            alert.load_id.to_string(),
            alert.kind.as_str(),
            alert.action_type.as_str(),
            alert.failure.clone(),
            state.as_str(),
            error.map(str::to_owned),
            to_ms(now),
        );
        let recorded = self
            .write_rows(
                "INSERT INTO ops_alerts (outbox_id, load_id, kind, action_type, failure, state, sends, last_error,
                                         raised_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 1, ?7, ?8, ?8)
                 ON CONFLICT (outbox_id) DO UPDATE SET state = excluded.state, sends = ops_alerts.sends + 1,
                     last_error = COALESCE(excluded.last_error, ops_alerts.last_error), updated_at = excluded.updated_at
                 WHERE ops_alerts.state = 'pending'
                 RETURNING outbox_id",
                params,
                |r| r.string(0).map_err(StoreError::from),
            )
            .await?;
        Ok(!recorded.is_empty())
    }

    async fn ops_alerts(&self, after: &RowCursor, limit: usize) -> Result<Vec<OpsAlertRecord>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(ops_alert),
                " FROM ops_alerts WHERE (raised_at, outbox_id) > (?1, ?2)
                 ORDER BY raised_at, outbox_id LIMIT CAST(?3 AS INTEGER)"
            ),
            (to_ms(after.created_at), after.id.clone(), sql_limit(limit)),
            ops_alert_row,
        )
        .await
    }

    async fn count_by_status(&self, status: OutboxStatus) -> Result<u64, StoreError> {
        self.read(move |conn: &Connection| {
            let n: i64 = conn
                .query_row("SELECT count(*) FROM outbox WHERE status = ?1", [status.as_str()], |r| r.get(0))
                .map_err(db)?;
            Ok(n as u64)
        })
        .await
    }
}

impl SqliteStore {
    async fn outcome_published(&self, id: &str, now: Timestamp) -> Result<(), StoreError> {
        let (id, now) = (id.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "UPDATE outbox SET outcome_published_at = ?2 WHERE id = ?1 AND outcome_published_at IS NULL",
                    params![id, now],
                )
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn dead_unpublished(&self, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(outbox),
                " FROM outbox WHERE status = 'dead' AND outcome_published_at IS NULL
                 ORDER BY dead_at, id LIMIT CAST(?1 AS INTEGER)"
            ),
            [limit as i64],
            outbox_row,
        )
        .await
    }
}

/// `TimerStore::schedule` on the writer's connection: alone, or in an append.
fn schedule_in(
    conn: &Connection,
    timer_id: &TimerId,
    fire_at: i64,
    trace: Option<&str>,
    now: i64,
) -> Result<bool, StoreError> {
    let (load_id, _, _) = timer_id.parts();
    let n = conn
        .prepare_cached(
            "INSERT INTO timers (timer_id, load_id, fire_at, status, created_at, trace)
             VALUES (?1, ?2, ?3, 'scheduled', ?4, ?5) ON CONFLICT (timer_id) DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![timer_id.as_str(), load_id.as_str(), fire_at, now, trace]))
        .map_err(db)?;
    Ok(n == 1)
}

/// `TimerStore::cancel` on the writer's connection: alone, or in an append.
fn cancel_in(conn: &Connection, timer_id: &TimerId, now: i64) -> Result<bool, StoreError> {
    let (load_id, _, _) = timer_id.parts();
    // A cancel that arrives before its schedule leaves a canceled row behind, so the
    // late schedule is a noop. Its fire_at is unknown: 0.
    let inserted = conn
        .prepare_cached(
            "INSERT INTO timers (timer_id, load_id, fire_at, status, created_at, canceled_at)
             VALUES (?1, ?2, 0, 'canceled', ?3, ?3) ON CONFLICT (timer_id) DO NOTHING",
        )
        .and_then(|mut s| s.execute(params![timer_id.as_str(), load_id.as_str(), now]))
        .map_err(db)?;
    if inserted == 1 {
        return Ok(true);
    }
    let n = conn
        .prepare_cached(
            "UPDATE timers SET status = 'canceled', canceled_at = ?2 WHERE timer_id = ?1 AND status = 'scheduled'",
        )
        .and_then(|mut s| s.execute(params![timer_id.as_str(), now]))
        .map_err(db)?;
    Ok(n == 1)
}

#[async_trait]
impl TimerStore for SqliteStore {
    async fn schedule_traced(
        &self,
        timer_id: &TimerId,
        fire_at: Timestamp,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let (timer_id, fire_at, now) = (timer_id.clone(), to_ms(fire_at), to_ms(now));
        let trace = trace.map(|t| t.to_string());
        self.writer.run(move |conn: &Connection| schedule_in(conn, &timer_id, fire_at, trace.as_deref(), now)).await
    }

    async fn cancel(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError> {
        let (timer_id, now) = (timer_id.clone(), to_ms(now));
        self.writer.run(move |conn: &Connection| cancel_in(conn, &timer_id, now)).await
    }

    async fn mark_fired(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError> {
        let (timer_id, now) = (timer_id.to_string(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let n = conn
                    .execute(
                        "UPDATE timers SET status = 'fired', fired_at = ?2 WHERE timer_id = ?1 AND status = 'scheduled'",
                        params![timer_id, now],
                    )
                    .map_err(db)?;
                Ok(n == 1)
            })
            .await
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<Timer>, StoreError> {
        let now = to_ms(now);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(timer),
                " FROM timers WHERE status = 'scheduled' AND fire_at <= ?1 ORDER BY fire_at, timer_id LIMIT CAST(?2 AS INTEGER)"
            ),
            (now, limit as i64),
            timer_row,
        )
        .await
    }

    async fn timers_for_load(&self, load_id: &LoadId) -> Result<Vec<Timer>, StoreError> {
        let load_id = load_id.to_string();
        self.query_rows(
            concat!("SELECT ", columns!(timer), " FROM timers WHERE load_id = ?1 ORDER BY created_at, timer_id"),
            [load_id],
            timer_row,
        )
        .await
    }

    async fn timers_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(timer),
                " FROM timers WHERE load_id = CAST(?1 AS TEXT) AND (created_at, timer_id) > (?2, ?3)
                 ORDER BY created_at, timer_id LIMIT CAST(?4 AS INTEGER)"
            ),
            (load_id.to_string(), to_ms(after.created_at), after.id.clone(), sql_limit(limit)),
            timer_row,
        )
        .await
    }

    async fn get_timer(&self, timer_id: &TimerId) -> Result<Option<Timer>, StoreError> {
        let timer_id = timer_id.to_string();
        Ok(self
            .query_rows(concat!("SELECT ", columns!(timer), " FROM timers WHERE timer_id = ?1"), [timer_id], timer_row)
            .await?
            .pop())
    }
}

/// Enqueues a message and, when its load has no head, makes it the head.
fn publish_in(
    conn: &Connection,
    load_id: &str,
    event_id: &str,
    body: &str,
    trace: Option<&str>,
    now: i64,
) -> Result<Published, StoreError> {
    let id: Option<i64> = conn
        .prepare_cached(
            "INSERT INTO queue (load_id, event_id, body, enqueued_at, trace) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (load_id, event_id) DO NOTHING RETURNING id",
        )
        .and_then(|mut s| s.query_row(params![load_id, event_id, body, now, trace], |r| r.get(0)).optional())
        .map_err(db)?;
    let Some(id) = id else { return Ok(Published::Duplicate) };
    conn.prepare_cached(
        "INSERT INTO queue_heads (load_id, message_id, visible_at) VALUES (?1, ?2, ?3) ON CONFLICT (load_id) DO NOTHING",
    )
    .and_then(|mut s| s.execute(params![load_id, id, now]))
    .map_err(db)?;
    Ok(Published::New)
}

/// Receives message `id`, the head of `load_id`: the head invisible until `until`, the
/// message under a receipt of `token`, as `receive` answers it.
fn take_head(conn: &Connection, load_id: &str, id: i64, token: &str, until: i64) -> Result<QueueMessage, StoreError> {
    conn.prepare_cached("UPDATE queue_heads SET visible_at = ?2 WHERE load_id = ?1")
        .and_then(|mut s| s.execute(params![load_id, until]))
        .map_err(db)?;
    let sql = concat!(
        "UPDATE queue SET receipt = ?2, receive_count = receive_count + 1 WHERE id = ?1 RETURNING ",
        columns!(queue_message),
        ", (SELECT l.version FROM loads l WHERE l.load_id = queue.load_id)"
    );
    let (_, message) = rows(conn, sql, params![id, receipt(id, token)], queue_message_row)?
        .pop()
        .ok_or_else(|| db(rusqlite::Error::QueryReturnedNoRows))?;
    Ok(message)
}

/// Acks the message of `receipt` and moves its load's head on; false (and nothing
/// changed) when the receipt is not the message's current one, or the message is not
/// of `load` when one is given.
fn ack_in(conn: &Connection, receipt: &str, load: Option<&str>, now: i64) -> Result<bool, StoreError> {
    let Some(id) = parse_receipt(receipt) else { return Ok(false) };
    // Two statements rather than `?4 IS NULL OR load_id = ?4`, which SQLite re-prepares
    // whenever ?4 is bound again (a tenth of the writer's instructions in the profile).
    let load_id: Option<String> = match load {
        None => conn
            .prepare_cached(
                "UPDATE queue SET acked_at = ?3 WHERE id = ?1 AND receipt = ?2 AND acked_at IS NULL RETURNING load_id",
            )
            .and_then(|mut s| s.query_row(params![id, receipt, now], |r| r.get(0)).optional()),
        Some(load) => conn
            .prepare_cached(
                "UPDATE queue SET acked_at = ?3 WHERE id = ?1 AND receipt = ?2 AND acked_at IS NULL AND load_id = ?4
                 RETURNING load_id",
            )
            .and_then(|mut s| s.query_row(params![id, receipt, now, load], |r| r.get(0)).optional()),
    }
    .map_err(db)?;
    let Some(load_id) = load_id else { return Ok(false) };
    advance_head(conn, &load_id, now)?;
    Ok(true)
}

/// Moves a load's head to its next unacked message, or drops the head row.
fn advance_head(conn: &Connection, load_id: &str, now: i64) -> Result<(), StoreError> {
    let next: Option<i64> = conn
        .prepare_cached(
            "SELECT id FROM queue WHERE load_id = CAST(?1 AS TEXT) AND acked_at IS NULL ORDER BY id LIMIT 1",
        )
        .and_then(|mut s| s.query_row([load_id], |r| r.get(0)).optional())
        .map_err(db)?;
    match next {
        Some(id) => conn
            .prepare_cached("UPDATE queue_heads SET message_id = ?2, visible_at = ?3 WHERE load_id = ?1")
            .and_then(|mut s| s.execute(params![load_id, id, now])),
        None => {
            conn.prepare_cached("DELETE FROM queue_heads WHERE load_id = ?1").and_then(|mut s| s.execute([load_id]))
        }
    }
    .map_err(db)?;
    Ok(())
}

#[async_trait]
impl LoadQueue for SqliteStore {
    fn short_receive_drains(&self) -> bool {
        true
    }

    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        let (load_id, event_id, body, now) = (load_id.to_string(), event_id.to_owned(), body.to_owned(), to_ms(now));
        let trace = trace.map(|t| t.to_string());
        self.writer
            .run(move |conn: &Connection| publish_in(conn, &load_id, &event_id, &body, trace.as_deref(), now))
            .await
    }

    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError> {
        let token = self.tokens.next();
        let (now, until) = (to_ms(now), deadline_ms(now, visibility));
        self.writer
            .run(move |conn: &Connection| {
                let heads: Vec<(String, i64)> = {
                    let mut stmt = conn
                        .prepare_cached(
                            "SELECT load_id, message_id FROM queue_heads WHERE visible_at <= ?1 ORDER BY visible_at, message_id LIMIT CAST(?2 AS INTEGER)",
                        )
                        .map_err(db)?;
                    let rows = stmt.query_map(params![now, max as i64], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db)?;
                    rows.collect::<Result<_, _>>().map_err(db)?
                };
                heads.into_iter().map(|(load_id, id)| take_head(conn, &load_id, id, &token, until)).collect()
            })
            .await
    }

    async fn publish_receiving(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        visibility: Duration,
        now: Timestamp,
    ) -> Result<(Published, Option<QueueMessage>), StoreError> {
        let (load_id, event_id, body) = (load_id.to_string(), event_id.to_owned(), body.to_owned());
        let trace = trace.map(|t| t.to_string());
        let token = self.tokens.next();
        let (now, until) = (to_ms(now), deadline_ms(now, visibility));
        self.writer
            .run(move |conn: &Connection| {
                let published = publish_in(conn, &load_id, &event_id, &body, trace.as_deref(), now)?;
                let head: Option<i64> = conn
                    .prepare_cached(
                        "SELECT h.message_id FROM queue_heads h JOIN queue q ON q.id = h.message_id
                         WHERE h.load_id = ?1 AND q.event_id = ?2 AND q.receive_count = 0 AND h.visible_at <= ?3",
                    )
                    .and_then(|mut s| s.query_row(params![load_id, event_id, now], |r| r.get(0)).optional())
                    .map_err(db)?;
                let taken = head.map(|id| take_head(conn, &load_id, id, &token, until)).transpose()?;
                Ok((published, taken))
            })
            .await
    }

    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        let (receipt, now) = (receipt.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| -> Result<(), QueueError> {
                if ack_in(conn, &receipt, None, now)? { Ok(()) } else { Err(QueueError::StaleReceipt(receipt)) }
            })
            .await
    }

    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        let (receipt, visible_at) = (receipt.to_owned(), deadline_ms(now, delay));
        self.writer
            .run(move |conn: &Connection| -> Result<(), QueueError> {
                let stale = || QueueError::StaleReceipt(receipt.clone());
                let id = parse_receipt(&receipt).ok_or_else(stale)?;
                let load_id: Option<String> = conn
                    .prepare_cached("UPDATE queue SET receipt = NULL WHERE id = ?1 AND receipt = ?2 AND acked_at IS NULL RETURNING load_id")
                    .and_then(|mut s| s.query_row(params![id, receipt], |r| r.get(0)).optional())
                    .map_err(db)?;
                let load_id = load_id.ok_or_else(stale)?;
                conn.prepare_cached("UPDATE queue_heads SET visible_at = ?2 WHERE load_id = ?1")
                    .and_then(|mut s| s.execute(params![load_id, visible_at]))
                    .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        self.read(|conn: &Connection| {
            let n: i64 =
                conn.query_row("SELECT count(*) FROM queue WHERE acked_at IS NULL", [], |r| r.get(0)).map_err(db)?;
            Ok(n as u64)
        })
        .await
    }

    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError> {
        let (load_id, event_id) = (load_id.to_string(), event_id.to_owned());
        self.read(move |conn: &Connection| {
            conn.query_row(
                "SELECT body FROM queue WHERE load_id = ?1 AND event_id = ?2",
                params![load_id, event_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(db)
        })
        .await
    }
}

struct SqliteLease {
    store: SqliteStore,
    load_id: String,
    token: String,
}

#[async_trait]
impl LoadLease for SqliteLease {
    async fn release(self: Box<Self>) -> Result<(), StoreError> {
        let SqliteLease { store, load_id, token } = *self;
        store
            .writer
            .run(move |conn: &Connection| {
                exec(conn, "DELETE FROM load_leases WHERE load_id = ?1 AND token = ?2", params![load_id, token])
                    .map_err(db)?;
                Ok(())
            })
            .await
    }
}

#[async_trait]
impl LoadLock for SqliteStore {
    async fn try_lock(
        &self,
        load_id: &LoadId,
        ttl: Duration,
        now: Timestamp,
    ) -> Result<Option<Box<dyn LoadLease>>, StoreError> {
        let token = self.tokens.next();
        let (lid, tok, now, until) = (load_id.to_string(), token.clone(), to_ms(now), deadline_ms(now, ttl));
        let got = self
            .writer
            .run(move |conn: &Connection| {
                let n = conn
                    .execute(
                        "INSERT INTO load_leases (load_id, token, expires_at) VALUES (?1, ?2, ?4)
                         ON CONFLICT (load_id) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at
                         WHERE load_leases.expires_at <= ?3",
                        params![lid, tok, now, until],
                    )
                    .map_err(db)?;
                Ok::<_, StoreError>(n == 1)
            })
            .await?;
        Ok(got.then(|| {
            Box::new(SqliteLease { store: self.clone(), load_id: load_id.to_string(), token }) as Box<dyn LoadLease>
        }))
    }
}

#[async_trait]
impl DeliveryLog for SqliteStore {
    async fn record_delivery(
        &self,
        channel: &str,
        key: &str,
        load_id: &LoadId,
        payload: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(String, bool), StoreError> {
        let (channel, key, load_id, payload, now) =
            (channel.to_owned(), key.to_owned(), load_id.to_string(), payload.to_string(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let new: Option<i64> = conn
                    .prepare_cached(
                        "INSERT INTO deliveries (channel, key, load_id, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT (channel, key) DO NOTHING RETURNING id",
                    )
                    .and_then(|mut s| s.query_row(params![channel, key, load_id, payload, now], |r| r.get(0)).optional())
                    .map_err(db)?;
                match new {
                    Some(id) => Ok((delivery_receipt(id), true)),
                    None => {
                        let id: i64 = conn
                            .query_row("SELECT id FROM deliveries WHERE channel = ?1 AND key = ?2", params![channel, key], |r| r.get(0))
                            .map_err(db)?;
                        Ok((delivery_receipt(id), false))
                    }
                }
            })
            .await
    }

    async fn deliveries(&self, load_id: Option<&LoadId>, limit: usize) -> Result<Vec<RecordedDelivery>, StoreError> {
        let load_id = load_id.map(|l| l.to_string());
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(delivery),
                " FROM deliveries WHERE ?1 IS NULL OR load_id = ?1 ORDER BY id LIMIT CAST(?2 AS INTEGER)"
            ),
            (load_id, limit as i64),
            delivery_row,
        )
        .await
    }
}

/// The instant kept under `key` in `send_rates` (a rate's `tat`, a queue's last
/// slot), if any.
fn rate_state(conn: &Connection, key: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT tat_us FROM send_rates WHERE rate_key = ?1")
        .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
        .map_err(db)
}

/// `SendRates::take_sends` inside a writer unit: `haul_core::limit::take` on the
/// state kept for `key`, written back when it moved or fell short.
fn take_in(conn: &Connection, key: &str, limit: &Limit, wanted: u32, now_us: i64) -> Result<Grant, StoreError> {
    let tat = rate_state(conn, key)?;
    let grant = haul_core::limit::take(limit, tat, now_us, wanted);
    let held = (grant.granted < wanted).then_some(now_us);
    if Some(grant.tat_us) != tat || held.is_some() {
        exec(
            conn,
            "INSERT INTO send_rates (rate_key, tat_us, held_at_us) VALUES (?1, ?2, ?3)
             ON CONFLICT (rate_key) DO UPDATE SET tat_us = excluded.tat_us,
             held_at_us = coalesce(excluded.held_at_us, send_rates.held_at_us)",
            params![key, grant.tat_us, held],
        )
        .map_err(db)?;
    }
    Ok(grant)
}

#[async_trait]
impl SendRates for SqliteStore {
    async fn take_sends(&self, key: &str, limit: &Limit, wanted: u32, now: Timestamp) -> Result<Grant, StoreError> {
        let (key, limit, now) = (key.to_owned(), *limit, to_us(now));
        self.writer.run(move |conn: &Connection| take_in(conn, &key, &limit, wanted, now)).await
    }

    async fn claim_taking(
        &self,
        max: usize,
        now: Timestamp,
        lease: Duration,
        after: Option<&ClaimCursor>,
        takes: &[ClaimTake],
    ) -> Result<ClaimedTaking, StoreError> {
        check_takes(takes)?;
        let token = self.tokens.next();
        let (now_us, lease_until, limit) = (to_us(now), to_ms(add(now, lease)), max as i64);
        let (now, after) = (to_ms(now), after.map(|a| (to_ms(a.due_at), a.id.clone())));
        let claim = ClaimArgs { token: token.clone(), lease_until, now, limit, after };
        let takes = takes.to_vec();
        self.writer
            .run(move |conn: &Connection| {
                let rows = claim_in(conn, claim)?;
                let mut grants = Vec::with_capacity(takes.len());
                for take in &takes {
                    let counted = counted(&rows, take);
                    grants.push(match counted {
                        0 => None,
                        n => Some((n, take_in(conn, &take.key, &take.limit, n, now_us)?)),
                    });
                }
                Ok(ClaimedTaking { claims: claims(rows, &token), grants })
            })
            .await
    }

    async fn queue_sends(&self, key: &str, from_us: i64, spacing_us: i64, n: u32) -> Result<i64, StoreError> {
        let key = key.to_owned();
        self.writer
            .run(move |conn: &Connection| {
                let tail = rate_state(conn, &key)?;
                let (first, tail) = haul_core::limit::queued(tail, from_us, spacing_us, n);
                exec(
                    conn,
                    "INSERT INTO send_rates (rate_key, tat_us) VALUES (?1, ?2)
                     ON CONFLICT (rate_key) DO UPDATE SET tat_us = excluded.tat_us",
                    params![key, tail],
                )
                .map_err(db)?;
                Ok(first)
            })
            .await
    }

    async fn requeue_held(
        &self,
        rate_key: &str,
        action_types: &[ActionType],
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let (key, queues, now_us) = (rate_key.to_owned(), format!("{rate_key}|"), to_us(now));
        let pause_key = haul_core::limit::pause_key(rate_key);
        let types = serde_json::Value::from(action_types.iter().map(|t| t.as_str()).collect::<Vec<_>>()).to_string();
        let now = to_ms(now);
        self.writer
            .run(move |conn: &Connection| {
                exec(conn, "DELETE FROM send_rates WHERE substr(rate_key, 1, length(?1)) = ?1", params![queues])
                    .map_err(db)?;
                // Afresh, but not before a pause the service asked for ends.
                exec(
                    conn,
                    "UPDATE send_rates SET tat_us = min(tat_us,
                       max(?2, coalesce((SELECT p.tat_us FROM send_rates p WHERE p.rate_key = ?3), ?2)))
                     WHERE rate_key = ?1",
                    params![key, now_us, pause_key],
                )
                .map_err(db)?;
                let n = exec(
                    conn,
                    "UPDATE outbox SET due_at = ?1, updated_at = ?1
                     WHERE status = 'pending' AND due_at > ?1 AND attempts = 0
                       AND (lease_until IS NULL OR lease_until <= ?1)
                       AND action_type IN (SELECT value FROM json_each(?2))",
                    params![now, types],
                )
                .map_err(db)?;
                Ok(n as u64)
            })
            .await
    }

    async fn take_slots(
        &self,
        key: &str,
        cap: u32,
        sends: &[(String, String)],
        until: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<String>, StoreError> {
        let (key, sends, until, now) = (key.to_owned(), sends.to_vec(), to_us(until), to_us(now));
        self.writer
            .run(move |conn: &Connection| {
                exec(conn, "DELETE FROM send_slots WHERE rate_key = ?1 AND until_us <= ?2", params![key, now])
                    .map_err(db)?;
                let held: i64 = conn
                    .prepare_cached("SELECT count(*) FROM send_slots WHERE rate_key = ?1")
                    .and_then(|mut s| s.query_row([&key], |r| r.get(0)))
                    .map_err(db)?;
                let mut free = i64::from(cap) - held;
                let mut granted = Vec::with_capacity(sends.len());
                for (id, token) in &sends {
                    // A send holding a slot keeps it under its new claim; another
                    // takes one while any is free.
                    let kept = exec(
                        conn,
                        "UPDATE send_slots SET token = ?3, until_us = ?4 WHERE rate_key = ?1 AND outbox_id = ?2",
                        params![key, id, token, until],
                    )
                    .map_err(db)?;
                    if kept == 0 && free > 0 {
                        exec(
                            conn,
                            "INSERT INTO send_slots (rate_key, outbox_id, token, until_us) VALUES (?1, ?2, ?3, ?4)",
                            params![key, id, token, until],
                        )
                        .map_err(db)?;
                        free -= 1;
                    } else if kept == 0 {
                        continue;
                    }
                    granted.push(id.clone());
                }
                Ok(granted)
            })
            .await
    }

    async fn free_slots(&self, key: &str, sends: &[(String, String)]) -> Result<(), StoreError> {
        let (key, sends) = (key.to_owned(), sends.to_vec());
        self.writer
            .run(move |conn: &Connection| {
                for (id, token) in &sends {
                    exec(
                        conn,
                        "DELETE FROM send_slots WHERE rate_key = ?1 AND outbox_id = ?2 AND token = ?3",
                        params![key, id, token],
                    )
                    .map_err(db)?;
                }
                Ok(())
            })
            .await
    }

    async fn queue_tails(&self, keys: &[String]) -> Result<Vec<(String, i64)>, StoreError> {
        let keys = serde_json::Value::from(keys.to_vec()).to_string();
        self.query_rows(
            "SELECT rate_key, tat_us FROM send_rates WHERE rate_key IN (SELECT value FROM json_each(?1))",
            [keys],
            |r: &dyn Columns| Ok((r.string(0)?, r.i64(1)?)),
        )
        .await
    }

    async fn unqueue_send(&self, key: &str, slot_us: i64, spacing_us: i64) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.writer
            .run(move |conn: &Connection| {
                let n = exec(
                    conn,
                    "UPDATE send_rates SET tat_us = tat_us - ?3 WHERE rate_key = ?1 AND tat_us >= ?2 AND tat_us < ?2 + 1000",
                    params![key, slot_us, spacing_us],
                )
                .map_err(db)?;
                Ok(n == 1)
            })
            .await
    }

    async fn pause_sends(&self, key: &str, limit: &Limit, until: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        let (key, now, pause_key) = (key.to_owned(), to_us(now), haul_core::limit::pause_key(key));
        let tat = haul_core::limit::paused(limit, None, to_us(until));
        self.writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "INSERT INTO send_rates (rate_key, tat_us, held_at_us) VALUES (?1, ?2, ?3), (?4, ?2, NULL)
                     ON CONFLICT (rate_key) DO UPDATE SET tat_us = max(send_rates.tat_us, excluded.tat_us),
                     held_at_us = excluded.held_at_us",
                    params![key, tat, now, pause_key],
                )
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn saturated(&self, since: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError> {
        self.query_rows(
            "SELECT rate_key, held_at_us FROM send_rates WHERE held_at_us >= ?1 ORDER BY held_at_us DESC, rate_key",
            [to_us(since)],
            saturated_row,
        )
        .await
    }

    async fn change_rate(&self, change: &RateChange) -> Result<(RateChange, bool), StoreError> {
        let c = change.clone();
        let request_id = c.request_id.clone();
        let made = self
            .writer
            .run(move |conn: &Connection| {
                let (rate, burst) = (c.limit.map(|l| l.rate.to_string()), c.limit.map(|l| i64::from(l.burst)));
                let n = exec(
                    conn,
                    "INSERT INTO rate_changes (request_id, channel, rate, burst, actor, reason, changed_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (request_id) DO NOTHING",
                    params![c.request_id, c.channel, rate, burst, c.actor, c.reason, to_ms(c.changed_at)],
                )
                .map_err(db)?;
                Ok::<bool, StoreError>(n == 1)
            })
            .await?;
        let sql = concat!("SELECT ", columns!(rate_change), " FROM rate_changes WHERE request_id = ?1");
        let mut rows = self.query_rows(sql, [request_id], rate_change_row).await?;
        let kept = rows.pop().ok_or_else(|| StoreError::new("a rate change was recorded and then not found"))?;
        Ok((kept, made))
    }

    async fn current_rates(&self) -> Result<Vec<RateChange>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(rate_change),
                " FROM rate_changes r WHERE seq = (SELECT max(seq) FROM rate_changes l WHERE l.channel = r.channel)
                 ORDER BY channel"
            ),
            [],
            rate_change_row,
        )
        .await
    }

    async fn rate_changes(&self, limit: usize) -> Result<Vec<RateChange>, StoreError> {
        self.query_rows(
            concat!("SELECT ", columns!(rate_change), " FROM rate_changes ORDER BY seq DESC LIMIT CAST(?1 AS INTEGER)"),
            [limit as i64],
            rate_change_row,
        )
        .await
    }
}

#[async_trait]
impl LoadIndex for SqliteStore {
    async fn loads_by_phone(&self, phone: &str) -> Result<Vec<LoadId>, StoreError> {
        let phone = phone.to_owned();
        self.query_rows(
            "SELECT load_id FROM load_facts WHERE driver_phone = ?1 AND active = 1 ORDER BY load_id LIMIT 100",
            [phone],
            load_id_row,
        )
        .await
    }

    async fn clients_of(&self, load_ids: &[LoadId]) -> Result<Vec<(LoadId, String)>, StoreError> {
        let ids: Vec<&str> = load_ids.iter().take(MAX_CLIENTS_OF).map(LoadId::as_str).collect();
        let ids = serde_json::Value::from(ids).to_string();
        self.query_rows(
            "SELECT load_id, client FROM load_facts
             WHERE load_id IN (SELECT value FROM json_each(?1)) AND client IS NOT NULL",
            [ids],
            load_client_row,
        )
        .await
    }

    async fn record_consent(&self, consent: &SmsConsent) -> Result<(), StoreError> {
        let c = consent.clone();
        self.writer
            .run(move |conn: &Connection| {
                let load_id = c.load_id.as_ref().map(LoadId::as_str);
                exec(conn, CONSENT_SET, params![c.phone, c.opted_out, c.event_id, load_id, to_ms(c.changed_at)])
                    .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn opted_out_among(&self, phones: &[String]) -> Result<Vec<SmsConsent>, StoreError> {
        let phones = serde_json::Value::from(&phones[..phones.len().min(MAX_CONSENT_ASKED)]).to_string();
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(sms_consent),
                " FROM sms_consent WHERE phone IN (SELECT value FROM json_each(?1)) AND opted_out = 1"
            ),
            [phones],
            sms_consent_row,
        )
        .await
    }

    async fn record_sms_report(&self, report: &SmsReport) -> Result<bool, StoreError> {
        let r = report.clone();
        self.writer
            .run(move |conn: &Connection| {
                let load_id = r.load_id.as_ref().map(LoadId::as_str);
                // '' for a report that matched no row: apart from a row's own.
                let outbox_id = r.outbox_id.as_deref().unwrap_or_default();
                let n = exec(
                    conn,
                    "INSERT INTO sms_reports (message_sid, status, error_code, outbox_id, load_id, reason, reported_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (message_sid, status, outbox_id) DO NOTHING",
                    params![r.message_sid, r.status, r.error_code, outbox_id, load_id, r.reason, to_ms(r.reported_at)],
                )
                .map_err(db)?;
                Ok(n == 1)
            })
            .await
    }

    async fn sms_reports_for_load(&self, load_id: &LoadId, limit: usize) -> Result<Vec<SmsReport>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(sms_report),
                " FROM sms_reports WHERE load_id = ?1
                 ORDER BY reported_at DESC, message_sid DESC, status DESC LIMIT CAST(?2 AS INTEGER)"
            ),
            (load_id.to_string(), sql_limit(limit)),
            sms_report_row,
        )
        .await
    }

    async fn unmatched_sms_reports(&self, limit: usize) -> Result<Vec<SmsReport>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(sms_report),
                " FROM sms_reports WHERE load_id IS NULL
                 ORDER BY reported_at DESC, message_sid DESC, status DESC LIMIT CAST(?1 AS INTEGER)"
            ),
            [sql_limit(limit)],
            sms_report_row,
        )
        .await
    }

    async fn record_unmatched_sms(&self, sms: &UnmatchedSms) -> Result<bool, StoreError> {
        let sms = sms.clone();
        self.writer
            .run(move |conn: &Connection| {
                let n = exec(
                    conn,
                    "INSERT INTO unmatched_sms (message_sid, from_phone, to_phone, body, received_at, reason)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (message_sid) DO NOTHING",
                    params![sms.message_sid, sms.from, sms.to, sms.body, to_ms(sms.received_at), sms.reason],
                )
                .map_err(db)?;
                Ok(n == 1)
            })
            .await
    }

    async fn claim_message_sid(
        &self,
        message_sid: &str,
        route: &SmsRoute,
        now: Timestamp,
    ) -> Result<SidClaim, StoreError> {
        let (sid, load_id, now) = (message_sid.to_owned(), sms_route_load(route).map(str::to_owned), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let n = exec(
                    conn,
                    "INSERT INTO message_sids (message_sid, load_id, claimed_at) VALUES (?1, ?2, ?3)
                     ON CONFLICT (message_sid) DO NOTHING",
                    params![sid, load_id, now],
                )
                .map_err(db)?;
                if n == 1 {
                    return Ok(SidClaim::New);
                }
                let first: Option<String> = conn
                    .prepare_cached("SELECT load_id FROM message_sids WHERE message_sid = ?1")
                    .and_then(|mut s| s.query_row([&sid], |r| r.get(0)))
                    .map_err(db)?;
                Ok(SidClaim::Taken(sms_route(first)?))
            })
            .await
    }

    async fn assign_unmatched_sms(
        &self,
        message_sid: &str,
        load_id: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsAssignment, StoreError> {
        let (sid, load_id, event_id, now) = (message_sid.to_owned(), load_id.clone(), event_id.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "UPDATE unmatched_sms SET assigned_load = ?2, assigned_event = ?3, assigned_at = ?4
                     WHERE message_sid = ?1 AND assigned_load IS NULL AND dismissed_at IS NULL",
                    params![sid, load_id.as_str(), event_id, now],
                )
                .map_err(db)?;
                let found = sms_holder(conn, &sid, |r| sms_assignment(r, &load_id, &event_id))?;
                Ok(found.unwrap_or(SmsAssignment::NotFound))
            })
            .await
    }

    async fn move_assigned_sms(
        &self,
        message_sid: &str,
        to: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsMove, StoreError> {
        let (sid, to, event_id, now) = (message_sid.to_owned(), to.clone(), event_id.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let moved_before: Option<String> = conn
                    .prepare_cached("SELECT from_load FROM sms_moves WHERE message_sid = ?1 AND event_id = ?2")
                    .and_then(|mut st| st.query_row(params![sid, event_id], |r| r.get(0)).optional())
                    .map_err(db)?;
                let step = sms_holder(conn, &sid, |r| sms_move_step(r, moved_before.as_deref(), &to, &event_id))?
                    .unwrap_or(Ok(SmsMove::NotFound));
                let (from, sms) = match step {
                    Ok(answer) => return Ok(answer),
                    Err(moving) => moving,
                };
                exec(
                    conn,
                    "UPDATE unmatched_sms SET assigned_load = ?2, assigned_event = ?3, assigned_at = ?4
                     WHERE message_sid = ?1",
                    params![sid, to.as_str(), event_id, now],
                )
                .map_err(db)?;
                exec(
                    conn,
                    "INSERT INTO sms_moves (message_sid, event_id, from_load, to_load, moved_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![sid, event_id, from.as_str(), to.as_str(), now],
                )
                .map_err(db)?;
                Ok(SmsMove::Moved { from, sms })
            })
            .await
    }

    async fn unmatched_sms(&self, limit: usize) -> Result<Vec<UnmatchedSms>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(unmatched_sms),
                " FROM unmatched_sms ORDER BY received_at DESC, message_sid DESC LIMIT CAST(?1 AS INTEGER)"
            ),
            [limit as i64],
            unmatched_sms_row,
        )
        .await
    }
}

/// A position in epoch milliseconds and id; `default` when there is none.
fn position(cursor: Option<&RowCursor>, default: i64) -> (i64, String) {
    cursor.map_or((default, String::new()), |c| (to_ms(c.created_at), c.id.clone()))
}

/// The loads query over `(?1, ?2]`; the parameters are those of PostgreSQL's `LOADS_PAGE`.
const LOADS_PAGE: &str = concat!(
    "SELECT ",
    columns!(load_summary),
    " FROM loads l WHERE l.load_id > ?1 AND l.load_id <= ?2
       AND (?3 IS NULL OR l.stage = ?3)
       AND (NOT ?4 OR l.open_asks > 0)
       AND (NOT ?5 OR l.escalated_asks > 0)
       AND (?6 IS NULL OR l.updated_at < ?6)
       AND (?7 IS NULL OR l.updated_at >= ?7)
       AND (NOT ?8 OR EXISTS (SELECT 1 FROM outbox o WHERE o.load_id = l.load_id AND o.status = 'dead'))
       AND (?9 IS NULL OR EXISTS (SELECT 1 FROM outbox o
             WHERE o.load_id = l.load_id AND o.status = 'pending' AND o.created_at <= ?9))
       AND (?10 IS NULL OR EXISTS (SELECT 1 FROM timers t
             WHERE t.load_id = l.load_id AND t.status = 'scheduled' AND t.fire_at <= ?10))
     ORDER BY l.load_id LIMIT CAST(?11 AS INTEGER)"
);

#[async_trait]
impl OpsQueries for SqliteStore {
    async fn oldest_due_timer(&self, now: Timestamp) -> Result<Option<Timestamp>, StoreError> {
        let now = to_ms(now);
        self.read(move |conn: &Connection| {
            let v: Option<i64> = conn
                .prepare_cached("SELECT min(fire_at) FROM timers WHERE status = 'scheduled' AND fire_at <= ?1")
                .and_then(|mut s| s.query_row([now], |r| r.get(0)))
                .map_err(db)?;
            Ok(v.map(from_ms))
        })
        .await
    }

    async fn loads_page(
        &self,
        filter: &LoadFilter,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<LoadsPage, StoreError> {
        let after = after.map_or(String::new(), |a| a.to_string());
        let filter = filter.clone();
        self.read(move |conn: &Connection| {
            let (upto, scanned): (Option<String>, i64) = conn
                .prepare_cached(
                    "SELECT max(load_id), count(*) FROM
                       (SELECT load_id FROM loads WHERE load_id > ?1 ORDER BY load_id LIMIT CAST(?2 AS INTEGER))",
                )
                .and_then(|mut s| {
                    s.query_row(params![after, sql_limit(LOADS_SCANNED_PER_PAGE)], |r| Ok((r.get(0)?, r.get(1)?)))
                })
                .map_err(db)?;
            let Some(upto) = upto else { return Ok(LoadsPage { loads: vec![], next_after: None }) };
            let ms = |t: Option<Timestamp>| t.map(to_ms);
            let loads = rows(
                conn,
                LOADS_PAGE,
                params![
                    after,
                    upto,
                    filter.stage,
                    filter.open_asks,
                    filter.escalated,
                    ms(filter.active_before),
                    ms(filter.active_since),
                    filter.has_dead,
                    ms(filter.pending_created_by),
                    ms(filter.timer_due_by),
                    sql_limit(limit),
                ],
                load_summary_row,
            )?;
            let next_after = next_loads_cursor(&loads, limit, &upto, scanned as usize)?;
            Ok(LoadsPage { loads, next_after })
        })
        .await
    }

    async fn dead_rows_page(
        &self,
        types: &[ActionType],
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<DeadRow>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(dead_row),
                " FROM outbox WHERE status = 'dead' AND instr(?1, ',' || action_type || ',') > 0
                   AND dead_at <= ?2 AND (dead_at < ?2 OR id < ?3)
                   AND (?5 IS NULL OR COALESCE(inbox_state, 'open') = ?5)
                 ORDER BY dead_at DESC, id DESC LIMIT CAST(?4 AS INTEGER)"
            ),
            (types_param(types), at, id, sql_limit(limit), state_param(state)),
            dead_row,
        )
        .await
    }

    async fn overdue_timers_page(
        &self,
        due_by: Timestamp,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let (at, id) = position(after, i64::MIN);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(timer),
                " FROM timers WHERE status = 'scheduled' AND fire_at <= ?1 AND (fire_at, timer_id) > (?2, ?3)
                 ORDER BY fire_at, timer_id LIMIT CAST(?4 AS INTEGER)"
            ),
            (to_ms(due_by), at, id, sql_limit(limit)),
            timer_row,
        )
        .await
    }

    async fn unmatched_sms_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxSms>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(inbox_sms),
                " FROM unmatched_sms WHERE (received_at, message_sid) < (?1, ?2)
                   AND (?4 IS NULL OR ",
                sms_inbox_state!(),
                " = ?4)
                 ORDER BY received_at DESC, message_sid DESC LIMIT CAST(?3 AS INTEGER)"
            ),
            (at, id, sql_limit(limit), state_param(state)),
            inbox_sms_row,
        )
        .await
    }

    async fn opted_out_page(&self, before: Option<&RowCursor>, limit: usize) -> Result<Vec<SmsConsent>, StoreError> {
        let (at, phone) = position(before, i64::MAX);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(sms_consent),
                " FROM sms_consent WHERE opted_out = 1 AND (changed_at, phone) < (?1, ?2)
                 ORDER BY changed_at DESC, phone DESC LIMIT CAST(?3 AS INTEGER)"
            ),
            (at, phone, sql_limit(limit)),
            sms_consent_row,
        )
        .await
    }

    async fn ops_alerts_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxAlert>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(ops_alert),
                ", inbox_state, inbox_event, inbox_at FROM (SELECT a.*, ",
                alert_inbox!(),
                " FROM ops_alerts a LEFT JOIN outbox o ON o.id = a.outbox_id
                   WHERE (a.raised_at, a.outbox_id) < (?1, ?2))
                 WHERE (?4 IS NULL OR COALESCE(inbox_state, 'open') = ?4)
                 ORDER BY raised_at DESC, outbox_id DESC LIMIT CAST(?3 AS INTEGER)"
            ),
            (at, id, sql_limit(limit), state_param(state)),
            inbox_alert_row,
        )
        .await
    }

    async fn inbox_counts(&self, bound: usize) -> Result<InboxCounts, StoreError> {
        let bound = sql_limit(bound);
        let dead = self
            .query_rows(
                "SELECT action_type, count(*) FROM (SELECT action_type FROM outbox
                   WHERE status = 'dead' AND inbox_state IS NULL ORDER BY dead_at DESC LIMIT CAST(?1 AS INTEGER))
                 GROUP BY action_type ORDER BY action_type",
                [bound],
                type_count_row,
            )
            .await?;
        let count = |sql: &'static str| async move {
            let n = self.query_rows(sql, [bound], |r| Ok(r.i64(0)?)).await?;
            Ok::<u64, StoreError>(n.first().copied().unwrap_or(0) as u64)
        };
        let alerts = count(
            "SELECT count(*) FROM (SELECT 1 FROM outbox o WHERE o.status = 'dead' AND o.inbox_state IS NULL
               AND EXISTS (SELECT 1 FROM ops_alerts a WHERE a.outbox_id = o.id) LIMIT CAST(?1 AS INTEGER))",
        )
        .await?;
        let unmatched = count(
            "SELECT count(*) FROM (SELECT 1 FROM unmatched_sms
               WHERE assigned_load IS NULL AND dismissed_at IS NULL LIMIT CAST(?1 AS INTEGER))",
        )
        .await?;
        Ok(InboxCounts { dead, alerts, unmatched })
    }

    async fn unmatched_sms_one(&self, message_sid: &str) -> Result<Option<InboxSms>, StoreError> {
        let rows = self
            .query_rows(
                concat!("SELECT ", columns!(inbox_sms), " FROM unmatched_sms WHERE message_sid = ?1"),
                [message_sid.to_owned()],
                inbox_sms_row,
            )
            .await?;
        Ok(rows.into_iter().next())
    }

    async fn dismiss_unmatched_sms(
        &self,
        message_sid: &str,
        by: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<SmsDismissal, StoreError> {
        let (sid, by, reason, now) = (message_sid.to_owned(), by.to_owned(), reason.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let n = exec(
                    conn,
                    "UPDATE unmatched_sms SET dismissed_by = ?2, dismissed_reason = ?3, dismissed_at = ?4
                     WHERE message_sid = ?1 AND assigned_load IS NULL AND dismissed_at IS NULL",
                    params![sid, by, reason, now],
                )
                .map_err(db)?;
                if n == 1 {
                    return Ok(SmsDismissal::Dismissed);
                }
                let mut stmt = conn
                    .prepare_cached(concat!(
                        "SELECT ",
                        columns!(inbox_sms),
                        " FROM unmatched_sms WHERE message_sid = ?1"
                    ))
                    .map_err(db)?;
                let mut found = stmt.query([&sid]).map_err(db)?;
                match found.next().map_err(db)? {
                    Some(row) => sms_dismissal(&inbox_sms_row(&SqliteRow(row))?),
                    None => Ok(SmsDismissal::NotFound),
                }
            })
            .await
    }

    async fn record_conflict(&self, load_id: &LoadId, now: Timestamp) -> Result<(), StoreError> {
        let (load_id, now) = (load_id.to_string(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "UPDATE loads SET conflicts = conflicts + 1, last_conflict_at = ?2 WHERE load_id = ?1",
                    params![load_id, now],
                )
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn conflict_loads(&self, limit: usize) -> Result<Vec<ConflictLoad>, StoreError> {
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(conflict_load),
                " FROM loads WHERE conflicts > 0 ORDER BY conflicts DESC, load_id LIMIT CAST(?1 AS INTEGER)"
            ),
            [sql_limit(limit)],
            conflict_load_row,
        )
        .await
    }
}

/// Retention batches: the oldest finished rows first, through the indexes of migration 5.
const PRUNE_OUTBOX: &str = "DELETE FROM outbox WHERE id IN (
       SELECT id FROM outbox WHERE status <> 'pending' AND outcome_published_at IS NOT NULL
       AND updated_at < ?1 AND outcome_published_at < ?1 ORDER BY updated_at LIMIT CAST(?2 AS INTEGER))";
const PRUNE_TIMERS: &str = "DELETE FROM timers WHERE timer_id IN (
       SELECT timer_id FROM timers WHERE status <> 'scheduled' AND COALESCE(fired_at, canceled_at) < ?1
       ORDER BY COALESCE(fired_at, canceled_at) LIMIT CAST(?2 AS INTEGER))";
const PRUNE_QUEUE: &str = "DELETE FROM queue WHERE id IN (
       SELECT id FROM queue WHERE acked_at IS NOT NULL AND acked_at < ?1 ORDER BY acked_at LIMIT CAST(?2 AS INTEGER))";

const PRUNE_OPERATOR_REQUESTS: &str = "DELETE FROM operator_requests WHERE (load_id, event_id) IN (
       SELECT load_id, event_id FROM operator_requests WHERE requested_at < ?1
       ORDER BY requested_at LIMIT CAST(?2 AS INTEGER))";
const PRUNE_SHADOW: &str = "DELETE FROM shadow_decisions WHERE (load_id, event_id, shadow) IN (
       SELECT load_id, event_id, shadow FROM shadow_decisions WHERE recorded_at < ?1
       ORDER BY recorded_at LIMIT CAST(?2 AS INTEGER))";

const PRUNE_SMS_REPORTS: &str = "DELETE FROM sms_reports WHERE (message_sid, status, outbox_id) IN (
       SELECT message_sid, status, outbox_id FROM sms_reports WHERE reported_at < ?1
       ORDER BY reported_at LIMIT CAST(?2 AS INTEGER))";

/// One load's shadow decisions after a cursor (`?1` load, `?2` seq, `?3` shadow, `?4` limit).
pub(crate) const SHADOW_PAGE: &str = concat!(
    "SELECT ",
    columns!(shadow),
    " FROM shadow_decisions WHERE load_id = CAST(?1 AS TEXT) AND (event_seq, shadow) > (?2, ?3)
     ORDER BY event_seq, shadow LIMIT CAST(?4 AS INTEGER)"
);

#[async_trait]
impl ShadowStore for SqliteStore {
    async fn record_shadow(&self, d: &ShadowDecision) -> Result<bool, StoreError> {
        let recorded = self
            .write_rows(
                concat!(
                    "INSERT INTO shadow_decisions (",
                    columns!(shadow),
                    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                     ON CONFLICT (load_id, event_id, shadow) DO NOTHING RETURNING load_id"
                ),
                shadow_params(d),
                |r| r.string(0).map_err(StoreError::from),
            )
            .await?;
        Ok(!recorded.is_empty())
    }

    async fn shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError> {
        let params = (load_id.to_string(), after.event_seq as i64, after.shadow.clone(), sql_limit(limit));
        self.query_rows(SHADOW_PAGE, params, shadow_row).await
    }
}

#[async_trait]
impl SpendLedger for SqliteStore {
    async fn client_day_spend(&self, client: &str, day: &str) -> Result<ClientDaySpend, StoreError> {
        let params = (client.to_owned(), day.to_owned());
        let rows = self
            .query_rows(
                concat!("SELECT ", columns!(llm_spend), " FROM llm_spend WHERE client = ?1 AND day = ?2"),
                params,
                llm_spend_row,
            )
            .await?;
        Ok(rows.into_iter().next().unwrap_or_else(|| ClientDaySpend::none(client, day)))
    }

    async fn spend_page(
        &self,
        from_day: &str,
        to_day: &str,
        client: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ClientDaySpend>, StoreError> {
        let (after_day, after_client) = ClientDaySpend::page_start(after);
        let params = (
            from_day.to_owned(),
            to_day.to_owned(),
            client.map(str::to_owned),
            after_day.to_owned(),
            after_client.to_owned(),
            sql_limit(limit),
        );
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(llm_spend),
                " FROM llm_spend WHERE day BETWEEN ?1 AND ?2 AND (?3 IS NULL OR client = ?3)
                   AND (day < ?4 OR (day = ?4 AND client > ?5))
                 ORDER BY day DESC, client LIMIT CAST(?6 AS INTEGER)"
            ),
            params,
            llm_spend_row,
        )
        .await
    }

    async fn prompt(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let rows = self
            .query_rows("SELECT text FROM prompts WHERE hash = ?1", (hash.to_owned(),), |r: &dyn Columns| {
                r.string(0).map_err(StoreError::from)
            })
            .await?;
        Ok(rows.into_iter().next())
    }
}

#[async_trait]
impl EdgeStore for SqliteStore {
    async fn console_secret(&self, candidate: &[u8; 32], now: Timestamp) -> Result<[u8; 32], StoreError> {
        let (candidate, now) = (console_secret_hex(candidate), to_ms(now));
        let kept: String = self
            .writer
            .run(move |conn: &Connection| {
                exec(
                    conn,
                    "INSERT INTO console_secret (id, secret, created_at) VALUES (1, ?1, ?2) ON CONFLICT (id) DO NOTHING",
                    params![candidate, now],
                )
                .map_err(db)?;
                conn.prepare_cached("SELECT secret FROM console_secret WHERE id = 1")
                    .and_then(|mut s| s.query_row([], |r| r.get(0)))
                    .map_err(db)
            })
            .await?;
        console_secret_from_hex(&kept)
    }

    async fn revoke_session(&self, nonce: &str, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        let (nonce, expires_at, now) = (nonce.to_owned(), to_ms(expires_at), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                exec(conn, "DELETE FROM console_revoked_sessions WHERE expires_at <= ?1", params![now]).map_err(db)?;
                exec(
                    conn,
                    "INSERT INTO console_revoked_sessions (nonce, expires_at) VALUES (?1, ?2)
                     ON CONFLICT (nonce) DO NOTHING",
                    params![nonce, expires_at],
                )
                .map_err(db)?;
                Ok(())
            })
            .await
    }

    async fn session_revoked(&self, nonce: &str) -> Result<bool, StoreError> {
        let nonce = nonce.to_owned();
        self.read(move |conn: &Connection| {
            conn.prepare_cached("SELECT count(*) > 0 FROM console_revoked_sessions WHERE nonce = ?1")
                .and_then(|mut s| s.query_row([&nonce], |r| r.get(0)))
                .map_err(db)
        })
        .await
    }

    async fn claim_operator_request(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<RequestClaim, StoreError> {
        let (load, event, body, now) = (load_id.to_string(), event_id.to_owned(), body.to_owned(), to_ms(now));
        self.writer
            .run(move |conn: &Connection| {
                let n = exec(
                    conn,
                    "INSERT INTO operator_requests (load_id, event_id, body, requested_at) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (load_id, event_id) DO NOTHING",
                    params![load, event, body, now],
                )
                .map_err(db)?;
                if n == 1 {
                    return Ok(RequestClaim::New);
                }
                let first: String = conn
                    .prepare_cached("SELECT body FROM operator_requests WHERE load_id = ?1 AND event_id = ?2")
                    .and_then(|mut s| s.query_row([&load, &event], |r| r.get(0)))
                    .map_err(db)?;
                Ok(if first == body { RequestClaim::Same } else { RequestClaim::Other })
            })
            .await
    }
}

#[async_trait]
impl Prune for SqliteStore {
    async fn prune(&self, older_than: Timestamp, batch_limit: usize) -> Result<PruneReport, StoreError> {
        let (cutoff, limit) = (to_ms(older_than), i64::try_from(batch_limit).unwrap_or(i64::MAX));
        self.writer
            .run(move |conn: &Connection| {
                let run = |sql: &str| -> Result<u64, StoreError> {
                    conn.prepare_cached(sql)
                        .and_then(|mut s| s.execute(params![cutoff, limit]))
                        .map_err(db)
                        .map(|n| n as u64)
                };
                Ok(PruneReport {
                    outbox: run(PRUNE_OUTBOX)?,
                    timers: run(PRUNE_TIMERS)?,
                    queue: run(PRUNE_QUEUE)? + run(PRUNE_OPERATOR_REQUESTS)?,
                    shadow: run(PRUNE_SHADOW)?,
                    reports: run(PRUNE_SMS_REPORTS)?,
                })
            })
            .await
    }
}
