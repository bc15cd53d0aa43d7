//! `e2e-http`: one unit of work as a user sees it, end to end over real HTTP, against
//! real `haul serve` processes.
//!
//! The unit: a load with a driver and no open ask; a caller posts an `inbound_sms` to
//! `POST /v1/loads/{id}/events` with the token; the worker logs it with its decision (SOP
//! rule 5: a Hero task) and the outbox row; the dispatcher POSTs the task to a Hero sink
//! on 127.0.0.1; the delivered outcome is logged. Latency is the POST's start until the
//! sink holds the task; throughput counts units whose outcome is logged. Callers are
//! closed-loop (1, 16, 32), each owning a share of 1,000 loads so that no two callers
//! wait on one load's FIFO. Each round runs a tenth of its units untimed first, so the
//! clock measures servers whose sessions have prepared (and planned) their statements.
//!
//! The servers are child processes of this binary (`haul serve`), so what is measured is
//! what an operator runs: all roles in one process, and on PostgreSQL also the roles
//! split across processes (api / worker / dispatcher+pump) and, in a full run, scaled
//! out (1, 2 or 4 worker processes; 1 or 2 dispatcher processes). Beside each figure: the
//! bare limits measured in the same run (the bare driver's append rate and bare POSTs/s
//! to the same sink).

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::serve::ListenerExt;
use haul_store::OutboxStatus;
use serde_json::{Value, json};

use super::{BenchStore, Figures, percentile};

/// The API token the child servers are started with.
const TOKEN: &str = "bench-e2e-http";
/// How long a child server may take to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one unit may take before the run is declared broken.
const UNIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The Hero task service: deduplicates on `Idempotency-Key` (as the wire contract asks)
/// and tells the caller waiting on that load the first time its task arrives.
#[derive(Default)]
struct Sink {
    seen: Mutex<HashSet<String>>,
    waiting: Mutex<HashMap<String, tokio::sync::oneshot::Sender<Instant>>>,
}

async fn task(
    axum::extract::State(sink): axum::extract::State<Arc<Sink>>,
    headers: axum::http::HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> (axum::http::StatusCode, axum::Json<Value>) {
    let held = Instant::now();
    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let first = sink.seen.lock().map(|mut seen| seen.insert(key.clone())).unwrap_or(false);
    if first
        && let Some(load) = body["load_id"].as_str()
        && let Some(tx) = sink.waiting.lock().ok().and_then(|mut w| w.remove(load))
    {
        let _ = tx.send(held);
    }
    (axum::http::StatusCode::CREATED, axum::Json(json!({ "id": key })))
}

async fn start_sink() -> anyhow::Result<(String, Arc<Sink>)> {
    let sink = Arc::new(Sink::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/v1/tasks", axum::routing::post(task))
        .route("/v1/messages", axum::routing::post(|| async { axum::http::StatusCode::CREATED }))
        .with_state(sink.clone());
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), sink))
}

fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `haul serve` processes on one store; dropped, they are killed.
struct Servers {
    children: Vec<tokio::process::Child>,
    api: String,
}

impl Servers {
    /// One process per entry of `roles` (`"api,worker,dispatcher,pump"` is all in one);
    /// the first must hold the api role.
    async fn start(
        store_url: &str,
        hero_url: &str,
        roles: &[&str],
        env: &[(String, String)],
    ) -> anyhow::Result<Servers> {
        let exe = std::env::current_exe().context("finding the haul binary")?;
        let client = reqwest::Client::new();
        let mut servers = Servers { children: Vec::new(), api: String::new() };
        for (i, r) in roles.iter().enumerate() {
            let addr = free_addr()?;
            let child = tokio::process::Command::new(&exe)
                .args(["serve", "--roles", r, "--listen", &addr.to_string()])
                .env("HAUL_STORE_URL", store_url)
                .env("HAUL_CHANNELS_HERO_URL", hero_url)
                .env("HAUL_API_TOKEN", TOKEN)
                .env("HAUL_LOG", "warn")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {} serve --roles {r}", exe.display()))?;
            servers.children.push(child);
            let base = format!("http://{addr}");
            let started = Instant::now();
            loop {
                if client.get(format!("{base}/healthz")).send().await.is_ok_and(|a| a.status().is_success()) {
                    break;
                }
                anyhow::ensure!(started.elapsed() < START_TIMEOUT, "haul serve --roles {r} did not start");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if i == 0 {
                servers.api = base;
            }
        }
        Ok(servers)
    }
}

impl Servers {
    /// SIGTERM to each, then waits for each to exit (its shutdown grace and a little).
    async fn stop(mut self) {
        for child in &self.children {
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            }
        }
        for child in &mut self.children {
            let _ = tokio::time::timeout(Duration::from_secs(15), child.wait()).await;
        }
    }
}

fn load_id(i: usize) -> String {
    format!("H{i}")
}

async fn post_event(client: &reqwest::Client, api: &str, load: &str, event: Value) -> anyhow::Result<()> {
    let answer = client
        .post(format!("{api}/v1/loads/{load}/events"))
        .bearer_auth(TOKEN)
        .json(&event)
        .send()
        .await
        .context("POST /v1/loads/{id}/events")?;
    let status = answer.status();
    anyhow::ensure!(status.is_success(), "POST /v1/loads/{load}/events: {status}: {}", answer.text().await?);
    Ok(())
}

/// Waits until the queue is empty and `dispatched` rows are dispatched: every unit's
/// outcome is then in its log.
async fn settled(store_url: &str, dispatched: usize) -> anyhow::Result<()> {
    let s = haul_backends::open(store_url, None).await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if s.count_by_status(OutboxStatus::Dispatched).await? as usize >= dispatched
            && s.count_by_status(OutboxStatus::Pending).await? == 0
            && s.depth().await? == 0
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the servers did not finish the units");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One round: `callers` closed-loop callers doing `units` units in all on `loads` loads
/// of a fresh store. Returns units/s (outcomes logged), latencies in ms and, with
/// `meter` on PostgreSQL, what one unit cost (`Budget`).
async fn round(
    store: &BenchStore,
    roles: &[&str],
    loads: usize,
    callers: usize,
    units: usize,
    env: &[(String, String)],
    meter: bool,
) -> anyhow::Result<(f64, Vec<f64>, Option<Budget>)> {
    let store_url = match store {
        BenchStore::Sqlite(_) => super::fresh_store(store, "e2e-http").await?.1,
        BenchStore::Postgres(url) => {
            let (schema, store_url) = haul_postgres::scratch::fresh_schema_url(url).await?;
            super::made_schema(&schema);
            store_url
        }
    };
    // The schema is made here, not by several servers starting at once.
    drop(haul_backends::open(&store_url, None).await?);
    let (hero_url, sink) = start_sink().await?;
    let servers = Servers::start(&store_url, &hero_url, roles, env).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    // Each load: a driver, no ask open.
    let sem = Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..loads {
        let (client, api, sem) = (client.clone(), servers.api.clone(), sem.clone());
        tasks.spawn(async move {
            let _p = sem.acquire_owned().await?;
            let ev = json!({"event_id": "init", "kind": "load_update", "driver_phone": "+15555550100", "stage": "in_transit"});
            post_event(&client, &api, &load_id(i), ev).await
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    settled(&store_url, 0).await?;
    // Warm-up, untimed: every session of the servers' pools prepares its statements (on
    // PostgreSQL a session plans each statement once, some 5 to 20 ms of server CPU for
    // one over the partitioned tables), as long-running servers have.
    let warm_up = (units / 10).max(callers);
    drive(&client, &servers.api, &sink, "w", loads, callers, warm_up).await?;
    settled(&store_url, warm_up).await?;
    let dispatched_before =
        haul_backends::open(&store_url, None).await?.count_by_status(OutboxStatus::Dispatched).await? as usize;

    let pids: Vec<u32> = servers.children.iter().filter_map(tokio::process::Child::id).collect();
    let before = match (meter, store) {
        (true, BenchStore::Postgres(_)) => Some(Meter::sample(&store_url, &pids).await?),
        _ => None,
    };
    let started = Instant::now();
    let lat = drive(&client, &servers.api, &sink, "u", loads, callers, units).await?;
    settled(&store_url, dispatched_before + units).await?;
    let secs = started.elapsed().as_secs_f64();
    let budget = match before {
        Some(before) => Some(Meter::sample(&store_url, &pids).await?.since(&before, units)),
        None => None,
    };
    if env.is_empty() {
        drop(servers);
    } else {
        // Stopped as an operator stops them (SIGTERM), so each exports what it queued.
        servers.stop().await;
    }
    Ok((units as f64 / secs, lat, budget))
}

/// What one unit cost on PostgreSQL, from the server's statistics and the processes'
/// CPU times over a metered round (its outcomes' runs included; the harness's own
/// polls while it waits for the last outcomes, a few, too).
struct Budget {
    commits: f64,
    wal_bytes: f64,
    /// Statements executed (pg_stat_statements' calls), when the database has it.
    statements: Option<f64>,
    /// PostgreSQL's processes, all of them (the backends, the WAL writer, the
    /// checkpointer, autovacuum), when they run on this machine.
    pg_cpu_us: Option<f64>,
    /// The `haul serve` processes.
    haul_cpu_us: f64,
    /// This process: the callers, the sink and (traced) the OTLP receiver.
    bench_cpu_us: f64,
}

impl Budget {
    fn figures(&self, f: &mut Figures) {
        f.insert("budget_commits_per_unit".into(), self.commits);
        f.insert("budget_wal_bytes_per_unit".into(), self.wal_bytes);
        f.insert("budget_haul_cpu_us_per_unit".into(), self.haul_cpu_us);
        if let Some(n) = self.statements {
            f.insert("budget_statements_per_unit".into(), n);
        }
        if let Some(us) = self.pg_cpu_us {
            f.insert("budget_pg_cpu_us_per_unit".into(), us);
        }
    }
}

/// Counters read at the start and at the end of a metered round.
struct Meter {
    commits: f64,
    wal_bytes: f64,
    statements: Option<f64>,
    pg_cpu_ticks: Option<u64>,
    haul_cpu_ticks: u64,
    bench_cpu_ticks: u64,
}

/// `/proc`'s CPU times are in clock ticks of 1/100 s (`USER_HZ`, 100 on Linux).
const TICK_US: f64 = 10_000.0;

impl Meter {
    async fn sample(store_url: &str, pids: &[u32]) -> anyhow::Result<Meter> {
        let (client, conn) = tokio_postgres::connect(store_url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        // Backends report their counts when idle, at most a second late.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let row = client
            .query_one(
                "SELECT xact_commit::float8, (SELECT wal_bytes::float8 FROM pg_stat_wal)
                 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await?;
        let statements = client
            .query_one(
                "SELECT coalesce(sum(calls), 0)::float8 FROM public.pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .ok()
            .map(|r| r.get(0));
        let haul_cpu_ticks = pids.iter().filter_map(|p| cpu_ticks(&format!("/proc/{p}/stat"), false)).sum();
        Ok(Meter {
            commits: row.get(0),
            wal_bytes: row.get(1),
            statements,
            pg_cpu_ticks: postgres_cpu_ticks(),
            haul_cpu_ticks,
            bench_cpu_ticks: cpu_ticks("/proc/self/stat", false).unwrap_or(0),
        })
    }

    fn since(&self, before: &Meter, units: usize) -> Budget {
        let per = |n: f64| n / units as f64;
        let ticks = |a: u64, b: u64| per(a.saturating_sub(b) as f64 * TICK_US);
        Budget {
            commits: per(self.commits - before.commits),
            wal_bytes: per(self.wal_bytes - before.wal_bytes),
            statements: self.statements.zip(before.statements).map(|(a, b)| per(a - b)),
            pg_cpu_us: self.pg_cpu_ticks.zip(before.pg_cpu_ticks).map(|(a, b)| ticks(a, b)),
            haul_cpu_us: ticks(self.haul_cpu_ticks, before.haul_cpu_ticks),
            bench_cpu_us: ticks(self.bench_cpu_ticks, before.bench_cpu_ticks),
        }
    }
}

/// User and system CPU ticks from a `/proc/<pid>/stat` line, with its reaped
/// children's when `children` (how a backend that exited still counts: in its
/// postmaster's).
fn cpu_ticks(path: &str, children: bool) -> Option<u64> {
    stat_ticks(&std::fs::read_to_string(path).ok()?, children)
}

fn stat_ticks(stat: &str, children: bool) -> Option<u64> {
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    // Fields 14 to 17 (utime, stime, cutime, cstime), counted from the pid as 1.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let own = field(14)? + field(15)?;
    Some(if children { own + field(16)? + field(17)? } else { own })
}

/// Every `postgres` process's CPU ticks and its reaped children's; `None` when this
/// machine runs none (the server is elsewhere).
fn postgres_cpu_ticks() -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if stat.contains(" (postgres) ") {
            *total.get_or_insert(0) += stat_ticks(&stat, true).unwrap_or(0);
        }
    }
    total
}

/// `callers` closed-loop callers doing `units` units in all (event ids `{tag}{caller}_{n}`),
/// each caller on its own loads round-robin. Returns the latencies in ms, sorted.
async fn drive(
    client: &reqwest::Client,
    api: &str,
    sink: &Arc<Sink>,
    tag: &'static str,
    loads: usize,
    callers: usize,
    units: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..callers {
        let (client, api, sink) = (client.clone(), api.to_owned(), sink.clone());
        let mine: Vec<usize> = (c..loads).step_by(callers).collect();
        let count = units / callers + usize::from(c < units % callers);
        tasks.spawn(async move {
            let mut lat = Vec::with_capacity(count);
            for n in 0..count {
                let load = load_id(mine[n % mine.len()]);
                let (tx, rx) = tokio::sync::oneshot::channel();
                sink.waiting.lock().map_err(|_| anyhow::anyhow!("sink lock poisoned"))?.insert(load.clone(), tx);
                let sent = Instant::now();
                let ev = json!({"event_id": format!("{tag}{c}_{n}"), "kind": "inbound_sms", "from": "+15555550199",
                    "body": format!("Gate code for the dock is {n}")});
                post_event(&client, &api, &load, ev).await?;
                let held = tokio::time::timeout(UNIT_TIMEOUT, rx)
                    .await
                    .with_context(|| format!("no Hero task for {load} within {}s", UNIT_TIMEOUT.as_secs()))??;
                lat.push(held.duration_since(sent).as_secs_f64() * 1000.0);
            }
            anyhow::Ok(lat)
        });
    }
    let mut lat = Vec::with_capacity(units);
    while let Some(r) = tasks.join_next().await {
        lat.extend(r??);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    Ok(lat)
}

/// Bare POSTs/s to a sink like the Hero one, 32 at a time, with one client.
async fn bare_posts(posts: usize) -> anyhow::Result<f64> {
    let (url, _sink) = start_sink().await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let body = json!({"load_id": "H0", "title": "SMS from the driver", "body": "Gate code", "urgency": "normal"});
    super::bare_posts(&client, &format!("{url}/v1/tasks"), &body, posts).await
}

/// Off-and-on pairs of rounds in the tracing comparison (full runs).
const TRACED_PAIRS: usize = 5;

/// The rounds of one side of the tracing comparison: their rates and p50s, whose
/// medians are compared.
#[derive(Default)]
struct Paired {
    rates: Vec<f64>,
    p50s_ms: Vec<f64>,
    haul_cpu_us: Vec<f64>,
    bench_cpu_us: Vec<f64>,
}

impl Paired {
    fn add(&mut self, (rate, lat, budget): (f64, Vec<f64>, Option<Budget>)) {
        self.rates.push(rate);
        self.p50s_ms.push(percentile(&lat, 0.5));
        if let Some(b) = budget {
            self.haul_cpu_us.push(b.haul_cpu_us);
            self.bench_cpu_us.push(b.bench_cpu_us);
        }
    }

    fn haul_cpu_us(&self) -> Option<f64> {
        (!self.haul_cpu_us.is_empty()).then(|| median(&self.haul_cpu_us))
    }

    fn bench_cpu_us(&self) -> Option<f64> {
        (!self.bench_cpu_us.is_empty()).then(|| median(&self.bench_cpu_us))
    }

    fn rate(&self) -> f64 {
        median(&self.rates)
    }

    fn p50_ms(&self) -> f64 {
        median(&self.p50s_ms)
    }
}

/// The middle value (the mean of the middle two of an even count); 0 for none.
fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

pub(super) async fn e2e_http(store: &BenchStore, quick: bool) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let loads = if quick { 100 } else { 1_000 };
    const ALL: &[&str] = &["api,worker,dispatcher,pump"];
    const SPLIT: &[&str] = &["api", "worker", "dispatcher,pump"];
    let mut layouts = vec![("", ALL)];
    if matches!(store, BenchStore::Postgres(_)) {
        layouts.push(("split_", SPLIT));
    }
    for (tag, roles) in layouts {
        for callers in [1usize, 16, 32] {
            let units = match (quick, callers) {
                (true, 1) => 50,
                (true, _) => 200,
                (false, 1) => 500,
                (false, _) => 4_000,
            };
            // What one unit cost, at 16 callers with the roles in one process.
            let meter = tag.is_empty() && callers == 16;
            let (rate, lat, budget) = round(store, roles, loads, callers, units, &[], meter).await?;
            if let Some(b) = budget {
                b.figures(&mut f);
            }
            f.insert(format!("{tag}units_per_s_{callers}_callers"), rate);
            f.insert(format!("{tag}p50_ms_{callers}_callers"), percentile(&lat, 0.5));
            f.insert(format!("{tag}p99_ms_{callers}_callers"), percentile(&lat, 0.99));
        }
    }
    // Scale-out on PostgreSQL (full runs only): roles as processes, with 1, 2 and 4
    // worker processes and 1 and 2 dispatcher processes, at 16 callers.
    if !quick && matches!(store, BenchStore::Postgres(_)) {
        for (workers, dispatchers) in [(1usize, 1usize), (2, 1), (4, 1), (1, 2), (2, 2)] {
            let mut roles = vec!["api"];
            roles.extend(std::iter::repeat_n("worker", workers));
            roles.push("dispatcher,pump");
            roles.extend(std::iter::repeat_n("dispatcher", dispatchers - 1));
            let (rate, lat, _) = round(store, &roles, loads, 16, 4_000, &[], false).await?;
            let tag = format!("scale_{workers}w_{dispatchers}d_");
            f.insert(format!("{tag}units_per_s_16_callers"), rate);
            f.insert(format!("{tag}p99_ms_16_callers"), percentile(&lat, 0.99));
        }
    }
    // Tracing on against off: every process exports its spans over OTLP/HTTP to a
    // receiver in this process (the SDK's batch defaults), all roles in one process.
    // Rounds alternate, off then on, `TRACED_PAIRS` times, and the medians are compared:
    // one round against one taken minutes earlier would show the drift between them.
    let otlp = crate::testkit_otlp::OtlpReceiver::start_counting().await?;
    let env: Vec<(String, String)> = otlp.env().into_iter().filter(|(k, _)| k.starts_with("OTEL_EXPORTER_")).collect();
    for callers in [1usize, 16] {
        let units = match (quick, callers) {
            (true, 1) => 50,
            (true, _) => 200,
            (false, 1) => 500,
            (false, _) => 4_000,
        };
        let (mut off, mut on) = (Paired::default(), Paired::default());
        let meter = callers == 16;
        for _ in 0..if quick { 1 } else { TRACED_PAIRS } {
            off.add(round(store, ALL, loads, callers, units, &[], meter).await?);
            on.add(round(store, ALL, loads, callers, units, &env, meter).await?);
        }
        // What tracing costs haul's processes, and this one (the receiver decodes here).
        if let (Some(off_us), Some(on_us)) = (off.haul_cpu_us(), on.haul_cpu_us()) {
            f.insert(format!("untraced_haul_cpu_us_per_unit_{callers}_callers"), off_us);
            f.insert(format!("traced_haul_cpu_us_per_unit_{callers}_callers"), on_us);
        }
        if let (Some(off_us), Some(on_us)) = (off.bench_cpu_us(), on.bench_cpu_us()) {
            f.insert(format!("untraced_bench_cpu_us_per_unit_{callers}_callers"), off_us);
            f.insert(format!("traced_bench_cpu_us_per_unit_{callers}_callers"), on_us);
        }
        f.insert(format!("untraced_paired_units_per_s_{callers}_callers"), off.rate());
        f.insert(format!("untraced_paired_p50_ms_{callers}_callers"), off.p50_ms());
        f.insert(format!("traced_units_per_s_{callers}_callers"), on.rate());
        f.insert(format!("traced_p50_ms_{callers}_callers"), on.p50_ms());
        f.insert(format!("traced_over_untraced_{callers}_callers"), on.rate() / off.rate());
    }
    // Spans received show the export was on (the servers flush theirs as they stop).
    f.insert("traced_spans_received".into(), otlp.received() as f64);
    // The limits, in the same run.
    let (s, handle) = super::fresh_store(store, "e2e-http-bare").await?;
    drop(s);
    let writers = if matches!(store, BenchStore::Postgres(_)) { 8 } else { 1 };
    f.insert("bare_append_per_s".into(), super::raw_rate(store, &handle, loads, writers, 0).await?);
    f.insert("bare_posts_per_s".into(), bare_posts(if quick { 500 } else { 5_000 }).await?);
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::{median, stat_ticks};

    #[test]
    fn cpu_ticks_are_read_after_the_command_whatever_it_holds() {
        let check =
            |stat: &str, children: bool, want: Option<u64>| assert_eq!(stat_ticks(stat, children), want, "{stat}");
        let fields = "S 1 2 3 4 5 6 7 8 9 10 120 30 4 5 20 0";
        check(&format!("42 (postgres) {fields}"), false, Some(150));
        check(&format!("42 (postgres) {fields}"), true, Some(159));
        check(&format!("42 (a (b) c) {fields}"), false, Some(150));
        check("42 (postgres) S 1 2", false, None);
        check("no command", false, None);
    }

    #[test]
    fn median_is_the_middle_value() {
        let check = |xs: &[f64], want: f64| assert_eq!(median(xs), want, "{xs:?}");
        check(&[], 0.0);
        check(&[3.0], 3.0);
        check(&[9.0, 1.0, 5.0], 5.0);
        check(&[4.0, 1.0, 2.0, 10.0], 3.0);
    }
}
