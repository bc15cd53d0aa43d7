//! One unit of work's statements: an append (with the ack of its message), a
//! publish, a publish-and-mark; what each does inside a transaction, what it does in a
//! transaction of its own, and how it fails. The committers (`group.rs`) run units in
//! batches; the storage contracts (`impls.rs`) hand units to them; neither reaches
//! into the other.

use deadpool_postgres::{GenericClient, Pool, Transaction};
use haul_core::derived::{Derived, TimerWrite};
use haul_core::ids::LoadId;
use haul_core::time::to_ms;
use haul_core::trace::TraceParent;
use haul_store::backend::{check_entry_ids_distinct, check_keys_distinct, parse_receipt, queue_message_row};
use haul_store::{
    AppendError, ClaimError, ConcurrencyConflictError, DuplicateActionKeyError, DuplicateEntryError, NewEntry,
    NewOutboxRow, Published, QueueMessage, StaleClaimError, StoreError, outbox_key_load,
};
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;

use crate::rows::{Params, PgRow, col, constraint};
use crate::sql::{
    CONSENT_SET, ENTRY_IDS_TAKEN, EVENTS_INSERT, LOAD_ADVANCE, LOAD_ADVANCE_OR_FAIL, LOAD_CREATE, LOAD_CREATE_OR_FAIL,
    LOAD_FACTS_SET, LOAD_SUMMARY_ASKS, LOAD_SUMMARY_FOLD, LOAD_SUMMARY_SET, LOAD_VERSION, OUTBOX_INBOX_SET,
    OUTBOX_INSERT, OUTBOX_KEYS_TAKEN, OUTBOX_MARK_DISPATCHED, PROMPTS_PUT, QUEUE_ACK, QUEUE_LOCK_HEAD,
    QUEUE_LOCK_HEAD_OF_LOAD, QUEUE_PUBLISH, QUEUE_RECEIVE_PUBLISHED, SPEND_ADD, TIMERS_CANCEL_ALL, TIMERS_SCHEDULE_ALL,
};
use crate::{pg, pool_client};

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
    /// The claim token and lease (ms) its outbox rows are written with, when claimed
    /// with the append (`AppendWith::claim`).
    pub claim: Option<(String, i64)>,
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
    /// The trace context's text, `''` for none (`QUEUE_PUBLISH`).
    pub trace: String,
    pub now: i64,
}

impl PublishMarkArgs {
    /// The publish's parameters, as `PublishArgs::parts`.
    pub(crate) fn publish(&self) -> Publish<'_> {
        (&self.load_id, &self.event_id, &self.body, &self.trace, self.now)
    }
}

/// `LoadQueue::publish_traced`'s arguments.
pub(crate) struct PublishArgs {
    pub load_id: String,
    pub event_id: String,
    pub body: String,
    /// The trace context's text, `''` for none (`QUEUE_PUBLISH`).
    pub trace: String,
    pub now: i64,
    /// `publish_receiving`'s receive: the receipt's token and the message's lease
    /// (invisible until, ms).
    pub receive: Option<(String, i64)>,
}

impl PublishArgs {
    pub(crate) fn new(
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: haul_core::time::Timestamp,
        receive: Option<(String, i64)>,
    ) -> Self {
        let (load_id, event_id, body) = (load_id.as_str().to_owned(), event_id.to_owned(), body.to_owned());
        PublishArgs { load_id, event_id, body, trace: trace_text(trace), now: to_ms(now), receive }
    }

    /// The publish's parameters: load, event id, body, trace context, now.
    pub(crate) fn parts(&self) -> Publish<'_> {
        (&self.load_id, &self.event_id, &self.body, &self.trace, self.now)
    }
}

/// A publish's parameters, in `QUEUE_PUBLISH`'s order.
pub(crate) type Publish<'a> = (&'a str, &'a str, &'a str, &'a str, i64);

/// A trace context as `QUEUE_PUBLISH` takes it.
pub(crate) fn trace_text(trace: Option<TraceParent>) -> String {
    trace.map(|t| t.to_string()).unwrap_or_default()
}

/// An append alone in a transaction of its own: a unit a batch put off because it
/// waited for a lock.
pub(crate) async fn append_solo(pool: &Pool, args: &AppendArgs) -> Result<(u64, bool), AppendError> {
    let mut client = pool_client(pool).await?;
    let tx = client.transaction().await.map_err(pg)?;
    let statements = AppendStatements::prepare(&tx, args, false).await.map_err(pg)?;
    let out = append_body(&tx, args, statements).await.map_err(Fail::into_err)?;
    tx.commit().await.map_err(pg)?;
    Ok(out)
}

/// The statements an append runs, prepared (on a connection's statement cache: a hit
/// after its first use). Only what this append runs is prepared: a store on an older
/// schema (upgrade tests) has no summary columns until migration 9.
#[derive(Clone)]
pub(crate) struct AppendStatements {
    version: Statement,
    /// The version check that fails its transaction (`LOAD_ADVANCE_OR_FAIL`), present
    /// when the append runs in one round trip (`append_body`).
    version_or_fail: Option<Statement>,
    entries: Statement,
    keys: Option<Statement>,
    asks: Option<Statement>,
    events: Statement,
    outbox: Option<Statement>,
    summary: Option<Statement>,
    fold: Option<Statement>,
    facts: Option<Statement>,
    consent: Option<Statement>,
    spend: Option<Statement>,
    prompts: Option<Statement>,
    inbox: Option<Statement>,
    schedule: Option<Statement>,
    cancel: Option<Statement>,
    lock: Option<Statement>,
    ack: Option<Statement>,
}

impl AppendStatements {
    /// `one_trip`: the append may run as one round trip (a unit of a committer's batch);
    /// it will when `append_is_one_trip` holds too.
    pub(crate) async fn prepare(
        tx: &impl GenericClient,
        a: &AppendArgs,
        one_trip: bool,
    ) -> Result<Self, tokio_postgres::Error> {
        let delta = Derived::merged(a.entries.iter().map(|e| &e.derived));
        let prepare = async |needed: bool, sql: &str| -> Result<Option<Statement>, tokio_postgres::Error> {
            if needed { Ok(Some(tx.prepare_cached(sql).await?)) } else { Ok(None) }
        };
        let message = a.receipt.as_deref().and_then(parse_receipt).is_some();
        let (version_sql, or_fail_sql) = match a.expected_version {
            0 => (LOAD_CREATE, LOAD_CREATE_OR_FAIL),
            _ => (LOAD_ADVANCE, LOAD_ADVANCE_OR_FAIL),
        };
        Ok(AppendStatements {
            version: tx.prepare_cached(version_sql).await?,
            version_or_fail: prepare(one_trip && append_is_one_trip(a), or_fail_sql).await?,
            entries: tx.prepare_cached(ENTRY_IDS_TAKEN).await?,
            keys: prepare(!a.outbox.is_empty(), OUTBOX_KEYS_TAKEN).await?,
            asks: prepare(!delta.asks_unchanged(), LOAD_SUMMARY_ASKS).await?,
            events: tx.prepare_cached(EVENTS_INSERT).await?,
            outbox: prepare(!a.outbox.is_empty(), OUTBOX_INSERT).await?,
            summary: prepare(delta.stage.is_some() || !delta.asks_unchanged(), LOAD_SUMMARY_SET).await?,
            fold: prepare(!delta.asks_unchanged(), LOAD_SUMMARY_FOLD).await?,
            facts: prepare(delta.changes_facts(), LOAD_FACTS_SET).await?,
            consent: prepare(delta.consent.is_some(), CONSENT_SET).await?,
            spend: prepare(!delta.spend.is_empty(), SPEND_ADD).await?,
            prompts: prepare(!delta.prompts.is_empty(), PROMPTS_PUT).await?,
            inbox: prepare(!delta.inbox.is_empty(), OUTBOX_INBOX_SET).await?,
            schedule: prepare(delta.timers.iter().any(TimerWrite::is_schedule), TIMERS_SCHEDULE_ALL).await?,
            cancel: prepare(!delta.timers.iter().all(TimerWrite::is_schedule), TIMERS_CANCEL_ALL).await?,
            lock: prepare(message, QUEUE_LOCK_HEAD_OF_LOAD).await?,
            ack: prepare(message, QUEUE_ACK).await?,
        })
    }
}

/// Whether `append_body`, prepared with `one_trip`, sends all of this append's statements in one
/// round trip (the one predicate both it and the committer's waves go by): unless the
/// call repeats an entry id or an action key (answered step by step, with the exact
/// error). Its summary's asks are folded in SQL (`LOAD_SUMMARY_FOLD`), so they need no
/// read first.
pub(crate) fn append_is_one_trip(a: &AppendArgs) -> bool {
    check_entry_ids_distinct(&a.load_id, &a.entries).is_ok() && check_keys_distinct(&a.outbox).is_ok()
}

/// The statements of an append (and its ack), inside the caller's transaction or
/// savepoint. Statements whose order allows it are issued together (pipelined): the
/// server still runs them in the order written, so the version is checked first.
///
/// Prepared for one round trip (`AppendStatements::prepare` with `one_trip`: a unit of a
/// committer's batch, inside its savepoint), an append sends every statement at once. Its
/// writes are only right when its checks pass; when anything else came back (a
/// conflict, a duplicate, an error), the unit answers `Fail::Again`, its savepoint is
/// rolled back, and it runs again alone, step by step, for the exact answer. Conflicts
/// are rare, so the common append costs one round trip, not two. The statements come
/// prepared, so that round trip goes out on the future's first poll, before it waits
/// for anything: what lets a committer send several units' statements together.
pub(crate) async fn append_body(
    tx: &impl GenericClient,
    a: &AppendArgs,
    statements: AppendStatements,
) -> Result<(u64, bool), Fail<AppendError>> {
    let (lid, now, entries, outbox) = (a.load_id.as_str(), a.now, &a.entries, &a.outbox);
    let expected = a.expected_version as i64;
    let new_version = expected + entries.len() as i64;
    let ids: Vec<&str> = entries.iter().map(|e| e.entry_id.as_str()).collect();
    let keys: Vec<&str> = outbox.iter().map(|o| o.id.as_str()).collect();
    let delta = Derived::merged(entries.iter().map(|e| &e.derived));
    let AppendStatements {
        version: version_stmt,
        version_or_fail: version_or_fail_stmt,
        entries: entries_stmt,
        keys: keys_stmt,
        asks: asks_stmt,
        events: events_stmt,
        outbox: outbox_stmt,
        summary: summary_stmt,
        fold: fold_stmt,
        facts: facts_stmt,
        consent: consent_stmt,
        spend: spend_stmt,
        prompts: prompts_stmt,
        inbox: inbox_stmt,
        schedule: schedule_stmt,
        cancel: cancel_stmt,
        lock: lock_stmt,
        ack: ack_stmt,
    } = statements;

    let seqs: Vec<i64> = (1..=entries.len() as i64).map(|i| expected + i).collect();
    let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
    let payloads: Vec<String> = entries.iter().map(|e| e.payload.to_string()).collect();
    let types: Vec<&str> = outbox.iter().map(|o| o.action_type.as_str()).collect();
    let actions: Vec<String> = outbox.iter().map(|o| o.action.to_string()).collect();
    let entry_traces: Vec<Option<String>> = entries.iter().map(|e| e.trace.map(|t| t.to_string())).collect();
    let row_traces: Vec<Option<String>> = outbox.iter().map(|o| o.trace.map(|t| t.to_string())).collect();
    let message = a.receipt.as_deref().and_then(parse_receipt);
    let receipt = a.receipt.as_deref().unwrap_or_default();
    let version_params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        if expected == 0 { vec![&lid, &new_version, &now] } else { vec![&lid, &new_version, &expected, &now] };

    // The statements, each a future that sends it when first polled: joined in the
    // order written, they go out in that order, in one round trip.
    let take_version = async || tx.execute(&version_stmt, &version_params).await;
    // One row when taken, an ERROR otherwise (no count of 0): see `LOAD_ADVANCE_OR_FAIL`.
    let take_version_or_fail = async |stmt: &Statement| tx.execute(stmt, &version_params).await;
    let find_taken_entry = async || tx.query_opt(&entries_stmt, &[&lid, &ids]).await;
    let find_taken_key = async || match &keys_stmt {
        Some(stmt) => tx.query_opt(stmt, &[&lid, &keys]).await,
        None => Ok(None),
    };
    let read_asks = async || match &asks_stmt {
        Some(stmt) => tx.query_opt(stmt, &[&lid]).await,
        None => Ok(None),
    };
    let insert_events =
        async || tx.execute(&events_stmt, &[&lid, &seqs, &ids, &kinds, &payloads, &now, &entry_traces]).await;
    let insert_outbox = async || match &outbox_stmt {
        Some(stmt) => {
            let (token, lease_until) = (a.claim.as_ref().map(|c| c.0.as_str()), a.claim.as_ref().map(|c| c.1));
            tx.execute(stmt, &[&lid, &keys, &types, &actions, &now, &row_traces, &token, &lease_until]).await
        }
        None => Ok(0),
    };
    let set_summary = async |asks: &Option<String>, open: &Option<i32>, escalated: &Option<i32>| match &summary_stmt {
        Some(stmt) => tx.execute(stmt, &[&lid, &delta.stage, asks, open, escalated]).await,
        None => Ok(0),
    };
    let active = delta.active();
    // The load's facts and the sender's consent (a STOP or START): derived data both,
    // sent together.
    let consent = delta.consent.as_ref().map(|(c, event_id)| (c.phone.as_str(), i32::from(c.opted_out), event_id));
    // And what its model calls cost their clients' days, and their prompts.
    let spend = SpendArrays::of(&delta);
    let set_facts = async || {
        let facts = async || match &facts_stmt {
            Some(stmt) => tx.execute(stmt, &[&lid, &delta.driver_phone, &active, &now, &delta.client]).await,
            None => Ok(0),
        };
        let consent = async || match (&consent_stmt, &consent) {
            (Some(stmt), Some((phone, opted_out, event_id))) => {
                tx.execute(stmt, &[phone, opted_out, event_id, &lid, &now]).await
            }
            _ => Ok(0),
        };
        let add_spend = async || match &spend_stmt {
            Some(stmt) => {
                let s = &spend;
                let params: Params = &[&s.clients, &s.days, &s.input, &s.output, &s.cost, &s.calls, &s.capped, &now];
                tx.execute(stmt, params).await
            }
            None => Ok(0),
        };
        let put_prompts = async || match &prompts_stmt {
            Some(stmt) => tx.execute(stmt, &[&spend.hashes, &spend.texts, &now]).await,
            None => Ok(0),
        };
        let (facts, consent, spent, prompts) = tokio::join!(facts(), consent(), add_spend(), put_prompts());
        facts.and(consent).and(spent).and(prompts)
    };
    // The dead rows the decisions took out of the inbox: each row's last change.
    let mut inbox: Vec<&(String, String, String)> = Vec::with_capacity(delta.inbox.len());
    for change in delta.inbox.iter().rev() {
        if !inbox.iter().any(|c| c.0 == change.0) {
            inbox.push(change);
        }
    }
    let inbox_ids: Vec<&str> = inbox.iter().map(|c| c.0.as_str()).collect();
    let inbox_states: Vec<&str> = inbox.iter().map(|c| c.1.as_str()).collect();
    let inbox_events: Vec<&str> = inbox.iter().map(|c| c.2.as_str()).collect();
    let mark_inbox = async || match &inbox_stmt {
        Some(stmt) => tx.execute(stmt, &[&lid, &inbox_ids, &inbox_states, &inbox_events, &now]).await,
        None => Ok(0),
    };
    // The timers its decisions schedule and cancel (`TimerRoute::WithDecision`):
    // schedules first, as a decision's actions come, each keeping the run's trace context.
    let timers = TimerArrays::of(&delta);
    let run_trace = NewEntry::run_trace(entries).map(|t| t.to_string());
    let timer_traces = vec![run_trace; timers.schedule.0.len()];
    let schedule_timers = async || match &schedule_stmt {
        Some(stmt) => {
            let (ids, loads, fire_at) = &timers.schedule;
            tx.execute(stmt, &[ids, loads, fire_at, &now, &timer_traces]).await
        }
        None => Ok(0),
    };
    let cancel_timers = async || match &cancel_stmt {
        Some(stmt) => tx.execute(stmt, &[&timers.cancel.0, &timers.cancel.1, &now]).await,
        None => Ok(0),
    };
    let ack = async || match (&lock_stmt, &ack_stmt, message) {
        (Some(lock), Some(ack), Some(id)) => {
            // Two statements, one round trip: the ack's snapshot must come after the
            // lock's wait (see `QUEUE_ACK`).
            let (lock_params, ack_params): (Params, Params) = (&[&id, &lid], &[&id, &receipt, &now, &lid]);
            let (locked, acked) = tokio::join!(tx.query_opt(lock, lock_params), tx.execute(ack, ack_params));
            locked.and(acked)
        }
        _ => Ok(0),
    };

    if let Some(version_or_fail) = &version_or_fail_stmt {
        // The asks' new statuses (each ask's last one: the delta folded over no asks),
        // folded over the stored ones in SQL.
        let statuses = (!delta.asks_unchanged()).then(|| delta.fold_asks("{}").0);
        let summarize = async || match (&fold_stmt, &statuses) {
            (Some(stmt), Some(statuses)) => tx.execute(stmt, &[&lid, &delta.stage, statuses]).await,
            _ => set_summary(&None, &None, &None).await,
        };
        // The entry ids and action keys are not looked up first: a taken one fails its
        // insert on the table's unique key (`(load_id, entry_id)` of the log, `(load_id,
        // id)` of the outbox, the lookups' own scopes), and the unit runs again step by
        // step, checks and all, for the exact error. Taken ones are rare (a redelivery
        // the worker did not already see in the log), the lookups are not: one or two
        // statements fewer per append.
        let (won, inserted, outboxed, summarized, facts, marked, scheduled, canceled, acked) = tokio::join!(
            take_version_or_fail(version_or_fail),
            insert_events(),
            insert_outbox(),
            summarize(),
            set_facts(),
            mark_inbox(),
            schedule_timers(),
            cancel_timers(),
            ack()
        );
        let clean = matches!(won, Ok(1))
            && inserted.is_ok()
            && outboxed.is_ok()
            && summarized.is_ok()
            && facts.is_ok()
            && marked.is_ok()
            && scheduled.is_ok()
            && canceled.is_ok();
        return match acked {
            Ok(n) if clean => Ok((new_version as u64, n == 1)),
            _ => Err(Fail::Again),
        };
    }

    // 1. The version (taking the loads row, insert or guarded update, serializes
    // appends to one load; a loser waits for the winner's commit, then fails here), the
    // entry ids, the outbox keys, and the asks the summary folds: one round trip.
    let (won, entry_taken, key_taken, asks) =
        tokio::join!(take_version(), find_taken_entry(), find_taken_key(), read_asks());
    if won.map_err(db)? != 1 {
        let stmt = tx.prepare_cached(LOAD_VERSION).await.map_err(db)?;
        let actual: Option<i64> = match tx.query_opt(&stmt, &[&lid]).await.map_err(db)? {
            Some(row) => Some(col(&row, 0).map_err(Fail::store)?),
            None => None,
        };
        return Err(Fail::typed(ConcurrencyConflictError {
            load_id: lid.to_owned(),
            expected: a.expected_version,
            actual: actual.unwrap_or(0) as u64,
        }));
    }

    // 2. The entry ids.
    check_entry_ids_distinct(&a.load_id, entries).map_err(Fail::typed)?;
    if let Some(row) = entry_taken.map_err(db)? {
        let entry_id = col(&row, 0).map_err(Fail::store)?;
        return Err(Fail::typed(DuplicateEntryError { load_id: lid.to_owned(), entry_id }));
    }

    // 3. The outbox keys.
    check_keys_distinct(outbox).map_err(Fail::typed)?;
    if let Some(row) = key_taken.map_err(db)? {
        return Err(Fail::typed(DuplicateActionKeyError { key: col(&row, 0).map_err(Fail::store)? }));
    }

    // 4. The rows, the load's summary (stage, asks) on the row step 1 holds, and the
    // ack, last, so the queue head's row lock is held for the shortest time: one round
    // trip.
    let (mut asks_after, mut open, mut escalated) = (None, None, None);
    if let Some(row) = asks.map_err(db)? {
        let before: String = col(&row, 0).map_err(Fail::store)?;
        let (after, o, e) = delta.fold_asks(&before);
        (asks_after, open, escalated) = (Some(after), Some(o as i32), Some(e as i32));
    }
    let (inserted, outboxed, summarized, facts, marked, scheduled, canceled, acked) = tokio::join!(
        insert_events(),
        insert_outbox(),
        set_summary(&asks_after, &open, &escalated),
        set_facts(),
        mark_inbox(),
        schedule_timers(),
        cancel_timers(),
        ack()
    );
    inserted.map_err(|e| match constraint(&e) {
        Some(c) if c.ends_with("entry_id_key") => {
            Fail::typed(DuplicateEntryError { load_id: lid.to_owned(), entry_id: "?".into() })
        }
        _ => db(e),
    })?;
    outboxed.map_err(|e| match constraint(&e) {
        // Another transaction took the key between our check and insert.
        Some(c) if c.ends_with("pkey") => Fail::typed(DuplicateActionKeyError { key: "?".into() }),
        _ => db(e),
    })?;
    summarized.map_err(db)?;
    facts.map_err(db)?;
    marked.map_err(db)?;
    scheduled.map_err(db)?;
    canceled.map_err(db)?;
    Ok((new_version as u64, acked.map_err(db)? == 1))
}

/// An append's spend and prompts as the arrays `SPEND_ADD` and `PROMPTS_PUT` take.
struct SpendArrays {
    clients: Vec<String>,
    days: Vec<String>,
    input: Vec<i64>,
    output: Vec<i64>,
    cost: Vec<i64>,
    calls: Vec<i64>,
    capped: Vec<bool>,
    hashes: Vec<String>,
    texts: Vec<String>,
}

impl SpendArrays {
    fn of(delta: &Derived) -> SpendArrays {
        // One element per client and day, one per hash: `Derived::merged` made them so.
        let rows = &delta.spend;
        let (hashes, texts) = delta.prompts.iter().cloned().unzip();
        SpendArrays {
            clients: rows.iter().map(|d| d.client.clone()).collect(),
            days: rows.iter().map(|d| d.day.clone()).collect(),
            input: rows.iter().map(|d| d.spend.input_tokens as i64).collect(),
            output: rows.iter().map(|d| d.spend.output_tokens as i64).collect(),
            cost: rows.iter().map(|d| d.spend.cost_micro_usd as i64).collect(),
            calls: rows.iter().map(|d| d.spend.calls as i64).collect(),
            capped: rows.iter().map(|d| d.capped).collect(),
            hashes,
            texts,
        }
    }
}

/// An append's timer writes as the arrays its statements take: each timer's id, load
/// and (scheduled) fire_at in epoch ms. A timer is canceled once however often the
/// append names it (one statement cannot change a row twice).
struct TimerArrays {
    schedule: (Vec<String>, Vec<String>, Vec<i64>),
    cancel: (Vec<String>, Vec<String>),
}

impl TimerArrays {
    fn of(delta: &Derived) -> TimerArrays {
        let mut out = TimerArrays { schedule: (vec![], vec![], vec![]), cancel: (vec![], vec![]) };
        for t in &delta.timers {
            match t {
                TimerWrite::Schedule { timer_id, fire_at } => {
                    out.schedule.0.push(timer_id.to_string());
                    out.schedule.1.push(timer_id.parts().0.to_string());
                    out.schedule.2.push(to_ms(*fire_at));
                }
                TimerWrite::Cancel { timer_id } if !out.cancel.0.iter().any(|c| c == timer_id.as_str()) => {
                    out.cancel.0.push(timer_id.to_string());
                    out.cancel.1.push(timer_id.parts().0.to_string());
                }
                TimerWrite::Cancel { .. } => {}
            }
        }
        out
    }
}

/// The statements of a publish-and-mark, prepared.
#[derive(Clone)]
pub(crate) struct PublishMarkStatements {
    publish: Statement,
    mark: Statement,
}

impl PublishMarkStatements {
    pub(crate) async fn prepare(c: &impl GenericClient) -> Result<Self, tokio_postgres::Error> {
        Ok(PublishMarkStatements {
            publish: c.prepare_cached(QUEUE_PUBLISH).await?,
            mark: c.prepare_cached(OUTBOX_MARK_DISPATCHED).await?,
        })
    }
}

/// Publishes an outcome and marks its row, in the caller's transaction or savepoint:
/// the answer is the publish, or the mark's stale claim (the publish stands either way).
pub(crate) async fn publish_mark_body(
    tx: &impl GenericClient,
    statements: &PublishMarkStatements,
    a: &PublishMarkArgs,
) -> Result<Result<Published, ClaimError>, Fail<ClaimError>> {
    let lid = outbox_key_load(&a.id);
    // The mark is issued behind the publish, in the same round trip.
    let mark: Params = &[&lid, &a.id, &a.token, &a.receipt, &a.now];
    let (published, n) = tokio::join!(
        publish_in::<ClaimError>(tx, &statements.publish, a.publish()),
        tx.execute(&statements.mark, mark),
    );
    let published = published?;
    if n.map_err(db)? == 1 { Ok(Ok(published)) } else { Ok(Err(StaleClaimError { outbox_id: a.id.clone() }.into())) }
}

/// A publish's statements, prepared: the publish, and `publish_receiving`'s receive
/// when it asks for one.
#[derive(Clone)]
pub(crate) struct PublishStatements {
    publish: Statement,
    receive: Option<Statement>,
}

impl PublishStatements {
    pub(crate) async fn prepare(client: &impl GenericClient, a: &PublishArgs) -> Result<Self, tokio_postgres::Error> {
        let publish = client.prepare_cached(QUEUE_PUBLISH).await?;
        let receive = match a.receive {
            Some(_) => Some(client.prepare_cached(QUEUE_RECEIVE_PUBLISHED).await?),
            None => None,
        };
        Ok(PublishStatements { publish, receive })
    }
}

/// A publish and, when asked, the receive of its load's head behind it in the same
/// round trip (`QUEUE_RECEIVE_PUBLISHED`).
pub(crate) async fn publish_body<E: From<StoreError>>(
    tx: &impl GenericClient,
    statements: &PublishStatements,
    a: &PublishArgs,
) -> Result<(Published, Option<QueueMessage>), Fail<E>> {
    let (Some(receive), Some((token, until))) = (&statements.receive, &a.receive) else {
        return Ok((publish_in(tx, &statements.publish, a.parts()).await?, None));
    };
    let (lid, event_id): (&str, &str) = (&a.load_id, &a.event_id);
    let params: Params = &[&lid, &event_id, &a.now, until, token];
    let (published, received) =
        tokio::join!(publish_in::<E>(tx, &statements.publish, a.parts()), tx.query_opt(receive, params));
    let published = published?;
    let received = match received.map_err(db)? {
        Some(row) => Some(queue_message_row(&PgRow(&row)).map_err(|e| Fail::Typed(E::from(e)))?.1),
        None => None,
    };
    Ok((published, received))
}

/// A publish alone in a transaction of its own (put off by a batch).
pub(crate) async fn publish_solo(
    pool: &Pool,
    a: &PublishArgs,
) -> Result<(Published, Option<QueueMessage>), StoreError> {
    let mut client = pool_client(pool).await?;
    let tx = client.transaction().await.map_err(pg)?;
    let statements = PublishStatements::prepare(&tx, a).await.map_err(pg)?;
    let out = publish_body::<StoreError>(&tx, &statements, a).await.map_err(Fail::into_err)?;
    tx.commit().await.map_err(pg)?;
    Ok(out)
}

/// `publish_and_mark_dispatched` alone in a transaction of its own (put off by a batch).
pub(crate) async fn publish_mark_solo(pool: &Pool, args: &PublishMarkArgs) -> Result<Published, ClaimError> {
    let mut client = pool_client(pool).await?;
    let tx = client.transaction().await.map_err(pg)?;
    let statements = PublishMarkStatements::prepare(&tx).await.map_err(pg)?;
    let out = publish_mark_body(&tx, &statements, args).await.map_err(Fail::into_err)?;
    tx.commit().await.map_err(pg)?;
    out
}

/// Locks the head row of the message's load and names the load. Lock order
/// everywhere: head row, then message row.
pub(crate) async fn lock_head<E: From<StoreError>>(
    tx: &Transaction<'_>,
    message_id: i64,
) -> Result<Option<String>, Fail<E>> {
    match tx.query_opt(&tx.prepare_cached(QUEUE_LOCK_HEAD).await.map_err(db)?, &[&message_id]).await.map_err(db)? {
        Some(row) => Ok(Some(col(&row, 0).map_err(Fail::store)?)),
        None => Ok(None),
    }
}

/// Publishes inside `tx`: the message and, when its load's head is empty, the head.
pub(crate) async fn publish_in<E: From<StoreError>>(
    tx: &impl GenericClient,
    publish: &Statement,
    (lid, event_id, body, trace, now): Publish<'_>,
) -> Result<Published, Fail<E>> {
    // The head's upsert locks its row, so a publish serializes with an ack moving it.
    match tx.query_opt(publish, &[&lid, &event_id, &body, &trace, &now]).await.map_err(db)? {
        Some(_) => Ok(Published::New),
        None => Ok(Published::Duplicate),
    }
}

/// Acks the message of `receipt` inside `tx` and moves its load's head on; false (and
/// nothing changed) when the receipt is not the message's current one. (An append's
/// ack, whose load is known, goes in the append's round trip: `QUEUE_LOCK_HEAD_OF_LOAD`.)
pub(crate) async fn ack_in<E: From<StoreError>>(
    tx: &Transaction<'_>,
    receipt: &str,
    now: i64,
) -> Result<bool, Fail<E>> {
    let Some(id) = parse_receipt(receipt) else { return Ok(false) };
    let Some(load_id) = lock_head(tx, id).await? else { return Ok(false) };
    let ack = tx.prepare_cached(QUEUE_ACK).await.map_err(db)?;
    Ok(tx.execute(&ack, &[&id, &receipt, &now, &load_id]).await.map_err(db)? == 1)
}
