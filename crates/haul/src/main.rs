//! The `haul` command line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

/// haul: a durable runtime for an AI dispatch agent running freight loads.
#[derive(Parser, Debug)]
#[command(name = "haul", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Sqlite,
    Postgres,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum QueueKind {
    /// The store's own queue.
    Store,
    /// SQS FIFO on a local emulator: HAUL_SQS_ENDPOINT, or a moto_server started for the run
    /// (needs a build with `--features sqs`).
    Sqs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DeciderKind {
    Sop,
    Llm,
}

/// The crash test's tools (scripts/crash-test); not for production.
#[derive(Subcommand, Debug)]
enum Testkit {
    /// Run the fake channel services on ADDR until killed (GET /stats reports effects).
    Services {
        #[arg(long)]
        listen: String,
    },
    /// Create a fresh schema in DATABASE_URL and print a store URL that uses it.
    Schema {
        #[arg(long)]
        db: String,
    },
    /// Post events over HTTP for a while; write the accepted ones to a file.
    Load {
        #[arg(long)]
        api: String,
        #[arg(long, env = "HAUL_API_TOKEN")]
        token: String,
        #[arg(long, default_value_t = 20)]
        loads: usize,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        accepted: PathBuf,
    },
    /// Wait for everything to drain, then check the crash test's invariants.
    Check {
        #[arg(long)]
        db: String,
        #[arg(long)]
        services: String,
        #[arg(long)]
        accepted: PathBuf,
        #[arg(long, default_value_t = 180)]
        timeout: u64,
    },
}

#[derive(Subcommand, Debug)]
enum Command {
    #[command(subcommand, hide = true)]
    Testkit(Testkit),
    /// Run the ingestion API, the load workers, the dispatcher and the timer pump.
    /// With no configuration: SQLite file haul.db, the store-backed queue, record mode
    /// for every channel, listening on 127.0.0.1:8080.
    Serve {
        /// A TOML config file (config.md); HAUL_* variables and flags override it.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The store URL (overrides store.url).
        #[arg(long)]
        db: Option<String>,
        /// Address for the API, /metrics and /healthz (overrides server.listen).
        #[arg(long)]
        listen: Option<String>,
        /// Which roles this process runs: any of api,worker,dispatcher,pump.
        #[arg(long, default_value = "api,worker,dispatcher,pump")]
        roles: String,
    },
    /// Deterministic simulation with fault injection: a seed reproduces a run exactly.
    /// Prints one line per seed (with its trace digest), the coverage of faults, and
    /// `N passed, N failed`; a failure prints the seed, the broken invariant and the
    /// trace lines that show it.
    Sim {
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How many seeds to run, from --seed up.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// Loads per run.
        #[arg(long, default_value_t = 4)]
        loads: usize,
        /// Steps of the fault phase per run.
        #[arg(long, default_value_t = 200)]
        steps: usize,
        /// Faults to inject: all, none, or some of crash,duplicate,redelivery,interleave,outage,service,clock.
        #[arg(long, default_value = "all")]
        faults: String,
        /// The backend: SQLite in memory, or PostgreSQL from DATABASE_URL (a schema per seed).
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// Plant a known bug, to check the simulator catches it (test use only).
        #[arg(long, hide = true)]
        plant: Option<String>,
    },
    /// Benchmark workloads; each throughput is reported with the limit measured in the
    /// same run (append, projection, contention, e2e, dispatch, timers).
    Bench {
        /// Workloads to run (default: all).
        workloads: Vec<String>,
        /// The backend: a SQLite file in a temporary folder, or PostgreSQL from DATABASE_URL.
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// Print one JSON object { "<workload>": { "<figure>": number } }.
        #[arg(long)]
        json: bool,
        /// Smaller sizes, for a quick look.
        #[arg(long)]
        quick: bool,
    },
    /// Show one load as a readable timeline: events, decisions with their actions and
    /// rationale, outbox rows with attempts and status, timers.
    Inspect {
        load_id: String,
        #[arg(long)]
        config: Option<PathBuf>,
        /// The store URL (overrides store.url).
        #[arg(long)]
        db: Option<String>,
        /// Print the load as JSON (the body of GET /v1/loads/{id}).
        #[arg(long)]
        json: bool,
    },
    /// Create or upgrade the database schema.
    Migrate {
        /// The store: sqlite://PATH, sqlite::memory: or postgres://…
        #[arg(long, env = "HAUL_STORE_URL", default_value = "sqlite://haul.db")]
        db: String,
    },
    /// Delete finished rows older than the retention age, in bounded batches until none
    /// is left: dispatched outbox rows and dead ones whose outcome was published, fired
    /// and canceled timers, acked queue messages. Never the log, a pending or claimed
    /// row, a dead row still waiting for its outcome, a scheduled timer or an unacked
    /// message. Safe to run while haul serves (cron it, e.g. hourly).
    Prune {
        /// The store: sqlite://PATH or postgres://…
        #[arg(long, env = "HAUL_STORE_URL", default_value = "sqlite://haul.db")]
        db: String,
        /// Retention age: rows that finished longer ago than this go. At least 5m, the
        /// queue's shortest dedup window; an acked event id older than this is no
        /// longer deduplicated by the queue (the log still drops it).
        #[arg(long, default_value = "7d")]
        older_than: String,
        /// Rows per table per batch; each batch is its own short transaction.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
    /// Run eval scenarios (TOML files, or folders of them) through the real pipeline
    /// on a fake clock. Prints one line per scenario and `N passed, N failed`.
    ///
    /// With `--decider llm --llm-answers FILE` the worker decides with the real LLM
    /// decider, pointed at a recorded chat-completions server on 127.0.0.1 that replies
    /// with the answers in FILE (matched by load id and event id); a model request with
    /// no recorded answer fails the scenario. Example:
    /// `haul eval --decider llm --llm-answers evals-llm/answers.toml evals-llm/scenarios/`
    Eval {
        /// Scenario files and folders (every *.toml below a folder, sorted).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print one JSON report instead of lines.
        #[arg(long)]
        json: bool,
        /// The backend: SQLite in memory, or PostgreSQL from DATABASE_URL (a schema per scenario).
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// The load queue: the store's own, or a fresh SQS FIFO queue per scenario.
        #[arg(long, value_enum, default_value = "store")]
        queue: QueueKind,
        /// The decider: the SOP, or the LLM decider against recorded answers (--llm-answers).
        #[arg(long, value_enum, default_value = "sop")]
        decider: DeciderKind,
        /// The recorded answers (TOML) the LLM decider's stand-in server replies with.
        #[arg(long, value_name = "FILE", required_if_eq("decider", "llm"))]
        llm_answers: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Evals report through their own lines; the pipeline's logs would bury them.
    let default_filter = match cli.command {
        Command::Eval { .. } | Command::Sim { .. } => "off",
        Command::Testkit(_) => "warn",
        Command::Bench { .. } => "error",
        Command::Inspect { .. } => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAUL_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The shortest `haul prune --older-than`: the queue's dedup promise (LoadQueue::publish).
const MIN_RETENTION: std::time::Duration = std::time::Duration::from_secs(300);
/// Batches one `haul prune` runs at most (100M rows per table at the default batch).
const MAX_PRUNE_BATCHES: usize = 100_000;

/// Prints a line; a closed stdout (`| head`) ends the program quietly instead of panicking.
fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}

fn eval_store(kind: StoreKind) -> haul::eval::EvalStore {
    match kind {
        StoreKind::Sqlite => haul::eval::EvalStore::SqliteMemory,
        StoreKind::Postgres => haul::eval::EvalStore::Postgres(
            std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
        ),
    }
}

async fn eval_queue(kind: QueueKind) -> anyhow::Result<haul::eval::EvalQueue> {
    match kind {
        QueueKind::Store => Ok(haul::eval::EvalQueue::Store),
        #[cfg(feature = "sqs")]
        QueueKind::Sqs => {
            Ok(haul::eval::EvalQueue::Sqs(haul_sqs::testing::endpoint().await.map_err(|e| anyhow::anyhow!(e))?))
        }
        #[cfg(not(feature = "sqs"))]
        QueueKind::Sqs => anyhow::bail!("--queue sqs needs a build with SQS (cargo build --features sqs)"),
    }
}

/// Defaults, the file, HAUL_* variables, then flags; warns about HAUL_* variables
/// that name no setting.
fn load_config(
    file: Option<&std::path::Path>,
    db: Option<String>,
    listen: Option<String>,
) -> anyhow::Result<haul::config::Config> {
    let (mut config, unknown) = haul::config::Config::load(file, std::env::vars())?;
    for name in unknown {
        tracing::warn!("{name} names no setting; ignored");
    }
    if let Some(db) = db {
        config.store.url = db;
    }
    if let Some(listen) = listen {
        config.server.listen = listen;
    }
    config.validate()?;
    Ok(config)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { config, db, listen, roles } => {
            let config = load_config(config.as_deref(), db, listen)?;
            let roles = haul::serve::Roles::parse(&roles)?;
            haul::serve::serve(config, roles, haul::serve::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { load_id, config, db, json } => {
            let config = load_config(config.as_deref(), db, None)?;
            let load = haul_core::ids::LoadId::parse(&load_id).map_err(|e| anyhow::anyhow!("{}", e.message))?;
            let store = haul::store::open(&config.store.url, None).await.context("store.url")?;
            let Some(view) = haul::inspect::load_view(store.as_ref(), &load).await? else {
                eprintln!("load {load} has no records in {}", haul::store::describe(&config.store.url));
                return Ok(ExitCode::from(2));
            };
            if json {
                say(format_args!("{}", serde_json::to_string_pretty(&view)?));
            } else {
                say(haul::inspect::timeline(&view).trim_end());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { db } => {
            let store = haul::store::open(&db, None).await.with_context(|| format!("opening {db}"))?;
            drop(store);
            say(format_args!("schema of {db} is up to date"));
            Ok(ExitCode::SUCCESS)
        }
        Command::Prune { db, older_than, batch } => {
            let age = haul_core::time::parse_duration(&older_than)
                .map_err(|e| anyhow::anyhow!("--older-than: {}", e.message))?;
            if age < MIN_RETENTION {
                anyhow::bail!(
                    "--older-than {older_than}: at least 5m (the queue deduplicates event ids for at least five minutes)"
                );
            }
            let store = haul::store::open(&db, None)
                .await
                .with_context(|| format!("opening {}", haul::store::describe(&db)))?;
            let now = haul_core::Clock::now(&haul::clock::SystemClock);
            let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            let cutoff = haul_core::time::from_ms(haul_core::time::to_ms(now).saturating_sub(age_ms));
            let mut batches = 0u64;
            let sum = haul_store::prune_all(store.as_ref(), cutoff, batch as usize, MAX_PRUNE_BATCHES, |b| {
                batches += 1;
                tracing::debug!(outbox = b.outbox, timers = b.timers, queue = b.queue, "prune batch");
            })
            .await?;
            say(format_args!(
                "pruned {} outbox rows, {} timers, {} queue messages finished before {cutoff} ({batches} batches of at most {batch} per table)",
                sum.outbox, sum.timers, sum.queue
            ));
            if batches as usize >= MAX_PRUNE_BATCHES {
                say(format_args!("stopped after {MAX_PRUNE_BATCHES} batches; run it again for the rest"));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Testkit(t) => {
            match t {
                Testkit::Services { listen } => {
                    let svc = haul::testkit::FakeServices::start_on(&listen, None).await?;
                    say(format_args!("fake services on {}", svc.addr));
                    haul::serve::shutdown_signal().await;
                }
                Testkit::Schema { db } => {
                    let schema = haul_postgres::testing::fresh_schema(&db).await;
                    let (client, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls).await?;
                    tokio::spawn(conn);
                    client.batch_execute(&format!("CREATE SCHEMA {schema}")).await?;
                    let sep = if db.contains('?') { '&' } else { '?' };
                    say(format_args!("{db}{sep}options=-csearch_path%3D{schema}"));
                }
                Testkit::Load { api, token, loads, seconds, seed, accepted } => {
                    haul::crashtest::load(&api, &token, loads, seconds, seed, &accepted).await?;
                }
                Testkit::Check { db, services, accepted, timeout } => {
                    let store = haul::store::open(&db, None).await?;
                    haul::crashtest::check(store, &services, &accepted, timeout).await?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { workloads, store, json, quick } => {
            let workloads: Vec<String> = if workloads.is_empty() {
                haul::bench::WORKLOADS.iter().map(|w| w.to_string()).collect()
            } else {
                workloads
            };
            let dir = std::env::temp_dir().join(format!("haul-bench-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let store = match store {
                StoreKind::Sqlite => haul::bench::BenchStore::Sqlite(dir.clone()),
                StoreKind::Postgres => haul::bench::BenchStore::Postgres(
                    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
                ),
            };
            let mut all = std::collections::BTreeMap::new();
            for w in &workloads {
                let figures = haul::bench::run_workload(w, &store, quick).await?;
                if !json {
                    for (k, v) in &figures {
                        say(format_args!("{w}.{k} = {v:.3}"));
                    }
                }
                all.insert(w.clone(), figures);
            }
            let _ = std::fs::remove_dir_all(&dir);
            if json {
                say(serde_json::to_string_pretty(&all)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Sim { seed, seeds, loads, steps, faults, store, plant } => {
            let faults = haul::sim::FaultSet::parse(&faults)?;
            let bugs = match plant.as_deref() {
                None => haul::faults::PlantedBugs::default(),
                Some(name) => haul::faults::PlantedBugs::parse(name)
                    .ok_or_else(|| anyhow::anyhow!("--plant: unknown bug {name:?}"))?,
            };
            let store = eval_store(store);
            let (mut passed, mut failed) = (0, 0);
            let mut coverage = std::collections::BTreeMap::<String, u64>::new();
            for s in seed..seed.saturating_add(seeds) {
                let opts = haul::sim::SimOptions { seed: s, loads, steps, faults, bugs };
                let report = haul::sim::run(&opts, &store).await.with_context(|| format!("seed {s}"))?;
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
            let cov: Vec<String> = coverage.iter().map(|(k, v)| format!("{k}={v}")).collect();
            say(format_args!("coverage: {}", cov.join(" ")));
            say(format_args!("{passed} passed, {failed} failed"));
            Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Eval { paths, json, store, queue, decider, llm_answers } => {
            let store = eval_store(store);
            let decider = match (decider, llm_answers) {
                (DeciderKind::Llm, Some(file)) => {
                    haul::eval::EvalDecider::Llm(haul::testkit_llm::Answers::from_file(&file).context("--llm-answers")?)
                }
                (DeciderKind::Llm, None) => anyhow::bail!("--decider llm needs --llm-answers FILE"),
                (DeciderKind::Sop, Some(_)) => anyhow::bail!("--llm-answers goes with --decider llm"),
                (DeciderKind::Sop, None) => haul::eval::EvalDecider::Sop,
            };
            let opts = haul::eval::EvalOptions { queue: eval_queue(queue).await?, decider };
            let report = haul::eval::run_paths_with(&paths, &store, &opts, |r| {
                if !json {
                    say(format_args!("{}", r.line()));
                }
            })
            .await;
            if json {
                say(format_args!("{}", serde_json::to_string_pretty(&report)?));
            } else {
                say(format_args!("{} passed, {} failed", report.passed, report.failed));
            }
            Ok(if report.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
