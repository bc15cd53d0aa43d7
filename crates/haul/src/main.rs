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
    let default_filter = if matches!(cli.command, Command::Eval { .. }) { "off" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HAUL_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
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

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
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
