//! The load queue as the runtime sees it: typed events in, typed events out.
//!
//! `LoadQueue` stores strings, so the store queues and SQS carry the same bytes and
//! keep no schema. The worker, the dispatcher, the pump and the API speak
//! `InboundEvent`: `EventQueue` writes the JSON form on publish and parses each
//! message once on receive, so a message that is not an event of its load is known as
//! poison from the moment it arrives, and nobody parses it a second time.

use std::sync::Arc;
use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::time::Timestamp;
use haul_core::trace::TraceParent;
use haul_core::{EventId, InboundEvent};
use haul_store::{LoadQueue, Published, QueueError, QueueMessage, StoreError};

/// The queue's body for an event: `{event_id, kind, ...payload}` as JSON.
pub fn body_of(event: &InboundEvent) -> String {
    event.to_json().to_string()
}

/// Why a message is not an event of its load. Only a bug upstream makes one: every
/// publisher goes through [`EventQueue::publish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poison(pub String);

/// A received message, its event parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Received {
    pub load_id: LoadId,
    /// The id the queue filed the message under.
    pub event_id: String,
    /// The receipt to ack or nack with; only the latest receive's is good.
    pub receipt: String,
    /// 1 on the first delivery.
    pub receive_count: u32,
    pub enqueued_at: Timestamp,
    /// The load's log version as the queue saw it (`QueueMessage::log_version`).
    pub log_version: Option<u64>,
    /// The context the message was published with (`QueueMessage::trace`).
    pub trace: Option<TraceParent>,
    pub event: Result<InboundEvent, Poison>,
}

impl Received {
    /// Parses a message's body: an event of its load, under the id it was filed as.
    pub fn parse(m: QueueMessage) -> Self {
        let event = serde_json::from_str(&m.body)
            .map_err(|e| Poison(e.to_string()))
            .and_then(|v| InboundEvent::from_json(m.load_id.clone(), v).map_err(|e| Poison(e.message)))
            .and_then(|e| match e.event_id.as_str() == m.event_id {
                true => Ok(e),
                false => Err(Poison(format!("message id {} carries event {}", m.event_id, e.event_id))),
            });
        Received {
            load_id: m.load_id,
            event_id: m.event_id,
            receipt: m.receipt,
            receive_count: m.receive_count,
            enqueued_at: m.enqueued_at,
            log_version: m.log_version,
            trace: m.trace,
            event,
        }
    }

    /// A message as the queue would hand `event` out under `receipt` (tests and the
    /// simulator deliver one twice this way).
    pub fn of_event(event: InboundEvent, receipt: &str, now: Timestamp) -> Self {
        Received {
            load_id: event.load_id.clone(),
            event_id: event.event_id.to_string(),
            receipt: receipt.to_owned(),
            receive_count: 1,
            enqueued_at: now,
            log_version: None,
            trace: None,
            event: Ok(event),
        }
    }
}

impl From<QueueMessage> for Received {
    fn from(m: QueueMessage) -> Self {
        Received::parse(m)
    }
}

/// How a publisher hands what it publishes to the worker of its own process
/// (`LoadQueue::publish_receiving`): room in the worker's channel is reserved before
/// the publish, so a message received is a message handed over. Between the publish
/// and the run there is then no receive (a statement and a commit) and no wake-up. A
/// message received but never run (the process died first) is redelivered when its
/// visibility timeout lapses, as a received message is. The channel holds as many
/// messages as the worker runs at once: a publisher that finds no room publishes the
/// usual way, so a busy worker is not handed more than one round of runs ahead, which
/// would keep those messages from any other process's worker.
#[derive(Clone)]
pub struct EventHandoff {
    pub(crate) to: tokio::sync::mpsc::Sender<Received>,
    pub(crate) visibility: Duration,
}

impl EventHandoff {
    /// A handoff of messages leased for `visibility`, at most `waiting` of them not yet
    /// taken by the worker loop, and the loop's end of it.
    pub fn new(visibility: Duration, waiting: usize) -> (Self, tokio::sync::mpsc::Receiver<Received>) {
        let (to, from) = tokio::sync::mpsc::channel(waiting.max(1));
        (EventHandoff { to, visibility }, from)
    }
}

/// A `LoadQueue` that takes and gives `InboundEvent`s.
#[derive(Clone)]
pub struct EventQueue {
    inner: Arc<dyn LoadQueue>,
    /// Where `publish_handing` hands what it receives: this process's worker.
    handoff: Option<EventHandoff>,
}

impl EventQueue {
    pub fn new(inner: Arc<dyn LoadQueue>) -> Self {
        EventQueue { inner, handoff: None }
    }

    /// This queue, its `publish_handing` handing messages to a worker of this process.
    pub fn handing_to(self, handoff: EventHandoff) -> Self {
        EventQueue { handoff: Some(handoff), ..self }
    }

    /// The queue's `messaging.system` (`LoadQueue::system`).
    pub fn system(&self) -> &'static str {
        self.inner.system()
    }

    /// `LoadQueue::short_receive_drains`.
    pub fn short_receive_drains(&self) -> bool {
        self.inner.short_receive_drains()
    }

    pub async fn publish(&self, event: &InboundEvent, now: Timestamp) -> Result<Published, StoreError> {
        self.publish_traced(event, None, now).await
    }

    /// `publish`, the message carrying `trace`: the context its run continues.
    pub async fn publish_traced(
        &self,
        event: &InboundEvent,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        self.inner.publish_traced(&event.load_id, event.event_id.as_str(), &body_of(event), trace, now).await
    }

    /// `publish_traced`; with a handoff (`handing_to`) and room in it, the message is
    /// received in the publish's transaction when its load's head takes it at once
    /// (`LoadQueue::publish_receiving`) and handed to the worker. True when handed:
    /// nobody needs waking for it.
    pub async fn publish_handing(
        &self,
        event: &InboundEvent,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<(Published, bool), StoreError> {
        let Some((handoff, room)) = self.handoff.as_ref().and_then(|h| Some((h, h.to.try_reserve().ok()?))) else {
            return Ok((self.publish_traced(event, trace, now).await?, false));
        };
        let (load, event_id, body) = (&event.load_id, event.event_id.as_str(), body_of(event));
        let (published, received) =
            self.inner.publish_receiving(load, event_id, &body, trace, handoff.visibility, now).await?;
        let handed = received.is_some();
        if let Some(m) = received {
            metrics::counter!("haul_messages_handed_over_total").increment(1);
            room.send(Received::parse(m));
        }
        Ok((published, handed))
    }

    pub async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<Received>, StoreError> {
        Ok(self.inner.receive(max, visibility, now).await?.into_iter().map(Received::parse).collect())
    }

    pub async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        self.inner.ack(receipt, now).await
    }

    pub async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        self.inner.nack(receipt, delay, now).await
    }

    pub async fn depth(&self) -> Result<u64, StoreError> {
        self.inner.depth().await
    }

    /// The event first published under this id, while the queue remembers it and it
    /// reads as an event (`None` otherwise; SQS never remembers).
    pub async fn published_event(
        &self,
        load_id: &LoadId,
        event_id: &EventId,
    ) -> Result<Option<InboundEvent>, StoreError> {
        let body = self.inner.published_body(load_id, event_id.as_str()).await?;
        Ok(body
            .and_then(|b| serde_json::from_str(&b).ok())
            .and_then(|v| InboundEvent::from_json(load_id.clone(), v).ok()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(body: &str) -> QueueMessage {
        QueueMessage {
            load_id: LoadId::parse("481207").unwrap(),
            event_id: "p1".into(),
            body: body.into(),
            enqueued_at: "2026-03-02T07:00:00Z".parse().unwrap(),
            receipt: "1.a".into(),
            receive_count: 1,
            log_version: None,
            trace: None,
        }
    }

    fn check(body: &str, expected: Result<&str, &str>) {
        let got = Received::parse(message(body)).event.map(|e| e.kind()).map_err(|p| p.0);
        match (&got, expected) {
            (Ok(kind), Ok(want)) => assert_eq!(*kind, want),
            (Err(why), Err(want)) => assert!(why.contains(want), "{body}: {why} lacks {want:?}"),
            _ => panic!("{body}: got {got:?}, want {expected:?}"),
        }
    }

    #[test]
    fn messages_parse_once_into_events_or_poison() {
        let ping = json!({"event_id": "p1", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"});
        check(&ping.to_string(), Ok("location_ping"));
        check("{not json", Err("key must be a string"));
        check(r#"{"event_id": "p1", "kind": "teleport"}"#, Err("unknown event kind"));
        let other = json!({"event_id": "p2", "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"});
        check(&other.to_string(), Err("message id p1 carries event p2"));
    }
}
