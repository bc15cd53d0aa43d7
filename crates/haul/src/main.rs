//! The `haul` command line: parse, set up logging and the async runtime, run one
//! command. What each command does lives in `commands`; its flags in `cli`.

mod cli;
mod commands;
mod operator;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::filter::{self, FilterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Evals report through their own lines; the pipeline's logs would bury them.
    let default_filter = match cli.command {
        Command::Eval { .. } | Command::Sim { .. } => "off",
        Command::Testkit(_) => "warn",
        Command::Bench { .. } => "error",
        Command::Inspect { .. } | Command::Config(_) | Command::Completions { .. } => "warn",
        Command::Replay { .. } | Command::ExportScenario { .. } => "warn",
        _ => "info",
    };
    // A bad HAUL_LOG is refused: ignoring it would hide the logs someone asked for.
    let wanted = match std::env::var("HAUL_LOG") {
        Err(std::env::VarError::NotPresent) => EnvFilter::new(default_filter),
        Ok(v) if v.trim().is_empty() => EnvFilter::new(default_filter),
        Ok(v) => match EnvFilter::builder().parse(&v) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("error: HAUL_LOG={v:?} is not a log filter ({e}); e.g. HAUL_LOG=info or HAUL_LOG=haul=debug");
                return ExitCode::FAILURE;
            }
        },
        Err(std::env::VarError::NotUnicode(_)) => {
            eprintln!("error: HAUL_LOG is not valid UTF-8");
            return ExitCode::FAILURE;
        }
    };
    // Below info, dependencies log what passes through them: tokio-postgres every
    // statement's parameters (phone numbers, message texts), HTTP stacks their headers
    // (tokens). Whatever HAUL_LOG asks, only haul's own crates log at debug and trace.
    let own_below_info = filter::filter_fn(|m| *m.level() <= tracing::Level::INFO || m.target().starts_with("haul"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_filter(wanted.and(own_below_info)),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
