//! The operator routes over real HTTP, on SQLite and PostgreSQL: only an operator's
//! token, one `operator_action` per request id on the load's queue (a retry answers
//! `duplicate`, the id reused for something else 422), a dead row's action carried
//! whole, a bulk requeue bounded with its dry run, an unmatched SMS assigned once, dead
//! rows and unmatched SMS dismissed from the inbox.

mod common;

use std::sync::Arc;
use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, add};
use haul_store::{NewEntry, NewOutboxRow, OutboxStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{Api, Backend, OPERATOR, TOKEN, api};

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn l(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

fn hero_action(key: &str) -> Value {
    json!({"key": key, "type": "create_hero_task",
           "params": {"title": "Driver not answering", "body": "call them", "urgency": "urgent"},
           "ask_id": "ask:eta_request:p", "step": 2})
}

/// Rows of `load` made by one decision (event `event`), then the given ones buried
/// (`dead` seconds after 07:00 each) and the rest left pending.
async fn rows(api: &Api, load: &str, event: &str, rows: &[(&str, ActionType, Option<u64>)]) {
    let s = &api.store;
    let version = s.read(&l(load)).await.unwrap().1;
    let entries = vec![
        NewEntry::stored(event, "location_ping", json!({})),
        NewEntry::stored(format!("dec:{event}"), "decision_recorded", json!({})),
    ];
    let outbox = rows
        .iter()
        .map(|(key, t, _)| NewOutboxRow { id: key.to_string(), action_type: *t, action: hero_action(key), trace: None })
        .collect();
    s.append(&l(load), entries, version, outbox, t0()).await.unwrap();
    for (key, _, dead) in rows {
        let Some(secs) = dead else { continue };
        let when = add(t0(), Duration::from_secs(*secs));
        let claims = s.pending(100, when, Duration::from_secs(60)).await.unwrap();
        let c = claims.iter().find(|c| c.row.id == *key).unwrap();
        s.mark_failed(key, &c.token, "400 bad request", None, when).await.unwrap();
        for other in claims.iter().filter(|c| c.row.id != *key) {
            // Give the other claims back at once (a retry due now).
            s.mark_failed(&other.row.id, &other.token, "503", Some(when), when).await.unwrap();
        }
    }
}

fn who(request_id: &str) -> Value {
    json!({"request_id": request_id, "actor": "ana", "reason": "the Hero service is back"})
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

/// The event the queue holds for `event_id` of `load`.
async fn published(api: &Api, load: &str, event_id: &str) -> Value {
    let body = api.store.published_body(&l(load), event_id).await.unwrap().expect("published");
    serde_json::from_str(&body).unwrap()
}

fn check(got: (StatusCode, Value), status: StatusCode, code_or_status: &str) -> Value {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let seen = v["error"]["code"].as_str().or(v["status"].as_str()).unwrap_or("");
    assert_eq!(seen, code_or_status, "{v}");
    v
}

const DEAD: &str = "L1/ask:eta_request:p/2/create_hero_task";

async fn requeue_takes_an_operator_token_and_publishes_once(backend: Backend) {
    let api = api(backend).await;
    rows(&api, "L1", "p", &[(DEAD, ActionType::CreateHeroTask, Some(1)), ("L1/p/send_sms", ActionType::SendSms, None)])
        .await;
    let body = with(who("r1"), json!({"outbox_id": DEAD}));
    let path = "/v1/operator/requeue";
    check(api.post_as(None, path, &body).await, StatusCode::UNAUTHORIZED, "unauthorized");
    check(api.post_as(Some("wrong-token-123"), path, &body).await, StatusCode::UNAUTHORIZED, "unauthorized");
    check(api.post_as(Some(TOKEN), path, &body).await, StatusCode::FORBIDDEN, "operator_token_required");

    // In the operator's trace: the action's run continues it.
    let traced = api
        .client
        .post(format!("{}{path}", api.base))
        .bearer_auth(OPERATOR)
        .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = traced.status();
    let v = check((status, traced.json().await.unwrap()), StatusCode::ACCEPTED, "queued");
    assert_eq!((v["load_id"].as_str(), v["event_id"].as_str()), (Some("L1"), Some("op:r1")));
    let ev = published(&api, "L1", "op:r1").await;
    assert_eq!(ev["kind"], "operator_action");
    assert_eq!((ev["actor"].as_str(), ev["reason"].as_str()), (Some("ana"), Some("the Hero service is back")));
    assert_eq!(ev["command"], json!({"type": "requeue", "outbox_id": DEAD, "action": hero_action(DEAD)}));
    // A retry is the same event; the id reused for another reason is refused.
    check(api.post_as(Some(OPERATOR), path, &body).await, StatusCode::OK, "duplicate");
    let other = with(body.clone(), json!({"reason": "something else"}));
    check(api.post_as(Some(OPERATOR), path, &other).await, StatusCode::UNPROCESSABLE_ENTITY, "request_id_reused");
    assert_eq!(api.store.depth().await.unwrap(), 1, "one event on the queue");
    // The dead row stays dead.
    assert_eq!(api.store.get(DEAD).await.unwrap().unwrap().status, OutboxStatus::Dead);

    for (body, status, code) in [
        (with(who("r2"), json!({"outbox_id": "L1/p/send_sms"})), StatusCode::CONFLICT, "not_dead"),
        (with(who("r2"), json!({"outbox_id": "L1/nope/send_sms"})), StatusCode::NOT_FOUND, "no_such_row"),
        (with(who("r 2"), json!({"outbox_id": DEAD})), StatusCode::BAD_REQUEST, "bad_request_id"),
        (with(who("op:x"), json!({"outbox_id": DEAD})), StatusCode::BAD_REQUEST, "bad_request_id"),
        (with(who("r2"), json!({"outbox_id": DEAD, "reason": " "})), StatusCode::BAD_REQUEST, "bad_payload"),
        (with(who("r2"), json!({"outbox_id": DEAD, "actor": "a b"})), StatusCode::BAD_REQUEST, "bad_payload"),
        (json!({"request_id": "r2", "actor": "ana", "outbox_id": DEAD}), StatusCode::BAD_REQUEST, "bad_payload"),
        (with(who("r2"), json!({"outbox_id": DEAD, "extra": 1})), StatusCode::BAD_REQUEST, "bad_payload"),
    ] {
        check(api.post_as(Some(OPERATOR), path, &body).await, status, code);
    }
    assert_eq!(api.store.depth().await.unwrap(), 1, "nothing refused was published");
    let queued = api.store.receive(10, Duration::from_secs(30), t0()).await.unwrap();
    let traces: Vec<_> = queued.iter().map(|m| (m.event_id.as_str(), m.trace.map(|t| t.trace_id_hex()))).collect();
    assert_eq!(traces, [("op:r1", Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned()))]);
}

async fn operator_actions_on_the_ingestion_route_need_an_operator_token(backend: Backend) {
    let api = api(backend).await;
    let event = json!({"event_id": "op:r9", "kind": "operator_action", "actor": "ana", "reason": "driver called",
                       "command": {"type": "resolve_ask", "ask_id": "ask:eta_request:p"}});
    let path = "/v1/loads/L1/events";
    check(api.post_as(Some(TOKEN), path, &event).await, StatusCode::BAD_REQUEST, "reserved_event_id");
    let plain_id = with(event.clone(), json!({"event_id": "r9"}));
    check(api.post_as(Some(TOKEN), path, &plain_id).await, StatusCode::BAD_REQUEST, "kind_not_accepted");
    check(api.post_as(Some(OPERATOR), path, &plain_id).await, StatusCode::BAD_REQUEST, "bad_event_id");
    check(api.post_as(Some(OPERATOR), path, &event).await, StatusCode::ACCEPTED, "queued");
    // An operator token reads what the API token reads.
    let resp = api.client.get(format!("{}/v1/webhooks/twilio/unmatched", api.base)).bearer_auth(OPERATOR).send().await;
    assert_eq!(resp.unwrap().status(), StatusCode::OK);
    let resp = api.client.get(format!("{}/v1/ops/loads", api.base)).bearer_auth(OPERATOR).send().await;
    assert_eq!(resp.unwrap().status(), StatusCode::OK);
    let resp = api.client.get(format!("{}/v1/ops/loads", api.base)).bearer_auth("not-a-token").send().await;
    assert_eq!(resp.unwrap().status(), StatusCode::UNAUTHORIZED, "the control: a wrong token reads nothing");
    let resp = api.client.get(format!("{}/v1/loads/L1", api.base)).bearer_auth(OPERATOR).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND, "no records yet, but past the token");
    // The resolve-ask route makes the same event from its request id (on a load with records).
    rows(&api, "L1", "p", &[]).await;
    let body = with(who("r10"), json!({"load_id": "L1", "ask_id": "ask:eta_request:p"}));
    check(api.post_as(Some(OPERATOR), "/v1/operator/resolve-ask", &body).await, StatusCode::ACCEPTED, "queued");
    let ev = published(&api, "L1", "op:r10").await;
    assert_eq!(ev["command"], json!({"type": "resolve_ask", "ask_id": "ask:eta_request:p"}));
    let bad = with(who("r11"), json!({"load_id": "L1", "ask_id": "nope"}));
    check(api.post_as(Some(OPERATOR), "/v1/operator/resolve-ask", &bad).await, StatusCode::BAD_REQUEST, "bad_payload");
}

async fn bulk_requeue_is_bounded_and_its_dry_run_publishes_nothing(backend: Backend) {
    let api = api(backend).await;
    let hero = ActionType::CreateHeroTask;
    rows(&api, "L1", "p", &[("L1/a/create_hero_task", hero, Some(1)), ("L1/b/send_sms", ActionType::SendSms, Some(2))])
        .await;
    rows(&api, "L2", "p", &[("L2/c/create_hero_task", hero, Some(3)), ("L2/d/create_hero_task", hero, Some(4))]).await;
    let path = "/v1/operator/bulk-requeue";
    let filter = |request: &str, extra: Value| {
        with(with(who(request), json!({"action_type": "create_hero_task", "since": "2026-03-02T07:00:00Z"})), extra)
    };
    let (status, v) = api.post_as(Some(OPERATOR), path, &filter("b1", json!({"limit": 2, "dry_run": true}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let listed = |v: &Value| -> Vec<(String, String)> {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["outbox_id"].as_str().unwrap().to_owned(), r["status"].as_str().unwrap().to_owned()))
            .collect()
    };
    let would = |id: &str| (id.to_owned(), "would_requeue".to_owned());
    assert_eq!(listed(&v), vec![would("L1/a/create_hero_task"), would("L2/c/create_hero_task")]);
    assert_eq!((v["truncated"].as_bool(), v["dry_run"].as_bool()), (Some(true), Some(true)));
    assert_eq!(v["rows"][0]["last_failure"], "400 bad request");
    assert_eq!(api.store.depth().await.unwrap(), 0, "a dry run publishes nothing");

    let (status, v) = api.post_as(Some(OPERATOR), path, &filter("b1", json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let queued = |id: &str| (id.to_owned(), "queued".to_owned());
    let all = ["L1/a/create_hero_task", "L2/c/create_hero_task", "L2/d/create_hero_task"];
    assert_eq!(listed(&v), all.map(queued).to_vec());
    assert_eq!(v["truncated"], false);
    assert_eq!(api.store.depth().await.unwrap(), 3, "one event per row, each on its load");
    let event_id = v["rows"][2]["event_id"].as_str().unwrap().to_owned();
    assert!(event_id.starts_with("op:b1:"), "{event_id}");
    let ev = published(&api, "L2", &event_id).await;
    assert_eq!(ev["command"]["outbox_id"], "L2/d/create_hero_task");
    // The same request again: every row a duplicate, nothing new.
    let (_, v) = api.post_as(Some(OPERATOR), path, &filter("b1", json!({}))).await;
    assert_eq!(listed(&v), all.map(|id| (id.to_owned(), "duplicate".to_owned())).to_vec());
    assert_eq!(api.store.depth().await.unwrap(), 3);
    // Since a later time; another type.
    let (_, v) = api
        .post_as(Some(OPERATOR), path, &filter("b2", json!({"since": "2026-03-02T07:00:04Z", "dry_run": true})))
        .await;
    assert_eq!(listed(&v), vec![would("L2/d/create_hero_task")]);
    let (_, v) =
        api.post_as(Some(OPERATOR), path, &filter("b3", json!({"action_type": "send_sms", "dry_run": true}))).await;
    assert_eq!(listed(&v), vec![would("L1/b/send_sms")]);

    for (extra, code) in [
        (json!({"limit": 0}), "bad_limit"),
        (json!({"limit": 101}), "bad_limit"),
        (json!({"action_type": "launch"}), "bad_payload"),
        (json!({"since": "07:00"}), "bad_payload"),
        (json!({"request_id": ""}), "bad_request_id"),
    ] {
        check(api.post_as(Some(OPERATOR), path, &filter("b4", extra)).await, StatusCode::BAD_REQUEST, code);
    }
    check(
        api.post_as(Some(TOKEN), path, &filter("b4", json!({}))).await,
        StatusCode::FORBIDDEN,
        "operator_token_required",
    );
}

async fn an_unmatched_sms_is_assigned_to_one_load_once(backend: Backend) {
    let api = api(backend).await;
    let form = [("From", "+15555550100"), ("To", "+15555550000"), ("Body", "ETA 9:15"), ("MessageSid", "SMa1")];
    assert_eq!(api.twilio(&form).await.0, StatusCode::OK);
    assert_eq!(api.unmatched().await.len(), 1, "no load has that phone");
    let path = "/v1/operator/assign-sms";
    let body = |request: &str, load: &str| with(who(request), json!({"message_sid": "SMa1", "load_id": load}));
    check(api.post_as(Some(TOKEN), path, &body("s1", "L1")).await, StatusCode::FORBIDDEN, "operator_token_required");
    // A mistyped load (no records) is refused and takes nothing: no load is made, the SMS
    // stays unmatched, and the right load takes it next.
    let v = check(api.post_as(Some(OPERATOR), path, &body("s0", "L1")).await, StatusCode::NOT_FOUND, "no_such_load");
    assert!(v["error"]["message"].as_str().unwrap().contains("load L1 has no records"), "{v}");
    assert_eq!(api.store.depth().await.unwrap(), 0);
    assert!(api.store.read(&l("L1")).await.unwrap().0.is_empty());
    assert_eq!(api.unmatched().await.len(), 1);
    rows(&api, "L1", "p", &[]).await;
    rows(&api, "L2", "p", &[]).await;
    let v = check(api.post_as(Some(OPERATOR), path, &body("s1", "L1")).await, StatusCode::ACCEPTED, "queued");
    assert_eq!(v["event_id"], "op:s1");
    let ev = published(&api, "L1", "op:s1").await;
    assert_eq!(
        ev["command"],
        json!({"type": "assign_sms", "message_sid": "SMa1", "from": "+15555550100", "body": "ETA 9:15"})
    );
    check(api.post_as(Some(OPERATOR), path, &body("s1", "L1")).await, StatusCode::OK, "duplicate");
    check(api.post_as(Some(OPERATOR), path, &body("s2", "L1")).await, StatusCode::CONFLICT, "sms_assigned");
    check(api.post_as(Some(OPERATOR), path, &body("s3", "L2")).await, StatusCode::CONFLICT, "sms_assigned");
    let unknown = with(who("s4"), json!({"message_sid": "SMnone", "load_id": "L1"}));
    check(api.post_as(Some(OPERATOR), path, &unknown).await, StatusCode::NOT_FOUND, "no_such_sms");
    let bad_sid = with(who("s5"), json!({"message_sid": "SM/x", "load_id": "L1"}));
    check(api.post_as(Some(OPERATOR), path, &bad_sid).await, StatusCode::BAD_REQUEST, "bad_message_sid");
    // A bad reason takes nothing: the next good request still finds the SMS taken by s1 only.
    let no_reason = with(body("s6", "L1"), json!({"reason": ""}));
    check(api.post_as(Some(OPERATOR), path, &no_reason).await, StatusCode::BAD_REQUEST, "bad_payload");
    assert_eq!(api.store.depth().await.unwrap(), 1);
    // Twilio's replay of the SMS does nothing new.
    assert_eq!(api.twilio(&form).await.0, StatusCode::OK);
    assert_eq!(api.store.depth().await.unwrap(), 1);
}

/// An SMS assigned to the wrong load moves to the right one: the old load is told
/// (`unassign_sms`), then the new one takes it (`assign_sms`), under one request id; a
/// retry answers `duplicate` for both, and what cannot move is refused with nothing
/// published.
async fn an_assigned_sms_is_moved_to_the_right_load(backend: Backend) {
    let api = api(backend).await;
    let form = [("From", "+15555550100"), ("To", "+15555550000"), ("Body", "ETA 9:15"), ("MessageSid", "SMm1")];
    assert_eq!(api.twilio(&form).await.0, StatusCode::OK);
    for load in ["L1", "L2", "L3"] {
        rows(&api, load, "p", &[]).await;
    }
    let path = "/v1/operator/reassign-sms";
    let body = |request: &str, load: &str| with(who(request), json!({"message_sid": "SMm1", "load_id": load}));
    // Not assigned yet: an assignment is what it needs.
    check(api.post_as(Some(OPERATOR), path, &body("m0", "L2")).await, StatusCode::CONFLICT, "sms_not_assigned");
    check(
        api.post_as(Some(OPERATOR), "/v1/operator/assign-sms", &body("a1", "L1")).await,
        StatusCode::ACCEPTED,
        "queued",
    );
    assert_eq!(api.store.depth().await.unwrap(), 1);
    check(api.post_as(Some(TOKEN), path, &body("m1", "L2")).await, StatusCode::FORBIDDEN, "operator_token_required");
    check(api.post_as(Some(OPERATOR), path, &body("m1", "L9")).await, StatusCode::NOT_FOUND, "no_such_load");
    check(api.post_as(Some(OPERATOR), path, &body("m1", "L1")).await, StatusCode::CONFLICT, "sms_assigned");
    // The request id a1 was the assignment's on L1: refused before anything moves.
    check(
        api.post_as(Some(OPERATOR), path, &body("a1", "L2")).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "request_id_reused",
    );
    assert_eq!(api.store.depth().await.unwrap(), 1, "nothing published by a refusal");

    let v = check(api.post_as(Some(OPERATOR), path, &body("m1", "L2")).await, StatusCode::ACCEPTED, "queued");
    assert_eq!((v["load_id"].as_str(), v["event_id"].as_str()), (Some("L2"), Some("op:m1")), "{v}");
    assert_eq!(v["from"], json!({"load_id": "L1", "event_id": "op:m1", "status": "queued"}), "{v}");
    let old = published(&api, "L1", "op:m1").await;
    assert_eq!(old["command"], json!({"type": "unassign_sms", "message_sid": "SMm1", "to_load": "L2"}));
    let new = published(&api, "L2", "op:m1").await;
    assert_eq!(
        new["command"],
        json!({"type": "assign_sms", "message_sid": "SMm1", "from": "+15555550100", "body": "ETA 9:15"})
    );
    assert_eq!(api.store.depth().await.unwrap(), 3);
    let v = check(api.post_as(Some(OPERATOR), path, &body("m1", "L2")).await, StatusCode::OK, "duplicate");
    assert_eq!(v["from"]["status"], "duplicate", "{v}");
    // Moved once more, from where it is now; the first request's retry moves nothing.
    let v = check(api.post_as(Some(OPERATOR), path, &body("m2", "L3")).await, StatusCode::ACCEPTED, "queued");
    assert_eq!(v["from"]["load_id"], "L2", "{v}");
    check(api.post_as(Some(OPERATOR), path, &body("m1", "L2")).await, StatusCode::CONFLICT, "sms_assigned");
    assert_eq!(api.store.depth().await.unwrap(), 5);
    let none = with(who("m3"), json!({"message_sid": "SMnone", "load_id": "L1"}));
    check(api.post_as(Some(OPERATOR), path, &none).await, StatusCode::NOT_FOUND, "no_such_sms");
    let no_reason = with(body("m4", "L1"), json!({"reason": ""}));
    check(api.post_as(Some(OPERATOR), path, &no_reason).await, StatusCode::BAD_REQUEST, "bad_payload");
    assert_eq!(api.store.depth().await.unwrap(), 5);
}

async fn resolve_ask_refuses_a_load_with_no_records(backend: Backend) {
    let api = api(backend).await;
    let path = "/v1/operator/resolve-ask";
    let body = |request: &str, load: &str| with(who(request), json!({"load_id": load, "ask_id": "ask:eta_request:p"}));
    check(api.post_as(Some(OPERATOR), path, &body("r1", "L9")).await, StatusCode::NOT_FOUND, "no_such_load");
    assert_eq!(api.store.depth().await.unwrap(), 0, "nothing published");
    assert!(api.store.read(&l("L9")).await.unwrap().0.is_empty(), "no load made");
    rows(&api, "L9", "p", &[]).await;
    check(api.post_as(Some(OPERATOR), path, &body("r2", "L9")).await, StatusCode::ACCEPTED, "queued");
    assert_eq!(api.store.depth().await.unwrap(), 1);
}

/// A caller's 60 KB id is not quoted back whole: the 404 names a glimpse of it.
async fn a_requeue_of_a_huge_unknown_id_answers_a_short_404(backend: Backend) {
    let a = api(backend).await;
    let huge = "x".repeat(60_000);
    let body = json!({"request_id": "r-huge", "actor": "ana", "reason": "typo", "outbox_id": huge});
    let resp = a
        .client
        .post(format!("{}/v1/operator/requeue", a.base))
        .bearer_auth(OPERATOR)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let text = resp.text().await.unwrap();
    assert!(text.len() < 1_000, "a {}-byte answer", text.len());
    assert!(text.contains("no_such_row") && text.contains("xxxx"), "{text}");
}

/// With `wait_s`, the answer waits for the load's decision and holds it: here the
/// load decides nothing (it has no such ask), which the answer shows as no actions;
/// with no worker, `decision` is null after the wait; past 10 s is refused unpublished.
async fn an_answer_with_wait_s_holds_the_loads_decision(backend: Backend) {
    let api = api(backend).await;
    rows(&api, "L1", "p", &[]).await;
    let path = "/v1/operator/resolve-ask";
    let body = |request: &str, wait_s: u64| {
        with(who(request), json!({"load_id": "L1", "ask_id": "ask:eta_request:nope", "wait_s": wait_s}))
    };
    check(api.post_as(Some(OPERATOR), path, &body("r0", 11)).await, StatusCode::BAD_REQUEST, "bad_wait");
    assert_eq!(api.store.depth().await.unwrap(), 0, "refused before anything was published");
    // No worker: the wait ends, and says so.
    let v = check(api.post_as(Some(OPERATOR), path, &body("r1", 1)).await, StatusCode::ACCEPTED, "queued");
    assert!(v.get("decision").is_some_and(Value::is_null), "{v}");
    // A worker decides while the answer waits.
    let worker = worker(&api);
    let deciding = tokio::spawn({
        let worker = worker.clone();
        async move {
            for _ in 0..50 {
                worker.run_once().await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let v = check(api.post_as(Some(OPERATOR), path, &body("r2", 8)).await, StatusCode::ACCEPTED, "queued");
    deciding.abort();
    let d = &v["decision"];
    assert_eq!((d["decider"].as_str(), d["event_id"].as_str()), (Some("operator"), Some("op:r2")), "{v}");
    assert_eq!(d["actions"], json!([]), "nothing done: {v}");
    // Without wait_s the answer is as it always was.
    let v = check(
        api.post_as(Some(OPERATOR), path, &with(who("r3"), json!({"load_id": "L1", "ask_id": "ask:eta_request:p"})))
            .await,
        StatusCode::ACCEPTED,
        "queued",
    );
    assert!(v.get("decision").is_none(), "{v}");
}

/// A worker on the API's store, run a few times: what decides the operator events.
fn worker(api: &Api) -> Arc<haul_runtime::worker::Worker> {
    use haul_core::{Clock, QueueMode};
    use haul_runtime::worker::{Worker, WorkerSettings};
    let clock: Arc<dyn Clock> = Arc::new(haul_runtime::clock::SystemClock);
    let sop = Arc::new(haul_runtime::decider::SopDecider { policies: Default::default() });
    Arc::new(Worker::new(
        api.store.clone(),
        api.store.clone(),
        QueueMode::StoreQueue,
        sop,
        clock,
        WorkerSettings::default(),
        Default::default(),
    ))
}

async fn dead_rows_and_unmatched_sms_leave_the_inbox_when_dismissed(backend: Backend) {
    let api = api(backend).await;
    rows(&api, "L1", "p", &[(DEAD, ActionType::CreateHeroTask, Some(1)), ("L1/p/send_sms", ActionType::SendSms, None)])
        .await;
    // The dead row's failed outcome in its log, as the dispatcher publishes it.
    let outcome = json!({"event_id": format!("evt:out:{DEAD}:failed"), "kind": "action_outcome", "outbox_id": DEAD,
                         "action_type": "create_hero_task", "status": "failed", "failure": "400", "hero_channel": true});
    api.store.publish(&l("L1"), outcome["event_id"].as_str().unwrap(), &outcome.to_string(), t0()).await.unwrap();
    let w = worker(&api);
    w.run_once().await.unwrap();
    let ids = |v: &Value, list: &str| -> Vec<String> {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().or(r["message_sid"].as_str()).unwrap().to_owned())
            .collect()
    };
    let (status, open, _) = api.get("/v1/ops/dead?inbox=open").await;
    assert_eq!((status, ids(&open, "rows")), (StatusCode::OK, vec![DEAD.to_owned()]), "{open}");
    assert_eq!(open["rows"][0]["inbox"], json!({"state": "open", "by": null, "at": null}));
    let (_, load, _) = api.get("/v1/loads/L1").await;
    assert!(load["state"].get("inbox").is_none(), "nothing out of the inbox yet: {load}");

    let path = "/v1/operator/dismiss";
    let body = |request: &str, key: &str| with(who(request), json!({"outbox_id": key, "wait_s": 5}));
    check(api.post_as(Some(TOKEN), path, &body("d0", DEAD)).await, StatusCode::FORBIDDEN, "operator_token_required");
    check(api.post_as(Some(OPERATOR), path, &body("d0", "L1/p/send_sms")).await, StatusCode::CONFLICT, "not_dead");
    check(api.post_as(Some(OPERATOR), path, &body("d0", "L1/nope/x")).await, StatusCode::NOT_FOUND, "no_such_row");
    let deciding = tokio::spawn({
        let w = w.clone();
        async move {
            for _ in 0..50 {
                w.run_once().await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let v = check(api.post_as(Some(OPERATOR), path, &body("d1", DEAD)).await, StatusCode::ACCEPTED, "queued");
    assert_eq!(v["decision"]["inbox"], json!([{"outbox_id": DEAD, "state": "dismissed"}]), "{v}");
    assert_eq!(v["decision"]["actions"], json!([]), "{v}");
    // Dismissed again by another request: the load says it is done already.
    let v = check(api.post_as(Some(OPERATOR), path, &body("d2", DEAD)).await, StatusCode::ACCEPTED, "queued");
    deciding.abort();
    assert!(v["decision"].get("inbox").is_none(), "{v}");
    assert!(v["decision"]["rationale"].as_str().unwrap().contains("is dismissed already"), "{v}");
    let (_, open, _) = api.get("/v1/ops/dead?inbox=open").await;
    assert_eq!(ids(&open, "rows"), Vec::<String>::new());
    let (_, gone, _) = api.get("/v1/ops/dead?inbox=dismissed").await;
    assert_eq!(ids(&gone, "rows"), vec![DEAD.to_owned()]);
    assert_eq!(
        (gone["rows"][0]["inbox"]["state"].as_str(), gone["rows"][0]["inbox"]["by"].as_str()),
        (Some("dismissed"), Some("op:d1"))
    );
    let (_, all, _) = api.get("/v1/ops/dead").await;
    assert_eq!(ids(&all, "rows"), vec![DEAD.to_owned()], "without inbox, every state, as before");
    let (_, load, _) = api.get("/v1/loads/L1").await;
    assert_eq!(load["state"]["inbox"], json!({DEAD: "dismissed"}), "the load's own view says so too");
    assert_eq!(load["state"]["totals"]["inbox"], 1);
    let (status, v, _) = api.get("/v1/ops/dead?inbox=closed").await;
    check((status, v), StatusCode::BAD_REQUEST, "bad_query");

    // An unmatched SMS: dismissed once, with who and why; then it goes to no load.
    let form = [("From", "+15555550199"), ("To", "+15555550000"), ("Body", "wrong number"), ("MessageSid", "SMd1")];
    assert_eq!(api.twilio(&form).await.0, StatusCode::OK);
    let path = "/v1/operator/dismiss-sms";
    let sms = |request: &str, sid: &str| with(who(request), json!({"message_sid": sid}));
    check(api.post_as(Some(TOKEN), path, &sms("x1", "SMd1")).await, StatusCode::FORBIDDEN, "operator_token_required");
    check(api.post_as(Some(OPERATOR), path, &sms("x1", "SMnone")).await, StatusCode::NOT_FOUND, "no_such_sms");
    check(api.post_as(Some(OPERATOR), path, &sms("x1", "SM/x")).await, StatusCode::BAD_REQUEST, "bad_message_sid");
    let no_reason = with(sms("x1", "SMd1"), json!({"reason": " "}));
    check(api.post_as(Some(OPERATOR), path, &no_reason).await, StatusCode::BAD_REQUEST, "bad_payload");
    let v = check(api.post_as(Some(OPERATOR), path, &sms("x1", "SMd1")).await, StatusCode::OK, "dismissed");
    assert_eq!(v["by"], "ana");
    let v = check(api.post_as(Some(OPERATOR), path, &sms("x2", "SMd1")).await, StatusCode::OK, "already_dismissed");
    assert_eq!(v["by"], "ana");
    let assign = with(who("x3"), json!({"message_sid": "SMd1", "load_id": "L1"}));
    check(api.post_as(Some(OPERATOR), "/v1/operator/assign-sms", &assign).await, StatusCode::CONFLICT, "sms_dismissed");
    let (_, open, _) = api.get("/v1/ops/unmatched?inbox=open").await;
    assert_eq!(ids(&open, "unmatched"), Vec::<String>::new());
    let (_, gone, _) = api.get("/v1/ops/unmatched?inbox=dismissed").await;
    let row = &gone["unmatched"][0];
    assert_eq!(
        (row["inbox"]["by"].as_str(), row["dismissed_reason"].as_str()),
        (Some("ana"), Some("the Hero service is back")),
        "{gone}"
    );
}

/// A channel's send limit changed while haul runs: only with an operator's token, once
/// per request id, bad input refused naming what is wrong (and nothing kept), the
/// history and what is in force listed; no rate puts the settings' limit back.
async fn a_channel_rate_is_changed_once_with_who_and_why(backend: Backend) {
    let api = api(backend).await;
    let path = "/v1/operator/channel-rate";
    let rate = |request: &str, extra: Value| with(with(who(request), json!({"channel": "sms"})), extra);
    let sms_10 = rate("r1", json!({"rate": "10/s", "burst": 5}));
    check(api.post_as(Some(TOKEN), path, &sms_10).await, StatusCode::FORBIDDEN, "operator_token_required");
    for (bad, code, says) in [
        (rate("r1", json!({"rate": "fast"})), "bad_rate", "rate: \"fast\" is not a rate"),
        (rate("r1", json!({"rate": "0/s"})), "bad_rate", "allows no send"),
        (rate("r1", json!({"rate": "1/s", "burst": 0})), "bad_rate", "burst 0"),
        (rate("r1", json!({"burst": 3})), "bad_rate", "burst without a rate"),
        (rate("r1", json!({"channel": "fax", "rate": "1/s"})), "bad_channel", "\"fax\" is not one of"),
        (rate("r 1", json!({"rate": "1/s"})), "bad_request_id", "request"),
        (rate("r1", json!({"rate": "1/s", "reason": " "})), "bad_payload", "say why"),
    ] {
        let v = check(api.post_as(Some(OPERATOR), path, &bad).await, StatusCode::BAD_REQUEST, code);
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{v}");
    }
    let (_, listed, _) = api.get("/v1/operator/channel-rates").await;
    assert_eq!(listed["changes"], json!([]), "nothing refused was kept");
    let v = check(api.post_as(Some(OPERATOR), path, &sms_10).await, StatusCode::OK, "changed");
    assert_eq!(
        (&v["channel"], &v["limit"], &v["actor"], &v["previous"], &v["effective"], &v["configured"]),
        (
            &json!("sms"),
            &json!({"rate": "10/s", "burst": 5}),
            &json!("ana"),
            &Value::Null,
            &json!({"rate": "10/s", "burst": 5}),
            &Value::Null
        )
    );
    let again = check(api.post_as(Some(OPERATOR), path, &sms_10).await, StatusCode::OK, "duplicate");
    assert_eq!(again["changed_at"], v["changed_at"]);
    let other = rate("r1", json!({"rate": "1/s"}));
    check(api.post_as(Some(OPERATOR), path, &other).await, StatusCode::UNPROCESSABLE_ENTITY, "request_id_reused");
    let back =
        check(api.post_as(Some(OPERATOR), path, &rate("r2", json!({"rate": null}))).await, StatusCode::OK, "changed");
    assert_eq!(
        (&back["previous"], &back["effective"], &back["limit"]),
        (&json!({"rate": "10/s", "burst": 5}), &Value::Null, &Value::Null)
    );
    let (status, listed, _) = api.get("/v1/operator/channel-rates").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> =
        listed["changes"].as_array().unwrap().iter().map(|c| c["request_id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["r2", "r1"]);
    let sms = listed["channels"].as_array().unwrap().iter().find(|c| c["channel"] == "sms").unwrap().clone();
    assert_eq!(sms, json!({"channel": "sms", "effective": null, "configured": null, "changed": null}));
}

on_both_backends!(
    a_channel_rate_is_changed_once_with_who_and_why,
    dead_rows_and_unmatched_sms_leave_the_inbox_when_dismissed,
    an_answer_with_wait_s_holds_the_loads_decision,
    a_requeue_of_a_huge_unknown_id_answers_a_short_404,
    requeue_takes_an_operator_token_and_publishes_once,
    operator_actions_on_the_ingestion_route_need_an_operator_token,
    bulk_requeue_is_bounded_and_its_dry_run_publishes_nothing,
    an_unmatched_sms_is_assigned_to_one_load_once,
    an_assigned_sms_is_moved_to_the_right_load,
    resolve_ask_refuses_a_load_with_no_records,
);
