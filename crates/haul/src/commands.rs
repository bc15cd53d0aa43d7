//! One function per command: each turns its flags into calls on the crates that do
//! the work (`haul-server`, `haul-runtime`, `haul-harness`) and prints the result.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use haul_config::{Config, Loaded};
use haul_harness::eval::{EvalDecider, EvalOptions, EvalQueue, EvalStore};
use haul_harness::{bench, crashtest, eval, sim};
use haul_runtime::store;

use crate::cli::{Cli, Command, ConfigArgs, ConfigCommand, DeciderKind, QueueKind, StoreKind, Testkit};
use crate::progress::Progress;

/// The shortest `haul prune --older-than`: the queue's dedup promise (LoadQueue::publish).
const MIN_RETENTION: Duration = Duration::from_secs(300);
/// Batches one `haul prune` runs at most (100M rows per table at the default batch).
const MAX_PRUNE_BATCHES: usize = 100_000;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { settings, listen, roles } => serve(&settings, listen, &roles).await,
        Command::Inspect { load_id, settings, json, after_seq, limit, outbox_after, timers_after } => {
            let page = haul_runtime::inspect::Page::parse(
                after_seq.as_deref(),
                limit.as_deref(),
                outbox_after.as_deref(),
                timers_after.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
            inspect(&load_id, &settings, json, &page).await
        }
        Command::Migrate { settings } => migrate(&settings).await,
        Command::Prune { settings, older_than, batch } => prune(&settings, &older_than, batch).await,
        Command::Config(ConfigCommand::Check { settings, listen }) => config_check(&settings, listen),
        Command::Config(ConfigCommand::Show { settings, listen }) => config_show(&settings, listen),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "haul", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Testkit(t) => testkit(t).await,
        Command::Bench { workloads, store, json, quick } => bench(workloads, store, json, quick).await,
        Command::Sim { seed, seeds, loads, steps, faults, store, plant } => {
            simulate(seed, seeds, loads, steps, &faults, store, plant.as_deref()).await
        }
        Command::Eval { paths, json, store, queue, decider, llm_answers, verbose, junit } => {
            let out = EvalOutput { json, verbose, junit };
            evaluate(&paths, &out, store, queue, decider, llm_answers.as_deref()).await
        }
    }
}

/// Prints a line; a closed stdout (`| head`) ends the program quietly instead of panicking.
fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Defaults, the file, HAUL_* variables, then flags, with where each value came from;
/// not yet validated.
fn load_settings(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<Loaded> {
    let mut loaded = Config::load_with_sources(args.config.as_deref(), std::env::vars())?;
    if let Some(db) = &args.db {
        loaded.set_by_flag("--db", db)?;
    }
    if let Some(listen) = &listen {
        loaded.set_by_flag("--listen", listen)?;
    }
    Ok(loaded)
}

/// The settings a command runs with, validated; warns about HAUL_* variables that name
/// no setting.
fn load_config(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<Config> {
    let loaded = load_settings(args, listen)?;
    for name in &loaded.unknown {
        tracing::warn!("{name} names no setting; ignored");
    }
    loaded.validate()?;
    Ok(loaded.config)
}

fn config_check(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<ExitCode> {
    let loaded = load_settings(args, listen)?;
    loaded.validate()?;
    if loaded.config.queue.kind == haul_config::QueueKind::Sqs && !cfg!(feature = "sqs") {
        anyhow::bail!(
            "queue.kind \"sqs\" needs a build with --features sqs (haul --version lists the features built in)"
        );
    }
    for (var, setting) in loaded.config.named_variables() {
        if std::env::var(&var).map_or(true, |v| v.trim().is_empty()) {
            anyhow::bail!("{setting} names {var}, which is not set");
        }
    }
    for name in &loaded.unknown {
        eprintln!("warning: {name} names no setting; ignored");
    }
    let c = &loaded.config;
    say(format_args!(
        "ok: store {}, queue {}, decider {}, listening on {}",
        store::describe(&c.store.url),
        c.queue.kind,
        c.decider.kind,
        c.server.listen
    ));
    Ok(ExitCode::SUCCESS)
}

/// A value for people: URLs without their password.
fn shown(value: &str) -> String {
    if value.contains("://") { haul_config::redact_url(value) } else { value.to_owned() }
}

fn config_show(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<ExitCode> {
    let loaded = load_settings(args, listen)?;
    let c = &loaded.config;
    let mut lines = Vec::new();
    for (path, value) in c.values() {
        let left = match &value {
            Some(v) => format!("{path} = {}", shown(v)),
            None => format!("{path} unset ({})", c.unset_means(&path).unwrap_or_default()),
        };
        lines.push((left, loaded.source(&path).to_string()));
    }
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0).min(72);
    say("# setting = value   # where it came from");
    for (left, source) in &lines {
        say(format_args!("{left:<width$}  # {source}"));
    }
    say("\n# other variables haul reads");
    let mut vars: Vec<(String, String, bool)> = haul_config::NOT_SETTINGS
        .iter()
        .map(|(n, what)| (n.to_string(), what.to_string(), what.starts_with("secret")))
        .collect();
    for (var, setting) in c.named_variables() {
        if !vars.iter().any(|(n, _, _)| *n == var) {
            vars.push((var, format!("secret: named by {setting}"), true));
        }
    }
    let width = vars.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    for (name, what, secret) in vars {
        let value = match std::env::var(&name) {
            Ok(v) if secret && !v.is_empty() => "set (masked)".to_owned(),
            Ok(v) => format!("{:?}", shown(&v)),
            Err(_) => "unset".to_owned(),
        };
        say(format_args!("{name:<width$}  {value:<16}  # {what}"));
    }
    for name in &loaded.unknown {
        say(format_args!("# ignored: {name} names no setting"));
    }
    Ok(ExitCode::SUCCESS)
}

fn eval_store(kind: StoreKind) -> EvalStore {
    match kind {
        StoreKind::Sqlite => EvalStore::SqliteMemory,
        StoreKind::Postgres => EvalStore::Postgres(haul_harness::database_url()),
    }
}

async fn serve(settings: &ConfigArgs, listen: Option<String>, roles: &str) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, listen)?;
    let roles = haul_server::Roles::parse(roles)?;
    haul_server::serve(config, roles, haul_server::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn inspect(
    load_id: &str,
    settings: &ConfigArgs,
    json: bool,
    page: &haul_runtime::inspect::Page,
) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let load = haul_core::ids::LoadId::parse(load_id).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    // Only reads: never creates a store where there was none.
    let store = store::open_read_only(&config.store.url).await?;
    let Some(view) = haul_runtime::inspect::load_view(store.as_ref(), &load, page).await? else {
        eprintln!("load {load} has no records in {}", store::describe(&config.store.url));
        return Ok(ExitCode::from(2));
    };
    if json {
        say(format_args!("{}", serde_json::to_string_pretty(&view)?));
    } else {
        say(haul_runtime::inspect::timeline(&view).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

async fn migrate(settings: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let db = config.store.url.as_str();
    let store = store::open(db, None).await?;
    drop(store);
    say(format_args!("schema of {} is up to date", store::describe(db)));
    Ok(ExitCode::SUCCESS)
}

async fn prune(settings: &ConfigArgs, older_than: &str, batch: u32) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let db = config.store.url.as_str();
    let age =
        haul_core::time::parse_duration(older_than).map_err(|e| anyhow::anyhow!("--older-than: {}", e.message))?;
    if age < MIN_RETENTION {
        anyhow::bail!(
            "--older-than {older_than}: at least 5m (the queue deduplicates event ids for at least five minutes)"
        );
    }
    let store = store::open(db, None).await?;
    let now = haul_core::Clock::now(&haul_runtime::clock::SystemClock);
    let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    let cutoff = haul_core::time::from_ms(haul_core::time::to_ms(now).saturating_sub(age_ms));
    let mut batches = 0u64;
    let mut progress = Progress::stderr("prune: batches", None);
    let mut deleted = 0u64;
    let sum = haul_store::prune_all(store.as_ref(), cutoff, batch as usize, MAX_PRUNE_BATCHES, |b| {
        batches += 1;
        deleted += b.outbox + b.timers + b.queue;
        progress.update(batches, &format!("{deleted} rows deleted"));
        tracing::debug!(outbox = b.outbox, timers = b.timers, queue = b.queue, "prune batch");
    })
    .await?;
    progress.finish();
    say(format_args!(
        "pruned {} outbox rows, {} timers, {} queue messages finished before {cutoff} ({batches} batches of at most {batch} per table)",
        sum.outbox, sum.timers, sum.queue
    ));
    if batches as usize >= MAX_PRUNE_BATCHES {
        say(format_args!("stopped after {MAX_PRUNE_BATCHES} batches; run it again for the rest"));
    }
    Ok(ExitCode::SUCCESS)
}

async fn testkit(t: Testkit) -> anyhow::Result<ExitCode> {
    match t {
        Testkit::Services { listen } => {
            let svc = haul_harness::testkit::FakeServices::start_on(&listen, None).await?;
            say(format_args!("fake services on {}", svc.addr));
            haul_server::shutdown_signal().await;
        }
        Testkit::Schema { db } => say(haul_harness::fresh_schema_url(&db).await.1),
        Testkit::Load { api, token, loads, seconds, seed, accepted } => {
            crashtest::load(&api, &token, loads, seconds, seed, &accepted).await?;
        }
        Testkit::Check { db, services, accepted, timeout, min_events } => {
            let store = store::open_read_only(&db).await?;
            crashtest::check(store, &services, &accepted, timeout, min_events).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench(workloads: Vec<String>, store: StoreKind, json: bool, quick: bool) -> anyhow::Result<ExitCode> {
    let workloads: Vec<String> =
        if workloads.is_empty() { bench::WORKLOADS.iter().map(|w| w.to_string()).collect() } else { workloads };
    let dir = std::env::temp_dir().join(format!("haul-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = match store {
        StoreKind::Sqlite => bench::BenchStore::Sqlite(dir.clone()),
        StoreKind::Postgres => bench::BenchStore::Postgres(haul_harness::database_url()),
    };
    let mut all = BTreeMap::new();
    let mut progress = Progress::stderr("bench: workloads done", Some(workloads.len() as u64));
    for (i, w) in workloads.iter().enumerate() {
        // A workload runs for minutes without a word: say which one is running, and
        // keep the clock moving while it does.
        let run = bench::run_workload(w, &store, quick);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let figures = loop {
            tokio::select! {
                r = &mut run => break r?,
                _ = tick.tick() => progress.update(i as u64, &format!("running {w}")),
            }
        };
        progress.finish();
        if !json {
            for (k, v) in &figures {
                say(format_args!("{w}.{k} = {v:.3}"));
            }
        }
        all.insert(w.clone(), figures);
    }
    progress.finish();
    let _ = std::fs::remove_dir_all(&dir);
    if json {
        say(serde_json::to_string_pretty(&all)?);
    }
    Ok(ExitCode::SUCCESS)
}

async fn simulate(
    seed: u64,
    seeds: u64,
    loads: usize,
    steps: usize,
    faults: &str,
    store: StoreKind,
    plant: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let faults = sim::FaultSet::parse(faults)?;
    let bugs = match plant {
        None => haul_runtime::faults::PlantedBugs::default(),
        Some(name) => haul_runtime::faults::PlantedBugs::parse(name)
            .ok_or_else(|| anyhow::anyhow!("--plant: unknown bug {name:?}"))?,
    };
    let store = eval_store(store);
    let (mut passed, mut failed) = (0, 0);
    let mut coverage = BTreeMap::<String, u64>::new();
    let mut progress = Progress::stderr("sim: seeds", Some(seeds));
    for s in seed..seed.saturating_add(seeds) {
        progress.update(s - seed, &format!("seed {s}, {failed} failed"));
        let opts = sim::SimOptions { seed: s, loads, steps, faults, bugs };
        let report = sim::run(&opts, &store).await.with_context(|| format!("seed {s}"))?;
        progress.finish(); // erased before the seed's line, so the report reads as it would piped
        for (k, v) in &report.coverage {
            *coverage.entry(k.clone()).or_default() += v;
        }
        match &report.violation {
            None => {
                passed += 1;
                say(format_args!(
                    "seed {s}: ok  digest {}  events {}  effects {}",
                    report.digest, report.events, report.effects
                ));
            }
            Some(v) => {
                failed += 1;
                say(format_args!("seed {s}: FAILED  digest {}: {v}", report.digest));
                say(format_args!("  reproduce: haul sim --seed {s} --loads {loads} --steps {steps}"));
                for line in &report.excerpt {
                    say(format_args!("  | {line}"));
                }
            }
        }
    }
    progress.finish();
    let cov: Vec<String> = coverage.iter().map(|(k, v)| format!("{k}={v}")).collect();
    say(format_args!("coverage: {}", cov.join(" ")));
    say(format_args!("{passed} passed, {failed} failed"));
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// How `haul eval` reports.
struct EvalOutput {
    json: bool,
    verbose: bool,
    junit: Option<PathBuf>,
}

async fn evaluate(
    paths: &[PathBuf],
    out: &EvalOutput,
    store: StoreKind,
    queue: QueueKind,
    decider: DeciderKind,
    llm_answers: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let store = eval_store(store);
    let decider = match (decider, llm_answers) {
        (DeciderKind::Llm, Some(file)) => {
            EvalDecider::Llm(haul_harness::testkit_llm::Answers::from_file(file).context("--llm-answers")?)
        }
        (DeciderKind::Llm, None) => anyhow::bail!("--decider llm needs --llm-answers FILE"),
        (DeciderKind::Sop, Some(_)) => anyhow::bail!("--llm-answers goes with --decider llm"),
        (DeciderKind::Sop, None) => EvalDecider::Sop,
    };
    let queue = match queue {
        QueueKind::Store => EvalQueue::Store,
        QueueKind::Sqs => EvalQueue::sqs_emulator().await?,
    };
    let opts = EvalOptions { queue, decider, timelines: out.verbose };
    let total = eval::collect(paths).len() as u64;
    let mut progress = Progress::stderr("eval: scenarios", Some(total));
    let (mut done, mut failed) = (0u64, 0u64);
    let report = eval::run_paths_with(paths, &store, &opts, |r| {
        done += 1;
        failed += u64::from(!r.passed);
        // Erased before a line is printed, so the report reads as it would piped.
        progress.finish();
        if !out.json {
            say(format_args!("{}", r.line()));
            for line in r.timeline.iter().flat_map(|t| t.lines()) {
                say(format_args!("  | {line}"));
            }
        }
        progress.update(done, &format!("{failed} failed"));
    })
    .await;
    progress.finish();
    if let Some(file) = &out.junit {
        std::fs::write(file, eval::junit(&report)).with_context(|| format!("--junit {}", file.display()))?;
    }
    if out.json {
        say(format_args!("{}", serde_json::to_string_pretty(&report)?));
    } else {
        say(format_args!("{} passed, {} failed", report.passed, report.failed));
    }
    if report.scenarios.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        eprintln!("error: no scenario files (*.toml) in {}: nothing was tested", shown.join(" "));
        return Ok(ExitCode::FAILURE);
    }
    Ok(if report.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
