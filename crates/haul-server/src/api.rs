//! The `/v1` API: events in, one load's view out, and the error shape every answer
//! shares (`{"error": {"code", "message"}}`).
//!
//! Every `/v1` route but the Twilio webhook takes the bearer token through one
//! extractor, [`ApiCaller`], which axum runs before the path, the query and the body:
//! a caller without the token learns nothing and costs no body read. The path, the
//! query and the body go through extractors of this module ([`LoadPath`],
//! [`ApiQuery`], [`ApiBody`]) rather than axum's own, so their rejections, like every
//! other answer, are the error shape, and routes or methods that do not exist answer
//! 404/405 in it too (401 first under `/v1` without the token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use haul_core::event::EventBody;
use haul_core::ids::LoadId;
use haul_core::mask::clip_quotes;
use haul_core::{BadInput, Clock, InboundEvent};
use haul_runtime::inspect::{LoadViews, Page};
use haul_runtime::queries::{Query as OpsQuery, QueryError};
use haul_runtime::queue::EventQueue;
use haul_store::{LoadQueue, Published, RequestClaim, Store};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::watch;
use tracing::{error, warn};

use crate::metrics::{metrics, metrics_handle};
use crate::twilio::{twilio_sms, unmatched};

/// Bodies over this are refused (413) before they are read whole.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Inbound SMS per sender per minute before 429.
pub const SMS_PER_MINUTE: u32 = 30;
/// Load views (`GET /v1/loads/{id}`, the console's load pages) being read at once.
pub use haul_runtime::inspect::LOAD_VIEWS_AT_ONCE;

pub struct ApiState {
    pub store: Arc<dyn Store>,
    pub queue: EventQueue,
    pub clock: Arc<dyn Clock>,
    /// Accepted bearer tokens (several, for rotation).
    pub tokens: Vec<String>,
    /// Operators' bearer tokens (`HAUL_OPERATOR_TOKEN`): accepted wherever `tokens`
    /// are, and the only ones the operator routes and `operator_action` events take.
    pub operator_tokens: Vec<String>,
    pub twilio_auth_token: Option<String>,
    /// The URL the outside world uses; Twilio signs it plus the route.
    pub public_url: String,
    pub metrics: PrometheusHandle,
    /// Inbound SMS per sender ([`SMS_PER_MINUTE`]).
    sms_per_sender: PerMinute,
    /// Woken after an event is queued (an in-process worker takes it at once).
    pub wake_worker: Option<Arc<tokio::sync::Notify>>,
    /// How long a request may take to send its body (`server.body_read_timeout`).
    pub body_read_timeout: Duration,
    /// Turns true when the server shuts down: body reads still waiting on their client
    /// end then, instead of holding the shutdown up.
    pub stopping: Option<watch::Receiver<bool>>,
    /// The views of loads: folds kept and caught up, a turn per load, and
    /// [`LOAD_VIEWS_AT_ONCE`] permits.
    pub load_views: LoadViews,
    /// The console's sign-in attempts per client address (`console::SIGN_INS_PER_MINUTE`).
    pub(crate) console_sign_ins: PerMinute,
    /// The console's signing key: the tokens under the store's secret, read on first use.
    pub(crate) console_key: tokio::sync::OnceCell<Option<[u8; 32]>>,
    /// `server.trusted_proxies`: whose `X-Forwarded-For` names the client ([`ClientAddress`]).
    pub trusted_proxies: Vec<haul_config::AddressRange>,
    /// Whether `/metrics` reads the figures kept in the store (processes with the `api`
    /// role do; see `metrics.rs`).
    pub store_figures: bool,
    /// The store figures' last values (`metrics::STORE_FIGURES` order), kept for a
    /// scrape the store cannot answer.
    pub(crate) store_figures_last: Mutex<[f64; 4]>,
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
            operator_tokens: vec![],
            twilio_auth_token,
            public_url,
            metrics: metrics_handle(),
            sms_per_sender: PerMinute::default(),
            wake_worker: None,
            body_read_timeout: haul_config::ServerConfig::default().body_read_timeout,
            stopping: None,
            load_views: LoadViews::default(),
            console_sign_ins: PerMinute::default(),
            console_key: tokio::sync::OnceCell::new(),
            trusted_proxies: Vec::new(),
            store_figures: true,
            store_figures_last: Mutex::new([0.0; 4]),
        }
    }

    /// A fixed one-minute window per sender.
    pub(crate) fn allow_sms_from(&self, from: &str) -> bool {
        self.sms_per_sender.allow(from, SMS_PER_MINUTE)
    }
}

/// Keys a [`PerMinute`] keeps at most; past it, the windows that ended are dropped, and
/// while it is still full, new keys share one window.
pub const MAX_RATE_KEYS: usize = 10_000;

/// Fixed one-minute windows of attempts per key (a sender, a client address), the table
/// bounded by [`MAX_RATE_KEYS`].
#[derive(Debug, Default)]
pub(crate) struct PerMinute {
    windows: Mutex<HashMap<String, (Instant, u32)>>,
}

impl PerMinute {
    /// Counts an attempt of `key`; true while its window has had at most `limit`.
    pub(crate) fn allow(&self, key: &str, limit: u32) -> bool {
        const WINDOW: Duration = Duration::from_secs(60);
        const OVERFLOW: &str = "(every other key)";
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if windows.len() >= MAX_RATE_KEYS && !windows.contains_key(key) {
            windows.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let key = if windows.len() >= MAX_RATE_KEYS && !windows.contains_key(key) { OVERFLOW } else { key };
        let entry = windows.entry(key.to_owned()).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        entry.1 <= limit
    }
}

/// The address of the client a request comes from: the peer's, or, when the peer is
/// one of `server.trusted_proxies`, the right-most address of `X-Forwarded-For` that is
/// not one of them (a client can prepend anything; only what the trusted proxies
/// appended is believed). Unknown without a peer address (a server not run by
/// `http::serve_http`, as in some tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientAddress(pub Option<std::net::IpAddr>);

impl ClientAddress {
    pub fn of(
        peer: Option<std::net::IpAddr>,
        headers: &axum::http::HeaderMap,
        trusted: &[haul_config::AddressRange],
    ) -> Self {
        let Some(peer) = peer else { return ClientAddress(None) };
        let is_trusted = |ip: std::net::IpAddr| trusted.iter().any(|r| r.contains(ip));
        if !is_trusted(peer) {
            return ClientAddress(Some(peer));
        }
        let forwarded: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        for hop in forwarded.iter().rev() {
            match hop.parse::<std::net::IpAddr>() {
                Ok(ip) if is_trusted(ip) => continue,
                Ok(ip) => return ClientAddress(Some(ip)),
                // A hop that is not an address: the proxy's own word ends there.
                Err(_) => return ClientAddress(Some(peer)),
            }
        }
        ClientAddress(Some(peer))
    }

    /// The key per-client limits count under: the address, an IPv6 one by its /64 (one
    /// host has a whole /64 to choose from).
    pub fn limit_key(&self) -> String {
        match self.0 {
            None => "(unknown)".into(),
            Some(std::net::IpAddr::V4(a)) => a.to_string(),
            Some(std::net::IpAddr::V6(a)) => {
                let s = a.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        }
    }
}

impl std::fmt::Display for ClientAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ip) => write!(f, "{ip}"),
            None => f.write_str("unknown"),
        }
    }
}

impl FromRequestParts<Arc<ApiState>> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Self::Rejection> {
        let peer = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
        Ok(ClientAddress::of(peer, &parts.headers, &s.trusted_proxies))
    }
}

/// A JSON body read into `T`: not UTF-8 or not JSON is `bad_json`, JSON of another
/// shape (a missing or unknown field, a value of the wrong type) `bad_payload`.
/// The error is the answer itself, sent at once by the handler (a cold path: boxing it
/// would only add an allocation).
#[allow(clippy::result_large_err)]
pub(crate) fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Err(error(StatusCode::BAD_REQUEST, "bad_utf8", "the body is not valid UTF-8"));
    };
    let value: Value = serde_json::from_str(text).map_err(|e| {
        error(StatusCode::BAD_REQUEST, "bad_json", format!("the body is not JSON: {}", clip_quotes(&e.to_string())))
    })?;
    serde_json::from_value(value)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "bad_payload", clip_quotes(&e.to_string())))
}

/// `{"error": {"code", "message"}}` with a status.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": {"code": code, "message": message.into()}}))).into_response()
}

fn too_large() -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", format!("the body is over {MAX_BODY_BYTES} bytes"))
}

fn body_error(r: BytesRejection) -> Response {
    let status = r.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large();
    }
    error(status, "bad_body", clip_quotes(&r.body_text()))
}

/// A caller that presented one of the API's bearer tokens, or an operator's.
#[derive(Clone, Copy, Debug)]
pub struct ApiCaller {
    /// The token was an operator's (`HAUL_OPERATOR_TOKEN`).
    pub operator: bool,
}

/// A caller that presented an operator's token: what the operator routes take. A
/// wrong or missing token is 401 as on every route; a good API token that is not an
/// operator's is 403 `operator_token_required`.
#[derive(Clone, Copy, Debug)]
pub struct OperatorCaller;

/// True when `given` is one of `tokens`, compared with every token without stopping
/// early. The SHA-256 digests are compared, not the texts: a comparison of texts of
/// different lengths ends at once, which would tell a caller a token's length.
pub(crate) fn one_of(tokens: &[String], given: &str) -> bool {
    use sha2::Digest;
    let given = sha2::Sha256::digest(given.as_bytes());
    tokens.iter().fold(false, |ok, t| ok | bool::from(sha2::Sha256::digest(t.as_bytes()).ct_eq(&given)))
}

impl FromRequestParts<Arc<ApiState>> for OperatorCaller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        match ApiCaller::from_request_parts(parts, s).await? {
            ApiCaller { operator: true } => Ok(OperatorCaller),
            ApiCaller { operator: false } => Err(error(
                StatusCode::FORBIDDEN,
                "operator_token_required",
                "operator actions need an operator token (HAUL_OPERATOR_TOKEN), not the API token",
            )),
        }
    }
}

/// The credentials of `Bearer <token>`; the scheme is case-insensitive (RFC 7235).
fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' ')).then_some(token)
}

impl FromRequestParts<Arc<ApiState>> for ApiCaller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        let mut values = parts.headers.get_all(header::AUTHORIZATION).iter();
        // Two headers are refused whatever they hold: which one a proxy on the way
        // reads is anyone's guess.
        let given = match (values.next(), values.next()) {
            (Some(v), None) => v.to_str().ok().and_then(bearer_token),
            _ => None,
        };
        // Compare with every token of both lists, without stopping early.
        let (api, operator) =
            given.map_or((false, false), |given| (one_of(&s.tokens, given), one_of(&s.operator_tokens, given)));
        if api | operator {
            Ok(ApiCaller { operator })
        } else {
            Err(error(StatusCode::UNAUTHORIZED, "unauthorized", "missing or wrong bearer token"))
        }
    }
}

/// The `{load_id}` of the path, decoded and of its form.
pub(crate) struct LoadPath(pub LoadId);

impl FromRequestParts<Arc<ApiState>> for LoadPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        let Path(raw) = Path::<String>::from_request_parts(parts, s).await.map_err(|r| {
            let code = if r.status().is_client_error() { "bad_load_id" } else { "internal" };
            error(r.status(), code, clip_quotes(&r.body_text()))
        })?;
        LoadId::parse(&raw).map(LoadPath).map_err(|e| error(StatusCode::BAD_REQUEST, e.code, e.message))
    }
}

/// The query string, parsed into `T`.
pub(crate) struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<Arc<ApiState>> for ApiQuery<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        Query::<T>::from_request_parts(parts, s)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|r| error(r.status(), "bad_query", clip_quotes(&r.body_text())))
    }
}

/// The whole body: at most [`MAX_BODY_BYTES`], within `body_read_timeout`.
pub(crate) struct ApiBody(pub Bytes);

/// Resolves once the server is shutting down; never without a `stopping` signal.
async fn shutting_down(stopping: Option<watch::Receiver<bool>>) {
    if let Some(mut stopping) = stopping
        && stopping.wait_for(|s| *s).await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// An error after which the connection is closed: the rest of the body is not read.
fn closing(mut answer: Response) -> Response {
    answer.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    answer
}

impl FromRequest<Arc<ApiState>> for ApiBody {
    type Rejection = Response;

    async fn from_request(req: Request, s: &Arc<ApiState>) -> Result<Self, Response> {
        // Checked before the body is touched: hyper answers `Expect: 100-continue` when
        // the body is first polled, so a body announced too large is refused before
        // its sender starts on it.
        let announced = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(closing(too_large()));
        }
        let read = tokio::time::timeout(s.body_read_timeout, Bytes::from_request(req, s));
        tokio::select! {
            read = read => match read {
                Ok(body) => body.map(ApiBody).map_err(body_error),
                Err(_) => Err(closing(error(
                    StatusCode::REQUEST_TIMEOUT,
                    "body_timeout",
                    format!("the body did not arrive within {}s", s.body_read_timeout.as_secs()),
                ))),
            },
            () = shutting_down(s.stopping.clone()) => Err(closing(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down; send the request again",
            ))),
        }
    }
}

/// One route of the HTTP surface. [`router`] is built from [`ROUTES`], and a test holds
/// the OpenAPI document (`docs/openapi.json`) to the same list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// Served only by a process with the `api` role (every role serves the others).
    pub api_role: bool,
    /// Needs the bearer token ([`ApiCaller`]).
    pub token: bool,
    /// Needs an operator's token ([`OperatorCaller`]).
    pub operator: bool,
}

/// Every route `haul serve` answers.
pub const ROUTES: &[Route] = &[
    Route { method: "GET", path: "/metrics", api_role: false, token: false, operator: false },
    Route { method: "GET", path: "/healthz", api_role: false, token: false, operator: false },
    Route { method: "POST", path: "/v1/loads/{load_id}/events", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/loads/{load_id}", api_role: true, token: true, operator: false },
    Route { method: "POST", path: "/v1/webhooks/twilio/sms", api_role: true, token: false, operator: false },
    Route { method: "GET", path: "/v1/webhooks/twilio/unmatched", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/openapi.json", api_role: true, token: false, operator: false },
    Route { method: "POST", path: "/v1/operator/requeue", api_role: true, token: true, operator: true },
    Route { method: "POST", path: "/v1/operator/bulk-requeue", api_role: true, token: true, operator: true },
    Route { method: "POST", path: "/v1/operator/assign-sms", api_role: true, token: true, operator: true },
    Route { method: "POST", path: "/v1/operator/resolve-ask", api_role: true, token: true, operator: true },
    Route { method: "GET", path: "/v1/ops/loads", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/ops/dead", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/ops/timers", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/ops/unmatched", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/ops/alerts", api_role: true, token: true, operator: false },
    Route { method: "GET", path: "/v1/ops/conflicts", api_role: true, token: true, operator: false },
];

/// The OpenAPI 3.1 document of these routes, served as written.
pub const OPENAPI_JSON: &str = include_str!("../../../docs/openapi.json");

fn handler(route: &Route) -> MethodRouter<Arc<ApiState>> {
    match (route.method, route.path) {
        ("GET", "/metrics") => get(metrics),
        ("GET", "/healthz") => get(healthz),
        ("POST", "/v1/loads/{load_id}/events") => post(post_event),
        ("GET", "/v1/loads/{load_id}") => get(get_load),
        ("POST", "/v1/webhooks/twilio/sms") => post(twilio_sms),
        ("GET", "/v1/webhooks/twilio/unmatched") => get(unmatched),
        ("GET", "/v1/openapi.json") => get(openapi),
        ("GET", path) if path.starts_with("/v1/ops/") => {
            let query = OpsQuery::parse(&path["/v1/ops/".len()..])
                .unwrap_or_else(|| panic!("ROUTES lists {path}, which names no query"));
            get(move |_: ApiCaller, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery| ops_query(query, s, raw))
        }
        ("POST", "/v1/operator/requeue") => post(crate::operator::requeue),
        ("POST", "/v1/operator/bulk-requeue") => post(crate::operator::bulk_requeue),
        ("POST", "/v1/operator/assign-sms") => post(crate::operator::assign_sms),
        ("POST", "/v1/operator/resolve-ask") => post(crate::operator::resolve_ask),
        // A route listed without a handler: every test that builds a router fails here.
        (method, path) => panic!("ROUTES lists {method} {path}, which has no handler"),
    }
}

pub fn router(state: Arc<ApiState>, api: bool) -> Router {
    let mut r = Router::new();
    for route in ROUTES.iter().filter(|route| api || !route.api_role) {
        r = r.route(route.path, handler(route));
    }
    if api {
        r = r.merge(crate::console::routes());
    }
    r.fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(state.clone(), edge_headers))
        .layer(axum::middleware::from_fn(access_log))
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
/// time taken. Never a body, a header or the token. `/metrics` and `/healthz`, which
/// scrapers and probes call every few seconds, log at debug.
async fn access_log(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let route = req.extensions().get::<axum::extract::MatchedPath>().map(|p| p.as_str().to_owned());
    let response = next.run(req).await;
    let route = route.as_deref().unwrap_or("(no route)");
    let (status, duration_ms) = (response.status().as_u16(), started.elapsed().as_millis() as u64);
    if route == "/metrics" || route == "/healthz" {
        tracing::debug!(target: "haul_server::access", %method, route, status, duration_ms, "request");
    } else {
        tracing::info!(target: "haul_server::access", %method, route, status, duration_ms, "request");
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

async fn post_event(
    caller: ApiCaller,
    State(s): State<Arc<ApiState>>,
    LoadPath(load): LoadPath,
    ApiBody(body): ApiBody,
) -> Response {
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(StatusCode::BAD_REQUEST, "bad_utf8", "the body is not valid UTF-8");
    };
    let value: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_json",
                format!("the body is not JSON: {}", clip_quotes(&e.to_string())),
            );
        }
    };
    let parsed = if caller.operator {
        InboundEvent::from_operator(load.clone(), value)
    } else {
        InboundEvent::from_outside(load.clone(), value)
    };
    let mut event = match parsed {
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
/// An operator's event is taken in the store first, so its reuse is refused on every
/// load queue (`haul_runtime::operator::claim`).
pub(crate) async fn accept(s: &ApiState, event: &InboundEvent, at_defaulted: bool) -> Response {
    let reused = || {
        error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "event_id_reused",
            format!("event id {} was already used for this load with another payload", event.event_id),
        )
    };
    let mut retried = false;
    if let EventBody::OperatorAction(_) = event.body {
        match haul_runtime::operator::claim(s.store.as_ref(), event, s.clock.now()).await {
            Ok(RequestClaim::New) => {}
            Ok(RequestClaim::Same) => retried = true,
            Ok(RequestClaim::Other) => return reused(),
            Err(e) => {
                error!(error = %e, "taking an operator request failed");
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_unavailable",
                    "the event was not queued; try again",
                );
            }
        }
    }
    match s.queue.publish(event, s.clock.now()).await {
        // A queue that cannot tell a duplicate (SQS FIFO): the store could.
        Ok(Published::New) if retried => {
            (StatusCode::OK, axum::Json(json!({"event_id": event.event_id, "status": "duplicate"}))).into_response()
        }
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
                reused()
            }
        }
        Err(e) => {
            error!(error = %e, "queueing an event failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the event was not queued; try again")
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
        Ok(answer) => axum::Json(answer).into_response(),
        Err(QueryError::Bad(e)) => error(StatusCode::BAD_REQUEST, e.code, e.message),
        Err(QueryError::Store(e)) => {
            error!(error = %e, query = query.name(), "an operators' query failed");
            error(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "try again")
        }
    }
}
