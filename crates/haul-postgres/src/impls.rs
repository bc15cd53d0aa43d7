//! The storage contracts on PostgreSQL.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use haul_core::InboxState;
use haul_core::action::ActionType;
use haul_core::dispatch::Alert;
use haul_core::ids::{LoadId, TimerId};
use haul_core::limit::{Grant, Limit};
use haul_core::projection::Record;
use haul_core::time::{Timestamp, add, from_ms, to_ms, to_us};
use haul_core::trace::TraceParent;
use haul_store::backend::{
    Columns, check_keys_of_load, check_lease, claims, conflict_load_row, dead_row, deadline_ms, delivery_receipt,
    delivery_row, inbox_alert_row, inbox_sms_row, load_client_row, load_id_row, load_summary_row, ops_alert_row,
    outbox_row, parse_receipt, queue_message_row, rate_change_row, record_row, saturated_row, shadow_params,
    shadow_row, sms_assignment, sms_consent_row, sms_dismissal, sms_move_step, sms_report_row, sms_route,
    sms_route_load, timer_row, type_count_row, unmatched_sms_row, unsettled_row,
};
use haul_store::backend::{check_takes, counted, llm_spend_row};
use haul_store::ops::{
    InboxAlert, InboxCounts, InboxSms, LOADS_SCANNED_PER_PAGE, SmsDismissal, state_param, types_param,
};
use haul_store::{
    AlertState, AppendError, AppendWith, Claim, ClaimError, DeliveryLog, EventStore, LoadIndex, LoadLease, LoadLock,
    LoadQueue, MAX_CLIENTS_OF, MAX_CONSENT_ASKED, MAX_HOLDS, NewEntry, NewOutboxRow, OpsAlertRecord, Outbox, OutboxRow,
    OutboxStatus, Prune, PruneReport, Published, QueueError, QueueMessage, RecordedDelivery, RowCursor, SendRates,
    ShadowCursor, ShadowDecision, ShadowStore, SidClaim, SmsAssignment, SmsConsent, SmsMove, SmsReport, SmsRoute,
    StaleClaimError, StoreError, Superseded, Timer, TimerStore, UnmatchedSms, Unsettled, columns, outbox_key_load,
    too_many,
};
use haul_store::{
    ClaimCursor, ClaimTake, ClaimWith, ClaimedTaking, ConflictLoad, DeadRow, LoadFilter, LoadsPage, OpsQueries,
    RateChange,
};
use haul_store::{ClientDaySpend, SpendLedger};
use haul_store::{EdgeStore, RequestClaim, console_secret_from_hex, console_secret_hex};

use crate::rows::{Params, PgRow, col, rows_on, sql_limit};
use crate::sql::*;
use crate::units::{AppendArgs, Fail, PublishArgs, PublishMarkArgs, ack_in, lock_head, trace_text};
use crate::{PgStore, pg};
use deadpool_postgres::GenericClient;

impl PgStore {
    /// Runs a (cached) query on a session of the main pool and decodes each row.
    async fn query_rows<T>(
        &self,
        sql: &str,
        params: Params<'_>,
        decode: fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        rows_on(&self.client().await?, sql, params, decode).await
    }
}

#[async_trait]
impl EventStore for PgStore {
    async fn read(&self, load_id: &LoadId) -> Result<(Vec<Record>, u64), StoreError> {
        self.read_after(load_id, 0).await
    }

    async fn read_after(&self, load_id: &LoadId, after_seq: u64) -> Result<(Vec<Record>, u64), StoreError> {
        let records = self.query_rows(READ_AFTER, &[&load_id.as_str(), &(after_seq as i64)], record_row).await?;
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
        let claim = with.claim.cloned();
        self.append_in_tx(load_id, entries, expected_version, outbox, with.receipt, claim, now).await
    }

    async fn read_page(&self, load_id: &LoadId, after_seq: u64, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.query_rows(READ_PAGE, &[&load_id.as_str(), &(after_seq as i64), &sql_limit(limit)], record_row).await
    }

    async fn load_ids(&self, after: Option<&LoadId>, limit: usize) -> Result<Vec<LoadId>, StoreError> {
        let after = after.map(|a| a.as_str()).unwrap_or("");
        self.query_rows(LOAD_IDS, &[&after, &(limit as i64)], load_id_row).await
    }
}

impl PgStore {
    /// The append, and with `receipt` the ack of that message, in one transaction:
    /// a unit of a committer's batch (`group.rs`).
    #[allow(clippy::too_many_arguments)]
    async fn append_in_tx(
        &self,
        load_id: &LoadId,
        entries: Vec<NewEntry>,
        expected_version: u64,
        outbox: Vec<NewOutboxRow>,
        receipt: Option<&str>,
        claim: Option<ClaimWith>,
        now: Timestamp,
    ) -> Result<(u64, bool), AppendError> {
        check_keys_of_load(load_id, &outbox)?;
        let args = AppendArgs {
            load_id: load_id.clone(),
            entries,
            expected_version,
            outbox,
            receipt: receipt.map(str::to_owned),
            claim: claim.map(|c| (c.token, to_ms(c.lease_until))),
            now: to_ms(now),
        };
        self.group.append(args).await
    }
}

/// The row's lease when `token` is its claim on a pending row.
async fn owns(client: &deadpool_postgres::Object, id: &str, token: &str) -> Result<Option<i64>, ClaimError> {
    let row = client
        .query_opt(&client.prepare_cached(OUTBOX_OWNS).await.map_err(pg)?, &[&outbox_key_load(id), &id, &token])
        .await
        .map_err(pg)?;
    match row {
        Some(r) => Ok(col(&r, 0)?),
        None => Err(StaleClaimError { outbox_id: id.to_owned() }.into()),
    }
}

impl PgStore {
    /// `pending`, or `pending_after` when `after` is given.
    async fn claim_due(
        &self,
        limit: usize,
        now: Timestamp,
        lease: Duration,
        after: Option<&ClaimCursor>,
    ) -> Result<Vec<Claim>, StoreError> {
        let token = self.tokens.next();
        let (now, until, limit) = (to_ms(now), to_ms(add(now, lease)), limit as i64);
        let client = self.lease_client().await?;
        let rows = match after {
            None => rows_on(&client, OUTBOX_CLAIM, &[&token, &until, &now, &limit], outbox_row).await?,
            Some(after) => {
                let params: Params = &[&token, &until, &now, &limit, &to_ms(after.due_at), &after.id];
                rows_on(&client, OUTBOX_CLAIM_AFTER, params, outbox_row).await?
            }
        };
        Ok(claims(rows, &token))
    }
}

#[async_trait]
impl Outbox for PgStore {
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
        let client = self.client().await?;
        Ok(check_lease(id, owns(&client, id, token).await?, to_ms(now))?)
    }

    async fn mark_dispatched(&self, id: &str, token: &str, receipt: &str, now: Timestamp) -> Result<(), ClaimError> {
        let client = self.client().await?;
        let n = client
            .execute(
                &client.prepare_cached(OUTBOX_MARK_DISPATCHED).await.map_err(pg)?,
                &[&outbox_key_load(id), &id, &token, &receipt, &to_ms(now)],
            )
            .await
            .map_err(pg)?;
        if n == 1 { Ok(()) } else { Err(StaleClaimError { outbox_id: id.to_owned() }.into()) }
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
        let args = PublishMarkArgs {
            id: id.to_owned(),
            token: token.to_owned(),
            receipt: receipt.to_owned(),
            load_id: load_id.as_str().to_owned(),
            event_id: event_id.to_owned(),
            body: body.to_owned(),
            trace: trace_text(trace),
            now: to_ms(now),
        };
        self.group.publish_mark(args).await
    }

    async fn hold(
        &self,
        id: &str,
        token: &str,
        until: Timestamp,
        note: Option<&str>,
        now: Timestamp,
    ) -> Result<(), ClaimError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(OUTBOX_HOLD).await.map_err(pg)?;
        let params: Params = &[&outbox_key_load(id), &id, &token, &to_ms(until), &to_ms(now), &note];
        let n = client.execute(&stmt, params).await.map_err(pg)?;
        if n == 1 { Ok(()) } else { Err(StaleClaimError { outbox_id: id.to_owned() }.into()) }
    }

    async fn hold_all(&self, holds: &[(String, String, Timestamp)], now: Timestamp) -> Result<usize, StoreError> {
        if holds.len() > MAX_HOLDS {
            return Err(too_many("holds", holds.len(), MAX_HOLDS));
        }
        if holds.is_empty() {
            return Ok(0);
        }
        let loads: Vec<&str> = holds.iter().map(|(id, _, _)| outbox_key_load(id)).collect();
        let ids: Vec<&str> = holds.iter().map(|(id, _, _)| id.as_str()).collect();
        let tokens: Vec<&str> = holds.iter().map(|(_, token, _)| token.as_str()).collect();
        let untils: Vec<i64> = holds.iter().map(|(_, _, until)| to_ms(*until)).collect();
        let client = self.client().await?;
        let stmt = client.prepare_cached(OUTBOX_HOLD_ALL).await.map_err(pg)?;
        let n = client.execute(&stmt, &[&loads, &ids, &tokens, &untils, &to_ms(now)]).await.map_err(pg)?;
        Ok(n as usize)
    }

    async fn supersede(
        &self,
        id: &str,
        token: &str,
        ask_id: &str,
        step: u32,
        now: Timestamp,
    ) -> Result<Option<Superseded>, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(OUTBOX_SUPERSEDE).await.map_err(pg)?;
        let params: Params = &[&outbox_key_load(id), &id, &token, &ask_id, &i64::from(step), &to_ms(now)];
        let Some(row) = client.query_opt(&stmt, params).await.map_err(pg)? else { return Ok(None) };
        let by_was_due = col::<Option<i64>>(&row, 1)?.map(from_ms);
        Ok(Some(Superseded { by: col(&row, 0)?, by_was_due }))
    }

    async fn mark_failed(
        &self,
        id: &str,
        token: &str,
        failure: &str,
        retry_at: Option<Timestamp>,
        now: Timestamp,
    ) -> Result<(), ClaimError> {
        let client = self.client().await?;
        let (now, lid) = (to_ms(now), outbox_key_load(id));
        let n = match retry_at {
            Some(at) => {
                client
                    .execute(
                        &client.prepare_cached(OUTBOX_MARK_RETRY).await.map_err(pg)?,
                        &[&lid, &id, &token, &failure, &to_ms(at), &now],
                    )
                    .await
            }
            None => {
                client
                    .execute(
                        &client.prepare_cached(OUTBOX_MARK_DEAD).await.map_err(pg)?,
                        &[&lid, &id, &token, &failure, &now],
                    )
                    .await
            }
        }
        .map_err(pg)?;
        if n == 1 { Ok(()) } else { Err(StaleClaimError { outbox_id: id.to_owned() }.into()) }
    }

    async fn get(&self, id: &str) -> Result<Option<OutboxRow>, StoreError> {
        Ok(self.query_rows(OUTBOX_GET, &[&outbox_key_load(id), &id], outbox_row).await?.pop())
    }

    async fn rows_for_load(&self, load_id: &LoadId) -> Result<Vec<OutboxRow>, StoreError> {
        self.query_rows(OUTBOX_FOR_LOAD, &[&load_id.as_str()], outbox_row).await
    }

    async fn rows_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let params: Params = &[&load_id.as_str(), &to_ms(after.created_at), &after.id, &sql_limit(limit)];
        self.query_rows(OUTBOX_PAGE, params, outbox_row).await
    }

    async fn oldest_pending_created_at(&self) -> Result<Option<Timestamp>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(&client.prepare_cached(OUTBOX_OLDEST_PENDING).await.map_err(pg)?, &[])
            .await
            .map_err(pg)?;
        Ok(col::<Option<i64>>(&row, 0)?.map(from_ms))
    }

    async fn dead(&self, since: Timestamp, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.query_rows(OUTBOX_DEAD, &[&to_ms(since), &(limit as i64)], outbox_row).await
    }

    async fn dead_of_type(
        &self,
        action_type: ActionType,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        let params: Params = &[&action_type.as_str(), &to_ms(since), &sql_limit(limit)];
        self.query_rows(OUTBOX_DEAD_OF_TYPE, params, outbox_row).await
    }

    async fn mark_outcome_published(&self, id: &str, now: Timestamp) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                &client.prepare_cached(OUTBOX_MARK_OUTCOME_PUBLISHED).await.map_err(pg)?,
                &[&outbox_key_load(id), &id, &to_ms(now)],
            )
            .await
            .map_err(pg)?;
        Ok(())
    }

    async fn dead_without_outcome(&self, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        self.query_rows(OUTBOX_DEAD_WITHOUT_OUTCOME, &[&(limit as i64)], outbox_row).await
    }

    async fn unsettled_due(&self, now: Timestamp, limit: usize) -> Result<Vec<Unsettled>, StoreError> {
        self.query_rows(OUTBOX_UNSETTLED_DUE, &[&to_ms(now), &sql_limit(limit)], unsettled_row).await
    }

    async fn defer_settle(&self, id: &str, failure: &str, retry_at: Timestamp) -> Result<(), StoreError> {
        let client = self.client().await?;
        let params: Params = &[&outbox_key_load(id), &id, &to_ms(retry_at), &failure];
        client.execute(OUTBOX_DEFER_SETTLE, params).await.map_err(pg)?;
        Ok(())
    }

    async fn record_ops_alert(
        &self,
        alert: &Alert,
        state: AlertState,
        error: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(OPS_ALERT_RECORD).await.map_err(pg)?;
        let params: Params = &[
            &alert.outbox_id,
            &alert.load_id.as_str(),
            &alert.kind.as_str(),
            &alert.action_type.as_str(),
            &alert.failure,
            &state.as_str(),
            &error,
            &to_ms(now),
        ];
        Ok(client.query_opt(&stmt, params).await.map_err(pg)?.is_some())
    }

    async fn ops_alerts(&self, after: &RowCursor, limit: usize) -> Result<Vec<OpsAlertRecord>, StoreError> {
        let params: Params = &[&to_ms(after.created_at), &after.id, &sql_limit(limit)];
        self.query_rows(OPS_ALERT_PAGE, params, ops_alert_row).await
    }

    async fn count_by_status(&self, status: OutboxStatus) -> Result<u64, StoreError> {
        let sql = match status {
            OutboxStatus::Pending => OUTBOX_COUNT_PENDING,
            OutboxStatus::Dispatched => OUTBOX_COUNT_DISPATCHED,
            OutboxStatus::Dead => OUTBOX_COUNT_DEAD,
            OutboxStatus::Superseded => OUTBOX_COUNT_SUPERSEDED,
        };
        let client = self.client().await?;
        let row = client.query_one(&client.prepare_cached(sql).await.map_err(pg)?, &[]).await.map_err(pg)?;
        Ok(col::<i64>(&row, 0)? as u64)
    }
}

#[async_trait]
impl TimerStore for PgStore {
    async fn schedule_traced(
        &self,
        timer_id: &TimerId,
        fire_at: Timestamp,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let (load_id, _, _) = timer_id.parts();
        let client = self.client().await?;
        let (timers, loads, fire_at) = ([timer_id.as_str()], [load_id.as_str()], [to_ms(fire_at)]);
        let traces = [trace.map(|t| t.to_string())];
        let n = client
            .execute(
                &client.prepare_cached(TIMERS_SCHEDULE_ALL).await.map_err(pg)?,
                &[&&timers[..], &&loads[..], &&fire_at[..], &to_ms(now), &&traces[..]],
            )
            .await
            .map_err(pg)?;
        Ok(n == 1)
    }

    async fn cancel(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError> {
        let (load_id, _, _) = timer_id.parts();
        let client = self.client().await?;
        let (timers, loads) = ([timer_id.as_str()], [load_id.as_str()]);
        let n = client
            .execute(
                &client.prepare_cached(TIMERS_CANCEL_ALL).await.map_err(pg)?,
                &[&&timers[..], &&loads[..], &to_ms(now)],
            )
            .await
            .map_err(pg)?;
        Ok(n == 1)
    }

    async fn mark_fired(&self, timer_id: &TimerId, now: Timestamp) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(&client.prepare_cached(TIMER_MARK_FIRED).await.map_err(pg)?, &[&timer_id.as_str(), &to_ms(now)])
            .await
            .map_err(pg)?;
        Ok(n == 1)
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<Timer>, StoreError> {
        self.query_rows(TIMERS_DUE, &[&to_ms(now), &(limit as i64)], timer_row).await
    }

    async fn timers_for_load(&self, load_id: &LoadId) -> Result<Vec<Timer>, StoreError> {
        self.query_rows(TIMERS_FOR_LOAD, &[&load_id.as_str()], timer_row).await
    }

    async fn timers_for_load_page(
        &self,
        load_id: &LoadId,
        after: &RowCursor,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let params: Params = &[&load_id.as_str(), &to_ms(after.created_at), &after.id, &sql_limit(limit)];
        self.query_rows(TIMERS_PAGE, params, timer_row).await
    }

    async fn get_timer(&self, timer_id: &TimerId) -> Result<Option<Timer>, StoreError> {
        Ok(self.query_rows(TIMER_GET, &[&timer_id.as_str()], timer_row).await?.pop())
    }
}

#[async_trait]
impl LoadQueue for PgStore {
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
        Ok(self.group.publish(PublishArgs::new(load_id, event_id, body, trace, now, None)).await?.0)
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
        let receive = Some((self.tokens.next(), deadline_ms(now, visibility)));
        self.group.publish(PublishArgs::new(load_id, event_id, body, trace, now, receive)).await
    }

    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError> {
        let token = self.tokens.next();
        let (now, until) = (to_ms(now), deadline_ms(now, visibility));
        let params: Params = &[&now, &(max as i64), &until, &token];
        let mut out = rows_on(&self.lease_client().await?, QUEUE_RECEIVE, params, queue_message_row).await?;
        out.sort_by_key(|(id, _)| *id);
        Ok(out.into_iter().map(|(_, m)| m).collect())
    }

    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        if !ack_in::<QueueError>(&tx, receipt, to_ms(now)).await.map_err(Fail::into_err)? {
            // Rolled back here, not on drop: the head's lock is then gone before the
            // caller goes on (a receive on another session would skip the load).
            tx.rollback().await.map_err(pg)?;
            return Err(QueueError::StaleReceipt(receipt.to_owned()));
        }
        tx.commit().await.map_err(pg)?;
        Ok(())
    }

    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        let stale = || QueueError::StaleReceipt(receipt.to_owned());
        let id = parse_receipt(receipt).ok_or_else(stale)?;
        let visible_at = deadline_ms(now, delay);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let load_id = lock_head::<QueueError>(&tx, id).await.map_err(Fail::into_err)?.ok_or_else(stale)?;
        let n = tx.execute(&tx.prepare_cached(QUEUE_NACK).await.map_err(pg)?, &[&id, &receipt]).await.map_err(pg)?;
        if n != 1 {
            // As in `ack`: the head's lock released before the answer.
            tx.rollback().await.map_err(pg)?;
            return Err(stale());
        }
        tx.execute(&tx.prepare_cached(QUEUE_HEAD_DELAY).await.map_err(pg)?, &[&load_id, &visible_at])
            .await
            .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(())
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let row = client.query_one(&client.prepare_cached(QUEUE_DEPTH).await.map_err(pg)?, &[]).await.map_err(pg)?;
        Ok(col::<i64>(&row, 0)? as u64)
    }

    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        match client
            .query_opt(&client.prepare_cached(QUEUE_PUBLISHED_BODY).await.map_err(pg)?, &[&load_id.as_str(), &event_id])
            .await
            .map_err(pg)?
        {
            Some(row) => Ok(Some(col(&row, 0)?)),
            None => Ok(None),
        }
    }
}

/// A session-level advisory lock held on one pooled connection for the run.
struct PgLease {
    client: Option<deadpool_postgres::Object>,
    key: i64,
}

#[async_trait]
impl LoadLease for PgLease {
    async fn release(mut self: Box<Self>) -> Result<(), StoreError> {
        let Some(client) = self.client.take() else { return Ok(()) };
        match client.execute("SELECT pg_advisory_unlock($1)", &[&self.key]).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // The session may still hold the lock: close it rather than pool it.
                drop(deadpool_postgres::Object::take(client));
                Err(pg(e))
            }
        }
    }
}

impl Drop for PgLease {
    fn drop(&mut self) {
        // Dropped without release (a cancelled run): close the connection, which ends
        // the session and so the lock, instead of returning a locked session to the pool.
        if let Some(client) = self.client.take() {
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

#[async_trait]
impl LoadLock for PgStore {
    async fn try_lock(
        &self,
        load_id: &LoadId,
        _ttl: Duration,
        _now: Timestamp,
    ) -> Result<Option<Box<dyn LoadLease>>, StoreError> {
        let client = self.client().await?;
        // Advisory locks are database-wide: the schema is in the key, so two haul
        // deployments (or two tests) sharing a database never hold each other's loads.
        let row = client
            .query_one(
                "WITH k AS (SELECT hashtextextended('haul:load:' || current_schema() || '/' || $1, 0) AS key)
                 SELECT key, pg_try_advisory_lock(key) FROM k",
                &[&load_id.as_str()],
            )
            .await
            .map_err(pg)?;
        let (key, got): (i64, bool) = (col(&row, 0)?, col(&row, 1)?);
        Ok(got.then(|| Box::new(PgLease { client: Some(client), key }) as Box<dyn LoadLease>))
    }
}

#[async_trait]
impl DeliveryLog for PgStore {
    async fn record_delivery(
        &self,
        channel: &str,
        key: &str,
        load_id: &LoadId,
        payload: &serde_json::Value,
        now: Timestamp,
    ) -> Result<(String, bool), StoreError> {
        let client = self.client().await?;
        let payload = payload.to_string();
        // The no-op update makes the conflicting row come back (and waits for a racing
        // insert of the same key), so every caller gets the first receipt.
        let row = client
            .query_one(
                "INSERT INTO deliveries (channel, key, load_id, payload, created_at) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (channel, key) DO UPDATE SET channel = deliveries.channel
                 RETURNING id, (xmax = 0) AS inserted",
                &[&channel, &key, &load_id.as_str(), &payload, &to_ms(now)],
            )
            .await
            .map_err(pg)?;
        Ok((delivery_receipt(col(&row, 0)?), col(&row, 1)?))
    }

    async fn deliveries(&self, load_id: Option<&LoadId>, limit: usize) -> Result<Vec<RecordedDelivery>, StoreError> {
        let load_id = load_id.map(|l| l.as_str());
        self.query_rows(
            concat!(
                "SELECT ",
                columns!(delivery),
                " FROM deliveries WHERE $1::text IS NULL OR load_id = $1 ORDER BY id LIMIT $2"
            ),
            &[&load_id, &(limit as i64)],
            delivery_row,
        )
        .await
    }
}

/// A take's answer as the store returned it (`last_granted`, `tat_us`) at `now_us`.
fn grant(limit: &Limit, granted: i64, tat_us: i64, now_us: i64) -> Result<Grant, StoreError> {
    let granted = u32::try_from(granted).map_err(|_| StoreError::new(format!("a take granted {granted} sends")))?;
    Ok(Grant::kept(limit, granted, tat_us, now_us))
}

#[async_trait]
impl SendRates for PgStore {
    async fn take_sends(&self, key: &str, limit: &Limit, wanted: u32, now: Timestamp) -> Result<Grant, StoreError> {
        let (now, interval, tolerance) = (to_us(now), limit.rate.interval_us(), limit.tolerance_us());
        let client = self.client().await?;
        let stmt = client.prepare_cached(SEND_RATE_TAKE).await.map_err(pg)?;
        let row =
            client.query_one(&stmt, &[&key, &now, &interval, &tolerance, &i64::from(wanted)]).await.map_err(pg)?;
        grant(limit, col(&row, 0)?, col(&row, 1)?, now)
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
        if takes.is_empty() {
            return Ok(ClaimedTaking { claims: self.claim_due(max, now, lease, after).await?, grants: vec![] });
        }
        let token = self.tokens.next();
        let (now_us, until, now, limit) = (to_us(now), to_ms(add(now, lease)), to_ms(now), max as i64);
        let (mut types, mut keys, mut intervals, mut tolerances) = (vec![], vec![], vec![], vec![]);
        for take in takes {
            for t in &take.action_types {
                types.push(t.as_str());
                keys.push(take.key.as_str());
                intervals.push(take.limit.rate.interval_us());
                tolerances.push(take.limit.tolerance_us());
            }
        }
        let client = self.lease_client().await?;
        let rows = match after {
            None => {
                let params: Params = &[&token, &until, &now, &limit, &types, &keys, &intervals, &tolerances, &now_us];
                let stmt = client.prepare_cached(OUTBOX_CLAIM_TAKING).await.map_err(pg)?;
                client.query(&stmt, params).await.map_err(pg)?
            }
            Some(after) => {
                let (due_at, id) = (to_ms(after.due_at), &after.id);
                let params: Params =
                    &[&token, &until, &now, &limit, &due_at, id, &types, &keys, &intervals, &tolerances, &now_us];
                let stmt = client.prepare_cached(OUTBOX_CLAIM_AFTER_TAKING).await.map_err(pg)?;
                client.query(&stmt, params).await.map_err(pg)?
            }
        };
        // The claimed rows, then one row of no outbox columns with the grants.
        let mut claimed: Vec<OutboxRow> = Vec::with_capacity(rows.len());
        let mut took: HashMap<String, (i64, i64)> = HashMap::new();
        for r in &rows {
            if col::<Option<String>>(r, 0)?.is_some() {
                claimed.push(outbox_row(&PgRow(r))?);
                continue;
            }
            let (keys, granted, tats): (Option<Vec<String>>, Option<Vec<i64>>, Option<Vec<i64>>) =
                (col(r, 15)?, col(r, 16)?, col(r, 17)?);
            let (keys, granted, tats) =
                (keys.unwrap_or_default(), granted.unwrap_or_default(), tats.unwrap_or_default());
            took = keys.into_iter().zip(granted.into_iter().zip(tats)).collect();
        }
        let mut grants = Vec::with_capacity(takes.len());
        for take in takes {
            grants.push(match (counted(&claimed, take), took.get(&take.key)) {
                (0, _) => None,
                (n, Some(&(granted, tat_us))) => Some((n, grant(&take.limit, granted, tat_us, now_us)?)),
                (n, None) => {
                    return Err(StoreError::new(format!("a claim counted {n} sends on {} but took none", take.key)));
                }
            });
        }
        Ok(ClaimedTaking { claims: claims(claimed, &token), grants })
    }

    async fn queue_sends(&self, key: &str, from_us: i64, spacing_us: i64, n: u32) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SEND_QUEUE_JOIN).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&key, &from_us, &spacing_us, &i64::from(n.max(1))]).await.map_err(pg)?;
        Ok(col(&row, 0)?)
    }

    async fn requeue_held(
        &self,
        rate_key: &str,
        action_types: &[ActionType],
        now: Timestamp,
    ) -> Result<u64, StoreError> {
        let queues = format!("{rate_key}|");
        let types: Vec<&str> = action_types.iter().map(|t| t.as_str()).collect();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute(&tx.prepare_cached(SEND_QUEUES_FORGET).await.map_err(pg)?, &[&queues]).await.map_err(pg)?;
        let pause_key = haul_core::limit::pause_key(rate_key);
        tx.execute(&tx.prepare_cached(SEND_RATE_AFRESH).await.map_err(pg)?, &[&rate_key, &to_us(now), &pause_key])
            .await
            .map_err(pg)?;
        let n = tx
            .execute(&tx.prepare_cached(OUTBOX_REQUEUE_HELD).await.map_err(pg)?, &[&to_ms(now), &types])
            .await
            .map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(n)
    }

    async fn take_slots(
        &self,
        key: &str,
        cap: u32,
        sends: &[(String, String)],
        until: Timestamp,
        now: Timestamp,
    ) -> Result<Vec<String>, StoreError> {
        let (ids, tokens): (Vec<&str>, Vec<&str>) = sends.iter().map(|(i, t)| (i.as_str(), t.as_str())).unzip();
        let (until, now, cap) = (to_us(until), to_us(now), i64::from(cap));
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        tx.execute(&tx.prepare_cached(SEND_SLOTS_LOCK).await.map_err(pg)?, &[&key]).await.map_err(pg)?;
        tx.execute(&tx.prepare_cached(SEND_SLOTS_EXPIRE).await.map_err(pg)?, &[&key, &now]).await.map_err(pg)?;
        let retake = tx.prepare_cached(SEND_SLOTS_RETAKE).await.map_err(pg)?;
        let mut rows = tx.query(&retake, &[&key, &ids, &tokens, &until]).await.map_err(pg)?;
        let take = tx.prepare_cached(SEND_SLOTS_TAKE).await.map_err(pg)?;
        rows.extend(tx.query(&take, &[&key, &ids, &tokens, &until, &cap]).await.map_err(pg)?);
        tx.commit().await.map_err(pg)?;
        let granted = rows.iter().map(|r| col::<String>(r, 0)).collect::<Result<Vec<_>, _>>()?;
        Ok(haul_store::backend::in_order_of(sends, granted))
    }

    async fn free_slots(&self, key: &str, sends: &[(String, String)]) -> Result<(), StoreError> {
        let (ids, tokens): (Vec<&str>, Vec<&str>) = sends.iter().map(|(i, t)| (i.as_str(), t.as_str())).unzip();
        let client = self.client().await?;
        let stmt = client.prepare_cached(SEND_SLOTS_FREE).await.map_err(pg)?;
        client.execute(&stmt, &[&key, &ids, &tokens]).await.map_err(pg)?;
        Ok(())
    }

    async fn queue_tails(&self, keys: &[String]) -> Result<Vec<(String, i64)>, StoreError> {
        self.query_rows(SEND_QUEUE_TAILS, &[&keys], |r: &dyn Columns| Ok((r.string(0)?, r.i64(1)?))).await
    }

    async fn unqueue_send(&self, key: &str, slot_us: i64, spacing_us: i64) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SEND_QUEUE_GIVE_BACK).await.map_err(pg)?;
        Ok(client.execute(&stmt, &[&key, &slot_us, &spacing_us]).await.map_err(pg)? == 1)
    }

    async fn pause_sends(&self, key: &str, limit: &Limit, until: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        let client = self.client().await?;
        let tat = haul_core::limit::paused(limit, None, to_us(until));
        let stmt = client.prepare_cached(SEND_RATE_PAUSE).await.map_err(pg)?;
        client.execute(&stmt, &[&key, &tat, &to_us(now), &haul_core::limit::pause_key(key)]).await.map_err(pg)?;
        Ok(())
    }

    async fn saturated(&self, since: Timestamp) -> Result<Vec<(String, Timestamp)>, StoreError> {
        self.query_rows(SEND_RATES_SATURATED, &[&to_us(since)], saturated_row).await
    }

    async fn change_rate(&self, change: &RateChange) -> Result<(RateChange, bool), StoreError> {
        let client = self.client().await?;
        let c = change;
        let (rate, burst) = (c.limit.map(|l| l.rate.to_string()), c.limit.map(|l| i64::from(l.burst)));
        let stmt = client.prepare_cached(RATE_CHANGE_INSERT).await.map_err(pg)?;
        let params: Params = &[&c.request_id, &c.channel, &rate, &burst, &c.actor, &c.reason, &to_ms(c.changed_at)];
        let made = client.execute(&stmt, params).await.map_err(pg)? == 1;
        let mut rows = self.query_rows(RATE_CHANGE_GET, &[&c.request_id], rate_change_row).await?;
        let kept = rows.pop().ok_or_else(|| StoreError::new("a rate change was recorded and then not found"))?;
        Ok((kept, made))
    }

    async fn current_rates(&self) -> Result<Vec<RateChange>, StoreError> {
        self.query_rows(RATE_CHANGES_CURRENT, &[], rate_change_row).await
    }

    async fn rate_changes(&self, limit: usize) -> Result<Vec<RateChange>, StoreError> {
        self.query_rows(RATE_CHANGES_LATEST, &[&sql_limit(limit)], rate_change_row).await
    }
}

#[async_trait]
impl LoadIndex for PgStore {
    async fn loads_by_phone(&self, phone: &str) -> Result<Vec<LoadId>, StoreError> {
        self.query_rows(
            "SELECT load_id FROM load_facts WHERE driver_phone = $1 AND active ORDER BY load_id LIMIT 100",
            &[&phone],
            load_id_row,
        )
        .await
    }

    async fn clients_of(&self, load_ids: &[LoadId]) -> Result<Vec<(LoadId, String)>, StoreError> {
        let ids: Vec<&str> = load_ids.iter().take(MAX_CLIENTS_OF).map(LoadId::as_str).collect();
        self.query_rows(LOAD_CLIENTS, &[&ids], load_client_row).await
    }

    async fn record_consent(&self, c: &SmsConsent) -> Result<(), StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(CONSENT_SET).await.map_err(pg)?;
        let (opted_out, load_id) = (i32::from(c.opted_out), c.load_id.as_ref().map(LoadId::as_str));
        let params: Params = &[&c.phone, &opted_out, &c.event_id, &load_id, &to_ms(c.changed_at)];
        client.execute(&stmt, params).await.map_err(pg)?;
        Ok(())
    }

    async fn opted_out_among(&self, phones: &[String]) -> Result<Vec<SmsConsent>, StoreError> {
        let phones = &phones[..phones.len().min(MAX_CONSENT_ASKED)];
        self.query_rows(CONSENT_OPTED_OUT_AMONG, &[&phones], sms_consent_row).await
    }

    async fn record_sms_report(&self, r: &SmsReport) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SMS_REPORT_RECORD).await.map_err(pg)?;
        let (outbox_id, load_id) = (r.outbox_id.as_deref().unwrap_or_default(), r.load_id.as_ref().map(LoadId::as_str));
        let params: Params =
            &[&r.message_sid, &r.status, &r.error_code, &outbox_id, &load_id, &r.reason, &to_ms(r.reported_at)];
        Ok(client.execute(&stmt, params).await.map_err(pg)? == 1)
    }

    async fn sms_reports_for_load(&self, load_id: &LoadId, limit: usize) -> Result<Vec<SmsReport>, StoreError> {
        self.query_rows(SMS_REPORTS_OF_LOAD, &[&load_id.as_str(), &sql_limit(limit)], sms_report_row).await
    }

    async fn unmatched_sms_reports(&self, limit: usize) -> Result<Vec<SmsReport>, StoreError> {
        self.query_rows(SMS_REPORTS_UNMATCHED, &[&sql_limit(limit)], sms_report_row).await
    }

    async fn record_unmatched_sms(&self, sms: &UnmatchedSms) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(UNMATCHED_SMS_RECORD).await.map_err(pg)?;
        let received_at = to_ms(sms.received_at);
        let params: Params = &[&sms.message_sid, &sms.from, &sms.to, &sms.body, &received_at, &sms.reason];
        Ok(client.execute(&stmt, params).await.map_err(pg)? == 1)
    }

    async fn claim_message_sid(
        &self,
        message_sid: &str,
        route: &SmsRoute,
        now: Timestamp,
    ) -> Result<SidClaim, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(MESSAGE_SID_CLAIM).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&message_sid, &sms_route_load(route), &to_ms(now)]).await.map_err(pg)?;
        if col::<bool>(&row, 1)? {
            return Ok(SidClaim::New);
        }
        Ok(SidClaim::Taken(sms_route(col(&row, 0)?)?))
    }

    async fn assign_unmatched_sms(
        &self,
        message_sid: &str,
        load_id: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsAssignment, StoreError> {
        let client = self.client().await?;
        let assign = client.prepare_cached(UNMATCHED_SMS_ASSIGN).await.map_err(pg)?;
        client.execute(&assign, &[&message_sid, &load_id.as_str(), &event_id, &to_ms(now)]).await.map_err(pg)?;
        let read = client.prepare_cached(UNMATCHED_SMS_ASSIGNED).await.map_err(pg)?;
        match client.query_opt(&read, &[&message_sid]).await.map_err(pg)? {
            Some(row) => sms_assignment(&PgRow(&row), load_id, event_id),
            None => Ok(SmsAssignment::NotFound),
        }
    }

    async fn move_assigned_sms(
        &self,
        message_sid: &str,
        to: &LoadId,
        event_id: &str,
        now: Timestamp,
    ) -> Result<SmsMove, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // The row's lock first: a racing move of the same SMS (a retry of this request
        // too) waits here, then sees the move the other committed.
        let Some(row) = tx
            .query_opt(&tx.prepare_cached(UNMATCHED_SMS_LOCK).await.map_err(pg)?, &[&message_sid])
            .await
            .map_err(pg)?
        else {
            return Ok(SmsMove::NotFound);
        };
        let before = tx
            .query_opt(&tx.prepare_cached(SMS_MOVED_BEFORE).await.map_err(pg)?, &[&message_sid, &event_id])
            .await
            .map_err(pg)?;
        let moved_before: Option<String> = before.map(|r| col(&r, 0)).transpose()?;
        let (from, sms) = match sms_move_step(&PgRow(&row), moved_before.as_deref(), to, event_id)? {
            Ok(answer) => return Ok(answer),
            Err(moving) => moving,
        };
        let now = to_ms(now);
        tx.execute(
            &tx.prepare_cached(UNMATCHED_SMS_MOVE).await.map_err(pg)?,
            &[&message_sid, &to.as_str(), &event_id, &now],
        )
        .await
        .map_err(pg)?;
        let record = tx.prepare_cached(SMS_MOVE_RECORD).await.map_err(pg)?;
        tx.execute(&record, &[&message_sid, &event_id, &from.as_str(), &to.as_str(), &now]).await.map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        Ok(SmsMove::Moved { from, sms })
    }

    async fn unmatched_sms(&self, limit: usize) -> Result<Vec<UnmatchedSms>, StoreError> {
        self.query_rows(UNMATCHED_SMS_LIST, &[&sql_limit(limit)], unmatched_sms_row).await
    }
}

/// A position in epoch milliseconds and id; `default` when there is none.
fn position(cursor: Option<&RowCursor>, default: i64) -> (i64, String) {
    cursor.map_or((default, String::new()), |c| (to_ms(c.created_at), c.id.clone()))
}

#[async_trait]
impl OpsQueries for PgStore {
    async fn oldest_due_timer(&self, now: Timestamp) -> Result<Option<Timestamp>, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(TIMERS_OLDEST_DUE).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&to_ms(now)]).await.map_err(pg)?;
        Ok(col::<Option<i64>>(&row, 0)?.map(from_ms))
    }

    async fn loads_page(
        &self,
        filter: &LoadFilter,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<LoadsPage, StoreError> {
        let after = after.map_or("", |a| a.as_str());
        let client = self.client().await?;
        let stmt = client.prepare_cached(LOADS_SCAN_END).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&after, &sql_limit(LOADS_SCANNED_PER_PAGE)]).await.map_err(pg)?;
        let (Some(upto), scanned) = (col::<Option<String>>(&row, 0)?, col::<i64>(&row, 1)?) else {
            return Ok(LoadsPage { loads: vec![], next_after: None });
        };
        let ms = |t: Option<Timestamp>| t.map(to_ms);
        let stmt = client.prepare_cached(LOADS_PAGE).await.map_err(pg)?;
        let rows = client
            .query(
                &stmt,
                &[
                    &after,
                    &upto,
                    &filter.stage,
                    &filter.open_asks,
                    &filter.escalated,
                    &ms(filter.active_before),
                    &ms(filter.active_since),
                    &filter.has_dead,
                    &ms(filter.pending_created_by),
                    &ms(filter.timer_due_by),
                    &sql_limit(limit),
                ],
            )
            .await
            .map_err(pg)?;
        let loads = rows.iter().map(|r| load_summary_row(&PgRow(r))).collect::<Result<Vec<_>, _>>()?;
        let next_after = haul_store::backend::next_loads_cursor(&loads, limit, &upto, scanned as usize)?;
        Ok(LoadsPage { loads, next_after })
    }

    async fn dead_rows_page(
        &self,
        types: &[ActionType],
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<DeadRow>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        let params: Params = &[&types_param(types), &at, &id, &sql_limit(limit), &state_param(state)];
        self.query_rows(OUTBOX_DEAD_PAGE, params, dead_row).await
    }

    async fn overdue_timers_page(
        &self,
        due_by: Timestamp,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError> {
        let (at, id) = position(after, i64::MIN);
        self.query_rows(TIMERS_OVERDUE_PAGE, &[&to_ms(due_by), &at, &id, &sql_limit(limit)], timer_row).await
    }

    async fn unmatched_sms_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxSms>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        self.query_rows(UNMATCHED_SMS_PAGE, &[&at, &id, &sql_limit(limit), &state_param(state)], inbox_sms_row).await
    }

    async fn opted_out_page(&self, before: Option<&RowCursor>, limit: usize) -> Result<Vec<SmsConsent>, StoreError> {
        let (at, phone) = position(before, i64::MAX);
        self.query_rows(CONSENT_OPTED_OUT_PAGE, &[&at, &phone, &sql_limit(limit)], sms_consent_row).await
    }

    async fn ops_alerts_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxAlert>, StoreError> {
        let (at, id) = position(before, i64::MAX);
        self.query_rows(OPS_ALERTS_NEWEST, &[&at, &id, &sql_limit(limit), &state_param(state)], inbox_alert_row).await
    }

    async fn inbox_counts(&self, bound: usize) -> Result<InboxCounts, StoreError> {
        let bound = sql_limit(bound);
        let dead = self.query_rows(INBOX_DEAD_COUNTS, &[&bound], type_count_row).await?;
        let count = async |sql: &'static str| -> Result<u64, StoreError> {
            let n = self.query_rows(sql, &[&bound], |r| Ok(r.i64(0)?)).await?;
            Ok(n.first().copied().unwrap_or(0).max(0) as u64)
        };
        Ok(InboxCounts { dead, alerts: count(INBOX_ALERTS_COUNT).await?, unmatched: count(INBOX_SMS_COUNT).await? })
    }

    async fn unmatched_sms_one(&self, message_sid: &str) -> Result<Option<InboxSms>, StoreError> {
        Ok(self.query_rows(UNMATCHED_SMS_ONE, &[&message_sid], inbox_sms_row).await?.into_iter().next())
    }

    async fn dismiss_unmatched_sms(
        &self,
        message_sid: &str,
        by: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<SmsDismissal, StoreError> {
        let client = self.client().await?;
        let dismiss = client.prepare_cached(UNMATCHED_SMS_DISMISS).await.map_err(pg)?;
        if client.execute(&dismiss, &[&message_sid, &by, &reason, &to_ms(now)]).await.map_err(pg)? == 1 {
            return Ok(SmsDismissal::Dismissed);
        }
        let read = client.prepare_cached(UNMATCHED_SMS_ONE).await.map_err(pg)?;
        match client.query_opt(&read, &[&message_sid]).await.map_err(pg)? {
            Some(row) => sms_dismissal(&inbox_sms_row(&PgRow(&row))?),
            None => Ok(SmsDismissal::NotFound),
        }
    }

    async fn record_conflict(&self, load_id: &LoadId, now: Timestamp) -> Result<(), StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(LOAD_CONFLICT_COUNT).await.map_err(pg)?;
        client.execute(&stmt, &[&load_id.as_str(), &to_ms(now)]).await.map_err(pg)?;
        Ok(())
    }

    async fn conflict_loads(&self, limit: usize) -> Result<Vec<ConflictLoad>, StoreError> {
        self.query_rows(LOADS_MOST_CONFLICTS, &[&sql_limit(limit)], conflict_load_row).await
    }
}

#[async_trait]
impl ShadowStore for PgStore {
    async fn record_shadow(&self, d: &ShadowDecision) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(SHADOW_RECORD).await.map_err(pg)?;
        let p = shadow_params(d);
        let params: Params = &[&p.0, &p.1, &p.2, &p.3, &p.4, &p.5, &p.6, &p.7, &p.8, &p.9, &p.10, &p.11];
        Ok(client.query_opt(&stmt, params).await.map_err(pg)?.is_some())
    }

    async fn shadow_page(
        &self,
        load_id: &LoadId,
        after: &ShadowCursor,
        limit: usize,
    ) -> Result<Vec<ShadowDecision>, StoreError> {
        let params: Params = &[&load_id.as_str(), &(after.event_seq as i64), &after.shadow, &sql_limit(limit)];
        self.query_rows(SHADOW_PAGE, params, shadow_row).await
    }
}

#[async_trait]
impl SpendLedger for PgStore {
    async fn client_day_spend(&self, client: &str, day: &str) -> Result<ClientDaySpend, StoreError> {
        let rows = self.query_rows(SPEND_OF_CLIENT_DAY, &[&client, &day], llm_spend_row).await?;
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
        let params: Params = &[&from_day, &to_day, &client, &after_day, &after_client, &sql_limit(limit)];
        self.query_rows(SPEND_PAGE, params, llm_spend_row).await
    }

    async fn prompt(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(PROMPT_TEXT).await.map_err(pg)?;
        let row = client.query_opt(&stmt, &[&hash]).await.map_err(pg)?;
        Ok(row.map(|r| col::<String>(&r, 0)).transpose()?)
    }
}

#[async_trait]
impl EdgeStore for PgStore {
    async fn console_secret(&self, candidate: &[u8; 32], now: Timestamp) -> Result<[u8; 32], StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(CONSOLE_SECRET).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&console_secret_hex(candidate), &to_ms(now)]).await.map_err(pg)?;
        console_secret_from_hex(&col::<String>(&row, 0)?)
    }

    async fn revoke_session(&self, nonce: &str, expires_at: Timestamp, now: Timestamp) -> Result<(), StoreError> {
        let client = self.client().await?;
        let expire = client.prepare_cached(CONSOLE_REVOKED_EXPIRE).await.map_err(pg)?;
        client.execute(&expire, &[&to_ms(now)]).await.map_err(pg)?;
        let revoke = client.prepare_cached(CONSOLE_REVOKE).await.map_err(pg)?;
        client.execute(&revoke, &[&nonce, &to_ms(expires_at)]).await.map_err(pg)?;
        Ok(())
    }

    async fn session_revoked(&self, nonce: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(CONSOLE_REVOKED).await.map_err(pg)?;
        Ok(col(&client.query_one(&stmt, &[&nonce]).await.map_err(pg)?, 0)?)
    }

    async fn claim_operator_request(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<RequestClaim, StoreError> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(OPERATOR_REQUEST_CLAIM).await.map_err(pg)?;
        let row = client.query_one(&stmt, &[&load_id.as_str(), &event_id, &body, &to_ms(now)]).await.map_err(pg)?;
        if col::<bool>(&row, 1)? {
            return Ok(RequestClaim::New);
        }
        Ok(if col::<String>(&row, 0)? == body { RequestClaim::Same } else { RequestClaim::Other })
    }
}

#[async_trait]
impl Prune for PgStore {
    async fn prune(&self, older_than: Timestamp, batch_limit: usize) -> Result<PruneReport, StoreError> {
        let (cutoff, limit) = (to_ms(older_than), i64::try_from(batch_limit).unwrap_or(i64::MAX));
        let client = self.client().await?;
        // One statement (and so one short transaction) per table: a batch holds its
        // row locks only while it deletes them.
        let run = async |sql: &str| -> Result<u64, StoreError> {
            let stmt = client.prepare_cached(sql).await.map_err(pg)?;
            client.execute(&stmt, &[&cutoff, &limit]).await.map_err(pg)
        };
        Ok(PruneReport {
            outbox: run(PRUNE_OUTBOX).await?,
            timers: run(PRUNE_TIMERS).await?,
            queue: run(PRUNE_QUEUE).await? + run(PRUNE_OPERATOR_REQUESTS).await?,
            shadow: run(PRUNE_SHADOW).await?,
            reports: run(PRUNE_SMS_REPORTS).await?,
        })
    }
}
