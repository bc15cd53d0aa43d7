//! The OpenAPI document (`docs/openapi.json`, served at `GET /v1/openapi.json`) says
//! what the real router does: the same routes, the same token rule, and every
//! reference in it resolves.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use haul_core::{Clock, FakeClock};
use haul_server::{ApiState, OPENAPI_JSON, ROUTES, router};
use haul_store::LoadQueue;
use reqwest::StatusCode;
use serde_json::Value;

fn document() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("docs/openapi.json is JSON")
}

/// `(METHOD, path)` of every operation in the document.
fn documented() -> BTreeSet<(String, String)> {
    let doc = document();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            out.insert((method.to_uppercase(), path.clone()));
        }
    }
    out
}

#[test]
fn the_document_lists_exactly_the_routes_of_the_router() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let routed: BTreeSet<(String, String)> = ROUTES.iter().map(|r| (r.method.to_owned(), r.path.to_owned())).collect();
    assert_eq!(routed.len(), ROUTES.len(), "a route is listed twice");
    assert_eq!(documented(), routed, "docs/openapi.json and haul_server::ROUTES differ");
}

#[test]
fn the_document_says_which_routes_need_the_token() {
    let doc = document();
    assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]), "the token is the default");
    for r in ROUTES {
        let op = &doc["paths"][r.path][r.method.to_lowercase()];
        let public = op.get("security") == Some(&serde_json::json!([]));
        assert_eq!(public, !r.token, "{} {}: security in the document vs the route's token", r.method, r.path);
        let operator = op.get("security") == Some(&serde_json::json!([{"operator": []}]));
        assert_eq!(
            operator, r.operator,
            "{} {}: security in the document vs the route's operator token",
            r.method, r.path
        );
    }
}

fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref"
                    && let Some(s) = x.as_str()
                {
                    out.push(s.to_owned());
                }
                refs(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

#[test]
fn every_reference_in_the_document_resolves() {
    let doc = document();
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(!found.is_empty());
    for r in found {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r} is not local"));
        assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
    }
}

async fn serve(api: bool) -> String {
    let store = haul_backends::open("sqlite::memory:", Some(3)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse().unwrap()));
    let state = Arc::new(ApiState::new(
        store.clone(),
        store as Arc<dyn LoadQueue>,
        clock,
        vec![TOKEN.into()],
        Some("twilio-auth-token".into()),
        base.clone(),
    ));
    let app = router(state, api);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

const TOKEN: &str = "openapi-token-123";

async fn call(base: &str, method: &str, path: &str) -> reqwest::Response {
    call_as(base, method, path, None).await
}

async fn call_as(base: &str, method: &str, path: &str, token: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let url = format!("{base}{}", path.replace("{load_id}", "L1"));
    let mut req = match method {
        "GET" => client.get(url),
        "POST" => client.post(url).header("content-type", "application/json").body("{}"),
        other => panic!("no test for {other}"),
    };
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn the_router_answers_every_route_and_asks_for_the_token_where_the_document_says() {
    let base = serve(true).await;
    for r in ROUTES {
        let status = call(&base, r.method, r.path).await.status();
        assert_ne!(status, StatusCode::NOT_FOUND, "{} {} is not routed", r.method, r.path);
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{} {} is not routed", r.method, r.path);
        assert_eq!(status == StatusCode::UNAUTHORIZED, r.token, "{} {} without a token: {status}", r.method, r.path);
    }
    // Under /v1 a caller without the token learns nothing of which routes exist.
    assert_eq!(call(&base, "GET", "/v1/nothing-here").await.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(call_as(&base, "GET", "/v1/nothing-here", Some(TOKEN)).await.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_document_is_served_as_written_without_the_token() {
    let base = serve(true).await;
    let resp = call(&base, "GET", "/v1/openapi.json").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    assert_eq!(resp.text().await.unwrap(), OPENAPI_JSON);
}

#[tokio::test]
async fn a_process_without_the_api_role_serves_only_metrics_and_health() {
    let base = serve(false).await;
    for r in ROUTES {
        let status = call_as(&base, r.method, r.path, Some(TOKEN)).await.status();
        assert_eq!(status == StatusCode::NOT_FOUND, r.api_role, "{} {}: {status}", r.method, r.path);
    }
}
