//! Channel clients (docs/api.md): the SMS, Hero task, Hero Slack and TMS services, and
//! OpsAlerts; the SMS channel may instead be Twilio's own API ([`twilio`]).
//!
//! Every call carries `Idempotency-Key: {outbox id}` and a bearer token; the services
//! dedupe on the key. Status classification: 2xx is a delivery (its JSON `id` is the
//! receipt); 408, 425, 429, 5xx, connection errors and timeouts are retryable; every
//! other status is permanent. A 429 with a `Retry-After` in seconds is throttled: the
//! dispatcher holds the row (and its channel) back that long instead of spending an
//! attempt. A channel with no URL is in record mode: the delivery is
//! recorded in the store, deduped by key, so a fresh machine shows what it would send.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use haul_core::ids::LoadId;
use haul_core::mask::Masker;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_core::{Channel, PerChannel};
use haul_store::DeliveryLog;
use serde_json::Value;

use haul_config::{ChannelConfig, ChannelKind, Config};

pub mod twilio;

use twilio::{Sender, TwilioChannel, TwilioSettings};

/// The SMS channel on Twilio's API, from `[twilio]`, `channels.sms` and
/// `server.public_url` (where delivery receipts go); its secret from
/// `channels.sms.token_env`, or `HAUL_TWILIO_AUTH_TOKEN` when that is unset.
fn twilio(
    config: &Config,
    client: reqwest::Client,
    url: &str,
    timeout: Duration,
    secrets: &Masker,
) -> anyhow::Result<TwilioChannel> {
    let t = &config.twilio;
    let var = config.channels.sms.token_env.as_deref().unwrap_or("HAUL_TWILIO_AUTH_TOKEN");
    let secret = std::env::var(var).map_err(|_| {
        anyhow::anyhow!("channels.sms.kind = \"twilio\" signs in with the secret in {var}, which is not set")
    })?;
    let account_sid = t
        .account_sid
        .clone()
        .ok_or_else(|| anyhow::anyhow!("channels.sms.kind = \"twilio\" needs twilio.account_sid"))?;
    let settings = TwilioSettings {
        base_url: url.to_owned(),
        account_sid,
        api_key_sid: t.api_key_sid.clone(),
        secret,
        sender: Sender { from: t.from.clone(), messaging_service_sid: t.messaging_service_sid.clone() },
        // Only a URL set for the world: the default (the listen address) is not one Twilio can reach.
        status_callback: config
            .server
            .public_url
            .as_deref()
            .map(|u| format!("{}/v1/webhooks/twilio/status", u.trim_end_matches('/'))),
        validity: config.twilio_validity(),
        timeout,
    };
    Ok(TwilioChannel::new(client, settings, secrets))
}

/// A failure worth retrying: the service may accept the same call later.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("retryable: {0}")]
pub struct RetryableDeliveryError(pub String);

/// A failure that will not go away by retrying.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("permanent: {0}")]
pub struct PermanentDeliveryError(pub String);

/// The service is over its rate (429) and said when to come back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("throttled for {}s: {why}", retry_after.as_secs())]
pub struct ThrottledDeliveryError {
    pub why: String,
    pub retry_after: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error(transparent)]
    Retryable(#[from] RetryableDeliveryError),
    #[error(transparent)]
    Permanent(#[from] PermanentDeliveryError),
    #[error(transparent)]
    Throttled(#[from] ThrottledDeliveryError),
}

/// A `Retry-After` in its delta-seconds form (`"7"`). The HTTP-date form, or anything
/// else, is `None`: the 429 is then an ordinary retryable failure.
pub fn retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if v.is_empty() || v.len() > 9 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().map(Duration::from_secs)
}

#[async_trait]
pub trait ChannelClient: Send + Sync {
    /// Delivers `body` to `path` with `key` as the idempotency key; the receipt on
    /// success. `trace` is the send's trace context, for a service that takes one.
    async fn send(
        &self,
        key: &str,
        load_id: &LoadId,
        path: &str,
        body: &Value,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<String, DeliveryError>;

    /// As [`ChannelClient::send`], for a call of `key` that may have reached the
    /// service before, since `tried_since` (an attempt failed, or a claim lapsed
    /// mid-call). A service that dedupes on the key is simply called again; one that
    /// honours no key (Twilio) looks for the earlier call's result first.
    #[allow(clippy::too_many_arguments)]
    async fn resend(
        &self,
        key: &str,
        load_id: &LoadId,
        path: &str,
        body: &Value,
        trace: Option<TraceParent>,
        now: Timestamp,
        tried_since: Timestamp,
    ) -> Result<String, DeliveryError> {
        let _ = tried_since;
        self.send(key, load_id, path, body, trace, now).await
    }

    /// `http`, `twilio` or `record`, for logs.
    fn mode(&self) -> &'static str;
}

/// Longest answer body read from a service; the rest is not read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

pub struct HttpChannel {
    client: reqwest::Client,
    base_url: String,
    token: Option<String>,
    timeout: Duration,
    /// Masks what a failure quotes of the service's answer: this channel's token and
    /// every other secret the process was given ([`HttpChannel::masking`]).
    masker: Masker,
}

/// One HTTP client for every channel: building one loads the TLS roots, which is
/// slow, and a client is a cheap handle to a shared connection pool.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(http_client_builder().build()?)
}

/// The channels' client settings (connect timeout, no redirects), for a client that
/// adds its own (the test services' shorter pool idle time).
pub fn http_client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().connect_timeout(Duration::from_secs(5)).redirect(reqwest::redirect::Policy::none())
}

impl HttpChannel {
    pub fn new(base_url: &str, token: Option<String>, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self::with_client(http_client()?, base_url, token, timeout))
    }

    pub fn with_client(client: reqwest::Client, base_url: &str, token: Option<String>, timeout: Duration) -> Self {
        let masker = Masker::new(token.as_deref());
        HttpChannel { client, base_url: base_url.trim_end_matches('/').to_owned(), token, timeout, masker }
    }

    /// This channel masking `secrets` too (the process's other secrets) in what its
    /// failures quote, before they are stored, logged or forwarded.
    pub fn masking(mut self, secrets: &Masker) -> Self {
        self.masker = secrets.with(self.token.as_deref());
        self
    }
}

#[async_trait]
impl ChannelClient for HttpChannel {
    async fn send(
        &self,
        key: &str,
        _load_id: &LoadId,
        path: &str,
        body: &Value,
        trace: Option<TraceParent>,
        _now: Timestamp,
    ) -> Result<String, DeliveryError> {
        let mut req = self
            .client
            .post(format!("{}{path}", self.base_url))
            .timeout(self.timeout)
            .header("Idempotency-Key", key)
            .json(body);
        if let Some(t) = trace {
            req = req.header("traceparent", t.to_string());
        }
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await.map_err(|e| RetryableDeliveryError(describe(&e, &self.masker)))?;
        let status = resp.status();
        let wait = resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(retry_after);
        let answer = match read_capped(&mut resp).await {
            Ok(answer) => answer,
            Err(e) if status.is_success() => return Err(RetryableDeliveryError(describe(&e, &self.masker)).into()),
            Err(_) => Vec::new(),
        };
        if status.is_success() {
            let id = serde_json::from_slice::<Value>(&answer).ok().and_then(|v| match v.get("id") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Number(n)) => Some(n.to_string()),
                _ => None,
            });
            return Ok(id.unwrap_or_else(|| format!("http-{}", status.as_u16())));
        }
        // Masked before it is clipped: services echo requests, which carry the token and
        // phone numbers, and may quote a credential in any form.
        let snippet: String = self.masker.mask(&String::from_utf8_lossy(&answer)).chars().take(200).collect();
        let failure = format!("HTTP {status}: {snippet}");
        match (status.as_u16(), wait) {
            (429, Some(retry_after)) => Err(ThrottledDeliveryError { why: failure, retry_after }.into()),
            (408 | 425 | 429 | 500..=599, _) => Err(RetryableDeliveryError(failure).into()),
            (_, _) => Err(PermanentDeliveryError(failure).into()),
        }
    }

    fn mode(&self) -> &'static str {
        "http"
    }
}

/// An answer's body, the first [`MAX_ANSWER_BYTES`] of it: the rest is not read.
pub(crate) async fn read_capped(resp: &mut reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut answer = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if answer.len() + chunk.len() > MAX_ANSWER_BYTES {
            break;
        }
        answer.extend_from_slice(&chunk);
    }
    Ok(answer)
}

/// A failed request in one line, down to its root cause: reqwest's own Display stops
/// at "error sending request", which hides "Connection refused" or a DNS failure.
/// Secrets are masked.
pub fn describe(e: &reqwest::Error, masker: &Masker) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    let mut parts = vec![e.to_string()];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    let chain = parts.join(": ");
    masker.mask(&if e.is_connect() { format!("cannot connect: {chain}") } else { chain })
}

/// Record mode: the store keeps the delivery, deduped by key.
pub struct RecordChannel {
    channel: Channel,
    log: Arc<dyn DeliveryLog>,
}

impl RecordChannel {
    pub fn new(channel: Channel, log: Arc<dyn DeliveryLog>) -> Self {
        RecordChannel { channel, log }
    }
}

#[async_trait]
impl ChannelClient for RecordChannel {
    async fn send(
        &self,
        key: &str,
        load_id: &LoadId,
        _path: &str,
        body: &Value,
        _trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<String, DeliveryError> {
        let (receipt, _) = self
            .log
            .record_delivery(self.channel.config_name(), key, load_id, body, now)
            .await
            .map_err(|e| RetryableDeliveryError(e.to_string()))?;
        Ok(receipt)
    }

    fn mode(&self) -> &'static str {
        "record"
    }
}

/// A channel's client with each call's duration recorded, by channel and result
/// (`delivered`, `retryable`, `permanent`).
struct Timed {
    channel: Channel,
    inner: Arc<dyn ChannelClient>,
}

#[async_trait]
impl ChannelClient for Timed {
    async fn send(
        &self,
        key: &str,
        load_id: &LoadId,
        path: &str,
        body: &Value,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<String, DeliveryError> {
        let started = std::time::Instant::now();
        let sent = self.inner.send(key, load_id, path, body, trace, now).await;
        self.timed(started, sent)
    }

    #[allow(clippy::too_many_arguments)]
    async fn resend(
        &self,
        key: &str,
        load_id: &LoadId,
        path: &str,
        body: &Value,
        trace: Option<TraceParent>,
        now: Timestamp,
        tried_since: Timestamp,
    ) -> Result<String, DeliveryError> {
        let started = std::time::Instant::now();
        let sent = self.inner.resend(key, load_id, path, body, trace, now, tried_since).await;
        self.timed(started, sent)
    }

    fn mode(&self) -> &'static str {
        self.inner.mode()
    }
}

impl Timed {
    fn timed(&self, started: std::time::Instant, sent: Result<String, DeliveryError>) -> Result<String, DeliveryError> {
        let result = match &sent {
            Ok(_) => "delivered",
            Err(DeliveryError::Retryable(_)) => "retryable",
            Err(DeliveryError::Permanent(_)) => "permanent",
            Err(DeliveryError::Throttled(_)) => "throttled",
        };
        metrics::histogram!(
            "haul_channel_call_duration_seconds",
            "channel" => self.channel.config_name(),
            "result" => result
        )
        .record(started.elapsed().as_secs_f64());
        sent
    }
}

/// The client of every channel, keyed by channel.
#[derive(Clone)]
pub struct Channels {
    clients: PerChannel<Arc<dyn ChannelClient>>,
}

impl Channels {
    /// `make(channel)` for each channel, in `Channel::ALL` order; every call of each is
    /// timed (`haul_channel_call_duration_seconds`).
    pub fn build(mut make: impl FnMut(Channel) -> anyhow::Result<Arc<dyn ChannelClient>>) -> anyhow::Result<Self> {
        let clients = PerChannel::try_from_fn(|channel| {
            let inner = make(channel)?;
            Ok::<_, anyhow::Error>(Arc::new(Timed { channel, inner }) as Arc<dyn ChannelClient>)
        })?;
        Ok(Channels { clients })
    }

    /// HTTP clients for the channels with a URL (Twilio's API for a `twilio` SMS
    /// channel), record mode for the others. Tokens are read from the environment
    /// variables the config names; a named variable that is unset is an error (a token
    /// that silently goes missing would fail every send). Each client masks `secrets`
    /// (the process's, [`crate::secrets::configured`]) and its own token in what its
    /// failures quote.
    pub fn from_config(config: &Config, log: Arc<dyn DeliveryLog>, secrets: &Masker) -> anyhow::Result<Self> {
        let client = http_client()?;
        let make = |channel: Channel| -> anyhow::Result<Arc<dyn ChannelClient>> {
            let c: &ChannelConfig = config.channels.get(channel);
            let Some(url) = c.service_url() else { return Ok(Arc::new(RecordChannel::new(channel, log.clone()))) };
            let timeout = c.timeout.unwrap_or(Duration::from_secs(5));
            if c.kind() == ChannelKind::Twilio {
                return Ok(Arc::new(twilio(config, client.clone(), url, timeout, secrets)?));
            }
            let token = match &c.token_env {
                Some(var) => Some(
                    std::env::var(var)
                        .map_err(|_| anyhow::anyhow!("channels.{channel}.token_env names {var}, which is not set"))?,
                ),
                None => None,
            };
            Ok(Arc::new(HttpChannel::with_client(client.clone(), url, token, timeout).masking(secrets)))
        };
        Self::build(make)
    }

    pub fn get(&self, channel: Channel) -> &Arc<dyn ChannelClient> {
        self.clients.get(channel)
    }

    pub fn iter(&self) -> impl Iterator<Item = (Channel, &Arc<dyn ChannelClient>)> {
        self.clients.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_twilio_sms_channel_is_built_from_its_settings() {
        let config = haul_sqlite::SqliteConfig::from_url("sqlite::memory:").unwrap();
        let log: Arc<dyn DeliveryLog> = Arc::new(haul_sqlite::SqliteStore::open(&config).unwrap());
        let twilio = |token_env: &str| {
            let toml = format!(
                "[channels.sms]\nkind = \"twilio\"\ntoken_env = \"{token_env}\"\n\
                 [twilio]\naccount_sid = \"AC0123456789abcdef0123456789abcdef\"\nfrom = \"+15555550000\""
            );
            Config::from_toml(&toml).unwrap()
        };
        // PATH is set wherever tests run; its value stands in for the Auth Token.
        let channels = Channels::from_config(&twilio("PATH"), log.clone(), &Masker::default()).unwrap();
        let modes: Vec<_> = channels.iter().map(|(c, client)| (c.config_name(), client.mode())).collect();
        assert_eq!(
            modes,
            [("sms", "twilio"), ("hero", "record"), ("slack", "record"), ("tms", "record"), ("ops", "record")]
        );
        let unset = "HAUL_TEST_NO_SUCH_VARIABLE_SET";
        let err = Channels::from_config(&twilio(unset), log, &Masker::default()).err().unwrap().to_string();
        assert!(err.contains(unset) && err.contains("twilio"), "{err}");
    }

    #[test]
    fn retry_after_reads_seconds_and_nothing_else() {
        let check = |v: &str, want: Option<u64>| assert_eq!(retry_after(v), want.map(Duration::from_secs), "{v:?}");
        check("7", Some(7));
        check(" 120 ", Some(120));
        check("0", Some(0));
        check("999999999", Some(999_999_999));
        check("1000000000", None);
        check("", None);
        check("-1", None);
        check("1.5", None);
        check("Wed, 21 Oct 2026 07:28:00 GMT", None);
    }
}
