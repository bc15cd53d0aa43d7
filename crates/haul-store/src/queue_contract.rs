//! The `LoadQueue` half of the contract suite, written once for every queue: the
//! store-backed ones (SQLite, PostgreSQL) and SQS FIFO.
//!
//! The store-backed queues take `now` from the caller; SQS keeps its own clock. So
//! each case moves time through [`QueueUnderTest::pass`], which advances the suite's
//! clock and, for a queue on its own clock, also sleeps. Where SQS cannot give a
//! guarantee the store-backed queues give (it cannot report a duplicate publish,
//! reject a stale receipt, or remember a body), the difference is a named
//! [`Guarantees`] flag, so the suite says what each queue promises instead of
//! skipping a case.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, add};
use haul_core::trace::TraceParent;
use serde_json::json;

use crate::{LoadQueue, Published, QueueError, QueueMessage, Store};

/// Expands to one test per queue case. `$factory` is an async fn returning a
/// [`QueueUnderTest`] on a fresh, empty queue.
#[macro_export]
macro_rules! queue_contract_tests {
    ($factory:path) => {
        $crate::queue_contract_tests!(@cases $factory;
            queue_drops_duplicate_event_ids,
            queue_is_fifo_per_load,
            queue_holds_a_loads_next_message_while_one_is_in_flight,
            queue_lets_other_loads_through_meanwhile,
            queue_redelivers_after_the_visibility_timeout,
            queue_nack_delays_redelivery,
            queue_stale_receipt_is_rejected,
            queue_concurrent_receivers_never_hold_one_load_twice,
            queue_remembers_the_first_body_of_an_event_id,
            queue_keeps_the_publish_time_it_was_given,
            queue_keeps_a_messages_trace_context,
        );
    };
    (@cases $factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let queue = $factory().await;
                $crate::queue_contract::$case(queue).await;
            }
        )*
    };
}

/// What a queue promises beyond the trait's common core.
#[derive(Clone, Copy, Debug)]
pub struct Guarantees {
    /// `publish` says `Duplicate` for a repeated event id (SQS drops it silently).
    pub reports_duplicates: bool,
    /// A repeated event id is dropped after its first message was acked (SQS: within
    /// its five-minute window; moto forgets the id once the message is deleted).
    pub dedup_after_ack: bool,
    /// Deduplication outlasts SQS's five-minute window.
    pub dedup_past_five_minutes: bool,
    /// `ack`/`nack` with a receipt that is not the latest is `StaleReceipt` (SQS
    /// accepts an old receipt on delete, and deleting twice).
    pub rejects_stale_receipts: bool,
    /// `published_body` answers (SQS keeps no bodies).
    pub remembers_bodies: bool,
}

pub struct QueueUnderTest {
    pub queue: Arc<dyn LoadQueue>,
    /// `true`: the queue keeps its own clock (SQS), so time passes by sleeping.
    pub real_time: bool,
    pub guarantees: Guarantees,
    /// The visibility timeout the cases use: long on a given clock, short on a real one.
    pub visibility: Duration,
    elapsed: Mutex<Duration>,
}

impl QueueUnderTest {
    /// A store-backed queue: every guarantee, time given by the caller.
    pub fn store(store: Arc<dyn Store>) -> Self {
        QueueUnderTest {
            queue: store as Arc<dyn LoadQueue>,
            real_time: false,
            guarantees: Guarantees {
                reports_duplicates: true,
                dedup_after_ack: true,
                dedup_past_five_minutes: true,
                rejects_stale_receipts: true,
                remembers_bodies: true,
            },
            visibility: Duration::from_secs(30),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// A queue on its own clock (whole seconds, as SQS counts).
    pub fn real_time(queue: Arc<dyn LoadQueue>, guarantees: Guarantees) -> Self {
        QueueUnderTest {
            queue,
            real_time: true,
            guarantees,
            visibility: Duration::from_secs(2),
            elapsed: Mutex::new(Duration::ZERO),
        }
    }

    /// The suite's clock.
    pub fn now(&self) -> Timestamp {
        add(t0(), *self.elapsed.lock().unwrap())
    }

    /// Lets `d` pass: on the suite's clock and, for a real-time queue, on the wall.
    pub async fn pass(&self, d: Duration) {
        *self.elapsed.lock().unwrap() += d;
        if self.real_time {
            // A little over, so a boundary that has passed on the suite's clock has
            // passed at the queue too.
            tokio::time::sleep(d + Duration::from_millis(250)).await;
        }
    }

    async fn publish(&self, l: &str, event: &str) -> Published {
        self.queue.publish(&load(l), event, &json!({"event_id": event}).to_string(), self.now()).await.unwrap()
    }

    async fn receive(&self) -> Vec<(String, String)> {
        self.queue
            .receive(10, self.visibility, self.now())
            .await
            .unwrap()
            .into_iter()
            .map(|m| (m.load_id.to_string(), m.event_id))
            .collect()
    }

    async fn receive_one(&self) -> QueueMessage {
        let mut got = self.queue.receive(1, self.visibility, self.now()).await.unwrap();
        assert_eq!(got.len(), 1, "expected one message");
        got.remove(0)
    }

    async fn ack(&self, m: &QueueMessage) {
        self.queue.ack(&m.receipt, self.now()).await.unwrap();
    }

    async fn depth(&self) -> u64 {
        self.queue.depth().await.unwrap()
    }
}

fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

fn load(s: &str) -> LoadId {
    LoadId::parse(s).unwrap()
}

fn pair(l: &str, e: &str) -> (String, String) {
    (l.into(), e.into())
}

const SECOND: Duration = Duration::from_secs(1);

pub async fn queue_drops_duplicate_event_ids(q: QueueUnderTest) {
    let first = q.publish("L1", "e1").await;
    let again = q.publish("L1", "e1").await;
    let other_load = q.publish("L2", "e1").await;
    if q.guarantees.reports_duplicates {
        assert_eq!((first, again, other_load), (Published::New, Published::Duplicate, Published::New));
    }
    assert_eq!(q.depth().await, 2, "the repeat is dropped; dedup is per load");
    let m = q.receive_one().await;
    assert_eq!((m.load_id.as_str(), m.event_id.as_str()), ("L1", "e1"));
    q.ack(&m).await;
    if !q.guarantees.dedup_after_ack {
        return;
    }
    // Acked, and still a duplicate inside the window.
    q.publish("L1", "e1").await;
    assert_eq!(q.receive().await, vec![pair("L2", "e1")]);
    if q.guarantees.dedup_past_five_minutes {
        q.pass(Duration::from_secs(600)).await;
        assert_eq!(q.publish("L1", "e1").await, Published::Duplicate, "well past SQS's five minutes");
        assert_eq!(q.depth().await, 1, "only L2's message, in flight");
    }
}

pub async fn queue_is_fifo_per_load(q: QueueUnderTest) {
    for e in ["e1", "e2", "e3"] {
        q.publish("L1", e).await;
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = q.receive_one().await;
        assert_eq!(m.receive_count, 1);
        got.push(m.event_id.clone());
        q.ack(&m).await;
    }
    assert_eq!(got, vec!["e1", "e2", "e3"]);
    assert!(q.receive().await.is_empty());
    assert_eq!(q.depth().await, 0);
}

pub async fn queue_holds_a_loads_next_message_while_one_is_in_flight(q: QueueUnderTest) {
    q.publish("L1", "e1").await;
    q.publish("L1", "e2").await;
    assert_eq!(q.receive().await, vec![pair("L1", "e1")], "one message per load per receive");
    q.pass(SECOND).await;
    assert!(q.receive().await.is_empty(), "e2 waits while e1 is in flight");
}

pub async fn queue_lets_other_loads_through_meanwhile(q: QueueUnderTest) {
    q.publish("L1", "a1").await;
    q.publish("L1", "a2").await;
    q.publish("L2", "b1").await;
    let first = q.receive_one().await;
    assert_eq!(first.event_id, "a1");
    assert_eq!(q.receive().await, vec![pair("L2", "b1")]);
    q.ack(&first).await;
    assert_eq!(q.receive().await, vec![pair("L1", "a2")]);
}

pub async fn queue_redelivers_after_the_visibility_timeout(q: QueueUnderTest) {
    q.publish("L1", "e1").await;
    q.publish("L1", "e2").await;
    let m1 = q.receive_one().await;
    q.pass(q.visibility - SECOND).await;
    assert!(q.receive().await.is_empty(), "still invisible a second before the timeout");
    q.pass(SECOND).await;
    let again = q.receive_one().await;
    assert_eq!((again.event_id.as_str(), again.receive_count), ("e1", 2), "the same message, FIFO kept");
    assert_ne!(again.receipt, m1.receipt);
    q.ack(&again).await;
    assert_eq!(q.receive().await, vec![pair("L1", "e2")]);
}

pub async fn queue_nack_delays_redelivery(q: QueueUnderTest) {
    let delay = if q.real_time { 2 * SECOND } else { 5 * SECOND };
    q.publish("L1", "e1").await;
    q.publish("L1", "e2").await;
    let m = q.receive_one().await;
    q.queue.nack(&m.receipt, delay, q.now()).await.unwrap();
    q.pass(delay - SECOND).await;
    assert!(q.receive().await.is_empty(), "nacked head keeps the load waiting");
    q.pass(SECOND).await;
    let again = q.receive_one().await;
    assert_eq!(again.event_id, "e1");
    if q.guarantees.rejects_stale_receipts {
        assert!(
            matches!(q.queue.ack(&m.receipt, q.now()).await, Err(QueueError::StaleReceipt(_))),
            "the nacked receipt is spent"
        );
    }
    q.ack(&again).await;
    assert_eq!(q.receive().await, vec![pair("L1", "e2")]);
}

pub async fn queue_stale_receipt_is_rejected(q: QueueUnderTest) {
    q.publish("L1", "e1").await;
    assert!(
        matches!(q.queue.ack("garbage", q.now()).await, Err(QueueError::StaleReceipt(_))),
        "a receipt never issued"
    );
    assert!(matches!(q.queue.nack("garbage", SECOND, q.now()).await, Err(QueueError::StaleReceipt(_))));
    assert_eq!(q.depth().await, 1, "a bad receipt removes nothing");
    if !q.guarantees.rejects_stale_receipts {
        return;
    }
    let m1 = q.receive_one().await;
    q.pass(q.visibility).await;
    let m2 = q.receive_one().await;
    assert!(matches!(q.queue.ack(&m1.receipt, q.now()).await, Err(QueueError::StaleReceipt(_))));
    assert_eq!(q.depth().await, 1, "a stale ack removes nothing");
    q.ack(&m2).await;
    assert!(matches!(q.queue.ack(&m2.receipt, q.now()).await, Err(QueueError::StaleReceipt(_))), "acked once");
    assert_eq!(q.depth().await, 0);
}

pub async fn queue_concurrent_receivers_never_hold_one_load_twice(q: QueueUnderTest) {
    let q = Arc::new(q);
    let loads = 6;
    let per_load = 5;
    for i in 0..per_load {
        for l in 0..loads {
            q.publish(&format!("L{l}"), &format!("e{i}")).await;
        }
    }
    let in_flight = Arc::new(Mutex::new(BTreeSet::<String>::new()));
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let receivers = 4;
    let barrier = Arc::new(tokio::sync::Barrier::new(receivers));
    let mut tasks = Vec::new();
    for _ in 0..receivers {
        let (q, in_flight, seen, barrier) = (q.clone(), in_flight.clone(), seen.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut idle = 0;
            while idle < 50 {
                let got = q.queue.receive(3, Duration::from_secs(600), q.now()).await.unwrap();
                if got.is_empty() {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                }
                idle = 0;
                for m in got {
                    assert!(
                        in_flight.lock().unwrap().insert(m.load_id.to_string()),
                        "load {} received twice at once",
                        m.load_id
                    );
                    seen.lock().unwrap().push((m.load_id.to_string(), m.event_id.clone()));
                    tokio::task::yield_now().await;
                    in_flight.lock().unwrap().remove(m.load_id.as_str());
                    q.ack(&m).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), loads * per_load, "every message delivered once");
    for l in 0..loads {
        let order: Vec<&str> = seen.iter().filter(|(ll, _)| *ll == format!("L{l}")).map(|(_, e)| e.as_str()).collect();
        assert_eq!(order, (0..per_load).map(|i| format!("e{i}")).collect::<Vec<_>>(), "FIFO for L{l}");
    }
}

pub async fn queue_remembers_the_first_body_of_an_event_id(q: QueueUnderTest) {
    let now = q.now();
    q.queue.publish(&load("L1"), "e1", "{\"v\":1}", now).await.unwrap();
    q.queue.publish(&load("L1"), "e1", "{\"v\":2}", now).await.unwrap();
    let first = q.queue.published_body(&load("L1"), "e1").await.unwrap();
    if q.guarantees.remembers_bodies {
        assert_eq!(first.as_deref(), Some("{\"v\":1}"));
    } else {
        assert_eq!(first, None, "a queue that keeps no bodies says None, never a guess");
    }
    assert_eq!(q.queue.published_body(&load("L1"), "e2").await.unwrap(), None);
    assert_eq!(q.queue.published_body(&load("L2"), "e1").await.unwrap(), None);
    // Whatever it remembers, what it delivers is the first body.
    assert_eq!(q.receive_one().await.body, "{\"v\":1}");
}

pub async fn queue_keeps_the_publish_time_it_was_given(q: QueueUnderTest) {
    // A publish time with milliseconds, before the receive.
    let at = haul_core::time::from_ms(haul_core::time::to_ms(q.now()) - 1234);
    q.queue.publish(&load("L1"), "e1", "{}", at).await.unwrap();
    let m = q.receive_one().await;
    assert_eq!((m.load_id.as_str(), m.event_id.as_str(), m.enqueued_at), ("L1", "e1", at));
}

/// The context a message was published with comes back with it, and a message
/// published without one has none.
pub async fn queue_keeps_a_messages_trace_context(q: QueueUnderTest) {
    let ctx = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    q.queue.publish_traced(&load("L1"), "e1", "{}", Some(ctx), q.now()).await.unwrap();
    q.queue.publish(&load("L1"), "e2", "{}", q.now()).await.unwrap();
    let m = q.receive_one().await;
    assert_eq!((m.event_id.as_str(), m.trace), ("e1", Some(ctx)));
    q.ack(&m).await;
    let m = q.receive_one().await;
    assert_eq!((m.event_id.as_str(), m.trace), ("e2", None));
}
