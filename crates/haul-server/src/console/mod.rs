//! The operator console (`/console`, docs/console.md): server-rendered pages over the
//! operators' queries and the load view, and forms for the operator actions, served
//! by the `api` role from the binary itself (the CSS and the script are embedded).
//!
//! Nothing here queries the store in a way of its own or acts on it: the pages show
//! what `haul_runtime::queries::run` and `haul_runtime::inspect::LoadViews` answer
//! (as `GET /v1/ops/*` and `GET /v1/loads/{id}` do), and the forms call
//! `haul_runtime::operator` (as `POST /v1/operator/*` do).
//!
//! Signed out, every page redirects (303) to the sign-in page and every POST is 403.
//! A session is a signed cookie ([`session`]); every POST carries the session's CSRF
//! token; every answer carries [`SECURITY_HEADERS`].

mod html;
mod pages;
pub mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use haul_core::action::ActionType;
use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, from_ms, to_ms};
use haul_core::trace::TraceParent;
use haul_runtime::inspect::Page;
use haul_runtime::operator::{self, DeadFilter, MAX_BULK_ROWS, OperatorError, Requester};
use haul_runtime::queries::{self, Page as QueryPage, Query, QueryError};
use haul_store::{InboxCounts, LoadFilter, OutboxStatus};
use tracing::{error, info};

use crate::state::{ApiBody, ApiState, ClientAddress, Trace, one_of};
use pages::{Ctx, Figures};
use session::{COOKIE, Role, Session};

/// Sign-in attempts the console takes per minute from one client address (a fixed
/// window per address and process, as the webhook's per-sender limit): more are
/// answered 429 without checking the token. Per address, never for everyone: a
/// stranger's flood cannot lock the operators out.
pub const SIGN_INS_PER_MINUTE: u32 = 20;

/// What every answer under `/console` carries (set by `api::edge_headers` on every
/// answer there, the router's own 404 and 405 included).
pub const SECURITY_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
];

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// A console route's handler.
type Handler = fn() -> axum::routing::MethodRouter<Arc<ApiState>>;

/// Every console route, method and path with its handler (docs/console.md lists each):
/// the router is built from this list, so each route is written once.
pub const CONSOLE_ROUTES: &[(&str, &str, Handler)] = &[
    ("GET", "/console", || get(overview)),
    ("GET", "/console/sign-in", || get(sign_in_page)),
    ("POST", "/console/sign-in", || post(sign_in)),
    ("POST", "/console/sign-out", || post(sign_out)),
    ("GET", "/console/loads", || get(loads)),
    ("GET", "/console/loads/{load_id}", || get(load)),
    ("GET", "/console/loads/{load_id}/timeline", || get(load_timeline)),
    ("GET", "/console/dead", || get(dead)),
    ("POST", "/console/dead/requeue", || post(requeue)),
    ("POST", "/console/dead/bulk-requeue", || post(bulk_requeue)),
    ("POST", "/console/dead/dismiss", || post(dismiss)),
    ("GET", "/console/timers", || get(timers)),
    ("GET", "/console/unmatched", || get(unmatched)),
    ("POST", "/console/unmatched/assign", || post(assign_sms)),
    ("POST", "/console/unmatched/reassign", || post(reassign_sms)),
    ("POST", "/console/unmatched/dismiss", || post(dismiss_sms)),
    ("GET", "/console/alerts", || get(alerts)),
    ("GET", "/console/assets/console.css", || get(|| async { asset("text/css; charset=utf-8", CSS) })),
    ("GET", "/console/assets/console.js", || get(|| async { asset("text/javascript; charset=utf-8", JS) })),
    ("GET", "/console/assets/favicon.svg", || get(|| async { asset("image/svg+xml", FAVICON) })),
];

/// The console's routes, for the `api` role's router.
pub(crate) fn routes() -> Router<Arc<ApiState>> {
    let router = CONSOLE_ROUTES.iter().fold(Router::new(), |r, (_, path, handler)| r.route(path, handler()));
    // Anything else under /console: an HTML 404 (with the same headers as every answer
    // under /console, `api::edge_headers`).
    router.route("/console/{*rest}", get(not_found).post(not_found))
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

fn html(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

fn now_s(s: &ApiState) -> i64 {
    to_ms(s.clock.now()).div_euclid(1000)
}

/// Whether the console is reached over https: `server.public_url` is https, or the
/// proxy in front says so (`X-Forwarded-Proto: https`). Then the cookie is `Secure`.
fn https(s: &ApiState, headers: &HeaderMap) -> bool {
    s.public_url.starts_with("https://")
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The console's signing key: the tokens under the store's secret, made (or read) once
/// per process. `Ok(None)` with no token configured; an error when the store does not
/// answer (tried again on the next request).
async fn console_key(s: &ApiState) -> Result<Option<[u8; 32]>, haul_store::StoreError> {
    let key = s
        .console_key
        .get_or_try_init(|| async {
            let mut candidate = [0u8; 32];
            getrandom::fill(&mut candidate)
                .map_err(|e| haul_store::StoreError::new(format!("no randomness for the console secret: {e}")))?;
            let secret = s.store.console_secret(&candidate, s.clock.now()).await?;
            Ok::<_, haul_store::StoreError>(session::session_key(&secret, &s.tokens, &s.operator_tokens))
        })
        .await?;
    Ok(*key)
}

/// The session the request's cookie names, if it checks out now and was not ended by
/// signing out. An operator's session needs an operator token configured. A store
/// that does not answer signs nobody in (logged).
async fn session_of(s: &ApiState, headers: &HeaderMap) -> Option<(Session, [u8; 32])> {
    let cookies = headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok());
    let value = session::cookie_value(cookies, COOKIE)?;
    let key = match console_key(s).await {
        Ok(key) => key?,
        Err(e) => {
            error!(error = %e, "console: the signing key could not be read from the store");
            return None;
        }
    };
    let session = session::verify(&key, value, now_s(s))?;
    if session.role == Role::Operator && s.operator_tokens.is_empty() {
        return None;
    }
    match s.store.session_revoked(&session.nonce).await {
        Ok(false) => Some((session, key)),
        Ok(true) => None,
        Err(e) => {
            error!(error = %e, "console: whether a session was ended could not be read from the store");
            None
        }
    }
}

/// A signed-in viewer of a page; signed out, the page redirects to the sign-in.
struct Viewer {
    signed_in: Poller,
    /// The open problems, for the navigation's counts.
    inbox: Option<InboxCounts>,
}

impl Viewer {
    fn ctx(&self) -> Ctx<'_> {
        Ctx { inbox: self.inbox.as_ref(), ..self.signed_in.ctx() }
    }
}

impl FromRequestParts<Arc<ApiState>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        let signed_in = Poller::from_request_parts(parts, s).await?;
        Ok(Viewer { signed_in, inbox: inbox_counts(s).await })
    }
}

/// A signed-in session polling a page's live sections: a [`Viewer`] without the
/// navigation's counts (no navigation is drawn).
struct Poller {
    session: Session,
    key: [u8; 32],
}

impl Poller {
    fn ctx(&self) -> Ctx<'_> {
        Ctx { session: &self.session, csrf: self.session.csrf(&self.key), inbox: None }
    }
}

impl FromRequestParts<Arc<ApiState>> for Poller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<ApiState>) -> Result<Self, Response> {
        match session_of(s, &parts.headers).await {
            Some((session, key)) => Ok(Poller { session, key }),
            None => Err(Redirect::to("/console/sign-in").into_response()),
        }
    }
}

/// The open problems, counted to the console's bound; `None` when the store does not
/// answer (logged: the page still renders, without counts).
async fn inbox_counts(s: &ApiState) -> Option<InboxCounts> {
    match s.store.inbox_counts(pages::INBOX_COUNT_BOUND).await {
        Ok(c) => Some(c),
        Err(e) => {
            error!(error = %e, "console: counting the open problems failed");
            None
        }
    }
}

/// A list's filters as given, open problems by default: an `inbox` state unless one
/// was asked for (`all` for every state).
fn open_by_default<'a>(mut pairs: Vec<(&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
    if !pairs.iter().any(|(n, _)| *n == "inbox") {
        pairs.push(("inbox", "open"));
    }
    pairs
}

fn forbidden(why: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Refused · haul console</title>\
         {}</head><body><main id=\"main\"><h1>Refused</h1>\
         <p class=\"error\" role=\"alert\">{}</p><p><a href=\"/console\">Back to the console</a></p></main></body></html>",
        pages::ASSET_LINKS,
        html::esc(why)
    );
    html(StatusCode::FORBIDDEN, body)
}

async fn not_found() -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Not found · haul console</title>\
         {}</head><body><main id=\"main\"><h1>Not found</h1>\
         <p>The console has no such page.</p><p><a href=\"/console\">Back to the console</a></p></main></body></html>",
        pages::ASSET_LINKS
    );
    html(StatusCode::NOT_FOUND, body)
}

/// A form's fields.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(body: &[u8]) -> Option<Form> {
        serde_urlencoded::from_bytes(body).ok().map(Form)
    }

    fn get(&self, name: &str) -> &str {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.trim()).unwrap_or("")
    }
}

/// A request from another site, refused before anything else (the CSRF token refuses
/// it too). A browser that sends `Sec-Fetch-Site` is believed; otherwise `Origin`
/// must name this host (as `Host` has it, or `server.public_url`, since a proxy in
/// front may pass its own `Host`); `Origin: null` (a sandboxed frame) is another site.
fn cross_site(headers: &HeaderMap, public_url: &str) -> bool {
    if let Some(fetch_site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return fetch_site != "same-origin" && fetch_site != "none";
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    if origin == "null" {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    let public = public_url.trim_end_matches('/');
    Some(origin_host) != host && origin != public
}

/// The session of a state-changing POST: signed in, its CSRF token, from this site.
#[allow(clippy::result_large_err)]
async fn posting(s: &ApiState, headers: &HeaderMap, form: &Form) -> Result<(Session, [u8; 32]), Response> {
    if cross_site(headers, &s.public_url) {
        return Err(forbidden("This request came from another site."));
    }
    let Some((session, key)) = session_of(s, headers).await else {
        return Err(forbidden("You are not signed in (or your session ended). Sign in again."));
    };
    if !session.csrf_ok(&key, form.get("csrf")) {
        return Err(forbidden(
            "This form's CSRF token is missing or not this session's. Reload the page and try again.",
        ));
    }
    Ok((session, key))
}

/// As [`posting`], and the session must be an operator's.
#[allow(clippy::result_large_err)]
async fn acting(s: &ApiState, headers: &HeaderMap, form: &Form) -> Result<(Session, [u8; 32]), Response> {
    let (session, key) = posting(s, headers, form).await?;
    if session.role != Role::Operator {
        return Err(forbidden("Read-only session: acting needs a sign-in with an operator token."));
    }
    Ok((session, key))
}

/// A request id for a form: rendered into it, so the same form sent twice is one
/// request. Random; without randomness (a broken machine), a count in this process.
fn new_request_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut bytes = [0u8; 12];
    match getrandom::fill(&mut bytes) {
        Ok(()) => format!("console-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        Err(_) => format!("console-n{}", COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
    }
}

// ---------------------------------------------------------------- sign-in

async fn sign_in_page(State(s): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    if session_of(&s, &headers).await.is_some() {
        return Redirect::to("/console").into_response();
    }
    html(StatusCode::OK, pages::sign_in(None))
}

async fn sign_in(
    State(s): State<Arc<ApiState>>,
    client: ClientAddress,
    headers: HeaderMap,
    ApiBody(body): ApiBody,
) -> Response {
    if cross_site(&headers, &s.public_url) {
        return forbidden("This request came from another site.");
    }
    if !s.console_sign_ins.allow(&client.limit_key(), SIGN_INS_PER_MINUTE) {
        info!(target: "haul_server::console", client = %client, "console sign-in refused: too many from this address");
        return html(StatusCode::TOO_MANY_REQUESTS, pages::sign_in(Some("Too many sign-in attempts: wait a minute.")));
    }
    let Some(form) = Form::parse(&body) else {
        return html(StatusCode::BAD_REQUEST, pages::sign_in(Some("The form did not arrive whole.")));
    };
    let (token, actor) = (form.get("token"), form.get("actor"));
    if !session::actor_ok(actor) {
        return html(
            StatusCode::BAD_REQUEST,
            pages::sign_in(Some("Your name: 1 to 64 of letters, digits and _ . @ + -")),
        );
    }
    let (api, op) = (one_of(&s.tokens, token), one_of(&s.operator_tokens, token));
    let role = match (api, op) {
        (_, true) => Role::Operator,
        (true, false) => Role::Read,
        (false, false) => {
            info!(target: "haul_server::console", "console sign-in refused: wrong token");
            return html(StatusCode::UNAUTHORIZED, pages::sign_in(Some("That token is not one of this server's.")));
        }
    };
    let key = match console_key(&s).await {
        Ok(Some(key)) => key,
        Ok(None) => return html(StatusCode::UNAUTHORIZED, pages::sign_in(Some("No token is configured."))),
        Err(e) => {
            error!(error = %e, "console: the signing key could not be read from the store");
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                pages::sign_in(Some("The store does not answer; try again.")),
            );
        }
    };
    let mut nonce = [0u8; 16];
    if getrandom::fill(&mut nonce).is_err() {
        return html(StatusCode::SERVICE_UNAVAILABLE, pages::sign_in(Some("No randomness for a session; try again.")));
    }
    let cookie = session::issue(&key, role, actor, now_s(&s), nonce);
    info!(target: "haul_server::console", actor, role = role.as_str(), "console sign-in");
    let mut r = Redirect::to("/console").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&cookie, https(&s, &headers))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// Ends the session for good, on every api process: its nonce is kept as ended until
/// the cookie would expire, so a copy of the cookie taken before signs nobody in.
async fn sign_out(State(s): State<Arc<ApiState>>, headers: HeaderMap, ApiBody(body): ApiBody) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match posting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(refused) => return refused,
    };
    let expires_at = haul_core::time::from_ms(session.expires_at.saturating_mul(1000));
    if let Err(e) = s.store.revoke_session(&session.nonce, expires_at, s.clock.now()).await {
        error!(error = %e, "console: a sign-out could not be kept in the store");
        let text = "The store does not answer, so the session was not ended; try again.";
        let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
        return html(StatusCode::SERVICE_UNAVAILABLE, pages::message(&ctx, "Not signed out", text, &[]));
    }
    info!(target: "haul_server::console", actor = %session.actor, "console sign-out");
    let mut r = Redirect::to("/console/sign-in").into_response();
    if let Ok(v) = HeaderValue::from_str(&session::clear_cookie(https(&s, &headers))) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

// ---------------------------------------------------------------- pages

async fn overview(v: Viewer, State(s): State<Arc<ApiState>>) -> Response {
    let now = s.clock.now();
    let hour_ago = from_ms(to_ms(now) - 3600 * 1000);
    let mut dead_last_hour = Vec::new();
    for class in pages::classes() {
        let types = haul_store::ops::class_types(class).unwrap_or_default();
        let bound = haul_store::ops::MAX_PAGE;
        let (n, more) = match s.store.dead_rows_page(&types, None, None, bound).await {
            Ok(rows) => {
                let n = rows.iter().filter(|r| r.dead_at >= hour_ago).count();
                (n, n == bound)
            }
            Err(e) => {
                error!(error = %e, "console: reading dead rows failed");
                (0, false)
            }
        };
        dead_last_hour.push((class, n, more));
    }
    let escalated = LoadFilter { escalated: true, ..LoadFilter::default() };
    let escalated_loads = s
        .store
        .loads_page(&escalated, None, pages::INBOX_COUNT_BOUND)
        .await
        .ok()
        .map(|p| (p.loads.len(), p.next_after.is_some()));
    // A channel that held rows back within the last minute is saturated.
    let saturated = s.store.saturated(from_ms(to_ms(now) - pages::SATURATED_WITHIN.as_millis() as i64));
    let figures = Figures {
        inbox: v.inbox.clone(),
        escalated_loads,
        saturated: saturated.await.ok(),
        oldest_pending: s.store.oldest_pending_created_at().await.ok().flatten(),
        dead_last_hour,
        dead_in_store: s.store.count_by_status(OutboxStatus::Dead).await.ok(),
        oldest_due_timer: s.store.oldest_due_timer(now).await.ok().flatten(),
        conflicts: conflicts(&s),
        conflict_loads: s.store.conflict_loads(5).await.ok(),
        queue_depth: s.queue.depth().await.ok(),
        now,
    };
    html(StatusCode::OK, pages::layout(&v.ctx(), "Overview", pages::Nav::Overview, &pages::overview(&figures)))
}

/// `haul_append_conflicts_total` as this process's `/metrics` renders it.
fn conflicts(s: &ApiState) -> Option<f64> {
    let text = s.metrics.render();
    text.lines()
        .filter(|l| l.starts_with("haul_append_conflicts_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

fn pairs_of(raw: Option<&str>) -> Vec<(String, String)> {
    serde_urlencoded::from_str(raw.unwrap_or("")).unwrap_or_default()
}

/// The pairs as the operators' queries take them.
fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// An operators' query's typed page (the same functions as `GET /v1/ops/{query}`), or
/// what to tell the operator.
fn told<T>(query: Query, answer: Result<QueryPage<T>, QueryError>) -> Result<QueryPage<T>, String> {
    match answer {
        Ok(page) => Ok(page),
        Err(QueryError::Bad(e)) => Err(e.message),
        Err(QueryError::Store(e)) => {
            error!(error = %e, query = query.name(), "console: an operators' query failed");
            Err("The store does not answer; try again.".into())
        }
    }
}

fn status_of<T>(answer: &Result<T, String>) -> StatusCode {
    if answer.is_ok() { StatusCode::OK } else { StatusCode::BAD_REQUEST }
}

async fn loads(v: Viewer, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery) -> Response {
    let all = pairs_of(raw.as_deref());
    if let Some((_, id)) = all.iter().find(|(n, _)| n == "load_id") {
        return match LoadId::parse(id.trim()) {
            Ok(id) => Redirect::to(&format!("/console/loads/{}", html::seg(id.as_str()))).into_response(),
            Err(e) => html(StatusCode::BAD_REQUEST, pages::loads(&v.ctx(), &[], Err(e.message))),
        };
    }
    let pairs = pages::given(&all, Query::Loads.params());
    let answer = told(Query::Loads, queries::loads(s.store.as_ref(), &owned(&pairs), s.clock.now()).await);
    html(status_of(&answer), pages::loads(&v.ctx(), &pairs, answer.as_ref().map_err(Clone::clone)))
}

/// A load's page from the query string (`after_seq`, `outbox_after`, `timers_after`,
/// `order`), the query kept for the live refresh, and the order.
fn page_of(raw: Option<&str>) -> Result<(Page, String, pages::Order), String> {
    let all = pairs_of(raw);
    let pairs = pages::given(&all, &["after_seq", "outbox_after", "timers_after", "order"]);
    let get = |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
    let page = Page::parse(get("after_seq"), None, get("outbox_after"), get("timers_after")).map_err(|e| e.message)?;
    Ok((page, html::query(&pairs), pages::Order::of(get("order"))))
}

async fn view_of(
    s: &ApiState,
    load: &str,
    raw: Option<&str>,
) -> Result<haul_runtime::inspect::LoadView, (StatusCode, String)> {
    let load = LoadId::parse(load).map_err(|e| (StatusCode::BAD_REQUEST, e.message))?;
    let (page, _, order) = page_of(raw).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
    // Newest first with no page asked for: the latest records, not the first ones.
    let latest = order == pages::Order::NewestFirst && !pairs_of(raw).iter().any(|(n, _)| n == "after_seq");
    let read = async |page: &Page| match s.load_views.view(s.store.as_ref(), &load, page).await {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err((StatusCode::NOT_FOUND, format!("Load {load} has no records."))),
        Err(e) => {
            error!(error = %e, "console: reading a load failed");
            Err((StatusCode::SERVICE_UNAVAILABLE, "The store does not answer; try again.".into()))
        }
    };
    let v = read(&page).await?;
    if latest && v.next_after_seq.is_some() {
        let after = v.version.saturating_sub(haul_runtime::inspect::PAGE_DEFAULT as u64);
        return read(&Page { after_seq: after, ..page }).await;
    }
    Ok(v)
}

async fn load(v: Viewer, State(s): State<Arc<ApiState>>, Path(id): Path<String>, RawQuery(raw): RawQuery) -> Response {
    match view_of(&s, &id, raw.as_deref()).await {
        Ok(view) => {
            let (q, order) = page_of(raw.as_deref()).map(|(_, q, o)| (q, o)).unwrap_or_default();
            let mut ids = new_request_id;
            html(StatusCode::OK, pages::load(&v.ctx(), &view, &q, order, &mut ids))
        }
        Err((status, why)) => html(status, pages::layout(&v.ctx(), "Load", pages::Nav::Loads, &pages::error_box(&why))),
    }
}

/// The load page's two live sections, its summary and its timeline: what the page's
/// script fetches to refresh them.
async fn load_timeline(
    v: Poller,
    State(s): State<Arc<ApiState>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    match view_of(&s, &id, raw.as_deref()).await {
        Ok(view) => {
            let (q, order) = page_of(raw.as_deref()).map(|(_, q, o)| (q, o)).unwrap_or_default();
            let ctx = v.ctx();
            let mut ids = new_request_id;
            let sections = format!("{}{}", pages::summary(&ctx, &view, &mut ids), pages::timeline(&view, &q, order));
            html(StatusCode::OK, sections)
        }
        Err((status, why)) => html(status, pages::error_box(&why)),
    }
}

async fn dead(v: Viewer, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery) -> Response {
    let all = pairs_of(raw.as_deref());
    let pairs = open_by_default(pages::given(&all, Query::Dead.params()));
    let answer = told(Query::Dead, queries::dead(s.store.as_ref(), &owned(&pairs), s.clock.now()).await);
    let mut ids = new_request_id;
    html(
        status_of(&answer),
        pages::dead(&v.ctx(), &pairs, answer.as_ref().map_err(Clone::clone), &mut ids, s.clock.now()),
    )
}

async fn timers(v: Viewer, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery) -> Response {
    let all = pairs_of(raw.as_deref());
    let pairs = pages::given(&all, Query::Timers.params());
    let answer = told(Query::Timers, queries::timers(s.store.as_ref(), &owned(&pairs), s.clock.now()).await);
    html(status_of(&answer), pages::timers(&v.ctx(), &pairs, answer.as_ref().map_err(Clone::clone)))
}

async fn unmatched(v: Viewer, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery) -> Response {
    let all = pairs_of(raw.as_deref());
    let pairs = open_by_default(pages::given(&all, Query::Unmatched.params()));
    let answer = told(Query::Unmatched, queries::unmatched(s.store.as_ref(), &owned(&pairs), s.clock.now()).await);
    // The active loads with each SMS's number, offered where it is assigned: a load id
    // picked, not typed. A page is at most 100 SMS, so at most 100 index lookups; one
    // that fails offers nothing (the id can still be typed).
    let mut choices = Vec::new();
    if let Ok(page) = &answer {
        for entry in &page.rows {
            let open = entry.inbox.state == haul_core::InboxState::Open;
            choices.push(if open { s.store.loads_by_phone(&entry.sms.from).await.unwrap_or_default() } else { vec![] });
        }
    }
    let mut ids = new_request_id;
    let answer_ref = answer.as_ref().map_err(Clone::clone);
    html(status_of(&answer), pages::unmatched(&v.ctx(), &pairs, answer_ref, &choices, &mut ids))
}

async fn alerts(v: Viewer, State(s): State<Arc<ApiState>>, RawQuery(raw): RawQuery) -> Response {
    let all = pairs_of(raw.as_deref());
    let pairs = open_by_default(pages::given(&all, Query::Alerts.params()));
    let answer = told(Query::Alerts, queries::alerts(s.store.as_ref(), &owned(&pairs), s.clock.now()).await);
    let mut ids = new_request_id;
    html(status_of(&answer), pages::alerts(&v.ctx(), &pairs, answer.as_ref().map_err(Clone::clone), &mut ids))
}

// ---------------------------------------------------------------- actions

/// Who acts and why: the session's name, the form's request id and reason; the action's
/// run continues the console request's trace (`Trace`).
fn requester(session: &Session, form: &Form, trace: TraceParent) -> Requester {
    Requester {
        request_id: form.get("request_id").to_owned(),
        actor: session.actor.clone(),
        reason: form.get("reason").to_owned(),
        trace: Some(trace),
    }
}

fn refused_page(ctx: &Ctx, e: &OperatorError) -> Response {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
    let text = match e {
        OperatorError::Store(err) => {
            error!(error = %err, "console: an operator action failed on the store");
            "The store does not answer; try again.".to_string()
        }
        other => other.to_string(),
    };
    html(status, pages::refused(ctx, &text, &[("/console".into(), "Overview")]))
}

/// How long an action's page waits for the load's decision before it answers.
const DECISION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The page after an operator action: what was queued, then what the load decided on
/// it (waited for, at most [`DECISION_WAIT`]). A decision with nothing to do is shown
/// as a refusal, in red: "Nothing done", with the load's reason, never a success.
async fn what_happened(
    s: &ApiState,
    ctx: &Ctx<'_>,
    q: &operator::Queued,
    title: &str,
    queued: String,
    links: &[(String, &str)],
) -> Response {
    match operator::decided(s.store.as_ref(), &q.load_id, q.event_id.as_str(), DECISION_WAIT).await {
        Some(d) if d.actions.is_empty() && d.inbox.is_empty() => {
            let text = format!("{queued} Nothing done: {}", d.rationale);
            html(StatusCode::OK, pages::refused(ctx, &text, links))
        }
        // Taken out of the inbox, nothing sent.
        Some(d) if d.actions.is_empty() => {
            let text = format!("{queued} Decided by {}: {}", d.decider, d.rationale);
            html(StatusCode::OK, pages::message(ctx, title, &text, links))
        }
        Some(d) => {
            let going: Vec<String> = d.actions.iter().map(|a| format!("{} {}", a.action_type(), a.key)).collect();
            let text = format!("{queued} Decided by {}: {} Going out: {}.", d.decider, d.rationale, going.join(", "));
            html(StatusCode::OK, pages::message(ctx, title, &text, links))
        }
        None => {
            let text = format!(
                "{queued} No decision yet within {} s (is a worker running?): the load's page shows it when it comes.",
                DECISION_WAIT.as_secs()
            );
            html(StatusCode::OK, pages::message(ctx, title, &text, links))
        }
    }
}

fn wake(s: &ApiState) {
    if let Some(w) = &s.wake_worker {
        w.notify_one();
    }
}

/// `queued`, or `was made already` for a request made before.
fn made(q: &operator::Queued) -> &'static str {
    if q.is_new() { "queued" } else { "was made already" }
}

/// An operator action published: logged, the worker woken when it is new, then what
/// the load decided on it ([`what_happened`]), with a link to the load and `back`.
#[allow(clippy::too_many_arguments)]
async fn acted(
    s: &ApiState,
    ctx: &Ctx<'_>,
    who: &Requester,
    action: &str,
    q: &operator::Queued,
    title: &str,
    text: String,
    back: &[(String, &str)],
) -> Response {
    info!(target: "haul_server::console", action, actor = %who.actor, request_id = %who.request_id, load_id = %q.load_id, status = q.status, "operator action");
    if q.is_new() {
        wake(s);
    }
    let mut links = vec![(format!("/console/loads/{}", html::seg(q.load_id.as_str())), "Open the load")];
    links.extend(back.iter().cloned());
    what_happened(s, ctx, q, title, text, &links).await
}

async fn requeue(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let who = requester(&session, &form, trace);
    let outbox_id = form.get("outbox_id");
    match operator::requeue(s.store.as_ref(), &s.queue, &who, outbox_id, s.clock.now()).await {
        Ok(q) => {
            let text = format!("Requeue of {outbox_id} {} as event {} on load {}.", made(&q), q.event_id, q.load_id);
            let back = [("/console/dead".into(), "Dead rows")];
            acted(&s, &ctx, &who, "requeue", &q, "Requeued", text, &back).await
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

async fn bulk_requeue(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let bad = |text: &str| {
        html(StatusCode::BAD_REQUEST, pages::refused(&ctx, text, &[("/console/dead".into(), "Dead rows")]))
    };
    let Some(action_type) = ActionType::parse(form.get("action_type")) else {
        return bad("Choose an action type.");
    };
    let Ok(since) = form.get("since").parse::<Timestamp>() else {
        return bad("Buried since: a time such as 2026-03-02T07:00:00Z.");
    };
    let dry_run = form.get("dry_run") != "false";
    let who = requester(&session, &form, trace);
    let filter = DeadFilter { action_type, since, limit: MAX_BULK_ROWS };
    match operator::bulk_requeue(s.store.as_ref(), &s.queue, &who, &filter, dry_run, s.clock.now()).await {
        Ok(a) => {
            let queued = a.rows.iter().filter(|r| r.status == "queued").count();
            info!(target: "haul_server::console", action = "bulk_requeue", actor = %who.actor, request_id = %who.request_id, rows = a.rows.len(), queued, dry_run, "operator bulk requeue");
            if queued > 0 {
                wake(&s);
            }
            html(StatusCode::OK, pages::bulk(&ctx, &a, &who.reason, new_request_id()))
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

async fn assign_sms(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let load = match LoadId::parse(form.get("load_id")) {
        Ok(l) => l,
        Err(e) => {
            return html(
                StatusCode::BAD_REQUEST,
                pages::refused(&ctx, &e.message, &[("/console/unmatched".into(), "Unmatched SMS")]),
            );
        }
    };
    let who = requester(&session, &form, trace);
    let sid = form.get("message_sid");
    match operator::assign_sms(s.store.as_ref(), &s.queue, &who, sid, &load, s.clock.now()).await {
        Ok(q) => {
            let done = if q.is_new() { "assigned" } else { "was assigned already" };
            let text = format!("SMS {sid} {done} to load {} as event {}.", q.load_id, q.event_id);
            let back = [("/console/unmatched".into(), "Unmatched SMS")];
            acted(&s, &ctx, &who, "assign_sms", &q, "Assigned", text, &back).await
        }
        Err(e @ OperatorError::NoSuchLoad(_)) => {
            // A typo: offer the active loads with the SMS's number, each one click
            // away, with the reason given.
            let loads = match s.store.unmatched_sms_one(sid).await {
                Ok(Some(sms)) => s.store.loads_by_phone(&sms.sms.from).await.unwrap_or_default(),
                _ => vec![],
            };
            let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::NOT_FOUND);
            let mut ids = new_request_id;
            html(status, pages::assign_refused(&ctx, &e.to_string(), sid, &who.reason, &loads, &mut ids))
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

/// Moves an SMS assigned to the wrong load: the page says both halves, the old load
/// told first, and what the new load decided.
async fn reassign_sms(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let back = [("/console/unmatched".into(), "Unmatched SMS")];
    let load = match LoadId::parse(form.get("load_id")) {
        Ok(l) => l,
        Err(e) => return html(StatusCode::BAD_REQUEST, pages::refused(&ctx, &e.message, &back)),
    };
    let who = requester(&session, &form, trace);
    let sid = form.get("message_sid");
    match operator::reassign_sms(s.store.as_ref(), &s.queue, &who, sid, &load, s.clock.now()).await {
        Ok(r) => {
            let text = format!(
                "SMS {sid} {} from load {} to load {} as event {}: load {}'s asks it answered go to a person.",
                if r.to.is_new() { "moved" } else { "was moved already" },
                r.from.load_id,
                r.to.load_id,
                r.to.event_id,
                r.from.load_id,
            );
            if r.from.is_new() {
                wake(&s);
            }
            let mut back = back.to_vec();
            back.push((format!("/console/loads/{}", html::seg(r.from.load_id.as_str())), "Open the load it left"));
            acted(&s, &ctx, &who, "reassign_sms", &r.to, "Moved", text, &back).await
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

async fn dismiss(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let who = requester(&session, &form, trace);
    let outbox_id = form.get("outbox_id");
    match operator::dismiss(s.store.as_ref(), &s.queue, &who, outbox_id, s.clock.now()).await {
        Ok(q) => {
            let text = format!("Dismissal of {outbox_id} {} as event {} on load {}.", made(&q), q.event_id, q.load_id);
            let back = [("/console/dead".into(), "Dead rows"), ("/console/alerts".into(), "OpsAlerts")];
            acted(&s, &ctx, &who, "dismiss", &q, "Dismissed", text, &back).await
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

async fn dismiss_sms(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    Trace(trace): Trace,
    ApiBody(body): ApiBody,
) -> Response {
    let form = Form::parse(&body).unwrap_or(Form(vec![]));
    let (session, key) = match acting(&s, &headers, &form).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let ctx = Ctx { session: &session, csrf: session.csrf(&key), inbox: None };
    let who = requester(&session, &form, trace);
    let links = [("/console/unmatched".to_string(), "Unmatched SMS")];
    match operator::dismiss_sms(s.store.as_ref(), &who, form.get("message_sid"), s.clock.now()).await {
        Ok(d) if d.status == "dismissed" => {
            info!(target: "haul_server::console", action = "dismiss_sms", actor = %who.actor, request_id = %who.request_id, "operator action");
            let text = format!("SMS {} dismissed: it goes to no load.", d.message_sid);
            html(StatusCode::OK, pages::message(&ctx, "Dismissed", &text, &links))
        }
        Ok(d) => {
            let text = format!("Nothing done: SMS {} was dismissed by {} already, at {}.", d.message_sid, d.by, d.at);
            html(StatusCode::OK, pages::refused(&ctx, &text, &links))
        }
        Err(e) => refused_page(&ctx, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_site_requests_are_told_apart() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, HeaderValue::from_static(v));
            }
            m
        };
        let public = "https://haul.example.com";
        let check = |headers: &[(&'static str, &'static str)], want: bool| {
            assert_eq!(cross_site(&h(headers), public), want, "{headers:?}");
        };
        check(&[], false);
        check(&[("host", "a:1"), ("origin", "http://a:1"), ("sec-fetch-site", "same-origin")], false);
        check(&[("host", "a:1"), ("origin", "http://evil")], true);
        check(&[("sec-fetch-site", "cross-site")], true);
        check(&[("sec-fetch-site", "same-site")], true);
        // Behind a proxy that passes its own Host: the browser's word decides, or the
        // public URL.
        check(
            &[("host", "127.0.0.1:8080"), ("origin", "https://haul.example.com"), ("sec-fetch-site", "same-origin")],
            false,
        );
        check(&[("host", "127.0.0.1:8080"), ("origin", "https://haul.example.com")], false);
        check(&[("host", "127.0.0.1:8080"), ("origin", "https://evil.example.com")], true);
        // A sandboxed frame.
        check(&[("host", "a:1"), ("origin", "null")], true);
    }

    #[test]
    fn docs_list_every_console_route() {
        let doc = include_str!("../../../../docs/console.md");
        for (method, path, _) in CONSOLE_ROUTES {
            assert!(doc.contains(&format!("`{method} {path}`")), "docs/console.md does not list {method} {path}");
        }
    }
}
