//! `haul sim`: deterministic simulation with fault injection (FoundationDB's simulation
//! tests, TigerBeetle's VOPR).
//!
//! One seeded generator drives a fake clock, many loads, two workers, two dispatchers
//! and two timer pumps (the production objects), the fake channel services and a queue
//! that can have outages. During the fault phase it injects: process deaths at every
//! fault point, an append whose answer is lost, duplicate publishes, redeliveries under
//! a live holder, two runs of one load at once, queue outages, services answering 5xx,
//! 429, 4xx (some SMS refused as opted out, Twilio's 21610), timing out, answering
//! slower than the lease or losing the answer after
//! the effect, and clock jumps. Then faults stop, the clock runs on until everything
//! drains, and the invariants are checked. Operations run one at a time in the order
//! the generator picks, so a seed repeats exactly: the trace digest says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haul_core::decision::Decision;
use haul_core::event::EventBody;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, Record};
use haul_core::sop::Policies;
use haul_core::time::{Timestamp, add, since};
use haul_core::timers::TimerRoute;
use haul_core::{Channel, Clock, FakeClock, InboundEvent, QueueMode};
use haul_store::{LoadQueue, OutboxStatus, Store, TimerStatus};
use serde_json::json;

use crate::eval::EvalStore;
use crate::testkit::{FakeServices, FaultKind, FlakyQueue};
use crate::{invariants, oracle};
use haul_config::{ClientConfig, ClientRateConfig, Config, EtaRequestConfig, policies};
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::dispatcher::{Dispatcher, DispatcherSettings};
use haul_runtime::faults::{FaultPoint, Faults, Observed, PlantedBugs};
use haul_runtime::pump::TimerPump;
use haul_runtime::queue::{EventQueue, Received};
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};

/// Which kinds of fault the fault phase injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultSet {
    pub crash: bool,
    pub duplicate: bool,
    pub redelivery: bool,
    pub interleave: bool,
    pub outage: bool,
    pub service: bool,
    pub clock: bool,
    /// Operator actions among the faults: requeues (retried, repeated, in bulk),
    /// resolved asks, unmatched SMS assigned to loads.
    pub operator: bool,
}

impl FaultSet {
    pub const NAMES: [&'static str; 8] =
        ["crash", "duplicate", "redelivery", "interleave", "outage", "service", "clock", "operator"];

    pub fn all() -> Self {
        FaultSet {
            crash: true,
            duplicate: true,
            redelivery: true,
            interleave: true,
            outage: true,
            service: true,
            clock: true,
            operator: true,
        }
    }

    /// `all`, `none`, or a comma-separated list of [`FaultSet::NAMES`].
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s {
            "all" => return Ok(Self::all()),
            "none" => {
                return Ok(FaultSet {
                    crash: false,
                    duplicate: false,
                    redelivery: false,
                    interleave: false,
                    outage: false,
                    service: false,
                    clock: false,
                    operator: false,
                });
            }
            _ => {}
        }
        let mut f = Self::parse("none")?;
        for name in s.split(',').map(str::trim) {
            match name {
                "crash" => f.crash = true,
                "duplicate" => f.duplicate = true,
                "redelivery" => f.redelivery = true,
                "interleave" => f.interleave = true,
                "outage" => f.outage = true,
                "service" => f.service = true,
                "clock" => f.clock = true,
                "operator" => f.operator = true,
                other => {
                    anyhow::bail!("--faults: unknown fault {other:?} (all, none, or some of {})", Self::NAMES.join(","))
                }
            }
        }
        Ok(f)
    }
}

#[derive(Clone, Debug)]
pub struct SimOptions {
    pub seed: u64,
    pub loads: usize,
    pub steps: usize,
    pub faults: FaultSet,
    pub bugs: PlantedBugs,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct SimReport {
    pub seed: u64,
    /// FNV-1a over the trace: the same seed gives the same digest.
    pub digest: String,
    pub violation: Option<String>,
    /// The trace lines that show the violation (those naming its load or key).
    pub excerpt: Vec<String>,
    pub coverage: BTreeMap<String, u64>,
    pub events: usize,
    pub effects: usize,
    /// Drain rounds it took to come to rest after faults stopped (liveness's margin
    /// against [`REST_WITHIN_ROUNDS`]).
    pub drain_rounds: usize,
}

/// What the hooks see and count; shared with the fault hook, the service chaos and the
/// dispatchers' observer.
struct Shared {
    rng: fastrand::Rng,
    on: bool,
    faults: FaultSet,
    coverage: BTreeMap<String, u64>,
    latest_claim: HashMap<String, String>,
    stale_marks: Vec<String>,
    trace: Vec<String>,
    /// When each SMS call reached the service (fake time), taken or refused: what the
    /// send rate invariant counts.
    sms_calls: Vec<Timestamp>,
    /// Each Hero task's call: its key (the row's, which starts with its load) and when.
    hero_calls: Vec<(String, Timestamp)>,
}

impl Shared {
    fn count(&mut self, what: impl Into<String>) {
        *self.coverage.entry(what.into()).or_default() += 1;
    }
}

type SharedRef = Arc<Mutex<Shared>>;

fn lock(s: &SharedRef) -> std::sync::MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// The SOP, remembering every state it was asked about (invariant: re-projecting the
/// log gives the state the runs saw).
struct Recording {
    sop: SopDecider,
    seen: Arc<Mutex<Vec<(LoadId, String, LoadState)>>>,
    /// The planted decision bug: every load update decided as a delivery.
    rule7_on_any_update: bool,
}

#[async_trait::async_trait]
impl Decider for Recording {
    fn name(&self) -> String {
        "sop".into()
    }

    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).push((
            load.clone(),
            event.event_id.to_string(),
            state.clone(),
        ));
        if self.rule7_on_any_update
            && let EventBody::LoadUpdate(u) = &event.body
        {
            let mut delivered = u.clone();
            delivered.stage = Some(haul_core::projection::STAGE_DELIVERED.into());
            let event = InboundEvent { body: EventBody::LoadUpdate(delivered), ..event.clone() };
            return self.sop.decide(load, state, &event, now).await;
        }
        self.sop.decide(load, state, event, now).await
    }
}

/// Rounds of the drain (each runs every pump, worker and dispatcher until idle, then
/// moves the clock to what is due next) within which every load must come to rest once
/// faults stop; past them the seed fails as a liveness failure. A clean drain takes
/// far fewer (the most in 10,000 default seeds is in bench/RESULTS.md).
pub const REST_WITHIN_ROUNDS: usize = 500;

/// The share of the events the generator made that must be logged: a run whose
/// publishes mostly failed proves little, however clean its invariants. Judged once it
/// made [`PROGRESS_JUDGED_FROM`] events: one queue outage (up to 25 steps) can cover
/// the whole of a tiny run.
pub const MIN_LOGGED_SHARE: f64 = 0.25;

/// Events a run must have made before its progress is judged.
pub const PROGRESS_JUDGED_FROM: u64 = 40;

/// How often a process dies at a fault point it passes during the fault phase. The
/// pump passes its one point far less often than the worker and the dispatcher theirs
/// (only when a timer is due): at the common 2% it was hit 468 times in 10,000 seeds,
/// against 1,000 wanted for every point ([`MIN_HITS_PER_SEED`]).
pub fn crash_chance(point: FaultPoint) -> f64 {
    match point {
        FaultPoint::AfterPumpPublish => 0.06,
        _ => 0.02,
    }
}

/// The hits a fault point should get per seed on average (1,000 in 10,000 default
/// seeds); `haul sim` names the points a run hit less often.
pub const MIN_HITS_PER_SEED: f64 = 0.1;

/// Every fault point's coverage key (`crash:{point}`) and its hits in `coverage`, hit
/// or not, in [`FaultPoint::ALL`] order.
pub fn fault_point_hits(coverage: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    FaultPoint::ALL
        .iter()
        .map(|p| {
            let key = format!("crash:{p}");
            let hits = coverage.get(&key).copied().unwrap_or(0);
            (key, hits)
        })
        .collect()
}

/// The fault points a run of `seeds` seeds hit less than [`MIN_HITS_PER_SEED`] a
/// seed, with their hits.
pub fn rare_fault_points(coverage: &BTreeMap<String, u64>, seeds: u64) -> Vec<(String, u64)> {
    let mut points = fault_point_hits(coverage);
    points.retain(|(_, hits)| (*hits as f64) < MIN_HITS_PER_SEED * seeds as f64);
    points
}

/// How the drain ended.
struct Drained {
    started: Timestamp,
    rounds: usize,
    /// What was still moving when the rounds ran out (`None`: at rest).
    still_moving: Option<String>,
}

const LEASE: Duration = Duration::from_secs(90);

/// The SMS channel's send rate in every seed: one a second, one at once. Low enough
/// that the generator's bursts meet it, so rows are held back, throttled and
/// superseded under every fault.
fn sms_limit() -> haul_core::limit::Limit {
    haul_core::limit::Limit::new(haul_core::limit::Rate::parse("1/s").expect("a rate"), 1).expect("a limit")
}

/// SMS a dispatcher may have been granted and not yet sent when the clock jumps (a
/// call answered after the lease moves it 91 s on).
const SMS_IN_FLIGHT: u32 = 0;

/// client_b's own limit on Hero tasks.
const CLIENT_B_HERO: &str = "2/min";
const VISIBILITY: Duration = Duration::from_secs(360);
const STRANGER: &str = "+15555559999";

struct World {
    store: Arc<dyn Store>,
    /// The PostgreSQL schema the store is lent, given back when the seed ends.
    _scratch: Option<crate::eval::Lent>,
    queue: Arc<FlakyQueue>,
    /// `queue`, typed: how the simulator publishes.
    events: EventQueue,
    clock: Arc<FakeClock>,
    svc: FakeServices,
    workers: Vec<Arc<Worker>>,
    dispatchers: Vec<Arc<Dispatcher>>,
    pumps: Vec<Arc<TimerPump>>,
    shared: SharedRef,
    seen: Arc<Mutex<Vec<(LoadId, String, LoadState)>>>,
    /// The clients' policies, as the oracle reads them.
    policies: Policies,
    rng: fastrand::Rng,
    loads: Vec<LoadId>,
    published: Vec<(LoadId, String)>,
    /// SMS rows a delivery report said were not delivered: each must have exactly one
    /// failed outcome in its log, however many reports came.
    failed_reports: std::collections::BTreeSet<(LoadId, String)>,
    /// Events the generator made, published or refused by a queue outage.
    made: u64,
    next_event: u64,
    step: usize,
    /// The step at which a queue outage ends.
    outage_until: Option<usize>,
}

fn phone(i: usize) -> String {
    format!("+1555555{:04}", 1000 + i)
}

impl World {
    async fn new(opts: &SimOptions, store: &EvalStore) -> anyhow::Result<World> {
        let (store, scratch) = crate::eval::open_store(store, opts.seed).await?;
        let clock = Arc::new(FakeClock::new("2026-03-02T07:00:00Z".parse()?));
        let svc = FakeServices::start(None).await?;
        let queue = Arc::new(FlakyQueue::new(store.clone() as Arc<dyn LoadQueue>));
        let shared: SharedRef = Arc::new(Mutex::new(Shared {
            rng: fastrand::Rng::with_seed(opts.seed ^ 0x5eed_f00d),
            on: true,
            faults: opts.faults,
            coverage: BTreeMap::new(),
            latest_claim: HashMap::new(),
            stale_marks: Vec::new(),
            trace: Vec::new(),
            sms_calls: Vec::new(),
            hero_calls: Vec::new(),
        }));
        let hook = {
            let shared = shared.clone();
            move |point: FaultPoint, ctx: &str| {
                let mut s = lock(&shared);
                if !(s.on && s.faults.crash) || s.rng.f64() >= crash_chance(point) {
                    return false;
                }
                s.count(format!("crash:{point}"));
                s.trace.push(format!("  crash at {point} ({ctx})"));
                true
            }
        };
        let observer = {
            let shared = shared.clone();
            move |o: Observed<'_>| {
                let mut s = lock(&shared);
                match o {
                    Observed::Claimed { outbox_id, token } => {
                        s.latest_claim.insert(outbox_id.to_owned(), token.to_owned());
                    }
                    Observed::Marked { outbox_id, token } => {
                        if s.latest_claim.get(outbox_id).map(String::as_str) != Some(token) {
                            s.stale_marks.push(outbox_id.to_owned());
                        }
                    }
                }
            }
        };
        let faults = Faults::new(hook).with_observer(observer).with_bugs(opts.bugs);
        let chaos = {
            let (shared, clock) = (shared.clone(), clock.clone());
            move |channel: &str, key: &str| -> Option<FaultKind> {
                let mut s = lock(&shared);
                if channel == Channel::Sms.config_name() {
                    s.sms_calls.push(clock.now());
                }
                if channel == Channel::Hero.config_name() {
                    s.hero_calls.push((key.to_owned(), clock.now()));
                }
                if !(s.on && s.faults.service) {
                    return None;
                }
                let r = s.rng.f64();
                let kind = match r {
                    r if r < 0.05 => FaultKind::Retryable,
                    r if r < 0.065 => FaultKind::RateLimited,
                    r if r < 0.07 => FaultKind::Throttled(Duration::from_secs(2)),
                    // A driver who opted out with the carrier, not by a reply to haul.
                    r if r < 0.0775 && channel == Channel::Sms.config_name() => FaultKind::OptedOut,
                    r if r < 0.08 => FaultKind::Permanent,
                    r if r < 0.10 => FaultKind::LostAnswer,
                    r if r < 0.102 => FaultKind::Slow(Duration::from_millis(400)),
                    r if r < 0.11 => {
                        // Applied, but answered after the lease ran out.
                        clock.advance(LEASE + Duration::from_secs(1));
                        s.count("service:slower_than_lease");
                        s.trace.push(format!("  {channel} {key}: answered after the lease"));
                        return None;
                    }
                    _ => return None,
                };
                let name = match &kind {
                    FaultKind::Retryable => "service:5xx",
                    FaultKind::RateLimited => "service:429",
                    FaultKind::Throttled(_) => "service:429_retry_after",
                    FaultKind::Permanent => "service:4xx",
                    FaultKind::OptedOut => "service:opted_out",
                    FaultKind::LostAnswer => "service:lost_answer",
                    FaultKind::Slow(_) => "service:timeout",
                    FaultKind::Held(_) => "service:held",
                };
                s.count(name);
                s.trace.push(format!("  {channel} {key}: {name}"));
                Some(kind)
            }
        };
        svc.set_chaos(Some(Arc::new(chaos)));
        let mut clients = BTreeMap::new();
        clients.insert(
            "client_b".to_string(),
            ClientConfig {
                eta_request: EtaRequestConfig {
                    retry_after: Some(Duration::from_secs(600)),
                    max_attempts: Some(2),
                    trigger_risk: Some(haul_core::Risk::Medium),
                },
                // Twice the others' share of the SMS rate when both wait.
                send_weight: Some(2),
                // Its own limit on Hero tasks, which no channel rate binds.
                rates: [("hero".to_owned(), ClientRateConfig { rate: Some(CLIENT_B_HERO.into()), burst: None })].into(),
                ..ClientConfig::default()
            },
        );
        let config = Config { clients, ..Config::default() };
        let seen = Arc::new(Mutex::new(Vec::new()));
        let decider: Arc<dyn Decider> = Arc::new(Recording {
            sop: SopDecider { policies: policies(&config.clients) },
            seen: seen.clone(),
            rule7_on_any_update: opts.bugs.rule7_on_any_update,
        });
        // A client timeout short enough that a "timing out" service costs little real time.
        let channels = svc.channels(None, Duration::from_millis(300))?;
        // The first worker sends its decisions' timers through the outbox (the path an
        // external TimerStore takes, and a build from before timers went into the
        // append), the second commits them with the decision: both on the same loads,
        // as during a rolling deploy.
        let worker_settings = |i: usize| WorkerSettings {
            concurrency: 1,
            visibility: VISIBILITY,
            timers: if i == 0 { TimerRoute::Outbox } else { TimerRoute::WithDecision },
            ..WorkerSettings::default()
        };
        // The clients' weights and own limits, read from the settings once.
        let clients_settings = DispatcherSettings::default().with_weights(&config.clients);
        let dispatcher_settings = |i: u64| DispatcherSettings {
            batch: 4,
            in_flight: 4,
            lease: LEASE,
            retry: config.dispatcher.retry.policy(),
            sequential: true,
            jitter_seed: Some(opts.seed.wrapping_mul(31).wrapping_add(i)),
            limits: haul_core::PerChannel::from_fn(|c| (c == Channel::Sms).then_some(sms_limit())),
            // One Hero task at the service at a time across both dispatchers: the cap
            // holds rows back, and a crash mid-send keeps its slot until its lease lapses.
            caps: haul_core::PerChannel::from_fn(|c| (c == Channel::Hero).then_some(1)),
            weights: clients_settings.weights.clone(),
            client_limits: clients_settings.client_limits.clone(),
        };
        let q: Arc<dyn LoadQueue> = queue.clone();
        // The second worker and dispatcher take the store's own queue, as `serve` does:
        // the ack inside the append and the outcome's publish with the mark, one
        // transaction each. The first ones go through the flaky queue: two steps, with
        // the crash windows between them and the queue's outages.
        let direct: Arc<dyn LoadQueue> = store.clone();
        let queue_of =
            |i: usize| if i == 0 { (q.clone(), QueueMode::Separate) } else { (direct.clone(), QueueMode::StoreQueue) };
        let c: Arc<dyn Clock> = clock.clone();
        let workers = (0..2)
            .map(|i| {
                let (queue, mode) = queue_of(i);
                Arc::new(Worker::new(
                    store.clone(),
                    queue,
                    mode,
                    decider.clone(),
                    c.clone(),
                    worker_settings(i),
                    faults.clone(),
                ))
            })
            .collect();
        let dispatchers = (0..2u64)
            .map(|i| {
                let (queue, mode) = queue_of(i as usize);
                Arc::new(Dispatcher::new(
                    store.clone(),
                    queue,
                    mode,
                    channels.clone(),
                    c.clone(),
                    dispatcher_settings(i),
                    faults.clone(),
                ))
            })
            .collect();
        let pumps =
            (0..2).map(|_| Arc::new(TimerPump::new(store.clone(), q.clone(), c.clone(), faults.clone(), 16))).collect();
        let loads = (0..opts.loads.max(1)).map(|i| LoadId::parse(&format!("L{i}")).expect("valid load id")).collect();
        Ok(World {
            store,
            _scratch: scratch,
            events: EventQueue::new(queue.clone()),
            queue,
            clock,
            svc,
            workers,
            dispatchers,
            pumps,
            shared,
            seen,
            policies: policies(&config.clients),
            rng: fastrand::Rng::with_seed(opts.seed),
            loads,
            published: Vec::new(),
            failed_reports: Default::default(),
            made: 0,
            next_event: 0,
            step: 0,
            outage_until: None,
        })
    }

    fn trace(&self, line: String) {
        let t = self.clock.now().strftime("%d %H:%M:%S");
        lock(&self.shared).trace.push(format!("{:>5} {t} {line}", self.step));
    }

    fn count(&self, what: &str) {
        lock(&self.shared).count(what);
    }

    fn faults(&self) -> FaultSet {
        let s = lock(&self.shared);
        if s.on { s.faults } else { FaultSet::parse("none").expect("static") }
    }

    async fn publish(&mut self, load: &LoadId, event: serde_json::Value, times: usize) -> Option<Received> {
        let ev = InboundEvent::from_json(load.clone(), event).expect("the simulator makes valid events");
        self.made += 1;
        let mut accepted = false;
        for _ in 0..times {
            match self.events.publish(&ev, self.clock.now()).await {
                Ok(_) => accepted = true,
                Err(_) => self.trace(format!("publish {load} {} refused: queue down", ev.event_id)),
            }
        }
        if !accepted {
            return None;
        }
        self.published.push((load.clone(), ev.event_id.to_string()));
        self.trace(format!("publish {load} {} {}{}", ev.event_id, ev.kind(), if times > 1 { " twice" } else { "" }));
        let now = self.clock.now();
        Some(Received::of_event(ev, "0.direct", now))
    }

    /// A delivery report (Twilio's status callback) for one of load `i`'s SMS rows, taken
    /// as the status webhook takes one (`haul_core::receipt`): before the send's answer
    /// or after it, now and then twice; or for a row haul does not have, which changes
    /// nothing.
    async fn report_delivery(&mut self, i: usize) {
        let load = self.loads[i].clone();
        let Ok(rows) = self.store.rows_for_load(&load).await else { return };
        let sms: Vec<_> = rows.into_iter().filter(|r| r.action_type == haul_core::ActionType::SendSms).collect();
        if sms.is_empty() || self.rng.u32(0..10) == 0 {
            self.count("report:unknown_row");
            self.trace(format!("report {load} for a row haul does not have: nothing"));
            return;
        }
        let row = &sms[self.rng.usize(0..sms.len())];
        let status = ["delivered", "sent", "undelivered", "failed"][self.rng.usize(0..4)];
        let sid: String = row.receipt.as_deref().unwrap_or("SM0").chars().filter(char::is_ascii_alphanumeric).collect();
        let Ok(report) = haul_core::receipt::DeliveryReport::new(Some(&sid), Some(status), Some("30006")) else {
            return;
        };
        let when = if row.receipt.is_some() { "after_answer" } else { "before_answer" };
        self.count(&format!("report:{status}:{when}"));
        self.trace(format!("report {load} {} {status}", row.id));
        let Some(event) = report.outcome(&row.facts()) else { return };
        let times = if self.rng.u32(0..3) == 0 { 2 } else { 1 };
        // Refused by a queue outage, the webhook answers 503 and nothing is kept.
        if self.publish(&load, event.to_json(), times).await.is_some() {
            self.failed_reports.insert((load, row.id.clone()));
        }
    }

    fn random_event(&mut self, i: usize) -> serde_json::Value {
        self.next_event += 1;
        let id = format!("e{}", self.next_event);
        let r = self.rng.u32(0..100);
        match r {
            0..=39 => {
                let risk = ["low", "medium", "high", "high"][self.rng.usize(0..4)];
                json!({"event_id": id, "kind": "location_ping", "lat": 41.0, "lon": -87.0, "risk": risk, "at": self.clock.now().to_string()})
            }
            40..=64 => {
                // Now and then the driver opts out of SMS, or back in.
                let body = match self.rng.u32(0..20) {
                    0 => "STOP",
                    1 => "Start",
                    2..=10 => "ETA 9:15",
                    _ => "flat tire, running late",
                };
                json!({"event_id": id, "kind": "inbound_sms", "from": phone(i), "body": body})
            }
            65..=74 => json!({"event_id": id, "kind": "inbound_sms", "from": STRANGER, "body": "who is this?"}),
            75..=79 => json!({"event_id": id, "kind": "load_update", "stage": "delivered"}),
            _ => json!({"event_id": id, "kind": "load_update", "next_stop": format!("stop {}", self.next_event)}),
        }
    }

    async fn init_loads(&mut self) {
        for i in 0..self.loads.len() {
            let load = self.loads[i].clone();
            let client = if i % 2 == 0 { "client_a" } else { "client_b" };
            let init = json!({"event_id": "load:init", "kind": "load_update", "client": client, "driver_phone": phone(i), "stage": "in_transit"});
            self.publish(&load, init, 1).await;
        }
    }

    fn outcomes(outcomes: &[RunOutcome]) -> String {
        outcomes
            .iter()
            .map(|o| match o {
                RunOutcome::Committed { decider, actions, .. } => format!("committed({decider},{actions})"),
                RunOutcome::Crashed(c) => format!("crashed({})", c.point),
                RunOutcome::LeftForRedelivery(why) => format!("left({why})"),
                other => format!("{other:?}").to_lowercase(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    async fn run_worker(&self, w: usize) -> anyhow::Result<bool> {
        let outcomes = self.workers[w].run_once().await?;
        if !outcomes.is_empty() {
            self.trace(format!("w{w}: {}", Self::outcomes(&outcomes)));
        }
        Ok(!outcomes.is_empty())
    }

    async fn run_dispatcher(&self, d: usize) -> anyhow::Result<bool> {
        let done = self.dispatchers[d].run_once().await?;
        if !done.is_empty() {
            let labels: Vec<String> = done.iter().map(|x| format!("{x:?}").to_lowercase()).collect();
            self.trace(format!("d{d}: {}", labels.join(" ")));
        }
        Ok(!done.is_empty())
    }

    async fn run_pump(&self, p: usize) -> anyhow::Result<bool> {
        let round = self.pumps[p].run_once().await?;
        if round.fired > 0 || round.crashed.is_some() {
            self.trace(format!(
                "p{p}: fired {}{}",
                round.fired,
                if round.crashed.is_some() { " then crashed" } else { "" }
            ));
        }
        Ok(round.fired > 0)
    }

    /// One step of the fault phase, chosen by the generator.
    async fn step(&mut self) -> anyhow::Result<()> {
        let f = self.faults();
        if self.outage_until.is_some_and(|end| self.step >= end) {
            self.outage_until = None;
            self.queue.set_down(false);
            self.trace("queue up".into());
        }
        let r = self.rng.u32(0..100);
        match r {
            0..=23 if self.rng.u32(0..8) == 0 => {
                let i = self.rng.usize(0..self.loads.len());
                self.report_delivery(i).await;
            }
            0..=23 => {
                let i = self.rng.usize(0..self.loads.len());
                let event = self.random_event(i);
                let load = self.loads[i].clone();
                let times = if f.duplicate && self.rng.u32(0..10) == 0 { 2 } else { 1 };
                if times > 1 {
                    self.count("queue:duplicate_publish");
                }
                self.publish(&load, event, times).await;
            }
            24..=47 => {
                let w = self.rng.usize(0..2);
                self.run_worker(w).await?;
            }
            48..=69 => {
                let d = self.rng.usize(0..2);
                self.run_dispatcher(d).await?;
            }
            70..=77 => {
                let p = self.rng.usize(0..2);
                self.run_pump(p).await?;
            }
            78..=87 => {
                let s = self.rng.u64(1..=120);
                self.clock.advance(Duration::from_secs(s));
            }
            88..=89 if f.operator => self.operate().await?,
            90..=91 if f.clock => {
                let m = self.rng.u64(10..=60);
                self.count("clock:jump");
                self.trace(format!("clock jumps {m} min"));
                self.clock.advance(Duration::from_secs(m * 60));
            }
            92..=93 if f.outage && self.outage_until.is_none() => {
                let steps = self.rng.usize(3..=25);
                self.outage_until = Some(self.step + steps);
                self.queue.set_down(true);
                self.count("queue:outage");
                self.trace(format!("queue down for {steps} steps"));
            }
            94..=96 if f.redelivery => {
                // A holder whose visibility lapses mid-run: another worker gets the
                // message meanwhile; the holder then finishes late.
                let held = self.workers[0].receive(1).await?;
                if let Some(m) = held.into_iter().next() {
                    self.count("queue:redelivery_under_holder");
                    self.trace(format!("w0 holds {} {} past its visibility", m.load_id, m.event_id));
                    self.clock.advance(VISIBILITY + Duration::from_secs(1));
                    self.run_worker(1).await?;
                    let late = self.workers[0].process(m).await;
                    self.trace(format!("w0 late: {}", Self::outcomes(&[late])));
                }
            }
            97..=99 if f.interleave => {
                // Two events of one load run at once in two workers.
                let i = self.rng.usize(0..self.loads.len());
                let load = self.loads[i].clone();
                let (ea, eb) = (self.random_event(i), self.random_event(i));
                let (Some(a), Some(b)) = (self.publish(&load, ea, 1).await, self.publish(&load, eb, 1).await) else {
                    return Ok(());
                };
                self.count("worker:interleaved_runs");
                let (ra, rb) = self.workers[0].interleave(a, &self.workers[1], b).await;
                self.trace(format!("interleaved on {load}: {} | {}", Self::outcomes(&[ra]), Self::outcomes(&[rb])));
            }
            _ => {
                let s = self.rng.u64(1..=30);
                self.clock.advance(Duration::from_secs(s));
            }
        }
        Ok(())
    }

    /// An operator action, made as the operator routes make it: a requeue of a dead row
    /// (sometimes retried, sometimes of a row requeued before by another request), a
    /// bulk requeue (sometimes a dry run), an ask resolved by hand, or an SMS kept as
    /// unmatched and assigned to a load. A refusal is traced, not a failure.
    async fn operate(&mut self) -> anyhow::Result<()> {
        use haul_runtime::operator as ops;
        self.next_event += 1;
        let n = self.next_event;
        let who = ops::Requester {
            request_id: format!("sim-{n}"),
            actor: "sim".into(),
            reason: format!("step {}", self.step),
            trace: None,
        };
        let now = self.clock.now();
        let start: Timestamp = "2026-03-02T07:00:00Z".parse()?;
        let (store, events) = (self.store.clone(), self.events.clone());
        let mut queued: Vec<(LoadId, String)> = Vec::new();
        let what = match self.rng.u32(0..4) {
            0 => {
                let dead = store.dead(start, 50).await?;
                if dead.is_empty() {
                    return Ok(());
                }
                let row = dead[self.rng.usize(0..dead.len())].clone();
                let times = if self.rng.bool() { 2 } else { 1 };
                self.count("operator:requeue");
                for _ in 0..times {
                    match ops::requeue(store.as_ref(), &events, &who, &row.id, now).await {
                        Ok(q) => queued.push((q.load_id, q.event_id.to_string())),
                        Err(e) => self.trace(format!("operator requeue {} refused: {e}", row.id)),
                    }
                }
                format!("requeue {}{}", row.id, if times > 1 { " twice" } else { "" })
            }
            1 => {
                let types = [
                    haul_core::ActionType::CreateHeroTask,
                    haul_core::ActionType::SendSms,
                    haul_core::ActionType::UpdateStage,
                ];
                let action_type = types[self.rng.usize(0..types.len())];
                let filter = ops::DeadFilter { action_type, since: start, limit: 5 };
                let dry_run = self.rng.u32(0..4) == 0;
                self.count(if dry_run { "operator:bulk_requeue_dry_run" } else { "operator:bulk_requeue" });
                match ops::bulk_requeue(store.as_ref(), &events, &who, &filter, dry_run, now).await {
                    Ok(a) if !dry_run => queued.extend(
                        a.rows
                            .into_iter()
                            .filter(|r| r.status == "queued" || r.status == "duplicate")
                            .map(|r| (r.load_id, r.event_id.to_string())),
                    ),
                    Ok(_) => {}
                    Err(e) => self.trace(format!("operator bulk requeue refused: {e}")),
                }
                format!("bulk requeue of dead {action_type}{}", if dry_run { " (dry run)" } else { "" })
            }
            2 => {
                let load = self.loads[self.rng.usize(0..self.loads.len())].clone();
                let state = haul_core::project(&store.read(&load).await?.0);
                let asks: Vec<_> = state.asks.keys().cloned().collect();
                if asks.is_empty() {
                    return Ok(());
                }
                let ask = asks[self.rng.usize(0..asks.len())].clone();
                self.count("operator:resolve_ask");
                match ops::resolve_ask(store.as_ref(), &events, &who, &load, &ask, now).await {
                    Ok(q) => queued.push((q.load_id, q.event_id.to_string())),
                    Err(e) => self.trace(format!("operator resolve {ask} refused: {e}")),
                }
                format!("resolve {load} {ask}")
            }
            _ => {
                let i = self.rng.usize(0..self.loads.len());
                let sid = format!("SMsim{n}");
                let from = if self.rng.bool() { phone(i) } else { STRANGER.to_owned() };
                store.claim_message_sid(&sid, &haul_store::SmsRoute::Unmatched, now).await?;
                let sms = haul_store::UnmatchedSms {
                    message_sid: sid.clone(),
                    from,
                    to: "+15555550000".into(),
                    body: "ETA 9:15".into(),
                    received_at: now,
                    reason: "no single active load has this driver phone".into(),
                };
                store.record_unmatched_sms(&sms).await?;
                let load = self.loads[i].clone();
                self.count("operator:assign_sms");
                match ops::assign_sms(store.as_ref(), &events, &who, &sid, &load, now).await {
                    Ok(q) => queued.push((q.load_id, q.event_id.to_string())),
                    Err(e) => self.trace(format!("operator assign {sid} refused: {e}")),
                }
                format!("assign {sid} to {load}")
            }
        };
        self.trace(format!("operator {}: {what}", who.request_id));
        self.published.extend(queued);
        Ok(())
    }

    /// Faults off; the clock runs on until nothing is left to do, for at most
    /// [`REST_WITHIN_ROUNDS`] rounds. What is still moving after them, if anything.
    async fn drain(&mut self) -> anyhow::Result<Drained> {
        lock(&self.shared).on = false;
        self.svc.clear_faults();
        self.queue.set_down(false);
        let started = self.clock.now();
        self.trace("faults stop; draining".into());
        for round in 0..REST_WITHIN_ROUNDS {
            let mut moved = false;
            for p in 0..2 {
                moved |= self.run_pump(p).await?;
            }
            for w in 0..2 {
                while self.run_worker(w).await? {
                    moved = true;
                }
            }
            for d in 0..2 {
                while self.run_dispatcher(d).await? {
                    moved = true;
                }
            }
            if moved {
                continue;
            }
            // A dead row the sweep put off is due again within minutes.
            let busy = self.store.depth().await? > 0
                || self.store.count_by_status(OutboxStatus::Pending).await? > 0
                || !self.store.dead_without_outcome(1).await?.is_empty();
            if busy {
                self.clock.advance(Duration::from_secs(30));
                continue;
            }
            let far = add(self.clock.now(), Duration::from_secs(365 * 86_400));
            match self.store.due(far, 1).await?.first() {
                Some(t) if t.fire_at > self.clock.now() => self.clock.set(t.fire_at),
                Some(_) => self.clock.advance(Duration::from_secs(1)),
                None => return Ok(Drained { started, rounds: round, still_moving: None }),
            }
        }
        let far = add(self.clock.now(), Duration::from_secs(365 * 86_400));
        let still = format!(
            "{} queued messages, {} pending rows, {} dead rows unsettled, {} timers not fired",
            self.store.depth().await?,
            self.store.count_by_status(OutboxStatus::Pending).await?,
            self.store.dead_without_outcome(100).await?.len(),
            self.store.due(far, 100).await?.len(),
        );
        Ok(Drained { started, rounds: REST_WITHIN_ROUNDS, still_moving: Some(still) })
    }

    /// Liveness at rest: every ask ended (answered, escalated or closed), and enough of
    /// what the generator made got logged.
    async fn check_progress(&self) -> anyhow::Result<Option<String>> {
        for l in &self.loads {
            let state = haul_core::project(&self.store.read(l).await?.0);
            if let Some((ask, _)) = state.asks.iter().find(|(_, a)| a.status == haul_core::decision::AskStatus::Open) {
                return Ok(Some(format!("liveness: ask {ask} of {l} is still open at rest (no timer, no answer)")));
            }
        }
        let logged = self.published.len() as f64;
        if self.made >= PROGRESS_JUDGED_FROM && logged < MIN_LOGGED_SHARE * self.made as f64 {
            return Ok(Some(format!(
                "too little progress: {logged} of the {} events made were logged (at least {:.0}% must be)",
                self.made,
                MIN_LOGGED_SHARE * 100.0
            )));
        }
        Ok(None)
    }

    async fn check(&self, drain_started: Timestamp) -> anyhow::Result<Option<String>> {
        let s = &self.store;
        let mut logs = BTreeMap::new();
        for l in &self.loads {
            logs.insert(l.clone(), s.read(l).await?.0);
        }
        let mut published: BTreeMap<&LoadId, Vec<&str>> = BTreeMap::new();
        for (l, id) in &self.published {
            published.entry(l).or_default().push(id.as_str());
        }
        let refused = invariants::refused_alerts(s.as_ref(), 100).await?;
        for (l, recs) in &logs {
            let checked = invariants::events_logged_once(l, recs, published.get(l).into_iter().flatten().copied())
                .and_then(|()| invariants::log_is_sound(l, recs));
            if let Err(v) = checked {
                return Ok(Some(v.message));
            }
            for t in s.timers_for_load(l).await? {
                if t.status == TimerStatus::Scheduled {
                    return Ok(Some(format!("timer {} of {l} never fired", t.timer_id)));
                }
                if t.status == TimerStatus::Fired
                    && t.fire_at >= drain_started
                    && t.fired_at.is_some_and(|f| since(f, t.fire_at) > Duration::from_secs(60))
                {
                    return Ok(Some(format!("timer {} of {l} fired more than 60 s late outside faults", t.timer_id)));
                }
            }
            // Every SOP and filter decision is the rule table's (`oracle`).
            if let Err(why) = oracle::check(l, recs, |client| policy_of(&self.policies, client)) {
                return Ok(Some(why));
            }
            let rows = s.rows_for_load(l).await?;
            for _ in rows.iter().filter(|r| r.status == OutboxStatus::Superseded) {
                lock(&self.shared).count("outbox:superseded");
            }
            let effects = |c: haul_core::Channel, key: &str| self.svc.deduped_effects(c.config_name(), key);
            if let Err(v) = invariants::outbox_settled(l, recs, &rows, &refused, effects)
                .and_then(|()| invariants::requeued_once(l, &rows))
            {
                return Ok(Some(v.message));
            }
        }
        // A message reported undelivered has one failed outcome, however many reports
        // (and the dispatcher's own failure) said so.
        for (l, id) in &self.failed_reports {
            let failed = haul_core::ids::action_outcome_event_id(id, haul_core::OutcomeStatus::Failed);
            let n = logs.get(l).map_or(0, |recs| recs.iter().filter(|r| r.entry_id == failed.as_str()).count());
            if n != 1 {
                return Ok(Some(format!("{id} of {l} was reported undelivered and has {n} failed outcomes")));
            }
        }
        if let Err(v) = invariants::one_payload_per_key(&self.svc.conflicts()) {
            return Ok(Some(v.message));
        }
        let sms_calls = lock(&self.shared).sms_calls.clone();
        if let Err(v) = invariants::sends_within_rate("sms", &sms_calls, &sms_limit(), SMS_IN_FLIGHT) {
            return Ok(Some(v.message));
        }
        // client_b's loads are the odd ones (`init_loads`).
        let client_b: Vec<String> = self.loads.iter().skip(1).step_by(2).map(|l| format!("{l}/")).collect();
        let hero_b: Vec<Timestamp> = lock(&self.shared)
            .hero_calls
            .iter()
            .filter(|(key, _)| client_b.iter().any(|l| key.starts_with(l.as_str())))
            .map(|(_, at)| *at)
            .collect();
        let rate = haul_core::limit::Rate::parse(CLIENT_B_HERO).expect("a rate");
        if let Err(v) = invariants::sends_spaced("client_b's hero", &hero_b, &rate) {
            return Ok(Some(v.message));
        }
        if let Some(id) = lock(&self.shared).stale_marks.first() {
            return Ok(Some(format!("a mark on {id} succeeded with a stale claim token")));
        }
        // Re-projecting the log gives the state each run decided on: the decision
        // logged for an event was made on the log exactly as it stands before it.
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut by_event: HashMap<(&LoadId, &str), Vec<&LoadState>> = HashMap::new();
        for (l, e, st) in &seen {
            by_event.entry((l, e.as_str())).or_default().push(st);
        }
        for (l, recs) in &logs {
            let mut before = LoadState::default();
            for (i, r) in recs.iter().enumerate() {
                // Only decisions the decider made: a run that asked the decider and
                // died may be followed by one the filter decides.
                let by_decider = recs
                    .get(i + 1)
                    .and_then(Record::decision)
                    .is_some_and(|d| !matches!(d.decider.as_str(), "filter" | "fallback"));
                let states = by_event.get(&(l, r.entry_id.as_str())).filter(|_| by_decider);
                if r.decision().is_some() || states.is_none() {
                    before.apply(r);
                    continue; // a decision, or decided by the filter or a fallback
                }
                let states = states.expect("checked");
                if !states.iter().any(|st| **st == before) {
                    return Ok(Some(format!(
                        "the decision for {} of {l} was made on a state its log does not give (decided on version {}, logged after version {})",
                        r.entry_id,
                        states.iter().map(|s| s.version).max().unwrap_or(0),
                        before.version
                    )));
                }
                before.apply(r);
            }
        }
        if s.depth().await? != 0 {
            return Ok(Some("the load queue did not drain".into()));
        }
        Ok(None)
    }
}

/// A client's policy in the oracle's terms.
fn policy_of(policies: &Policies, client: Option<&str>) -> oracle::Policy {
    let p = policies.for_client(client);
    oracle::Policy { max_attempts: p.max_attempts, trigger_risk: p.trigger_risk }
}

fn fnv1a(lines: &[String]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in lines {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The trace lines that name what the violation names (its load, or its key), last 30.
fn excerpt(trace: &[String], violation: &str) -> Vec<String> {
    let needles: Vec<&str> = violation
        .split_whitespace()
        .filter(|w| w.starts_with('L') && w[1..].chars().all(|c| c.is_ascii_digit()) || w.contains('/'))
        .collect();
    let hits: Vec<String> = trace.iter().filter(|l| needles.iter().any(|n| l.contains(n))).cloned().collect();
    let pick = if hits.is_empty() { trace.to_vec() } else { hits };
    pick[pick.len().saturating_sub(30)..].to_vec()
}

/// This process's resident memory now and at its peak, in bytes (Linux's
/// `/proc/self/status`; `None` elsewhere): what says whether a long run keeps
/// anything per seed.
pub fn resident_memory() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k * 1024)
    };
    Some((kib("VmRSS:")?, kib("VmHWM:")?))
}

/// Runs one seed.
pub async fn run(opts: &SimOptions, store: &EvalStore) -> anyhow::Result<SimReport> {
    let mut w = World::new(opts, store).await?;
    w.init_loads().await;
    for step in 0..opts.steps {
        w.step = step;
        w.step().await?;
    }
    w.step = opts.steps;
    let drained = w.drain().await?;
    let violation = match &drained.still_moving {
        Some(still) => {
            Some(format!("liveness: not at rest {REST_WITHIN_ROUNDS} drain rounds after faults stopped: {still}"))
        }
        None => match w.check(drained.started).await? {
            Some(v) => Some(v),
            None => w.check_progress().await?,
        },
    };
    let s = lock(&w.shared);
    let mut coverage = s.coverage.clone();
    coverage.insert("events".into(), w.published.len() as u64);
    let effects = w.svc.effects().len();
    Ok(SimReport {
        seed: opts.seed,
        digest: format!("{:016x}", fnv1a(&s.trace)),
        excerpt: violation.as_deref().map(|v| excerpt(&s.trace, v)).unwrap_or_default(),
        violation,
        coverage,
        events: w.published.len(),
        effects,
        drain_rounds: drained.rounds,
    })
}
