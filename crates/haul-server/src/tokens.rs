//! The API's bearer tokens: `HAUL_API_TOKEN`, or one made for a fresh machine.
//!
//! Two steps, so that a start that is refused leaves nothing behind: the variable is
//! checked with the other settings, before anything opens; a token is made (or read
//! back) only once the store is open and the port bound, when serving is certain.

use anyhow::{Context, bail};
use tracing::warn;

/// Where `serve` keeps the token it made, in the working directory.
const TOKEN_FILE: &str = "haul-api-token";

/// Bytes of randomness in a made token (written as twice as many hex digits).
const TOKEN_BYTES: usize = 32;

/// The tokens `HAUL_API_TOKEN` names (comma-separated), or `None` when it is unset.
pub(crate) fn tokens_from_env() -> anyhow::Result<Option<Vec<String>>> {
    list_from_env("HAUL_API_TOKEN")
}

/// The operator tokens `HAUL_OPERATOR_TOKEN` names (comma-separated); none when it is
/// unset, and then the operator routes answer 403. Never made up: an operator token
/// is given on purpose, and refused unless it looks random enough to withstand
/// guessing ([`random_enough`]).
pub(crate) fn operator_tokens_from_env() -> anyhow::Result<Vec<String>> {
    let tokens = list_from_env("HAUL_OPERATOR_TOKEN")?.unwrap_or_default();
    if let Some((i, weak)) = tokens.iter().enumerate().find(|(_, t)| !random_enough(t)) {
        bail!(
            "HAUL_OPERATOR_TOKEN: token {} of {} is {} characters with {} distinct ones; an operator token \
             must be at least {MIN_OPERATOR_TOKEN_CHARS} characters of random text with at least \
             {MIN_DISTINCT_CHARS} distinct ones, not a piece repeated (make one with `openssl rand -hex 32`)",
            i + 1,
            tokens.len(),
            weak.chars().count(),
            distinct(weak),
        );
    }
    Ok(tokens)
}

/// Fewest characters of an operator token.
pub const MIN_OPERATOR_TOKEN_CHARS: usize = 32;

/// Fewest distinct characters of an operator token: 32 random hex digits have about 14,
/// a word repeated to length far fewer.
pub const MIN_DISTINCT_CHARS: usize = 10;

fn distinct(token: &str) -> usize {
    token.chars().collect::<std::collections::BTreeSet<_>>().len()
}

/// Whether `token` is long and varied enough to be taken for random: it acts on loads,
/// so it must not fall to guessing.
pub fn random_enough(token: &str) -> bool {
    token.chars().count() >= MIN_OPERATOR_TOKEN_CHARS && distinct(token) >= MIN_DISTINCT_CHARS && !repeats(token)
}

/// Whether `token` is a shorter piece said again and again (`abcabcab…`).
fn repeats(token: &str) -> bool {
    let b = token.as_bytes();
    (1..=b.len() / 2).any(|period| b.iter().skip(period).zip(b).all(|(x, y)| x == y))
}

fn list_from_env(name: &str) -> anyhow::Result<Option<Vec<String>>> {
    let Ok(v) = std::env::var(name) else { return Ok(None) };
    let tokens: Vec<String> = v.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned).collect();
    if tokens.is_empty() {
        bail!("{name} is set but names no token");
    }
    if tokens.iter().any(|t| t.len() < 8) {
        bail!("{name}: every token must be at least 8 characters");
    }
    Ok(Some(tokens))
}

/// The token `./haul-api-token` holds now, if any (read only: nothing is made).
pub(crate) fn file_token() -> Option<String> {
    let t = std::fs::read_to_string(TOKEN_FILE).ok()?;
    let t = t.trim();
    (t.len() >= 8).then(|| t.to_owned())
}

/// The token in `./haul-api-token`, made there (mode 600) from the OS's random source
/// when the file is missing or holds no usable token.
pub(crate) fn token_from_file() -> anyhow::Result<Vec<String>> {
    let path = std::path::Path::new(TOKEN_FILE);
    let token = match file_token() {
        Some(t) => t,
        None => {
            let mut bytes = [0u8; TOKEN_BYTES];
            getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for the API token: {e}"))?;
            let t: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(path, &t).with_context(|| {
                let at = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
                format!(
                    "HAUL_API_TOKEN is not set, and the token haul made cannot be kept in {}: set HAUL_API_TOKEN \
                     (e.g. `export HAUL_API_TOKEN=$(openssl rand -hex 32)`), or run haul serve in a directory it may \
                     write to",
                    at.display()
                )
            })?;
            t
        }
    };
    warn!("HAUL_API_TOKEN is not set: using the token in ./{TOKEN_FILE}");
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

#[cfg(test)]
mod tests {
    use super::random_enough;

    #[test]
    fn operator_tokens_must_look_random() {
        for (token, ok) in [
            ("dispatch2024", false),
            ("dispatch2024dispatch2024dispatch2024", false),
            ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
            ("0123456789abcdef0123456789abcde", false),
            ("0123456789abcdef0123456789abcdef", false),
            ("3f9a0c7e1b5d2846ae0f9c3b7d1e5a28", true),
            ("5f0e3a9b7c1d2e4f6a8b0c9d7e5f3a1b8c2d4e6f0a1b3c5d7e9f", true),
            ("Xk2-p9Qz_vL4mN8rT6wY1bC3dF5gH7jK", true),
        ] {
            assert_eq!(random_enough(token), ok, "{token}");
        }
    }
}
