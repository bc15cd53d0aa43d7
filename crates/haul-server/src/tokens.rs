//! The API's bearer tokens: `HAUL_API_TOKEN`, or one made for a fresh machine.

use anyhow::{Context, bail};
use tracing::warn;

/// The API bearer tokens: `HAUL_API_TOKEN` (comma-separated). When unset, one is
/// generated and written to `haul-api-token` (mode 600) so a fresh machine works.
pub(crate) fn api_tokens() -> anyhow::Result<Vec<String>> {
    if let Ok(v) = std::env::var("HAUL_API_TOKEN") {
        let tokens: Vec<String> = v.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect();
        if tokens.is_empty() {
            bail!("HAUL_API_TOKEN is set but names no token");
        }
        if tokens.iter().any(|t| t.len() < 8) {
            bail!("HAUL_API_TOKEN: every token must be at least 8 characters");
        }
        return Ok(tokens);
    }
    let path = std::path::Path::new("haul-api-token");
    let token = match std::fs::read_to_string(path) {
        Ok(t) if t.trim().len() >= 8 => t.trim().to_owned(),
        _ => {
            let mut rng = fastrand::Rng::new();
            let t = format!("{:016x}{:016x}", rng.u64(..), rng.u64(..));
            write_private(path, &t).context("writing haul-api-token")?;
            t
        }
    };
    warn!("HAUL_API_TOKEN is not set: using the token in ./haul-api-token");
    Ok(vec![token])
}

#[cfg(unix)]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}
