//! A pipeline on a fake clock with the fake services over real HTTP, on SQLite or
//! PostgreSQL, for the tests named after ADR 0003's cases.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use haul_config::Config;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, Record, project};
use haul_core::time::{Timestamp, add};
use haul_core::{Channel, Clock, FakeClock, InboundEvent, QueueMode};
use haul_harness::testkit::{FakeServices, FlakyQueue};
use haul_runtime::channels::{ChannelClient, Channels};
use haul_runtime::decider::Decider;
use haul_runtime::dispatcher::{Dispatcher, DispatcherSettings};
use haul_runtime::faults::Faults;
use haul_runtime::pipeline::{Parts, Pipeline, Round};
use haul_runtime::queue::Received;
use haul_store::{LoadQueue, OutboxRow, Store};
use serde_json::{Value, json};

pub const LOAD: &str = "481207";
pub const DRIVER: &str = "+15555550100";
pub const SMS1: &str = "481207/ask:eta_request:ping_0700/1/send_sms";

pub fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

pub fn init() -> Value {
    json!({"event_id": "load:init", "kind": "load_update", "client": "client_a", "driver_phone": DRIVER, "stage": "in_transit"})
}

pub fn ping(id: &str) -> Value {
    json!({"event_id": id, "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high"})
}

pub fn sms(id: &str, from: &str, body: &str) -> Value {
    json!({"event_id": id, "kind": "inbound_sms", "from": from, "body": body})
}

pub async fn sqlite() -> Arc<dyn Store> {
    haul_backends::open("sqlite::memory:", Some(7)).await.unwrap()
}

pub async fn postgres() -> Arc<dyn Store> {
    postgres_in_schema().await.0
}

/// A migrated store in a new schema of its own, and the schema's name.
pub async fn postgres_in_schema() -> (Arc<dyn Store>, String) {
    let options = haul_postgres::testing::FreshStore { seed: Some(7), ..Default::default() };
    let (store, schema) = haul_postgres::testing::fresh_store(&options)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for these tests ({}): {e}", options.url));
    (Arc::new(store), schema)
}

/// Runs each named case on SQLite and on PostgreSQL.
#[macro_export]
#[allow(clippy::crate_in_macro_def)] // `crate` is the test binary that includes `common`
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(crate::common::sqlite().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(crate::common::postgres().await).await;
                }
            )*
        }
    };
}

pub struct H {
    pub store: Arc<dyn Store>,
    pub queue: Arc<FlakyQueue>,
    pub clock: Arc<FakeClock>,
    pub svc: FakeServices,
    pub channels: Channels,
    pub config: Config,
    pub pipeline: Pipeline,
    pub load: LoadId,
}

pub async fn harness(store: Arc<dyn Store>, config: Config, faults: Faults, decider: Option<Arc<dyn Decider>>) -> H {
    let clock = Arc::new(FakeClock::new(t0()));
    harness_on(store, config, faults, decider, clock, None).await
}

/// As [`harness`], on `clock`, with `sms` (a Twilio channel on its double) instead of
/// the fake services' SMS channel when given.
pub async fn harness_on(
    store: Arc<dyn Store>,
    config: Config,
    faults: Faults,
    decider: Option<Arc<dyn Decider>>,
    clock: Arc<FakeClock>,
    sms: Option<Arc<dyn ChannelClient>>,
) -> H {
    let svc = FakeServices::start(Some("svc-token".into())).await.unwrap();
    let channels = svc.channels(Some("svc-token".into()), Duration::from_secs(5)).unwrap();
    let channels = match sms {
        None => channels,
        Some(sms) => {
            Channels::build(|c| Ok(if c == Channel::Sms { sms.clone() } else { channels.get(c).clone() })).unwrap()
        }
    };
    let queue = Arc::new(FlakyQueue::new(store.clone() as Arc<dyn LoadQueue>));
    let parts = Parts {
        store: store.clone(),
        queue: queue.clone(),
        // A FlakyQueue over the store: another object, so acks and publishes are steps of their own.
        queue_mode: QueueMode::Separate,
        channels: channels.clone(),
        clock: clock.clone(),
        faults,
        seed: Some(11),
    };
    let pipeline = Pipeline::new(&config, parts, decider);
    H { store, queue, clock, svc, channels, config, pipeline, load: LoadId::parse(LOAD).unwrap() }
}

impl H {
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    pub fn set(&self, t: Timestamp) {
        self.clock.set(t);
    }

    pub fn at_min(&self, minutes: u64) -> Timestamp {
        add(t0(), Duration::from_secs(minutes * 60))
    }

    pub async fn publish(&self, event: Value) {
        let ev = InboundEvent::from_json(self.load.clone(), event).unwrap();
        self.queue.publish(&self.load, ev.event_id.as_str(), &ev.to_json().to_string(), self.now()).await.unwrap();
    }

    pub async fn settle(&self) -> Vec<Round> {
        self.pipeline.run_until_quiet().await.unwrap()
    }

    pub async fn log(&self) -> Vec<Record> {
        self.store.read(&self.load).await.unwrap().0
    }

    pub async fn state(&self) -> LoadState {
        project(&self.log().await)
    }

    pub async fn entries(&self, entry_id: &str) -> usize {
        self.log().await.iter().filter(|r| r.entry_id == entry_id).count()
    }

    pub async fn decision(&self, event_id: &str) -> Value {
        let id = format!("dec:{event_id}");
        self.log()
            .await
            .into_iter()
            .find(|r| r.entry_id == id)
            .unwrap_or_else(|| panic!("no decision for {event_id}"))
            .payload()
    }

    pub async fn row(&self, id: &str) -> OutboxRow {
        self.store.get(id).await.unwrap().unwrap_or_else(|| panic!("no outbox row {id}"))
    }

    /// Another worker on the same store and queue, with the SOP decider and a snapshot
    /// cache of its own (another process).
    pub fn second_worker(&self) -> haul_runtime::worker::Worker {
        haul_runtime::worker::Worker::new(
            self.store.clone(),
            self.queue.clone(),
            QueueMode::Separate,
            Arc::new(haul_runtime::decider::SopDecider { policies: haul_core::sop::Policies::default() }),
            self.clock.clone(),
            haul_runtime::worker::WorkerSettings::default(),
            Faults::default(),
        )
    }

    /// Another dispatcher on the same store and services (another process).
    pub fn second_dispatcher(&self, seed: u64) -> Arc<Dispatcher> {
        Arc::new(Dispatcher::new(
            self.store.clone(),
            self.queue.clone(),
            QueueMode::Separate,
            self.channels.clone(),
            self.clock.clone(),
            DispatcherSettings { jitter_seed: Some(seed), ..DispatcherSettings::from_config(&self.config.dispatcher) },
            Faults::default(),
        ))
    }

    /// A message as the queue would hand it out, for delivering one twice.
    pub fn message(&self, event: Value) -> Received {
        let ev = InboundEvent::from_json(self.load.clone(), event).unwrap();
        Received::of_event(ev, "0.not-from-the-queue", self.now())
    }
}

/// A fault hook that crashes at `point` for `context` the first `times` times.
pub fn crash_at(point: haul_runtime::faults::FaultPoint, context: &str, times: usize) -> Faults {
    let left = std::sync::atomic::AtomicUsize::new(times);
    let context = context.to_owned();
    Faults::new(move |p, c| {
        p == point
            && c == context
            && left
                .fetch_update(std::sync::atomic::Ordering::SeqCst, std::sync::atomic::Ordering::SeqCst, |n| {
                    n.checked_sub(1)
                })
                .is_ok()
    })
}
