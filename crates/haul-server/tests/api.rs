//! The ingestion API's bad-input battery (docs/api.md): every case gets the right status
//! and a clear `{"error": {"code", "message"}}`, writes nothing, and panics nothing.
//! Real HTTP on 127.0.0.1 against the real router on a real store.

use std::sync::Arc;
use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::{Clock, FakeClock};
use haul_server::twilio;
use haul_server::{ApiState, ConnectionLimits, SMS_PER_MINUTE, router, serve_http};
use haul_store::{LoadQueue, NewEntry, Store};
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKENS: [&str; 2] = ["token-one-123456", "token-two-654321"];
const TWILIO: &str = "twilio-auth-token";

struct Api {
    base: String,
    store: Arc<dyn Store>,
    client: reqwest::Client,
}

/// The limits a test server runs with: short, so the tests that wait on them are quick.
#[derive(Clone, Copy)]
struct Limits {
    header_read_timeout: Duration,
    body_read_timeout: Duration,
    write_timeout: Duration,
    max_connections: usize,
}

const LIMITS: Limits = Limits {
    header_read_timeout: Duration::from_secs(1),
    body_read_timeout: Duration::from_secs(1),
    write_timeout: Duration::from_secs(1),
    max_connections: 1000,
};

async fn api() -> Api {
    api_with(LIMITS).await
}

async fn api_with(limits: Limits) -> Api {
    api_configured(limits, Some(TWILIO)).await
}

/// A server with these limits and Twilio auth token (`None`: HAUL_TWILIO_AUTH_TOKEN unset).
async fn api_configured(limits: Limits, twilio_auth_token: Option<&str>) -> Api {
    let store = haul_backends::open("sqlite::memory:", Some(3)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse().unwrap()));
    let mut state = ApiState::new(
        store.clone(),
        store.clone() as Arc<dyn LoadQueue>,
        clock,
        TOKENS.iter().map(|t| t.to_string()).collect(),
        twilio_auth_token.map(str::to_owned),
        base.clone(),
    );
    state.body_read_timeout = limits.body_read_timeout;
    let app = router(Arc::new(state), true);
    let connections = ConnectionLimits {
        max_connections: limits.max_connections,
        header_read_timeout: limits.header_read_timeout,
        write_timeout: limits.write_timeout,
    };
    tokio::spawn(serve_http(listener, app, connections, std::future::pending()));
    Api { base, store, client: reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap() }
}

impl Api {
    async fn post_raw(&self, path: &str, token: Option<&str>, body: Vec<u8>) -> (StatusCode, Value) {
        let mut req =
            self.client.post(format!("{}{path}", self.base)).header("content-type", "application/json").body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A counter from `/metrics` (0 when absent).
    async fn metric(&self, name: &str) -> f64 {
        let text = self.client.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    async fn post(&self, load: &str, body: Value) -> (StatusCode, Value) {
        self.post_raw(&format!("/v1/loads/{load}/events"), Some(TOKENS[0]), body.to_string().into_bytes()).await
    }

    async fn written(&self) -> u64 {
        self.store.depth().await.unwrap()
    }

    /// Asserts the answer and that nothing was queued.
    async fn refused(&self, (status, body): (StatusCode, Value), want: StatusCode, code: &str) {
        assert_eq!(status, want, "{body}");
        assert_eq!(body["error"]["code"], code, "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert_eq!(self.written().await, 0, "nothing written");
    }

    async fn twilio(&self, params: &[(&str, &str)], signature: Option<String>) -> reqwest::Response {
        let pairs: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let body = serde_urlencoded::to_string(&pairs).unwrap();
        let mut req = self
            .client
            .post(format!("{}/v1/webhooks/twilio/sms", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if let Some(s) = signature {
            req = req.header("X-Twilio-Signature", s);
        }
        req.send().await.unwrap()
    }

    fn sign(&self, params: &[(&str, &str)]) -> String {
        let pairs: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        twilio::signature(TWILIO, &format!("{}/v1/webhooks/twilio/sms", self.base), &pairs)
    }
}

fn ping() -> Value {
    json!({"event_id": "ping_0700", "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high"})
}

#[tokio::test]
async fn tokens_are_required_and_several_rotate() {
    let a = api().await;
    let path = "/v1/loads/481207/events";
    let body = || ping().to_string().into_bytes();
    a.refused(a.post_raw(path, None, body()).await, StatusCode::UNAUTHORIZED, "unauthorized").await;
    a.refused(a.post_raw(path, Some("token-one-12345"), body()).await, StatusCode::UNAUTHORIZED, "unauthorized").await;
    a.refused(a.post_raw(path, Some(""), body()).await, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let resp = a.client.get(format!("{}/v1/loads/481207", a.base)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let (status, _) = a.post_raw(path, Some(TOKENS[1]), body()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "the second token of a rotation is accepted");
}

#[tokio::test]
async fn malformed_and_mistyped_bodies_are_400() {
    let a = api().await;
    let path = "/v1/loads/481207/events";
    let raw = |b: &[u8]| b.to_vec();
    for (body, code) in [
        (raw(b"{\"event_id\": "), "bad_json"),
        (raw(b"not json at all"), "bad_json"),
        (raw(b""), "bad_json"),
        (raw(b"[1,2,3]"), "bad_json"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":\"41\",\"lon\":0,\"risk\":\"high\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":41,\"lon\":0}"), "bad_payload"),
        (raw(b"{\"kind\":\"location_ping\",\"lat\":41,\"lon\":0,\"risk\":\"high\"}"), "bad_payload"),
        (raw(b"{\"event_id\":7,\"kind\":\"location_ping\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"teleport\"}"), "unknown_kind"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"timer_fired\",\"timer_id\":\"tmr:481207:ask:eta_request:p:1\",\"ask_id\":\"ask:eta_request:p\",\"step\":1,\"fire_at\":\"2026-03-02T07:30:00Z\"}"), "kind_not_accepted"),
        (raw(b"{\"event_id\":\"o\",\"kind\":\"action_outcome\",\"outbox_id\":\"x\",\"action_type\":\"send_sms\",\"status\":\"delivered\"}"), "kind_not_accepted"),
        (raw(b"{\"event_id\":\"evt:tmr:481207:ask:eta_request:p:1\",\"kind\":\"inbound_sms\",\"from\":\"+1555\",\"body\":\"x\"}"), "reserved_event_id"),
        (raw(b"{\"event_id\":\"a b\",\"kind\":\"inbound_sms\",\"from\":\"+1555\",\"body\":\"x\"}"), "bad_event_id"),
        (raw(b"{\"event_id\":\"s\",\"kind\":\"inbound_sms\",\"from\":\"+1555\",\"body\":\"nul \\u0000 here\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"u\",\"kind\":\"load_update\",\"driver_phone\":\"call me\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":91,\"lon\":0,\"risk\":\"high\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":0,\"lon\":-180.5,\"risk\":\"high\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":NaN,\"lon\":0,\"risk\":\"high\"}"), "bad_json"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":1e999,\"lon\":0,\"risk\":\"high\"}"), "bad_json"),
        (raw(b"{\"event_id\":\"p\",\"kind\":\"location_ping\",\"lat\":\"NaN\",\"lon\":0,\"risk\":\"high\"}"), "bad_payload"),
        (raw(b"{\"event_id\":\"s\",\"kind\":\"inbound_sms\",\"from\":\"+1\",\"body\":\"\xff\xfe\"}"), "bad_utf8"),
    ] {
        let answer = a.post_raw(path, Some(TOKENS[0]), body.clone()).await;
        a.refused(answer, StatusCode::BAD_REQUEST, code).await;
    }
}

#[tokio::test]
async fn ids_outside_their_form_are_400() {
    let a = api().await;
    for load in ["bad%20load", "a.b", "%27%20OR%201%3D1%20--", &"x".repeat(65)] {
        a.refused(a.post(load, ping()).await, StatusCode::BAD_REQUEST, "bad_load_id").await;
    }
}

#[tokio::test]
async fn huge_bodies_are_413_before_being_read_whole() {
    let a = api().await;
    let huge = json!({"event_id": "s", "kind": "inbound_sms", "from": "+15555550100", "body": "x".repeat(100 * 1024)});
    a.refused(a.post("481207", huge).await, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large").await;
    // Streamed with no Content-Length: refused once the limit is crossed, without
    // waiting for the rest of the body.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
    let head = format!(
        "POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        TOKENS[0]
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let chunk = format!("400\r\n{}\r\n", " ".repeat(1024));
    for _ in 0..80 {
        if tcp.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut answer)).await.unwrap().unwrap();
    let line = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    assert_eq!(a.written().await, 0);
}

#[tokio::test]
async fn sql_injection_is_stored_verbatim() {
    let a = api().await;
    let nasty = "'; DROP TABLE events; -- \" OR 1=1 /* ünïcødé 🚚 */";
    let (status, body) = a
        .post("481207", json!({"event_id": "sms_1", "kind": "inbound_sms", "from": "+15555550100", "body": nasty}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, json!({"event_id": "sms_1", "status": "queued"}));
    let stored = a.store.published_body(&LoadId::parse("481207").unwrap(), "sms_1").await.unwrap().unwrap();
    let v: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(v["body"], nasty);
    assert_eq!(a.written().await, 1);
}

#[tokio::test]
async fn a_reused_event_id_is_a_duplicate_or_422() {
    let a = api().await;
    assert_eq!(a.post("481207", ping()).await.0, StatusCode::ACCEPTED);
    // The same event again (no `at`: both got the receive time): a duplicate.
    let (status, body) = a.post("481207", ping()).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("duplicate")));
    // The same id with another payload.
    let mut other = ping();
    other["risk"] = json!("low");
    let (status, body) = a.post("481207", other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "event_id_reused");
    // The same id on another load is another event.
    assert_eq!(a.post("481208", ping()).await.0, StatusCode::ACCEPTED);
    assert_eq!(a.written().await, 2);
}

#[tokio::test]
async fn unknown_load_is_404_and_health_and_metrics_answer() {
    let a = api().await;
    let resp = a.client.get(format!("{}/v1/loads/481207", a.base)).bearer_auth(TOKENS[0]).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_such_load");
    assert_eq!(a.client.get(format!("{}/healthz", a.base)).send().await.unwrap().status(), StatusCode::OK);
    let m = a.client.get(format!("{}/metrics", a.base)).send().await.unwrap();
    assert_eq!(m.status(), StatusCode::OK);
    assert!(m.text().await.unwrap().contains("haul_queue_depth"));
}

/// A prompt an LLM decision names is read back by its hash; an unknown hash is 404, a
/// text that is not a hash 400, and the token comes first.
#[tokio::test]
async fn a_decisions_prompt_is_read_back_by_its_hash() {
    let a = api().await;
    let text = "the input of p1";
    let hash = haul_runtime::llm::sha256_hex(text);
    let payload = json!({"decision_id": "dec:p1", "event_id": "p1", "decided_at": "2026-03-02T07:00:00Z",
        "decider": "llm:m", "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": [],
        "llm": {"model": "m", "input_tokens": 1, "output_tokens": 1, "prompt_hash": hash, "input_hash": hash}});
    let mut decision = NewEntry::stored("dec:p1", "decision_recorded", payload);
    decision.derived.prompts = vec![(hash.clone(), text.to_owned())];
    let ping = NewEntry::stored("p1", "location_ping", json!({}));
    let at = "2026-03-02T07:00:00Z".parse().unwrap();
    a.store.append(&LoadId::parse("481207").unwrap(), vec![ping, decision], 0, vec![], at).await.unwrap();
    let get = async |path: &str, token: bool| {
        let mut req = a.client.get(format!("{}/v1/prompts/{path}", a.base));
        if token {
            req = req.bearer_auth(TOKENS[0]);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        (status, resp.json::<Value>().await.unwrap_or(Value::Null))
    };
    assert_eq!(get(&hash, true).await, (StatusCode::OK, json!({"hash": hash, "text": text})));
    let (status, body) = get(&"0".repeat(64), true).await;
    assert_eq!((status, &body["error"]["code"]), (StatusCode::NOT_FOUND, &json!("no_such_prompt")));
    for bad in ["abc", &hash.to_uppercase(), "%FF%FE", &"a".repeat(65)] {
        let (status, body) = get(bad, true).await;
        assert_eq!((status, &body["error"]["code"]), (StatusCode::BAD_REQUEST, &json!("bad_prompt_hash")), "{bad}");
    }
    assert_eq!(get(&hash, false).await.0, StatusCode::UNAUTHORIZED);
}

const SMS: [(&str, &str); 4] =
    [("From", "+15555550100"), ("To", "+15555550000"), ("Body", "ETA 9:15"), ("MessageSid", "SM8a1f")];

#[tokio::test]
async fn twilio_webhook_checks_the_signature() {
    let a = api().await;
    // The load's first event, as a worker appends it: its facts route the SMS.
    let update = NewEntry::stored("load:init", "load_update", json!({"driver_phone": "+15555550100"}));
    let at = "2026-03-02T07:00:00Z".parse().unwrap();
    a.store.append(&LoadId::parse("481207").unwrap(), vec![update], 0, vec![], at).await.unwrap();
    assert_eq!(a.twilio(&SMS, None).await.status(), StatusCode::FORBIDDEN);
    assert_eq!(a.twilio(&SMS, Some("bm90IGEgc2lnbmF0dXJl".into())).await.status(), StatusCode::FORBIDDEN);
    let mut tampered = SMS;
    tampered[2].1 = "ETA never";
    assert_eq!(a.twilio(&tampered, Some(a.sign(&SMS))).await.status(), StatusCode::FORBIDDEN);
    assert_eq!(a.written().await, 0);
    let resp = a.twilio(&SMS, Some(a.sign(&SMS))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.text().await.unwrap().contains("<Response>"));
    let body = a.store.published_body(&LoadId::parse("481207").unwrap(), "sms:SM8a1f").await.unwrap().unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["kind"].as_str(), v["body"].as_str()), (Some("inbound_sms"), Some("ETA 9:15")));
    // A replay (same MessageSid) is deduplicated.
    assert_eq!(a.twilio(&SMS, Some(a.sign(&SMS))).await.status(), StatusCode::OK);
    assert_eq!(a.written().await, 1);
}

/// With no auth token set the webhook cannot check a signature, so it refuses every
/// request: even one signed with an empty key (what an unset token read as "" would
/// accept), and nothing is written.
#[tokio::test]
async fn twilio_webhook_without_an_auth_token_refuses_everything() {
    let a = api_configured(LIMITS, None).await;
    let pairs: Vec<(String, String)> = SMS.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let empty_key = twilio::signature("", &format!("{}/v1/webhooks/twilio/sms", a.base), &pairs);
    for signature in [None, Some(empty_key), Some(a.sign(&SMS))] {
        let resp = a.twilio(&SMS, signature).await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "webhook_not_configured", "{body}");
    }
    assert_eq!(a.written().await, 0);
    assert!(a.store.unmatched_sms(10).await.unwrap().is_empty(), "nothing kept either");
}

#[tokio::test]
async fn twilio_sms_from_no_active_load_is_kept_as_unmatched() {
    let a = api().await;
    let resp = a.twilio(&SMS, Some(a.sign(&SMS))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(a.written().await, 0);
    let list: Value = a
        .client
        .get(format!("{}/v1/webhooks/twilio/unmatched", a.base))
        .bearer_auth(TOKENS[0])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["unmatched"][0]["message_sid"], "SM8a1f");
    assert_eq!(list["unmatched"][0]["body"], "ETA 9:15");
}

#[tokio::test]
async fn twilio_flood_from_one_number_is_429() {
    let a = api().await;
    let mut statuses = Vec::new();
    for i in 0..=SMS_PER_MINUTE {
        let sid = format!("SM{i:04}");
        let params = [("From", "+15555550177"), ("To", "+15555550000"), ("Body", "spam"), ("MessageSid", sid.as_str())];
        statuses.push(a.twilio(&params, Some(a.sign(&params))).await.status());
    }
    assert!(statuses[..SMS_PER_MINUTE as usize].iter().all(|s| *s == StatusCode::OK));
    assert_eq!(statuses[SMS_PER_MINUTE as usize], StatusCode::TOO_MANY_REQUESTS);
    // Other numbers are not affected.
    let params = [("From", "+15555550178"), ("To", "+15555550000"), ("Body", "hi"), ("MessageSid", "SMother")];
    assert_eq!(a.twilio(&params, Some(a.sign(&params))).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn twilio_signed_forms_out_of_form_are_kept_not_refused() {
    // A 400 would make Twilio drop the message; it is kept for a person instead
    // (tests/twilio.rs has the whole battery, on both backends).
    let a = api().await;
    let missing = [("From", "+15555550100"), ("Body", "x")];
    assert_eq!(a.twilio(&missing, Some(a.sign(&missing))).await.status(), StatusCode::OK);
    let bad_sid = [("From", "+15555550100"), ("To", "+1"), ("Body", "x"), ("MessageSid", "SM/../x")];
    assert_eq!(a.twilio(&bad_sid, Some(a.sign(&bad_sid))).await.status(), StatusCode::OK);
    assert_eq!(a.written().await, 0);
    assert_eq!(a.store.unmatched_sms(10).await.unwrap().len(), 2);
}

impl Api {
    /// Sends `head` over a fresh connection and sends nothing more; the start of the
    /// answer, read within five seconds.
    async fn raw(&self, head: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(self.base.trim_start_matches("http://")).await.unwrap();
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("no answer within 5 s to {head:?}"))
            .unwrap_or(0);
        String::from_utf8_lossy(&answer[..n]).into_owned()
    }
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_only_one_authorization_header_counts() {
    let a = api().await;
    let t = TOKENS[0];
    // (Authorization headers sent, expected status)
    let cases: Vec<(Vec<String>, StatusCode)> = vec![
        (vec![format!("Bearer {t}")], StatusCode::ACCEPTED),
        (vec![format!("bearer {t}")], StatusCode::ACCEPTED),
        (vec![format!("BEARER {t}")], StatusCode::ACCEPTED),
        (vec![format!("bEaReR   {t}")], StatusCode::ACCEPTED),
        (vec![format!("Bearer {t}"), format!("Bearer {t}")], StatusCode::UNAUTHORIZED),
        (vec!["Bearer wrong-token-000".into(), format!("Bearer {t}")], StatusCode::UNAUTHORIZED),
        (vec![format!("Basic {t}")], StatusCode::UNAUTHORIZED),
        (vec![format!("Bearer{t}")], StatusCode::UNAUTHORIZED),
        (vec![format!("Bearer {t} {t}")], StatusCode::UNAUTHORIZED),
        (vec![t.to_owned()], StatusCode::UNAUTHORIZED),
        (vec!["Bearer".into()], StatusCode::UNAUTHORIZED),
    ];
    let mut accepted = 0;
    for (i, (headers, want)) in cases.into_iter().enumerate() {
        let mut event = ping();
        event["event_id"] = json!(format!("ping_{i}"));
        let mut req = a.client.post(format!("{}/v1/loads/481207/events", a.base)).body(event.to_string());
        for h in &headers {
            req = req.header("authorization", h);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(status, want, "{headers:?}: {body}");
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(body["error"]["code"], "unauthorized", "{headers:?}: {body}");
        } else {
            accepted += 1;
        }
    }
    assert_eq!(a.written().await, accepted);
}

#[tokio::test]
async fn the_frameworks_own_rejections_are_json_and_come_after_the_token() {
    let a = api().await;
    // (method, path, with the token, expected status, expected code)
    for (method, path, token, want, code) in [
        ("POST", "/v1/loads/%FF/events", true, 400, "bad_load_id"),
        ("POST", "/v1/loads/%FF/events", false, 401, "unauthorized"),
        ("GET", "/v1/loads/%FF", true, 400, "bad_load_id"),
        ("GET", "/v1/loads/%FF", false, 401, "unauthorized"),
        ("GET", "/v1/webhooks/twilio/unmatched?limit=abc", true, 400, "bad_query"),
        ("GET", "/v1/webhooks/twilio/unmatched?limit=-1", true, 400, "bad_query"),
        ("GET", "/v1/webhooks/twilio/unmatched?limit=abc", false, 401, "unauthorized"),
        ("GET", "/v1/nowhere", true, 404, "not_found"),
        ("GET", "/v1/nowhere", false, 401, "unauthorized"),
        ("DELETE", "/v1/loads/481207", true, 405, "method_not_allowed"),
        ("DELETE", "/v1/loads/481207", false, 401, "unauthorized"),
        ("GET", "/v1/webhooks/twilio/sms", false, 401, "unauthorized"),
        ("GET", "/nowhere", false, 404, "not_found"),
        ("POST", "/healthz", false, 405, "method_not_allowed"),
    ] {
        let mut req = a.client.request(method.parse().unwrap(), format!("{}{path}", a.base));
        if token {
            req = req.bearer_auth(TOKENS[0]);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: not JSON: {text:?}"));
        assert_eq!((status, body["error"]["code"].as_str()), (want, Some(code)), "{method} {path}: {body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{method} {path}: {body}");
    }
    assert_eq!(a.written().await, 0);
}

#[tokio::test]
async fn error_messages_clip_the_input_they_echo() {
    let a = api().await;
    let long = "Z".repeat(60 * 1024);
    let mut unknown_field = json!({"event_id": "p", "kind": "location_ping", "lat": 1, "lon": 0, "risk": "high"});
    unknown_field[&long] = json!(1);
    for (body, code) in [
        (unknown_field, "bad_payload"),
        (json!({"event_id": "p", "kind": "location_ping", "lat": 1, "lon": 0, "risk": long}), "bad_payload"),
        (json!({"event_id": "p", "kind": "location_ping", "lat": long, "lon": 0, "risk": "high"}), "bad_payload"),
        (json!({"event_id": "u", "kind": "load_update", "stage": long}), "bad_payload"),
        (json!({"event_id": "u", "kind": "load_update", "client": long}), "bad_payload"),
        (json!({"event_id": long, "kind": "location_ping"}), "bad_event_id"),
        (json!({"event_id": "p", "kind": long}), "unknown_kind"),
    ] {
        let (status, answer) = a.post("481207", body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some(code)), "{answer:.300}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("ZZZ"), "the message still shows the start of what was wrong: {message:.300}");
        assert!(message.chars().count() <= 300, "{} characters: {message:.300}…", message.chars().count());
    }
    assert_eq!(a.written().await, 0);
}

#[tokio::test]
async fn expect_continue_with_a_body_over_the_limit_is_413_not_100_continue() {
    let a = api().await;
    for (path, auth) in [
        ("/v1/loads/481207/events", format!("Authorization: Bearer {}\r\n", TOKENS[0])),
        ("/v1/webhooks/twilio/sms", String::new()),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 1000000\r\nExpect: 100-continue\r\n\r\n"
        );
        let answer = a.raw(&head).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(answer.contains("body_too_large"), "{path}: {answer}");
    }
    assert_eq!(a.written().await, 0);
}

/// `n` connections that each send the start of a request's head and never the rest.
async fn half_sent(a: &Api, n: usize) -> Vec<tokio::net::TcpStream> {
    use tokio::io::AsyncWriteExt;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let mut tcp = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
        tcp.write_all(b"POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        held.push(tcp);
    }
    held
}

/// Reads `tcp` until the server closes it; panics if that takes longer than `within`.
async fn closed_within(tcp: &mut tokio::net::TcpStream, within: Duration, what: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 1024];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    };
    if tokio::time::timeout(within, read_all).await.is_err() {
        panic!("{what}: still open after {within:?}");
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn a_wrong_token_is_401_at_once_whatever_the_body() {
    let a = api().await;
    for (framing, body_start) in [
        ("Content-Length: 60000\r\n", "{\"event_id\":"),
        ("Content-Length: 100000000\r\nExpect: 100-continue\r\n", ""),
        ("Transfer-Encoding: chunked\r\n", "10\r\n{\"event_id\":"),
    ] {
        let head = format!(
            "POST /v1/loads/481207/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong-token-000\r\n{framing}\r\n{body_start}"
        );
        let started = std::time::Instant::now();
        let answer = a.raw(&head).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{framing}: {answer}");
        assert!(started.elapsed() < Duration::from_millis(500), "{framing}: took {:?}", started.elapsed());
    }
    assert_eq!(a.written().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_after_the_header_timeout_while_others_are_served() {
    let a = api().await;
    let mut held = half_sent(&a, 300).await;
    let started = std::time::Instant::now();
    let health = a.client.get(format!("{}/healthz", a.base)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(1), "healthz took {:?} beside 300 stalled", started.elapsed());
    for (i, tcp) in held.iter_mut().enumerate() {
        let within = LIMITS.header_read_timeout + Duration::from_secs(3);
        closed_within(tcp, within.saturating_sub(started.elapsed()), &format!("half-sent request {i}")).await;
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = api().await;
    let mut tcp = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 512];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    closed_within(&mut tcp, LIMITS.header_read_timeout + Duration::from_secs(2), "an idle connection").await;
}

#[tokio::test]
async fn a_stalled_body_is_408_after_the_body_timeout() {
    let a = api().await;
    for (path, auth) in [
        ("/v1/loads/481207/events", format!("Authorization: Bearer {}\r\n", TOKENS[0])),
        ("/v1/webhooks/twilio/sms", String::new()),
    ] {
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 1000\r\n\r\n{{\"event_id\":");
        let mut tcp = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut tcp, head.as_bytes()).await.unwrap();
        let answer = closed_within(&mut tcp, LIMITS.body_read_timeout + Duration::from_secs(2), path).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(answer.contains("body_timeout"), "{path}: {answer}");
    }
    assert_eq!(a.written().await, 0);
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_at_once() {
    let a = api_with(Limits { max_connections: 8, header_read_timeout: Duration::from_secs(30), ..LIMITS }).await;
    let held = half_sent(&a, 8).await;
    // Let the server take all eight before the ninth knocks.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ninth = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
    let answer = closed_within(&mut ninth, Duration::from_secs(2), "the ninth connection").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too_many_connections"), "{answer}");
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match a.client.get(format!("{}/healthz", a.base)).send().await {
            Ok(r) if r.status() == StatusCode::OK => break,
            other => assert!(std::time::Instant::now() < deadline, "slots never came back: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_request_head_over_16_kib_is_431() {
    let a = api().await;
    let head = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n", "p".repeat(20 * 1024));
    let answer = a.raw(&head).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    let fine = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: {}\r\n\r\n", "p".repeat(8 * 1024));
    assert!(a.raw(&fine).await.starts_with("HTTP/1.1 200"));
}

/// A connection that pipelines requests for a large answer and never reads a byte.
async fn never_reading(a: &Api, requests: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
    let one = "GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n";
    // Written from a task: the server stops reading once its answers back up, and a
    // write of every request at once would then wait forever.
    let (_, mut write) = tcp.split();
    let _ = tokio::time::timeout(Duration::from_millis(300), write.write_all(one.repeat(requests).as_bytes())).await;
    tcp
}

/// The attack of the edge review: clients that pipeline requests and never read the
/// answers held every slot (`/healthz` answered 503 for as long as they stayed). Now
/// the one with no request in the service for longest makes room for a new client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_hold_no_slot() {
    let cap = 8;
    let a = api_with(Limits {
        max_connections: cap,
        header_read_timeout: Duration::from_secs(30),
        write_timeout: Duration::from_secs(60),
        ..LIMITS
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..cap + 4 {
        held.push(never_reading(&a, 150).await);
    }
    // Past the eviction age: every held connection is one a new client may displace.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in 0..5 {
        let fresh =
            reqwest::Client::builder().timeout(Duration::from_secs(5)).pool_max_idle_per_host(0).build().unwrap();
        let started = std::time::Instant::now();
        let r = fresh.get(format!("{}/healthz", a.base)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "fresh client {i} beside {} clients that never read", held.len());
        assert!(started.elapsed() < Duration::from_secs(2), "fresh client {i} waited {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        held.push(never_reading(&a, 150).await);
    }
    assert!(a.metric("haul_http_connections_evicted_total").await >= 5.0);
}

/// A client that stops reading its answers is closed once a write has made no
/// progress for `server.write_timeout`, and the requests it pipelined behind are never
/// read: it got far fewer answers than it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_closed_after_the_write_timeout() {
    use tokio::io::AsyncReadExt;
    let a = api_with(Limits {
        write_timeout: Duration::from_secs(1),
        header_read_timeout: Duration::from_secs(30),
        ..LIMITS
    })
    .await;
    let mut tcp = never_reading(&a, 150).await;
    tokio::time::sleep(LIMITS.write_timeout + Duration::from_secs(2)).await;
    let mut seen = Vec::new();
    let read_all = tcp.read_to_end(&mut seen);
    let closed = tokio::time::timeout(Duration::from_secs(5), read_all).await;
    assert!(closed.is_ok(), "the connection was still open after the write timeout");
    let answers = String::from_utf8_lossy(&seen).matches("HTTP/1.1 200").count();
    assert!(answers < 150, "all {answers} answers were written: the connection was never closed");
    assert!(a.metric("haul_http_write_timeouts_total").await >= 1.0);
}

/// Every answer says `nosniff`, whatever made it; under `/console` the router's own 404
/// and 405 carry the console's headers too; HSTS only when the world reaches haul
/// over https.
#[tokio::test]
async fn every_answer_carries_the_edge_headers_and_console_answers_their_own() {
    for public_url in ["http://127.0.0.1", "https://haul.example.com"] {
        let store = haul_backends::open("sqlite::memory:", Some(3)).await.unwrap();
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse().unwrap()));
        let state = ApiState::new(
            store.clone(),
            store as Arc<dyn LoadQueue>,
            clock,
            vec![TOKENS[0].to_string()],
            None,
            public_url.to_string(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router(Arc::new(state), true)).await.unwrap() });
        let client = reqwest::Client::new();
        let https = public_url.starts_with("https");
        for (method, path, status) in [
            ("GET", "/healthz", 200),
            ("GET", "/metrics", 200),
            ("GET", "/v1/openapi.json", 200),
            ("GET", "/v1/loads/481207", 401),
            ("PUT", "/healthz", 405),
            ("GET", "/nope", 404),
            ("GET", "/console/sign-in", 200),
            ("GET", "/console/sign-out", 405),
            ("DELETE", "/console/dead/requeue", 405),
            ("GET", "/console/nope", 404),
        ] {
            let r = client.request(method.parse().unwrap(), format!("{base}{path}")).send().await.unwrap();
            assert_eq!(r.status().as_u16(), status, "{method} {path}");
            let h = r.headers();
            assert_eq!(
                h.get("x-content-type-options").map(|v| v.to_str().unwrap()),
                Some("nosniff"),
                "{method} {path}"
            );
            assert_eq!(h.contains_key("strict-transport-security"), https, "{public_url}: {method} {path}");
            if path.starts_with("/console") {
                for (name, value) in haul_server::console::SECURITY_HEADERS {
                    assert_eq!(h.get(name).map(|v| v.to_str().unwrap()), Some(value), "{method} {path}: {name}");
                }
            }
        }
    }
}

/// A caller's `traceparent` is continued (its trace, a span of haul's own) by the queued
/// message; without one, or with one that does not read, the event is queued all the
/// same with a trace of its own. A repeat of an event keeps its first publish's trace.
#[tokio::test]
async fn a_callers_trace_is_continued_and_a_malformed_one_refuses_nothing() {
    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let a = api().await;
    let post = async |load: &str, traceparent: Option<&str>| {
        let mut req = a
            .client
            .post(format!("{}/v1/loads/{load}/events", a.base))
            .bearer_auth(TOKENS[0])
            .json(&json!({"event_id": "e1", "kind": "load_update", "stage": "in_transit"}));
        if let Some(t) = traceparent {
            req = req.header("traceparent", t);
        }
        req.send().await.unwrap().status()
    };
    assert_eq!(post("L1", Some(GIVEN)).await, StatusCode::ACCEPTED);
    assert_eq!(post("L2", Some("00-not-a-trace")).await, StatusCode::ACCEPTED);
    assert_eq!(post("L3", None).await, StatusCode::ACCEPTED);
    // Two contexts: neither is taken.
    let twice = a
        .client
        .post(format!("{}/v1/loads/L4/events", a.base))
        .bearer_auth(TOKENS[0])
        .header("traceparent", GIVEN)
        .header("traceparent", GIVEN)
        .json(&json!({"event_id": "e1", "kind": "load_update", "stage": "in_transit"}))
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::ACCEPTED);
    assert_eq!(post("L1", Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")).await, StatusCode::OK);
    let now = "2026-03-02T07:00:00Z".parse().unwrap();
    let got = a.store.receive(10, Duration::from_secs(30), now).await.unwrap();
    let trace = |load: &str| got.iter().find(|m| m.load_id.as_str() == load).and_then(|m| m.trace).unwrap();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(trace("L1").trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736", "the first publish's");
    assert_ne!(trace("L1").span_id_hex(), "00f067aa0ba902b7", "a span of haul's");
    assert!(trace("L1").sampled());
    for load in ["L2", "L3", "L4"] {
        assert_ne!(trace(load).trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
    assert_ne!(trace("L2").trace_id, trace("L3").trace_id);
}
