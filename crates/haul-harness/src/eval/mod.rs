//! `haul eval`: runs scenario files (docs/scenarios.md) through the real worker,
//! dispatcher and timer pump on a fake clock, with the channel services as real HTTP
//! servers on 127.0.0.1.
//!
//! At each step: set the clock, publish the step's events, run the pipeline to
//! quiescence (`Pipeline::run_until_quiet`, the same objects `serve` runs), check the
//! step's `expect` keys, then the four invariants. The first failure ends the
//! scenario with a message naming the step, its time, the key, expected and actual.
//!
//! With [`EvalDecider::Llm`] the worker decides with the real `LlmDecider`, pointed at
//! a recorded chat-completions server (`testkit_llm`) that each scenario starts on
//! 127.0.0.1; a request with no recorded answer, or of the wrong shape, fails the
//! scenario (key `llm`).

pub mod keep;
pub mod scenario;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use haul_core::decision::Decision;
use haul_core::ids::{LoadId, TimerId, ops_alert_outbox_id};
use haul_core::projection::{LoadState, Record, project};
use haul_core::{Channel, Clock, FakeClock, InboundEvent, QueueMode, Timestamp};
pub(crate) use haul_postgres::scratch::Lent;
use haul_postgres::scratch::Reusable;
use haul_store::{LoadQueue, OutboxRow, OutboxStatus, SmsRoute, Store, Timer, TimerStatus, UnmatchedSms};
use serde::Serialize;
use serde_json::Value;

use crate::invariants;
use crate::testkit::{Effect, FakeServices};
use crate::testkit_llm::{Answers, RECORDED_API_KEY, RecordedLlm};
use haul_config::Config;
use haul_runtime::faults::Faults;
use haul_runtime::llm::{LlmDecider, LlmSettings};
use haul_runtime::pipeline::{Parts, Pipeline};
use haul_runtime::queue::EventQueue;
use scenario::{Expect, Scenario, SentExpect};

/// Which store each scenario runs on.
#[derive(Clone, Debug)]
pub enum EvalStore {
    SqliteMemory,
    /// Each scenario in its own schema of this database.
    Postgres(String),
}

/// Which load queue a scenario runs on.
#[derive(Clone, Debug, Default)]
pub enum EvalQueue {
    /// The store's own queue, on the scenario's fake clock.
    #[default]
    Store,
    /// A fresh SQS FIFO queue per scenario on this endpoint (a local emulator). SQS
    /// keeps its own clock, so a nacked message is waited for in real time.
    Sqs(String),
}

impl EvalQueue {
    /// SQS FIFO on a local emulator: `HAUL_SQS_ENDPOINT`, or one started for this run.
    #[cfg(feature = "sqs")]
    pub async fn sqs_emulator() -> anyhow::Result<Self> {
        Ok(EvalQueue::Sqs(haul_sqs::emulator::endpoint().await.map_err(|e| anyhow::anyhow!(e))?))
    }

    #[cfg(not(feature = "sqs"))]
    pub async fn sqs_emulator() -> anyhow::Result<Self> {
        anyhow::bail!("--queue sqs needs a build with SQS (cargo build --features sqs)")
    }
}

/// How long a scenario waits, in real time, for messages SQS holds back (a nack's
/// delay) before it calls the pipeline stuck.
const SQS_SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// Which decider the worker runs.
#[derive(Clone, Debug, Default)]
pub enum EvalDecider {
    /// The SOP of docs/design.md with the scenario's client policies.
    #[default]
    Sop,
    /// The LLM decider against a recorded server replying with these answers.
    Llm(Answers),
}

/// What a run is made of besides its store; the default is the store's queue and the SOP.
#[derive(Clone, Debug, Default)]
pub struct EvalOptions {
    pub queue: EvalQueue,
    pub decider: EvalDecider,
    /// A failing scenario's report carries its loads' timelines (`haul eval --verbose`).
    pub timelines: bool,
    /// Copy each scenario's logs into this store when it ends (`haul eval --keep`).
    pub keep: Option<Arc<keep::Keep>>,
    /// Where the runs and sends record their spans (`haul eval --export-spans`); off
    /// unless asked. On, each event a step publishes starts a trace of its own.
    pub spans: haul_runtime::spans::Spans,
}

/// Where a scenario failed.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Failure {
    /// The step's number, counted from 1 as the `[[step]]` blocks are; `None` before the
    /// first step or for file problems.
    pub step: Option<usize>,
    pub at: Option<String>,
    /// The `expect` key, `invariant N`, or the file key at fault.
    pub key: String,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub file: String,
    pub name: String,
    pub passed: bool,
    pub failure: Option<Failure>,
    pub steps: usize,
    pub duration_ms: u64,
    /// With [`EvalOptions::timelines`], a failing scenario's loads as `haul inspect`
    /// shows them, read when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<String>,
}

impl ScenarioReport {
    /// `PASS name` or `FAIL name: why`.
    pub fn line(&self) -> String {
        match &self.failure {
            None => format!("PASS {}", self.name),
            Some(f) => {
                let wher = match (&f.step, &f.at) {
                    (Some(i), Some(at)) => format!("step {i} ({at}): "),
                    _ => String::new(),
                };
                format!("FAIL {} ({}): {wher}{}: {}", self.name, self.file, f.key, f.message)
            }
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenarios: Vec<ScenarioReport>,
    pub passed: usize,
    pub failed: usize,
}

/// The scenario files a list of paths names: files as given, folders searched for
/// `*.toml` (sorted). A path that does not exist is reported as a failure.
pub fn collect(paths: &[PathBuf]) -> Vec<Result<PathBuf, (PathBuf, String)>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found);
            found.sort();
            out.extend(found.into_iter().map(Ok));
        } else if p.is_file() {
            out.push(Ok(p.clone()));
        } else {
            out.push(Err((p.clone(), "no such file or folder".into())));
        }
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "toml") {
            out.push(p);
        }
    }
}

/// Runs every file with the store's queue and the SOP; `on_report` sees each scenario
/// as it finishes.
pub async fn run_paths(paths: &[PathBuf], store: &EvalStore, on_report: impl FnMut(&ScenarioReport)) -> Report {
    run_paths_with(paths, store, &EvalOptions::default(), on_report).await
}

/// Runs every file with the given queue and decider.
pub async fn run_paths_with(
    paths: &[PathBuf],
    store: &EvalStore,
    opts: &EvalOptions,
    mut on_report: impl FnMut(&ScenarioReport),
) -> Report {
    let mut scenarios = Vec::new();
    for item in collect(paths) {
        let report = match item {
            Ok(path) => run_file_with(&path, store, opts).await,
            Err((path, why)) => file_failure(&path, "path", why),
        };
        on_report(&report);
        scenarios.push(report);
    }
    let passed = scenarios.iter().filter(|s| s.passed).count();
    Report { failed: scenarios.len() - passed, passed, scenarios }
}

fn file_failure(path: &Path, key: &str, message: String) -> ScenarioReport {
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    ScenarioReport {
        file: path.display().to_string(),
        name,
        passed: false,
        failure: Some(Failure { step: None, at: None, key: key.into(), message }),
        steps: 0,
        duration_ms: 0,
        timeline: None,
    }
}

pub async fn run_file(path: &Path, store: &EvalStore) -> ScenarioReport {
    run_file_with(path, store, &EvalOptions::default()).await
}

pub async fn run_file_with(path: &Path, store: &EvalStore, opts: &EvalOptions) -> ScenarioReport {
    let text = match std::fs::read(path) {
        Ok(b) => match String::from_utf8(b) {
            Ok(t) => t,
            Err(_) => return file_failure(path, "file", "is not UTF-8".into()),
        },
        Err(e) => return file_failure(path, "file", e.to_string()),
    };
    let scenario = match scenario::parse(&text) {
        Ok(s) => s,
        Err(e) => {
            let message = match e.line {
                Some(l) => format!("line {l}: {}", e.message),
                None => e.message,
            };
            return file_failure(path, &e.key, message);
        }
    };
    run_scenario_with(&scenario, &path.display().to_string(), store, Faults::default(), opts).await
}

/// Runs one parsed scenario. `faults` lets the runner's self-checks plant failures.
pub async fn run_scenario(s: &Scenario, file: &str, store: &EvalStore, faults: Faults) -> ScenarioReport {
    run_scenario_with(s, file, store, faults, &EvalOptions::default()).await
}

/// Runs one parsed scenario with the given queue and decider.
pub async fn run_scenario_with(
    s: &Scenario,
    file: &str,
    store: &EvalStore,
    faults: Faults,
    opts: &EvalOptions,
) -> ScenarioReport {
    let started = std::time::Instant::now();
    let (failure, timeline) = match Run::start(s, store, faults, opts).await {
        Ok(mut run) => {
            let mut failure = run.steps(s).await.err();
            let timeline = if failure.is_some() && opts.timelines { Some(run.timelines().await) } else { None };
            run.close().await;
            if let Some(keep) = &opts.keep
                && let Err(e) = keep.copy(run.store.as_ref(), &run.loads, &s.clients).await
            {
                failure =
                    failure.or(Some(Failure { step: None, at: None, key: "keep".into(), message: format!("{e:#}") }));
            }
            (failure, timeline)
        }
        Err(e) => (Some(Failure { step: None, at: None, key: "setup".into(), message: format!("{e:#}") }), None),
    };
    ScenarioReport {
        file: file.to_owned(),
        name: s.name.clone(),
        passed: failure.is_none(),
        failure,
        steps: s.steps.len(),
        duration_ms: started.elapsed().as_millis() as u64,
        timeline,
    }
}

/// One scenario in progress, and what it has seen so far.
struct Run {
    /// Each published event starts a trace (spans are exported).
    traced: bool,
    store: Arc<dyn Store>,
    /// The PostgreSQL schema the store is lent, given back when the run ends.
    _scratch: Option<Lent>,
    clock: Arc<FakeClock>,
    svc: FakeServices,
    pipeline: Pipeline,
    queue: EventQueue,
    /// The SQS queue to delete when the scenario ends.
    #[cfg(feature = "sqs")]
    sqs: Option<Arc<haul_sqs::SqsQueue>>,
    load: Option<LoadId>,
    loads: BTreeSet<LoadId>,
    /// Every (load, event id) published, for invariant 1.
    published: Vec<(LoadId, String)>,
    /// Cursors at the previous check.
    effects_seen: usize,
    rows_seen: BTreeMap<String, OutboxStatus>,
    timers_seen: BTreeMap<TimerId, TimerStatus>,
    log_seen: BTreeMap<LoadId, usize>,
    /// The recorded model server, with the LLM decider.
    llm: Option<RecordedLlm>,
    llm_seen: usize,
}

/// The scratch schemas of each PostgreSQL database this process ran scenarios or seeds
/// on, migrated once and emptied for each ([`haul_postgres::scratch::Reusable`]).
fn scratch_schemas(url: &str) -> Arc<Reusable> {
    static POOLS: std::sync::OnceLock<std::sync::Mutex<BTreeMap<String, Arc<Reusable>>>> = std::sync::OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    pools.entry(url.to_owned()).or_insert_with(|| Reusable::new(url)).clone()
}

/// Drops the scratch schemas this process made on `store` (at the end of `haul eval`
/// and `haul sim`, so a run leaves none behind); what could not be dropped, with why.
pub async fn drop_scratch_schemas(store: &EvalStore) -> Vec<String> {
    match store {
        EvalStore::SqliteMemory => Vec::new(),
        EvalStore::Postgres(url) => scratch_schemas(url).drop_all().await,
    }
}

/// A fresh, empty store of the kind asked for, its tokens seeded, and on PostgreSQL the
/// schema it lends (given back to be emptied for the next user when dropped).
pub(crate) async fn open_store(store: &EvalStore, seed: u64) -> anyhow::Result<(Arc<dyn Store>, Option<Lent>)> {
    match store {
        EvalStore::SqliteMemory => Ok((haul_backends::open("sqlite::memory:", Some(seed)).await?, None)),
        EvalStore::Postgres(url) => {
            let (store, lent) = scratch_schemas(url).store(Some(seed), 4).await?;
            Ok((Arc::new(store), Some(lent)))
        }
    }
}

fn fail(step: Option<(usize, &str)>, key: &str, message: String) -> Failure {
    Failure { step: step.map(|s| s.0), at: step.map(|s| s.1.to_owned()), key: key.into(), message }
}

impl Run {
    async fn start(s: &Scenario, store: &EvalStore, faults: Faults, opts: &EvalOptions) -> anyhow::Result<Run> {
        let (queue, decider) = (&opts.queue, &opts.decider);
        let (store, scratch) = open_store(store, 1).await?;
        #[cfg(feature = "sqs")]
        let sqs = match queue {
            EvalQueue::Store => None,
            EvalQueue::Sqs(endpoint) => {
                let name = format!("haul-eval-{:016x}.fifo", fastrand::u64(..));
                Some(Arc::new(haul_sqs::SqsQueue::create(&haul_sqs::emulator::settings(endpoint), &name).await?))
            }
        };
        #[cfg(feature = "sqs")]
        let (queue, queue_mode): (Arc<dyn LoadQueue>, _) = match &sqs {
            Some(q) => (q.clone(), QueueMode::Separate),
            None => (store.clone(), QueueMode::StoreQueue),
        };
        #[cfg(not(feature = "sqs"))]
        let (queue, queue_mode): (Arc<dyn LoadQueue>, _) = match queue {
            EvalQueue::Store => (store.clone(), QueueMode::StoreQueue),
            EvalQueue::Sqs(_) => anyhow::bail!("--queue sqs needs a build with SQS (cargo build --features sqs)"),
        };
        let clock = Arc::new(FakeClock::new(s.start));
        let svc = FakeServices::start(None).await?;
        for f in &s.faults {
            svc.add_fault(f.clone());
        }
        let mut config = Config { clients: s.clients.clone(), channels: s.channels.clone(), ..Config::default() };
        let (llm, llm_decider) = match decider {
            EvalDecider::Sop => (None, None),
            EvalDecider::Llm(answers) => {
                let server = RecordedLlm::start(answers.clone(), RECORDED_API_KEY).await?;
                let settings = LlmSettings {
                    base_url: server.base_url(),
                    model: answers.model.clone(),
                    api_key: RECORDED_API_KEY.into(),
                    timeout: answers.timeout,
                };
                config.decider.kind = haul_config::DeciderKind::Llm;
                config.decider.llm.timeout = answers.timeout;
                let model = Arc::new(LlmDecider::new(settings, haul_config::policies(&s.clients))?);
                // A client's `llm_budget` binds as in `serve`; the recorded model has no
                // price, so only token budgets can.
                let budgets = config.decider.llm.budgets(&s.clients)?;
                if budgets.any_money() {
                    anyhow::bail!(
                        "clients.*.llm_budget.usd_per_day: the recorded model has no price; use tokens_per_day"
                    );
                }
                let sop = haul_runtime::decider::SopDecider { policies: haul_config::policies(&s.clients) };
                let d: Arc<dyn haul_runtime::decider::Decider> =
                    Arc::new(haul_runtime::budget::Budgeted::new(model, sop, budgets, store.clone()));
                (Some(server), Some(d))
            }
        };
        let parts = Parts {
            store: store.clone(),
            queue: queue.clone(),
            queue_mode,
            channels: svc.channels(None, Duration::from_secs(5))?,
            clock: clock.clone(),
            faults,
            seed: Some(1),
        };
        let pipeline = Pipeline::new(&config, parts, llm_decider);
        if opts.spans.is_on() {
            pipeline.worker.export_spans(opts.spans.clone());
            pipeline.dispatcher.export_spans(opts.spans.clone());
        }
        Ok(Run {
            traced: opts.spans.is_on(),
            store,
            _scratch: scratch,
            clock,
            svc,
            pipeline,
            queue: EventQueue::new(queue),
            #[cfg(feature = "sqs")]
            sqs,
            load: s.load.clone(),
            loads: s.load.iter().cloned().collect(),
            published: vec![],
            effects_seen: 0,
            rows_seen: BTreeMap::new(),
            timers_seen: BTreeMap::new(),
            log_seen: BTreeMap::new(),
            llm,
            llm_seen: 0,
        })
    }

    async fn steps(&mut self, s: &Scenario) -> Result<(), Failure> {
        if let Some(init) = &s.init {
            self.publish(init, 1).await.map_err(|m| fail(None, "load", m))?;
            self.settle().await.map_err(|m| fail(None, "pipeline", m))?;
            self.llm_ok().map_err(|(k, m)| fail(None, &k, m))?;
            self.invariants().await.map_err(|(k, m)| fail(None, &k, m))?;
        }
        for (i, step) in s.steps.iter().enumerate() {
            // Counted from 1, as a person counts the `[[step]]` blocks.
            let here = Some((i + 1, step.at_text.as_str()));
            self.clock.set(step.at);
            for (event, repeat) in &step.inbound {
                self.publish(event, *repeat).await.map_err(|m| fail(here, "inbound", m))?;
            }
            for sms in &step.unmatched_sms {
                self.keep_unmatched(sms).await.map_err(|m| fail(here, "unmatched_sms", m))?;
            }
            for op in &step.operator {
                self.operate(op).await.map_err(|m| fail(here, "operator", m))?;
            }
            for report in &step.sms_status {
                self.report_status(report).await.map_err(|m| fail(here, "sms_status", m))?;
            }
            self.settle().await.map_err(|m| fail(here, "pipeline", m))?;
            self.llm_ok().map_err(|(k, m)| fail(here, &k, m))?;
            if let Some(expect) = &step.expect {
                self.check(expect).await.map_err(|(k, m)| fail(here, &k, m))?;
                self.mark_checked().await.map_err(|m| fail(here, "store", m))?;
            }
            self.invariants().await.map_err(|(k, m)| fail(here, &k, m))?;
        }
        Ok(())
    }

    async fn publish(&mut self, event: &InboundEvent, repeat: u32) -> Result<(), String> {
        // A repeat is the same message again: the same context.
        let trace = self.traced.then(haul_runtime::trace::root);
        for _ in 0..repeat {
            self.queue.publish_traced(event, trace, self.clock.now()).await.map_err(|e| e.to_string())?;
        }
        self.loads.insert(event.load_id.clone());
        self.published.push((event.load_id.clone(), event.event_id.to_string()));
        Ok(())
    }

    /// Keeps an SMS as unmatched, as the Twilio webhook keeps one no load takes.
    async fn keep_unmatched(&self, sms: &scenario::UnmatchedStep) -> Result<(), String> {
        let now = self.clock.now();
        self.store.claim_message_sid(&sms.message_sid, &SmsRoute::Unmatched, now).await.map_err(|e| e.to_string())?;
        let kept = UnmatchedSms {
            message_sid: sms.message_sid.clone(),
            from: sms.from.clone(),
            to: "+15555550000".into(),
            body: sms.body.clone(),
            received_at: now,
            reason: "no single active load has this driver phone".into(),
        };
        self.store.record_unmatched_sms(&kept).await.map_err(|e| e.to_string())?;
        Ok(())
    }

    /// A delivery receipt for an SMS row, taken as `POST /v1/webhooks/twilio/status`
    /// takes one for it: a message that will not arrive is the row's failed outcome.
    async fn report_status(&mut self, st: &scenario::SmsStatusStep) -> Result<(), String> {
        let row = self.store.get(&st.key).await.map_err(|e| e.to_string())?;
        let row = row.ok_or_else(|| format!("no outbox row {:?} to report on", st.key))?;
        if row.action_type != haul_core::ActionType::SendSms {
            return Err(format!("{:?} is a {}, not an SMS", st.key, row.action_type));
        }
        let receipt: String =
            row.receipt.as_deref().unwrap_or("SM0").chars().filter(char::is_ascii_alphanumeric).collect();
        let sid = st.message_sid.clone().unwrap_or(receipt);
        let report = haul_core::receipt::DeliveryReport::new(Some(&sid), Some(&st.status), st.error_code.as_deref())?;
        if let Some(event) = report.outcome(&row.facts()) {
            self.publish(&event, 1).await?;
        }
        Ok(())
    }

    /// An operator action, made as `POST /v1/operator/*` makes it, `repeat` times; a
    /// refusal fails the scenario.
    async fn operate(&mut self, op: &scenario::OperatorStep) -> Result<(), String> {
        use haul_runtime::operator as ops;
        use scenario::OperatorAsk;
        for _ in 0..op.repeat {
            let (store, now) = (self.store.as_ref(), self.clock.now());
            let queued: Vec<(LoadId, String)> = match &op.ask {
                OperatorAsk::Requeue { outbox_id } => {
                    let q = ops::requeue(store, &self.queue, &op.who, outbox_id, now).await;
                    q.map(|q| vec![(q.load_id, q.event_id.to_string())]).map_err(|e| e.to_string())?
                }
                OperatorAsk::AssignSms { message_sid, load } => {
                    let q = ops::assign_sms(store, &self.queue, &op.who, message_sid, load, now).await;
                    q.map(|q| vec![(q.load_id, q.event_id.to_string())]).map_err(|e| e.to_string())?
                }
                OperatorAsk::ReassignSms { message_sid, load } => {
                    let r = ops::reassign_sms(store, &self.queue, &op.who, message_sid, load, now).await;
                    let r = r.map_err(|e| e.to_string())?;
                    vec![(r.from.load_id, r.from.event_id.to_string()), (r.to.load_id, r.to.event_id.to_string())]
                }
                OperatorAsk::ResolveAsk { load, ask_id } => {
                    let q = ops::resolve_ask(store, &self.queue, &op.who, load, ask_id, now).await;
                    q.map(|q| vec![(q.load_id, q.event_id.to_string())]).map_err(|e| e.to_string())?
                }
                OperatorAsk::Dismiss { outbox_id } => {
                    let q = ops::dismiss(store, &self.queue, &op.who, outbox_id, now).await;
                    q.map(|q| vec![(q.load_id, q.event_id.to_string())]).map_err(|e| e.to_string())?
                }
                // No event: the SMS belongs to no load. Dismissed before (a repeat) is
                // not a refusal.
                OperatorAsk::DismissSms { message_sid } => {
                    ops::dismiss_sms(store, &op.who, message_sid, now).await.map_err(|e| e.to_string())?;
                    vec![]
                }
                OperatorAsk::BulkRequeue { filter, dry_run } => {
                    let a = ops::bulk_requeue(store, &self.queue, &op.who, filter, *dry_run, now)
                        .await
                        .map_err(|e| e.to_string())?;
                    if let Some(r) =
                        a.rows.iter().find(|r| !["queued", "duplicate", "would_requeue"].contains(&r.status.as_str()))
                    {
                        return Err(format!("bulk requeue of {}: {}", r.outbox_id, r.status));
                    }
                    a.rows.into_iter().filter(|_| !dry_run).map(|r| (r.load_id, r.event_id.to_string())).collect()
                }
            };
            for (load, event_id) in queued {
                self.loads.insert(load.clone());
                self.published.push((load, event_id));
            }
        }
        Ok(())
    }

    async fn settle(&self) -> Result<(), String> {
        let started = std::time::Instant::now();
        loop {
            self.pipeline.run_until_quiet().await.map_err(|e| format!("{e:#}"))?;
            // The store's queue is quiet when the pipeline is; SQS may still hold a
            // nacked message back for its delay, in real time.
            if !self.real_time_queue() || self.queue.depth().await.map_err(|e| e.to_string())? == 0 {
                return Ok(());
            }
            if started.elapsed() > SQS_SETTLE_LIMIT {
                return Err(format!(
                    "messages stayed on the queue for {SQS_SETTLE_LIMIT:?} after the pipeline went quiet"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn real_time_queue(&self) -> bool {
        #[cfg(feature = "sqs")]
        return self.sqs.is_some();
        #[cfg(not(feature = "sqs"))]
        false
    }

    /// Every load's timeline as `haul inspect` prints it (the first page of each).
    async fn timelines(&self) -> String {
        let mut out = String::new();
        for l in &self.loads {
            let page = haul_runtime::inspect::Page::default();
            match haul_runtime::inspect::load_view(self.store.as_ref(), l, &page).await {
                Ok(Some(view)) => out.push_str(&haul_runtime::inspect::timeline(&view)),
                Ok(None) => out.push_str(&format!("load {l}: no records\n")),
                Err(e) => out.push_str(&format!("load {l}: cannot read it: {e}\n")),
            }
            out.push('\n');
        }
        out.trim_end().to_owned()
    }

    /// Deletes what the scenario made outside its store.
    async fn close(&self) {
        #[cfg(feature = "sqs")]
        if let Some(q) = &self.sqs
            && let Err(e) = q.delete_queue().await
        {
            tracing::warn!(error = %e, "deleting the scenario's SQS queue failed");
        }
    }

    async fn rows(&self) -> Result<Vec<OutboxRow>, String> {
        let mut rows = Vec::new();
        for l in &self.loads {
            rows.extend(self.store.rows_for_load(l).await.map_err(|e| e.to_string())?);
        }
        Ok(rows)
    }

    /// The loads' timers, as the TimerStore has them (written by a decision's append or
    /// by the dispatcher: the checks do not depend on the route).
    async fn timers(&self) -> Result<Vec<Timer>, String> {
        let mut timers = Vec::new();
        for l in &self.loads {
            timers.extend(self.store.timers_for_load(l).await.map_err(|e| e.to_string())?);
        }
        Ok(timers)
    }

    async fn logs(&self) -> Result<BTreeMap<LoadId, Vec<Record>>, String> {
        let mut logs = BTreeMap::new();
        for l in &self.loads {
            logs.insert(l.clone(), self.store.read(l).await.map_err(|e| e.to_string())?.0);
        }
        Ok(logs)
    }

    async fn mark_checked(&mut self) -> Result<(), String> {
        self.effects_seen = self.svc.effects().len();
        self.llm_seen = self.llm.as_ref().map_or(0, |l| l.requests().len());
        self.rows_seen = self.rows().await?.into_iter().map(|r| (r.id, r.status)).collect();
        self.timers_seen = self.timers().await?.into_iter().map(|t| (t.timer_id, t.status)).collect();
        self.log_seen = self.logs().await?.into_iter().map(|(l, r)| (l, r.len())).collect();
        Ok(())
    }

    /// Outbox rows that reached `status` since the previous check.
    fn newly(&self, rows: &[OutboxRow], status: OutboxStatus) -> Vec<OutboxRow> {
        rows.iter()
            .filter(|r| r.status == status)
            .filter(|r| self.rows_seen.get(&r.id) != Some(&status))
            .cloned()
            .collect()
    }

    async fn check(&self, e: &Expect) -> Result<(), (String, String)> {
        let store_err = |m: String| ("store".to_string(), m);
        let new_effects: Vec<Effect> = self.svc.effects().into_iter().skip(self.effects_seen).collect();
        if let Some(want) = &e.sent {
            let got: Vec<&Effect> = new_effects.iter().filter(|e| e.channel != Channel::Ops.config_name()).collect();
            check_sent(want, &got).map_err(|m| ("sent".to_string(), m))?;
        }
        if let Some(want) = e.llm_calls {
            let got = self.llm.as_ref().map_or(0, |l| l.requests().len()) - self.llm_seen;
            if got != want {
                let events: Vec<String> = self
                    .llm
                    .as_ref()
                    .map(|l| l.requests().into_iter().skip(self.llm_seen).map(|r| r.event).collect())
                    .unwrap_or_default();
                return Err(("llm_calls".into(), format!("expected {want} model calls, got {got} {events:?}")));
            }
        }
        if let Some(want) = &e.ops_alerts {
            let got: BTreeSet<String> = new_effects
                .iter()
                .filter(|e| e.channel == Channel::Ops.config_name())
                .map(|e| ops_alert_outbox_id(&e.key).unwrap_or(&e.key).to_owned())
                .collect();
            same_set("ops_alerts", want.iter().cloned().collect(), got)?;
        }
        let rows = if e.dead.is_some() { self.rows().await.map_err(store_err)? } else { vec![] };
        let timers = if e.timers_scheduled.is_some() || e.timers_canceled.is_some() {
            self.timers().await.map_err(store_err)?
        } else {
            vec![]
        };
        if let Some(want) = &e.timers_scheduled {
            let want_set: BTreeSet<String> = want.iter().map(|t| format!("{} at {}", t.id, t.fire_at)).collect();
            // New since the previous check, and scheduled (a cancel that came first
            // leaves a row with no fire_at: nothing was scheduled).
            let got: BTreeSet<String> = timers
                .iter()
                .filter(|t| !self.timers_seen.contains_key(&t.timer_id) && t.fire_at != Timestamp::UNIX_EPOCH)
                .map(|t| format!("{} at {}", t.timer_id, t.fire_at))
                .collect();
            same_set("timers_scheduled", want_set, got)?;
        }
        if let Some(want) = &e.timers_canceled {
            let got: BTreeSet<String> = timers
                .iter()
                .filter(|t| t.status == TimerStatus::Canceled)
                .filter(|t| self.timers_seen.get(&t.timer_id) != Some(&TimerStatus::Canceled))
                .map(|t| t.timer_id.to_string())
                .collect();
            same_set("timers_canceled", want.iter().cloned().collect(), got)?;
        }
        if let Some(want) = &e.dead {
            let got: BTreeSet<String> = self.newly(&rows, OutboxStatus::Dead).into_iter().map(|r| r.id).collect();
            same_set("dead", want.iter().cloned().collect(), got)?;
        }
        if let Some(want) = &e.opted_out {
            let kept = self
                .store
                .opted_out_page(None, haul_store::ops::MAX_PAGE)
                .await
                .map_err(|e| store_err(e.to_string()))?;
            same_set("opted_out", want.iter().cloned().collect(), kept.into_iter().map(|c| c.phone).collect())?;
        }
        if e.asks.is_some() || e.open_asks.is_some() || e.stage.is_some() || e.decisions.is_some() {
            let logs = self.logs().await.map_err(store_err)?;
            let mut states: BTreeMap<&LoadId, LoadState> = BTreeMap::new();
            let wanted = e.asks.iter().flatten().map(|a| &a.load);
            let wanted = wanted.chain(e.open_asks.iter().flatten().map(|o| &o.load));
            for l in wanted.chain(e.stage.iter().flatten().map(|s| &s.load)) {
                if !states.contains_key(l) {
                    let recs = match logs.get(l) {
                        Some(r) => r.clone(),
                        None => self.store.read(l).await.map_err(|e| store_err(e.to_string()))?.0,
                    };
                    states.insert(l, project(&recs));
                }
            }
            // Another load than the `[load]` is named in the message.
            let of = |l: &LoadId| if self.load.as_ref() == Some(l) { String::new() } else { format!("load {l}: ") };
            if let Some(want) = &e.asks {
                for a in want {
                    let got = states[&a.load].asks.values().find(|x| x.ask_id.as_str() == a.id);
                    let ok = got.is_some_and(|g| g.status.as_str() == a.status && a.step.is_none_or(|s| s == g.step));
                    if !ok {
                        let actual = got.map_or("no such ask".to_string(), |g| {
                            format!("status {} step {}", g.status.as_str(), g.step)
                        });
                        let expected =
                            format!("status {}{}", a.status, a.step.map(|s| format!(" step {s}")).unwrap_or_default());
                        return Err((
                            "asks".into(),
                            format!("{}ask {}: expected {expected}, got {actual}", of(&a.load), a.id),
                        ));
                    }
                }
            }
            for want in e.open_asks.iter().flatten() {
                let got: BTreeSet<String> = states[&want.load].open_asks().map(|a| a.ask_id.to_string()).collect();
                same_set("open_asks", want.ids.iter().cloned().collect(), got)
                    .map_err(|(k, m)| (k, format!("{}{m}", of(&want.load))))?;
            }
            for want in e.stage.iter().flatten() {
                let got = states[&want.load].stage.clone().unwrap_or_default();
                if got != want.stage {
                    return Err(("stage".into(), format!("{}expected {:?}, got {got:?}", of(&want.load), want.stage)));
                }
            }
            if let Some(want) = &e.decisions {
                let recent: Vec<&Decision> = logs
                    .iter()
                    .flat_map(|(l, recs)| recs.iter().skip(self.log_seen.get(l).copied().unwrap_or(0)))
                    .filter_map(Record::decision)
                    .collect();
                for d in want {
                    let found = recent.iter().find(|r| r.event_id.as_str() == d.event_id);
                    let Some(r) = found else {
                        let ids: Vec<&str> = recent.iter().map(|r| r.event_id.as_str()).collect();
                        return Err((
                            "decisions".into(),
                            format!("no decision for {} since the previous check (decided: {ids:?})", d.event_id),
                        ));
                    };
                    check_decision(d, r).map_err(|m| ("decisions".to_string(), format!("{}: {m}", d.event_id)))?;
                }
            }
        }
        Ok(())
    }

    /// With the LLM decider: every model request so far was well formed and had a
    /// recorded answer. Checked before `expect`, since a missing answer is the cause.
    fn llm_ok(&self) -> Result<(), (String, String)> {
        match self.llm.as_ref().and_then(|l| l.problems().into_iter().next()) {
            Some(problem) => Err(("llm".into(), problem)),
            None => Ok(()),
        }
    }

    /// The four invariants a scenario promises (docs/scenarios.md), and the log's own soundness, from
    /// the one checker the simulator and the crash test use too.
    async fn invariants(&self) -> Result<(), (String, String)> {
        let logs = self.logs().await.map_err(|m| ("store".to_string(), m))?;
        let mut published: BTreeMap<&LoadId, Vec<&str>> = BTreeMap::new();
        for (l, id) in &self.published {
            published.entry(l).or_default().push(id.as_str());
        }
        let no_log = Vec::new();
        let checked = published
            .iter()
            .try_for_each(|(l, ids)| {
                invariants::events_logged_once(l, logs.get(*l).unwrap_or(&no_log), ids.iter().copied())
            })
            .and_then(|()| logs.iter().try_for_each(|(l, recs)| invariants::log_is_sound(l, recs)))
            .and_then(|()| invariants::one_payload_per_key(&self.svc.conflicts()));
        checked.map_err(|v| (v.invariant.key().to_string(), v.message))?;
        for l in &self.loads {
            let rows = self.store.rows_for_load(l).await.map_err(|e| ("store".to_string(), e.to_string()))?;
            invariants::requeued_once(l, &rows).map_err(|v| (v.invariant.key().to_string(), v.message))?;
        }
        Ok(())
    }
}

fn same_set(key: &str, want: BTreeSet<String>, got: BTreeSet<String>) -> Result<(), (String, String)> {
    if want == got {
        return Ok(());
    }
    let missing: Vec<&String> = want.difference(&got).collect();
    let unexpected: Vec<&String> = got.difference(&want).collect();
    Err((key.into(), format!("missing {missing:?}, unexpected {unexpected:?}")))
}

/// A fake service's channel (its config name) as scenario files name it.
fn channel_label(config_name: &str) -> &str {
    Channel::from_config_name(config_name).map_or(config_name, |c| c.scenario_name())
}

fn matches(want: &SentExpect, got: &Effect) -> bool {
    let body = got.payload.get("body").or_else(|| got.payload.get("text")).and_then(Value::as_str).unwrap_or("");
    channel_label(&got.channel) == want.channel
        && got.key == want.key
        && want.to.as_ref().is_none_or(|t| got.payload["to"] == *t)
        && want.urgency.as_ref().is_none_or(|u| got.payload["urgency"] == *u)
        && want.body_contains.as_ref().is_none_or(|b| body.contains(b.as_str()))
}

/// Exactly the expected calls, order ignored: each expectation takes a distinct call.
fn check_sent(want: &[SentExpect], got: &[&Effect]) -> Result<(), String> {
    let mut free: Vec<bool> = vec![true; got.len()];
    let mut missing = Vec::new();
    for w in want {
        match (0..got.len()).find(|&i| free[i] && matches(w, got[i])) {
            Some(i) => free[i] = false,
            None => missing.push(describe_want(w)),
        }
    }
    let unexpected: Vec<String> = got
        .iter()
        .zip(&free)
        .filter(|(_, f)| **f)
        .map(|(e, _)| format!("{} {} {}", channel_label(&e.channel), e.key, e.payload))
        .collect();
    if missing.is_empty() && unexpected.is_empty() {
        return Ok(());
    }
    Err(format!("missing {missing:?}, unexpected {unexpected:?}"))
}

fn describe_want(w: &SentExpect) -> String {
    let mut s = format!("{} {}", w.channel, w.key);
    for (k, v) in [("to", &w.to), ("urgency", &w.urgency), ("body_contains", &w.body_contains)] {
        if let Some(v) = v {
            s.push_str(&format!(" {k}={v:?}"));
        }
    }
    s
}

fn check_decision(want: &scenario::DecisionExpect, got: &Decision) -> Result<(), String> {
    if let Some(d) = &want.decider
        && got.decider != *d
    {
        return Err(format!("expected decider {d:?}, got {:?}", got.decider));
    }
    if let Some(f) = want.filtered
        && got.filtered != f
    {
        return Err(format!("expected filtered {f}, got {}", got.filtered));
    }
    if let Some(types) = &want.actions {
        let mut want_types = types.clone();
        want_types.sort();
        let mut got_types: Vec<String> = got.actions.iter().map(|a| a.action_type().as_str().to_owned()).collect();
        got_types.sort();
        if want_types != got_types {
            return Err(format!("expected actions {want_types:?}, got {got_types:?}"));
        }
    }
    if let Some(budget) = &want.budget {
        let got_budget = got.budget.as_ref().map_or("none", |b| b.scope.as_str());
        if got_budget != budget {
            return Err(format!("expected budget {budget:?}, got {got_budget:?}"));
        }
    }
    if let Some(inbox) = &want.inbox {
        let mut want_rows = inbox.clone();
        want_rows.sort();
        let mut got_rows: Vec<scenario::InboxExpect> = got
            .inbox
            .iter()
            .map(|c| scenario::InboxExpect { outbox_id: c.outbox_id.clone(), state: c.state.as_str().to_owned() })
            .collect();
        got_rows.sort();
        if want_rows != got_rows {
            let show = |rows: &[scenario::InboxExpect]| {
                let each: Vec<String> = rows.iter().map(|r| format!("{} {}", r.outbox_id, r.state)).collect();
                format!("[{}]", each.join(", "))
            };
            return Err(format!("expected inbox {}, got {}", show(&want_rows), show(&got_rows)));
        }
    }
    Ok(())
}

/// The report as JUnit XML (one `testsuite`, a `testcase` per scenario named by its
/// file, a `failure` for each failing one), the form CI systems read.
pub fn junit(report: &Report) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let secs = |ms: u64| format!("{:.3}", ms as f64 / 1000.0);
    let total: u64 = report.scenarios.iter().map(|s| s.duration_ms).sum();
    out.push_str(&format!(
        "<testsuites tests=\"{}\" failures=\"{}\" time=\"{}\">\n<testsuite name=\"haul eval\" tests=\"{}\" failures=\"{}\" time=\"{}\">\n",
        report.scenarios.len(),
        report.failed,
        secs(total),
        report.scenarios.len(),
        report.failed,
        secs(total)
    ));
    for s in &report.scenarios {
        out.push_str(&format!(
            "  <testcase classname=\"{}\" name=\"{}\" time=\"{}\"",
            xml(&s.file),
            xml(&s.name),
            secs(s.duration_ms)
        ));
        match &s.failure {
            None => out.push_str("/>\n"),
            Some(f) => {
                let mut text = s.line();
                if let Some(t) = &s.timeline {
                    text.push_str("\n\n");
                    text.push_str(t);
                }
                out.push_str(&format!(
                    ">\n    <failure message=\"{}\" type=\"{}\">{}</failure>\n  </testcase>\n",
                    xml(&f.message),
                    xml(&f.key),
                    xml(&text)
                ));
            }
        }
    }
    out.push_str("</testsuite>\n</testsuites>\n");
    out
}

/// Text for an XML attribute or element: the five special characters escaped, and the
/// control characters XML 1.0 cannot carry dropped.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' | '\r' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}
