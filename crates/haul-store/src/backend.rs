//! What the SQL backends share that is not SQL.
//!
//! haul-sqlite and haul-postgres run different statements over the same tables, and
//! everything around those statements is the same: durations as milliseconds, claim
//! tokens and receipts, which migrations are pending, the checks `append` makes on its
//! arguments, and reading a row back into the store's types. It lives here once so the
//! backends cannot drift apart (one reporting a corrupt row as an error while the other
//! panics on it, or a column list in one order and its decoder in another).
//!
//! No database crate here: a backend lets its driver's row be read through
//! [`Columns`], and the decoders ([`outbox_row`], [`timer_row`], ...) read the columns
//! [`columns!`](crate::columns) lists, in that order.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::dispatch::AlertKind;
use haul_core::ids::{LoadId, TimerId};
use haul_core::limit::Limit;
use haul_core::projection::Record;
use haul_core::time::{Timestamp, from_ms, to_ms};
use haul_core::trace::TraceParent;
use serde_json::Value;

use crate::{
    AlertState, AppendError, Claim, ClaimError, ClaimTake, DeadRow, DuplicateActionKeyError, DuplicateEntryError,
    LoadSummary, MAX_CLAIM_TAKES, NewEntry, NewOutboxRow, OpsAlertRecord, OutboxRow, OutboxStatus, QueueError,
    QueueMessage, RateChange, RecordedDelivery, ShadowDecision, SmsAssignment, SmsConsent, SmsMove, SmsReport,
    SmsRoute, StaleClaimError, StoreError, Timer, TimerStatus, UnmatchedSms, Unsettled, is_key_of_load,
    ops::ConflictLoad, ops::InboxAlert, ops::InboxMark, ops::InboxSms, ops::SmsDismissal,
};

// ---------------------------------------------------------------------------------
// Time as stored: timestamps are `to_ms`/`from_ms` (haul-core); durations are here.

/// A duration in whole milliseconds, saturating: a lease of `Duration::MAX` never ends
/// instead of overflowing.
pub fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `now + d` in epoch milliseconds, saturating: when a visibility or a lease ends.
pub fn deadline_ms(now: Timestamp, d: Duration) -> i64 {
    to_ms(now).saturating_add(duration_ms(d))
}

// ---------------------------------------------------------------------------------
// Rows that cannot be read back.

/// A stored row the store cannot turn back into its types. Nothing the store writes
/// is like that, so it means the database was changed behind the store's back; the
/// caller sees a `StoreError`, never a panic.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CorruptRowError {
    /// A value of the right type that is out of form (a load id, a status, JSON).
    #[error("corrupt row: {what} {value:?}")]
    Value { what: &'static str, value: String },
    /// A column the driver cannot read as the type asked for (another type, a NULL).
    #[error("corrupt row: column {index}: {reason}")]
    Column { index: usize, reason: String },
}

impl CorruptRowError {
    pub fn value(what: &'static str, value: &str) -> Self {
        CorruptRowError::Value { what, value: value.to_owned() }
    }

    /// For a backend's [`Columns`]: `reason` is the driver's error.
    pub fn column(index: usize, reason: impl Display) -> Self {
        CorruptRowError::Column { index, reason: reason.to_string() }
    }
}

impl From<CorruptRowError> for StoreError {
    fn from(e: CorruptRowError) -> Self {
        StoreError::new(e.to_string())
    }
}

// So a backend reads a column with `?` whatever the method's error type is.
impl From<CorruptRowError> for AppendError {
    fn from(e: CorruptRowError) -> Self {
        AppendError::Store(e.into())
    }
}

impl From<CorruptRowError> for ClaimError {
    fn from(e: CorruptRowError) -> Self {
        ClaimError::Store(e.into())
    }
}

impl From<CorruptRowError> for QueueError {
    fn from(e: CorruptRowError) -> Self {
        QueueError::Store(e.into())
    }
}

/// A load id read back from a row; one out of form is a corrupt row.
pub fn parse_load_id(s: &str) -> Result<LoadId, CorruptRowError> {
    LoadId::parse(s).map_err(|_| CorruptRowError::value("load_id", s))
}

/// The cursor after a page of loads: its last load when the page is full; else the
/// last load examined (`upto`) when a whole scan window was examined (more may match
/// after it); else `None`, the end.
pub fn next_loads_cursor(
    loads: &[LoadSummary],
    limit: usize,
    upto: &str,
    scanned: usize,
) -> Result<Option<LoadId>, StoreError> {
    if limit > 0 && loads.len() >= limit {
        return Ok(loads.last().map(|l| l.load_id.clone()));
    }
    if scanned >= crate::ops::LOADS_SCANNED_PER_PAGE {
        return Ok(Some(parse_load_id(upto)?));
    }
    Ok(None)
}

/// A stored JSON text. One that does not parse is kept as a string: the projection
/// counts such a record as unreadable instead of the whole read failing.
fn json_or_string(text: String) -> Value {
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

// ---------------------------------------------------------------------------------
// Reading rows.

/// One result row as a backend's driver reads it, by column index. Every method is an
/// error, not a panic, when the value is not of the type asked for.
pub trait Columns {
    fn string(&self, index: usize) -> Result<String, CorruptRowError>;
    fn opt_string(&self, index: usize) -> Result<Option<String>, CorruptRowError>;
    /// A `bigint` (PostgreSQL) or `INTEGER` (SQLite): timestamps, seqs, ids.
    fn i64(&self, index: usize) -> Result<i64, CorruptRowError>;
    fn opt_i64(&self, index: usize) -> Result<Option<i64>, CorruptRowError>;
    /// A counter, `integer` on PostgreSQL: attempts, receive counts.
    fn u32(&self, index: usize) -> Result<u32, CorruptRowError>;
}

/// The column lists the decoders below read, in their order, as string literals (so a
/// backend can build statements with `concat!`): `columns!(outbox)`, `columns!(timer)`,
/// `columns!(queue_message)`, `columns!(record)`, `columns!(delivery)`,
/// `columns!(unmatched_sms)`. A statement whose rows go to a decoder selects (or
/// returns) exactly its list.
#[macro_export]
macro_rules! columns {
    (outbox) => {
        "id, load_id, action_type, action, status, attempts, due_at, first_attempt_at, claim_token, \
         lease_until, last_failure, receipt, created_at, updated_at, trace"
    };
    (sms_report) => {
        "message_sid, status, error_code, NULLIF(outbox_id, ''), load_id, reason, reported_at"
    };
    (sms_consent) => {
        "phone, opted_out, event_id, load_id, changed_at"
    };
    (timer) => {
        "timer_id, load_id, fire_at, status, created_at, canceled_at, fired_at, trace"
    };
    (queue_message) => {
        "id, load_id, event_id, body, enqueued_at, receipt, receive_count, trace"
    };
    (record) => {
        "seq, entry_id, kind, payload, recorded_at, trace"
    };
    // What the read-only logs read (replay, export): no trace, which they do not show,
    // so they read a database a migration behind this build too.
    (record_read_only) => {
        "seq, entry_id, kind, payload, recorded_at, NULL AS trace"
    };
    (delivery) => {
        "id, channel, key, load_id, payload, created_at"
    };
    (unmatched_sms) => {
        "message_sid, from_phone, to_phone, body, received_at, reason"
    };
    (load_summary) => {
        "load_id, version, stage, open_asks, escalated_asks, created_at, updated_at"
    };
    (dead_row) => {
        "id, load_id, action_type, action, status, attempts, due_at, first_attempt_at, claim_token, \
         lease_until, last_failure, receipt, created_at, updated_at, trace, dead_at, outcome_published_at, \
         inbox_state, inbox_event, inbox_at"
    };
    (inbox_sms) => {
        "message_sid, from_phone, to_phone, body, received_at, reason, assigned_load, assigned_event, assigned_at, \
         dismissed_by, dismissed_reason, dismissed_at"
    };
    (unsettled) => {
        "id, load_id, action_type, action, status, attempts, due_at, first_attempt_at, claim_token, \
         lease_until, last_failure, receipt, created_at, updated_at, trace, settle_attempts, settle_due_at, settle_failure"
    };
    (ops_alert) => {
        "outbox_id, load_id, kind, action_type, failure, state, sends, last_error, raised_at, updated_at"
    };
    (conflict_load) => {
        "load_id, conflicts, last_conflict_at"
    };
    (llm_spend) => {
        "client, day, input_tokens, output_tokens, cost_micro_usd, calls, capped_at"
    };
    (rate_change) => {
        "request_id, channel, rate, burst, actor, reason, changed_at"
    };
    (shadow) => {
        "load_id, event_id, shadow, event_seq, event, rule, primary_decision, shadow_decision, agreement, error, \
         decided_at, recorded_at"
    };
}

/// A stored trace context. One that does not read is no context (a trace is a
/// diagnosis, never a reason to refuse a row): only a writer that bypassed
/// `TraceParent`'s own text could have stored it.
fn trace_column(r: &dyn Columns, i: usize) -> Result<Option<TraceParent>, StoreError> {
    Ok(r.opt_string(i)?.as_deref().and_then(TraceParent::parse))
}

/// A row of `columns!(outbox)`.
pub fn outbox_row(r: &dyn Columns) -> Result<OutboxRow, StoreError> {
    let (load_id, action_type, action, status) = (r.string(1)?, r.string(2)?, r.string(3)?, r.string(4)?);
    Ok(OutboxRow {
        id: r.string(0)?,
        load_id: parse_load_id(&load_id)?,
        action_type: ActionType::parse(&action_type)
            .ok_or_else(|| CorruptRowError::value("action_type", &action_type))?,
        action: serde_json::from_str(&action).map_err(|_| CorruptRowError::value("action", &action))?,
        status: OutboxStatus::parse(&status).ok_or_else(|| CorruptRowError::value("status", &status))?,
        attempts: r.u32(5)?,
        due_at: from_ms(r.i64(6)?),
        first_attempt_at: r.opt_i64(7)?.map(from_ms),
        claim_token: r.opt_string(8)?,
        lease_until: r.opt_i64(9)?.map(from_ms),
        last_failure: r.opt_string(10)?,
        receipt: r.opt_string(11)?,
        created_at: from_ms(r.i64(12)?),
        updated_at: from_ms(r.i64(13)?),
        trace: trace_column(r, 14)?,
    })
}

/// A row of `columns!(timer)`.
pub fn timer_row(r: &dyn Columns) -> Result<Timer, StoreError> {
    let (timer_id, load_id, status) = (r.string(0)?, r.string(1)?, r.string(3)?);
    Ok(Timer {
        timer_id: TimerId::parse(&timer_id).map_err(|_| CorruptRowError::value("timer_id", &timer_id))?,
        load_id: parse_load_id(&load_id)?,
        fire_at: from_ms(r.i64(2)?),
        status: TimerStatus::parse(&status).ok_or_else(|| CorruptRowError::value("timer status", &status))?,
        created_at: from_ms(r.i64(4)?),
        canceled_at: r.opt_i64(5)?.map(from_ms),
        fired_at: r.opt_i64(6)?.map(from_ms),
        trace: trace_column(r, 7)?,
    })
}

/// A row of `columns!(queue_message)` as received (its receipt set), then the load's
/// log version (NULL without a log): the message id, which orders messages, and the
/// message.
pub fn queue_message_row(r: &dyn Columns) -> Result<(i64, QueueMessage), StoreError> {
    let load_id = r.string(1)?;
    let message = QueueMessage {
        load_id: parse_load_id(&load_id)?,
        event_id: r.string(2)?,
        body: r.string(3)?,
        enqueued_at: from_ms(r.i64(4)?),
        receipt: r.string(5)?,
        receive_count: r.u32(6)?,
        trace: trace_column(r, 7)?,
        log_version: r.opt_i64(8)?.map(|v| v as u64),
    };
    Ok((r.i64(0)?, message))
}

/// A row of `columns!(record)`.
/// Decoded here, once: what the store hands up is typed (`haul_core::log`).
pub fn record_row(r: &dyn Columns) -> Result<Record, StoreError> {
    let kind = r.string(2)?;
    let record =
        Record::decode(r.i64(0)? as u64, r.string(1)?, &kind, json_or_string(r.string(3)?), from_ms(r.i64(4)?));
    Ok(record.with_trace(trace_column(r, 5)?))
}

/// A row of `columns!(delivery)`.
pub fn delivery_row(r: &dyn Columns) -> Result<RecordedDelivery, StoreError> {
    let load_id = r.string(3)?;
    Ok(RecordedDelivery {
        channel: r.string(1)?,
        key: r.string(2)?,
        load_id: parse_load_id(&load_id)?,
        payload: json_or_string(r.string(4)?),
        receipt: delivery_receipt(r.i64(0)?),
        created_at: from_ms(r.i64(5)?),
    })
}

/// A row of `columns!(unmatched_sms)`.
/// A row of `columns!(unsettled)`: `columns!(outbox)` and the sweep's three.
pub fn unsettled_row(r: &dyn Columns) -> Result<Unsettled, StoreError> {
    Ok(Unsettled {
        row: outbox_row(r)?,
        settle_attempts: r.u32(15)?,
        settle_due_at: r.opt_i64(16)?.map(from_ms),
        settle_failure: r.opt_string(17)?,
    })
}

/// A row of `columns!(shadow)`.
pub fn shadow_row(r: &dyn Columns) -> Result<ShadowDecision, StoreError> {
    let (load_id, agreement) = (r.string(0)?, r.string(8)?);
    let json = |what: &'static str, text: String| {
        serde_json::from_str::<Value>(&text).map_err(|_| CorruptRowError::value(what, &text))
    };
    Ok(ShadowDecision {
        load_id: parse_load_id(&load_id)?,
        event_id: r.string(1)?,
        shadow: r.string(2)?,
        event_seq: r.i64(3)? as u64,
        event: json("event", r.string(4)?)?,
        rule: r.string(5)?,
        primary: json("primary_decision", r.string(6)?)?,
        decision: r.opt_string(7)?.map(|t| json("shadow_decision", t)).transpose()?,
        agreement: haul_core::replay::Agreement::parse(&agreement)
            .ok_or_else(|| CorruptRowError::value("agreement", &agreement))?,
        error: r.opt_string(9)?,
        decided_at: from_ms(r.i64(10)?),
        recorded_at: from_ms(r.i64(11)?),
    })
}

/// The columns of `columns!(shadow)` as written: JSON as text, times as milliseconds.
#[allow(clippy::type_complexity)]
pub fn shadow_params(
    d: &ShadowDecision,
) -> (String, String, String, i64, String, String, String, Option<String>, &'static str, Option<String>, i64, i64) {
    (
        d.load_id.to_string(),
        d.event_id.clone(),
        d.shadow.clone(),
        d.event_seq as i64,
        d.event.to_string(),
        d.rule.clone(),
        d.primary.to_string(),
        d.decision.as_ref().map(Value::to_string),
        d.agreement.as_str(),
        d.error.clone(),
        to_ms(d.decided_at),
        to_ms(d.recorded_at),
    )
}

/// A row of `columns!(llm_spend)`.
pub fn llm_spend_row(r: &dyn Columns) -> Result<crate::ClientDaySpend, StoreError> {
    let count = |i: usize, name: &'static str| -> Result<u64, StoreError> {
        let v = r.i64(i)?;
        u64::try_from(v).map_err(|_| CorruptRowError::value(name, &v.to_string()).into())
    };
    Ok(crate::ClientDaySpend {
        client: r.string(0)?,
        day: r.string(1)?,
        spend: haul_core::spend::Spend {
            input_tokens: count(2, "input_tokens")?,
            output_tokens: count(3, "output_tokens")?,
            cost_micro_usd: count(4, "cost_micro_usd")?,
            calls: count(5, "calls")?,
        },
        capped_at: r.opt_i64(6)?.map(from_ms),
    })
}

/// A row of `columns!(ops_alert)`.
pub fn ops_alert_row(r: &dyn Columns) -> Result<OpsAlertRecord, StoreError> {
    let (load_id, kind, action_type, state) = (r.string(1)?, r.string(2)?, r.string(3)?, r.string(5)?);
    Ok(OpsAlertRecord {
        outbox_id: r.string(0)?,
        load_id: parse_load_id(&load_id)?,
        kind: AlertKind::parse(&kind).ok_or_else(|| CorruptRowError::value("kind", &kind))?,
        action_type: ActionType::parse(&action_type)
            .ok_or_else(|| CorruptRowError::value("action_type", &action_type))?,
        failure: r.string(4)?,
        state: AlertState::parse(&state).ok_or_else(|| CorruptRowError::value("state", &state))?,
        sends: r.u32(6)?,
        last_error: r.opt_string(7)?,
        raised_at: from_ms(r.i64(8)?),
        updated_at: from_ms(r.i64(9)?),
    })
}

pub fn unmatched_sms_row(r: &dyn Columns) -> Result<UnmatchedSms, StoreError> {
    Ok(UnmatchedSms {
        message_sid: r.string(0)?,
        from: r.string(1)?,
        to: r.string(2)?,
        body: r.string(3)?,
        received_at: from_ms(r.i64(4)?),
        reason: r.string(5)?,
    })
}

/// A row of `columns!(sms_consent)`.
pub fn sms_consent_row(r: &dyn Columns) -> Result<SmsConsent, StoreError> {
    Ok(SmsConsent {
        phone: r.string(0)?,
        opted_out: r.u32(1)? != 0,
        event_id: r.string(2)?,
        load_id: r.opt_string(3)?.map(|l| parse_load_id(&l)).transpose()?,
        changed_at: from_ms(r.i64(4)?),
    })
}

/// A row of `columns!(sms_report)`.
pub fn sms_report_row(r: &dyn Columns) -> Result<SmsReport, StoreError> {
    Ok(SmsReport {
        message_sid: r.string(0)?,
        status: r.string(1)?,
        error_code: r.opt_string(2)?,
        outbox_id: r.opt_string(3)?,
        load_id: r.opt_string(4)?.map(|l| parse_load_id(&l)).transpose()?,
        reason: r.opt_string(5)?,
        reported_at: from_ms(r.i64(6)?),
    })
}

/// A row of `columns!(load_summary)`.
pub fn load_summary_row(r: &dyn Columns) -> Result<LoadSummary, StoreError> {
    let load_id = r.string(0)?;
    Ok(LoadSummary {
        load_id: parse_load_id(&load_id)?,
        version: r.i64(1)? as u64,
        stage: r.opt_string(2)?,
        open_asks: r.u32(3)?,
        escalated_asks: r.u32(4)?,
        created_at: from_ms(r.i64(5)?),
        last_activity_at: from_ms(r.i64(6)?),
    })
}

/// A row of `columns!(conflict_load)`.
pub fn conflict_load_row(r: &dyn Columns) -> Result<ConflictLoad, StoreError> {
    Ok(ConflictLoad {
        load_id: parse_load_id(&r.string(0)?)?,
        conflicts: r.i64(1)? as u64,
        last_conflict_at: from_ms(r.opt_i64(2)?.unwrap_or(0)),
    })
}

/// A row of `columns!(dead_row)`: `columns!(outbox)` and `dead_at`.
pub fn dead_row(r: &dyn Columns) -> Result<DeadRow, StoreError> {
    let row = outbox_row(r)?;
    // A dead row always has its time of death; one without reads as its last update.
    let dead_at = r.opt_i64(15)?.map_or(row.updated_at, from_ms);
    Ok(DeadRow { row, dead_at, outcome_published_at: r.opt_i64(16)?.map(from_ms), inbox: inbox_mark(r, 17)? })
}

/// The inbox state, its `by` and `at`, from three columns from `first`.
pub fn inbox_mark(r: &dyn Columns, first: usize) -> Result<InboxMark, StoreError> {
    let state = r.opt_string(first)?;
    let mark = InboxMark::stored(state.as_deref(), r.opt_string(first + 1)?, r.opt_i64(first + 2)?);
    Ok(mark.ok_or_else(|| CorruptRowError::value("inbox_state", state.as_deref().unwrap_or_default()))?)
}

/// A row of `columns!(ops_alert)`, then the inbox state, event and time of its dead
/// row (NULLs when the row is gone or open).
pub fn inbox_alert_row(r: &dyn Columns) -> Result<InboxAlert, StoreError> {
    Ok(InboxAlert { alert: ops_alert_row(r)?, inbox: inbox_mark(r, 10)? })
}

/// A row of `columns!(inbox_sms)`: assigned is handled, dismissed is dismissed.
pub fn inbox_sms_row(r: &dyn Columns) -> Result<InboxSms, StoreError> {
    let sms = unmatched_sms_row(r)?;
    let assigned_load = r.opt_string(6)?.map(|l| parse_load_id(&l)).transpose()?;
    let (dismissed_by, dismissed_reason, dismissed_at) = (r.opt_string(9)?, r.opt_string(10)?, r.opt_i64(11)?);
    let inbox = match (&assigned_load, dismissed_at) {
        (Some(_), _) => {
            InboxMark { state: haul_core::InboxState::Handled, by: r.opt_string(7)?, at: r.opt_i64(8)?.map(from_ms) }
        }
        (None, Some(at)) => {
            InboxMark { state: haul_core::InboxState::Dismissed, by: dismissed_by, at: Some(from_ms(at)) }
        }
        (None, None) => InboxMark::OPEN,
    };
    Ok(InboxSms { sms, inbox, assigned_load, dismissed_reason })
}

/// The inbox state of an unmatched SMS as SQL (for the state filter) over the columns
/// of `columns!(inbox_sms)`: the same reading as [`inbox_sms_row`].
#[macro_export]
macro_rules! sms_inbox_state {
    () => {
        "(CASE WHEN assigned_load IS NOT NULL THEN 'handled' WHEN dismissed_at IS NOT NULL THEN 'dismissed' \
         ELSE 'open' END)"
    };
}

/// An OpsAlert's inbox columns (`inbox_state, inbox_event, inbox_at`) over `ops_alerts
/// a LEFT JOIN outbox o`: its dead row's; a row retention removed (`haul prune`) reads
/// as dismissed by `haul prune`, so an alert never stays open with nothing to act on.
#[macro_export]
macro_rules! alert_inbox {
    () => {
        "CASE WHEN o.id IS NULL THEN 'dismissed' ELSE o.inbox_state END AS inbox_state, \
         CASE WHEN o.id IS NULL THEN 'haul prune' ELSE o.inbox_event END AS inbox_event, o.inbox_at AS inbox_at"
    };
}

/// What a dismissal that changed nothing found, from the SMS's row as it is.
pub fn sms_dismissal(row: &InboxSms) -> Result<SmsDismissal, StoreError> {
    match (&row.assigned_load, &row.inbox) {
        (Some(load_id), mark) => {
            Ok(SmsDismissal::Assigned { load_id: load_id.clone(), event_id: mark.by.clone().unwrap_or_default() })
        }
        (None, InboxMark { by: Some(by), at: Some(at), .. }) => Ok(SmsDismissal::Already { by: by.clone(), at: *at }),
        _ => Err(CorruptRowError::value("dismissed_at", "NULL after its dismissal").into()),
    }
}

/// An action type and a count.
pub fn type_count_row(r: &dyn Columns) -> Result<(ActionType, u64), StoreError> {
    let t = r.string(0)?;
    let action_type = ActionType::parse(&t).ok_or_else(|| CorruptRowError::value("action_type", &t))?;
    Ok((action_type, r.i64(1)?.max(0) as u64))
}

/// A row of `columns!(unmatched_sms), assigned_load, assigned_event, dismissed_by`, read back after
/// [`LoadIndex::assign_unmatched_sms`](crate::LoadIndex::assign_unmatched_sms) tried to
/// take it for `load_id` and `event_id`: whose it is now.
pub fn sms_assignment(r: &dyn Columns, load_id: &LoadId, event_id: &str) -> Result<SmsAssignment, StoreError> {
    let sms = unmatched_sms_row(r)?;
    match (r.opt_string(6)?, r.opt_string(7)?) {
        (Some(l), Some(e)) if l == load_id.as_str() && e == event_id => Ok(SmsAssignment::Assigned(sms)),
        (Some(l), Some(e)) => Ok(SmsAssignment::Taken { load_id: parse_load_id(&l)?, event_id: e }),
        (None, None) => match r.opt_string(8)? {
            Some(by) => Ok(SmsAssignment::Dismissed { by }),
            None => Err(CorruptRowError::value("assigned_load", "NULL after its assignment").into()),
        },
        _ => Err(CorruptRowError::value("assigned_load", "set without its event").into()),
    }
}

/// A row of `rate_key, held_at_us` of `send_rates`: a saturated channel and when.
/// A row of `columns!(rate_change)`.
pub fn rate_change_row(r: &dyn Columns) -> Result<RateChange, StoreError> {
    let limit = match r.opt_string(2)? {
        None => None,
        Some(rate) => {
            let parsed = haul_core::limit::Rate::parse(&rate).map_err(|_| CorruptRowError::value("rate", &rate))?;
            let burst = r.opt_i64(3)?.unwrap_or(1);
            let limit = u32::try_from(burst).ok().and_then(|b| Limit::new(parsed, b).ok());
            Some(limit.ok_or_else(|| CorruptRowError::value("burst", &burst.to_string()))?)
        }
    };
    Ok(RateChange {
        request_id: r.string(0)?,
        channel: r.string(1)?,
        limit,
        actor: r.string(4)?,
        reason: r.string(5)?,
        changed_at: from_ms(r.i64(6)?),
    })
}

pub fn saturated_row(r: &dyn Columns) -> Result<(String, Timestamp), StoreError> {
    Ok((r.string(0)?, haul_core::time::from_us(r.i64(1)?)))
}

/// What a move of an assigned SMS to `to` by `event_id` does, from the SMS's row
/// (`columns!(unmatched_sms), assigned_load, assigned_event, dismissed_by`, read under
/// the write's lock) and the load this event moved it from before, if it did: answer
/// now, or move it (the SMS) from the load that holds it. One rule for every backend.
pub fn sms_move_step(
    r: &dyn Columns,
    moved_before: Option<&str>,
    to: &LoadId,
    event_id: &str,
) -> Result<Result<SmsMove, (LoadId, UnmatchedSms)>, StoreError> {
    let sms = unmatched_sms_row(r)?;
    let holder = match (r.opt_string(6)?, r.opt_string(7)?) {
        (Some(l), Some(e)) => Some((parse_load_id(&l)?, e)),
        (None, None) => None,
        _ => return Err(CorruptRowError::value("assigned_load", "set without its event").into()),
    };
    if let Some(from) = moved_before {
        return Ok(Ok(match holder {
            Some((l, e)) if l == *to && e == event_id => SmsMove::Moved { from: parse_load_id(from)?, sms },
            Some((load_id, event_id)) => SmsMove::Taken { load_id, event_id },
            None => return Err(CorruptRowError::value("assigned_load", "NULL after a move").into()),
        }));
    }
    Ok(match holder {
        Some((l, event_id)) if l == *to => Ok(SmsMove::Held { event_id }),
        Some((from, _)) => Err((from, sms)),
        None => Ok(match r.opt_string(8)? {
            Some(by) => SmsMove::Dismissed { by },
            None => SmsMove::Unassigned,
        }),
    })
}

/// The route a `message_sids` row names by its `load_id` (NULL: unmatched).
pub fn sms_route(load_id: Option<String>) -> Result<SmsRoute, CorruptRowError> {
    match load_id {
        Some(l) => Ok(SmsRoute::Load(parse_load_id(&l)?)),
        None => Ok(SmsRoute::Unmatched),
    }
}

/// The `load_id` a `message_sids` row keeps for `route`.
pub fn sms_route_load(route: &SmsRoute) -> Option<&str> {
    match route {
        SmsRoute::Load(l) => Some(l.as_str()),
        SmsRoute::Unmatched => None,
    }
}

/// A row whose first column is a load id.
pub fn load_id_row(r: &dyn Columns) -> Result<LoadId, StoreError> {
    Ok(parse_load_id(&r.string(0)?)?)
}

/// A `(load_id, client)` row.
pub fn load_client_row(r: &dyn Columns) -> Result<(LoadId, String), StoreError> {
    Ok((parse_load_id(&r.string(0)?)?, r.string(1)?))
}

/// The receipt of a recorded delivery: its row id.
pub fn delivery_receipt(id: i64) -> String {
    format!("rec:{id}")
}

// ---------------------------------------------------------------------------------
// Tokens and receipts.

/// Claim tokens, queue receipts' tokens and lease tokens: 128 random bits as hex. The
/// generator takes a seed so evals and the simulator get the same tokens every run.
#[derive(Clone, Debug)]
pub struct Tokens {
    rng: Arc<Mutex<fastrand::Rng>>,
}

impl Tokens {
    /// `None` draws a seed from the OS.
    pub fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => fastrand::Rng::with_seed(s),
            None => fastrand::Rng::new(),
        };
        Tokens { rng: Arc::new(Mutex::new(rng)) }
    }

    /// A fresh token.
    pub fn next(&self) -> String {
        // A panic elsewhere while holding the lock leaves the generator as good as before.
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        format!("{:016x}{:016x}", rng.u64(..), rng.u64(..))
    }
}

/// A queue receipt, `{message id}.{token}`: the id finds the row, the token proves it
/// is the latest receive's.
pub fn receipt(message_id: i64, token: &str) -> String {
    format!("{message_id}.{token}")
}

/// The message id of a receipt; `None` when it is not one of this store's.
pub fn parse_receipt(receipt: &str) -> Option<i64> {
    receipt.split_once('.').and_then(|(id, _)| id.parse().ok())
}

// ---------------------------------------------------------------------------------
// Claims.

/// The rows one `Outbox::pending` call claimed with `token`, in the order the contract
/// hands them out (due first, then by id): `RETURNING` gives rows in no order.
pub fn claims(mut rows: Vec<OutboxRow>, token: &str) -> Vec<Claim> {
    rows.sort_by(|a, b| (a.due_at, &a.id).cmp(&(b.due_at, &b.id)));
    rows.into_iter().map(|row| Claim { row, token: token.to_owned() }).collect()
}

/// The outbox ids of `sends` that are in `granted`, in `sends`' order
/// (`SendRates::take_slots`' answer, whatever order the store found them in).
pub fn in_order_of(sends: &[(String, String)], granted: Vec<String>) -> Vec<String> {
    let granted: std::collections::HashSet<String> = granted.into_iter().collect();
    sends.iter().filter(|(id, _)| granted.contains(id)).map(|(id, _)| id.clone()).collect()
}

/// The rows of `rows` a claim takes sends for under `take`: of its action types and
/// claimed as made (`haul_core::dispatch::as_made`).
pub fn counted(rows: &[OutboxRow], take: &ClaimTake) -> u32 {
    let n = rows
        .iter()
        .filter(|r| take.action_types.contains(&r.action_type) && haul_core::dispatch::as_made(r.created_at, r.due_at))
        .count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `SendRates::claim_taking`'s bounds: at most `MAX_CLAIM_TAKES` takes, each key once
/// (one claim cannot take twice from one rate in one statement).
pub fn check_takes(takes: &[ClaimTake]) -> Result<(), StoreError> {
    if takes.len() > MAX_CLAIM_TAKES {
        return Err(crate::too_many("takes", takes.len(), MAX_CLAIM_TAKES));
    }
    let keys: BTreeSet<&str> = takes.iter().map(|t| t.key.as_str()).collect();
    if keys.len() < takes.len() {
        return Err(StoreError::new("a claim takes from one send rate once; a key was given twice"));
    }
    Ok(())
}

/// `check_claim`'s answer once the store found the row's lease for the token
/// (`lease_until_ms`): the claim stands while the lease is live at `now_ms`.
pub fn check_lease(id: &str, lease_until_ms: Option<i64>, now_ms: i64) -> Result<(), StaleClaimError> {
    match lease_until_ms {
        Some(until) if until > now_ms => Ok(()),
        _ => Err(StaleClaimError { outbox_id: id.to_owned() }),
    }
}

// ---------------------------------------------------------------------------------
// Migrations.

/// One schema migration: the version it takes the schema to and its SQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    pub version: i64,
    pub sql: &'static str,
    /// The oldest schema version a haul may write and still run on a database with this
    /// migration applied: its own version, unless declared older
    /// ([`Migration::readable_by`]) because older builds do not mind it (new tables or
    /// columns they never touch).
    pub readable_by: i64,
}

impl Migration {
    pub const fn new(version: i64, sql: &'static str) -> Self {
        Migration { version, sql, readable_by: version }
    }

    /// Declares that a haul writing schema `version` (older than this migration's) can
    /// still run on a database with this migration applied.
    pub const fn readable_by(self, version: i64) -> Self {
        Migration { readable_by: version, ..self }
    }
}

/// What a database with `applied` migrations (of those `all` knows) asks of the haul
/// that runs on it, with what it asked before (`kept`, set by any build): the largest
/// `readable_by` of them all.
pub fn readable_by(all: &[Migration], applied: &[i64], kept: Option<i64>) -> i64 {
    all.iter().filter(|m| applied.contains(&m.version)).map(|m| m.readable_by).chain(kept).max().unwrap_or(0)
}

/// Whether a haul that writes schema `latest` may run on a database at `version` whose
/// migrations ask for a haul writing `readable_by` or later. A newer database than
/// this haul knows is refused, naming both versions, unless every migration past
/// `latest` was declared readable by it; then `Ok(true)` (run, and say so).
pub fn check_schema(latest: i64, version: i64, readable_by: i64) -> Result<bool, StoreError> {
    if version <= latest {
        return Ok(false);
    }
    if readable_by <= latest {
        return Ok(true);
    }
    Err(StoreError::new(format!(
        "the database's schema is at version {version}, newer than this haul, which writes version {latest}; \
         it needs a haul that writes version {readable_by} or later: upgrade haul (haul --version shows the \
         schema a build writes)"
    )))
}

/// The newest version of a migration list (in version order, as every list is).
pub const fn latest_version(all: &[Migration]) -> i64 {
    all[all.len() - 1].version
}

/// The migrations of `all` up to `target` (inclusive) whose versions are not in
/// `applied`, in list order: what a backend runs, inside the transaction it read
/// `applied` in.
pub fn pending_migrations<'a>(all: &'a [Migration], applied: &[i64], target: i64) -> Vec<&'a Migration> {
    all.iter().filter(|m| m.version <= target && !applied.contains(&m.version)).collect()
}

#[cfg(test)]
mod schema_tests {
    use super::*;

    #[test]
    fn a_newer_schema_runs_only_where_its_migrations_allow() {
        assert!(!check_schema(12, 11, 11).unwrap(), "older: migrate");
        assert!(!check_schema(12, 12, 11).unwrap(), "the same");
        assert!(check_schema(12, 13, 12).unwrap(), "newer, declared readable by 12");
        assert!(check_schema(12, 14, 11).unwrap());
        let e = check_schema(12, 13, 13).unwrap_err().to_string();
        assert!(e.contains("version 13") && e.contains("writes version 12"), "{e}");
        let all = [Migration::new(1, ""), Migration::new(2, "").readable_by(1), Migration::new(3, "")];
        assert_eq!(readable_by(&all, &[1, 2], None), 1);
        assert_eq!(readable_by(&all, &[1, 2, 3], None), 3);
        assert_eq!(readable_by(&all, &[1, 2], Some(5)), 5, "what a newer build asked stays");
    }
}

/// A migration that failed; its version is in the message.
pub fn migration_failed(version: i64, reason: impl Display) -> StoreError {
    StoreError::new(format!("migration {version}: {reason}"))
}

// ---------------------------------------------------------------------------------
// What `append` checks before it touches the database.

/// Refuses an outbox row whose id is not an action key of `load_id` (`EventStore::append`).
pub fn check_keys_of_load(load_id: &LoadId, outbox: &[NewOutboxRow]) -> Result<(), StoreError> {
    match outbox.iter().find(|o| !is_key_of_load(&o.id, load_id.as_str())) {
        Some(bad) => Err(StoreError::new(format!("outbox key {:?} is not an action key of load {load_id}", bad.id))),
        None => Ok(()),
    }
}

/// The first entry id that repeats within one append.
pub fn check_entry_ids_distinct(load_id: &LoadId, entries: &[NewEntry]) -> Result<(), DuplicateEntryError> {
    match first_repeat(entries.iter().map(|e| e.entry_id.as_str())) {
        Some(dup) => Err(DuplicateEntryError { load_id: load_id.to_string(), entry_id: dup.to_owned() }),
        None => Ok(()),
    }
}

/// The first outbox key that repeats within one append.
pub fn check_keys_distinct(outbox: &[NewOutboxRow]) -> Result<(), DuplicateActionKeyError> {
    match first_repeat(outbox.iter().map(|o| o.id.as_str())) {
        Some(dup) => Err(DuplicateActionKeyError { key: dup.to_owned() }),
        None => Ok(()),
    }
}

fn first_repeat<'a>(ids: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut seen = BTreeSet::new();
    ids.into_iter().find(|id| !seen.insert(*id))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    /// A row as the backends' drivers see it: typed values by column name, read by
    /// index through the list `columns!` gives, so a decoder reading another order
    /// than its list fails here.
    #[derive(Default)]
    struct FakeRow {
        names: Vec<&'static str>,
        values: BTreeMap<&'static str, Cell>,
    }

    #[derive(Clone)]
    enum Cell {
        Text(&'static str),
        Int(i64),
        Null,
    }

    impl FakeRow {
        fn new(list: &'static str, values: &[(&'static str, Cell)]) -> Self {
            let names: Vec<&'static str> = list.split(',').map(str::trim).collect();
            assert_eq!(names.len(), values.len(), "every column of {list:?} has a value");
            FakeRow { names, values: values.iter().cloned().collect() }
        }

        fn cell(&self, index: usize) -> Result<&Cell, CorruptRowError> {
            let name = self.names.get(index).ok_or_else(|| CorruptRowError::column(index, "no such column"))?;
            self.values.get(name).ok_or_else(|| CorruptRowError::column(index, format!("no value for {name}")))
        }
    }

    impl Columns for FakeRow {
        fn string(&self, index: usize) -> Result<String, CorruptRowError> {
            self.opt_string(index)?.ok_or_else(|| CorruptRowError::column(index, "NULL"))
        }

        fn opt_string(&self, index: usize) -> Result<Option<String>, CorruptRowError> {
            match self.cell(index)? {
                Cell::Text(s) => Ok(Some((*s).to_owned())),
                Cell::Null => Ok(None),
                Cell::Int(_) => Err(CorruptRowError::column(index, "an integer, not text")),
            }
        }

        fn i64(&self, index: usize) -> Result<i64, CorruptRowError> {
            self.opt_i64(index)?.ok_or_else(|| CorruptRowError::column(index, "NULL"))
        }

        fn opt_i64(&self, index: usize) -> Result<Option<i64>, CorruptRowError> {
            match self.cell(index)? {
                Cell::Int(n) => Ok(Some(*n)),
                Cell::Null => Ok(None),
                Cell::Text(_) => Err(CorruptRowError::column(index, "text, not an integer")),
            }
        }

        fn u32(&self, index: usize) -> Result<u32, CorruptRowError> {
            u32::try_from(self.i64(index)?).map_err(|e| CorruptRowError::column(index, e))
        }
    }

    fn outbox_values() -> Vec<(&'static str, Cell)> {
        vec![
            ("id", Cell::Text("L1/e1/send_sms")),
            ("load_id", Cell::Text("L1")),
            ("action_type", Cell::Text("send_sms")),
            ("action", Cell::Text("{\"key\":\"L1/e1/send_sms\"}")),
            ("status", Cell::Text("pending")),
            ("attempts", Cell::Int(2)),
            ("due_at", Cell::Int(6_000)),
            ("first_attempt_at", Cell::Int(7_000)),
            ("claim_token", Cell::Text("tok")),
            ("lease_until", Cell::Null),
            ("last_failure", Cell::Text("503")),
            ("receipt", Cell::Null),
            ("created_at", Cell::Int(12_000)),
            ("updated_at", Cell::Int(13_000)),
            ("trace", Cell::Text(TRACE)),
        ]
    }

    #[test]
    fn outbox_row_reads_its_column_list_in_order() {
        let row = outbox_row(&FakeRow::new(columns!(outbox), &outbox_values())).unwrap();
        assert_eq!(row.id, "L1/e1/send_sms");
        assert_eq!(row.load_id.as_str(), "L1");
        assert_eq!(row.action_type, ActionType::SendSms);
        assert_eq!(row.action, json!({"key": "L1/e1/send_sms"}));
        assert_eq!(row.status, OutboxStatus::Pending);
        assert_eq!(row.attempts, 2);
        assert_eq!((to_ms(row.due_at), row.first_attempt_at.map(to_ms)), (6_000, Some(7_000)));
        assert_eq!((row.claim_token.as_deref(), row.lease_until), (Some("tok"), None));
        assert_eq!((row.last_failure.as_deref(), row.receipt), (Some("503"), None));
        assert_eq!((to_ms(row.created_at), to_ms(row.updated_at)), (12_000, 13_000));
        assert_eq!(row.trace.map(|t| t.to_string()).as_deref(), Some(TRACE));
        // A context that does not read is none: a trace never makes a row corrupt.
        let mut values = outbox_values();
        values.last_mut().unwrap().1 = Cell::Text("00-oops");
        assert_eq!(outbox_row(&FakeRow::new(columns!(outbox), &values)).unwrap().trace, None);
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_wrong_type_or_a_null_is_a_corrupt_row_error() {
        for (column, cell) in [("due_at", Cell::Text("soon")), ("status", Cell::Int(1)), ("created_at", Cell::Null)] {
            let mut values = outbox_values();
            values.iter_mut().find(|(n, _)| *n == column).unwrap().1 = cell;
            let err = outbox_row(&FakeRow::new(columns!(outbox), &values)).unwrap_err();
            assert!(err.0.starts_with("corrupt row: column "), "{column}: {err}");
        }
        let mut values = outbox_values();
        values[4].1 = Cell::Text("lost");
        let err = outbox_row(&FakeRow::new(columns!(outbox), &values)).unwrap_err();
        assert_eq!(err.0, "corrupt row: status \"lost\"");
    }

    #[test]
    fn the_other_decoders_read_their_column_lists_in_order() {
        use Cell::{Int, Null, Text};
        let t = timer_row(&FakeRow::new(
            columns!(timer),
            &[
                ("timer_id", Text("tmr:L1:ask:eta_request:p1:1")),
                ("load_id", Text("L1")),
                ("fire_at", Int(2)),
                ("status", Text("fired")),
                ("created_at", Int(4)),
                ("canceled_at", Null),
                ("fired_at", Int(6)),
                ("trace", Null),
            ],
        ))
        .unwrap();
        assert_eq!(
            (t.timer_id.as_str(), t.load_id.as_str(), t.status),
            ("tmr:L1:ask:eta_request:p1:1", "L1", TimerStatus::Fired)
        );
        assert_eq!(
            (to_ms(t.fire_at), to_ms(t.created_at), t.canceled_at, t.fired_at.map(to_ms)),
            (2, 4, None, Some(6))
        );
        assert_eq!(t.trace, None);

        let (id, m) = queue_message_row(&FakeRow::new(
            concat!(columns!(queue_message), ", log_version"),
            &[
                ("id", Int(9)),
                ("load_id", Text("L1")),
                ("event_id", Text("e1")),
                ("body", Text("{}")),
                ("enqueued_at", Int(4)),
                ("receipt", Text("9.tok")),
                ("receive_count", Int(1)),
                ("trace", Text(TRACE)),
                ("log_version", Int(3)),
            ],
        ))
        .unwrap();
        assert_eq!((id, m.load_id.as_str(), m.event_id.as_str(), m.body.as_str()), (9, "L1", "e1", "{}"));
        assert_eq!((to_ms(m.enqueued_at), m.receipt.as_str(), m.receive_count), (4, "9.tok", 1));
        assert_eq!(m.log_version, Some(3));
        assert_eq!(m.trace.map(|t| t.to_string()).as_deref(), Some(TRACE));

        let r = record_row(&FakeRow::new(
            columns!(record),
            &[
                ("seq", Int(3)),
                ("entry_id", Text("e1")),
                ("kind", Text("k")),
                ("payload", Text("{oops")),
                ("recorded_at", Int(5)),
                ("trace", Text(TRACE)),
            ],
        ))
        .unwrap();
        assert_eq!((r.seq, r.entry_id.as_str(), r.kind(), to_ms(r.recorded_at)), (3, "e1", "k", 5));
        assert_eq!(r.payload(), Value::String("{oops".into()), "an unreadable payload is kept as text");
        assert_eq!(r.trace.map(|t| t.to_string()).as_deref(), Some(TRACE));

        let d = delivery_row(&FakeRow::new(
            columns!(delivery),
            &[
                ("id", Int(7)),
                ("channel", Text("sms")),
                ("key", Text("L1/e1/send_sms")),
                ("load_id", Text("L1")),
                ("payload", Text("{\"to\":1}")),
                ("created_at", Int(8)),
            ],
        ))
        .unwrap();
        assert_eq!((d.channel.as_str(), d.key.as_str(), d.load_id.as_str()), ("sms", "L1/e1/send_sms", "L1"));
        assert_eq!((d.payload, d.receipt.as_str(), to_ms(d.created_at)), (json!({"to": 1}), "rec:7", 8));

        let s = unmatched_sms_row(&FakeRow::new(
            columns!(unmatched_sms),
            &[
                ("message_sid", Text("SM1")),
                ("from_phone", Text("+1")),
                ("to_phone", Text("+2")),
                ("body", Text("hi")),
                ("received_at", Int(3)),
                ("reason", Text("why")),
            ],
        ))
        .unwrap();
        assert_eq!(
            (s.message_sid.as_str(), s.from.as_str(), s.to.as_str(), s.body.as_str()),
            ("SM1", "+1", "+2", "hi")
        );
        assert_eq!((to_ms(s.received_at), s.reason.as_str()), (3, "why"));
        assert_eq!(sms_route(None), Ok(SmsRoute::Unmatched));
        let l1 = LoadId::parse("L1").unwrap();
        assert_eq!(sms_route(Some("L1".into())), Ok(SmsRoute::Load(l1.clone())));
        assert_eq!(sms_route_load(&SmsRoute::Load(l1)), Some("L1"));
        assert!(sms_route(Some("L 1".into())).is_err());
    }

    #[test]
    fn a_load_id_out_of_form_is_a_corrupt_row() {
        assert_eq!(parse_load_id("L 1").unwrap_err().to_string(), "corrupt row: load_id \"L 1\"");
    }

    #[test]
    fn tokens_from_one_seed_repeat_and_receipts_round_trip() {
        let (a, b) = (Tokens::new(Some(7)), Tokens::new(Some(7)));
        let t = a.next();
        assert_eq!((t.len(), t.clone()), (32, b.next()));
        assert_ne!(a.next(), t);
        assert_eq!(parse_receipt(&receipt(42, &t)), Some(42));
        assert_eq!(parse_receipt("x.y"), None);
        assert_eq!(parse_receipt("42"), None);
    }

    #[test]
    fn pending_migrations_are_the_unapplied_ones_up_to_the_target() {
        const ALL: &[Migration] =
            &[Migration::new(1, "a"), Migration::new(2, "b"), Migration::new(3, "c"), Migration::new(4, "d")];
        let versions = |v: Vec<&Migration>| v.iter().map(|m| m.version).collect::<Vec<_>>();
        assert_eq!(latest_version(ALL), 4);
        assert_eq!(versions(pending_migrations(ALL, &[], 4)), [1, 2, 3, 4]);
        assert_eq!(versions(pending_migrations(ALL, &[1, 2], 4)), [3, 4]);
        assert_eq!(versions(pending_migrations(ALL, &[1], 2)), [2]);
        assert_eq!(versions(pending_migrations(ALL, &[], 0)), Vec::<i64>::new());
        assert_eq!(migration_failed(5, "boom").0, "migration 5: boom");
    }

    #[test]
    fn append_checks_keys_and_repeats_in_the_batch() {
        let l = LoadId::parse("L1").unwrap();
        let row =
            |id: &str| NewOutboxRow { id: id.into(), action_type: ActionType::SendSms, action: json!({}), trace: None };
        let entry = |id: &str| NewEntry::stored(id, "k", json!({}));
        assert!(check_keys_of_load(&l, &[row("L1/e1/a")]).is_ok());
        let err = check_keys_of_load(&l, &[row("L1/e1/a"), row("L10/e1/a")]).unwrap_err();
        assert_eq!(err.0, "outbox key \"L10/e1/a\" is not an action key of load L1");
        assert!(check_entry_ids_distinct(&l, &[entry("e1"), entry("e2")]).is_ok());
        let err = check_entry_ids_distinct(&l, &[entry("e1"), entry("e2"), entry("e2")]).unwrap_err();
        assert_eq!((err.load_id.as_str(), err.entry_id.as_str()), ("L1", "e2"));
        assert!(check_keys_distinct(&[row("L1/a"), row("L1/b")]).is_ok());
        assert_eq!(check_keys_distinct(&[row("L1/a"), row("L1/a")]).unwrap_err().key, "L1/a");
    }

    #[test]
    fn claims_come_due_first_then_by_id_and_a_lapsed_lease_is_stale() {
        let row = |id: &'static str, due_ms: i64| {
            let mut values = outbox_values();
            values[0].1 = Cell::Text(id);
            values[6].1 = Cell::Int(due_ms);
            outbox_row(&FakeRow::new(columns!(outbox), &values)).unwrap()
        };
        let got = claims(vec![row("L1/b", 2), row("L1/c", 1), row("L1/a", 2)], "t");
        let order: Vec<&str> = got.iter().map(|c| c.row.id.as_str()).collect();
        assert_eq!(order, ["L1/c", "L1/a", "L1/b"]);
        assert!(got.iter().all(|c| c.token == "t"));
        assert!(check_lease("x", Some(11), 10).is_ok());
        assert_eq!(check_lease("x", Some(10), 10).unwrap_err().outbox_id, "x");
        assert!(check_lease("x", None, 10).is_err());
    }

    #[test]
    fn durations_saturate() {
        assert_eq!(duration_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(duration_ms(Duration::MAX), i64::MAX);
        assert_eq!(deadline_ms(from_ms(1000), Duration::from_secs(2)), 3000);
        assert_eq!(deadline_ms(from_ms(1000), Duration::MAX), i64::MAX);
    }
}
