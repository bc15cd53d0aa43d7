//! What every command shares: the settings it runs with, and how it prints a line.
//! (Here rather than in `commands`, so the commands of their own modules, such as
//! `operator`, need nothing back from `commands`.)

use std::io::Write;

use haul_config::{Config, Loaded};

use crate::cli::ConfigArgs;

/// Prints a line; a closed stdout (`| head`) ends the program quietly instead of panicking.
pub(crate) fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Defaults, the file, HAUL_* variables, then flags, with where each value came from;
/// not yet validated.
pub(crate) fn load_settings(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<Loaded> {
    let mut loaded = Config::load_with_sources(args.config.as_deref(), std::env::vars())?;
    if let Some(db) = &args.db {
        loaded.set_by_flag("--db", db)?;
    }
    if let Some(listen) = &listen {
        loaded.set_by_flag("--listen", listen)?;
    }
    Ok(loaded)
}

/// The settings a command runs with, validated; warns about what [`Loaded::notes`]
/// finds (HAUL_* variables that name no setting, a DATABASE_URL that is not the store).
pub(crate) fn load_config(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<Config> {
    let loaded = load_settings(args, listen)?;
    for note in loaded.notes() {
        tracing::warn!("{note}");
    }
    loaded.validate()?;
    Ok(loaded.config)
}
