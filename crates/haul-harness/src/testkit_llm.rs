//! A stand-in for an OpenAI-compatible chat-completions endpoint that replies with
//! **recorded answers**, over real HTTP on 127.0.0.1 (axum).
//!
//! It exists so the real `LlmDecider` (its HTTP, its parsing, its limits) runs in tests
//! and in `haul eval --decider llm` without a model: an answers file maps the load id
//! and the inbound event id found in the request's user message to an answer: good
//! tool calls, a malformed body, an unknown tool, a refusal, a slow answer, a 429/500.
//! It also checks each request's shape (bearer token, model, system and user messages,
//! every action tool, `tool_choice`), so a client bug fails the test instead of
//! quietly producing a fallback. Requests with no recorded answer and misshapen
//! requests are kept as `problems`. Used by evals and tests, never by `serve`.
//!
//! The answers file (TOML):
//!
//! ```toml
//! model = "recorded-model"   # the model the decider asks for (checked)
//! timeout = "2s"             # the decider's time limit in evals (default 2s)
//!
//! [[answer]]
//! load = "llm_eta"           # optional: any load when absent
//! event = "ping_0700"        # the inbound event id; `*` globs
//! content = "High risk: ask the driver for an ETA."
//! [[answer.tool_call]]
//! name = "send_sms"
//! arguments = { to = "driver", body = "What is your ETA?", ask_id = "ask:eta_request:ping_0700", step = 1 }
//!
//! [[answer]]
//! event = "ping_0800"
//! body = "{not json"         # the body verbatim (status 200 unless `status`)
//! # also: status = 429, delay = "5s", refusal = "…", finish_reason = "stop",
//! # usage = { prompt_tokens = 900, completion_tokens = 40 } (default: a quarter of the
//! # request's and the answer's bytes), and per tool call `arguments_raw = "…"` for
//! # arguments that are not JSON.
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use haul_core::ActionType;
use haul_core::parse_duration;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::testkit::glob_match;

/// The token the recorded server expects unless told otherwise.
pub const RECORDED_API_KEY: &str = "recorded-llm-key";

/// The decider's time limit in evals when the answers file gives none.
pub const DEFAULT_EVAL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct AnswersFile {
    model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(default)]
    answer: Vec<Answer>,
}

/// Recorded answers and the model they are for.
#[derive(Clone, Debug)]
pub struct Answers {
    pub model: String,
    /// The decider's time limit to use with these answers.
    pub timeout: Duration,
    pub answers: Vec<Answer>,
}

/// One recorded answer and what request it answers.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The load id (exact); any load when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<String>,
    /// The inbound event id; `*` matches any run of characters.
    pub event: String,
    /// HTTP status (default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Wait this long (real time) before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// The body verbatim instead of a chat completion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Default: `tool_calls` with tool calls, `stop` without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_call: Vec<RecordedCall>,
    /// The tokens the answer says it took; default: a quarter of the request's bytes
    /// in, a quarter of the answer's out (an estimate that repeats exactly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<RecordedUsage>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedCall {
    pub name: String,
    /// Sent as JSON text, as the API does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    /// Sent verbatim (for arguments that are not JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_raw: Option<String>,
}

impl Answers {
    /// Parses an answers file; errors name the line.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let f: AnswersFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().replace('\n', " ");
            match line {
                Some(l) => anyhow::anyhow!("line {l}: {msg}"),
                None => anyhow::anyhow!("{msg}"),
            }
        })?;
        let timeout = match &f.timeout {
            Some(t) => parse_duration(t).map_err(|e| anyhow::anyhow!("timeout: {}", e.message))?,
            None => DEFAULT_EVAL_TIMEOUT,
        };
        for (i, a) in f.answer.iter().enumerate() {
            if let Some(d) = &a.delay {
                parse_duration(d)
                    .map_err(|e| anyhow::anyhow!("answer {i} (event {}): delay: {}", a.event, e.message))?;
            }
            if a.tool_call.iter().any(|c| c.arguments.is_some() && c.arguments_raw.is_some()) {
                anyhow::bail!("answer {i} (event {}): a tool call has both arguments and arguments_raw", a.event);
            }
        }
        Ok(Answers { model: f.model, timeout, answers: f.answer })
    }

    /// The answers as an answers file.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        let f = AnswersFile {
            model: self.model.clone(),
            timeout: Some(haul_core::time::format_duration(self.timeout)),
            answer: self.answers.clone(),
        };
        Ok(toml::to_string(&f)?)
    }

    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))
    }

    fn find(&self, load: &str, event: &str) -> Option<&Answer> {
        self.answers.iter().find(|a| a.load.as_deref().is_none_or(|l| l == load) && glob_match(&a.event, event))
    }
}

/// One request the server received.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmRequest {
    pub load: String,
    pub event: String,
    /// Whether a recorded answer matched it (or, live, the model answered).
    pub answered: bool,
}

/// A real model the server asks, within a budget, when no recorded answer matches
/// (`haul replay --live`); what it answers is recorded ([`RecordedLlm::live_answers`]).
#[derive(Clone)]
pub struct Upstream {
    /// `decider.llm.base_url`.
    pub base_url: String,
    pub api_key: String,
    /// Model calls at most.
    pub max_calls: usize,
}

#[derive(Default)]
struct Shared {
    requests: Vec<LlmRequest>,
    problems: Vec<String>,
    /// Answers the upstream model gave, as recorded answers.
    live: Vec<Answer>,
    live_calls: usize,
}

struct Server {
    answers: Answers,
    api_key: String,
    shared: Mutex<Shared>,
    upstream: Option<(Upstream, reqwest::Client)>,
}

/// The recorded chat-completions server.
#[derive(Clone)]
pub struct RecordedLlm {
    pub addr: SocketAddr,
    server: Arc<Server>,
}

impl RecordedLlm {
    /// Starts on an ephemeral port of 127.0.0.1; requests must carry `Bearer {api_key}`.
    pub async fn start(answers: Answers, api_key: &str) -> anyhow::Result<Self> {
        Self::start_with(answers, api_key, None).await
    }

    /// As [`start`](Self::start); a request with no recorded answer goes to `upstream`
    /// while its budget lasts, and its answer is recorded.
    pub async fn start_with(answers: Answers, api_key: &str, upstream: Option<Upstream>) -> anyhow::Result<Self> {
        let upstream = match upstream {
            Some(u) => Some((u, reqwest::Client::builder().timeout(answers.timeout).build()?)),
            None => None,
        };
        let server = Arc::new(Server { answers, api_key: api_key.to_owned(), shared: Mutex::default(), upstream });
        let app = Router::new().route("/v1/chat/completions", post(handle)).with_state(server.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "recorded LLM server stopped");
            }
        });
        Ok(RecordedLlm { addr, server })
    }

    /// The `decider.llm.base_url` that reaches this server.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn model(&self) -> &str {
        &self.server.answers.model
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.server.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<LlmRequest> {
        self.lock().requests.clone()
    }

    /// Requests about one event.
    pub fn requests_for(&self, event: &str) -> usize {
        self.lock().requests.iter().filter(|r| r.event == event).count()
    }

    /// What the upstream model answered, as recorded answers (in the order asked).
    pub fn live_answers(&self) -> Vec<Answer> {
        self.lock().live.clone()
    }

    /// Misshapen requests and requests with no recorded answer.
    pub fn problems(&self) -> Vec<String> {
        self.lock().problems.clone()
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({"error": {"message": message, "type": "recorded_error"}}))).into_response()
}

/// What is wrong with a request's shape, if anything; else its (load, event).
fn check_shape(server: &Server, headers: &HeaderMap, body: &[u8]) -> Result<(String, String), (StatusCode, String)> {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    if auth != format!("Bearer {}", server.api_key) {
        return Err((StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()));
    }
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("the request body is not JSON: {e}")))?;
    if v["model"] != server.answers.model {
        return Err(bad(format!("model {} is not {:?}", v["model"], server.answers.model)));
    }
    let messages = v["messages"].as_array().ok_or_else(|| bad("no messages".into()))?;
    let role = |i: usize| messages.get(i).and_then(|m| m["role"].as_str()).unwrap_or("");
    if messages.len() != 2 || role(0) != "system" || role(1) != "user" {
        return Err(bad("messages must be one system and one user message".into()));
    }
    if !messages[0]["content"].as_str().is_some_and(|c| c.contains("SOP")) {
        return Err(bad("the system message does not carry the SOP".into()));
    }
    let user: Value = messages[1]["content"]
        .as_str()
        .and_then(|c| serde_json::from_str(c).ok())
        .ok_or_else(|| bad("the user message is not JSON text".into()))?;
    for key in ["prompt_version", "now", "policy", "state"] {
        if user.get(key).is_none() {
            return Err(bad(format!("the user message has no {key}")));
        }
    }
    let (Some(load), Some(event)) = (user["load_id"].as_str(), user["event"]["event_id"].as_str()) else {
        return Err(bad("the user message has no load_id or event.event_id".into()));
    };
    let tools = v["tools"].as_array().ok_or_else(|| bad("no tools".into()))?;
    let mut names = Vec::new();
    for t in tools {
        if t["type"] != "function" || !t["function"]["parameters"].is_object() {
            return Err(bad(format!("tool {t} is not a function with parameters")));
        }
        names.extend(t["function"]["name"].as_str());
    }
    for t in ActionType::ALL {
        if !names.contains(&t.as_str()) {
            return Err(bad(format!("no tool for {t}")));
        }
    }
    if !matches!(v["tool_choice"].as_str(), Some("required" | "auto")) {
        return Err(bad("tool_choice is not \"required\" or \"auto\"".into()));
    }
    Ok((load.to_owned(), event.to_owned()))
}

async fn handle(State(server): State<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    let (load, event) = match check_shape(&server, &headers, &body) {
        Ok(x) => x,
        Err((status, why)) => {
            server.shared.lock().unwrap_or_else(|p| p.into_inner()).problems.push(why.clone());
            return error(status, &why);
        }
    };
    let answer = server.answers.find(&load, &event).cloned();
    if answer.is_none()
        && let Some((up, client)) = &server.upstream
    {
        return live(&server, up, client, load, event, body).await;
    }
    {
        let mut shared = server.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.requests.push(LlmRequest { load: load.clone(), event: event.clone(), answered: answer.is_some() });
        if answer.is_none() {
            shared.problems.push(format!("no recorded answer for load {load} event {event}"));
        }
    }
    let Some(a) = answer else {
        return error(StatusCode::INTERNAL_SERVER_ERROR, &format!("no recorded answer for load {load} event {event}"));
    };
    if let Some(d) = a.delay.as_deref().and_then(|d| parse_duration(d).ok()) {
        tokio::time::sleep(d).await;
    }
    let status = StatusCode::from_u16(a.status.unwrap_or(200)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Some(raw) = a.body {
        return (status, [(header::CONTENT_TYPE, "application/json")], raw).into_response();
    }
    if !status.is_success() {
        return error(status, "recorded failure");
    }
    let calls: Vec<Value> = a
        .tool_call
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let arguments = match (&c.arguments_raw, &c.arguments) {
                (Some(raw), _) => raw.clone(),
                (None, Some(v)) => v.to_string(),
                (None, None) => "{}".into(),
            };
            json!({"id": format!("call_{i}"), "type": "function", "function": {"name": c.name, "arguments": arguments}})
        })
        .collect();
    let finish = a.finish_reason.unwrap_or_else(|| if calls.is_empty() { "stop".into() } else { "tool_calls".into() });
    let mut message = json!({"role": "assistant", "content": a.content, "refusal": a.refusal});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    let usage = a.usage.unwrap_or(RecordedUsage {
        prompt_tokens: body.len() as u64 / 4,
        completion_tokens: message.to_string().len() as u64 / 4,
    });
    let completion = json!({
        "id": "chatcmpl-recorded",
        "object": "chat.completion",
        "created": 0,
        "model": server.answers.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
                  "total_tokens": usage.prompt_tokens + usage.completion_tokens},
    });
    (status, axum::Json(completion)).into_response()
}

/// Asks the upstream model, within the budget; records its answer.
async fn live(
    server: &Server,
    up: &Upstream,
    client: &reqwest::Client,
    load: String,
    event: String,
    body: Bytes,
) -> Response {
    let spent = {
        let mut shared = server.shared.lock().unwrap_or_else(|p| p.into_inner());
        let spent = shared.live_calls >= up.max_calls;
        if !spent {
            shared.live_calls += 1;
        }
        spent
    };
    let fail = |why: String| {
        let mut shared = server.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.requests.push(LlmRequest { load: load.clone(), event: event.clone(), answered: false });
        shared.problems.push(why.clone());
        error(StatusCode::SERVICE_UNAVAILABLE, &why)
    };
    if spent {
        return fail(format!("the live call budget ({}) is spent", up.max_calls));
    }
    let url = format!("{}/chat/completions", up.base_url.trim_end_matches('/'));
    let sent = client
        .post(url)
        .bearer_auth(&up.api_key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.to_vec())
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return fail(format!("the live model could not be reached: {e}")),
    };
    let status = resp.status();
    let Ok(bytes) = resp.bytes().await else { return fail("the live model's answer was cut short".into()) };
    let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
    let message = parsed.as_ref().map(|v| v["choices"][0].clone());
    let (true, Some(choice)) = (status.is_success(), message.filter(|m| m.is_object())) else {
        return fail(format!("the live model answered {status}"));
    };
    let m = &choice["message"];
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let answer = Answer {
        load: Some(load.clone()),
        event: event.clone(),
        content: text(&m["content"]),
        refusal: text(&m["refusal"]),
        finish_reason: text(&choice["finish_reason"]),
        tool_call: m["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| RecordedCall {
                        name: c["function"]["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: None,
                        arguments_raw: Some(match &c["function"]["arguments"] {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        }),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ..Answer::default()
    };
    {
        let mut shared = server.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.requests.push(LlmRequest { load, event, answered: true });
        shared.live.push(answer);
    }
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}
