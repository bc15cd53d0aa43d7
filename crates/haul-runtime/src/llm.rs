//! `decider.kind = "llm"`: a thin OpenAI-compatible chat-completions client with tool
//! calls, as a [`Decider`].
//!
//! It exists to move bytes between the worker and a model, and nothing else: what the
//! prompt says and what the answer means live in `haul_core::tools` (pure, tested
//! without a network). One request per decision: `POST {base_url}/chat/completions`
//! with the SOP as the system message, `{state, event, now, policy}` as JSON in the user
//! message, one tool per action type and `tool_choice: "required"`. Every way the call
//! can go wrong is an [`LlmError`]; the worker turns any error, and a late answer, into
//! the `fallback` decision. The API key is read once from the environment and is never
//! logged, printed or put in an error.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use haul_core::InboundEvent;
use haul_core::decision::Decision;
use haul_core::ids::LoadId;
use haul_core::mask::Masker;
use haul_core::projection::LoadState;
use haul_core::sop::Policies;
use haul_core::spend::{LlmUsage, Price};
use haul_core::time::Timestamp;
use haul_core::tools::{self, ToolCall, ToolCallError};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::debug;

use crate::decider::Decider;
use haul_config::{ClientConfig, LlmConfig, LlmConfigError};
use std::collections::BTreeMap;

/// Largest answer body read, in bytes; a longer one is an error, not a decision.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Longest piece of an error body quoted in an error (and so in a fallback rationale).
const ERROR_SNIPPET_CHARS: usize = 200;

/// Where and how to reach the model.
#[derive(Clone)]
pub struct LlmSettings {
    /// The API root, e.g. `https://api.openai.com/v1`; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    pub model: String,
    /// The bearer token. Not shown by `Debug`.
    pub api_key: String,
    pub timeout: Duration,
}

impl fmt::Debug for LlmSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlmSettings")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &"<redacted>")
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why a model call did not give a decision. Every variant ends in the fallback
/// decision; the variant says whether retrying later could help (transport, rate
/// limit, 5xx, timeout) or the answer itself was wrong.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("the model endpoint could not be reached: {0}")]
    Transport(String),
    #[error("the model did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the model endpoint is rate limiting (429)")]
    RateLimited,
    #[error("the model endpoint answered {status}: {snippet}")]
    Status { status: u16, snippet: String },
    #[error("the answer body is larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("the answer is not a chat completion: {0}")]
    Malformed(String),
    #[error("the model refused: {0}")]
    Refusal(String),
    #[error("the model answered without a tool call (finish_reason {finish_reason:?}): {text}")]
    NoToolCalls { finish_reason: String, text: String },
    #[error("the model's tool calls do not make a decision: {0}")]
    ToolCalls(#[from] ToolCallError),
}

impl LlmError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            LlmError::Transport(_) => "transport",
            LlmError::Timeout(_) => "timeout",
            LlmError::RateLimited => "rate_limited",
            LlmError::Status { .. } => "status",
            LlmError::TooLarge => "too_large",
            LlmError::Malformed(_) => "malformed",
            LlmError::Refusal(_) => "refusal",
            LlmError::NoToolCalls { .. } => "no_tool_calls",
            LlmError::ToolCalls(_) => "invalid",
        }
    }
}

/// The LLM decider: one chat-completions call per decision.
pub struct LlmDecider {
    client: reqwest::Client,
    settings: LlmSettings,
    endpoint: String,
    policies: Policies,
    /// The model's price (`decider.llm.prices`): each decision's cost; `None`: none recorded.
    price: Option<Price>,
    /// The fixed part of every request (model, system message, tools), built once: each
    /// request is it with the decision's user message.
    fixed: Value,
    /// Its SHA-256 (the decision's `llm.prompt_hash`) and its text as stored.
    fixed_text: (String, String),
    /// Masks what an error quotes of the endpoint's answer: its own key and every other
    /// secret the process was given ([`LlmDecider::masking`]).
    masker: Masker,
}

impl LlmDecider {
    pub fn new(settings: LlmSettings, policies: Policies) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        let endpoint = format!("{}/chat/completions", settings.base_url.trim_end_matches('/'));
        let masker = Masker::new([settings.api_key.as_str()]);
        let fixed = fixed_part(&settings.model);
        let text = fixed.to_string();
        let fixed_text = (sha256_hex(&text), text);
        Ok(LlmDecider { client, settings, endpoint, policies, price: None, fixed, fixed_text, masker })
    }

    /// This decider recording each decision's cost by `price` (USD per million tokens).
    pub fn priced(mut self, price: Option<Price>) -> Self {
        self.price = price;
        self
    }

    /// This decider masking `secrets` too (the process's other secrets) in what its
    /// errors quote.
    pub fn masking(mut self, secrets: &Masker) -> Self {
        self.masker = secrets.with([self.settings.api_key.as_str()]);
        self
    }

    /// From `decider.llm.*`, the key from the variable `api_key_env` names. Errors name
    /// the setting (and never hold the key).
    pub fn from_config(c: &LlmConfig, clients: &BTreeMap<String, ClientConfig>) -> anyhow::Result<Self> {
        c.check()?;
        let price = c.price(clients)?;
        let policies = haul_config::policies(clients);
        let api_key = std::env::var(&c.api_key_env)
            .ok()
            .filter(|k| !k.trim().is_empty())
            .ok_or_else(|| LlmConfigError::NoApiKey(c.api_key_env.clone()))?;
        let settings = LlmSettings {
            base_url: c.base_url.clone().unwrap_or_default(),
            model: c.model.clone().unwrap_or_default(),
            api_key,
            timeout: c.timeout,
        };
        Ok(Self::new(settings, policies)?.priced(price))
    }

    pub fn settings(&self) -> &LlmSettings {
        &self.settings
    }

    /// The user message of one decision: the load's state, the event, `now`, the policy.
    fn input_text(&self, load: &LoadId, state: &LoadState, event: &InboundEvent, now: Timestamp) -> String {
        let policy = self.policies.for_client(state.client.as_deref());
        tools::prompt_input(load, state, event, &policy, now).to_string()
    }

    /// The request body for one decision.
    pub fn request_body(&self, load: &LoadId, state: &LoadState, event: &InboundEvent, now: Timestamp) -> Value {
        with_input(self.fixed.clone(), self.input_text(load, state, event, now))
    }

    /// One model call and the decision its answer makes.
    pub async fn ask(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> Result<Decision, LlmError> {
        self.ask_metered(load, state, event, now).await.map_err(|f| f.error)
    }

    /// [`ask`](Self::ask), with what the call cost when the model answered but its
    /// answer made no decision (the tokens are spent all the same).
    async fn ask_metered(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> Result<Decision, Spent> {
        let input = self.input_text(load, state, event, now);
        let input_hash = sha256_hex(&input);
        let body = with_input(self.fixed.clone(), input);
        let answer = tokio::time::timeout(self.settings.timeout, self.call(&body))
            .await
            .map_err(|_| LlmError::Timeout(self.settings.timeout))
            .and_then(|r| r)
            .map_err(Spent::nothing)?;
        let completion: Completion = serde_json::from_slice(&answer)
            .map_err(|e| Spent::nothing(LlmError::Malformed(self.clip(&e.to_string()))))?;
        let model_version = completion.model();
        let (input_tokens, output_tokens) = completion.tokens();
        let Some(choice) = completion.choices.into_iter().next() else {
            return Err(Spent::nothing(LlmError::Malformed("no choices".into())));
        };
        let usage = LlmUsage {
            model: self.settings.model.clone(),
            model_version: model_version.filter(|m| !m.is_empty() && *m != self.settings.model),
            input_tokens,
            output_tokens,
            cost_micro_usd: self.price.map(|p| p.cost_micro_usd(input_tokens, output_tokens)),
            finish_reason: choice.finish_reason.clone(),
            prompt_hash: self.fixed_text.0.clone(),
            input_hash,
            client: state.charged_client(event),
        };
        let spent = |error: LlmError| Spent { error, usage: Some(usage.clone()) };
        let mut decision = self.decision_of(load, state, event, now, choice).map_err(spent)?;
        decision.llm = Some(usage);
        Ok(decision)
    }

    /// The decision a completion's first choice makes.
    fn decision_of(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
        choice: Choice,
    ) -> Result<Decision, LlmError> {
        let message = choice.message;
        if let Some(r) = message.refusal.as_deref().filter(|r| !r.trim().is_empty()) {
            return Err(LlmError::Refusal(self.clip(r)));
        }
        let calls: Vec<ToolCall> = message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| ToolCall {
                name: c.function.name,
                arguments: match c.function.arguments {
                    Value::String(s) => s,
                    Value::Null => String::new(),
                    // Some servers send the arguments as an object rather than JSON text.
                    other => other.to_string(),
                },
            })
            .collect();
        if calls.is_empty() {
            return Err(LlmError::NoToolCalls {
                finish_reason: choice.finish_reason.unwrap_or_default(),
                text: self.clip(message.content.as_deref().unwrap_or("")),
            });
        }
        debug!(calls = calls.len(), model = %self.settings.model, "model answered");
        let name = self.name();
        Ok(tools::decision_from_tool_calls(load, state, event, now, &name, &calls, message.content.as_deref())?)
    }

    /// POST the body; the answer's bytes when it is a 2xx of at most [`MAX_BODY_BYTES`].
    async fn call(&self, body: &Value) -> Result<Vec<u8>, LlmError> {
        let mut resp = self
            .client
            .post(&self.endpoint)
            .bearer_auth(&self.settings.api_key)
            .timeout(self.settings.timeout)
            .json(body)
            .send()
            .await
            .map_err(|e| self.transport(&e))?;
        let status = resp.status();
        if resp.content_length().is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            return Err(LlmError::TooLarge);
        }
        let mut buf = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&e))? {
            if buf.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(LlmError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        if status.as_u16() == 429 {
            return Err(LlmError::RateLimited);
        }
        if !status.is_success() {
            return Err(LlmError::Status {
                status: status.as_u16(),
                snippet: self.clip(&String::from_utf8_lossy(&buf)),
            });
        }
        Ok(buf)
    }

    fn clip(&self, s: &str) -> String {
        clip(&self.masker, s)
    }

    fn transport(&self, e: &reqwest::Error) -> LlmError {
        if e.is_timeout() {
            LlmError::Timeout(self.settings.timeout)
        } else {
            LlmError::Transport(self.clip(&transport(e)))
        }
    }
}

/// A reqwest error without its source chain's noise, one line.
fn transport(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// One line of at most [`ERROR_SNIPPET_CHARS`] characters, the secrets, phone numbers
/// and credentials masked first (an endpoint may echo the request and its key).
fn clip(masker: &Masker, s: &str) -> String {
    let one: String = masker.mask(s).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let one = one.trim();
    if one.chars().count() <= ERROR_SNIPPET_CHARS {
        return one.to_owned();
    }
    let mut out: String = one.chars().take(ERROR_SNIPPET_CHARS).collect();
    out.push('…');
    out
}

/// A model call that made no decision, and what it cost when the model answered.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Spent {
    #[source]
    pub error: LlmError,
    pub usage: Option<LlmUsage>,
}

impl Spent {
    fn nothing(error: LlmError) -> Self {
        Spent { error, usage: None }
    }
}

/// The part of every request that does not depend on the decision: what
/// `llm.prompt_hash` names.
fn fixed_part(model: &str) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "system", "content": tools::SYSTEM_PROMPT}],
        "tools": tools::tool_definitions(),
        "tool_choice": "required",
        "temperature": 0,
    })
}

/// The request: the fixed part with the decision's user message after the system one.
fn with_input(mut fixed: Value, input: String) -> Value {
    if let Some(messages) = fixed.get_mut("messages").and_then(Value::as_array_mut) {
        messages.push(json!({"role": "user", "content": input}));
    }
    fixed
}

/// SHA-256 of a text, in lowercase hex.
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[async_trait]
impl Decider for LlmDecider {
    fn name(&self) -> String {
        format!("llm:{}", self.settings.model)
    }

    fn prompt_texts(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> Vec<(String, String)> {
        let input = self.input_text(load, state, event, now);
        vec![self.fixed_text.clone(), (sha256_hex(&input), input)]
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        // Operator actions are decided by the deterministic path, never by the model
        // (the worker's filter takes them first; asked anyway, no request is made).
        if let haul_core::EventBody::OperatorAction(op) = &event.body {
            return Ok(haul_core::operator::decide(load, state, event, op, now));
        }
        let result = self.ask_metered(load, state, event, now).await;
        let outcome = match &result {
            Ok(_) => "decided",
            Err(e) => e.error.label(),
        };
        metrics::counter!("haul_llm_requests_total", "outcome" => outcome).increment(1);
        Ok(result?)
    }
}

/// The parts of a chat completion the decider reads; everything else is ignored.
#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    /// Read leniently, as `usage` is: an odd value here does not cost the decision.
    #[serde(default)]
    model: Value,
    #[serde(default)]
    usage: Value,
}

impl Completion {
    /// The model the answer names, when it names one in text.
    fn model(&self) -> Option<String> {
        self.model.as_str().map(|m| m.chars().take(MAX_MODEL_CHARS).collect())
    }

    /// The answer's token counts: 0 for a count absent or not a whole number (some
    /// servers send none; a decision is not lost over its bill).
    fn tokens(&self) -> (u64, u64) {
        let count = |name: &str| self.usage.get(name).and_then(Value::as_u64).unwrap_or(0);
        (count("prompt_tokens"), count("completion_tokens"))
    }
}

/// Longest model name recorded from an answer.
const MAX_MODEL_CHARS: usize = 100;

#[derive(Deserialize)]
struct Choice {
    message: Message,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bill that does not read costs 0 tokens, not the decision.
    #[test]
    fn odd_usage_and_model_fields_read_as_nothing() {
        let check = |body: Value, want: ((u64, u64), Option<&str>)| {
            let c: Completion = serde_json::from_value(body.clone()).unwrap();
            assert_eq!((c.tokens(), c.model().as_deref()), want, "{body}");
        };
        let with = |extra: Value| {
            let mut b = json!({"choices": []});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            b
        };
        check(with(json!({})), ((0, 0), None));
        check(
            with(json!({"usage": {"prompt_tokens": 12, "completion_tokens": 3}, "model": "m-1"})),
            ((12, 3), Some("m-1")),
        );
        check(with(json!({"usage": {"prompt_tokens": 1.5, "completion_tokens": -3}, "model": 7})), ((0, 0), None));
        check(with(json!({"usage": "lots", "model": null})), ((0, 0), None));
        let long = "m".repeat(500);
        check(with(json!({"model": long})), ((0, 0), Some(&"m".repeat(MAX_MODEL_CHARS)[..])));
    }

    #[test]
    fn debug_hides_the_key() {
        let s = LlmSettings {
            base_url: "http://x".into(),
            model: "m".into(),
            api_key: "sk-secret".into(),
            timeout: Duration::from_secs(1),
        };
        assert!(!format!("{s:?}").contains("sk-secret"));
    }
}
