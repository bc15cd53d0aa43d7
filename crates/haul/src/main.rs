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

#[derive(Subcommand, Debug)]
enum Command {
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
    /// Run eval scenarios (TOML files, or folders of them) through the real pipeline
    /// on a fake clock. Prints one line per scenario and `N passed, N failed`.
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Evals report through their own lines; the pipeline's logs would bury them.
    let default_filter = match cli.command {
        Command::Eval { .. } => "off",
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
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", haul::inspect::timeline(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { db } => {
            let store = haul::store::open(&db, None).await.with_context(|| format!("opening {db}"))?;
            drop(store);
            println!("schema of {db} is up to date");
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval { paths, json, store } => {
            let store = match store {
                StoreKind::Sqlite => haul::eval::EvalStore::SqliteMemory,
                StoreKind::Postgres => haul::eval::EvalStore::Postgres(
                    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
                ),
            };
            let report = haul::eval::run_paths(&paths, &store, |r| {
                if !json {
                    println!("{}", r.line());
                    let _ = std::io::stdout().flush();
                }
            })
            .await;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{} passed, {} failed", report.passed, report.failed);
            }
            Ok(if report.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}
