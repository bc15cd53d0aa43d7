//! The `haul` command line: parse, set up logging and the async runtime, run one
//! command. What each command does lives in `commands`; its flags in `cli`.

mod cli;
mod commands;
mod operator;
mod progress;
mod shared;

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
    // The PostgreSQL server's NOTICEs (tokio-postgres logs them at info: "schema
    // already exists, skipping" on every start) are noise: off unless HAUL_LOG names
    // tokio_postgres.
    let notices = std::env::var("HAUL_LOG").is_ok_and(|v| v.contains("tokio_postgres"));
    let own_below_info = filter::filter_fn(move |m| {
        let ours = m.target().starts_with("haul");
        if m.target().starts_with("tokio_postgres") && !notices {
            return *m.level() <= tracing::Level::WARN;
        }
        *m.level() <= tracing::Level::INFO || ours
    });
    let filter = wanted.and(own_below_info);
    let stderr_is_terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // HAUL_LOG_FORMAT=json: one JSON object per line, for log shippers.
    let layer = match std::env::var("HAUL_LOG_FORMAT").as_deref().map(str::trim) {
        Err(_) | Ok("" | "text") => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(stderr_is_terminal)
            .with_filter(filter)
            .boxed(),
        Ok("json") => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed(),
        Ok(other) => {
            eprintln!("error: HAUL_LOG_FORMAT={other:?} is not a log format; text (the default) or json");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::registry().with(layer).init();
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
