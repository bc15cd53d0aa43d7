//! Twilio's Messages API as the tests need it: a double that keeps what it was sent
//! (so a re-send can be seen), and Twilio's own OpenAPI description served by Prism
//! (so every request haul makes is checked against what Twilio publishes).
//!
//! The double speaks the wire contract of `POST` and `GET
//! /2010-04-01/Accounts/{AccountSid}/Messages.json`: basic auth, form-encoded
//! creates answered `201` with a `sid`, lists newest first with RFC 2822 dates, and
//! Twilio's error bodies (`{code, message, status}`). On command it refuses the next
//! creates with an error code, or takes the next one and answers too late (the
//! answer lost, the message made). Never used by `serve`.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Form, Json, Router};
use haul_core::Clock;
use haul_core::time::Timestamp;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

/// A message the double took.
#[derive(Clone, Debug)]
pub struct Message {
    pub sid: String,
    pub to: String,
    pub from: Option<String>,
    pub messaging_service_sid: Option<String>,
    pub body: String,
    /// Every form field, as sent.
    pub form: Vec<(String, String)>,
    pub date_created: Timestamp,
}

#[derive(Default)]
struct Shared {
    messages: Vec<Message>,
    creates: u32,
    lists: u32,
    /// The next creates refused with (HTTP status, Twilio error code).
    refusals: Vec<(u16, u32)>,
    /// The next creates taken but answered only after this long.
    late_answers: Vec<Duration>,
}

/// The double on 127.0.0.1; stops when dropped.
pub struct TwilioDouble {
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone)]
struct App {
    shared: Arc<Mutex<Shared>>,
    account_sid: String,
    secret: String,
    clock: Arc<dyn Clock>,
}

impl TwilioDouble {
    /// A double for `account_sid` that takes `secret` as the Auth Token.
    pub async fn start(account_sid: &str, secret: &str, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = App { shared: shared.clone(), account_sid: account_sid.into(), secret: secret.into(), clock };
        let router =
            Router::new().route("/2010-04-01/Accounts/{account}/Messages.json", post(create).get(list)).with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(TwilioDouble { url: format!("http://{addr}"), shared, _stop: stop })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The messages taken, oldest first.
    pub fn messages(&self) -> Vec<Message> {
        self.shared().messages.clone()
    }

    /// Creates asked for (taken, refused or not), and lists.
    pub fn calls(&self) -> (u32, u32) {
        let s = self.shared();
        (s.creates, s.lists)
    }

    /// The next create is refused with `status` and Twilio's error `code`.
    pub fn refuse_next(&self, status: u16, code: u32) {
        self.shared().refusals.push((status, code));
    }

    /// The next create is taken, and answered only after `delay`.
    pub fn answer_next_late(&self, delay: Duration) {
        self.shared().late_answers.push(delay);
    }
}

fn error(status: StatusCode, code: u32, message: &str) -> Response {
    (status, Json(json!({"code": code, "message": message, "more_info": format!("https://www.twilio.com/docs/errors/{code}"), "status": status.as_u16()})))
        .into_response()
}

/// Basic auth with the account (or any user) and the secret; the path's account.
fn authorized(app: &App, account: &str, headers: &HeaderMap) -> Option<Response> {
    use base64::Engine as _;
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Basic "));
    let decoded = given.and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok());
    let ok = decoded
        .and_then(|d| String::from_utf8(d).ok())
        .and_then(|d| d.split_once(':').map(|(_, secret)| secret == app.secret))
        .unwrap_or(false);
    if !ok {
        return Some(error(StatusCode::UNAUTHORIZED, 20003, "Authenticate"));
    }
    (account != app.account_sid).then(|| error(StatusCode::NOT_FOUND, 20404, "The requested resource was not found"))
}

fn rfc2822(t: Timestamp) -> String {
    t.strftime("%a, %d %b %Y %H:%M:%S +0000").to_string()
}

fn to_json(m: &Message) -> Value {
    json!({"sid": m.sid, "to": m.to, "from": m.from, "messaging_service_sid": m.messaging_service_sid,
           "body": m.body, "status": "queued", "date_created": rfc2822(m.date_created)})
}

async fn create(
    State(app): State<App>,
    Path(account): Path<String>,
    headers: HeaderMap,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    if let Some(refused) = authorized(&app, &account, &headers) {
        return refused;
    }
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (late, refusal) = {
        let mut s = app.shared.lock().unwrap_or_else(|p| p.into_inner());
        s.creates += 1;
        let refusal = (!s.refusals.is_empty()).then(|| s.refusals.remove(0));
        let late = if refusal.is_none() && !s.late_answers.is_empty() { Some(s.late_answers.remove(0)) } else { None };
        (late, refusal)
    };
    if let Some((status, code)) = refusal {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        return error(status, code, &format!("refused with {code} as the test asked"));
    }
    let (Some(to), Some(body)) = (field("To"), field("Body")) else {
        return error(StatusCode::BAD_REQUEST, 21604, "A 'To' phone number and a 'Body' are required.");
    };
    let (from, service) = (field("From"), field("MessagingServiceSid"));
    if from.is_none() && service.is_none() {
        return error(StatusCode::BAD_REQUEST, 21603, "A 'From' or 'MessagingServiceSid' parameter is required");
    }
    let message = {
        let mut s = app.shared.lock().unwrap_or_else(|p| p.into_inner());
        let sid = format!("SM{:032x}", s.messages.len() + 1);
        let m = Message {
            sid,
            to,
            from,
            messaging_service_sid: service,
            body,
            form: form.clone(),
            date_created: app.clock.now(),
        };
        s.messages.push(m.clone());
        m
    };
    if let Some(delay) = late {
        tokio::time::sleep(delay).await;
    }
    (StatusCode::CREATED, Json(to_json(&message))).into_response()
}

async fn list(
    State(app): State<App>,
    Path(account): Path<String>,
    headers: HeaderMap,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    if let Some(refused) = authorized(&app, &account, &headers) {
        return refused;
    }
    let field = |name: &str| query.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let page: usize = field("PageSize").and_then(|p| p.parse().ok()).unwrap_or(50);
    let mut s = app.shared.lock().unwrap_or_else(|p| p.into_inner());
    s.lists += 1;
    let messages: Vec<Value> = s
        .messages
        .iter()
        .rev()
        .filter(|m| field("To").is_none_or(|to| m.to == to))
        .filter(|m| field("From").is_none_or(|from| m.from.as_deref() == Some(from)))
        .take(page)
        .map(to_json)
        .collect();
    Json(json!({"messages": messages, "page": 0, "page_size": page})).into_response()
}

/// The variable naming a running Prism serving Twilio's description
/// (`scripts/test` starts one for the run).
pub const PRISM_VAR: &str = "HAUL_TWILIO_PRISM_URL";

static PRISM: OnceCell<String> = OnceCell::const_new();

/// Prism serving Twilio's OpenAPI description of its REST API, validating every
/// request: `HAUL_TWILIO_PRISM_URL` when set, else one this process starts (once,
/// installing it with npm the first time: `scripts/twilio-prism`) and that stops when
/// this process exits. Errors say what is missing; tests fail on them, never skip.
pub async fn prism_url() -> Result<String, String> {
    if let Ok(url) = std::env::var(PRISM_VAR) {
        return Ok(url);
    }
    PRISM.get_or_try_init(start_prism).await.cloned()
}

async fn start_prism() -> Result<String, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port for Prism: {e}"))?
        .port();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/twilio-prism");
    // Prism outlives a killed parent; a small Python wrapper kills it when its stdin
    // (this process's pipe) closes, however this process ends.
    let wrapper = "import subprocess, sys\n\
        p = subprocess.Popen([sys.argv[1], sys.argv[2]], stdout=subprocess.DEVNULL)\n\
        sys.stdin.read()\n\
        p.kill()\n";
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", wrapper, &script.to_string_lossy(), &port.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run python3 for Prism: {e}"))?;
    let stdin = child.stdin.take();
    std::mem::forget(stdin);
    std::mem::forget(child);
    let url = format!("http://127.0.0.1:{port}");
    // The first start installs Prism and Twilio's description with npm.
    for _ in 0..1200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(url);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "Prism did not start on {url} within 120 s: run scripts/twilio-prism PORT to see why (it needs node and npm), \
         or set {PRISM_VAR} to a running one"
    ))
}
