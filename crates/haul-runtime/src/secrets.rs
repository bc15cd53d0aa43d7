//! The secrets a process was given, gathered once at start into a [`Masker`]: what a
//! channel's or the model's error quotes is masked by each secret's literal value
//! before it is stored, logged or forwarded (a service that echoes `tok=…` with no
//! `Bearer` before it shows `tok=***`), whichever role the process runs.
//!
//! Every process reads the same variables, whatever its roles: a dispatcher-only
//! process masks the API and operator tokens too, so a service that was handed one by
//! mistake cannot make a dispatcher store it.

use haul_config::{ChannelConfig, Config};
use haul_core::Channel;
use haul_core::mask::Masker;

/// The variables that hold secrets whatever the settings say (comma-separated lists).
pub const SECRET_VARIABLES: [&str; 3] = ["HAUL_API_TOKEN", "HAUL_OPERATOR_TOKEN", "HAUL_TWILIO_AUTH_TOKEN"];

/// A masker of every secret `config` names and the environment holds: the channels'
/// tokens (`channels.*.token_env`), the model's key (`decider.llm.api_key_env`), the
/// API, operator and Twilio tokens, and the store URL's password; plus `more` (a token
/// `serve` read from its file).
pub fn configured<S: AsRef<str>>(config: &Config, more: impl IntoIterator<Item = S>) -> Masker {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut secrets: Vec<String> = Vec::new();
    for channel in Channel::ALL {
        let c: &ChannelConfig = config.channels.get(channel);
        secrets.extend(c.token_env.as_deref().and_then(var));
    }
    secrets.extend(var(&config.decider.llm.api_key_env));
    for name in SECRET_VARIABLES {
        if let Some(list) = var(name) {
            secrets.extend(list.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_owned));
        }
    }
    if let Some(password) = password_of(&config.store.url) {
        secrets.push(haul_core::redact::percent_decode(&password));
        secrets.push(password);
    }
    Masker::new(secrets).with(more)
}

/// The password of a `scheme://user:password@host/…` URL, as written in it.
fn password_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::password_of;

    #[test]
    fn a_store_urls_password_is_found() {
        let check = |url: &str, want: Option<&str>| assert_eq!(password_of(url).as_deref(), want, "{url}");
        check("postgres://haul:s3cr3t-pw@db:5432/haul", Some("s3cr3t-pw"));
        check("postgres://haul:p%40ss@db/haul?sslmode=require", Some("p%40ss"));
        check("postgres://haul@db/haul", None);
        check("sqlite://haul.db", None);
        check("sqlite::memory:", None);
        check("postgres://haul:@db/haul", None);
    }
}
