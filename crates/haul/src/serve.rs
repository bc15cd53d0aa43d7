//! `haul serve`: the ingestion API, the load workers, the dispatcher and the timer
//! pump, in one process or split by `--roles` across several against one database.
//!
//! Every role process serves `/metrics` and `/healthz` on its listen address; the
//! `api` role adds the `/v1` routes. On SIGTERM or SIGINT the loops stop taking work,
//! runs that have not appended give their message back, and the process exits within
//! ten seconds: nothing lost or half-done.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use haul_core::event::EventBody;
use haul_core::ids::{EventId, LoadId};
use haul_core::{Clock, InboundEvent, QueueMode};
use haul_store::{LoadQueue, OutboxStatus, Published, Store, UnmatchedSms};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::channels::Channels;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::dispatcher::Dispatcher;
use crate::inspect::load_view;
use crate::pipeline::{Parts, Pipeline};
use crate::pump::TimerPump;
use crate::queue::EventQueue;
use crate::worker::Worker;

/// Bodies over this are refused (413) before they are read whole.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Inbound SMS per sender per minute before 429.
pub const SMS_PER_MINUTE: u32 = 30;
/// How long shutdown waits for in-flight work.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(8);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    pub api: bool,
    pub worker: bool,
    pub dispatcher: bool,
    pub pump: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { api: true, worker: true, dispatcher: true, pump: true };

    /// `api,worker,dispatcher,pump` (any subset, at least one).
    pub fn parse(s: &str) -> anyhow::Result<Roles> {
        let mut r = Roles { api: false, worker: false, dispatcher: false, pump: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "api" => r.api = true,
                "worker" => r.worker = true,
                "dispatcher" => r.dispatcher = true,
                "pump" => r.pump = true,
                other => bail!("--roles: unknown role {other:?} (api, worker, dispatcher, pump)"),
            }
        }
        if r == (Roles { api: false, worker: false, dispatcher: false, pump: false }) {
            bail!("--roles names no role");
        }
        Ok(r)
    }

    fn names(&self) -> String {
        [(self.api, "api"), (self.worker, "worker"), (self.dispatcher, "dispatcher"), (self.pump, "pump")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The process-wide Prometheus recorder (installed once).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
                )
                .expect("static bucket list is not empty");
            match builder.install_recorder() {
                Ok(h) => h,
                // Another recorder is installed (tests in one process): render an empty one.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}

pub struct ApiState {
    pub store: Arc<dyn Store>,
    pub queue: EventQueue,
    pub clock: Arc<dyn Clock>,
    /// Accepted bearer tokens (several, for rotation).
    pub tokens: Vec<String>,
    pub twilio_auth_token: Option<String>,
    /// The URL the outside world uses; Twilio signs it plus the route.
    pub public_url: String,
    pub metrics: PrometheusHandle,
    rate: Mutex<HashMap<String, (Instant, u32)>>,
    /// Woken after an event is queued (an in-process worker takes it at once).
    pub wake_worker: Option<Arc<tokio::sync::Notify>>,
}

impl ApiState {
    pub fn new(
        store: Arc<dyn Store>,
        queue: Arc<dyn LoadQueue>,
        clock: Arc<dyn Clock>,
        tokens: Vec<String>,
        twilio_auth_token: Option<String>,
        public_url: String,
    ) -> Self {
        ApiState {
            store,
            queue: EventQueue::new(queue),
            clock,
            tokens,
            twilio_auth_token,
            public_url,
            metrics: metrics_handle(),
            rate: Mutex::new(HashMap::new()),
            wake_worker: None,
        }
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(given) =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        // Compare with every token, without stopping early.
        self.tokens.iter().fold(false, |ok, t| ok | bool::from(t.as_bytes().ct_eq(given.as_bytes())))
    }

    /// A fixed one-minute window per sender; the table is bounded by pruning old windows.
    fn allow_sms_from(&self, from: &str) -> bool {
        let mut rate = self.rate.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if rate.len() > 10_000 {
            rate.retain(|_, (start, _)| now.duration_since(*start) < Duration::from_secs(60));
        }
        let entry = rate.entry(from.to_owned()).or_insert((now, 0));
        if now.duration_since(entry.0) >= Duration::from_secs(60) {
            *entry = (now, 0);
        }
        entry.1 += 1;
        entry.1 <= SMS_PER_MINUTE
    }
}

/// `{"error": {"code", "message"}}` with a status.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": {"code": code, "message": message.into()}}))).into_response()
}

fn body_error(r: BytesRejection) -> Response {
    let status = r.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return error(status, "body_too_large", format!("the body is over {MAX_BODY_BYTES} bytes"));
    }
    error(status, "bad_body", r.body_text())
}

/// Logs and the LLM prompt mask phone numbers the same way (the last four digits).
pub use haul_core::tools::mask_phone;

pub fn router(state: Arc<ApiState>, api: bool) -> Router {
    let mut r = Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz));
    if api {
        r = r
            .route("/v1/loads/{load_id}/events", post(post_event))
            .route("/v1/loads/{load_id}", get(get_load))
            .route("/v1/webhooks/twilio/sms", post(twilio_sms))
            .route("/v1/webhooks/twilio/unmatched", get(unmatched));
    }
    r.layer(DefaultBodyLimit::max(MAX_BODY_BYTES)).with_state(state)
}

async fn healthz(State(s): State<Arc<ApiState>>) -> Response {
    match s.store.load_ids(None, 1).await {
        Ok(_) => (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response(),
        Err(e) => {
            warn!(error = %e, "health check: the store does not answer");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the store does not answer")
        }
    }
}

async fn metrics(State(s): State<Arc<ApiState>>) -> Response {
    // Figures that live in the store are read at scrape time, so any role's process
    // reports them.
    let now = s.clock.now();
    if let Ok(oldest) = s.store.oldest_pending_created_at().await {
        let age = oldest.map(|t| haul_core::time::since(now, t).as_secs_f64()).unwrap_or(0.0);
        metrics::gauge!("haul_outbox_oldest_pending_age_seconds").set(age);
    }
    if let Ok(n) = s.store.count_by_status(OutboxStatus::Dead).await {
        metrics::gauge!("haul_outbox_dead_rows").set(n as f64);
    }
    if let Ok(n) = s.queue.depth().await {
        metrics::gauge!("haul_queue_depth").set(n as f64);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}

async fn post_event(
    State(s): State<Arc<ApiState>>,
    Path(load_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if !s.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token");
    }
    let load = match LoadId::parse(&load_id) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    let body = match body {
        Ok(b) => b,
        Err(r) => return body_error(r),
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_utf8", "the body is not valid UTF-8");
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_json", format!("the body is not JSON: {e}")),
    };
    let mut event = match InboundEvent::from_outside(load.clone(), value) {
        Ok(e) => e,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    let mut at_defaulted = false;
    if let EventBody::LocationPing(p) = &mut event.body
        && p.at.is_none()
    {
        p.at = Some(s.clock.now());
        at_defaulted = true;
    }
    accept(&s, &event, at_defaulted).await
}

/// Queues an event; a repeat of an id answers `duplicate`, or 422 when its payload differs.
async fn accept(s: &ApiState, event: &InboundEvent, at_defaulted: bool) -> Response {
    match s.queue.publish(event, s.clock.now()).await {
        Ok(Published::New) => {
            metrics::counter!("haul_events_accepted_total", "kind" => event.kind()).increment(1);
            if let Some(w) = &s.wake_worker {
                w.notify_one();
            }
            (StatusCode::ACCEPTED, axum::Json(json!({"event_id": event.event_id, "status": "queued"}))).into_response()
        }
        Ok(Published::Duplicate) => {
            let first = match s.queue.published_event(&event.load_id, &event.event_id).await {
                Ok(first) => first,
                Err(e) => {
                    error!(error = %e, "reading the first copy of a duplicate failed");
                    return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
                }
            };
            let same = first.is_none_or(|mut first| {
                // A ping sent twice without `at` got the receive time each time.
                if at_defaulted
                    && let (EventBody::LocationPing(f), EventBody::LocationPing(n)) = (&mut first.body, &event.body)
                {
                    f.at = n.at;
                }
                first == *event
            });
            if same {
                (StatusCode::OK, axum::Json(json!({"event_id": event.event_id, "status": "duplicate"}))).into_response()
            } else {
                error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "event_id_reused",
                    format!("event id {} was already used for this load with another payload", event.event_id),
                )
            }
        }
        Err(e) => {
            error!(error = %e, "queueing an event failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the event was not queued; try again")
        }
    }
}

async fn get_load(State(s): State<Arc<ApiState>>, Path(load_id): Path<String>, headers: HeaderMap) -> Response {
    if !s.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token");
    }
    let load = match LoadId::parse(&load_id) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    match load_view(s.store.as_ref(), &load).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "no_such_load", format!("load {load} has no records")),
        Err(e) => {
            error!(error = %e, "reading a load failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}

const TWIML_EMPTY: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response></Response>";

async fn twilio_sms(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(r) => return body_error(r),
    };
    let Ok(params) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_form", "the body is not form-encoded UTF-8");
    };
    let Some(token) = &s.twilio_auth_token else {
        warn!("Twilio webhook called but HAUL_TWILIO_AUTH_TOKEN is not set: refused");
        return error(StatusCode::FORBIDDEN, "webhook_not_configured", "HAUL_TWILIO_AUTH_TOKEN is not set");
    };
    let url = format!("{}/v1/webhooks/twilio/sms", s.public_url.trim_end_matches('/'));
    let given = headers.get("x-twilio-signature").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !crate::twilio::validate(token, &url, &params, given) {
        metrics::counter!("haul_twilio_bad_signatures_total").increment(1);
        return error(StatusCode::FORBIDDEN, "bad_signature", "X-Twilio-Signature does not match");
    }
    let field = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (Some(from), Some(to), Some(text), Some(sid)) =
        (field("From"), field("To"), field("Body"), field("MessageSid"))
    else {
        return error(StatusCode::BAD_REQUEST, "bad_form", "From, To, Body and MessageSid are required");
    };
    if sid.is_empty() || sid.len() > 64 || !sid.chars().all(|c| c.is_ascii_alphanumeric()) {
        return error(StatusCode::BAD_REQUEST, "bad_form", "MessageSid is not a Twilio message id");
    }
    if !s.allow_sms_from(&from) {
        warn!(from = %mask_phone(&from), "inbound SMS over the per-sender rate: 429");
        return error(StatusCode::TOO_MANY_REQUESTS, "rate_limited", "too many messages from this number");
    }
    let event_id = match EventId::parse_inbound(&format!("sms:{sid}")) {
        Ok(e) => e,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    let loads = match s.store.loads_by_phone(&from).await {
        Ok(l) => l,
        Err(e) => {
            error!(error = %e, "looking up the sender's load failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
        }
    };
    if let [load] = loads.as_slice() {
        let v = json!({"event_id": event_id, "kind": "inbound_sms", "from": from, "body": text});
        let event = match InboundEvent::from_outside(load.clone(), v) {
            Ok(e) => e,
            Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
        };
        let answer = accept(&s, &event, false).await;
        if !answer.status().is_success() {
            return answer;
        }
        info!(load_id = %load, from = %mask_phone(&from), %event_id, "inbound SMS matched");
    } else {
        let sms = UnmatchedSms { message_sid: sid, from: from.clone(), to, body: text, received_at: s.clock.now() };
        if let Err(e) = s.store.record_unmatched_sms(&sms).await {
            error!(error = %e, "keeping an unmatched SMS failed");
            return error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again");
        }
        metrics::counter!("haul_unmatched_sms_total").increment(1);
        info!(from = %mask_phone(&from), candidates = loads.len(), "inbound SMS matched no single active load: kept as unmatched");
    }
    ([(header::CONTENT_TYPE, "text/xml")], TWIML_EMPTY).into_response()
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn unmatched(State(s): State<Arc<ApiState>>, headers: HeaderMap, Query(q): Query<Limit>) -> Response {
    if !s.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token");
    }
    match s.store.unmatched_sms(q.limit.unwrap_or(100).min(1000)).await {
        Ok(list) => axum::Json(json!({"unmatched": list})).into_response(),
        Err(e) => {
            error!(error = %e, "listing unmatched SMS failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}

// ---------------------------------------------------------------------------------
// The loops.

async fn sleep_or_stop(d: Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.changed() => {}
    }
}

/// Sleeps up to `d`, less when woken (new work in this process) or stopped.
async fn idle(d: Duration, wake: &tokio::sync::Notify, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = wake.notified() => {}
        _ = stop.changed() => {}
    }
}

/// Keeps up to `concurrency` runs going, one per load; each run holds a permit.
pub async fn worker_loop(
    worker: Arc<Worker>,
    concurrency: usize,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut idle_for = Duration::from_millis(10);
    while !*stop.borrow() {
        let free = permits.available_permits();
        if free == 0 {
            tokio::select! {
                p = permits.clone().acquire_owned() => drop(p),
                _ = stop.changed() => {}
            }
            continue;
        }
        match worker.receive(free).await {
            Ok(msgs) if !msgs.is_empty() => {
                idle_for = Duration::from_millis(10);
                for m in msgs {
                    let Ok(permit) = permits.clone().acquire_owned().await else { break };
                    let w = worker.clone();
                    tokio::spawn(async move {
                        w.process(m).await;
                        drop(permit);
                    });
                }
            }
            Ok(_) => {
                self::idle(idle_for, &wake, &mut stop).await;
                idle_for = (idle_for * 2).min(Duration::from_millis(250));
            }
            Err(e) => {
                warn!(error = %e, "receiving from the load queue failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
    // Let runs in flight finish (they abandon before append once stopping).
    let _ = permits.acquire_many(concurrency as u32).await;
}

pub async fn dispatcher_loop(
    dispatcher: Arc<Dispatcher>,
    wake: Arc<tokio::sync::Notify>,
    mut stop: watch::Receiver<bool>,
) {
    let mut idle_for = Duration::from_millis(10);
    while !*stop.borrow() {
        match dispatcher.run_once().await {
            Ok(done) if !done.is_empty() => idle_for = Duration::from_millis(10),
            Ok(_) => {
                idle(idle_for, &wake, &mut stop).await;
                idle_for = (idle_for * 2).min(Duration::from_millis(500));
            }
            Err(e) => {
                warn!(error = %e, "claiming outbox rows failed");
                sleep_or_stop(Duration::from_secs(1), &mut stop).await;
            }
        }
    }
}

/// Polls at least every `poll` (at most 30 s); a full batch polls again at once.
pub async fn pump_loop(pump: Arc<TimerPump>, poll: Duration, batch: usize, mut stop: watch::Receiver<bool>) {
    let poll = poll.min(Duration::from_secs(30));
    while !*stop.borrow() {
        match pump.run_once().await {
            Ok(round) if round.fired >= batch => continue,
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reading due timers failed"),
        }
        sleep_or_stop(poll, &mut stop).await;
    }
}

/// The API bearer tokens: `HAUL_API_TOKEN` (comma-separated). When unset, one is
/// generated and written to `haul-api-token` (mode 600) so a fresh machine works.
fn api_tokens() -> anyhow::Result<Vec<String>> {
    if let Ok(v) = std::env::var("HAUL_API_TOKEN") {
        let tokens: Vec<String> = v.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect();
        if tokens.is_empty() {
            bail!("HAUL_API_TOKEN is set but names no token");
        }
        if tokens.iter().any(|t| t.len() < 8) {
            bail!("HAUL_API_TOKEN: every token must be at least 8 characters");
        }
        return Ok(tokens);
    }
    let path = std::path::Path::new("haul-api-token");
    let token = match std::fs::read_to_string(path) {
        Ok(t) if t.trim().len() >= 8 => t.trim().to_owned(),
        _ => {
            let mut rng = fastrand::Rng::new();
            let t = format!("{:016x}{:016x}", rng.u64(..), rng.u64(..));
            write_private(path, &t).context("writing haul-api-token")?;
            t
        }
    };
    warn!("HAUL_API_TOKEN is not set: using the token in ./haul-api-token");
    Ok(vec![token])
}

#[cfg(unix)]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// Runs the roles until `shutdown` resolves, then stops within ten seconds.
pub async fn serve(config: Config, roles: Roles, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let store = crate::store::open(&config.store.url, None).await.context("store.url")?;
    // Series that dashboards divide by exist from the start, at zero.
    let _ = metrics_handle();
    metrics::counter!("haul_append_conflicts_total").absolute(0);
    for kind in ["hero_channel_failure", "internal_failure"] {
        metrics::counter!("haul_ops_alerts_total", "kind" => kind).absolute(0);
    }
    for t in haul_core::ActionType::ALL {
        metrics::counter!("haul_outbox_dead_rows_total", "action_type" => t.as_str()).absolute(0);
    }
    let decider: Option<Arc<dyn crate::decider::Decider>> = match config.decider.kind.as_str() {
        "sop" => None,
        "llm" => {
            let d = crate::llm::LlmDecider::from_config(&config.decider.llm, crate::config::policies(&config.clients))?;
            info!(base_url = %d.settings().base_url, model = %d.settings().model, "decider: llm");
            Some(Arc::new(d))
        }
        other => bail!("decider.kind {other:?} is not available in this build"),
    };
    let (queue, queue_mode): (Arc<dyn LoadQueue>, _) = match config.queue.kind.as_str() {
        "store" => (store.clone(), QueueMode::StoreQueue),
        _ => (crate::store::open_sqs(&config.queue).await?, QueueMode::Separate),
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let channels = Channels::from_config(&config.channels, store.clone())?;
    let modes: Vec<String> = channels.iter().map(|(n, c)| format!("{n}={}", c.mode())).collect();
    let pipeline = Pipeline::new(
        &config,
        Parts {
            store: store.clone(),
            queue: queue.clone(),
            queue_mode,
            channels,
            clock: clock.clone(),
            faults: Default::default(),
            seed: None,
        },
        decider,
    );
    let tokens = if roles.api { api_tokens()? } else { vec![] };
    let public_url = config.server.public_url.clone().unwrap_or_else(|| format!("http://{}", config.server.listen));
    let (wake_worker, wake_dispatcher) = pipeline.wakeups();
    let mut state = ApiState::new(
        store.clone(),
        queue.clone(),
        clock.clone(),
        tokens,
        std::env::var("HAUL_TWILIO_AUTH_TOKEN").ok().filter(|t| !t.is_empty()),
        public_url,
    );
    state.wake_worker = Some(wake_worker.clone());
    let state = Arc::new(state);
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("server.listen: cannot listen on {}", config.server.listen))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    if roles.worker {
        tasks.spawn(worker_loop(
            pipeline.worker.clone(),
            config.worker.concurrency,
            wake_worker.clone(),
            stop_rx.clone(),
        ));
    }
    if roles.dispatcher {
        tasks.spawn(dispatcher_loop(pipeline.dispatcher.clone(), wake_dispatcher.clone(), stop_rx.clone()));
    }
    if roles.pump {
        tasks.spawn(pump_loop(pipeline.pump.clone(), config.timers.poll, 256, stop_rx.clone()));
    }
    let mut http_stop = stop_rx.clone();
    let app = router(state, roles.api);
    tasks.spawn(async move {
        let stopped = async move {
            let _ = http_stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
            error!(error = %e, "the HTTP server failed");
        }
    });
    info!(
        listen = %config.server.listen,
        roles = %roles.names(),
        store = %crate::store::describe(&config.store.url),
        channels = %modes.join(" "),
        "haul is serving"
    );
    shutdown.await;
    info!("shutting down: no new work; runs not yet appended give their message back");
    pipeline.worker.stop();
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(
            "in-flight work did not finish within {}s; it was not appended and will be redelivered",
            SHUTDOWN_GRACE.as_secs()
        );
    }
    info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
