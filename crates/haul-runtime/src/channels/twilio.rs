//! The SMS channel as Twilio's Messages API (`channels.sms.kind = "twilio"`), so a
//! brokerage on Twilio needs no gateway of its own.
//!
//! The dispatcher's SMS call (`{to, body, load_id}`, docs/api.md) becomes
//! `POST /2010-04-01/Accounts/{AccountSid}/Messages.json`, form-encoded, with basic
//! auth (the account, or an API key), `From` or `MessagingServiceSid`,
//! `ValidityPeriod`, and a `StatusCallback` naming the row when haul has a public URL.
//! Twilio's `sid` is the receipt.
//!
//! Twilio honours no idempotency key on a message's creation, so a re-send after a
//! lost answer could text the driver twice. A call that may have reached Twilio
//! before (the row failed an attempt, or an earlier claim lapsed mid-call:
//! [`haul_core::dispatch::tried_since`]) first lists the messages to that number
//! since that first try, and answers the sid of one with the same text and sender
//! instead of creating another. A first try makes no such call: it costs a request
//! of Twilio's rate, and nothing can be there yet.
//!
//! Twilio's answers map to the dispatcher's classes by status: 429 (error 20429) is
//! throttled or retryable, 408, 425 and 5xx retryable, any other refusal permanent
//! with Twilio's error code in the failure (`twilio error 21610: …`), so the rules
//! that read a failure can tell an opted-out number (21610) from a bad one (21211).

use std::time::Duration;

use async_trait::async_trait;
use haul_core::ids::LoadId;
use haul_core::mask::Masker;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use serde::Deserialize;
use serde_json::Value;

use super::{
    ChannelClient, DeliveryError, PermanentDeliveryError, RetryableDeliveryError, ThrottledDeliveryError, describe,
    read_capped, retry_after,
};

/// How far back of a row's first try a message Twilio lists still counts as that
/// row's: Twilio's `date_created` has whole seconds, and its clock is not ours.
const CLOCK_SLACK: Duration = Duration::from_secs(120);

/// Messages listed when looking for an earlier try's (newest first): a driver is
/// never texted this many times in one retry budget, and the page (about a kilobyte a
/// message) stays well inside the 64 KiB of an answer that is read.
const LOOKUP_PAGE: &str = "20";

/// Who the messages are sent as: a number, a Messaging Service, or both (the
/// service's settings with that number).
#[derive(Clone, Debug)]
pub struct Sender {
    pub from: Option<String>,
    pub messaging_service_sid: Option<String>,
}

/// What the channel needs of the settings (`[twilio]`, `channels.sms`).
#[derive(Clone, Debug)]
pub struct TwilioSettings {
    /// Twilio's API, `https://api.twilio.com` unless a test points it elsewhere.
    pub base_url: String,
    pub account_sid: String,
    /// The API key to sign in with; `None`: the account itself.
    pub api_key_sid: Option<String>,
    /// The Auth Token, or the API key's secret.
    pub secret: String,
    pub sender: Sender,
    /// Where Twilio posts the message's delivery status, if anywhere
    /// (`{server.public_url}/v1/webhooks/twilio/status`); each message's adds its
    /// row's key ([`status_callback`]).
    pub status_callback: Option<String>,
    pub validity: Duration,
    pub timeout: Duration,
}

pub struct TwilioChannel {
    client: reqwest::Client,
    settings: TwilioSettings,
    /// The Messages resource: `{base}/2010-04-01/Accounts/{sid}/Messages.json`.
    messages_url: String,
    masker: Masker,
}

impl TwilioChannel {
    /// `secrets`: the process's other secrets, masked with this channel's own in what
    /// its failures quote.
    pub fn new(client: reqwest::Client, settings: TwilioSettings, secrets: &Masker) -> Self {
        let messages_url = format!(
            "{}/2010-04-01/Accounts/{}/Messages.json",
            settings.base_url.trim_end_matches('/'),
            settings.account_sid
        );
        let masker = secrets.with([settings.secret.as_str()]);
        TwilioChannel { client, settings, messages_url, masker }
    }

    fn user(&self) -> &str {
        self.settings.api_key_sid.as_deref().unwrap_or(&self.settings.account_sid)
    }

    /// The sid of a message to `to` with `text` from this sender, created since
    /// `since` (less the clock slack), if Twilio lists one.
    async fn find_sent(&self, to: &str, text: &str, since: Timestamp) -> Result<Option<String>, DeliveryError> {
        let mut query = vec![("To", to), ("PageSize", LOOKUP_PAGE)];
        if let Some(from) = &self.settings.sender.from {
            query.push(("From", from));
        }
        let req = self
            .client
            .get(&self.messages_url)
            .timeout(self.settings.timeout)
            .basic_auth(self.user(), Some(&self.settings.secret))
            .query(&query);
        let answer = self.call(req).await?;
        let page: MessagePage = serde_json::from_slice(&answer).map_err(|e| {
            RetryableDeliveryError(format!("looking for an earlier send: Twilio's message list does not read: {e}"))
        })?;
        let earliest =
            since.checked_sub(jiff::SignedDuration::try_from(CLOCK_SLACK).unwrap_or_default()).unwrap_or(since);
        Ok(page.messages.into_iter().find(|m| m.is_ours(text, &self.settings.sender, earliest)).map(|m| m.sid))
    }

    /// Sends `req`; the answer's body on a 2xx, else the failure classified.
    async fn call(&self, req: reqwest::RequestBuilder) -> Result<Vec<u8>, DeliveryError> {
        let mut resp = req.send().await.map_err(|e| RetryableDeliveryError(describe(&e, &self.masker)))?;
        let status = resp.status();
        let wait = resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(retry_after);
        let answer = match read_capped(&mut resp).await {
            Ok(answer) => answer,
            Err(e) if status.is_success() => return Err(RetryableDeliveryError(describe(&e, &self.masker)).into()),
            Err(_) => Vec::new(),
        };
        if status.is_success() {
            return Ok(answer);
        }
        Err(classify(status.as_u16(), wait, &answer, &self.masker))
    }
}

/// A refusal as the dispatcher's class, quoting Twilio's error code and message
/// (masked, then clipped).
pub fn classify(status: u16, wait: Option<Duration>, answer: &[u8], masker: &Masker) -> DeliveryError {
    let error = serde_json::from_slice::<TwilioError>(answer).ok();
    let said = match &error {
        Some(TwilioError { code: Some(code), message }) => {
            format!("twilio error {code}: {}", message.as_deref().unwrap_or(""))
        }
        _ => String::from_utf8_lossy(answer).into_owned(),
    };
    let said: String = masker.mask(&said).chars().take(200).collect();
    let failure = format!("HTTP {status}: {said}");
    let code = error.and_then(|e| e.code);
    match (status, code, wait) {
        (429, _, Some(retry_after)) => ThrottledDeliveryError { why: failure, retry_after }.into(),
        (408 | 425 | 429 | 500..=599, _, _) | (_, Some(TOO_MANY_REQUESTS), _) => RetryableDeliveryError(failure).into(),
        _ => PermanentDeliveryError(failure).into(),
    }
}

/// Twilio's error code for a request over its rate.
const TOO_MANY_REQUESTS: u64 = 20429;

#[derive(Deserialize)]
struct TwilioError {
    code: Option<u64>,
    message: Option<String>,
}

#[derive(Deserialize)]
struct MessagePage {
    #[serde(default)]
    messages: Vec<ListedMessage>,
}

#[derive(Deserialize)]
struct ListedMessage {
    sid: String,
    body: Option<String>,
    from: Option<String>,
    messaging_service_sid: Option<String>,
    date_created: Option<String>,
}

impl ListedMessage {
    /// Whether this is a message haul sent with `text` as `sender`, created at or after
    /// `earliest`. A trial account prefixes the text it sends, hence the suffix.
    fn is_ours(&self, text: &str, sender: &Sender, earliest: Timestamp) -> bool {
        let same_text = self.body.as_deref().is_some_and(|b| b.ends_with(text));
        let same_sender = match (&sender.messaging_service_sid, &sender.from) {
            (Some(service), _) => self.messaging_service_sid.as_deref() == Some(service),
            (None, Some(from)) => self.from.as_deref() == Some(from),
            (None, None) => false,
        };
        let parser = jiff::fmt::rfc2822::DateTimeParser::new();
        let created = self.date_created.as_deref().and_then(|d| parser.parse_timestamp(d).ok());
        same_text && same_sender && created.is_some_and(|c| c >= earliest)
    }
}

/// The query parameter of a status callback's URL naming the outbox row it reports on.
pub const STATUS_KEY_PARAM: &str = "key";

/// `url` with the row's key as its query: Twilio calls the URL as given and signs it
/// whole, so the key comes back with the message's status, vouched for by the
/// signature, even when the answer that carried the message's sid was lost.
pub fn status_callback(url: &str, key: &str) -> String {
    let query = serde_urlencoded::to_string([(STATUS_KEY_PARAM, key)]).unwrap_or_default();
    format!("{url}?{query}")
}

/// The SMS call's `to` and `body`.
fn sms_of(body: &Value) -> Result<(&str, &str), DeliveryError> {
    let field = |name: &str| {
        body.get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| PermanentDeliveryError(format!("the SMS has no {name} to send to Twilio")))
    };
    Ok((field("to")?, field("body")?))
}

#[async_trait]
impl ChannelClient for TwilioChannel {
    async fn send(
        &self,
        key: &str,
        _load_id: &LoadId,
        _path: &str,
        body: &Value,
        // Twilio is a third party: it is given no trace context.
        _trace: Option<TraceParent>,
        _now: Timestamp,
    ) -> Result<String, DeliveryError> {
        let (to, text) = sms_of(body)?;
        let validity = self.settings.validity.as_secs().to_string();
        let mut form = vec![("To", to), ("Body", text), ("ValidityPeriod", validity.as_str())];
        let sender = &self.settings.sender;
        if let Some(service) = &sender.messaging_service_sid {
            form.push(("MessagingServiceSid", service));
        }
        if let Some(from) = &sender.from {
            form.push(("From", from));
        }
        let callback = self.settings.status_callback.as_deref().map(|url| status_callback(url, key));
        if let Some(url) = &callback {
            form.push(("StatusCallback", url));
        }
        let req = self
            .client
            .post(&self.messages_url)
            .timeout(self.settings.timeout)
            .basic_auth(self.user(), Some(&self.settings.secret))
            .form(&form);
        let answer = self.call(req).await?;
        let sid = serde_json::from_slice::<Value>(&answer)
            .ok()
            .and_then(|v| v.get("sid").and_then(Value::as_str).map(str::to_owned));
        // Accepted but unreadable: the message exists, so a retry would text twice;
        // the receipt says what happened instead.
        Ok(sid.unwrap_or_else(|| "twilio-accepted-without-sid".into()))
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
        let (to, text) = sms_of(body)?;
        if let Some(sid) = self.find_sent(to, text, tried_since).await? {
            return Ok(sid);
        }
        self.send(key, load_id, path, body, trace, now).await
    }

    fn mode(&self) -> &'static str {
        "twilio"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twilio_refusals_map_to_the_dispatchers_classes() {
        let masker = Masker::new(["s3cret"]);
        let check = |status: u16, wait: Option<u64>, answer: &str, want: &str| {
            let got = classify(status, wait.map(Duration::from_secs), answer.as_bytes(), &masker);
            let class = match &got {
                DeliveryError::Retryable(_) => "retryable",
                DeliveryError::Permanent(_) => "permanent",
                DeliveryError::Throttled(_) => "throttled",
            };
            assert_eq!(format!("{class} {got}"), want, "{status} {answer}");
        };
        let unsubscribed = r#"{"code": 21610, "message": "Attempt to send to unsubscribed recipient", "status": 400}"#;
        check(
            400,
            None,
            unsubscribed,
            "permanent permanent: HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient",
        );
        let bad_to = r#"{"code": 21211, "message": "The 'To' number +15555550100 is not a valid phone number."}"#;
        check(
            400,
            None,
            bad_to,
            "permanent permanent: HTTP 400: twilio error 21211: The 'To' number ***0100 is not a valid phone number.",
        );
        let busy = r#"{"code": 20429, "message": "Too Many Requests"}"#;
        check(429, Some(3), busy, "throttled throttled for 3s: HTTP 429: twilio error 20429: Too Many Requests");
        check(429, None, busy, "retryable retryable: HTTP 429: twilio error 20429: Too Many Requests");
        check(400, None, busy, "retryable retryable: HTTP 400: twilio error 20429: Too Many Requests");
        check(503, None, "down", "retryable retryable: HTTP 503: down");
        check(408, None, "", "retryable retryable: HTTP 408: ");
        check(
            401,
            None,
            r#"{"code": 20003, "message": "Authenticate s3cret"}"#,
            "permanent permanent: HTTP 401: twilio error 20003: Authenticate ***",
        );
    }

    #[test]
    fn a_status_callback_names_its_row() {
        let url = "https://haul.example.com/v1/webhooks/twilio/status";
        assert_eq!(
            status_callback(url, "481207/ask:eta_request:ping_0700/1/send_sms"),
            "https://haul.example.com/v1/webhooks/twilio/status?key=481207%2Fask%3Aeta_request%3Aping_0700%2F1%2Fsend_sms"
        );
    }

    #[test]
    fn an_earlier_send_is_one_with_the_same_text_sender_and_time() {
        let earliest: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let by_number = Sender { from: Some("+15555550000".into()), messaging_service_sid: None };
        let by_service = Sender { from: None, messaging_service_sid: Some("MG1".into()) };
        let message = |body: &str, from: &str, service: Option<&str>, created: &str| ListedMessage {
            sid: "SM1".into(),
            body: Some(body.into()),
            from: Some(from.into()),
            messaging_service_sid: service.map(str::to_owned),
            date_created: Some(created.into()),
        };
        let at = "Mon, 02 Mar 2026 07:00:00 +0000";
        let check = |m: ListedMessage, sender: &Sender, want: bool| {
            assert_eq!(m.is_ours("ETA?", sender, earliest), want, "{:?} {:?}", m.body, m.date_created);
        };
        check(message("ETA?", "+15555550000", None, at), &by_number, true);
        check(message("Sent from your Twilio trial account - ETA?", "+15555550000", None, at), &by_number, true);
        check(message("ETA? later", "+15555550000", None, at), &by_number, false);
        check(message("ETA?", "+15555550001", None, at), &by_number, false);
        check(message("ETA?", "+15555550000", None, "Mon, 02 Mar 2026 06:59:59 +0000"), &by_number, false);
        check(message("ETA?", "+15555550000", None, "Mon, 02 Mar 2026 08:00:00 +0100"), &by_number, true);
        check(message("ETA?", "+15555550000", None, "yesterday"), &by_number, false);
        check(message("ETA?", "+15555550009", Some("MG1"), at), &by_service, true);
        check(message("ETA?", "+15555550000", Some("MG2"), at), &by_service, false);
        check(message("ETA?", "+15555550000", None, at), &Sender { from: None, messaging_service_sid: None }, false);
    }
}
