//! The load queue on SQS FIFO: production's queue when the log lives in PostgreSQL.
//!
//! One message group per load gives SQS's own guarantee the worker needs: a group's
//! next message is not handed out while one is in flight. The deduplication id is
//! derived from `(load, event id)`, so a republished event is dropped inside SQS's
//! five-minute window (the log's `DuplicateEntry` catches it after that).
//!
//! Where SQS cannot give what the store-backed queues give, this adapter says so
//! rather than pretending (docs/internals.md, "SQS FIFO"): it cannot tell a duplicate
//! publish from a new one, cannot reject a stale receipt on ack, keeps no bodies and
//! keeps its own clock for visibility (the `now` callers pass is recorded, not obeyed).

pub mod emulator;

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, from_ms, to_ms};
use haul_core::trace::TraceParent;
use haul_store::{LoadQueue, Published, QueueError, QueueMessage, StoreError};
use sha2::{Digest, Sha256};

/// Message attributes carrying what the body does not: the load and the publish time
/// on the caller's clock (SQS's `SentTimestamp` is wall time, which evals do not use).
const ATTR_LOAD: &str = "haul_load_id";
const ATTR_EVENT: &str = "haul_event_id";
const ATTR_ENQUEUED_AT: &str = "haul_enqueued_at_ms";
/// The producer's W3C trace context, under the name the OpenTelemetry messaging
/// conventions give it for SQS message attributes.
const ATTR_TRACEPARENT: &str = "traceparent";

/// SQS takes at most 10 per call; receives of one message each keep one message per
/// group in flight (a batch can hold a group's next message too), so `max` above this
/// is capped.
pub const MAX_RECEIVE: usize = 10;

/// SQS's limit on a message body (256 KiB); the API's own limit is far below it.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The longest visibility SQS allows (12 hours).
const MAX_VISIBILITY_S: u64 = 12 * 60 * 60;

/// Where the queue is and how to reach it.
#[derive(Clone, Debug, Default)]
pub struct SqsSettings {
    /// The FIFO queue's URL (ends in `.fifo`).
    pub queue_url: String,
    /// An endpoint other than AWS's (a local emulator); `None` for AWS itself.
    pub endpoint: Option<String>,
    /// `None`: the SDK's default chain (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// Static credentials; `None`: the SDK's default chain (environment, profile, the
    /// instance role). Tests always pass these so the SDK never probes the network.
    pub static_credentials: Option<(String, String)>,
}

pub struct SqsQueue {
    client: Client,
    queue_url: String,
}

impl SqsQueue {
    /// A client for the queue; makes no call (use [`SqsQueue::check`] to see it answers).
    pub async fn connect(settings: &SqsSettings) -> Self {
        SqsQueue { client: client(settings).await, queue_url: settings.queue_url.clone() }
    }

    /// Creates (or finds) a FIFO queue by name and returns a queue on it.
    pub async fn create(settings: &SqsSettings, name: &str) -> Result<Self, StoreError> {
        if !name.ends_with(".fifo") {
            return Err(StoreError::new(format!("SQS FIFO queue names end in .fifo, not {name:?}")));
        }
        let client = client(settings).await;
        let out = client
            .create_queue()
            .queue_name(name)
            .attributes(QueueAttributeName::FifoQueue, "true")
            .send()
            .await
            .map_err(|e| sqs_error(name, "create_queue", e))?;
        let queue_url = out.queue_url.ok_or_else(|| StoreError::new("create_queue answered without a URL"))?;
        Ok(SqsQueue { client, queue_url })
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// One call that proves the queue exists and the credentials work.
    pub async fn check(&self) -> Result<(), StoreError> {
        self.depth().await.map(|_| ())
    }

    pub async fn delete_queue(&self) -> Result<(), StoreError> {
        self.client
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sqs_error(&self.queue_url, "delete_queue", e))
    }

    async fn receive_one(&self, visibility_s: i32) -> Result<Option<QueueMessage>, StoreError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(1)
            .visibility_timeout(visibility_s)
            .wait_time_seconds(0)
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_attribute_names("All")
            .send()
            .await
            .map_err(|e| sqs_error(&self.queue_url, "receive_message", e))?;
        let Some(m) = out.messages.unwrap_or_default().into_iter().next() else {
            return Ok(None);
        };
        let attr =
            |name: &str| m.message_attributes.as_ref().and_then(|a| a.get(name)).and_then(|v| v.string_value.clone());
        let receipt =
            m.receipt_handle.clone().ok_or_else(|| StoreError::new("SQS message without a receipt handle"))?;
        let (Some(load), Some(event_id), Some(enqueued_ms)) =
            (attr(ATTR_LOAD), attr(ATTR_EVENT), attr(ATTR_ENQUEUED_AT))
        else {
            // Not ours (published by something else): give it a clear error rather than
            // a guessed load; it stays on the queue for an operator (or a dead-letter queue).
            return Err(StoreError::new(format!(
                "SQS message {} lacks haul's attributes; not a haul message",
                m.message_id.as_deref().unwrap_or("?")
            )));
        };
        let load_id = LoadId::parse(&load).map_err(|e| StoreError::new(format!("SQS message load id: {e}")))?;
        let enqueued_at = enqueued_ms
            .parse::<i64>()
            .map(from_ms)
            .map_err(|_| StoreError::new(format!("SQS message enqueued_at {enqueued_ms:?} is not epoch ms")))?;
        let receive_count = m
            .attributes
            .as_ref()
            .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
            .and_then(|c| c.parse().ok())
            .unwrap_or(1);
        Ok(Some(QueueMessage {
            load_id,
            event_id,
            body: m.body.unwrap_or_default(),
            enqueued_at,
            receipt,
            receive_count,
            log_version: None,
            // A context that does not read is none: the run starts a trace of its own.
            trace: attr(ATTR_TRACEPARENT).as_deref().and_then(TraceParent::parse),
        }))
    }
}

async fn client(settings: &SqsSettings) -> Client {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    if let Some(region) = &settings.region {
        loader = loader.region(Region::new(region.clone()));
    }
    if let Some(endpoint) = &settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    // Bounded calls: a hung SQS call must not hold a worker past its run.
    loader = loader.timeout_config(
        aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .operation_attempt_timeout(Duration::from_secs(10))
            .operation_timeout(Duration::from_secs(30))
            .build(),
    );
    if let Some((key, secret)) = &settings.static_credentials {
        loader = loader.credentials_provider(Credentials::new(key, secret, None, None, "haul-static"));
    }
    Client::new(&loader.load().await)
}

/// `(load, event)` as a deduplication id: readable when it fits SQS's rules (128
/// characters of ASCII letters, digits and punctuation), a SHA-256 otherwise.
pub fn deduplication_id(load_id: &LoadId, event_id: &str) -> String {
    let readable = format!("{}|{}", load_id.as_str(), event_id);
    if readable.len() <= 128 && readable.bytes().all(|b| b.is_ascii_graphic()) {
        return readable;
    }
    let digest = Sha256::digest(readable.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn seconds(d: Duration) -> i32 {
    // SQS counts whole seconds; round up so a message is never visible early.
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.min(MAX_VISIBILITY_S) as i32
}

/// A failed SQS call in one line: the queue, the call, and the reason as SQS put it
/// (`AWS.SimpleQueueService.NonExistentQueue: The specified queue does not exist`) or
/// the root cause of a call that never reached it (`Connection refused`), instead of
/// the SDK's Debug text (hundreds of characters of nested structs).
fn sqs_error<E, R>(queue: &str, op: &str, e: SdkError<E, R>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    let reason = match &e {
        SdkError::ServiceError(s) => match (s.err().code(), s.err().message()) {
            (Some(code), Some(message)) => format!("{code}: {message}"),
            (Some(code), None) => code.to_owned(),
            _ => causes(&e),
        },
        SdkError::TimeoutError(_) => "timed out".to_owned(),
        _ => causes(&e),
    };
    let reason: String = reason.replace(['\n', '\r'], " ").chars().take(MAX_REASON_CHARS).collect();
    StoreError::new(format!("SQS queue {queue}: {op}: {reason}"))
}

/// Longest reason an SQS error quotes.
const MAX_REASON_CHARS: usize = 300;

/// An error and its causes, each said once, down to the root (the OS's reason).
fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

fn string_attr(v: &str) -> MessageAttributeValue {
    // Built from fixed fields: both are set, so the builder cannot fail.
    MessageAttributeValue::builder().data_type("String").string_value(v).build().expect("data_type is set")
}

#[async_trait]
impl LoadQueue for SqsQueue {
    fn system(&self) -> &'static str {
        "aws_sqs"
    }

    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(StoreError::new(format!(
                "message body of {} bytes is over SQS's {MAX_BODY_BYTES}",
                body.len()
            )));
        }
        let send = match trace {
            Some(t) => self.client.send_message().message_attributes(ATTR_TRACEPARENT, string_attr(&t.to_string())),
            None => self.client.send_message(),
        };
        send.queue_url(&self.queue_url)
            .message_body(body)
            .message_group_id(load_id.as_str())
            .message_deduplication_id(deduplication_id(load_id, event_id))
            .message_attributes(ATTR_LOAD, string_attr(load_id.as_str()))
            .message_attributes(ATTR_EVENT, string_attr(event_id))
            .message_attributes(ATTR_ENQUEUED_AT, string_attr(&to_ms(now).to_string()))
            .send()
            .await
            .map_err(|e| sqs_error(&self.queue_url, "send_message", e))?;
        // SQS accepts a duplicate as if it were new (and drops it): it cannot say which.
        Ok(Published::New)
    }

    async fn receive(
        &self,
        max: usize,
        visibility: Duration,
        _now: Timestamp,
    ) -> Result<Vec<QueueMessage>, StoreError> {
        let visibility_s = seconds(visibility);
        let mut got = Vec::new();
        // One message per call: SQS hands out a group's later messages in the same
        // batch, and the worker needs at most one per load in flight.
        for _ in 0..max.min(MAX_RECEIVE) {
            match self.receive_one(visibility_s).await? {
                Some(m) => got.push(m),
                None => break,
            }
        }
        Ok(got)
    }

    async fn ack(&self, receipt: &str, _now: Timestamp) -> Result<(), QueueError> {
        match self.client.delete_message().queue_url(&self.queue_url).receipt_handle(receipt).send().await {
            Ok(_) => Ok(()),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_receipt_handle_is_invalid()) => {
                Err(QueueError::StaleReceipt(receipt.chars().take(32).collect()))
            }
            Err(e) => Err(sqs_error(&self.queue_url, "delete_message", e).into()),
        }
    }

    async fn nack(&self, receipt: &str, delay: Duration, _now: Timestamp) -> Result<(), QueueError> {
        match self
            .client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(seconds(delay))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|s| s.is_receipt_handle_is_invalid() || s.is_message_not_inflight()) =>
            {
                Err(QueueError::StaleReceipt(receipt.chars().take(32).collect()))
            }
            Err(e) => Err(sqs_error(&self.queue_url, "change_message_visibility", e).into()),
        }
    }

    async fn depth(&self) -> Result<u64, StoreError> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .send()
            .await
            .map_err(|e| sqs_error(&self.queue_url, "get_queue_attributes", e))?;
        let attrs = out.attributes.unwrap_or_default();
        Ok(attrs.values().filter_map(|v| v.parse::<u64>().ok()).sum())
    }

    async fn published_body(&self, _load_id: &LoadId, _event_id: &str) -> Result<Option<String>, StoreError> {
        Ok(None)
    }
}
