//! The operator routes (`/v1/operator/*`, docs/api.md "Operator actions"): each takes
//! an operator's token ([`OperatorCaller`]), a request id, who asks and why, and
//! publishes an `operator_action` through `haul_runtime::operator`, which the load
//! worker appends with its decision. Nothing here writes a log or an outbox row.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use haul_core::action::ActionType;
use haul_core::ids::{AskId, LoadId};
use haul_core::time::Timestamp;
use haul_runtime::operator::{self, DeadFilter, MAX_BULK_ROWS, OperatorError, Queued, Requester};
use serde::Deserialize;
use tracing::{error, info};

use crate::state::{ApiBody, ApiState, OperatorCaller, Trace, error, json_body};

fn refused(e: OperatorError) -> Response {
    if let OperatorError::Store(s) = &e {
        error!(error = %s, "an operator action failed on the store");
        return error(StatusCode::SERVICE_UNAVAILABLE, e.code(), "the store does not answer; try again");
    }
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    error(status, e.code(), e.to_string())
}

/// Longest `wait_s` a request may ask for: the answer waits no longer than this.
const MAX_WAIT_S: u64 = 10;

/// The refusal of a `wait_s` past [`MAX_WAIT_S`], given before anything is published.
fn refused_wait(wait_s: Option<u64>) -> Option<Response> {
    let w = wait_s.filter(|w| *w > MAX_WAIT_S)?;
    Some(error(StatusCode::BAD_REQUEST, "bad_wait", format!("wait_s is {w}: at most {MAX_WAIT_S} seconds")))
}

/// 202 `queued` (the worker is woken) or 200 `duplicate`, with the load and event id;
/// with `wait_s`, also the load's decision on it once made (null if none came within
/// the wait): what happened, not only that it was queued.
async fn answer(
    s: &ApiState,
    who: &Requester,
    what: &str,
    q: Result<Queued, OperatorError>,
    wait_s: Option<u64>,
) -> Response {
    let q = match q {
        Ok(q) => q,
        Err(e) => return refused(e),
    };
    info!(action = what, actor = %who.actor, request_id = %who.request_id, load_id = %q.load_id, event_id = %q.event_id, status = q.status, "operator action");
    let status = if q.is_new() {
        if let Some(w) = &s.wake_worker {
            w.notify_one();
        }
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let Some(wait_s) = wait_s else { return (status, axum::Json(q)).into_response() };
    let wait = std::time::Duration::from_secs(wait_s);
    let decision = operator::decided(s.store.as_ref(), &q.load_id, q.event_id.as_str(), wait).await;
    let mut body = serde_json::to_value(&q).unwrap_or_default();
    body["decision"] = serde_json::to_value(&decision).unwrap_or_default();
    (status, axum::Json(body)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RequeueBody {
    request_id: String,
    actor: String,
    reason: String,
    outbox_id: String,
    #[serde(default)]
    wait_s: Option<u64>,
}

pub(crate) async fn requeue(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: RequeueBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = refused_wait(b.wait_s) {
        return r;
    }
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let q = operator::requeue(s.store.as_ref(), &s.queue, &who, &b.outbox_id, s.clock.now()).await;
    answer(&s, &who, "requeue", q, b.wait_s).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AssignSmsBody {
    request_id: String,
    actor: String,
    reason: String,
    message_sid: String,
    load_id: LoadId,
    #[serde(default)]
    wait_s: Option<u64>,
}

pub(crate) async fn assign_sms(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: AssignSmsBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = refused_wait(b.wait_s) {
        return r;
    }
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let q = operator::assign_sms(s.store.as_ref(), &s.queue, &who, &b.message_sid, &b.load_id, s.clock.now()).await;
    answer(&s, &who, "assign_sms", q, b.wait_s).await
}

/// Moves an SMS assigned to the wrong load to `load_id` (the same body as an
/// assignment): 202 with the new load's event and, under `from`, the old load's
/// `unassign_sms`; with `wait_s`, each load's decision (`decision`, `from.decision`).
pub(crate) async fn reassign_sms(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: AssignSmsBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = refused_wait(b.wait_s) {
        return r;
    }
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let r = match operator::reassign_sms(s.store.as_ref(), &s.queue, &who, &b.message_sid, &b.load_id, s.clock.now())
        .await
    {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    info!(action = "reassign_sms", actor = %who.actor, request_id = %who.request_id, load_id = %r.to.load_id, from_load_id = %r.from.load_id, event_id = %r.to.event_id, status = r.to.status, "operator action");
    let status = if r.to.is_new() || r.from.is_new() {
        if let Some(w) = &s.wake_worker {
            w.notify_one();
        }
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let mut body = serde_json::to_value(&r).unwrap_or_default();
    if let Some(wait_s) = b.wait_s {
        let wait = std::time::Duration::from_secs(wait_s);
        let store = s.store.as_ref();
        let (to, from) = tokio::join!(
            operator::decided(store, &r.to.load_id, r.to.event_id.as_str(), wait),
            operator::decided(store, &r.from.load_id, r.from.event_id.as_str(), wait)
        );
        body["decision"] = serde_json::to_value(&to).unwrap_or_default();
        body["from"]["decision"] = serde_json::to_value(&from).unwrap_or_default();
    }
    (status, axum::Json(body)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveAskBody {
    request_id: String,
    actor: String,
    reason: String,
    load_id: LoadId,
    ask_id: AskId,
    #[serde(default)]
    wait_s: Option<u64>,
}

pub(crate) async fn resolve_ask(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: ResolveAskBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = refused_wait(b.wait_s) {
        return r;
    }
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let q = operator::resolve_ask(s.store.as_ref(), &s.queue, &who, &b.load_id, &b.ask_id, s.clock.now()).await;
    answer(&s, &who, "resolve_ask", q, b.wait_s).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DismissBody {
    request_id: String,
    actor: String,
    reason: String,
    outbox_id: String,
    #[serde(default)]
    wait_s: Option<u64>,
}

/// Takes a dead row (and its requeue chain) out of the operators' inbox: an
/// `operator_action` its load decides, like a requeue.
pub(crate) async fn dismiss(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: DismissBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Some(r) = refused_wait(b.wait_s) {
        return r;
    }
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let q = operator::dismiss(s.store.as_ref(), &s.queue, &who, &b.outbox_id, s.clock.now()).await;
    answer(&s, &who, "dismiss", q, b.wait_s).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DismissSmsBody {
    request_id: String,
    actor: String,
    reason: String,
    message_sid: String,
}

/// Takes an unmatched SMS out of the inbox: 200 `dismissed`, or `already_dismissed`
/// with who did and when; one assigned to a load is refused (`sms_assigned`).
pub(crate) async fn dismiss_sms(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: DismissSmsBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    match operator::dismiss_sms(s.store.as_ref(), &who, &b.message_sid, s.clock.now()).await {
        Ok(d) => {
            info!(action = "dismiss_sms", actor = %who.actor, request_id = %who.request_id, status = d.status, "operator action");
            (StatusCode::OK, axum::Json(d)).into_response()
        }
        Err(e) => refused(e),
    }
}

fn default_limit() -> usize {
    MAX_BULK_ROWS
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BulkRequeueBody {
    request_id: String,
    actor: String,
    reason: String,
    action_type: ActionType,
    since: Timestamp,
    #[serde(default = "default_limit")]
    limit: usize,
    #[serde(default)]
    dry_run: bool,
}

pub(crate) async fn bulk_requeue(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: BulkRequeueBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let filter = DeadFilter { action_type: b.action_type, since: b.since, limit: b.limit };
    match operator::bulk_requeue(s.store.as_ref(), &s.queue, &who, &filter, b.dry_run, s.clock.now()).await {
        Ok(a) => {
            let queued = a.rows.iter().filter(|r| r.status == "queued").count();
            info!(actor = %who.actor, request_id = %who.request_id, rows = a.rows.len(), queued, dry_run = b.dry_run, "operator bulk requeue");
            if queued > 0
                && let Some(w) = &s.wake_worker
            {
                w.notify_one();
            }
            (StatusCode::OK, axum::Json(a)).into_response()
        }
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelRateBody {
    request_id: String,
    actor: String,
    reason: String,
    channel: String,
    /// `null` or absent: the settings' limit again.
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    burst: Option<u32>,
}

/// Changes a channel's send limit while haul runs: 200 `changed` (in force at every
/// dispatcher within a second) or `duplicate` (a retry), with the limit before and
/// after.
pub(crate) async fn channel_rate(
    _: OperatorCaller,
    State(s): State<Arc<ApiState>>,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let b: ChannelRateBody = match json_body(&body) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let who = Requester { request_id: b.request_id, actor: b.actor, reason: b.reason, trace: Some(trace) };
    let request = haul_runtime::rates::RateRequest { channel: b.channel, rate: b.rate, burst: b.burst };
    match haul_runtime::rates::change_rate(s.store.as_ref(), &s.configured_limits, &who, &request, s.clock.now()).await
    {
        Ok(changed) => (StatusCode::OK, axum::Json(changed)).into_response(),
        Err(e) => refused(e),
    }
}

/// Every channel's send limit in force, the settings' beside it, and the latest
/// changes, newest first.
pub(crate) async fn channel_rates(_: crate::state::ApiCaller, State(s): State<Arc<ApiState>>) -> Response {
    match haul_runtime::rates::channel_rates(s.store.as_ref(), &s.configured_limits).await {
        Ok((channels, changes)) => {
            axum::Json(serde_json::json!({"channels": channels, "changes": changes})).into_response()
        }
        Err(e) => refused(e),
    }
}
