//! Operator requests made into `operator_action` events (docs/design.md, "Operator
//! actions"): what `POST /v1/operator/*`, `haul operator …`, the evals and the
//! simulator share.
//!
//! A request never writes a log or an outbox row. It reads what the event must carry
//! (a dead row's action, an unmatched SMS), builds the event under the id its request
//! id gives (`op:{request id}`), and publishes it to the load's queue; the load worker
//! appends it with its decision (`haul_core::operator`). A retried request publishes
//! the same event, which the queue and the log deduplicate: it does nothing twice.

use std::collections::HashMap;
use std::time::Duration;

use haul_core::action::{Action, ActionType};
use haul_core::decision::Decision;
use haul_core::event::{OperatorAction, OperatorCommand};
use haul_core::ids::{AskId, EventId, LoadId, check_request_id};
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_core::{BadInput, EventBody, InboundEvent};
use haul_store::{
    EdgeStore, OutboxRow, OutboxStatus, Published, RequestClaim, SmsAssignment, SmsDismissal, SmsMove, Store,
    StoreError, UnmatchedSms,
};
use serde::{Deserialize, Serialize};

use crate::queue::EventQueue;

/// Most rows one bulk requeue takes (and its default).
pub const MAX_BULK_ROWS: usize = 100;

/// Who asks, why, and the request id that names the action for good.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requester {
    /// `[A-Za-z0-9_.-]{1,64}`, chosen by the caller; the same id again is the same
    /// request (a retry), answered `duplicate`.
    pub request_id: String,
    pub actor: String,
    pub reason: String,
    /// The request's trace context: the action's run continues it.
    pub trace: Option<TraceParent>,
}

/// Why a request was refused. Nothing was published.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("{}", .0.message)]
    BadInput(BadInput),
    #[error("no outbox row {0}")]
    NoSuchRow(String),
    #[error("load {0} has no records: an operator action never makes a load (is the load id right?)")]
    NoSuchLoad(LoadId),
    #[error("outbox row {id} is {status}: only a dead row is requeued or dismissed")]
    NotDead { id: String, status: &'static str },
    #[error("no unmatched SMS has MessageSid {0}")]
    NoSuchSms(String),
    #[error("SMS {message_sid} was assigned to load {load_id} by {event_id} already")]
    SmsAssigned { message_sid: String, load_id: LoadId, event_id: String },
    #[error("SMS {0} is not assigned to a load: assign it instead")]
    SmsNotAssigned(String),
    #[error("SMS {message_sid} was dismissed by {by}: it goes to no load")]
    SmsDismissed { message_sid: String, by: String },
    #[error("request id {request_id} was already used for another operator action on load {load_id}")]
    RequestIdReused { request_id: String, load_id: LoadId },
    #[error("request id {0} was already used for another rate change")]
    RateRequestReused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OperatorError {
    /// The error code of docs/api.md.
    pub fn code(&self) -> &str {
        match self {
            OperatorError::BadInput(e) => e.code,
            OperatorError::NoSuchRow(_) => "no_such_row",
            OperatorError::NoSuchLoad(_) => "no_such_load",
            OperatorError::NotDead { .. } => "not_dead",
            OperatorError::NoSuchSms(_) => "no_such_sms",
            OperatorError::SmsAssigned { .. } => "sms_assigned",
            OperatorError::SmsDismissed { .. } => "sms_dismissed",
            OperatorError::SmsNotAssigned(_) => "sms_not_assigned",
            OperatorError::RequestIdReused { .. } | OperatorError::RateRequestReused(_) => "request_id_reused",
            OperatorError::Store(_) => "store_unavailable",
        }
    }

    /// The HTTP status it answers with.
    pub fn status(&self) -> u16 {
        match self {
            OperatorError::BadInput(_) => 400,
            OperatorError::NoSuchRow(_) | OperatorError::NoSuchLoad(_) | OperatorError::NoSuchSms(_) => 404,
            OperatorError::NotDead { .. }
            | OperatorError::SmsAssigned { .. }
            | OperatorError::SmsDismissed { .. }
            | OperatorError::SmsNotAssigned(_) => 409,
            OperatorError::RequestIdReused { .. } | OperatorError::RateRequestReused(_) => 422,
            OperatorError::Store(_) => 503,
        }
    }
}

impl From<BadInput> for OperatorError {
    fn from(e: BadInput) -> Self {
        OperatorError::BadInput(e)
    }
}

/// An operator event on its load's queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Queued {
    pub load_id: LoadId,
    pub event_id: EventId,
    /// `queued`, or `duplicate` when this request was made before.
    pub status: &'static str,
}

impl Queued {
    pub fn is_new(&self) -> bool {
        self.status == "queued"
    }
}

/// The event `who` asks for on `load_id`, checked as one from an operator is.
fn event(
    load_id: &LoadId,
    event_id: &EventId,
    who: &Requester,
    command: OperatorCommand,
) -> Result<InboundEvent, OperatorError> {
    let body =
        EventBody::OperatorAction(OperatorAction { actor: who.actor.clone(), reason: who.reason.clone(), command });
    let draft = InboundEvent { load_id: load_id.clone(), event_id: event_id.clone(), body };
    // The same checks as an operator_action posted to the ingestion route.
    Ok(InboundEvent::from_operator(load_id.clone(), draft.to_json())?)
}

/// Refuses a MessageSid out of Twilio's form before anything is read or taken.
fn check_message_sid(message_sid: &str) -> Result<(), OperatorError> {
    if !haul_core::ids::is_message_sid(message_sid) {
        return Err(BadInput::new("bad_message_sid", "MessageSid is not of the form [A-Za-z0-9]{1,64}").into());
    }
    Ok(())
}

/// Refuses a load with no records: a mistyped load id must not make a new load (with
/// a Hero task for an SMS nobody expects) and take the SMS from the right one.
async fn load_exists(store: &dyn Store, load_id: &LoadId) -> Result<(), OperatorError> {
    if store.read_page(load_id, 0, 1).await?.is_empty() {
        return Err(OperatorError::NoSuchLoad(load_id.clone()));
    }
    Ok(())
}

/// Takes the operator request `event` stands for in the store (its load, event id and
/// body): whatever the load queue, a request id reused for another action is found
/// here (SQS FIFO answers a reused id as new and then drops it).
pub async fn claim(store: &dyn EdgeStore, event: &InboundEvent, now: Timestamp) -> Result<RequestClaim, StoreError> {
    let body = event.to_json().to_string();
    store.claim_operator_request(&event.load_id, event.event_id.as_str(), &body, now).await
}

/// Publishes `event`: `queued` the first time, `duplicate` for a retry of the same
/// request, and refused when the request id was used for another action on the load.
/// The same answers on every load queue: the store takes each request first
/// ([`claim`]), and a retry is published again (its first publish may have failed).
async fn publish(
    store: &dyn EdgeStore,
    queue: &EventQueue,
    event: &InboundEvent,
    who: &Requester,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let claimed = claim_request(store, event, &who.request_id, now).await?;
    publish_claimed(queue, event, claimed, who, now).await
}

/// [`claim`], refused when the request id was used for another action on the load.
async fn claim_request(
    store: &dyn EdgeStore,
    event: &InboundEvent,
    request_id: &str,
    now: Timestamp,
) -> Result<RequestClaim, OperatorError> {
    match claim(store, event, now).await? {
        RequestClaim::Other => Err(reused(request_id, &event.load_id)),
        claimed => Ok(claimed),
    }
}

fn reused(request_id: &str, load_id: &LoadId) -> OperatorError {
    OperatorError::RequestIdReused { request_id: request_id.to_owned(), load_id: load_id.clone() }
}

/// [`publish`] of an event the store took (`claimed`) already.
async fn publish_claimed(
    queue: &EventQueue,
    event: &InboundEvent,
    claimed: RequestClaim,
    who: &Requester,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let request_id = who.request_id.as_str();
    let status = match queue.publish_traced(event, who.trace, now).await? {
        Published::New if claimed == RequestClaim::New => "queued",
        // A queue that cannot tell (SQS FIFO): the store could.
        Published::New => "duplicate",
        Published::Duplicate => match queue.published_event(&event.load_id, &event.event_id).await? {
            Some(first) if first != *event => return Err(reused(request_id, &event.load_id)),
            _ => "duplicate",
        },
    };
    Ok(Queued { load_id: event.load_id.clone(), event_id: event.event_id.clone(), status })
}

/// The outbox row `outbox_id`, refused unless it is there and dead.
async fn dead_row(store: &dyn Store, outbox_id: &str) -> Result<OutboxRow, OperatorError> {
    // The id is the caller's: an answer quotes no more than a glimpse of it.
    let no_such_row = || OperatorError::NoSuchRow(haul_core::mask::clip(outbox_id, haul_core::mask::MAX_ECHO_CHARS));
    let row = store.get(outbox_id).await?.ok_or_else(no_such_row)?;
    check_dead(&row)?;
    Ok(row)
}

fn check_dead(row: &OutboxRow) -> Result<(), OperatorError> {
    if row.status != OutboxStatus::Dead {
        return Err(OperatorError::NotDead { id: row.id.clone(), status: row.status.as_str() });
    }
    Ok(())
}

/// The requeue event of a dead row (its action copied from the row).
fn requeue_event(row: &OutboxRow, event_id: &EventId, who: &Requester) -> Result<InboundEvent, OperatorError> {
    check_dead(row)?;
    let action = <Action as serde::Deserialize>::deserialize(&row.action)
        .map_err(|e| StoreError::new(format!("outbox row {} holds an action that does not read: {e}", row.id)))?;
    event(&row.load_id, event_id, who, OperatorCommand::Requeue { outbox_id: row.id.clone(), action })
}

/// Requeues the dead row `outbox_id`: a new row carrying its action, made by the load
/// worker on the `operator_action` this publishes. The dead row stays dead.
pub async fn requeue(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    outbox_id: &str,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let event_id = EventId::operator(&who.request_id)?;
    let row = dead_row(store, outbox_id).await?;
    let event = requeue_event(&row, &event_id, who)?;
    publish(store, queue, &event, who, now).await
}

/// Hands the unmatched SMS `message_sid` to `load_id`, which takes it as its
/// `inbound_sms` (the SOP's SMS rules). One load, one request: another request for
/// the same SMS is refused (`sms_assigned`); the same request again is `duplicate`.
pub async fn assign_sms(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    message_sid: &str,
    load_id: &LoadId,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let event_id = EventId::operator(&who.request_id)?;
    check_message_sid(message_sid)?;
    // Checked before the SMS is taken, so a bad actor or reason takes nothing.
    event(
        load_id,
        &event_id,
        who,
        OperatorCommand::AssignSms { message_sid: message_sid.into(), from: "+1".into(), body: String::new() },
    )?;
    load_exists(store, load_id).await?;
    let sms = match store.assign_unmatched_sms(message_sid, load_id, event_id.as_str(), now).await? {
        SmsAssignment::Assigned(sms) => sms,
        SmsAssignment::NotFound => return Err(OperatorError::NoSuchSms(message_sid.to_owned())),
        SmsAssignment::Taken { load_id, event_id } => {
            return Err(OperatorError::SmsAssigned { message_sid: message_sid.to_owned(), load_id, event_id });
        }
        SmsAssignment::Dismissed { by } => {
            return Err(OperatorError::SmsDismissed { message_sid: message_sid.to_owned(), by });
        }
    };
    let command = OperatorCommand::AssignSms { message_sid: sms.message_sid, from: sms.from, body: sms.body };
    let event = event(load_id, &event_id, who, command)?;
    publish(store, queue, &event, who, now).await
}

/// What a reassignment published: the assignment on the load the SMS is moved to,
/// and the undoing on the load it was taken from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reassigned {
    #[serde(flatten)]
    pub to: Queued,
    pub from: Queued,
}

/// Moves the SMS `message_sid`, assigned to a load by mistake, to `load_id`: that load
/// takes it as its `inbound_sms` (like an assignment), and the load it came from gets
/// an `unassign_sms` (its asks the SMS answered go to a person). One event id, the
/// request's, on both loads; a retry publishes both again.
pub async fn reassign_sms(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    message_sid: &str,
    load_id: &LoadId,
    now: Timestamp,
) -> Result<Reassigned, OperatorError> {
    let event_id = EventId::operator(&who.request_id)?;
    check_message_sid(message_sid)?;
    let unassign = |from: &LoadId| {
        let command = OperatorCommand::UnassignSms { message_sid: message_sid.into(), to_load: load_id.clone() };
        event(from, &event_id, who, command)
    };
    let assign = |sms: &UnmatchedSms| {
        let command = OperatorCommand::AssignSms {
            message_sid: sms.message_sid.clone(),
            from: sms.from.clone(),
            body: sms.body.clone(),
        };
        event(load_id, &event_id, who, command)
    };
    let sid = || message_sid.to_owned();
    // Checked before the SMS moves, so a bad actor or reason moves nothing.
    unassign(load_id)?;
    load_exists(store, load_id).await?;
    let found = store.unmatched_sms_one(message_sid).await?.ok_or_else(|| OperatorError::NoSuchSms(sid()))?;
    // Both events taken before the move: a request id used before on either load is
    // refused with the SMS where it was. (Held by `load_id` already: a retry, whose
    // events were taken by its first try, or a refusal the move gives.)
    let mut claims = None;
    if let Some(holder) = found.assigned_load.as_ref().filter(|l| *l != load_id) {
        let (old, new) = (unassign(holder)?, assign(&found.sms)?);
        let old_claim = claim_request(store, &old, &who.request_id, now).await?;
        claims = Some((holder.clone(), old_claim, claim_request(store, &new, &who.request_id, now).await?));
    }
    let (from, sms) = match store.move_assigned_sms(message_sid, load_id, event_id.as_str(), now).await? {
        SmsMove::Moved { from, sms } => (from, sms),
        SmsMove::NotFound => return Err(OperatorError::NoSuchSms(sid())),
        SmsMove::Unassigned => return Err(OperatorError::SmsNotAssigned(sid())),
        SmsMove::Held { event_id } => {
            return Err(OperatorError::SmsAssigned { message_sid: sid(), load_id: load_id.clone(), event_id });
        }
        SmsMove::Taken { load_id, event_id } => {
            return Err(OperatorError::SmsAssigned { message_sid: sid(), load_id, event_id });
        }
        SmsMove::Dismissed { by } => return Err(OperatorError::SmsDismissed { message_sid: sid(), by }),
    };
    let (old, new) = (unassign(&from)?, assign(&sms)?);
    let (old_claim, new_claim) = match claims {
        Some((holder, old_claim, new_claim)) if holder == from => (old_claim, new_claim),
        // A retry, or another move came between the read and this one.
        _ => (
            claim_request(store, &old, &who.request_id, now).await?,
            claim_request(store, &new, &who.request_id, now).await?,
        ),
    };
    // The old load first: were the new one told and this not, the SMS would count on both.
    let from = publish_claimed(queue, &old, old_claim, who, now).await?;
    let to = publish_claimed(queue, &new, new_claim, who, now).await?;
    Ok(Reassigned { to, from })
}

/// Takes the dead row `outbox_id` (and the rest of its requeue chain) out of the
/// operators' inbox, for the reason `who` gives: an `operator_action` on its load,
/// decided there (`haul_core::operator`), so the log keeps who dismissed it and why.
pub async fn dismiss(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    outbox_id: &str,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let event_id = EventId::operator(&who.request_id)?;
    let row = dead_row(store, outbox_id).await?;
    let event = event(&row.load_id, &event_id, who, OperatorCommand::Dismiss { outbox_id: row.id.clone() })?;
    publish(store, queue, &event, who, now).await
}

/// What dismissing an unmatched SMS did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SmsDismissed {
    pub message_sid: String,
    /// `dismissed` now, or `already_dismissed` (by `by` at `at`: this or another
    /// request, before).
    pub status: &'static str,
    pub by: String,
    pub at: Timestamp,
}

/// Takes the unmatched SMS `message_sid` out of the inbox: it belongs to no load, so
/// the store keeps who dismissed it and why (there is no log to append to). One
/// assigned to a load is handled and is refused (`sms_assigned`).
pub async fn dismiss_sms(
    store: &dyn Store,
    who: &Requester,
    message_sid: &str,
    now: Timestamp,
) -> Result<SmsDismissed, OperatorError> {
    check_request_id(&who.request_id)?;
    check_message_sid(message_sid)?;
    haul_core::event::validate_actor_and_reason(&who.actor, &who.reason)?;
    let sms = message_sid.to_owned();
    match store.dismiss_unmatched_sms(message_sid, &who.actor, &who.reason, now).await? {
        SmsDismissal::Dismissed => {
            Ok(SmsDismissed { message_sid: sms, status: "dismissed", by: who.actor.clone(), at: now })
        }
        SmsDismissal::Already { by, at } => Ok(SmsDismissed { message_sid: sms, status: "already_dismissed", by, at }),
        SmsDismissal::Assigned { load_id, event_id } => {
            Err(OperatorError::SmsAssigned { message_sid: sms, load_id, event_id })
        }
        SmsDismissal::NotFound => Err(OperatorError::NoSuchSms(sms)),
    }
}

/// Closes the ask `ask_id` of `load_id` by hand and cancels its timer (the driver
/// called in). Whether there is such an ask to close is the load's decision; a load
/// with no records is refused here.
pub async fn resolve_ask(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    load_id: &LoadId,
    ask_id: &AskId,
    now: Timestamp,
) -> Result<Queued, OperatorError> {
    let event_id = EventId::operator(&who.request_id)?;
    let event = event(load_id, &event_id, who, OperatorCommand::ResolveAsk { ask_id: ask_id.clone() })?;
    load_exists(store, load_id).await?;
    publish(store, queue, &event, who, now).await
}

/// The load's decision on the operator event `event_id`, once a worker has made it:
/// the log is read (each time only past what was read) until it holds
/// `dec:{event_id}` or `wait` has passed. `None`: not decided within `wait` (no worker
/// running, or one behind). What lets an answer say what happened, not just "queued".
pub async fn decided(store: &dyn Store, load: &LoadId, event_id: &str, wait: Duration) -> Option<Decision> {
    let until = std::time::Instant::now() + wait;
    let entry = format!("dec:{event_id}");
    let mut seen = 0;
    loop {
        if let Ok((records, version)) = store.read_after(load, seen).await {
            if let Some(r) = records.iter().find(|r| r.entry_id == entry) {
                return r.decision().cloned();
            }
            seen = version;
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(DECISION_POLL.min(until.saturating_duration_since(std::time::Instant::now()))).await;
    }
}

/// How often [`decided`] reads the log again.
const DECISION_POLL: Duration = Duration::from_millis(100);

/// Which dead rows a bulk requeue takes: one action type, dead since a time, at most
/// `limit` (≤ [`MAX_BULK_ROWS`]), oldest death first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeadFilter {
    pub action_type: ActionType,
    pub since: Timestamp,
    pub limit: usize,
}

/// One row of a bulk requeue, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BulkRow {
    pub outbox_id: String,
    pub load_id: LoadId,
    /// When the row was buried.
    pub dead_at: Timestamp,
    pub last_failure: Option<String>,
    pub event_id: EventId,
    /// `would_requeue` (a dry run), `queued`, `duplicate`, `already_requeued` (another
    /// request requeued it: nothing published, on a dry run too), `dismissed` (an
    /// operator took it out of the inbox: nothing published), or an error code.
    pub status: String,
    /// With `already_requeued`: the key of the row that carries its action again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeued_as: Option<String>,
}

impl BulkRow {
    /// Whether its action goes out (or would, on a dry run): the rows an answer counts
    /// as requeued. One requeued already or refused does not.
    pub fn goes_out(&self) -> bool {
        matches!(self.status.as_str(), "would_requeue" | "queued" | "duplicate")
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BulkAnswer {
    pub request_id: String,
    pub dry_run: bool,
    pub filter: DeadFilter,
    pub rows: Vec<BulkRow>,
    /// More dead rows match than `limit`: a next request with `since` = the last row's
    /// `dead_at` takes the next ones (a row requeued already is a noop on its load).
    pub truncated: bool,
}

/// Requeues every dead row the filter picks, each as its own `operator_action` on its
/// load (event id `op:{request id}:{row hash}`, so a retried request publishes the
/// same events). With `dry_run`, lists them and publishes nothing.
pub async fn bulk_requeue(
    store: &dyn Store,
    queue: &EventQueue,
    who: &Requester,
    filter: &DeadFilter,
    dry_run: bool,
    now: Timestamp,
) -> Result<BulkAnswer, OperatorError> {
    check_request_id(&who.request_id)?;
    if filter.limit == 0 || filter.limit > MAX_BULK_ROWS {
        return Err(BadInput::new("bad_limit", format!("limit must be 1 to {MAX_BULK_ROWS}")).into());
    }
    let mut picked = store.dead_of_type(filter.action_type, filter.since, filter.limit + 1).await?;
    let truncated = picked.len() > filter.limit;
    picked.truncate(filter.limit);
    let mut rows = Vec::with_capacity(picked.len());
    // Each load's requeues and dismissals, read once: a row another request requeued
    // already, or one an operator dismissed from the inbox, is skipped and says so, so
    // what the answer counts as requeued is what goes out. This request's own rows go
    // on (a retry: duplicate).
    let mut states: HashMap<LoadId, haul_core::LoadState> = HashMap::new();
    for row in &picked {
        let event_id = EventId::operator_bulk(&who.request_id, &row.id)?;
        if !states.contains_key(&row.load_id) {
            let state = haul_core::project(&store.read(&row.load_id).await?.0);
            states.insert(row.load_id.clone(), state);
        }
        let state = &states[&row.load_id];
        // The key this request's copy has (haul_core::operator makes it the same way).
        let own_copy = haul_core::ids::event_action_key(&row.load_id, &event_id, row.action_type.as_str());
        let requeued_as = state.requeues.get(&row.id).filter(|key| **key != own_copy).cloned();
        let dismissed = state.inbox_state(&row.id) == haul_core::InboxState::Dismissed;
        // The event is built on a dry run too: what would be refused shows as refused.
        let status = match requeue_event(row, &event_id, who) {
            Err(e @ (OperatorError::Store(_) | OperatorError::BadInput(_))) => return Err(e),
            Err(e) => e.code().to_owned(),
            Ok(_) if requeued_as.is_some() => "already_requeued".to_owned(),
            Ok(_) if dismissed => "dismissed".to_owned(),
            Ok(_) if dry_run => "would_requeue".to_owned(),
            Ok(event) => match publish(store, queue, &event, who, now).await {
                Ok(q) => q.status.to_owned(),
                Err(e @ OperatorError::Store(_)) => return Err(e),
                Err(e) => e.code().to_owned(),
            },
        };
        rows.push(BulkRow {
            outbox_id: row.id.clone(),
            load_id: row.load_id.clone(),
            dead_at: row.updated_at,
            last_failure: row.last_failure.clone(),
            event_id,
            status,
            requeued_as,
        });
    }
    Ok(BulkAnswer { request_id: who.request_id.clone(), dry_run, filter: filter.clone(), rows, truncated })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal's code and HTTP status, as docs/api.md lists them.
    #[test]
    fn each_refusal_has_its_code_and_status() {
        let load = LoadId::parse("L1").unwrap();
        let cases = [
            (OperatorError::from(BadInput::new("bad_request_id", "x")), "bad_request_id", 400),
            (OperatorError::NoSuchRow("r".into()), "no_such_row", 404),
            (OperatorError::NoSuchLoad(load.clone()), "no_such_load", 404),
            (OperatorError::NoSuchSms("SM1".into()), "no_such_sms", 404),
            (OperatorError::NotDead { id: "r".into(), status: "pending" }, "not_dead", 409),
            (
                OperatorError::SmsAssigned {
                    message_sid: "SM1".into(),
                    load_id: load.clone(),
                    event_id: "op:r".into(),
                },
                "sms_assigned",
                409,
            ),
            (OperatorError::RequestIdReused { request_id: "r".into(), load_id: load }, "request_id_reused", 422),
            (OperatorError::RateRequestReused("r".into()), "request_id_reused", 422),
            (OperatorError::Store(StoreError::new("down")), "store_unavailable", 503),
        ];
        for (e, code, status) in cases {
            assert_eq!((e.code(), e.status()), (code, status), "{e}");
        }
    }
}
