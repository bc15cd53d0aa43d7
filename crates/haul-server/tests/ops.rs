//! The operators' queries over real HTTP (`GET /v1/ops/{query}`), on both backends:
//! filters, pages and their cursors, bounds, `bad_query`, and the token.

mod common;

use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::dispatch::{Alert, AlertKind};
use haul_core::ids::{LoadId, TimerId};
use haul_core::time::{Timestamp, add};
use haul_store::{AlertState, NewEntry, NewOutboxRow, UnmatchedSms};
use reqwest::StatusCode;
use serde_json::{Value, json};

use common::{Api, Backend, api};

/// An hour before the API's clock (07:00).
fn t(secs: u64) -> Timestamp {
    add("2026-03-02T06:00:00Z".parse().unwrap(), Duration::from_secs(secs))
}

fn row(id: &str, action_type: ActionType) -> NewOutboxRow {
    NewOutboxRow { id: id.into(), action_type, action: json!({"key": id}), trace: None }
}

/// L1 in transit with an open ask; L2 with an escalated ask, a dead SMS and a dead
/// Hero task (its alert delivered); L3 with a row pending since 06:20 and a timer 30
/// minutes overdue; two unmatched SMS.
async fn fill(a: &Api) {
    let s = &a.store;
    let entry = |id: &str, kind: &str, payload: Value| NewEntry::stored(id, kind, payload);
    let ask = |status: &str| json!([{"ask_id": "ask:eta_request:u1", "step": 1, "status": status}]);
    let l = |id: &str| LoadId::parse(id).unwrap();
    s.append(
        &l("L1"),
        vec![
            entry("u1", "load_update", json!({"stage": "in_transit"})),
            haul_store::contract::decision("u1", ask("open")),
        ],
        0,
        vec![],
        t(0),
    )
    .await
    .unwrap();
    s.append(
        &l("L2"),
        vec![
            entry("u1", "load_update", json!({"stage": "at_pickup"})),
            haul_store::contract::decision("u1", ask("escalated")),
        ],
        0,
        vec![row("L2/u1/send_sms", ActionType::SendSms), row("L2/u1/create_hero_task", ActionType::CreateHeroTask)],
        t(10),
    )
    .await
    .unwrap();
    s.append(
        &l("L3"),
        vec![entry("p1", "location_ping", json!({}))],
        0,
        vec![row("L3/p1/send_sms", ActionType::SendSms)],
        t(1200),
    )
    .await
    .unwrap();
    for c in s.pending(10, t(20), Duration::from_secs(60)).await.unwrap() {
        s.mark_failed(&c.row.id, &c.token, "HTTP 400: no such number", None, t(30)).await.unwrap();
    }
    s.mark_outcome_published("L2/u1/create_hero_task", t(31)).await.unwrap();
    // The Hero task's OpsAlert: the ops service was down once, then took it.
    let alert = Alert {
        kind: AlertKind::HeroChannelFailure,
        outbox_id: "L2/u1/create_hero_task".into(),
        load_id: l("L2"),
        action_type: ActionType::CreateHeroTask,
        failure: "HTTP 400: no such number".into(),
    };
    s.record_ops_alert(&alert, AlertState::Pending, Some("HTTP 503"), t(30)).await.unwrap();
    s.record_ops_alert(&alert, AlertState::Delivered, None, t(31)).await.unwrap();
    // L2 lost three races, L1 one.
    for (load, at) in [("L2", 40), ("L1", 41), ("L2", 42), ("L2", 43)] {
        s.record_conflict(&l(load), t(at)).await.unwrap();
    }
    s.schedule(&TimerId::parse("tmr:L3:ask:eta_request:p1:1").unwrap(), t(1800), t(1200)).await.unwrap();
    for (sid, at) in [("SM1", 100), ("SM2", 200)] {
        let sms = UnmatchedSms {
            message_sid: sid.into(),
            from: "+15555550199".into(),
            to: "+15555550000".into(),
            body: "who is this".into(),
            received_at: t(at),
            reason: "no single active load has this driver phone".into(),
        };
        s.record_unmatched_sms(&sms).await.unwrap();
    }
}

async fn ok(a: &Api, path: &str) -> Value {
    let (status, v, _) = a.get(path).await;
    assert_eq!(status, StatusCode::OK, "{path}: {v}");
    v
}

fn ids(v: &Value, list: &str, key: &str) -> Vec<String> {
    v[list].as_array().unwrap().iter().map(|x| x[key].as_str().unwrap().to_owned()).collect()
}

async fn the_queries_filter_and_page(backend: Backend) {
    let a = api(backend).await;
    fill(&a).await;
    let loads = |q: &'static str| {
        let a = &a;
        async move { ids(&ok(a, &format!("/v1/ops/loads{q}")).await, "loads", "load_id") }
    };
    assert_eq!(loads("").await, ["L1", "L2", "L3"]);
    assert_eq!(loads("?stage=in_transit").await, ["L1"]);
    assert_eq!(loads("?open_asks=true").await, ["L1"]);
    assert_eq!(loads("?escalated=true&has_dead=true").await, ["L2"]);
    assert_eq!(loads("?pending_over=5m").await, ["L3"], "L3's row waits since 06:20");
    assert_eq!(loads("?pending_over=45m").await, Vec::<String>::new());
    assert_eq!(loads("?overdue_over=15m").await, ["L3"]);
    assert_eq!(loads("?overdue_over=45m").await, Vec::<String>::new());
    assert_eq!(loads("?idle_over=50m").await, ["L1", "L2"]);
    assert_eq!(loads("?active_within=50m").await, ["L3"]);
    let page = ok(&a, "/v1/ops/loads?limit=2").await;
    assert_eq!(page["next_after"], "L2");
    assert_eq!(ids(&ok(&a, "/v1/ops/loads?limit=2&after=L2").await, "loads", "load_id"), ["L3"]);
    let l1 = &ok(&a, "/v1/ops/loads?stage=in_transit").await["loads"][0];
    assert_eq!(
        (l1["open_asks"].clone(), l1["escalated_asks"].clone(), l1["idle_s"].clone()),
        (json!(1), json!(0), json!(3600.0))
    );

    let dead = ok(&a, "/v1/ops/dead").await;
    assert_eq!(ids(&dead, "rows", "id"), ["L2/u1/send_sms", "L2/u1/create_hero_task"]);
    let first = &dead["rows"][0];
    assert_eq!(
        (first["class"].clone(), first["last_failure"].clone()),
        (json!("external"), json!("HTTP 400: no such number"))
    );
    assert_eq!(dead["next_before"], Value::Null);
    let page = ok(&a, "/v1/ops/dead?limit=1").await;
    let next = page["next_before"].as_str().unwrap().to_owned();
    let rest = ok(&a, &format!("/v1/ops/dead?limit=2&before={}", urlencode(&next))).await;
    assert_eq!(ids(&rest, "rows", "id"), ["L2/u1/create_hero_task"]);
    assert_eq!(ids(&ok(&a, "/v1/ops/dead?class=hero_channel").await, "rows", "id"), ["L2/u1/create_hero_task"]);
    assert_eq!(ids(&ok(&a, "/v1/ops/dead?action_type=send_sms").await, "rows", "id"), ["L2/u1/send_sms"]);

    let timers = ok(&a, "/v1/ops/timers").await;
    assert_eq!(ids(&timers, "timers", "timer_id"), ["tmr:L3:ask:eta_request:p1:1"]);
    assert_eq!(timers["timers"][0]["overdue_s"], json!(1800.0));
    assert_eq!(ids(&ok(&a, "/v1/ops/timers?overdue_over=1h").await, "timers", "timer_id").len(), 0);

    let sms = ok(&a, "/v1/ops/unmatched?limit=1").await;
    assert_eq!(ids(&sms, "unmatched", "message_sid"), ["SM2"]);
    let next = sms["next_before"].as_str().unwrap().to_owned();
    let rest = ok(&a, &format!("/v1/ops/unmatched?limit=1&before={}", urlencode(&next))).await;
    assert_eq!(ids(&rest, "unmatched", "message_sid"), ["SM1"]);

    let alerts = ok(&a, "/v1/ops/alerts").await;
    assert_eq!(alerts["alerts"].as_array().unwrap().len(), 1, "{alerts}");
    let alert = &alerts["alerts"][0];
    assert_eq!(alert["kind"], "hero_channel_failure");
    assert_eq!(alert["outbox_id"], "L2/u1/create_hero_task");
    assert_eq!((alert["state"].clone(), alert["sends"].clone()), (json!("delivered"), json!(2)));
    assert_eq!(alert["last_error"], "HTTP 503");
    assert_eq!(alert["failure"], "HTTP 400: no such number");

    let conflicts = ok(&a, "/v1/ops/conflicts").await;
    let got: Vec<(String, u64)> = conflicts["loads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["load_id"].as_str().unwrap().to_owned(), c["conflicts"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [("L2".to_owned(), 3), ("L1".to_owned(), 1)]);
    assert_eq!(conflicts["loads"][0]["last_conflict_at"], "2026-03-02T06:00:43Z");
    assert_eq!(ids(&ok(&a, "/v1/ops/conflicts?limit=1").await, "loads", "load_id"), ["L2"]);
}

fn urlencode(s: &str) -> String {
    serde_urlencoded::to_string([("x", s)]).unwrap()[2..].to_owned()
}

async fn bad_queries_are_400_and_the_token_comes_first(backend: Backend) {
    let a = api(backend).await;
    for q in [
        "/v1/ops/loads?limit=0",
        "/v1/ops/loads?limit=501",
        "/v1/ops/loads?stag=x",
        "/v1/ops/loads?stage=a&stage=b",
        "/v1/ops/loads?escalated=maybe",
        "/v1/ops/loads?pending_over=5",
        "/v1/ops/loads?after=not%20a%20load",
        "/v1/ops/dead?class=nope",
        "/v1/ops/dead?class=external&action_type=send_sms",
        "/v1/ops/dead?before=12",
        "/v1/ops/timers?after=x",
        "/v1/ops/unmatched?before=1.",
        "/v1/ops/alerts?limit=x",
        "/v1/ops/conflicts?before=1.x",
        "/v1/ops/conflicts?limit=501",
        "/v1/ops/spend?from=2026-03-03&to=2026-03-02",
        "/v1/ops/spend?to=03/02/2026",
        "/v1/ops/spend?from=2025-01-01&to=2026-03-02",
        "/v1/ops/spend?client=a%20b",
        "/v1/ops/spend?after=nope",
    ] {
        let (status, v, _) = a.get(q).await;
        assert_eq!((status, v["error"]["code"].clone()), (StatusCode::BAD_REQUEST, json!("bad_query")), "{q}: {v}");
    }
    for q in ["loads", "dead", "timers", "unmatched", "alerts", "conflicts", "spend"] {
        let resp = a.client.get(format!("{}/v1/ops/{q}?limit=0", a.base)).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{q}");
    }
}

/// Every query's whole answer, field by field: the API's answers are extended, never
/// changed, whatever builds them.
async fn each_answer_keeps_every_field(backend: Backend) {
    let a = api(backend).await;
    fill(&a).await;
    let mut got = serde_json::Map::new();
    for q in ["loads?limit=1", "dead?limit=1", "timers", "unmatched?limit=1", "alerts", "conflicts?limit=1"] {
        got.insert(q.into(), ok(&a, &format!("/v1/ops/{q}")).await);
    }
    let want = json!({
      "alerts": {
        "alerts": [
          {
            "action_type": "create_hero_task",
            "age_s": 3570.0,
            "failure": "HTTP 400: no such number",
            "kind": "hero_channel_failure",
            "last_error": "HTTP 503",
            "load_id": "L2",
            "outbox_id": "L2/u1/create_hero_task",
            "raised_at": "2026-03-02T06:00:30Z",
            "sends": 2,
            "state": "delivered",
            "updated_at": "2026-03-02T06:00:31Z",
            "inbox": {"state": "open", "by": null, "at": null}
          }
        ],
        "next_before": null
      },
      "conflicts?limit=1": {
        "loads": [
          {
            "conflicts": 3,
            "last_conflict_at": "2026-03-02T06:00:43Z",
            "load_id": "L2",
            "since_last_s": 3557.0
          }
        ]
      },
      "dead?limit=1": {
        "next_before": "1772431230000.L2/u1/send_sms",
        "rows": [
          {
            "action_type": "send_sms",
            "age_s": 3570.0,
            "attempts": 1,
            "class": "external",
            "created_at": "2026-03-02T06:00:10Z",
            "dead_at": "2026-03-02T06:00:30Z",
            "id": "L2/u1/send_sms",
            "last_failure": "HTTP 400: no such number",
            "load_id": "L2",
            "outcome_published_at": null,
            "inbox": {"state": "open", "by": null, "at": null}
          }
        ]
      },
      "loads?limit=1": {
        "loads": [
          {
            "created_at": "2026-03-02T06:00:00Z",
            "escalated_asks": 0,
            "idle_s": 3600.0,
            "last_activity_at": "2026-03-02T06:00:00Z",
            "load_id": "L1",
            "open_asks": 1,
            "stage": "in_transit",
            "version": 2
          }
        ],
        "next_after": "L1"
      },
      "timers": {
        "next_after": null,
        "timers": [
          {
            "created_at": "2026-03-02T06:20:00Z",
            "fire_at": "2026-03-02T06:30:00Z",
            "load_id": "L3",
            "overdue_s": 1800.0,
            "timer_id": "tmr:L3:ask:eta_request:p1:1"
          }
        ]
      },
      "unmatched?limit=1": {
        "next_before": "1772431400000.SM2",
        "unmatched": [
          {
            "age_s": 3400.0,
            "body": "who is this",
            "from": "+15555550199",
            "message_sid": "SM2",
            "reason": "no single active load has this driver phone",
            "received_at": "2026-03-02T06:03:20Z",
            "to": "+15555550000",
            "inbox": {"state": "open", "by": null, "at": null},
            "assigned_load": null,
            "dismissed_reason": null
          }
        ]
      }
    });
    assert_eq!(Value::Object(got), want);
}

/// The spend query: each client's UTC day of model calls, the latest day first, today
/// (the API's clock) by default; the next page's cursor; a client's days only.
async fn the_spend_query_answers_each_clients_day(backend: Backend) {
    let a = api(backend).await;
    let usage = |client: &str, input: u64| {
        json!({"model": "m", "input_tokens": input, "output_tokens": 10, "cost_micro_usd": input * 2,
               "prompt_hash": "p", "input_hash": "i", "client": client})
    };
    let decision = |id: &str, day: &str, llm: Value| {
        let payload = json!({"decision_id": format!("dec:{id}"), "event_id": id, "decided_at": format!("{day}T06:00:00Z"),
            "decider": "llm:m", "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": [], "llm": llm});
        NewEntry::stored(format!("dec:{id}"), "decision_recorded", payload)
    };
    let event = |id: &str| NewEntry::stored(id, "location_ping", json!({}));
    let l = LoadId::parse("L1").unwrap();
    let entries = vec![
        event("p1"),
        decision("p1", "2026-03-01", usage("acme", 100)),
        event("p2"),
        decision("p2", "2026-03-02", usage("acme", 50)),
        event("p3"),
        decision("p3", "2026-03-02", usage("beta", 7)),
    ];
    a.store.append(&l, entries, 0, vec![], t(0)).await.unwrap();
    let today = ok(&a, "/v1/ops/spend").await;
    let day = |client: &str, day: &str, input: u64| {
        json!({"client": client, "day": day, "input_tokens": input, "output_tokens": 10, "cost_micro_usd": input * 2,
               "cost_usd": format!("$0.{:06}", input * 2), "calls": 1, "capped_at": null})
    };
    assert_eq!(
        today,
        json!({"spend": [day("acme", "2026-03-02", 50), day("beta", "2026-03-02", 7)], "next_after": null})
    );
    let first = ok(&a, "/v1/ops/spend?from=2026-03-01&limit=2").await;
    assert_eq!(first["next_after"], "2026-03-02.beta");
    let rest = ok(&a, "/v1/ops/spend?from=2026-03-01&after=2026-03-02.beta").await;
    assert_eq!(rest, json!({"spend": [day("acme", "2026-03-01", 100)], "next_after": null}));
    let acme = ok(&a, "/v1/ops/spend?from=2026-02-01&to=2026-03-01&client=acme").await;
    assert_eq!(acme["spend"].as_array().map(Vec::len), Some(1));
}

on_both_backends!(
    the_queries_filter_and_page,
    bad_queries_are_400_and_the_token_comes_first,
    each_answer_keeps_every_field,
    the_spend_query_answers_each_clients_day
);
