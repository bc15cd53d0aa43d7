//! The `/v1` API's router: every route written once ([`ROUTES`], which the router is
//! built from and the OpenAPI document is checked against), the headers every answer
//! carries, the access log, one load's view and the queries across loads. Routes or
//! methods that do not exist answer 404/405 in the error shape too (401 first under
//! `/v1` without the token).

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use haul_core::BadInput;
use haul_runtime::inspect::Page;
use haul_runtime::queries::{Query as OpsQuery, QueryError};
use haul_runtime::spans::{Kind, Span};
use haul_store::OutboxStatus;
use serde_json::json;
use tracing::{error, warn};

use crate::events::post_event;
use crate::metrics::{FAMILIES, STORE_FIGURES};
use crate::state::{ApiCaller, ApiState, LoadPath, MAX_BODY_BYTES, error};
use crate::twilio::{twilio_sms, unmatched};

/// One route of the HTTP surface, with its handler: [`router`] is built from
/// [`ROUTES`], and a test holds the OpenAPI document (`docs/openapi.json`) to the same
/// list, so each route is written once.
#[derive(Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// Served only by a process with the `api` role (every role serves the others).
    pub api_role: bool,
    /// Needs the bearer token ([`ApiCaller`]).
    pub token: bool,
    /// Needs an operator's token ([`OperatorCaller`]).
    pub operator: bool,
    /// What answers it.
    pub handler: fn() -> MethodRouter<Arc<ApiState>>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// `GET /v1/ops/{query}`'s handler for `query`.
fn ops(query: OpsQuery) -> MethodRouter<Arc<ApiState>> {
    get(move |_: ApiCaller, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery| ops_query(query, s, raw))
}

/// A route of every role, with no token.
const fn open(method: &'static str, path: &'static str, handler: fn() -> MethodRouter<Arc<ApiState>>) -> Route {
    Route { method, path, api_role: false, token: false, operator: false, handler }
}

/// A route of the api role; `token`: the bearer token; `operator`: an operator's.
const fn api(
    method: &'static str,
    path: &'static str,
    token: bool,
    operator: bool,
    handler: fn() -> MethodRouter<Arc<ApiState>>,
) -> Route {
    Route { method, path, api_role: true, token, operator, handler }
}

/// Every route `haul serve` answers.
pub const ROUTES: &[Route] = &[
    open("GET", "/metrics", || get(metrics)),
    open("GET", "/healthz", || get(healthz)),
    api("POST", "/v1/loads/{load_id}/events", true, false, || post(post_event)),
    api("GET", "/v1/loads/{load_id}", true, false, || get(get_load)),
    api("GET", "/v1/prompts/{hash}", true, false, || get(get_prompt)),
    api("POST", "/v1/webhooks/twilio/sms", false, false, || post(twilio_sms)),
    api("POST", "/v1/webhooks/twilio/status", false, false, || post(crate::twilio::twilio_status)),
    api("GET", "/v1/webhooks/twilio/unmatched", true, false, || get(unmatched)),
    api("GET", "/v1/openapi.json", false, false, || get(openapi)),
    api("POST", "/v1/operator/requeue", true, true, || post(crate::operator::requeue)),
    api("POST", "/v1/operator/bulk-requeue", true, true, || post(crate::operator::bulk_requeue)),
    api("POST", "/v1/operator/assign-sms", true, true, || post(crate::operator::assign_sms)),
    api("POST", "/v1/operator/reassign-sms", true, true, || post(crate::operator::reassign_sms)),
    api("POST", "/v1/operator/resolve-ask", true, true, || post(crate::operator::resolve_ask)),
    api("POST", "/v1/operator/dismiss", true, true, || post(crate::operator::dismiss)),
    api("POST", "/v1/operator/dismiss-sms", true, true, || post(crate::operator::dismiss_sms)),
    api("POST", "/v1/operator/channel-rate", true, true, || post(crate::operator::channel_rate)),
    api("GET", "/v1/operator/channel-rates", true, false, || get(crate::operator::channel_rates)),
    api("GET", "/v1/ops/loads", true, false, || ops(OpsQuery::Loads)),
    api("GET", "/v1/ops/dead", true, false, || ops(OpsQuery::Dead)),
    api("GET", "/v1/ops/timers", true, false, || ops(OpsQuery::Timers)),
    api("GET", "/v1/ops/unmatched", true, false, || ops(OpsQuery::Unmatched)),
    api("GET", "/v1/ops/alerts", true, false, || ops(OpsQuery::Alerts)),
    api("GET", "/v1/ops/conflicts", true, false, || ops(OpsQuery::Conflicts)),
    api("GET", "/v1/ops/opted-out", true, false, || ops(OpsQuery::OptedOut)),
    api("GET", "/v1/ops/spend", true, false, || ops(OpsQuery::Spend)),
];

/// The OpenAPI 3.1 document of these routes, served as written.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

pub fn router(state: Arc<ApiState>, api: bool) -> Router {
    let mut r = Router::new();
    for route in ROUTES.iter().filter(|route| api || !route.api_role) {
        r = r.route(route.path, (route.handler)());
    }
    if api {
        r = r.merge(crate::console::routes());
    }
    r.fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge_headers))
        .layer(axum::middleware::from_fn_with_state(state.clone(), access_log))
        .with_state(state)
}

/// `Strict-Transport-Security` when the world reaches haul over https: a year, as
/// browsers and scanners expect (no `includeSubDomains`: haul does not own its
/// neighbours' names).
pub const HSTS: &str = "max-age=31536000";

/// The headers every answer carries, whatever made it (a handler, an extractor's
/// rejection, the router's own 404 or 405): `nosniff` everywhere, HSTS when
/// `server.public_url` is https, and under `/console` the console's own
/// ([`crate::console::SECURITY_HEADERS`]).
async fn edge_headers(
    State(s): State<Arc<ApiState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let console = req.uri().path() == "/console" || req.uri().path().starts_with("/console/");
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    if s.public_url.starts_with("https://") {
        h.insert(header::STRICT_TRANSPORT_SECURITY, header::HeaderValue::from_static(HSTS));
    }
    if console {
        for (name, value) in crate::console::SECURITY_HEADERS {
            h.insert(name, header::HeaderValue::from_static(value));
        }
    }
    response
}

/// The access log: one line per request with the method, the route's template (never
/// the path as sent: no load ids of strangers, no unbounded values), the status and the
/// time taken, and the request's trace context (`Trace`, which the handler's work
/// continues). Never a body, a header or the token. `/metrics` and `/healthz`, which
/// scrapers and probes call every few seconds, log at debug.
async fn access_log(
    State(s): State<Arc<ApiState>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (started, began) = (std::time::Instant::now(), s.clock.now());
    let method = req.method().clone();
    let incoming = crate::state::Trace::incoming(req.headers());
    let trace = crate::state::Trace(incoming.context());
    req.extensions_mut().insert(trace);
    let (trace_id, span_id) = (trace.0.trace_id_hex(), trace.0.span_id_hex());
    let route = req.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str().to_owned());
    let response = next.run(req).await;
    let route = route.as_deref().unwrap_or("(no route)");
    let (status, duration_ms) = (response.status().as_u16(), started.elapsed().as_millis() as u64);
    // The request's SERVER span: for the routes that take work in (a scrape, a health
    // check or a read would only crowd the traces).
    if method == axum::http::Method::POST {
        let end = s.clock.now();
        s.spans.record(|| {
            let caller = incoming.caller();
            let span = Span::new(format!("{method} {route}"), Kind::Server, trace.0, caller.as_ref(), began, end)
                .remote_parent()
                .attr("http.request.method", method.as_str())
                .attr("http.route", route)
                .attr("http.response.status_code", i64::from(status));
            if status >= 500 { span.failed(status.to_string(), "the request failed") } else { span }
        });
    }
    if route == "/metrics" || route == "/healthz" {
        tracing::debug!(target: "haul_server::access", %method, route, status, duration_ms, trace_id, span_id, "request");
    } else {
        tracing::info!(target: "haul_server::access", %method, route, status, duration_ms, trace_id, span_id, "request");
    }
    response
}

/// `answer`, or under `/v1/` to a caller without the token 401 whatever the route: it
/// learns nothing of which routes exist.
fn token_first(uri: &Uri, s: &ApiState, caller: Result<ApiCaller, Response>, answer: Response) -> Response {
    match caller {
        Err(unauthorized) if uri.path().starts_with("/v1/") && !s.tokens.is_empty() => unauthorized,
        _ => answer,
    }
}

async fn no_route(State(s): State<Arc<ApiState>>, uri: Uri, caller: Result<ApiCaller, Response>) -> Response {
    token_first(&uri, &s, caller, error(StatusCode::NOT_FOUND, "not_found", "no such route"))
}

async fn wrong_method(State(s): State<Arc<ApiState>>, uri: Uri, caller: Result<ApiCaller, Response>) -> Response {
    let answer = error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "this route does not take that method");
    token_first(&uri, &s, caller, answer)
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
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

async fn get_load(
    _: ApiCaller,
    State(s): State<Arc<ApiState>>,
    LoadPath(load): LoadPath,
    RawQuery(query): RawQuery,
) -> Response {
    let page = match page_of(query.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.code, e.message),
    };
    match s.load_views.view(s.store.as_ref(), &load, &page).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "no_such_load", format!("load {load} has no records")),
        Err(e) => {
            error!(error = %e, "reading a load failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}

/// The prompt text an LLM decision names by hash (`llm.prompt_hash`, `llm.input_hash`).
async fn get_prompt(
    _: ApiCaller,
    State(s): State<Arc<ApiState>>,
    hash: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Response {
    let hash = hash.map(|Path(h)| h).unwrap_or_default();
    if !haul_core::spend::is_prompt_hash(&hash) {
        let shown: String = hash.chars().take(80).collect();
        return error(
            StatusCode::BAD_REQUEST,
            "bad_prompt_hash",
            format!("{shown:?} is not a prompt hash (SHA-256: 64 lowercase hex digits)"),
        );
    }
    match s.store.prompt(&hash).await {
        Ok(Some(text)) => axum::Json(json!({"hash": hash, "text": text})).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, "no_such_prompt", format!("no prompt is stored under {hash}")),
        Err(e) => {
            error!(error = %e, "reading a prompt failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}

/// `?after_seq=N&limit=M&outbox_after=C&timers_after=C`, each at most once and all
/// optional; any other parameter is refused rather than ignored (a misspelt cursor
/// would silently show the first page).
fn page_of(query: &str) -> Result<Page, BadInput> {
    const NAMES: [&str; 4] = ["after_seq", "limit", "outbox_after", "timers_after"];
    let bad = |m: String| BadInput::new("bad_query", m);
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(query).map_err(|_| bad("the query string is not form-encoded UTF-8".into()))?;
    let mut values: [Option<String>; 4] = Default::default();
    for (name, value) in pairs {
        let Some(i) = NAMES.iter().position(|n| *n == name) else {
            let name: String = name.chars().take(40).collect();
            return Err(bad(format!("unknown query parameter {name:?} (one of {})", NAMES.join(", "))));
        };
        if values[i].replace(value).is_some() {
            return Err(bad(format!("query parameter {name} is given twice")));
        }
    }
    let [after_seq, limit, outbox_after, timers_after] = values;
    Page::parse(after_seq.as_deref(), limit.as_deref(), outbox_after.as_deref(), timers_after.as_deref())
}

/// `GET /v1/ops/{query}`: one of the operators' queries across loads
/// (`haul_runtime::queries`, the same as `haul query`).
async fn ops_query(query: OpsQuery, s: Arc<ApiState>, raw: Option<String>) -> Response {
    let pairs: Vec<(String, String)> = match serde_urlencoded::from_str(raw.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(_) => return error(StatusCode::BAD_REQUEST, "bad_query", "the query string is not form-encoded UTF-8"),
    };
    match haul_runtime::queries::run(s.store.as_ref(), query, &pairs, s.clock.now()).await {
        Ok(answer) => axum::Json(crate::answers::answer_json(&answer)).into_response(),
        Err(QueryError::Bad(e)) => error(StatusCode::BAD_REQUEST, e.code, e.message),
        Err(QueryError::Store(e)) => {
            error!(error = %e, query = query.name(), "an operators' query failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}

/// The figures that live in the store, rendered as gauges after the recorder's text.
/// They are never set in the process-wide recorder: a process (or a test) that does not
/// read the store must not export a figure another `ApiState` of the same process read.
/// A figure the store cannot give now keeps this state's last value (the scrape still
/// answers).
async fn store_figures_text(s: &ApiState) -> String {
    let now = s.clock.now();
    let age = |t: Option<haul_core::time::Timestamp>| t.map_or(0.0, |t| haul_core::time::since(now, t).as_secs_f64());
    let read: [Option<f64>; 4] = [
        s.store.count_by_status(OutboxStatus::Dead).await.ok().map(|n| n as f64),
        s.store.oldest_pending_created_at().await.ok().map(age),
        s.store.oldest_due_timer(now).await.ok().map(age),
        s.queue.depth().await.ok().map(|n| n as f64),
    ];
    let values = {
        let mut last = s.store_figures_last.lock().unwrap_or_else(|p| p.into_inner());
        for (kept, new) in last.iter_mut().zip(read) {
            if let Some(v) = new {
                *kept = v;
            }
        }
        *last
    };
    let mut text = String::new();
    for (name, value) in STORE_FIGURES.iter().zip(values) {
        let help = FAMILIES.iter().find(|(n, _, _)| n == name).map_or("", |(_, _, h)| *h);
        let _ = write!(text, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n\n");
    }
    text
}

pub(crate) async fn metrics(State(s): State<Arc<ApiState>>) -> Response {
    let mut text = s.metrics.render();
    if s.store_figures {
        text.push_str(&store_figures_text(&s).await);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
