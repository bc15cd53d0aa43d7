//! The Twilio webhook against replays and bad input, on SQLite and PostgreSQL.
//!
//! A MessageSid is taken once across all loads: a replayed request (its signature
//! never expires) answers 200 and does nothing, whichever load its number belongs to
//! by then. The `sms:` event ids are the webhook's: the ingestion API refuses them.
//! Whatever a signed request holds, it is answered 200 and kept: routed to its load
//! when it validates, otherwise cleaned, clipped and listed as unmatched with the
//! reason, the same on both backends.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use haul_core::action::ActionType;
use haul_core::ids::LoadId;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_store::{LoadQueue, NewEntry, NewOutboxRow, Published, QueueError, QueueMessage, Store, StoreError};
use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{Api, Backend, api, api_with_queue};

const DRIVER: &str = "+15555550100";
const HAUL_NUMBER: &str = "+15555550000";
/// The token the test server checks signatures with (`common::TWILIO`).
const TWILIO_TOKEN: &str = common::TWILIO;

fn l(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn sms<'a>(from: &'a str, body: &'a str, sid: &'a str) -> [(&'a str, &'a str); 4] {
    [("From", from), ("To", HAUL_NUMBER), ("Body", body), ("MessageSid", sid)]
}

/// Gives `load` the driver `phone`, active or delivered, as a worker's append of a
/// `load_update` does.
async fn assign(a: &Api, load: &str, phone: &str, active: bool) {
    let version = a.store.read(&l(load)).await.unwrap().1;
    let stage = if active { "in_transit" } else { "delivered" };
    let update = NewEntry::stored(format!("u{version}"), "load_update", json!({"driver_phone": phone, "stage": stage}));
    a.store.append(&l(load), vec![update], version, vec![], t0()).await.unwrap();
}

/// The body an SMS was queued with on a load, if it was.
async fn queued(a: &Api, load: &str, sid: &str) -> Option<Value> {
    let body = a.store.published_body(&l(load), &format!("sms:{sid}")).await.unwrap()?;
    Some(serde_json::from_str(&body).unwrap())
}

/// The webhook's tests take turns: they read `haul_unmatched_sms_total`, which every
/// test of this binary shares when `cargo test` runs them as threads of one process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn a_replayed_sms_never_reaches_another_load(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    let counted = a.metric("haul_unmatched_sms_total").await;
    // Kept as unmatched: nobody drives with this number yet.
    let first = sms(DRIVER, "ETA 9:15", "SMa1");
    assert_eq!(a.twilio(&first).await.0, StatusCode::OK);
    assert_eq!(a.unmatched().await.len(), 1);
    // The number goes to a load; the captured request comes back.
    assign(&a, "L1", DRIVER, true).await;
    assert_eq!(a.twilio(&first).await.0, StatusCode::OK);
    assert_eq!(queued(&a, "L1", "SMa1").await, None, "the replay became an event of L1");
    assert_eq!(a.store.depth().await.unwrap(), 0);
    assert_eq!(a.unmatched().await.len(), 1);
    assert_eq!(a.metric("haul_unmatched_sms_total").await - counted, 1.0, "one message, whatever its replays");

    // Matched to L1; the number moves to L2; the request comes back.
    let second = sms(DRIVER, "Running late", "SMb2");
    assert_eq!(a.twilio(&second).await.0, StatusCode::OK);
    assert_eq!(queued(&a, "L1", "SMb2").await.unwrap()["body"], "Running late");
    assign(&a, "L1", DRIVER, false).await;
    assign(&a, "L2", DRIVER, true).await;
    assert_eq!(a.twilio(&second).await.0, StatusCode::OK);
    assert_eq!(queued(&a, "L2", "SMb2").await, None, "the replay became an event of L2");
    assert_eq!(a.store.depth().await.unwrap(), 1);
}

async fn the_api_refuses_sms_event_ids_so_the_real_sms_gets_through(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    assign(&a, "L1", DRIVER, true).await;
    let forged = json!({"event_id": "sms:SMc3", "kind": "inbound_sms", "from": DRIVER, "body": "delivered, all good"});
    let (status, answer) = a.post_event("L1", &forged).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "reserved_event_id");
    assert!(answer["error"]["message"].as_str().unwrap().contains("sms:"), "{answer}");
    assert_eq!(a.store.depth().await.unwrap(), 0);
    assert_eq!(a.twilio(&sms(DRIVER, "Flat tyre, 2h late", "SMc3")).await.0, StatusCode::OK);
    assert_eq!(queued(&a, "L1", "SMc3").await.unwrap()["body"], "Flat tyre, 2h late");
}

/// The store's own queue, but the first `failures` publishes fail as an outage would.
struct FailingPublishes {
    store: Arc<dyn Store>,
    failures: AtomicU32,
}

#[async_trait]
impl LoadQueue for FailingPublishes {
    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        if self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(StoreError::new("the queue is down"));
        }
        self.store.publish_traced(load_id, event_id, body, trace, now).await
    }
    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError> {
        self.store.receive(max, visibility, now).await
    }
    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        self.store.ack(receipt, now).await
    }
    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        self.store.nack(receipt, delay, now).await
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        self.store.depth().await
    }
    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError> {
        self.store.published_body(load_id, event_id).await
    }
}

async fn a_publish_that_failed_goes_through_on_twilios_retry(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api_with_queue(backend, |store| Arc::new(FailingPublishes { store, failures: AtomicU32::new(1) })).await;
    assign(&a, "L1", DRIVER, true).await;
    let msg = sms(DRIVER, "ETA 10:40", "SMd4");
    assert_eq!(a.twilio(&msg).await.0, StatusCode::SERVICE_UNAVAILABLE, "the outage is Twilio's to retry");
    assert_eq!(queued(&a, "L1", "SMd4").await, None);
    // Twilio's retry: the MessageSid was taken, and goes to the load it was taken for.
    assert_eq!(a.twilio(&msg).await.0, StatusCode::OK);
    assert_eq!(queued(&a, "L1", "SMd4").await.unwrap()["body"], "ETA 10:40");
    assert_eq!(a.twilio(&msg).await.0, StatusCode::OK);
    assert_eq!(a.store.depth().await.unwrap(), 1);
}

/// One bad (or borderline) webhook request and what must be kept of it.
struct Case {
    name: &'static str,
    params: Vec<(&'static str, String)>,
    /// `None`: routed to L1 (it validates). `Some`: kept as unmatched with these.
    kept: Option<Kept>,
}

struct Kept {
    /// `None`: a key the webhook makes up (no usable MessageSid).
    sid: Option<&'static str>,
    from: String,
    to: String,
    body: String,
    /// Part of the reason given.
    reason: &'static str,
}

fn form(from: &str, to: &str, body: &str, sid: &str) -> Vec<(&'static str, String)> {
    vec![("From", from.into()), ("To", to.into()), ("Body", body.into()), ("MessageSid", sid.into())]
}

fn without(mut params: Vec<(&'static str, String)>, name: &str) -> Vec<(&'static str, String)> {
    params.retain(|(k, _)| *k != name);
    params
}

fn kept(sid: Option<&'static str>, from: &str, to: &str, body: &str, reason: &'static str) -> Option<Kept> {
    Some(Kept { sid, from: from.into(), to: to.into(), body: body.into(), reason })
}

fn cases() -> Vec<Case> {
    let long = "x".repeat(2_000);
    let huge = "y".repeat(60 * 1024);
    let at_bound = "z".repeat(1_600);
    let other = "+15555550199";
    vec![
        Case {
            name: "a matched SMS with a control character",
            params: form(DRIVER, HAUL_NUMBER, "ETA\u{7} 9:15", "SMctl1"),
            kept: kept(Some("SMctl1"), DRIVER, HAUL_NUMBER, "ETA\u{FFFD} 9:15", "control character"),
        },
        Case {
            name: "a matched SMS with a NUL",
            params: form(DRIVER, HAUL_NUMBER, "ETA\u{0}9:15", "SMnul1"),
            kept: kept(Some("SMnul1"), DRIVER, HAUL_NUMBER, "ETA9:15", "control character"),
        },
        Case {
            name: "a matched SMS over 1,600 characters",
            params: form(DRIVER, HAUL_NUMBER, &long, "SMlong1"),
            kept: kept(Some("SMlong1"), DRIVER, HAUL_NUMBER, &long[..1_600], "longer than 1600"),
        },
        Case {
            name: "an unmatched SMS of 60 KB",
            params: form(other, HAUL_NUMBER, &huge, "SMhuge1"),
            kept: kept(Some("SMhuge1"), other, HAUL_NUMBER, &huge[..1_600], "longer than 1600"),
        },
        Case {
            name: "an empty From",
            params: form("", HAUL_NUMBER, "who am I", "SMnofrom1"),
            kept: kept(Some("SMnofrom1"), "", HAUL_NUMBER, "who am I", "From is empty"),
        },
        Case {
            name: "a NUL in From",
            params: form("+1555\u{0}5550100", HAUL_NUMBER, "hi", "SMnulfrom1"),
            kept: kept(Some("SMnulfrom1"), DRIVER, HAUL_NUMBER, "hi", "From contains a control character"),
        },
        Case {
            name: "a From of 100 characters",
            params: form(&"9".repeat(100), HAUL_NUMBER, "hi", "SMlongfrom1"),
            kept: kept(Some("SMlongfrom1"), &"9".repeat(32), HAUL_NUMBER, "hi", "From is longer than 32"),
        },
        Case {
            name: "a To of 5,000 characters",
            params: form(DRIVER, &"8".repeat(5_000), "hi", "SMlongto1"),
            kept: kept(Some("SMlongto1"), DRIVER, &"8".repeat(32), "hi", "To is longer than 32"),
        },
        Case {
            name: "no Body",
            params: without(form(DRIVER, HAUL_NUMBER, "", "SMnobody1"), "Body"),
            kept: kept(Some("SMnobody1"), DRIVER, HAUL_NUMBER, "", "Body is missing"),
        },
        Case {
            name: "no MessageSid",
            params: without(form(DRIVER, HAUL_NUMBER, "no sid at all", ""), "MessageSid"),
            kept: kept(None, DRIVER, HAUL_NUMBER, "no sid at all", "MessageSid is missing"),
        },
        Case {
            name: "a MessageSid out of form",
            params: form(DRIVER, HAUL_NUMBER, "odd sid", "SM/../x\u{0}"),
            kept: kept(None, DRIVER, HAUL_NUMBER, "odd sid", "MessageSid"),
        },
        Case {
            name: "a matched SMS of exactly 1,600 characters, with tabs and line breaks",
            params: form(DRIVER, HAUL_NUMBER, &format!("a\tb\r\n{}", &at_bound[6..]), "SMbound1"),
            kept: None,
        },
    ]
}

async fn bad_webhook_inputs_are_kept_as_unmatched(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    let counted = a.metric("haul_unmatched_sms_total").await;
    assign(&a, "L1", DRIVER, true).await;
    let cases = cases();
    for round in ["first", "replayed"] {
        let mut refused = Vec::new();
        for c in &cases {
            let params: Vec<(&str, &str)> = c.params.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (status, answer) = a.twilio(&params).await;
            if status != StatusCode::OK || !answer.contains("<Response>") {
                refused.push(format!("{}: {status} {answer}", c.name));
            }
        }
        assert!(refused.is_empty(), "{backend:?}, {round}: answered other than 200:\n{}", refused.join("\n"));
        let unmatched = a.unmatched().await;
        let kept_cases = cases.iter().filter(|c| c.kept.is_some()).count();
        assert_eq!(unmatched.len(), kept_cases, "{round}: one row per message: {unmatched:#?}");
        let distinct = a.metric("haul_unmatched_sms_total").await - counted;
        assert_eq!(distinct, kept_cases as f64, "{round}: distinct messages");
        assert_eq!(a.store.depth().await.unwrap(), 1, "{round}: only the valid SMS was queued");
    }
    let unmatched = a.unmatched().await;
    for c in &cases {
        let Some(k) = &c.kept else {
            let sid = &c.params.iter().find(|(n, _)| *n == "MessageSid").unwrap().1;
            assert_eq!(queued(&a, "L1", sid).await.unwrap()["body"], c.params[2].1, "{}", c.name);
            continue;
        };
        let row = unmatched
            .iter()
            .find(|u| match k.sid {
                Some(sid) => u["message_sid"] == sid,
                None => u["body"] == k.body.as_str(),
            })
            .unwrap_or_else(|| panic!("{}: not kept: {unmatched:#?}", c.name));
        if k.sid.is_none() {
            let key = row["message_sid"].as_str().unwrap();
            assert!(key.starts_with("nosid:") && key.len() <= 64, "{}: {key}", c.name);
        }
        assert_eq!(row["from"], k.from.as_str(), "{}", c.name);
        assert_eq!(row["to"], k.to.as_str(), "{}", c.name);
        assert_eq!(row["body"], k.body.as_str(), "{}", c.name);
        let reason = row["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(k.reason), "{}: reason {reason:?}", c.name);
        if let Some(sid) = k.sid {
            assert_eq!(queued(&a, "L1", sid).await, None, "{}: kept, not routed", c.name);
        }
    }
}

/// The trace context of the run that decided the SMS rows `a_sent_sms` makes.
const ROW_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A `send_sms` row of `load`, sent: Twilio's sid `receipt` kept with it.
async fn a_sent_sms(a: &Api, load: &str, row_id: &str, receipt: Option<&str>) {
    let version = a.store.read(&l(load)).await.unwrap().1;
    let update =
        NewEntry::stored(format!("u{version}"), "load_update", json!({"driver_phone": DRIVER, "stage": "in_transit"}));
    let action = json!({"key": row_id, "type": "send_sms", "ask_id": "eta_request:p1", "step": 1,
                        "params": {"to": DRIVER, "body": "What is your ETA?"}});
    let trace = haul_core::trace::TraceParent::parse(ROW_TRACE);
    let row = NewOutboxRow { id: row_id.into(), action_type: ActionType::SendSms, action, trace };
    a.store.append(&l(load), vec![update], version, vec![row], t0()).await.unwrap();
    if let Some(receipt) = receipt {
        let claims = a.store.pending(10, t0(), Duration::from_secs(90)).await.unwrap();
        let claim = claims.iter().find(|c| c.row.id == row_id).unwrap();
        a.store.mark_dispatched(row_id, &claim.token, receipt, t0()).await.unwrap();
    }
}

fn status(sid: &str, status: &str, code: Option<&str>) -> Vec<(&'static str, String)> {
    let mut form =
        vec![("MessageSid", sid.to_owned()), ("MessageStatus", status.to_owned()), ("AccountSid", "AC1".to_owned())];
    if let Some(code) = code {
        form.push(("ErrorCode", code.to_owned()));
    }
    form
}

async fn post_status(a: &Api, row_id: &str, form: &[(&str, String)]) -> StatusCode {
    let pairs: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    a.twilio_status(&key_query(row_id), &pairs, None).await
}

fn key_query(row_id: &str) -> String {
    serde_urlencoded::to_string([("key", row_id)]).unwrap()
}

/// Twilio's delivery receipts: a message that will not arrive becomes its row's failed
/// outcome, once however many callbacks say so; other statuses, forged, malformed and
/// foreign callbacks queue nothing.
async fn a_failed_delivery_receipt_is_the_rows_failed_outcome_once(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    let row = "L1/ask:eta_request:p1/1/send_sms";
    a_sent_sms(&a, "L1", row, Some("SM1")).await;
    let outcome = |a: &Api| {
        let a_store = a.store.clone();
        async move { a_store.published_body(&l("L1"), &format!("evt:out:{row}:failed")).await.unwrap() }
    };

    assert_eq!(post_status(&a, row, &status("SM1", "sent", None)).await, StatusCode::OK);
    assert_eq!(post_status(&a, row, &status("SM1", "delivered", None)).await, StatusCode::OK);
    assert_eq!(outcome(&a).await, None, "a delivered message queues nothing");

    // Forged or malformed: refused, nothing queued.
    let forged = status("SM1", "undelivered", Some("30006"));
    let pairs: Vec<(&str, &str)> = forged.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(a.twilio_status(&key_query(row), &pairs, Some("Zm9yZ2Vk")).await, StatusCode::FORBIDDEN);
    let other_row = key_query("L1/ask:eta_request:p1/2/send_sms");
    let signed_for_another = a.twilio_status(&other_row, &pairs, None).await;
    assert_eq!(signed_for_another, StatusCode::OK, "signed, for a row that does not exist: unmatched");
    assert_eq!(post_status(&a, row, &[("MessageStatus", "failed".into())]).await, StatusCode::BAD_REQUEST);
    assert_eq!(post_status(&a, row, &status("SM1", "lost", None)).await, StatusCode::BAD_REQUEST);
    assert_eq!(outcome(&a).await, None);

    // Another message's sid on this row's URL: not this row's.
    let unmatched = a.metric("haul_twilio_status_unmatched_total").await;
    assert_eq!(post_status(&a, row, &status("SM2", "failed", Some("30003"))).await, StatusCode::OK);
    assert_eq!(a.metric("haul_twilio_status_unmatched_total").await, unmatched + 1.0);
    assert_eq!(outcome(&a).await, None);

    // Undelivered: the failed outcome, with Twilio's code and the sid.
    assert_eq!(post_status(&a, row, &status("SM1", "undelivered", Some("30006"))).await, StatusCode::OK);
    let body: Value = serde_json::from_str(&outcome(&a).await.expect("the failed outcome is queued")).unwrap();
    assert_eq!((body["kind"].as_str(), body["status"].as_str()), (Some("action_outcome"), Some("failed")), "{body}");
    assert_eq!((body["outbox_id"].as_str(), body["receipt"].as_str()), (Some(row), Some("SM1")), "{body}");
    let failure = body["failure"].as_str().unwrap_or_default();
    assert!(failure.contains("error 30006") && failure.contains("landline"), "{failure}");
    // Queued in the trace of the decision that made the SMS, not the callback's own:
    // under the publish's own (PRODUCER) span, a child of the decision's.
    let queued = a.store.receive(10, Duration::from_secs(1), t0()).await.unwrap();
    let traces: Vec<_> = queued.iter().map(|m| (m.event_id.as_str(), m.trace.map(|t| t.trace_id))).collect();
    let decided = TraceParent::parse(ROW_TRACE).unwrap();
    assert_eq!(traces, [(format!("evt:out:{row}:failed").as_str(), Some(decided.trace_id))]);
    assert_ne!(queued[0].trace.map(|t| t.span_id), Some(decided.span_id), "the publish's span, not the decision's");

    // Twilio's later callbacks for it, and a replay: the same one outcome.
    assert_eq!(post_status(&a, row, &status("SM1", "failed", Some("30006"))).await, StatusCode::OK);
    assert_eq!(post_status(&a, row, &status("SM1", "undelivered", Some("30006"))).await, StatusCode::OK);
    let again: Value = serde_json::from_str(&outcome(&a).await.unwrap()).unwrap();
    assert_eq!(again, body, "one failed outcome");

    // The reports that said how it ended are kept on its load, each once (Twilio's
    // `sent` is not); the foreign one is kept apart for a person, with why.
    let (status_code, view, _) = a.get("/v1/loads/L1").await;
    assert_eq!(status_code, StatusCode::OK, "{view}");
    let mut kept: Vec<(String, String)> = view["sms_reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["status"].as_str().unwrap().to_owned(), r["outbox_id"].as_str().unwrap().to_owned()))
        .collect();
    kept.sort();
    let on_row = |status: &str| (status.to_owned(), row.to_owned());
    assert_eq!(kept, [on_row("delivered"), on_row("failed"), on_row("undelivered")], "{view}");
    let (_, list, _) = a.get("/v1/webhooks/twilio/unmatched").await;
    let apart: Vec<(&str, &str)> = list["status_callbacks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["message_sid"].as_str().unwrap(), r["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(apart, [("SM2", "its row's SMS is another message"), ("SM1", "no outbox row has its key")], "{list}");
}

/// A callback that beats the send's own answer (the sid not kept yet) is vouched for
/// by its row's key in the signed URL.
async fn a_receipt_before_the_sends_answer_is_matched_by_its_key(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    let row = "L2/ask:eta_request:p1/1/send_sms";
    a_sent_sms(&a, "L2", row, None).await;
    assert_eq!(post_status(&a, row, &status("SM9", "failed", Some("30005"))).await, StatusCode::OK);
    let body = a.store.published_body(&l("L2"), &format!("evt:out:{row}:failed")).await.unwrap();
    assert!(body.is_some_and(|b| b.contains("30005")));
}

/// What Twilio's own helper library (twilio-python's `RequestValidator`, the version
/// scripts/requirements-test.txt pins) says of each case: its signature, and whether
/// it validates haul's. Run by scripts/test-python, which installs it when missing.
fn twilio_python_says(cases: &Value) -> Vec<Value> {
    let script = r#"
import json, sys
from twilio.request_validator import RequestValidator
out = []
for case in json.load(sys.stdin):
    v = RequestValidator(case["token"])
    out.append({"signature": v.compute_signature(case["url"], case["params"]),
                "validates_haul": v.validate(case["url"], case["params"], case["haul"])})
print(json.dumps(out))
"#;
    let tool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-python");
    let mut child = std::process::Command::new(tool)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("scripts/test-python runs (it needs python3 and PyPI the first time)");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(cases.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "twilio-python failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// haul's signatures (what it checks, and what these tests sign with) are the ones
/// Twilio's own library computes, for both webhooks' URLs, a status callback's key in
/// its query, a port, and text from outside ASCII.
#[test]
fn haul_signs_as_twilios_own_library_does() {
    let status_url = format!(
        "https://haul.example.com/v1/webhooks/twilio/status?{}",
        serde_urlencoded::to_string([("key", "481207/ask:eta_request:ping_0700/1/send_sms")]).unwrap()
    );
    /// The token, the URL Twilio called, the form.
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>);
    let cases: Vec<Case> = vec![
        (
            TWILIO_TOKEN,
            "https://haul.example.com/v1/webhooks/twilio/sms".into(),
            vec![
                ("From", DRIVER),
                ("To", HAUL_NUMBER),
                ("Body", "ETA 9:15, traffic on I-94 🚚"),
                ("MessageSid", "SM1"),
            ],
        ),
        (
            TWILIO_TOKEN,
            status_url,
            vec![("MessageSid", "SM1"), ("MessageStatus", "undelivered"), ("ErrorCode", "30006")],
        ),
        (
            "12345",
            "http://127.0.0.1:8080/v1/webhooks/twilio/sms".into(),
            vec![("Body", "Ça roule, j'arrive à 10h"), ("From", "+33612345678")],
        ),
        ("another token", "https://haul.example.com:8443/x?a=1&b=%20".into(), vec![]),
    ];
    let json_cases: Vec<Value> = cases
        .iter()
        .map(|(token, url, params)| {
            let pairs: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let haul = haul_server::twilio::signature(token, url, &pairs);
            let params: serde_json::Map<String, Value> =
                params.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            json!({"token": token, "url": url, "params": params, "haul": haul})
        })
        .collect();
    let said = twilio_python_says(&json!(json_cases));
    for (case, theirs) in json_cases.iter().zip(&said) {
        assert_eq!(case["haul"], theirs["signature"], "{case}");
        assert_eq!(theirs["validates_haul"], true, "{case}");
        let pairs: Vec<(String, String)> = case["params"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let url = case["url"].as_str().unwrap();
        let token = case["token"].as_str().unwrap();
        assert!(haul_server::twilio::validate(token, url, &pairs, theirs["signature"].as_str().unwrap()), "{case}");
    }
}

/// A load's view says when its driver opted out of SMS, and stops saying it after START.
async fn a_loads_view_shows_the_drivers_opt_out(backend: Backend) {
    let a = api(backend).await;
    assign(&a, "L3", DRIVER, true).await;
    let sms =
        |id: &str, body: &str| NewEntry::stored(id.to_owned(), "inbound_sms", json!({"from": DRIVER, "body": body}));
    let version = a.store.read(&l("L3")).await.unwrap().1;
    a.store.append(&l("L3"), vec![sms("sms:SMa", "STOP")], version, vec![], t0()).await.unwrap();
    let (status, view, _) = a.get("/v1/loads/L3").await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(view["state"]["sms_opt_out"]["event_id"], "sms:SMa", "{view}");
    assert_eq!(view["state"]["sms_opt_out"]["phone"], DRIVER, "{view}");
    let version = a.store.read(&l("L3")).await.unwrap().1;
    a.store.append(&l("L3"), vec![sms("sms:SMb", "start")], version, vec![], t0()).await.unwrap();
    let (_, view, _) = a.get("/v1/loads/L3").await;
    assert!(view["state"].get("sms_opt_out").is_none(), "{view}");
}

/// A STOP is the driver's on every load of theirs: the webhook queues it to each active
/// one, and the consent ledger keeps one that reached no load (so the driver's next
/// load sends nothing); START from an opted-out phone clears it. Any other SMS from a
/// phone on two loads is unmatched, as before; a replayed keyword changes nothing.
async fn a_stop_reaches_every_load_of_the_driver_or_the_ledger(backend: Backend) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let a = api(backend).await;
    assign(&a, "L1", DRIVER, true).await;
    assign(&a, "L2", DRIVER, true).await;
    assert_eq!(a.twilio(&sms(DRIVER, "Stop.", "SMs1")).await.0, StatusCode::OK);
    for load in ["L1", "L2"] {
        assert_eq!(queued(&a, load, "SMs1").await.unwrap()["body"], "Stop.", "{load}");
    }
    assert_eq!(a.twilio(&sms(DRIVER, "ETA 9:15", "SMs2")).await.0, StatusCode::OK);
    assert_eq!(a.twilio(&sms(DRIVER, "yes", "SMs3")).await.0, StatusCode::OK, "not opted out in the ledger yet");
    let unmatched: Vec<String> = a.unmatched().await.iter().map(|u| u["message_sid"].to_string()).collect();
    assert_eq!(unmatched, ["\"SMs3\"", "\"SMs2\""]);

    let other = "+15555550177";
    let opted_out = async || {
        let (status, page, _) = a.get("/v1/ops/opted-out").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["opted_out"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["phone"].clone(), c["load_id"].clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(a.twilio(&sms(other, "UNSUBSCRIBE", "SMs4")).await.0, StatusCode::OK);
    assert_eq!(opted_out().await, [(json!(other), Value::Null)], "kept with no load");
    assert_eq!(a.twilio(&sms(other, "START", "SMs5")).await.0, StatusCode::OK);
    assert!(opted_out().await.is_empty(), "opted back in");
    assert_eq!(a.twilio(&sms(other, "UNSUBSCRIBE", "SMs4")).await.0, StatusCode::OK);
    assert!(opted_out().await.is_empty(), "a replayed STOP opted the phone out again");
    assert_eq!(a.store.depth().await.unwrap(), 2, "the STOP on each load, nothing else");
}

on_both_backends!(
    a_stop_reaches_every_load_of_the_driver_or_the_ledger,
    a_loads_view_shows_the_drivers_opt_out,
    a_failed_delivery_receipt_is_the_rows_failed_outcome_once,
    a_receipt_before_the_sends_answer_is_matched_by_its_key,
    a_replayed_sms_never_reaches_another_load,
    the_api_refuses_sms_event_ids_so_the_real_sms_gets_through,
    a_publish_that_failed_goes_through_on_twilios_retry,
    bad_webhook_inputs_are_kept_as_unmatched,
);
