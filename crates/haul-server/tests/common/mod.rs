//! The API over real HTTP on 127.0.0.1, on a real store: SQLite in a file (WAL, its
//! read connections) or PostgreSQL in a schema of its own. Tests that run on both
//! backends take a [`Backend`] and are expanded once per backend by [`on_both_backends!`].

#![allow(dead_code)] // each test file uses its own part of the harness

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use haul_core::{Clock, FakeClock};
use haul_server::{ApiState, router, twilio};
use haul_store::{LoadQueue, Store};
use reqwest::StatusCode;
use serde_json::Value;

pub const TOKEN: &str = "token-one-123456";
pub const TWILIO: &str = "twilio-auth-token";
pub const OPERATOR: &str = "operator-token-7890";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    SqliteFile,
    Postgres,
}

pub struct Api {
    pub base: String,
    pub store: Arc<dyn Store>,
    /// The server's state (its load views' counts, for tests of what a view costs).
    pub state: Arc<ApiState>,
    pub client: reqwest::Client,
    /// The database file on SQLite.
    pub sqlite_path: Option<PathBuf>,
}

/// A migrated store of `backend`, empty, and the SQLite file when there is one.
pub async fn store(backend: Backend) -> (Arc<dyn Store>, Option<PathBuf>) {
    match backend {
        Backend::SqliteFile => {
            let dir = std::env::temp_dir().join(format!("haul-server-{}-{}", std::process::id(), fastrand::u64(..)));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("haul.db");
            let url = format!("sqlite://{}?synchronous=normal", path.display());
            (haul_backends::open(&url, Some(3)).await.unwrap(), Some(path))
        }
        Backend::Postgres => {
            let (store, _) =
                haul_postgres::testing::fresh_store(&haul_postgres::testing::FreshStore::default()).await.unwrap();
            (Arc::new(store), None)
        }
    }
}

/// The API on a fresh store of `backend`, its load queue the store's own.
pub async fn api(backend: Backend) -> Api {
    api_with_queue(backend, |s| s as Arc<dyn LoadQueue>).await
}

/// The API on a fresh store of `backend`, its load queue what `queue` makes of the store.
pub async fn api_with_queue(backend: Backend, queue: impl FnOnce(Arc<dyn Store>) -> Arc<dyn LoadQueue>) -> Api {
    let (store, sqlite_path) = store(backend).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse().unwrap()));
    let mut state = ApiState::new(
        store.clone(),
        queue(store.clone()),
        clock,
        vec![TOKEN.to_string()],
        Some(TWILIO.into()),
        base.clone(),
    );
    state.operator_tokens = vec![OPERATOR.to_string()];
    let state = Arc::new(state);
    let app = router(state.clone(), true);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    Api { base, store, state, client, sqlite_path }
}

impl Api {
    /// `GET path` with the token: the status, the JSON answer and its size in bytes.
    pub async fn get(&self, path: &str) -> (StatusCode, Value, usize) {
        let resp = self.client.get(format!("{}{path}", self.base)).bearer_auth(TOKEN).send().await.unwrap();
        let status = resp.status();
        let bytes = resp.bytes().await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null), bytes.len())
    }

    pub async fn post_event(&self, load: &str, body: &Value) -> (StatusCode, Value) {
        let resp = self
            .client
            .post(format!("{}/v1/loads/{load}/events", self.base))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `POST path` with `token` (none: no Authorization): the status and the JSON answer.
    pub async fn post_as(&self, token: Option<&str>, path: &str, body: &Value) -> (StatusCode, Value) {
        let mut req = self.client.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// Posts a Twilio webhook form, signed as Twilio signs it.
    pub async fn twilio(&self, params: &[(&str, &str)]) -> (StatusCode, String) {
        self.twilio_signed("/v1/webhooks/twilio/sms", params, None).await
    }

    /// Posts a Twilio status callback form to the status route with `query` (as the
    /// StatusCallback gave it), signed as Twilio signs it, or with `signature`.
    pub async fn twilio_status(&self, query: &str, params: &[(&str, &str)], signature: Option<&str>) -> StatusCode {
        self.twilio_signed(&format!("/v1/webhooks/twilio/status?{query}"), params, signature).await.0
    }

    /// Posts `params` to `path` (with its query) as Twilio does: form-encoded, signed
    /// over the whole URL, or with `signature` instead.
    async fn twilio_signed(
        &self,
        path: &str,
        params: &[(&str, &str)],
        signature: Option<&str>,
    ) -> (StatusCode, String) {
        let pairs: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let url = format!("{}{path}", self.base);
        let signature = signature.map_or_else(|| twilio::signature(TWILIO, &url, &pairs), str::to_owned);
        let resp = self
            .client
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .header("X-Twilio-Signature", signature)
            .body(serde_urlencoded::to_string(&pairs).unwrap())
            .send()
            .await
            .unwrap();
        let status = resp.status();
        (status, resp.text().await.unwrap_or_default())
    }

    /// The unmatched list, newest first.
    pub async fn unmatched(&self) -> Vec<Value> {
        let (status, v, _) = self.get("/v1/webhooks/twilio/unmatched?limit=1000").await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v["unmatched"].as_array().cloned().unwrap_or_default()
    }

    /// A counter or gauge from `/metrics` (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.client.get(format!("{}/metrics", self.base)).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }
}

/// One `#[tokio::test]` per backend for each `async fn name(backend: Backend)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::common::Backend::SqliteFile).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}
