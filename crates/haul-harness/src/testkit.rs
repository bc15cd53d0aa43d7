//! Stand-ins for the outside services, speaking their real wire contract over real
//! HTTP on 127.0.0.1 (docs/api.md): the SMS, Hero task, Hero Slack, TMS and ops services.
//!
//! They dedupe on `Idempotency-Key` as the real services must, count every call and
//! every new effect, notice a key reused with another payload, and misbehave on
//! command (`[[fault]]` in eval scenarios, the simulator's service faults). Used by
//! `haul eval`, `haul sim` and the tests, never by `serve`.
//!
//! Two counts, for two questions. [`FakeServices::sends`]: how many calls with a key
//! the service took (every one, deduplicated or not): "was it sent once?" is
//! `sends == 1`, and a second send shows. [`FakeServices::deduped_effects`]: how many
//! effects the key had at a service that dedupes, which is at most one by
//! construction: "did the driver get one message although it was sent twice?". Only
//! the first can catch a double send.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use haul_core::Channel;
use haul_core::ids::LoadId;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_store::{LoadQueue, Published, QueueError, QueueMessage, StoreError};
use serde_json::{Value, json};

use haul_runtime::channels::{ChannelClient, Channels, HttpChannel};

/// How a matching call misbehaves.
#[derive(Clone, Debug, PartialEq)]
pub enum FaultKind {
    /// 503, nothing applied.
    Retryable,
    /// 429, nothing applied.
    RateLimited,
    /// 429 with `Retry-After` (whole seconds), nothing applied.
    Throttled(Duration),
    /// 422, nothing applied.
    Permanent,
    /// 400 with Twilio's refusal of an opted-out number (error 21610) in the body, as a
    /// gateway in front of Twilio passes it on; nothing applied.
    OptedOut,
    /// Waits (real time), then answers normally.
    Slow(Duration),
    /// Applies the effect, then answers 503 as if the answer was lost.
    LostAnswer,
    /// Holds the call until the test releases it: the test knows the call is in
    /// flight (no sleep to guess when), and decides when it completes.
    Held(Gate),
}

/// A call held at a service: [`Gate::arrived`] returns once a call reached it,
/// [`Gate::release`] lets it answer.
#[derive(Clone, Default)]
pub struct Gate {
    arrived: Arc<tokio::sync::Notify>,
    released: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// Waits until a call has reached the gate (returns at once if one already has).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// Lets the held call (or the next one) answer.
    pub fn release(&self) {
        self.released.notify_one();
    }

    async fn hold(&self) {
        self.arrived.notify_one();
        self.released.notified().await;
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gate")
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.arrived, &other.arrived)
    }
}

#[derive(Clone, Debug)]
pub struct FaultRule {
    /// The channel's config name (`Channel::config_name`: `sms`, `hero`, ...).
    pub channel: String,
    /// An exact key or a glob with `*`.
    pub key: String,
    pub kind: FaultKind,
    /// The first N matching calls (over all keys it matches); `None`: every call.
    pub times: Option<u32>,
}

/// One call a service accepted as a new effect.
#[derive(Clone, Debug, PartialEq)]
pub struct Effect {
    pub channel: String,
    pub key: String,
    pub payload: Value,
    /// When the service took it (real time: what a benchmark counts per second).
    pub at: std::time::Instant,
}

/// One request, whatever its answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub channel: String,
    pub key: String,
    pub status: u16,
    /// The service took it: applied it, or answered it as a duplicate of one it
    /// applied (a lost answer counts: the effect happened).
    pub taken: bool,
    /// The call's `traceparent` header, as sent.
    pub traceparent: Option<String>,
}

#[derive(Default)]
struct Shared {
    effects: Vec<Effect>,
    calls: Vec<Call>,
    /// First successful answer per (channel, key), with the payload it answered.
    answers: HashMap<(String, String), (Value, Value)>,
    /// Keys seen again with a different payload (docs/scenarios.md invariant 3).
    conflicts: Vec<String>,
    rules: Vec<(FaultRule, u32)>,
    chaos: Option<Arc<Chaos>>,
    next_id: u64,
    token: Option<String>,
}

/// Decides, call by call, whether a call misbehaves: `(channel, key) -> fault`.
pub type Chaos = dyn Fn(&str, &str) -> Option<FaultKind> + Send + Sync;

/// The fake services on one HTTP server; each channel under its own path prefix.
#[derive(Clone)]
pub struct FakeServices {
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    _server: Arc<Server>,
}

/// Stops the server when the last handle to its services is dropped: a process that
/// runs thousands of seeds or scenarios keeps no server, and none of the calls one
/// recorded, past its run (each did, and `haul sim` grew by a seed's calls per seed).
struct Server {
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = stop.send(());
        }
    }
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob_match(pattern: &str, s: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == s;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !s.starts_with(first) || s.len() < first.len() + last.len() || !s.ends_with(last) {
        return false;
    }
    let mut rest = &s[first.len()..s.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

impl FakeServices {
    /// Starts the server on an ephemeral port of 127.0.0.1. `token`: the bearer token
    /// every call must carry (401 otherwise).
    pub async fn start(token: Option<String>) -> anyhow::Result<Self> {
        Self::start_on("127.0.0.1:0", token).await
    }

    /// Starts on a given address; `GET /stats` reports effects and conflicts (for the
    /// crash test, which runs the services as a process of their own).
    pub async fn start_on(addr: &str, token: Option<String>) -> anyhow::Result<Self> {
        let shared = Arc::new(Mutex::new(Shared { token, ..Shared::default() }));
        let app = Router::new()
            .route("/{channel}/v1/{*rest}", post(handle))
            .route("/stats", axum::routing::get(stats))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            // Graceful: the pooled keep-alive connections of the shared client close too.
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "fake services stopped");
            }
        });
        Ok(FakeServices { addr, shared, _server: Arc::new(Server { stop: Mutex::new(Some(stop)) }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn base_url(&self, channel: Channel) -> String {
        format!("http://{}/{}", self.addr, channel.config_name())
    }

    /// HTTP clients for every channel pointed at these services.
    pub fn channels(&self, token: Option<String>, timeout: Duration) -> anyhow::Result<Channels> {
        let client = shared_client()?;
        Channels::build(|c| -> anyhow::Result<Arc<dyn ChannelClient>> {
            Ok(Arc::new(HttpChannel::with_client(client.clone(), &self.base_url(c), token.clone(), timeout)))
        })
    }

    pub fn add_fault(&self, rule: FaultRule) {
        self.lock().rules.push((rule, 0));
    }

    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.rules.clear();
        s.chaos = None;
    }

    /// Consulted for every call that no rule matched (the simulator's random faults).
    pub fn set_chaos(&self, chaos: Option<Arc<Chaos>>) {
        self.lock().chaos = chaos;
    }

    /// Every new effect so far, in the order applied.
    pub fn effects(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// How many new effects the services have applied so far (a cheap progress count).
    pub fn effect_count(&self) -> usize {
        self.lock().effects.len()
    }

    /// The effects `key` had at a service that dedupes: 0 or 1, however often it was
    /// sent. Says "one message reached the driver", never "it was sent once" (that
    /// is [`FakeServices::sends`]).
    pub fn deduped_effects(&self, channel: &str, key: &str) -> usize {
        self.lock().effects.iter().filter(|e| e.channel == channel && e.key == key).count()
    }

    /// Calls with `key` the service took (applied, or answered as a duplicate): every
    /// send that got through, so a second send of one key counts 2.
    pub fn sends(&self, channel: &str, key: &str) -> usize {
        self.lock().calls.iter().filter(|c| c.channel == channel && c.key == key && c.taken).count()
    }

    /// The `traceparent` of every call with `key`, in order (`None` for a call without).
    pub fn traceparents(&self, channel: &str, key: &str) -> Vec<Option<String>> {
        let calls = &self.lock().calls;
        calls.iter().filter(|c| c.channel == channel && c.key == key).map(|c| c.traceparent.clone()).collect()
    }

    /// Every call with `key`, refused ones (faults, bad token) included.
    pub fn call_count(&self, channel: &str, key: &str) -> usize {
        self.lock().calls.iter().filter(|c| c.channel == channel && c.key == key).count()
    }

    /// Keys that arrived again with a different payload.
    pub fn conflicts(&self) -> Vec<String> {
        self.lock().conflicts.clone()
    }
}

/// One client for every fake-service channel set in this process (evals and the
/// simulator make hundreds of them; building a client loads the TLS roots).
fn shared_client() -> anyhow::Result<reqwest::Client> {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    if let Some(c) = CLIENT.get() {
        return Ok(c.clone());
    }
    // The channels' client settings, but idle connections kept 2 s, not 90: each seed or
    // scenario has services on a port of their own, and the pool kept an entry per
    // port for 90 s (`haul sim` grew by 90 s of seeds before it levelled off).
    let c = haul_runtime::channels::http_client_builder().pool_idle_timeout(Duration::from_secs(2)).build()?;
    Ok(CLIENT.get_or_init(|| c).clone())
}

async fn stats(State(shared): State<Arc<Mutex<Shared>>>) -> Response {
    let s = shared.lock().unwrap_or_else(|p| p.into_inner());
    let mut effects: HashMap<String, usize> = HashMap::new();
    for e in &s.effects {
        *effects.entry(format!("{} {}", e.channel, e.key)).or_default() += 1;
    }
    let sends = s.calls.iter().filter(|c| c.taken).count();
    axum::Json(json!({"effects": effects, "calls": s.calls.len(), "sends": sends, "conflicts": s.conflicts}))
        .into_response()
}

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

async fn handle(
    State(shared): State<Arc<Mutex<Shared>>>,
    Path((channel, _rest)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let lock = || shared.lock().unwrap_or_else(|p| p.into_inner());
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned) else {
        return answer(StatusCode::BAD_REQUEST, json!({"error": "missing Idempotency-Key"}));
    };
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let token = lock().token.clone();
    if let Some(t) = token {
        let ok = headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {t}"));
        if !ok {
            lock().calls.push(Call { channel, key, status: 401, taken: false, traceparent });
            return answer(StatusCode::UNAUTHORIZED, json!({"error": "bad token"}));
        }
    }
    let Ok(payload) = serde_json::from_slice::<Value>(&body) else {
        return answer(StatusCode::BAD_REQUEST, json!({"error": "body is not JSON"}));
    };
    let fault = {
        let mut s = lock();
        let hit = s
            .rules
            .iter_mut()
            .find(|(r, used)| r.channel == channel && glob_match(&r.key, &key) && r.times.is_none_or(|n| *used < n));
        let ruled = hit.map(|(r, used)| {
            *used += 1;
            r.kind.clone()
        });
        let chaos = s.chaos.clone();
        drop(s);
        ruled.or_else(|| chaos.and_then(|c| c(&channel, &key)))
    };
    let refuse = match &fault {
        Some(FaultKind::Retryable) => Some(StatusCode::SERVICE_UNAVAILABLE),
        Some(FaultKind::RateLimited | FaultKind::Throttled(_)) => Some(StatusCode::TOO_MANY_REQUESTS),
        Some(FaultKind::Permanent) => Some(StatusCode::UNPROCESSABLE_ENTITY),
        Some(FaultKind::OptedOut) => Some(StatusCode::BAD_REQUEST),
        Some(FaultKind::Slow(d)) => {
            tokio::time::sleep(*d).await;
            None
        }
        Some(FaultKind::Held(gate)) => {
            gate.hold().await;
            None
        }
        Some(FaultKind::LostAnswer) | None => None,
    };
    let mut s = lock();
    if let Some(status) = refuse {
        s.calls.push(Call { channel, key, status: status.as_u16(), taken: false, traceparent });
        let error = match fault {
            Some(FaultKind::OptedOut) => "twilio error 21610: Attempt to send to unsubscribed recipient",
            _ => "injected fault",
        };
        let mut refused = answer(status, json!({"error": error}));
        if let Some(FaultKind::Throttled(wait)) = &fault {
            refused.headers_mut().insert(axum::http::header::RETRY_AFTER, wait.as_secs().into());
        }
        return refused;
    }
    let answered = match s.answers.get(&(channel.clone(), key.clone())).cloned() {
        Some((first_payload, first_answer)) => {
            if first_payload != payload {
                s.conflicts.push(format!("{channel} {key}"));
            }
            first_answer
        }
        None => {
            s.next_id += 1;
            let reply = json!({"id": format!("{channel}-{}", s.next_id)});
            s.answers.insert((channel.clone(), key.clone()), (payload.clone(), reply.clone()));
            s.effects.push(Effect {
                channel: channel.clone(),
                key: key.clone(),
                payload,
                at: std::time::Instant::now(),
            });
            reply
        }
    };
    let status = if fault == Some(FaultKind::LostAnswer) { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    s.calls.push(Call { channel, key, status: status.as_u16(), taken: true, traceparent });
    answer(status, answered)
}

/// A load queue whose publishes fail while `down` is set: a queue outage, for tests
/// and the simulator. Everything else passes through to the real queue.
pub struct FlakyQueue {
    inner: Arc<dyn LoadQueue>,
    down: std::sync::atomic::AtomicBool,
}

impl FlakyQueue {
    pub fn new(inner: Arc<dyn LoadQueue>) -> Self {
        FlakyQueue { inner, down: std::sync::atomic::AtomicBool::new(false) }
    }

    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait]
impl LoadQueue for FlakyQueue {
    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        if self.is_down() {
            return Err(StoreError::new("load queue unavailable (injected outage)"));
        }
        self.inner.publish_traced(load_id, event_id, body, trace, now).await
    }

    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError> {
        self.inner.receive(max, visibility, now).await
    }

    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        self.inner.ack(receipt, now).await
    }

    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        self.inner.nack(receipt, delay, now).await
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        self.inner.depth().await
    }

    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError> {
        self.inner.published_body(load_id, event_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key sent twice is two sends and one effect: `sends` sees the second send,
    /// `deduped_effects` cannot.
    #[tokio::test]
    async fn a_second_send_of_a_key_is_counted() {
        let svc = FakeServices::start(None).await.unwrap();
        let http = reqwest::Client::new();
        let send = || {
            http.post(format!("{}/v1/messages", svc.base_url(Channel::Sms)))
                .header("idempotency-key", "L1/e/send_sms")
                .json(&json!({"to": "+15555550100", "body": "hi"}))
                .send()
        };
        assert_eq!(svc.sends("sms", "L1/e/send_sms"), 0);
        send().await.unwrap();
        assert_eq!((svc.sends("sms", "L1/e/send_sms"), svc.deduped_effects("sms", "L1/e/send_sms")), (1, 1));
        send().await.unwrap();
        assert_eq!((svc.sends("sms", "L1/e/send_sms"), svc.deduped_effects("sms", "L1/e/send_sms")), (2, 1));
        svc.add_fault(FaultRule { channel: "sms".into(), key: "*".into(), kind: FaultKind::Retryable, times: Some(1) });
        send().await.unwrap();
        assert_eq!(svc.sends("sms", "L1/e/send_sms"), 2, "a refused call is not a send");
        assert_eq!(svc.call_count("sms", "L1/e/send_sms"), 3);
    }

    #[test]
    fn globs() {
        for (p, s, m) in [
            ("a", "a", true),
            ("a", "b", false),
            ("481207/ask:eta_request:*/1/send_sms", "481207/ask:eta_request:ping_0700/1/send_sms", true),
            ("481207/ask:eta_request:*/1/send_sms", "481207/ask:eta_request:ping_0700/2/send_sms", false),
            ("*", "", true),
            ("*x*", "axb", true),
            ("a*a", "a", false),
        ] {
            assert_eq!(glob_match(p, s), m, "{p} {s}");
        }
    }
}
