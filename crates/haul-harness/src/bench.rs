//! `haul bench`: throughput, latency and memory, each throughput set against a limit
//! measured in the same run (these machines are noisy: a bare number means little).
//!
//! Workloads: `append` (runs/s against the bare driver writing the same rows),
//! `projection` (read + project per run at 100, 1,000 and 10,000 entries),
//! `contention` (8 workers on one hot load: wasted decisions, with and without the
//! LoadLock), `e2e` (the whole pipeline in one process, at a fixed rate and at
//! saturation), `e2e-http` (one unit over real HTTP through `haul serve` processes, by
//! closed-loop callers), `dispatch` (outbox rows to an HTTP sink against bare HTTP posts)
//! and `replay` (`haul replay` with the SOP over 10,000 loads and 560,000 log records,
//! decisions per second against reading and projecting the same logs).
//! Each reports its peak resident memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use haul_core::action::ActionType;
use haul_core::decision::Decision;
use haul_core::derived::Derived;
use haul_core::event::EventBody;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, project};
use haul_core::time::Timestamp;
use haul_core::timers::{self, TimerRoute};
use haul_core::{Clock, InboundEvent, QueueMode};
use haul_postgres::scratch::FreshStore;
use haul_store::{LoadQueue, NewEntry, NewOutboxRow, OutboxStatus, Store};
use serde_json::{Value, json};

use haul_runtime::clock::SystemClock;
use haul_runtime::decider::{Decider, SopDecider};
use haul_runtime::faults::Faults;
use haul_runtime::queue::Received;
use haul_runtime::worker::{RunOutcome, Worker, WorkerSettings};

mod e2e_http;

pub const WORKLOADS: [&str; 9] =
    ["append", "projection", "contention", "e2e", "e2e-http", "dispatch", "timers", "replay", "burst"];

/// Figures of one workload: name → number.
pub type Figures = BTreeMap<String, f64>;

#[derive(Clone, Debug)]
pub enum BenchStore {
    /// A SQLite file in this directory, with the default durability (`synchronous=FULL`).
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

/// Peak resident memory since the last reset, in MiB (Linux `VmHWM`).
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()))
        .map_or(0.0, |kb| kb / 1024.0)
}

fn reset_peak_rss() {
    // "5" resets the peak resident set size (Linux 4.0+); elsewhere the figure is the process's peak.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

async fn fresh_store(store: &BenchStore, tag: &str) -> anyhow::Result<(Arc<dyn Store>, String)> {
    match store {
        BenchStore::Sqlite(dir) => {
            let path = dir.join(format!("bench-{tag}-{}.db", fastrand::u32(..)));
            let url =
                format!("sqlite://{}{}", path.display(), std::env::var("HAUL_BENCH_SQLITE_OPTS").unwrap_or_default());
            Ok((haul_backends::open(&url, None).await?, url))
        }
        BenchStore::Postgres(url) => {
            let options = FreshStore { url: url.clone(), pool_size: 16, ..FreshStore::default() };
            let (s, schema) = haul_postgres::scratch::fresh_store(&options).await?;
            made_schema(&schema);
            Ok((Arc::new(s), schema))
        }
    }
}

/// The PostgreSQL schemas the running workload made, dropped when it ends: a full run
/// makes a dozen, and left behind they grow the server's catalogs, which slows the
/// runs and tests after it (the test helpers only drop schemas an hour old).
static SCHEMAS_MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn made_schema(schema: &str) {
    if let Ok(mut made) = SCHEMAS_MADE.lock() {
        made.push(schema.to_owned());
    }
}

/// Drops the schemas the workload made. A schema that cannot be dropped is reported and
/// left (the test helpers drop it once it is an hour old).
async fn drop_schemas_made(url: &str) {
    let made = SCHEMAS_MADE.lock().map(|mut m| std::mem::take(&mut *m)).unwrap_or_default();
    for failure in haul_postgres::scratch::drop_schemas(url, &made).await {
        eprintln!("bench: could not drop its schema {failure}");
    }
}

fn load(i: usize) -> LoadId {
    LoadId::parse(&format!("B{i}")).expect("valid load id")
}

/// One run's rows: a high-risk ping, its decision, and two outbox rows.
fn run_rows(l: &LoadId, n: usize, now: Timestamp) -> (Vec<NewEntry>, Vec<NewOutboxRow>) {
    let ev = format!("ping_{n}");
    let ask = format!("ask:eta_request:{ev}");
    let sms = json!({"key": format!("{l}/{ask}/1/send_sms"), "type": "send_sms", "ask_id": ask, "step": 1,
        "params": {"to": "+15555550100", "body": "Hi, this is dispatch. What is your ETA to Gary, IN? Please reply with a time."}});
    let timer = json!({"key": format!("{l}/{ask}/1/set_timer"), "type": "set_timer", "ask_id": ask, "step": 1,
        "params": {"timer_id": format!("tmr:{l}:{ask}:1"), "fire_at": now.to_string(), "ask_id": ask, "step": 1}});
    let decision = json!({"decision_id": format!("dec:{ev}"), "event_id": ev, "decided_at": now.to_string(), "filtered": false,
        "needs_hero_task": false, "actions": [sms.clone(), timer.clone()], "rationale": "risk high: ask the driver for an ETA (step 1 of 3)",
        "decider": "sop", "asks": [{"ask_id": ask, "step": 1, "status": "open"}]});
    // What the worker hands the append: the stored form and the delta it made from its
    // typed entries (a ping changes nothing; the decision opens the ask), so the figure
    // is the store's work, not a decode the worker never does.
    let entry = |entry_id: String, kind: &str, payload, derived| NewEntry {
        entry_id,
        kind: kind.into(),
        payload,
        derived,
        trace: None,
    };
    let opened = Derived { asks: vec![(ask.clone(), "open".into())], ..Derived::default() };
    let entries = vec![
        entry(
            ev.clone(),
            "location_ping",
            json!({"at": now.to_string(), "lat": 41.88, "lon": -87.63, "risk": "high"}),
            Derived::default(),
        ),
        entry(format!("dec:{ev}"), "decision_recorded", decision, opened),
    ];
    let outbox = vec![
        NewOutboxRow {
            id: sms["key"].as_str().unwrap_or_default().into(),
            action_type: ActionType::SendSms,
            action: sms,
            trace: None,
        },
        NewOutboxRow {
            id: timer["key"].as_str().unwrap_or_default().into(),
            action_type: ActionType::SetTimer,
            action: timer,
            trace: None,
        },
    ];
    (entries, outbox)
}

/// Committed runs per second: `loads` loads, one run each, split over `writers`.
async fn append_rate(store: Arc<dyn Store>, loads: usize, writers: usize, offset: usize) -> anyhow::Result<f64> {
    let now = SystemClock.now();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.spawn(async move {
            for i in (w..loads).step_by(writers) {
                let l = load(offset + i);
                let (entries, outbox) = run_rows(&l, i, now);
                store.append(&l, entries, 0, outbox, now).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(loads as f64 / started.elapsed().as_secs_f64())
}

/// The same rows, one transaction each, with the bare driver: the physical limit.
async fn raw_rate(
    store: &BenchStore,
    url_or_schema: &str,
    loads: usize,
    writers: usize,
    offset: usize,
) -> anyhow::Result<f64> {
    let now = SystemClock.now();
    match store {
        BenchStore::Sqlite(_) => {
            let path = url_or_schema.trim_start_matches("sqlite://").to_owned();
            let started = Instant::now();
            // One writer is SQLite's limit: extra connections only wait on its lock.
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                let conn = rusqlite::Connection::open(&path)?;
                conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")?;
                for i in 0..loads {
                    let l = load(offset + i);
                    let (entries, outbox) = run_rows(&l, i, now);
                    let ms = now.as_millisecond();
                    conn.execute_batch("BEGIN IMMEDIATE")?;
                    conn.execute("INSERT INTO loads (load_id, version, created_at, updated_at) VALUES (?1, 2, ?2, ?2)", rusqlite::params![l.as_str(), ms])?;
                    for (n, e) in entries.iter().enumerate() {
                        conn.execute(
                            "INSERT INTO events (load_id, seq, entry_id, kind, payload, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                            rusqlite::params![l.as_str(), n as i64 + 1, e.entry_id, e.kind, e.payload.to_string(), ms],
                        )?;
                    }
                    for o in &outbox {
                        conn.execute(
                            "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 'pending', ?5, ?5, ?5)",
                            rusqlite::params![o.id, l.as_str(), o.action_type.as_str(), o.action.to_string(), ms],
                        )?;
                    }
                    conn.execute_batch("COMMIT")?;
                }
                Ok(())
            })
            .await??;
            Ok(loads as f64 / started.elapsed().as_secs_f64())
        }
        BenchStore::Postgres(url) => {
            let schema = url_or_schema.to_owned();
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..writers {
                let (url, schema) = (url.clone(), schema.clone());
                tasks.spawn(async move {
                    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                    tokio::spawn(conn);
                    client.batch_execute(&format!("SET search_path = {schema}")).await?;
                    let ms = now.as_millisecond();
                    for i in (w..loads).step_by(writers) {
                        let l = load(offset + i);
                        let (entries, outbox) = run_rows(&l, i, now);
                        let tx = client.transaction().await?;
                        tx.execute("INSERT INTO loads (load_id, version, created_at, updated_at) VALUES ($1, 2, $2, $2)", &[&l.as_str(), &ms]).await?;
                        for (n, e) in entries.iter().enumerate() {
                            tx.execute(
                                "INSERT INTO events (load_id, seq, entry_id, kind, payload, recorded_at) VALUES ($1, $2, $3, $4, $5, $6)",
                                &[&l.as_str(), &(n as i64 + 1), &e.entry_id, &e.kind, &e.payload.to_string(), &ms],
                            )
                            .await?;
                        }
                        for o in &outbox {
                            tx.execute(
                                "INSERT INTO outbox (id, load_id, action_type, action, status, due_at, created_at, updated_at) VALUES ($1, $2, $3, $4, 'pending', $5, $5, $5)",
                                &[&o.id, &l.as_str(), &o.action_type.as_str(), &o.action.to_string(), &ms],
                            )
                            .await?;
                        }
                        tx.commit().await?;
                    }
                    anyhow::Ok(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
            Ok(loads as f64 / started.elapsed().as_secs_f64())
        }
    }
}

async fn append(store: &BenchStore, loads: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let (s, handle) = fresh_store(store, "append").await?;
    let one = append_rate(s.clone(), loads, 1, 0).await?;
    let eight = append_rate(s.clone(), loads, 8, loads).await?;
    let raw1 = raw_rate(store, &handle, loads, 1, 1_000_000).await?;
    let raw8 = match store {
        BenchStore::Sqlite(_) => raw1,
        BenchStore::Postgres(_) => raw_rate(store, &handle, loads, 8, 2_000_000).await?,
    };
    f.insert("runs_per_s_1_writer".into(), one);
    f.insert("runs_per_s_8_writers".into(), eight);
    f.insert("raw_per_s_1_writer".into(), raw1);
    f.insert("raw_per_s_8_writers".into(), raw8);
    f.insert("ratio_1_writer".into(), one / raw1);
    f.insert("ratio_8_writers".into(), eight / raw8);
    f.insert("ratio".into(), eight.max(one) / raw8.max(raw1));
    Ok(f)
}

/// A realistic log of `n` records: pings and their decisions, some with actions.
async fn fill_log(s: &Arc<dyn Store>, l: &LoadId, n: usize) -> anyhow::Result<()> {
    let now = SystemClock.now();
    let mut version = 0u64;
    let mut i = 0usize;
    while (version as usize) < n {
        let (entries, _) = run_rows(l, i, now);
        version = s.append(l, entries, version, vec![], now).await?;
        i += 1;
    }
    Ok(())
}

async fn projection(store: &BenchStore) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let (s, _) = fresh_store(store, "projection").await?;
    let now = SystemClock.now();
    let mut per_run = Vec::new();
    for n in [100usize, 1_000, 10_000] {
        let l = load(n);
        fill_log(&s, &l, n).await?;
        // The full fold, as a run without a snapshot (a cold cache) pays it.
        let reps = (100_000 / n).clamp(3, 100);
        let started = Instant::now();
        for _ in 0..reps {
            let (records, _) = s.read(&l).await?;
            std::hint::black_box(project(&records));
        }
        f.insert(format!("full_fold_ms_{n}"), started.elapsed().as_secs_f64() * 1000.0 / reps as f64);
        // A run as the worker makes it: the cached snapshot caught up with what was
        // appended since (here one more run's two entries), then put back.
        let projector = haul_runtime::projector::Projector::new(s.clone(), 16);
        let mut state = projector.take(&l, None).await?;
        let mut took = Duration::ZERO;
        let runs = 200;
        for i in 0..runs {
            let (entries, _) = run_rows(&l, 1_000_000 + i, now);
            s.append(&l, entries, state.version, vec![], now).await?;
            projector.put(&l, state);
            let t = Instant::now();
            state = projector.take(&l, None).await?;
            took += t.elapsed();
        }
        let full = project(&s.read(&l).await?.0);
        anyhow::ensure!(state == full, "the snapshot caught up is not the full fold at {n} entries");
        let ms = took.as_secs_f64() * 1000.0 / runs as f64;
        f.insert(format!("read_project_ms_{n}"), ms);
        per_run.push(ms);
    }
    // Per run, how much more 10,000 entries cost than 100 (1 = flat, 100 = linear).
    f.insert("growth_10000_vs_100".into(), per_run[2] / per_run[0]);
    Ok(f)
}

/// The SOP with a small think time, counting its calls: a decision that does not
/// commit is wasted work (an LLM call, in production).
struct Counting {
    sop: SopDecider,
    calls: AtomicUsize,
    think: Duration,
}

#[async_trait::async_trait]
impl Decider for Counting {
    fn name(&self) -> String {
        "sop".into()
    }

    async fn decide(
        &self,
        l: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> anyhow::Result<Decision> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.think).await;
        self.sop.decide(l, state, event, now).await
    }
}

/// Eight workers (as eight processes) handed events of one load at once.
async fn contention_round(store: &BenchStore, load_lock: bool, events: usize) -> anyhow::Result<(f64, usize)> {
    let (s, _) = fresh_store(store, "contention").await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let decider = Arc::new(Counting {
        sop: SopDecider { policies: Default::default() },
        calls: AtomicUsize::new(0),
        think: Duration::from_millis(5),
    });
    let settings = WorkerSettings { load_lock, ..WorkerSettings::default() };
    let l = LoadId::parse("HOT")?;
    let msg = |i: usize| {
        let ev = InboundEvent::from_json(
            l.clone(),
            json!({"event_id": format!("s{i}"), "kind": "inbound_sms", "from": "+15555550199", "body": "hello"}),
        )
        .expect("valid event");
        Received::of_event(ev, "0.bench", clock.now())
    };
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..8 {
        let worker = Arc::new(Worker::new(
            s.clone(),
            s.clone() as Arc<dyn LoadQueue>,
            QueueMode::StoreQueue,
            decider.clone(),
            clock.clone(),
            settings.clone(),
            Faults::default(),
        ));
        let mine: Vec<Received> = (w..events).step_by(8).map(msg).collect();
        tasks.spawn(async move {
            for m in mine {
                // Busy (the lease is held) or left for redelivery: the queue would hand
                // it back; here it comes back after a short wait.
                loop {
                    match worker.process(m.clone()).await {
                        RunOutcome::Committed { .. } | RunOutcome::AlreadyProcessed | RunOutcome::Duplicate => break,
                        _ => tokio::time::sleep(Duration::from_millis(2)).await,
                    }
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    let calls = decider.calls.load(Ordering::SeqCst);
    let committed = s.read(&l).await?.0.iter().filter(|r| r.decision().is_some()).count();
    anyhow::ensure!(committed == events, "{committed} of {events} events committed");
    Ok(((calls - committed) as f64 / committed as f64, committed))
}

async fn contention(store: &BenchStore) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let (without, _) = contention_round(store, false, 80).await?;
    let (with, _) = contention_round(store, true, 80).await?;
    f.insert("wasted_per_committed_without_lock".into(), without);
    f.insert("wasted_per_committed_with_lock".into(), with);
    Ok(f)
}

/// Runs one workload; adds its peak memory.
pub async fn run_workload(name: &str, store: &BenchStore, quick: bool) -> anyhow::Result<Figures> {
    reset_peak_rss();
    let f = match name {
        "append" => append(store, if quick { 1_000 } else { 10_000 }).await,
        "projection" => projection(store).await,
        "contention" => contention(store).await,
        "e2e" => e2e(store, quick).await,
        "e2e-http" => e2e_http::e2e_http(store, quick).await,
        "dispatch" => dispatch(store, if quick { 2_000 } else { 20_000 }).await,
        "timers" => timers(store, if quick { 50_000 } else { 1_000_000 }, if quick { 1_000 } else { 10_000 }).await,
        "replay" => replay(store, if quick { 1_000 } else { 10_000 }).await,
        "burst" => burst(store, if quick { 500 } else { 5_000 }).await,
        other => anyhow::bail!("unknown workload {other:?} (one of {})", WORKLOADS.join(", ")),
    }
    .with_context(|| format!("workload {name}"));
    if let BenchStore::Postgres(url) = store {
        drop_schemas_made(url).await;
    }
    let mut f = f?;
    f.insert("peak_rss_mib".into(), peak_rss_mib());
    Ok(f)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The whole pipeline in one process (store-backed queue, SOP, record mode), with the
/// serve loops: events offered at a fixed rate, then all at once (saturation). At
/// saturation also with the timers sent through the outbox (the route an external
/// TimerStore takes, and every build before timers went into the append), with what
/// each ETA ask costs on both routes counted in the store.
async fn e2e(store: &BenchStore, quick: bool) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let rate = 200.0;
    let seconds = if quick { 2.0 } else { 5.0 };
    let fixed = e2e_round(store, (rate * seconds) as usize, Some(rate), TimerRoute::WithDecision).await?;
    f.insert("offered_events_per_s".into(), rate);
    f.insert("runs_per_s_fixed_rate".into(), fixed.runs_per_s);
    f.insert("p50_ms_fixed_rate".into(), percentile(&fixed.latencies_ms, 0.5));
    f.insert("p99_ms_fixed_rate".into(), percentile(&fixed.latencies_ms, 0.99));
    let events = if quick { 500 } else { 2_000 };
    for (route, tag) in [(TimerRoute::WithDecision, ""), (TimerRoute::Outbox, "_timers_via_outbox")] {
        let sat = e2e_round(store, events, None, route).await?;
        f.insert(format!("runs_per_s_saturation{tag}"), sat.runs_per_s);
        f.insert(format!("asks_per_s_saturation{tag}"), sat.asks_per_s);
        f.insert(format!("p50_ms_saturation{tag}"), percentile(&sat.latencies_ms, 0.5));
        f.insert(format!("p99_ms_saturation{tag}"), percentile(&sat.latencies_ms, 0.99));
        f.insert(format!("outbox_rows_per_ask{tag}"), sat.outbox_rows_per_ask);
        f.insert(format!("worker_runs_per_ask{tag}"), sat.runs_per_ask);
        if let Some(row_writes) = sat.row_writes_per_load {
            f.insert(format!("row_writes_per_load{tag}"), row_writes);
        }
    }
    Ok(f)
}

/// PostgreSQL's own count of the rows written in the database (inserted, updated,
/// deleted), as its statistics have them. (Its count of transactions would include
/// the round's polls, which only read.)
async fn rows_written(url: &str) -> anyhow::Result<f64> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    // Backends report their counts when idle, at most a second late.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = client
        .query_one(
            "SELECT (tup_inserted + tup_updated + tup_deleted)::float8
             FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// One e2e round's figures.
struct E2eRound {
    runs_per_s: f64,
    /// ETA asks (pings that opened one) made, sent and timed per second.
    asks_per_s: f64,
    /// Publish → delivered-SMS-outcome, in ms.
    latencies_ms: Vec<f64>,
    /// Outbox rows and worker runs (events the queue carried) per ask, the load's
    /// `load_update` not counted.
    outbox_rows_per_ask: f64,
    runs_per_ask: f64,
    /// On PostgreSQL: rows written in the database per load (its `load_update` and its
    /// ask: log, outbox, queue, timers, summaries), from PostgreSQL's statistics.
    row_writes_per_load: Option<f64>,
}

/// Publishes `events` high-risk pings on distinct loads (each load first gets its
/// `load_update`); each ping opens an ETA ask: an SMS and a timer. Done when every SMS
/// is delivered, every timer scheduled and the queue empty.
async fn e2e_round(
    store: &BenchStore,
    events: usize,
    rate: Option<f64>,
    route: TimerRoute,
) -> anyhow::Result<E2eRound> {
    let (s, _) = fresh_store(store, "e2e").await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let config = haul_config::Config::default();
    let channels = haul_runtime::channels::Channels::from_config(&config, s.clone(), &Default::default())?;
    let parts = haul_runtime::pipeline::Parts {
        store: s.clone(),
        queue: s.clone(),
        queue_mode: QueueMode::StoreQueue,
        channels,
        clock: clock.clone(),
        faults: Faults::default(),
        seed: None,
    };
    let p = haul_runtime::pipeline::Pipeline::with_timers(&config, parts, None, route);
    let rows_before = match store {
        BenchStore::Postgres(url) => Some(rows_written(url).await?),
        BenchStore::Sqlite(_) => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (wake_worker, wake_dispatcher) = p.wakeups();
    p.hand_claims_over();
    // The publishers hand what they publish to an idle load to the worker, as the API does.
    let events_in = haul_runtime::queue::EventQueue::new(s.clone()).handing_to(p.worker.event_handoff());
    let mut loops = tokio::task::JoinSet::new();
    loops.spawn(haul_runtime::loops::worker_loop(
        p.worker.clone(),
        config.worker.concurrency,
        wake_worker.clone(),
        stop_rx.clone(),
    ));
    loops.spawn(haul_runtime::loops::dispatcher_loop(p.dispatcher.clone(), wake_dispatcher, stop_rx.clone()));
    let started = Instant::now();
    // Publishers run as the API's requests do: concurrently (a bounded number).
    let publishers = Arc::new(tokio::sync::Semaphore::new(32));
    let mut publishing = tokio::task::JoinSet::new();
    for i in 0..events {
        if let Some(r) = rate {
            let due = Duration::from_secs_f64(i as f64 / r);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        let permit = publishers.clone().acquire_owned().await?;
        let (events_in, clock, wake) = (events_in.clone(), clock.clone(), wake_worker.clone());
        publishing.spawn(async move {
            let l = load(i);
            let init = json!({"event_id": "load:init", "kind": "load_update", "driver_phone": "+15555550100", "stage": "in_transit"});
            let ping = json!({"event_id": "ping", "kind": "location_ping", "lat": 41.0, "lon": -87.0, "risk": "high", "at": clock.now().to_string()});
            for v in [init, ping] {
                let ev = InboundEvent::from_json(l.clone(), v)?;
                if !events_in.publish_handing(&ev, None, clock.now()).await?.1 {
                    wake.notify_one();
                }
            }
            drop(permit);
            anyhow::Ok(())
        });
    }
    while let Some(r) = publishing.join_next().await {
        r??;
    }
    // Done when every row is dispatched and the queue is empty. Cheapest check first:
    // the poll runs on the store under test every 5 ms, and counting dispatched rows
    // scans the outbox (it was about a tenth of the writer thread's work).
    let rows_per_ask = match route {
        TimerRoute::WithDecision => 1,
        TimerRoute::Outbox => 2,
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if s.depth().await? == 0
            && s.count_by_status(OutboxStatus::Pending).await? == 0
            && s.count_by_status(OutboxStatus::Dispatched).await? as usize == rows_per_ask * events
            && s.depth().await? == 0
        {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the pipeline did not finish");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    while loops.join_next().await.is_some() {}
    let row_writes_per_load = match (store, rows_before) {
        (BenchStore::Postgres(url), Some(before)) => Some((rows_written(url).await? - before) / events as f64),
        _ => None,
    };
    let mut lat = Vec::with_capacity(events);
    let (mut runs, mut rows, mut scheduled) = (0, 0, 0);
    for i in 0..events {
        let recs = s.read(&load(i)).await?.0;
        // A worker run per event the queue carried: not the outcomes the ping's own
        // run settled in its append.
        runs += recs
            .iter()
            .filter(|r| match r.event() {
                Some((_, EventBody::ActionOutcome(o))) => o.receipt.as_deref() != Some(timers::RECEIPT),
                other => other.is_some(),
            })
            .count();
        rows += s.rows_for_load(&load(i)).await?.len();
        scheduled += s.timers_for_load(&load(i)).await?.len();
        let ping_at = recs.iter().find(|r| r.entry_id == "ping").and_then(|r| match r.event() {
            Some((_, EventBody::LocationPing(p))) => p.at,
            _ => None,
        });
        let out = recs.iter().find(|r| r.entry_id.ends_with("/send_sms:delivered")).map(|r| r.recorded_at);
        if let (Some(a), Some(b)) = (ping_at, out) {
            lat.push((b.as_millisecond() - a.as_millisecond()) as f64);
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    anyhow::ensure!(scheduled == events, "{scheduled} timers scheduled for {events} asks");
    // Each ask's own runs: the ping's and its outcomes' (each load's load_update aside).
    let asks = events as f64;
    Ok(E2eRound {
        runs_per_s: runs as f64 / elapsed,
        asks_per_s: asks / elapsed,
        latencies_ms: lat,
        outbox_rows_per_ask: rows as f64 / asks,
        runs_per_ask: (runs - events) as f64 / asks,
        row_writes_per_load,
    })
}

/// Outbox rows delivered to an HTTP sink on 127.0.0.1 that dedupes, with 1 and 4
/// dispatchers running `haul serve`'s dispatcher loop, against bare HTTP posts of the
/// same bodies to the same sink.
///
/// The first tenth of the rows is dispatched untimed: each new session plans the
/// store's statements on their first execution (tens of milliseconds each on
/// PostgreSQL), which a running dispatcher pays once and a run of a few seconds would
/// count. Progress is counted at the sink; the store is asked once the sink holds every
/// row, until the last one is marked.
async fn dispatch(store: &BenchStore, rows: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let sink = crate::testkit::FakeServices::start(None).await?;
    // The limit: the same number of POSTs, 32 at a time, with the same client, right
    // before and right after the timed phase of 4 dispatchers (this machine's speed
    // drifts over a minute, by a third at times: measured seconds apart, the figures
    // would not share one window).
    let client = haul_runtime::channels::http_client()?;
    let url = format!("{}/v1/messages", sink.base_url(haul_core::Channel::Sms));
    let body: Value = json!({"to": "+15555550100", "body": "Hi, this is dispatch. What is your ETA?", "load_id": "B1"});
    let mut raw = Vec::new();
    for dispatchers in [1usize, 4] {
        let (s, _) = fresh_store(store, "dispatch").await?;
        let now = SystemClock.now();
        // The rows, appended 32 at a time (the set-up, not measured).
        append_sms_rows(&s, (0..rows).map(|i| load(dispatchers * 1_000_000 + i)).collect(), now).await?;
        if dispatchers == 4 {
            raw.push(bare_posts(&client, &url, &body, rows).await?);
        }
        // The loop `haul serve` runs (sends kept going, rows claimed as they free).
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let tasks = spawn_dispatchers(&s, &sink, dispatchers as u64, None, &stop_rx)?;
        // Progress is counted at the sink (a query of the outbox every few milliseconds
        // would be the store's busiest client); the clock stops when the last row is
        // marked, which the store is asked only once the sink holds every row.
        let deadline = Instant::now() + Duration::from_secs(300);
        let delivered_before = sink.effect_count();
        let delivered = async || -> anyhow::Result<usize> {
            anyhow::ensure!(Instant::now() < deadline, "the dispatchers did not finish the rows");
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(sink.effect_count() - delivered_before)
        };
        // The warm-up: the first tenth, untimed.
        let mut sent = delivered().await?;
        while sent < rows / 10 {
            sent = delivered().await?;
        }
        let (started, timed) = (Instant::now(), rows - sent);
        while sent < rows {
            sent = delivered().await?;
        }
        until_marked(&s, deadline, Duration::from_millis(1)).await?;
        let secs = started.elapsed().as_secs_f64();
        stop_dispatchers(stop_tx, tasks).await?;
        if dispatchers == 4 {
            raw.push(bare_posts(&client, &url, &body, rows).await?);
        }
        anyhow::ensure!(
            s.count_by_status(OutboxStatus::Dispatched).await? as usize == rows,
            "not every row was dispatched"
        );
        f.insert(format!("rows_per_s_{dispatchers}_dispatchers"), timed as f64 / secs);
    }
    let raw = raw.iter().sum::<f64>() / raw.len() as f64;
    f.insert("raw_posts_per_s".into(), raw);
    f.insert("ratio_4_dispatchers".into(), f["rows_per_s_4_dispatchers"] / raw);
    Ok(f)
}

/// One SMS row per load of `loads` (a ping, its decision, the row), appended 32 at a time.
async fn append_sms_rows(s: &Arc<dyn Store>, loads: Vec<LoadId>, now: Timestamp) -> anyhow::Result<()> {
    append_client_sms_rows(s, loads.into_iter().map(|l| (l, None)).collect(), now).await
}

/// [`append_sms_rows`], each load with its client (named by a `load_update` first).
async fn append_client_sms_rows(
    s: &Arc<dyn Store>,
    loads: Vec<(LoadId, Option<&'static str>)>,
    now: Timestamp,
) -> anyhow::Result<()> {
    let mut appends = tokio::task::JoinSet::new();
    for (i, l) in loads.into_iter().enumerate() {
        if appends.len() >= 32
            && let Some(r) = appends.join_next().await
        {
            r??;
        }
        let s = s.clone();
        let (l, client) = l;
        appends.spawn(async move {
            let (mut entries, outbox) = run_rows(&l, i, now);
            if let Some(client) = client {
                entries.insert(0, NewEntry::stored("load:init", "load_update", json!({"client": client})));
            }
            let sms = outbox.into_iter().filter(|o| o.action_type == ActionType::SendSms).collect();
            s.append(&l, entries, 0, sms, now).await.map(drop)
        });
    }
    while let Some(r) = appends.join_next().await {
        r??;
    }
    Ok(())
}

/// `n` dispatcher loops on `s`, `sms` the SMS channel's limit, stopped by `stop`.
fn spawn_dispatchers(
    s: &Arc<dyn Store>,
    sink: &crate::testkit::FakeServices,
    n: u64,
    sms: Option<haul_core::limit::Limit>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinSet<()>> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let channels = sink.channels(None, Duration::from_secs(5))?;
    let mut tasks = tokio::task::JoinSet::new();
    for d in 0..n {
        let settings = haul_runtime::dispatcher::DispatcherSettings {
            jitter_seed: Some(d),
            limits: haul_core::PerChannel::from_fn(|c| if c == haul_core::Channel::Sms { sms } else { None }),
            ..haul_runtime::dispatcher::DispatcherSettings::default()
        };
        let disp = Arc::new(haul_runtime::dispatcher::Dispatcher::new(
            s.clone(),
            s.clone() as Arc<dyn LoadQueue>,
            QueueMode::StoreQueue,
            channels.clone(),
            clock.clone(),
            settings,
            Faults::default(),
        ));
        let wake = Arc::new(tokio::sync::Notify::new());
        tasks.spawn(haul_runtime::loops::dispatcher_loop(disp, wake, stop.clone()));
    }
    Ok(tasks)
}

/// `burst`: a morning burst against an SMS rate (docs/design.md, "Send rates"): `a_rows`
/// routine SMS of client_a and 10 of client_b (each load's client named by a
/// `load_update`), all due at once, client_b's last in claim order, sent by 2
/// dispatchers (sharing the rate and the clients' queues through the store, as
/// processes would) at 50/s, burst 5; 2 s in, an urgent Hero task (a channel with no rate). At
/// the sink, counted per second of real time: the most SMS any second saw (against
/// the rate's own bound, burst + 50), when B's last SMS and the Hero task arrived,
/// and how many rows died (none should).
async fn burst(store: &BenchStore, a_rows: usize) -> anyhow::Result<Figures> {
    const B_ROWS: usize = 10;
    let rate = haul_core::limit::Rate::parse("50/s").map_err(anyhow::Error::msg)?;
    let limit = haul_core::limit::Limit::new(rate, 5).map_err(anyhow::Error::msg)?;
    let mut f = Figures::new();
    let sink = crate::testkit::FakeServices::start(None).await?;
    let (s, _) = fresh_store(store, "burst").await?;
    let now = SystemClock.now();
    let client_load = |client: &'static str, i: usize| {
        let tag = if client == "client_a" { "A" } else { "B" };
        (LoadId::parse(&format!("C{tag}{i}")).expect("valid load id"), Some(client))
    };
    let loads = (0..a_rows)
        .map(|i| client_load("client_a", i))
        .chain((0..B_ROWS).map(|i| client_load("client_b", i)))
        .collect();
    append_client_sms_rows(&s, loads, now).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let tasks = spawn_dispatchers(&s, &sink, 2, Some(limit), &stop_rx)?;
    // The urgent Hero task, 2 s into the burst.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hero_load = LoadId::parse("CHERO")?;
    let key = format!("{hero_load}/ask:eta_request:p/2/create_hero_task");
    let action = json!({"key": key, "type": "create_hero_task", "ask_id": "ask:eta_request:p", "step": 2,
        "params": {"title": "Driver not answering", "body": "Call the driver", "urgency": "urgent"}});
    let entries = vec![NewEntry::stored("p", "location_ping", json!({}))];
    let hero_row = NewOutboxRow { id: key.clone(), action_type: ActionType::CreateHeroTask, action, trace: None };
    let hero_made = Instant::now();
    s.append(&hero_load, entries, 0, vec![hero_row], SystemClock.now()).await?;
    let all = a_rows + B_ROWS + 1;
    let deadline = Instant::now() + Duration::from_secs((a_rows / 50) as u64 + 120);
    while sink.effect_count() < all {
        anyhow::ensure!(Instant::now() < deadline, "the dispatchers did not send the burst");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_marked(&s, deadline, Duration::from_millis(5)).await?;
    stop_dispatchers(stop_tx, tasks).await?;
    let effects = sink.effects();
    let mut sms: Vec<Instant> = effects.iter().filter(|e| e.channel == "sms").map(|e| e.at).collect();
    sms.sort();
    let in_second_from = |i: usize| sms[i..].iter().take_while(|t| **t < sms[i] + Duration::from_secs(1)).count();
    let (most_from, most) = (0..sms.len()).map(|i| (i, in_second_from(i))).max_by_key(|(_, n)| *n).unwrap_or((0, 0));
    let since_start = |t: Instant| t.duration_since(started).as_secs_f64();
    // Also by whole seconds since the start, as a service counting per second would.
    let mut per_second: BTreeMap<u64, usize> = BTreeMap::new();
    for t in &sms {
        *per_second.entry(t.duration_since(started).as_secs()).or_default() += 1;
    }
    let b_last = effects.iter().filter(|e| e.key.starts_with("CB")).map(|e| e.at).max();
    let hero_at = effects.iter().find(|e| e.key == key).map(|e| e.at);
    f.insert("sms_rate_per_s".into(), limit.rate.per_second());
    f.insert("sms_max_in_any_second".into(), most as f64);
    f.insert("sms_max_in_any_second_from_s".into(), sms.get(most_from).map_or(f64::NAN, |t| since_start(*t)));
    f.insert("sms_max_in_a_whole_second".into(), per_second.values().copied().max().unwrap_or(0) as f64);
    f.insert("sms_allowed_in_any_second".into(), f64::from(limit.burst) + limit.rate.per_second());
    f.insert("sms_sent_per_s".into(), sms.len() as f64 / sms.last().map_or(1.0, |t| since_start(*t)));
    f.insert("b_last_sms_s".into(), b_last.map_or(f64::NAN, since_start));
    f.insert("urgent_hero_after_s".into(), hero_at.map_or(f64::NAN, |t| t.duration_since(hero_made).as_secs_f64()));
    f.insert("dead_rows".into(), s.count_by_status(OutboxStatus::Dead).await? as f64);
    f.insert("rows".into(), all as f64);
    // What the limiter costs when it never binds: the same rows sent by 2 dispatchers
    // with no rate and with one far above what they reach, in pairs, each pair's order
    // turned round from the last (this machine's speed drifts, and a pass leaves work
    // behind for the next: a pair's two passes compare, not passes far apart). The
    // cost is the median pair's; the best of each kind is kept too.
    let rows = a_rows * 4;
    let loose =
        haul_core::limit::Limit::new(haul_core::limit::Rate::parse("100000/s").map_err(anyhow::Error::msg)?, 10_000)
            .map_err(anyhow::Error::msg)?;
    let (mut free, mut rated, mut costs) = (0f64, 0f64, Vec::new());
    for pair in 0..LIMITER_PAIRS {
        let mut per_s = [0f64; 2];
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            per_s[i] = unbound_pass(store, &sink, rows, (i == 1).then_some(loose)).await?;
        }
        free = free.max(per_s[0]);
        rated = rated.max(per_s[1]);
        costs.push((1.0 - per_s[1] / per_s[0]) * 100.0);
    }
    costs.sort_by(f64::total_cmp);
    f.insert("unbound_rows_per_s_no_rate".into(), free);
    f.insert("unbound_rows_per_s_rate_not_binding".into(), rated);
    f.insert("limiter_cost_pct".into(), costs[costs.len() / 2]);
    f.insert("limiter_cost_pct_best_of_each".into(), (1.0 - rated / free) * 100.0);
    Ok(f)
}

/// Pairs of passes, with a rate and without, that measure what the limiter costs.
const LIMITER_PAIRS: usize = 11;

/// `rows` SMS rows sent by 2 dispatchers with `limit` on the SMS channel: rows per second.
async fn unbound_pass(
    store: &BenchStore,
    sink: &crate::testkit::FakeServices,
    rows: usize,
    limit: Option<haul_core::limit::Limit>,
) -> anyhow::Result<f64> {
    let (s, _) = fresh_store(store, "burst-unbound").await?;
    let tag = fastrand::u32(..);
    let loads = (0..rows).map(|i| LoadId::parse(&format!("U{tag}x{i}")).expect("valid load id")).collect();
    append_sms_rows(&s, loads, SystemClock.now()).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let before = sink.effect_count();
    let started = Instant::now();
    let tasks = spawn_dispatchers(&s, sink, 2, limit, &stop_rx)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while sink.effect_count() - before < rows {
        anyhow::ensure!(Instant::now() < deadline, "the dispatchers did not send the rows");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    until_marked(&s, deadline, Duration::from_millis(1)).await?;
    let secs = started.elapsed().as_secs_f64();
    stop_dispatchers(stop_tx, tasks).await?;
    Ok(rows as f64 / secs)
}

/// Waits, asking every `poll`, until no row of `s` is pending: every one marked.
async fn until_marked(s: &Arc<dyn Store>, deadline: Instant, poll: Duration) -> anyhow::Result<()> {
    while s.count_by_status(OutboxStatus::Pending).await? > 0 {
        anyhow::ensure!(Instant::now() < deadline, "the dispatchers did not mark the rows");
        tokio::time::sleep(poll).await;
    }
    Ok(())
}

/// Stops the dispatcher loops of [`spawn_dispatchers`] and waits for them to end.
async fn stop_dispatchers(
    stop: tokio::sync::watch::Sender<bool>,
    mut tasks: tokio::task::JoinSet<()>,
) -> anyhow::Result<()> {
    let _ = stop.send(true);
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    Ok(())
}

/// The physical limit of a sink: `posts` POSTs of `body` to `url`, 32 at a time, with
/// `client`, each with its own idempotency key. POSTs per second.
async fn bare_posts(client: &reqwest::Client, url: &str, body: &Value, posts: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..posts {
        let (client, url, body, sem) = (client.clone(), url.to_owned(), body.clone(), sem.clone());
        tasks.spawn(async move {
            let _p = sem.acquire_owned().await?;
            client
                .post(&url)
                .header("Idempotency-Key", format!("bare-{i}"))
                .json(&body)
                .send()
                .await?
                .error_for_status()?;
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(posts as f64 / started.elapsed().as_secs_f64())
}

/// `pending` timers, `due` of them firing within the next minute (the rest later), and
/// the timer pump polling every `timers.poll` (10 s) on the system clock: lag
/// (fired − `fire_at`) p50 and p99 against the target of poll + 1 s.
async fn timers(store: &BenchStore, pending: usize, due: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let (s, _) = fresh_store(store, "timers").await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let window = Duration::from_secs(60);
    let timer = |i: usize| -> anyhow::Result<haul_core::ids::TimerId> {
        let ask = haul_core::ids::AskId::parse(&format!("ask:eta_request:t{i}"))?;
        Ok(haul_core::ids::TimerId::new(&load(i % 10_000), &ask, 1))
    };
    // All but `due` a day out, then the `due` ones spread over the next minute.
    let started = Instant::now();
    let schedule = |from: usize, to: usize, fire: Arc<dyn Fn(usize) -> Timestamp + Send + Sync>| {
        let s = s.clone();
        async move {
            let writers = 32;
            let mut tasks = tokio::task::JoinSet::new();
            for w in 0..writers {
                let (s, fire) = (s.clone(), fire.clone());
                tasks.spawn(async move {
                    for i in (from + w..to).step_by(writers) {
                        s.schedule(&timer(i)?, fire(i), SystemClock.now()).await?;
                    }
                    anyhow::Ok(())
                });
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
            anyhow::Ok(())
        }
    };
    let far = haul_core::time::add(clock.now(), Duration::from_secs(86_400));
    schedule(due, pending, Arc::new(move |_| far)).await?;
    let start = clock.now();
    let spread =
        move |i: usize| haul_core::time::add(start, window.mul_f64(i as f64 / due as f64) + Duration::from_secs(2));
    schedule(0, due, Arc::new(spread)).await?;
    let setup_secs = started.elapsed().as_secs_f64();
    f.insert("setup_timers_per_s".into(), pending as f64 / setup_secs);
    let poll = Duration::from_secs(10);
    let pump = Arc::new(haul_runtime::pump::TimerPump::new(
        s.clone(),
        s.clone() as Arc<dyn LoadQueue>,
        clock.clone(),
        Faults::default(),
        256,
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let looping = tokio::spawn(haul_runtime::loops::pump_loop(pump, poll, 256, stop_rx));
    // Until the last due timer has had a full poll to fire.
    let last = haul_core::time::add(start, window + Duration::from_secs(2) + poll + Duration::from_secs(2));
    tokio::time::sleep(haul_core::time::since(last, clock.now())).await;
    let _ = stop_tx.send(true);
    looping.await?;
    let mut lags = Vec::with_capacity(due);
    for i in 0..due {
        let t = s.get_timer(&timer(i)?).await?.context("a due timer vanished")?;
        let fired = t.fired_at.with_context(|| format!("timer {} never fired", t.timer_id))?;
        lags.push((fired.as_millisecond() - t.fire_at.as_millisecond()) as f64 / 1000.0);
    }
    lags.sort_by(|a, b| a.total_cmp(b));
    f.insert("pending_timers".into(), pending as f64);
    f.insert("setup_seconds".into(), setup_secs);
    f.insert("lag_p50_s".into(), percentile(&lags, 0.5));
    f.insert("lag_p99_s".into(), percentile(&lags, 0.99));
    f.insert("target_p99_s".into(), poll.as_secs_f64() + 1.0);
    Ok(f)
}

/// One load's log as the worker writes it under the SOP: `load:init`, then `cycles`
/// rounds of a high-risk ping and its ask, the delivered outcomes, a timer asking
/// again, the driver's answer cancelling the timer, and a low-risk ping; 2 + 18 per
/// cycle records. Entries, and the time of the last.
fn sop_log(l: &LoadId, cycles: usize, t0: Timestamp) -> (Vec<NewEntry>, Timestamp) {
    use haul_core::projection::Record;
    let policies = haul_core::sop::Policies::default();
    let mut state = LoadState::default();
    let mut entries = Vec::new();
    let mut at = t0;
    let run = |ev: Value, now: Timestamp, state: &mut LoadState, entries: &mut Vec<NewEntry>| -> Decision {
        let ev = InboundEvent::from_json(l.clone(), ev).expect("a valid bench event");
        let d = haul_core::filter::filter(l, state, &ev, now)
            .unwrap_or_else(|| haul_core::sop::decide(&policies, l, state, &ev, now));
        for r in Record::appended(state.version, &ev, &d, now) {
            state.apply(&r);
            entries.push(NewEntry::of(&r));
        }
        d
    };
    let outcomes = |d: &Decision| -> Vec<Value> {
        d.actions
            .iter()
            .map(|a| {
                let receipt = match a.action_type() {
                    ActionType::SetTimer => "scheduled",
                    ActionType::CancelTimer => "canceled",
                    _ => "rec:1",
                };
                json!({"event_id": format!("evt:out:{}:delivered", a.key), "kind": "action_outcome", "outbox_id": a.key,
                       "action_type": a.action_type(), "status": "delivered", "receipt": receipt,
                       "internal": a.class() == haul_core::ChannelClass::Internal,
                       "hero_channel": a.class() == haul_core::ChannelClass::HeroChannel})
            })
            .collect()
    };
    let phone = "+15555550100";
    run(
        json!({"event_id": "load:init", "kind": "load_update", "client": "bench", "driver_phone": phone, "stage": "in_transit", "next_stop": "Gary, IN"}),
        at,
        &mut state,
        &mut entries,
    );
    for c in 0..cycles {
        at = haul_core::time::add(t0, Duration::from_secs(7200 * c as u64));
        let ping = format!("ping_{c}");
        let d = run(
            json!({"event_id": ping, "kind": "location_ping", "lat": 41.88, "lon": -87.63, "risk": "high", "at": at.to_string()}),
            at,
            &mut state,
            &mut entries,
        );
        for o in outcomes(&d) {
            run(o, at, &mut state, &mut entries);
        }
        let later = haul_core::time::add(at, Duration::from_secs(1800));
        let timer = d.actions.iter().find_map(|a| match &a.kind {
            haul_core::ActionKind::SetTimer { timer_id, fire_at, ask_id, step } => Some(json!({
                "event_id": format!("evt:tmr:{timer_id}"), "kind": "timer_fired", "timer_id": timer_id, "ask_id": ask_id,
                "step": step, "fire_at": fire_at.to_string()})),
            _ => None,
        });
        if let Some(t) = timer {
            let d = run(t, later, &mut state, &mut entries);
            for o in outcomes(&d) {
                run(o, later, &mut state, &mut entries);
            }
        }
        let answer = haul_core::time::add(at, Duration::from_secs(2400));
        let d = run(
            json!({"event_id": format!("sms_{c}"), "kind": "inbound_sms", "from": phone, "body": "ETA 9:15, on my way"}),
            answer,
            &mut state,
            &mut entries,
        );
        for o in outcomes(&d) {
            run(o, answer, &mut state, &mut entries);
        }
        at = haul_core::time::add(at, Duration::from_secs(3000));
        run(
            json!({"event_id": format!("low_{c}"), "kind": "location_ping", "lat": 41.0, "lon": -87.0, "risk": "low", "at": at.to_string()}),
            at,
            &mut state,
            &mut entries,
        );
    }
    (entries, at)
}

/// `haul replay` with the SOP over `loads` loads of 56 records, in decisions per second,
/// against reading and projecting the same logs through the same reader (the limit: a
/// replay reads and folds them too). Each measured twice, alternating; the better kept.
async fn replay(store: &BenchStore, loads: usize) -> anyhow::Result<Figures> {
    use crate::replay::{Candidate, ReplayOptions, read_and_project, replay};
    let mut f = Figures::new();
    let (s, handle) = fresh_store(store, "replay").await?;
    let t0: Timestamp = "2026-03-02T07:00:00Z".parse()?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let writers = 8;
    for w in 0..writers {
        let s = s.clone();
        tasks.spawn(async move {
            for i in (w..loads).step_by(writers) {
                let l = load(i);
                let (entries, last) = sop_log(&l, 3, t0);
                s.append(&l, entries, 0, vec![], last).await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    f.insert("setup_seconds".into(), started.elapsed().as_secs_f64());
    let url = match store {
        BenchStore::Sqlite(_) => handle,
        BenchStore::Postgres(url) => {
            let sep = if url.contains('?') { '&' } else { '?' };
            format!("{url}{sep}options=-csearch_path%3D{handle}")
        }
    };
    let reader = haul_backends::open_log_reader(&url).await?;
    let opts = ReplayOptions { show: 0, ..ReplayOptions::default() };
    let candidate = Candidate::Sop(haul_core::sop::Policies::default());
    let (mut project_rate, mut replay_rate, mut records_rate) = (0f64, 0f64, 0f64);
    let (mut records, mut decisions) = (0, 0);
    for _ in 0..2 {
        let t = Instant::now();
        (records, decisions) = read_and_project(reader.clone(), &opts).await?;
        let secs = t.elapsed().as_secs_f64();
        project_rate = project_rate.max(decisions as f64 / secs);
        records_rate = records_rate.max(records as f64 / secs);
        let t = Instant::now();
        let report = replay(reader.clone(), "bench", &candidate, &opts, |_| {}).await?;
        let secs = t.elapsed().as_secs_f64();
        anyhow::ensure!(
            report.summary.compared == decisions,
            "replay compared {} of {decisions}",
            report.summary.compared
        );
        anyhow::ensure!(report.summary.different == 0, "the same SOP differs: {:?}", report.summary);
        replay_rate = replay_rate.max(report.summary.compared as f64 / secs);
    }
    f.insert("loads".into(), loads as f64);
    f.insert("records".into(), records as f64);
    f.insert("decisions".into(), decisions as f64);
    f.insert("read_project_decisions_per_s".into(), project_rate);
    f.insert("read_project_records_per_s".into(), records_rate);
    f.insert("replay_decisions_per_s".into(), replay_rate);
    f.insert("ratio".into(), replay_rate / project_rate);
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The deltas the benchmark hands the append are the ones its entries really make.
    #[test]
    fn a_benchmark_runs_deltas_are_its_entries_own() {
        let now: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let (entries, _) = run_rows(&load(7), 3, now);
        assert_eq!(entries.len(), 2);
        for e in entries {
            let decoded = NewEntry::stored(e.entry_id.clone(), &e.kind, e.payload.clone());
            assert_eq!(e.derived, decoded.derived, "{}", e.entry_id);
        }
    }
}
