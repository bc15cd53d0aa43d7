//! The `haul` command line: parse, set up logging and the async runtime, run one
//! command. What each command does lives in `commands`; its flags in `cli`.

mod cli;
mod commands;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Evals report through their own lines; the pipeline's logs would bury them.
    let default_filter = match cli.command {
        Command::Eval { .. } | Command::Sim { .. } => "off",
        Command::Testkit(_) => "warn",
        Command::Bench { .. } => "error",
        Command::Inspect { .. } | Command::Config(_) | Command::Completions { .. } => "warn",
        _ => "info",
    };
    // A bad HAUL_LOG is refused: ignoring it would hide the logs someone asked for.
    let filter = match std::env::var("HAUL_LOG") {
        Err(std::env::VarError::NotPresent) => tracing_subscriber::EnvFilter::new(default_filter),
        Ok(v) if v.trim().is_empty() => tracing_subscriber::EnvFilter::new(default_filter),
        Ok(v) => match tracing_subscriber::EnvFilter::builder().parse(&v) {
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
    tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
