//! The `haul` command line.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// haul: a durable runtime for an AI dispatch agent running freight loads.
#[derive(Parser, Debug)]
#[command(name = "haul", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the database schema.
    Migrate {
        /// The store: sqlite://PATH, sqlite::memory: or postgres://…
        #[arg(long, env = "HAUL_STORE_URL", default_value = "sqlite://haul.db")]
        db: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("HAUL_LOG").unwrap_or_else(|_| "info".into()))
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
    }
}
