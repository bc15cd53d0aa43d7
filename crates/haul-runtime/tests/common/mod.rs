//! A worker, a dispatcher and the operator requests on an in-memory SQLite store and a
//! fake clock, with channel services that answer as each test says and a load queue
//! the test can take down. What a test checks is read back from the store and the
//! queue, as an operator would.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use haul_core::ids::LoadId;
use haul_core::log::{Entry, Record};
use haul_core::sop::Policies;
use haul_core::time::Timestamp;
use haul_core::timers::TimerRoute;
use haul_core::trace::TraceParent;
use haul_core::{Channel, Clock, FakeClock, InboundEvent, QueueMode};
use haul_runtime::channels::{ChannelClient, Channels, DeliveryError, PermanentDeliveryError, RetryableDeliveryError};
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::dispatcher::{Dispatcher, DispatcherSettings};
use haul_runtime::faults::Faults;
use haul_runtime::queue::{EventQueue, Received};
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};
use haul_sqlite::{SqliteConfig, SqliteStore};
use haul_store::{LoadQueue, OutboxRow, Published, QueueError, QueueMessage, Store, StoreError};
use serde_json::{Value, json};

pub const DRIVER: &str = "+15555550100";

pub fn t0() -> Timestamp {
    "2026-03-02T07:00:00Z".parse().unwrap()
}

pub fn load(id: &str) -> LoadId {
    LoadId::parse(id).unwrap()
}

pub fn init() -> Value {
    json!({"event_id": "load:init", "kind": "load_update", "client": "client_a", "driver_phone": DRIVER, "stage": "in_transit"})
}

pub fn ping(id: &str) -> Value {
    json!({"event_id": id, "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high"})
}

pub fn phone_change(id: &str, phone: &str) -> Value {
    json!({"event_id": id, "kind": "load_update", "driver_phone": phone})
}

/// How a channel service answers every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Delivered,
    Retryable,
    Permanent,
    /// 429 with `Retry-After` of this many seconds.
    Throttled(u64),
    /// 400 with Twilio's 21610: the phone opted out.
    OptedOut,
}

/// The channel services: one answer per channel, and every call they got.
#[derive(Default)]
pub struct Services {
    answers: Mutex<HashMap<Channel, Answer>>,
    calls: Mutex<Vec<(Channel, String)>>,
    /// Each call moves this clock on by so much (the time a call takes).
    takes: Mutex<Option<(Arc<FakeClock>, Duration)>>,
}

impl Services {
    pub fn answer(&self, channel: Channel, answer: Answer) {
        self.answers.lock().unwrap().insert(channel, answer);
    }

    /// Every call from now on takes `time` of `clock`'s.
    pub fn take(&self, clock: Arc<FakeClock>, time: Duration) {
        *self.takes.lock().unwrap() = Some((clock, time));
    }

    /// The keys `channel` was called with, in order.
    pub fn calls(&self, channel: Channel) -> Vec<String> {
        self.calls.lock().unwrap().iter().filter(|(c, _)| *c == channel).map(|(_, k)| k.clone()).collect()
    }
}

struct Client {
    channel: Channel,
    services: Arc<Services>,
}

#[async_trait]
impl ChannelClient for Client {
    async fn send(
        &self,
        key: &str,
        _: &LoadId,
        _: &str,
        _: &Value,
        _: Option<TraceParent>,
        _: Timestamp,
    ) -> Result<String, DeliveryError> {
        self.services.calls.lock().unwrap().push((self.channel, key.to_owned()));
        if let Some((clock, time)) = &*self.services.takes.lock().unwrap() {
            clock.advance(*time);
        }
        let answer = self.services.answers.lock().unwrap().get(&self.channel).copied().unwrap_or(Answer::Delivered);
        match answer {
            Answer::Delivered => Ok(format!("rcpt-{key}")),
            Answer::Retryable => Err(RetryableDeliveryError("HTTP 503 from the service".into()).into()),
            Answer::Permanent => {
                Err(PermanentDeliveryError(format!("HTTP 422: {}", "no such number ".repeat(100))).into())
            }
            Answer::OptedOut => Err(PermanentDeliveryError(
                "HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient".into(),
            )
            .into()),
            Answer::Throttled(secs) => Err(haul_runtime::channels::ThrottledDeliveryError {
                why: "HTTP 429 Too Many Requests".into(),
                retry_after: Duration::from_secs(secs),
            }
            .into()),
        }
    }

    fn mode(&self) -> &'static str {
        "test"
    }
}

/// The store's own queue, which a test can take down: publishes and receives then
/// fail as an unreachable queue's would.
pub struct Downable {
    inner: Arc<SqliteStore>,
    down: AtomicBool,
}

impl Downable {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::new("the queue is down")),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl LoadQueue for Downable {
    async fn publish_traced(
        &self,
        load_id: &LoadId,
        event_id: &str,
        body: &str,
        trace: Option<TraceParent>,
        now: Timestamp,
    ) -> Result<Published, StoreError> {
        self.check()?;
        self.inner.publish_traced(load_id, event_id, body, trace, now).await
    }
    async fn receive(&self, max: usize, visibility: Duration, now: Timestamp) -> Result<Vec<QueueMessage>, StoreError> {
        self.check()?;
        self.inner.receive(max, visibility, now).await
    }
    async fn ack(&self, receipt: &str, now: Timestamp) -> Result<(), QueueError> {
        self.inner.ack(receipt, now).await
    }
    async fn nack(&self, receipt: &str, delay: Duration, now: Timestamp) -> Result<(), QueueError> {
        self.inner.nack(receipt, delay, now).await
    }
    async fn depth(&self) -> Result<u64, StoreError> {
        self.inner.depth().await
    }
    async fn published_body(&self, load_id: &LoadId, event_id: &str) -> Result<Option<String>, StoreError> {
        self.inner.published_body(load_id, event_id).await
    }
}

pub struct Rig {
    /// The database file (`None` in memory).
    path: Option<std::path::PathBuf>,
    pub sqlite: Arc<SqliteStore>,
    pub store: Arc<dyn Store>,
    pub queue: Arc<Downable>,
    pub clock: Arc<FakeClock>,
    pub services: Arc<Services>,
}

pub fn sop() -> Arc<dyn Decider> {
    Arc::new(SopDecider { policies: Policies::default() })
}

impl Rig {
    pub async fn new() -> Self {
        Self::at("sqlite::memory:").await
    }

    /// On a file, which [`Rig::refuse`] can make refuse a write.
    pub async fn on_file(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("haul-runtime-{}-{name}.db", std::process::id()));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        Self::at(&format!("sqlite://{}", path.display())).await
    }

    /// From now on the store refuses `UPDATE`s of `column` of the outbox where `when`
    /// holds (an SQL condition on `NEW`), as a store that fails mid-dispatch would: a
    /// trigger, made through a second connection to the file.
    pub fn refuse(&self, column: &str, when: &str) {
        let path = self.path.as_ref().expect("a rig on a file");
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TRIGGER refuse_{column} BEFORE UPDATE OF {column} ON outbox WHEN {when}
             BEGIN SELECT RAISE(ABORT, 'the store refused the write'); END;"
        ))
        .unwrap();
    }

    async fn at(url: &str) -> Self {
        let config = SqliteConfig::from_url(url).unwrap();
        let path = config.path.clone();
        let sqlite = Arc::new(SqliteStore::open(&config).unwrap());
        sqlite.migrate().await.unwrap();
        let queue = Arc::new(Downable { inner: sqlite.clone(), down: AtomicBool::new(false) });
        Rig {
            path,
            store: sqlite.clone(),
            sqlite,
            queue,
            clock: Arc::new(FakeClock::new(t0())),
            services: Arc::new(Services::default()),
        }
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub fn events(&self) -> EventQueue {
        EventQueue::new(self.queue.clone())
    }

    /// The queue as a worker or dispatcher in `mode` takes it.
    fn queue_of(&self, mode: QueueMode) -> Arc<dyn LoadQueue> {
        match mode {
            // The ack and the publish go into the store's transactions: the store itself.
            QueueMode::StoreQueue => self.sqlite.clone(),
            QueueMode::Separate => self.queue.clone(),
        }
    }

    pub fn worker_with(&self, decider: Arc<dyn Decider>, settings: WorkerSettings, faults: Faults) -> Arc<Worker> {
        let clock: Arc<dyn Clock> = self.clock.clone();
        let mode = QueueMode::Separate;
        Arc::new(Worker::new(self.store.clone(), self.queue_of(mode), mode, decider, clock, settings, faults))
    }

    pub fn worker(&self) -> Arc<Worker> {
        self.worker_with(sop(), WorkerSettings::default(), Faults::default())
    }

    /// A worker on the store's own queue, its ack in the append's transaction.
    pub fn worker_on_the_stores_queue(&self) -> Arc<Worker> {
        let (clock, mode): (Arc<dyn Clock>, _) = (self.clock.clone(), QueueMode::StoreQueue);
        let (settings, faults) = (WorkerSettings::default(), Faults::default());
        Arc::new(Worker::new(self.store.clone(), self.queue_of(mode), mode, sop(), clock, settings, faults))
    }

    pub fn dispatcher_with(&self, mode: QueueMode, settings: DispatcherSettings, faults: Faults) -> Arc<Dispatcher> {
        let services = self.services.clone();
        let channels = Channels::build(|channel| -> anyhow::Result<Arc<dyn ChannelClient>> {
            Ok(Arc::new(Client { channel, services: services.clone() }))
        })
        .unwrap();
        let clock: Arc<dyn Clock> = self.clock.clone();
        Arc::new(Dispatcher::new(self.store.clone(), self.queue_of(mode), mode, channels, clock, settings, faults))
    }

    /// A dispatcher as the evals run one: one row after another, a seeded jitter.
    pub fn dispatcher(&self, mode: QueueMode, faults: Faults) -> Arc<Dispatcher> {
        self.dispatcher_with(
            mode,
            DispatcherSettings { sequential: true, jitter_seed: Some(7), ..Default::default() },
            faults,
        )
    }

    pub async fn publish(&self, load_id: &str, event: Value) {
        let event = InboundEvent::from_json(load(load_id), event).unwrap();
        self.events().publish(&event, self.now()).await.unwrap();
    }

    /// A message as the queue would hand `event` of `load_id` out.
    pub fn message(&self, load_id: &str, event: Value) -> Received {
        Received::of_event(InboundEvent::from_json(load(load_id), event).unwrap(), "no-receipt", self.now())
    }

    /// Runs `worker` until the queue has nothing visible for it.
    pub async fn settle(&self, worker: &Arc<Worker>) -> Vec<RunOutcome> {
        let mut all = Vec::new();
        for _ in 0..100 {
            let outcomes = worker.run_once().await.unwrap();
            if outcomes.is_empty() {
                return all;
            }
            all.extend(outcomes);
        }
        panic!("the worker never ran out of messages: {all:?}");
    }

    pub async fn log(&self, load_id: &str) -> Vec<Record> {
        self.store.read_page(&load(load_id), 0, 1000).await.unwrap()
    }

    /// The kinds of the load's records, in order (`decision:{decider}` for decisions).
    pub async fn kinds(&self, load_id: &str) -> Vec<String> {
        self.log(load_id)
            .await
            .iter()
            .map(|r| match &r.entry {
                Entry::Event { event_id, .. } => event_id.to_string(),
                Entry::Decision(d) => format!("decision:{}", d.decider),
                Entry::Unreadable { kind, .. } => format!("unreadable:{kind}"),
            })
            .collect()
    }

    pub async fn rows(&self, load_id: &str) -> Vec<OutboxRow> {
        self.store.rows_for_load(&load(load_id)).await.unwrap()
    }

    /// The row of `load_id` of one action type.
    pub async fn row(&self, load_id: &str, action_type: &str) -> OutboxRow {
        let rows = self.rows(load_id).await;
        rows.iter().find(|r| r.action_type.as_str() == action_type).cloned().unwrap_or_else(|| {
            panic!("no {action_type} row on load {load_id}: {:?}", rows.iter().map(|r| &r.id).collect::<Vec<_>>())
        })
    }

    pub async fn depth(&self) -> u64 {
        self.queue.depth().await.unwrap()
    }

    /// A load with an open ask: its SMS and timer rows committed, not yet sent. The
    /// timer goes through the outbox (`TimerRoute::Outbox`, an external TimerStore's
    /// route and the one rows written before timers went into the append take), so the
    /// dispatcher has a channel row and a TimerStore row to send.
    pub async fn asked(&self, load_id: &str) {
        self.publish(load_id, init()).await;
        self.publish(load_id, ping("ping_0700")).await;
        let settings = WorkerSettings { timers: TimerRoute::Outbox, ..WorkerSettings::default() };
        self.settle(&self.worker_with(sop(), settings, Faults::default())).await;
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(path) = &self.path {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

/// Whether `notify` holds a wake-up now (never waits).
pub async fn woken(notify: &tokio::sync::Notify) -> bool {
    tokio::time::timeout(Duration::ZERO, notify.notified()).await.is_ok()
}

/// What the `tracing` lines of `f` say, at INFO and above, without colours.
pub async fn logs_of<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let out = f.await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    (out, text)
}
