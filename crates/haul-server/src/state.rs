//! What every route shares: the server's state ([`ApiState`]), the error shape every
//! answer has (`{"error": {"code", "message"}}`), and the extractors.
//!
//! Every `/v1` route but the Twilio webhook takes the bearer token through one
//! extractor, [`ApiCaller`], which axum runs before the path, the query and the body:
//! a caller without the token learns nothing and costs no body read. The path, the
//! query and the body go through extractors of this module ([`LoadPath`],
//! [`ApiQuery`], [`ApiBody`]) rather than axum's own, so their rejections, like every
//! other answer, are the error shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use haul_core::Clock;
use haul_core::ids::LoadId;
use haul_core::mask::clip_quotes;
use haul_core::trace::TraceParent;
use haul_runtime::inspect::LoadViews;
use haul_runtime::queue::EventQueue;
use haul_runtime::trace::Incoming;
use haul_store::{LoadQueue, Store};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use crate::metrics::metrics_handle;

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
    /// The channels' send limits of the settings (`channels.*.rate`), what an
    /// operator's rate change overrides and what a change with no rate puts back.
    pub configured_limits: haul_core::PerChannel<Option<haul_core::limit::Limit>>,
    /// Where each request's SERVER span and each publish's PRODUCER span go.
    pub spans: haul_runtime::spans::Spans,
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
            spans: haul_runtime::spans::Spans::off(),
            wake_worker: None,
            body_read_timeout: haul_config::ServerConfig::default().body_read_timeout,
            stopping: None,
            load_views: LoadViews::default(),
            console_sign_ins: PerMinute::default(),
            console_key: tokio::sync::OnceCell::new(),
            trusted_proxies: Vec::new(),
            store_figures: true,
            store_figures_last: Mutex::new([0.0; 4]),
            configured_limits: haul_core::PerChannel::from_fn(|_| None),
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

/// The request's trace context: a span of its own continuing the caller's W3C
/// `traceparent`, or a new root when the request brought none it can read. A
/// malformed header is counted (`haul_traceparent_malformed_total`) and never refused:
/// a trace is a diagnosis, not a reason to turn an event away.
#[derive(Clone, Copy, Debug)]
pub struct Trace(pub TraceParent);

impl Trace {
    pub fn of_headers(headers: &HeaderMap) -> Trace {
        Trace(Trace::incoming(headers).context())
    }

    /// How the request's `traceparent` read (the caller's context with it).
    pub fn incoming(headers: &HeaderMap) -> Incoming {
        let mut given = headers.get_all("traceparent").iter();
        let incoming = match (given.next(), given.next()) {
            // Two contexts: which one the caller meant cannot be told.
            (Some(_), Some(_)) => Incoming::Malformed(haul_runtime::trace::root()),
            (first, _) => Incoming::of_header(first.map(|v| v.as_bytes())),
        };
        if let Incoming::Malformed(_) = incoming {
            metrics::counter!("haul_traceparent_malformed_total").increment(1);
        }
        incoming
    }
}

/// The context the access log read for the request (one per request, so the log line
/// and the work name the same span), else read here.
impl<S: Send + Sync> FromRequestParts<S> for Trace {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Trace>().copied().unwrap_or_else(|| Trace::of_headers(&parts.headers)))
    }
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
