//! Settings: defaults that work on a fresh machine, a TOML file on top, `HAUL_*`
//! variables on top of that (flags are the binary's, over all three).
//!
//! A leaf: this crate knows the shape and the rules of every setting and nothing of
//! what uses them, so the runtime, the server, the harness and the binary all read it
//! and it reads none of them. Unknown keys and bad values are errors that name the key
//! (and the variable, when one set it), so a typo never silently falls back to a
//! default. It also knows where each value came from ([`Loaded::sources`]), which is
//! what `haul config show` prints, and the list of every setting
//! ([`Config::setting_paths`]), which the tests hold `docs/config.md` and
//! `examples/haul.toml` to.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use haul_core::sop::{EtaPolicy, Policies};
use haul_core::spend::{Budgets, Limit, Price};
use haul_core::time::format_duration;
use haul_core::{Channel, RetryPolicy, Risk, parse_duration};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration setting: written as `"90s"`, `"1h 30m"`, `"7d"` (see `parse_duration`).
mod duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// An optional duration setting (unset: a default derived from other settings).
mod opt_duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| parse_duration(&s).map_err(serde::de::Error::custom)).transpose()
    }
}

pub use haul_core::redact::redact_url;

/// Which backend `store.url` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

impl StoreKind {
    pub fn of_url(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("sqlite:") {
            Ok(StoreKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(StoreKind::Postgres)
        } else {
            bail!("store.url {:?} is neither sqlite://PATH, sqlite::memory: nor postgres://…", redact_url(url))
        }
    }
}

/// Declares a setting that is one of a few names, with the error that lists them.
macro_rules! named_kind {
    ($(#[$doc:meta])* $name:ident, $setting:literal, { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
        #[serde(try_from = "String", into = "&'static str")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl From<$name> for &'static str {
            fn from(k: $name) -> &'static str {
                k.as_str()
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(s: String) -> Result<Self, String> {
                Self::ALL.iter().copied().find(|k| k.as_str() == s).ok_or_else(|| {
                    let names: Vec<String> = Self::ALL.iter().map(|k| format!("{:?}", k.as_str())).collect();
                    format!("{} must be {}, not {s:?}", $setting, names.join(" or "))
                })
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

named_kind!(
    /// What decides after the deterministic filter.
    DeciderKind, "decider.kind", {
        /// The SOP of the standard operating procedure, in code.
        Sop = "sop",
        /// A chat-completions model with tool calls (`decider.llm.*`).
        Llm = "llm",
    }
);

named_kind!(
    /// Where the load queue lives.
    QueueKind, "queue.kind", {
        /// In the store's own database.
        Store = "store",
        /// An SQS FIFO queue (`queue.url`).
        Sqs = "sqs",
    }
);

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub store: StoreConfig,
    pub queue: QueueConfig,
    pub server: ServerConfig,
    pub worker: WorkerConfig,
    pub decider: DeciderConfig,
    pub dispatcher: DispatcherConfig,
    pub timers: TimersConfig,
    pub channels: ChannelsConfig,
    pub twilio: TwilioConfig,
    pub load_lock: LoadLockConfig,
    pub clients: BTreeMap<String, ClientConfig>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    pub url: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { url: "sqlite://haul.db".into() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    pub kind: QueueKind,
    /// The SQS FIFO queue's URL (`kind = "sqs"`).
    pub url: Option<String>,
    /// An SQS endpoint other than AWS's (a local emulator).
    pub endpoint: Option<String>,
    /// The AWS region; unset: the SDK's default chain (`AWS_REGION`, profile).
    pub region: Option<String>,
    /// How long a received message stays invisible: longer than a run may take.
    #[serde(with = "opt_duration")]
    pub visibility: Option<Duration>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig { kind: QueueKind::Store, url: None, endpoint: None, region: None, visibility: None }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: String,
    pub public_url: Option<String>,
    /// Open HTTP connections at most; past it a new one gets 503 and is closed.
    pub max_connections: usize,
    /// How long a connection may take to send a request's head, and (the same clock:
    /// it runs whenever the connection waits for a request) to stay idle between two.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// How long a request may take to send its body (at most 64 KiB).
    #[serde(with = "duration")]
    pub body_read_timeout: Duration,
    /// How long a write of an answer may make no progress (the client reads nothing)
    /// before the connection is closed.
    #[serde(with = "duration")]
    pub write_timeout: Duration,
    /// The addresses (or `address/prefix` networks) of the proxies in front of haul
    /// whose `X-Forwarded-For` names the client: per-client limits (the console's
    /// sign-in) count the address it gives. Empty: the peer's address counts.
    #[serde(deserialize_with = "address_list")]
    pub trusted_proxies: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            public_url: None,
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            trusted_proxies: Vec::new(),
        }
    }
}

/// A list of addresses as a TOML array, or as one comma-separated string (what a
/// `HAUL_*` variable gives).
fn address_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        One(String),
        Many(Vec<String>),
    }
    let items = match List::deserialize(d)? {
        List::One(s) => s.split(',').map(str::to_owned).collect(),
        List::Many(v) => v,
    };
    Ok(items.into_iter().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
}

/// An address (`10.0.0.1`, `::1`) or a network (`10.0.0.0/8`, `fd00::/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressRange {
    pub network: std::net::IpAddr,
    pub prefix: u8,
}

impl AddressRange {
    pub fn parse(s: &str) -> Option<AddressRange> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: std::net::IpAddr = addr.trim().parse().ok()?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max)?,
        };
        Some(AddressRange { network, prefix })
    }

    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr::{V4, V6};
        let p = u32::from(self.prefix);
        match (self.network, ip) {
            (V4(n), V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - p).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (V6(n), V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - p).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl ServerConfig {
    /// `trusted_proxies` parsed (checked by [`Config::validate`]; an entry that does not
    /// parse is left out).
    pub fn trusted_proxy_ranges(&self) -> Vec<AddressRange> {
        self.trusted_proxies.iter().filter_map(|s| AddressRange::parse(s)).collect()
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkerConfig {
    pub concurrency: usize,
    pub conflict_retries: u32,
    #[serde(with = "duration")]
    pub run_timeout: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig { concurrency: 32, conflict_retries: 5, run_timeout: Duration::from_secs(300) }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeciderConfig {
    pub kind: DeciderKind,
    pub llm: LlmConfig,
    /// Shadow mode: a settings file (the format of this one) whose client policies and
    /// `decider.*` make a second decider, asked after each committed decision and never
    /// dispatched. Unset: off.
    pub shadow: Option<PathBuf>,
}

impl Default for DeciderConfig {
    fn default() -> Self {
        DeciderConfig { kind: DeciderKind::Sop, llm: LlmConfig::default(), shadow: None }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmConfig {
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub api_key_env: String,
    #[serde(with = "duration")]
    pub timeout: Duration,
    /// What each model costs, by model name (`[decider.llm.prices."gpt-4o-mini"]`):
    /// each LLM decision records its cost by it.
    pub prices: BTreeMap<String, Price>,
    /// The budgets past which the SOP decides in the model's place.
    pub budget: LlmBudgetConfig,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            base_url: None,
            model: None,
            api_key_env: "HAUL_LLM_API_KEY".into(),
            timeout: Duration::from_secs(120),
            prices: BTreeMap::new(),
            budget: LlmBudgetConfig::default(),
        }
    }
}

/// `decider.llm.budget.*`: a load's lifetime and a client's UTC day, in tokens (in and
/// out) or dollars; unset: no limit.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmBudgetConfig {
    /// Read signed, so a negative one is refused naming the setting.
    pub load_tokens: Option<i64>,
    pub load_usd: Option<Usd>,
    pub client_tokens_per_day: Option<i64>,
    pub client_usd_per_day: Option<Usd>,
}

/// `clients.<name>.llm_budget.*`: the client's own day budget over
/// `decider.llm.budget.client_*_per_day`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientLlmBudgetConfig {
    pub tokens_per_day: Option<i64>,
    pub usd_per_day: Option<Usd>,
}

/// An amount of dollars as written: a number (`2.5`) or text (`"2.50"`, `"$2.50"`),
/// read to the micro-dollar when the settings are checked.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum Usd {
    Number(f64),
    Text(String),
}

impl Usd {
    /// In micro-dollars, or what is wrong, naming the setting `at`.
    pub fn micro(&self, at: &str) -> anyhow::Result<u64> {
        let text = match self {
            Usd::Number(n) if n.is_finite() && *n >= 0.0 => format!("{n:.6}"),
            Usd::Number(n) => bail!("{at}: {n} is not an amount of dollars (like 2.50)"),
            Usd::Text(t) => t.clone(),
        };
        haul_core::spend::parse_usd(&text).map_err(|e| anyhow::anyhow!("{at}: {e}"))
    }
}

/// A setting `decider.kind = "llm"` needs and did not get.
#[derive(Debug, thiserror::Error)]
pub enum LlmConfigError {
    #[error("decider.llm.{0} must be set when decider.kind is \"llm\"")]
    Missing(&'static str),
    #[error("decider.llm.base_url must start with http:// or https://, not {0:?}")]
    BadBaseUrl(String),
    #[error("decider.llm.api_key_env: the environment variable {0} is not set (it holds the model's API key)")]
    NoApiKey(String),
}

impl LlmConfig {
    /// The budgets, in micro-dollars and tokens, with each client's own; an error names
    /// the setting that does not read.
    pub fn budgets(&self, clients: &BTreeMap<String, ClientConfig>) -> anyhow::Result<Budgets> {
        let b = &self.budget;
        let usd = |v: &Option<Usd>, at: &str| v.as_ref().map(|u| u.micro(at)).transpose();
        let tokens = |v: Option<i64>, at: &str| -> anyhow::Result<Option<u64>> {
            v.map(|t| u64::try_from(t).map_err(|_| anyhow::anyhow!("{at} must be 0 or more tokens, not {t}")))
                .transpose()
        };
        let mut out = Budgets {
            load: Limit {
                tokens: tokens(b.load_tokens, "decider.llm.budget.load_tokens")?,
                micro_usd: usd(&b.load_usd, "decider.llm.budget.load_usd")?,
            },
            client_day: Limit {
                tokens: tokens(b.client_tokens_per_day, "decider.llm.budget.client_tokens_per_day")?,
                micro_usd: usd(&b.client_usd_per_day, "decider.llm.budget.client_usd_per_day")?,
            },
            clients_day: BTreeMap::new(),
        };
        for (name, c) in clients {
            let own = &c.llm_budget;
            if own.tokens_per_day.is_none() && own.usd_per_day.is_none() {
                continue;
            }
            let at = format!("clients.{name}.llm_budget.usd_per_day");
            let limit = Limit {
                tokens: tokens(own.tokens_per_day, &format!("clients.{name}.llm_budget.tokens_per_day"))?
                    .or(out.client_day.tokens),
                micro_usd: usd(&own.usd_per_day, &at)?.or(out.client_day.micro_usd),
            };
            out.clients_day.insert(name.clone(), limit);
        }
        Ok(out)
    }

    /// The price of the configured model, or why the prices and budgets cannot be used:
    /// a price out of range, a model the non-empty table does not price, a money budget
    /// with no price to count it by.
    pub fn price(&self, clients: &BTreeMap<String, ClientConfig>) -> anyhow::Result<Option<Price>> {
        for (model, p) in &self.prices {
            p.check(&format!("decider.llm.prices.{model:?}")).map_err(|e| anyhow::anyhow!(e))?;
        }
        let model = self.model.as_deref().unwrap_or_default();
        let price = self.prices.get(model).copied();
        if price.is_none() && !self.prices.is_empty() {
            let known: Vec<&str> = self.prices.keys().map(String::as_str).collect();
            bail!(
                "decider.llm.model = {model:?} has no price in decider.llm.prices (priced: {}); add \
                 [decider.llm.prices.{model:?}] with input_usd_per_mtok and output_usd_per_mtok",
                known.join(", ")
            );
        }
        if price.is_none() && self.budgets(clients)?.any_money() {
            bail!(
                "a dollar budget is set (decider.llm.budget.*_usd*, clients.<name>.llm_budget.usd_per_day) but \
                 decider.llm.model = {model:?} has no price: add [decider.llm.prices.{model:?}]"
            );
        }
        Ok(price)
    }

    /// Checks the settings `decider.kind = "llm"` needs, reading nothing from the environment.
    pub fn check(&self) -> Result<(), LlmConfigError> {
        let base_url =
            self.base_url.as_deref().filter(|s| !s.trim().is_empty()).ok_or(LlmConfigError::Missing("base_url"))?;
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(LlmConfigError::BadBaseUrl(base_url.to_owned()));
        }
        self.model.as_deref().filter(|s| !s.trim().is_empty()).ok_or(LlmConfigError::Missing("model"))?;
        if self.api_key_env.trim().is_empty() {
            return Err(LlmConfigError::Missing("api_key_env"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatcherConfig {
    /// Rows one claim takes at most.
    pub batch: usize,
    /// Sends a running dispatcher keeps in flight at once.
    pub in_flight: usize,
    #[serde(with = "duration")]
    pub lease: Duration,
    pub retry: RetryConfig,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig { batch: 32, in_flight: 64, lease: Duration::from_secs(90), retry: RetryConfig::default() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    #[serde(with = "duration")]
    pub base: Duration,
    #[serde(with = "duration")]
    pub cap: Duration,
    pub max_attempts: u32,
    #[serde(with = "duration")]
    pub budget: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        let p = RetryPolicy::default();
        RetryConfig { base: p.base, cap: p.cap, max_attempts: p.max_attempts, budget: p.budget }
    }
}

impl RetryConfig {
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy { base: self.base, cap: self.cap, max_attempts: self.max_attempts, budget: self.budget }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimersConfig {
    #[serde(with = "duration")]
    pub poll: Duration,
}

impl Default for TimersConfig {
    fn default() -> Self {
        TimersConfig { poll: Duration::from_secs(10) }
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelsConfig {
    pub sms: ChannelConfig,
    pub hero: ChannelConfig,
    pub slack: ChannelConfig,
    pub tms: ChannelConfig,
    pub ops: ChannelConfig,
}

impl ChannelsConfig {
    /// `channels.{channel}`: each field is named after its channel's config name.
    pub fn get(&self, channel: Channel) -> &ChannelConfig {
        match channel {
            Channel::Sms => &self.sms,
            Channel::Hero => &self.hero,
            Channel::Slack => &self.slack,
            Channel::Tms => &self.tms,
            Channel::Ops => &self.ops,
        }
    }

    pub fn get_mut(&mut self, channel: Channel) -> &mut ChannelConfig {
        match channel {
            Channel::Sms => &mut self.sms,
            Channel::Hero => &mut self.hero,
            Channel::Slack => &mut self.slack,
            Channel::Tms => &mut self.tms,
            Channel::Ops => &mut self.ops,
        }
    }
}

named_kind!(
    /// What a channel's service speaks.
    ChannelKind, "channels.*.kind", {
        /// haul's own JSON contract (docs/api.md), for every channel.
        Generic = "generic",
        /// Twilio's Messages API (`[twilio]`), for `channels.sms` only.
        Twilio = "twilio",
    }
);

/// Twilio's Messages API, where it answers unless `channels.sms.url` says otherwise.
pub const TWILIO_API_URL: &str = "https://api.twilio.com";

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelConfig {
    /// What the service speaks; unset: `generic`.
    pub kind: Option<ChannelKind>,
    /// None: record mode (a `twilio` channel: Twilio's own API).
    pub url: Option<String>,
    /// The environment variable holding the bearer token.
    pub token_env: Option<String>,
    #[serde(with = "opt_duration")]
    pub timeout: Option<Duration>,
    /// The most the channel's service takes, `N/s`, `N/min` or `N/h` (`haul_core::limit`),
    /// across every dispatcher; unset: no limit.
    pub rate: Option<String>,
    /// Sends at once after a quiet spell, 1 to 10000; unset: 1 (sends evenly spaced).
    pub burst: Option<i64>,
    /// The most sends at the service at once, across every dispatcher, 1 to 10000;
    /// unset: no cap.
    pub in_flight: Option<i64>,
}

impl ChannelConfig {
    pub fn kind(&self) -> ChannelKind {
        self.kind.unwrap_or(ChannelKind::Generic)
    }

    /// Where the service answers: `url`, or Twilio's API for a `twilio` channel; `None`
    /// is record mode.
    pub fn service_url(&self) -> Option<&str> {
        match (&self.url, self.kind()) {
            (Some(url), _) => Some(url),
            (None, ChannelKind::Twilio) => Some(TWILIO_API_URL),
            (None, ChannelKind::Generic) => None,
        }
    }

    /// The send limit `rate` and `burst` make, or what is wrong with them (the
    /// message names the setting under `channels.{name}`).
    pub fn limit(&self, name: &str) -> anyhow::Result<Option<haul_core::limit::Limit>> {
        limit_of(self.rate.as_deref(), self.burst, &format!("channels.{name}"))
    }

    /// The cap `in_flight` sets on sends at once, or what is wrong with it.
    pub fn in_flight_cap(&self, name: &str) -> anyhow::Result<Option<u32>> {
        let Some(cap) = self.in_flight else { return Ok(None) };
        match u32::try_from(cap) {
            Ok(cap @ 1..=MAX_IN_FLIGHT) => Ok(Some(cap)),
            _ => bail!("channels.{name}.in_flight: {cap} is not 1 to {MAX_IN_FLIGHT}"),
        }
    }
}

/// The send limit a `rate` and `burst` under `at` (the settings' prefix) make, or
/// what is wrong with them, naming the setting.
fn limit_of(rate: Option<&str>, burst: Option<i64>, at: &str) -> anyhow::Result<Option<haul_core::limit::Limit>> {
    let Some(rate) = rate else {
        if burst.is_some() {
            bail!("{at}.burst is set without {at}.rate: a burst of what rate?");
        }
        return Ok(None);
    };
    let rate = haul_core::limit::Rate::parse(rate).map_err(|e| anyhow::anyhow!("{at}.rate: {e}"))?;
    let burst = burst.unwrap_or(1);
    let burst = u32::try_from(burst)
        .map_err(|_| anyhow::anyhow!("{at}.burst: {burst} is not 1 to {}", haul_core::limit::MAX_BURST))?;
    haul_core::limit::Limit::new(rate, burst).map(Some).map_err(|e| anyhow::anyhow!("{at}.burst: {e}"))
}

/// A client's own send limit on one channel (`clients.<name>.rates.<channel>`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientRateConfig {
    /// As `channels.*.rate`, for this client's rows only.
    pub rate: Option<String>,
    /// As `channels.*.burst`.
    pub burst: Option<i64>,
}

/// Most `channels.*.in_flight` may be.
pub const MAX_IN_FLIGHT: u32 = 10_000;

/// The Twilio account `channels.sms.kind = "twilio"` sends from. Its secret (the
/// Auth Token, or the API key's secret) is read from the variable
/// `channels.sms.token_env` names, `HAUL_TWILIO_AUTH_TOKEN` when unset.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TwilioConfig {
    /// `AC` and 32 hex digits: the account in the API's paths.
    pub account_sid: Option<String>,
    /// `SK` and 32 hex digits: an API key to sign in with instead of the account.
    pub api_key_sid: Option<String>,
    /// The sending number, E.164 (`+15555550000`); or `messaging_service_sid`.
    pub from: Option<String>,
    /// `MG` and 32 hex digits: a Messaging Service, which picks the sending number.
    pub messaging_service_sid: Option<String>,
    /// How long Twilio may keep a message queued before it gives up on it, 1s to 10h;
    /// unset: the shortest ETA ask interval less a minute, so an ask never arrives
    /// after the next one was decided.
    #[serde(with = "opt_duration")]
    pub validity_period: Option<Duration>,
}

/// Twilio's longest `ValidityPeriod`, in seconds.
pub const TWILIO_MAX_VALIDITY_S: u64 = 36_000;

/// Whether `s` is `prefix` and 32 hex digits, the form of Twilio's SIDs.
pub fn is_twilio_sid(s: &str, prefix: &str) -> bool {
    s.len() == 34 && s.starts_with(prefix) && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `s` is an E.164 number: `+` and 8 to 15 digits, the first not 0.
pub fn is_e164(s: &str) -> bool {
    let Some(digits) = s.strip_prefix('+') else { return false };
    (8..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0')
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadLockConfig {
    pub enabled: bool,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    pub eta_request: EtaRequestConfig,
    /// The client's share of a saturated channel against a client of weight 1 (read
    /// signed, so a negative one is refused naming the setting).
    pub send_weight: Option<i64>,
    /// The client's own send limits, by channel name (`[clients.<name>.rates.tms]`):
    /// its rows of that channel never go faster, whatever the channel allows.
    pub rates: BTreeMap<String, ClientRateConfig>,
    /// The client's own LLM budget for a UTC day.
    pub llm_budget: ClientLlmBudgetConfig,
}

impl ClientConfig {
    /// The client `name`'s own limit on `channel`, or what is wrong with it.
    pub fn limit(&self, name: &str, channel: Channel) -> anyhow::Result<Option<haul_core::limit::Limit>> {
        let Some(r) = self.rates.get(channel.config_name()) else { return Ok(None) };
        limit_of(r.rate.as_deref(), r.burst, &format!("clients.{name}.rates.{}", channel.config_name()))
    }
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtaRequestConfig {
    #[serde(with = "opt_duration")]
    pub retry_after: Option<Duration>,
    pub max_attempts: Option<u32>,
    pub trigger_risk: Option<Risk>,
}

/// A TOML error as one line: `line N: message`.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().replace('\n', " ");
    match e.span() {
        Some(span) => format!("line {}: {msg}", text[..span.start.min(text.len())].matches('\n').count() + 1),
        None => msg,
    }
}

/// Builds the SOP policies from `clients.*.eta_request` over the defaults.
pub fn policies(clients: &BTreeMap<String, ClientConfig>) -> Policies {
    let default = EtaPolicy::default();
    let clients = clients
        .iter()
        .map(|(name, c)| {
            let e = &c.eta_request;
            (
                name.clone(),
                EtaPolicy {
                    retry_after: e.retry_after.unwrap_or(default.retry_after),
                    max_attempts: e.max_attempts.unwrap_or(default.max_attempts),
                    trigger_risk: e.trigger_risk.unwrap_or(default.trigger_risk),
                },
            )
        })
        .collect();
    Policies { default, clients }
}

/// Every setting an environment variable can set besides the channels' (see
/// [`CHANNEL_SETTINGS`]): `HAUL_` and the dotted path in capitals with `_` for `.`
/// (`worker.run_timeout` is `HAUL_WORKER_RUN_TIMEOUT`). Per-client policies are for
/// the TOML file only.
const ENV_SETTINGS: &[(&str, Kind)] = &[
    ("store.url", Kind::Text),
    ("queue.kind", Kind::Text),
    ("queue.url", Kind::Text),
    ("queue.endpoint", Kind::Text),
    ("queue.region", Kind::Text),
    ("queue.visibility", Kind::Text),
    ("server.listen", Kind::Text),
    ("server.public_url", Kind::Text),
    ("server.max_connections", Kind::Int),
    ("server.header_read_timeout", Kind::Text),
    ("server.body_read_timeout", Kind::Text),
    ("server.write_timeout", Kind::Text),
    ("server.trusted_proxies", Kind::Text),
    ("worker.concurrency", Kind::Int),
    ("worker.conflict_retries", Kind::Int),
    ("worker.run_timeout", Kind::Text),
    ("decider.kind", Kind::Text),
    ("decider.llm.base_url", Kind::Text),
    ("decider.llm.model", Kind::Text),
    ("decider.llm.api_key_env", Kind::Text),
    ("decider.llm.timeout", Kind::Text),
    ("decider.llm.budget.load_tokens", Kind::Int),
    ("decider.llm.budget.load_usd", Kind::Text),
    ("decider.llm.budget.client_tokens_per_day", Kind::Int),
    ("decider.llm.budget.client_usd_per_day", Kind::Text),
    ("decider.shadow", Kind::Text),
    ("dispatcher.batch", Kind::Int),
    ("dispatcher.in_flight", Kind::Int),
    ("dispatcher.lease", Kind::Text),
    ("dispatcher.retry.base", Kind::Text),
    ("dispatcher.retry.cap", Kind::Text),
    ("dispatcher.retry.max_attempts", Kind::Int),
    ("dispatcher.retry.budget", Kind::Text),
    ("timers.poll", Kind::Text),
    ("twilio.account_sid", Kind::Text),
    ("twilio.api_key_sid", Kind::Text),
    ("twilio.from", Kind::Text),
    ("twilio.messaging_service_sid", Kind::Text),
    ("twilio.validity_period", Kind::Text),
    ("load_lock.enabled", Kind::Bool),
];

/// The settings of each channel, `channels.{config name}.{setting}` for every channel.
const CHANNEL_SETTINGS: [(&str, Kind); 7] = [
    ("kind", Kind::Text),
    ("url", Kind::Text),
    ("token_env", Kind::Text),
    ("timeout", Kind::Text),
    ("rate", Kind::Text),
    ("burst", Kind::Int),
    ("in_flight", Kind::Int),
];

/// The setting `HAUL_{name}` sets, and its kind.
/// Every setting a variable can set: [`ENV_SETTINGS`] and each channel's.
fn env_settings() -> impl Iterator<Item = (String, Kind)> {
    let channels = Channel::ALL
        .into_iter()
        .flat_map(|c| CHANNEL_SETTINGS.map(|(s, k)| (format!("channels.{}.{s}", c.config_name()), k)));
    ENV_SETTINGS.iter().map(|(p, k)| (p.to_string(), *k)).chain(channels)
}

fn env_setting(name: &str) -> Option<(String, Kind)> {
    if name == "HAUL_PUBLIC_URL" {
        return Some(("server.public_url".into(), Kind::Text));
    }
    env_settings().find(|(path, _)| env_name(path) == name)
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Text,
    Int,
    Bool,
}

/// Settings only the TOML file can set, with `<name>` for the part the file chooses.
const FILE_SETTINGS: &[&str] = &[
    "clients.<name>.eta_request.retry_after",
    "clients.<name>.eta_request.max_attempts",
    "clients.<name>.eta_request.trigger_risk",
    "clients.<name>.send_weight",
    "clients.<name>.rates.<channel>.rate",
    "clients.<name>.rates.<channel>.burst",
    "clients.<name>.llm_budget.tokens_per_day",
    "clients.<name>.llm_budget.usd_per_day",
    "decider.llm.prices.<model>.input_usd_per_mtok",
    "decider.llm.prices.<model>.output_usd_per_mtok",
];

/// Flags of `haul serve` (and the commands that open the store) over a setting.
pub const FLAGS: &[(&str, &str)] = &[("--db", "store.url"), ("--listen", "server.listen")];

/// `HAUL_*` variables that are not settings, and what reads them. Setting none of them
/// is an error; `serve` reads the secrets, the binary `HAUL_LOG`, the tools the rest.
pub const NOT_SETTINGS: &[(&str, &str)] = &[
    ("HAUL_API_TOKEN", "secret: the API's bearer tokens, comma-separated"),
    ("HAUL_OPERATOR_TOKEN", "secret: the operators' bearer tokens (operator actions), comma-separated"),
    ("HAUL_TWILIO_AUTH_TOKEN", "secret: the key of Twilio's webhook signatures"),
    ("HAUL_LLM_API_KEY", "secret: the model's API key (the default of decider.llm.api_key_env)"),
    ("HAUL_LOG", "log filter, e.g. haul=debug"),
    ("HAUL_LOG_FORMAT", "log lines as text (the default) or json"),
    ("HAUL_SQS_ENDPOINT", "a running SQS emulator for haul eval --queue sqs and the tests"),
    ("HAUL_TEST_MAY_RESTART_POSTGRES", "scripts/crash-test may restart the local PostgreSQL"),
    ("HAUL_BENCH_SQLITE_OPTS", "haul bench: query options appended to its SQLite URL"),
];

/// The variable haul reads that `name` (one it does not) was most likely meant to be:
/// a setting's or one of [`NOT_SETTINGS`], a few letters away at most.
pub fn closest_variable(name: &str) -> Option<String> {
    let known = env_settings()
        .map(|(p, _)| env_name(&p))
        .chain(NOT_SETTINGS.iter().map(|(n, _)| (*n).to_owned()))
        .chain(["HAUL_PUBLIC_URL".to_owned()]);
    let most = (name.len() / 5).max(2);
    known.map(|k| (edit_distance(name, &k), k)).filter(|(d, _)| *d <= most).min().map(|(_, k)| k)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

impl Loaded {
    /// What a person should hear about these settings before a command runs: each
    /// `HAUL_*` variable that names no setting (with the one it was likely meant to be),
    /// and `DATABASE_URL` set while `store.url` is the default (it names where evals and
    /// tests make scratch schemas, never haul's store).
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .unknown
            .iter()
            .map(|name| match closest_variable(name) {
                Some(meant) => format!("{name} names no setting; ignored (did you mean {meant}?)"),
                None => format!("{name} names no setting; ignored"),
            })
            .collect();
        let database_url = std::env::var("DATABASE_URL").is_ok_and(|v| !v.trim().is_empty());
        if database_url && *self.source("store.url") == Source::Default {
            notes.push(format!(
                "DATABASE_URL is set but haul's store is store.url, here the default {:?}: set HAUL_STORE_URL or \
                 --db to use PostgreSQL (DATABASE_URL only names where evals, the simulator, the benchmarks and the \
                 tests make their scratch schemas)",
                self.config.store.url
            ));
        }
        if self.config.channels.sms.kind() == ChannelKind::Twilio && self.config.server.public_url.is_none() {
            notes.push(
                "channels.sms.kind = \"twilio\" without server.public_url: Twilio is asked for no delivery receipts, \
                 so an SMS it cannot deliver is seen only when the driver does not answer (docs/twilio.md)"
                    .into(),
            );
        }
        notes
    }
}

/// The variable for a setting: `HAUL_` and the dotted path in capitals, `_` for `.`.
pub fn env_name(path: &str) -> String {
    format!("HAUL_{}", path.to_ascii_uppercase().replace('.', "_"))
}

/// Sets `path` (dotted) in a TOML table, creating the tables on the way.
fn set_path(table: &mut toml::Table, path: &str, value: toml::Value) -> anyhow::Result<()> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        let entry = t.entry(p.to_owned()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry.as_table_mut().ok_or_else(|| anyhow::anyhow!("{p} is not a table"))?;
    }
    t.insert(last.to_owned(), value);
    Ok(())
}

/// The dotted paths of every value (not table) in `table`.
fn leaf_paths(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => leaf_paths(t, &path, out),
            _ => out.push(path),
        }
    }
}

/// Where a setting's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    /// The variable's name.
    Variable(String),
    /// The flag's name (`--db`).
    Flag(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Variable(v) => write!(f, "variable {v}"),
            Source::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A config with where each value came from, before flags and validation.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub config: Config,
    /// Settings not at their default, by dotted path.
    pub sources: BTreeMap<String, Source>,
    /// `HAUL_*` variables that name no setting and nothing else haul reads.
    pub unknown: Vec<String>,
}

impl Loaded {
    pub fn source(&self, path: &str) -> &Source {
        self.sources.get(path).unwrap_or(&Source::Default)
    }

    /// Applies a flag of [`FLAGS`] over the file and the variables.
    pub fn set_by_flag(&mut self, flag: &str, value: &str) -> anyhow::Result<()> {
        let Some((_, path)) = FLAGS.iter().find(|(f, _)| *f == flag) else { bail!("{flag} sets no setting") };
        let mut table = toml::Table::try_from(&self.config)?;
        set_path(&mut table, path, toml::Value::String(value.to_owned()))?;
        self.config = table.try_into().map_err(|e: toml::de::Error| anyhow::anyhow!("{flag}: {}", e.message()))?;
        self.sources.insert((*path).to_owned(), Source::Flag(flag.to_owned()));
        Ok(())
    }

    /// Checks the rules between settings; an error names the settings and, for each
    /// that is not at its default, where it was set.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.config.validate().map_err(|e| {
            let message = format!("{e:#}");
            let from: Vec<String> = self
                .sources
                .iter()
                .filter(|(path, _)| message.contains(path.as_str()))
                .map(|(path, source)| format!("{path} from {source}"))
                .collect();
            if from.is_empty() { anyhow::anyhow!(message) } else { anyhow::anyhow!("{message} ({})", from.join(", ")) }
        })
    }
}

impl Config {
    /// Defaults, then the TOML file (if any), then `HAUL_*` variables, validated.
    /// Returns the config and the `HAUL_*` variables that named no setting (for a warning).
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<(Self, Vec<String>)> {
        let loaded = Self::load_with_sources(file, env)?;
        loaded.validate()?;
        Ok((loaded.config, loaded.unknown))
    }

    /// Defaults, the TOML file (if any), then `HAUL_*` variables, each value checked
    /// for its type where it was written (a file error names its line, a variable's
    /// names the variable and its value). The rules between settings are
    /// [`Loaded::validate`]'s, after the flags.
    pub fn load_with_sources(
        file: Option<&std::path::Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<Loaded> {
        let mut sources = BTreeMap::new();
        let mut table: toml::Table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                // Read alone first, so errors point at the file's own lines.
                let _: Config = toml::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), one_line(&text, &e)))?;
                let table: toml::Table = text
                    .parse()
                    .map_err(|e: toml::de::Error| anyhow::anyhow!("{}: {}", path.display(), one_line(&text, &e)))?;
                let mut paths = Vec::new();
                leaf_paths(&table, "", &mut paths);
                sources.extend(paths.into_iter().map(|p| (p, Source::File(path.to_owned()))));
                table
            }
            None => toml::Table::new(),
        };
        let mut unknown = Vec::new();
        let mut env: Vec<(String, String)> = env.filter(|(k, _)| k.starts_with("HAUL_")).collect();
        env.sort();
        for (name, value) in env {
            if NOT_SETTINGS.iter().any(|(n, _)| *n == name) {
                continue;
            }
            let Some((path, kind)) = env_setting(&name) else {
                unknown.push(name);
                continue;
            };
            let shown = redact_url(&value);
            let v = match kind {
                Kind::Text => toml::Value::String(value),
                Kind::Int => toml::Value::Integer(
                    value
                        .trim()
                        .parse()
                        .map_err(|_| anyhow::anyhow!("{name}={shown:?} ({path}): must be a whole number"))?,
                ),
                Kind::Bool => toml::Value::Boolean(match value.trim() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => anyhow::bail!("{name}={shown:?} ({path}): must be true or false"),
                }),
            };
            // Read alone, so a bad value is blamed on its variable.
            let mut alone = toml::Table::new();
            set_path(&mut alone, &path, v.clone())?;
            if let Err(e) = toml::Value::Table(alone).try_into::<Config>() {
                bail!("{name}={shown:?} ({path}): {}", e.message().trim_end());
            }
            set_path(&mut table, &path, v)?;
            sources.insert(path.clone(), Source::Variable(name));
        }
        let config: Config = table
            .try_into()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("with the HAUL_* variables: {}", e.message()))?;
        // Variables the settings name (tokens, the model's key) are read, not unknown.
        let named = config.named_variables();
        unknown.retain(|n| !named.iter().any(|(v, _)| v == n));
        Ok(Loaded { config, sources, unknown })
    }

    pub fn from_toml(text: &str) -> anyhow::Result<Self> {
        let config: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", one_line(text, &e)))?;
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::from_toml(&text).with_context(|| format!("in {}", path.display()))
    }

    /// The shadow decider's settings (`decider.shadow`): the defaults and that file,
    /// no `HAUL_*` variable (they are the primary's), validated. Only its client
    /// policies and `decider.*` are used. `None` when shadow mode is off. An error
    /// names the file.
    pub fn shadow_config(&self) -> anyhow::Result<Option<Config>> {
        let Some(path) = &self.decider.shadow else { return Ok(None) };
        let shadow = Config::from_file(path).with_context(|| format!("decider.shadow = {:?}", path.display()))?;
        if shadow.decider.shadow.is_some() {
            bail!(
                "decider.shadow = {:?}: the shadow's own settings name a shadow (decider.shadow must be unset there)",
                path.display()
            );
        }
        Ok(Some(shadow))
    }

    /// Every setting's dotted path: those a variable can set, then the file-only ones
    /// (`<name>` stands for a client's name).
    pub fn setting_paths() -> Vec<String> {
        env_settings().map(|(p, _)| p).chain(FILE_SETTINGS.iter().map(|p| (*p).to_owned())).collect()
    }

    /// The variable that sets `path`, if one does.
    pub fn variable_of(path: &str) -> Option<String> {
        env_settings().any(|(p, _)| p == path).then(|| env_name(path))
    }

    /// Every setting with its value as TOML (`None`: unset), in [`Config::setting_paths`]
    /// order; a client's settings once per client in the file.
    pub fn values(&self) -> Vec<(String, Option<String>)> {
        let table = toml::Table::try_from(self).unwrap_or_default();
        let lookup = |path: &str| -> Option<String> {
            let mut v: Option<&toml::Value> = None;
            let mut t = Some(&table);
            for part in path.split('.') {
                v = t.and_then(|t| t.get(part));
                t = v.and_then(|v| v.as_table());
            }
            v.map(|v| v.to_string())
        };
        let mut out: Vec<(String, Option<String>)> = env_settings()
            .map(|(p, _)| {
                let v = lookup(&p);
                (p, v)
            })
            .collect();
        for p in FILE_SETTINGS.iter().filter(|p| p.contains("<model>")) {
            for model in self.decider.llm.prices.keys() {
                let path = p.replace("<model>", &format!("{model:?}"));
                let value = p.rsplit('.').next().and_then(|f| {
                    let price = self.decider.llm.prices.get(model)?;
                    Some(if f == "input_usd_per_mtok" { price.input_usd_per_mtok } else { price.output_usd_per_mtok })
                });
                out.push((path, value.map(|v| v.to_string())));
            }
        }
        for name in self.clients.keys() {
            for p in FILE_SETTINGS.iter().filter(|p| p.contains("<name>")) {
                let path = p.replace("<name>", name);
                let value = lookup(&path);
                out.push((path, value));
            }
        }
        out
    }

    /// What an unset setting means, for the ones whose default depends on others.
    pub fn unset_means(&self, path: &str) -> Option<String> {
        let name = path.split('.').nth(1).unwrap_or_default();
        match path {
            "queue.visibility" => Some(format!("worker.run_timeout + 1m = {}", format_duration(self.visibility()))),
            "server.public_url" => Some(format!("http://{}", self.server.listen)),
            "decider.llm.base_url" | "decider.llm.model" => Some("needed when decider.kind = \"llm\"".into()),
            "decider.shadow" => Some("no shadow decider".into()),
            "queue.url" => Some("needed when queue.kind = \"sqs\"".into()),
            "queue.endpoint" => Some("AWS's own".into()),
            "queue.region" => Some("the AWS SDK's default chain".into()),
            "channels.sms.url" if self.channels.sms.kind() == ChannelKind::Twilio => Some(TWILIO_API_URL.into()),
            "channels.sms.token_env" if self.channels.sms.kind() == ChannelKind::Twilio => {
                Some("HAUL_TWILIO_AUTH_TOKEN".into())
            }
            "twilio.validity_period" => Some(format!(
                "the shortest ETA ask interval less a minute = {}",
                format_duration(self.twilio_validity())
            )),
            "twilio.account_sid" | "twilio.from" | "twilio.messaging_service_sid" => {
                Some("needed when channels.sms.kind = \"twilio\"".into())
            }
            "twilio.api_key_sid" => Some("the account's own Auth Token".into()),
            _ if path.starts_with("channels.") && path.ends_with(".kind") => Some("generic".into()),
            _ if path.starts_with("channels.") && path.ends_with(".url") => Some(format!("record mode for {name}")),
            _ if path.starts_with("channels.") && path.ends_with(".token_env") => Some("no token".into()),
            _ if path.starts_with("channels.") && path.ends_with(".timeout") => Some("5s".into()),
            _ if path.starts_with("channels.") && path.ends_with(".rate") => Some("no limit".into()),
            _ if path.starts_with("channels.") && path.ends_with(".burst") => Some("1".into()),
            _ if path.starts_with("channels.") && path.ends_with(".in_flight") => Some("no cap".into()),
            _ if path.starts_with("clients.") => {
                let p = EtaPolicy::default();
                Some(match path.rsplit('.').next().unwrap_or_default() {
                    "retry_after" => format_duration(p.retry_after),
                    "max_attempts" => p.max_attempts.to_string(),
                    _ => p.trigger_risk.as_str().to_owned(),
                })
            }
            _ => None,
        }
    }

    /// Variables the settings name, with the setting that names each: the channels'
    /// tokens and the model's API key (only with `decider.kind = "llm"`).
    pub fn named_variables(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for channel in Channel::ALL {
            let (name, c) = (channel.config_name(), self.channels.get(channel));
            if let Some(v) = &c.token_env {
                out.push((v.clone(), format!("channels.{name}.token_env")));
            }
        }
        if self.channels.sms.kind() == ChannelKind::Twilio && self.channels.sms.token_env.is_none() {
            out.push(("HAUL_TWILIO_AUTH_TOKEN".into(), "channels.sms.token_env (unset with kind \"twilio\")".into()));
        }
        if self.decider.kind == DeciderKind::Llm {
            out.push((self.decider.llm.api_key_env.clone(), "decider.llm.api_key_env".into()));
        }
        // A shadow file that does not read is reported by `shadow_config`.
        if let Ok(Some(shadow)) = self.shadow_config()
            && shadow.decider.kind == DeciderKind::Llm
        {
            out.push((shadow.decider.llm.api_key_env.clone(), "decider.shadow's decider.llm.api_key_env".into()));
        }
        out
    }

    /// How long Twilio may keep an SMS queued: `twilio.validity_period`, or the
    /// shortest ETA ask interval (of any client) less a minute, at least 1s and at most
    /// Twilio's 10h. An ask that waited longer would arrive after the next was decided.
    pub fn twilio_validity(&self) -> Duration {
        if let Some(d) = self.twilio.validity_period {
            return d;
        }
        let policies = policies(&self.clients);
        let shortest = policies.clients.values().chain([&policies.default]).map(|p| p.retry_after).min();
        let less_a_minute = shortest.unwrap_or_default().saturating_sub(Duration::from_secs(60));
        less_a_minute.clamp(Duration::from_secs(1), Duration::from_secs(TWILIO_MAX_VALIDITY_S))
    }

    /// The visibility timeout: the run timeout plus a minute, so a run that is still
    /// inside its time limit is never redelivered under itself.
    pub fn visibility(&self) -> Duration {
        self.queue.visibility.unwrap_or(self.worker.run_timeout + Duration::from_secs(60))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        StoreKind::of_url(&self.store.url).context("store.url")?;
        if !(1..=65_536).contains(&self.server.max_connections) {
            bail!("server.max_connections must be 1 to 65536, not {}", self.server.max_connections);
        }
        let seconds = Duration::from_secs;
        if !(seconds(1)..=seconds(60)).contains(&self.server.header_read_timeout) {
            bail!("server.header_read_timeout must be 1s to 60s");
        }
        if !(seconds(1)..=seconds(300)).contains(&self.server.body_read_timeout) {
            bail!("server.body_read_timeout must be 1s to 5m");
        }
        if !(seconds(1)..=seconds(300)).contains(&self.server.write_timeout) {
            bail!("server.write_timeout must be 1s to 5m");
        }
        if let Some(bad) = self.server.trusted_proxies.iter().find(|p| AddressRange::parse(p).is_none()) {
            let bad: String = bad.chars().take(60).collect();
            bail!("server.trusted_proxies: {bad:?} is not an address or a network (10.0.0.1, 10.0.0.0/8, fd00::/8)");
        }
        if !(1..=1024).contains(&self.worker.concurrency) {
            bail!("worker.concurrency must be 1 to 1024, not {}", self.worker.concurrency);
        }
        if self.worker.conflict_retries > 100 {
            bail!("worker.conflict_retries must be at most 100");
        }
        if self.worker.run_timeout < Duration::from_secs(1) {
            bail!("worker.run_timeout must be at least 1s");
        }
        if self.visibility() <= self.worker.run_timeout {
            bail!("queue.visibility must outlast worker.run_timeout");
        }
        if self.decider.kind == DeciderKind::Llm {
            self.decider.llm.check()?;
        }
        // Read whatever the decider: a bad budget or price is named at start, not when
        // the decider is switched to the model.
        self.decider.llm.budgets(&self.clients)?;
        if self.decider.kind == DeciderKind::Llm {
            self.decider.llm.price(&self.clients)?;
        }
        if self.queue.kind == QueueKind::Sqs {
            match self.queue.url.as_deref() {
                None | Some("") => bail!("queue.url must name the SQS FIFO queue when queue.kind = \"sqs\""),
                Some(u) if !u.ends_with(".fifo") => {
                    bail!("queue.url must be an SQS FIFO queue (ending in .fifo), not {u:?}")
                }
                Some(_) => {}
            }
            if self.visibility() > Duration::from_secs(12 * 60 * 60) {
                bail!("queue.visibility must be at most 12h on SQS");
            }
        }
        if !(1..=1000).contains(&self.dispatcher.batch) {
            bail!("dispatcher.batch must be 1 to 1000, not {}", self.dispatcher.batch);
        }
        if !(1..=1000).contains(&self.dispatcher.in_flight) {
            bail!("dispatcher.in_flight must be 1 to 1000, not {}", self.dispatcher.in_flight);
        }
        if self.dispatcher.lease < Duration::from_secs(10) {
            bail!("dispatcher.lease must be at least 10s (sends time out after 5s)");
        }
        let r = &self.dispatcher.retry;
        if r.base.is_zero() || r.cap < r.base {
            bail!("dispatcher.retry.base must be above zero and at most dispatcher.retry.cap");
        }
        if !(2..=100).contains(&r.max_attempts) {
            bail!("dispatcher.retry.max_attempts must be 2 to 100 (the first retry is always allowed)");
        }
        if self.timers.poll.is_zero() || self.timers.poll > Duration::from_secs(30) {
            bail!("timers.poll must be above zero and at most 30s");
        }
        for (name, c) in &self.clients {
            haul_core::event::validate_client(name).with_context(|| format!("clients.{name}"))?;
            if let Some(n) = c.eta_request.max_attempts
                && !(1..=20).contains(&n)
            {
                bail!("clients.{name}.eta_request.max_attempts must be 1 to 20");
            }
            if c.eta_request.retry_after.is_some_and(|d| d < Duration::from_secs(1)) {
                bail!("clients.{name}.eta_request.retry_after must be at least 1s");
            }
            if let Some(w) = c.send_weight
                && !(1..=i64::from(haul_core::limit::MAX_WEIGHT)).contains(&w)
            {
                bail!("clients.{name}.send_weight must be 1 to {}, not {w}", haul_core::limit::MAX_WEIGHT);
            }
            for channel in c.rates.keys() {
                if !Channel::ALL.iter().any(|ch| ch.config_name() == channel) {
                    bail!("clients.{name}.rates.{channel}: no such channel (sms, hero, slack, tms, ops)");
                }
            }
            for channel in Channel::ALL {
                c.limit(name, channel)?;
            }
        }
        for name in Channel::ALL {
            let c = self.channels.get(name);
            if let Some(url) = &c.url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                bail!("channels.{name}.url must start with http:// or https://");
            }
            if c.timeout.is_some_and(|t| t.is_zero() || t >= self.dispatcher.lease) {
                bail!("channels.{name}.timeout must be above zero and well inside dispatcher.lease");
            }
            c.limit(name.config_name())?;
            c.in_flight_cap(name.config_name())?;
            if c.kind() == ChannelKind::Twilio && name != Channel::Sms {
                bail!("channels.{name}.kind: \"twilio\" is for channels.sms only");
            }
        }
        self.validate_twilio()
    }

    /// `[twilio]`: each SID in its form, a sender when SMS goes through Twilio.
    fn validate_twilio(&self) -> anyhow::Result<()> {
        let t = &self.twilio;
        for (setting, value, prefix) in [
            ("account_sid", &t.account_sid, "AC"),
            ("api_key_sid", &t.api_key_sid, "SK"),
            ("messaging_service_sid", &t.messaging_service_sid, "MG"),
        ] {
            if let Some(v) = value
                && !is_twilio_sid(v, prefix)
            {
                bail!("twilio.{setting}: {v:?} is not {prefix} and 32 hex digits");
            }
        }
        if let Some(from) = &t.from
            && !is_e164(from)
        {
            bail!("twilio.from: {from:?} is not a phone number in E.164 form (+ and 8 to 15 digits)");
        }
        if t.validity_period.is_some_and(|d| !(1..=TWILIO_MAX_VALIDITY_S).contains(&d.as_secs())) {
            bail!("twilio.validity_period must be 1s to 10h (Twilio's range)");
        }
        if self.channels.sms.kind() == ChannelKind::Twilio {
            if t.account_sid.is_none() {
                bail!("channels.sms.kind = \"twilio\" needs twilio.account_sid");
            }
            if t.from.is_none() && t.messaging_service_sid.is_none() {
                bail!("channels.sms.kind = \"twilio\" needs twilio.from or twilio.messaging_service_sid (who sends)");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod hint_tests {
    #[test]
    fn a_misspelt_variable_is_told_the_one_it_meant() {
        let check =
            |name: &str, want: Option<&str>| assert_eq!(super::closest_variable(name).as_deref(), want, "{name}");
        check("HAUL_WORKER_CONCURENCY", Some("HAUL_WORKER_CONCURRENCY"));
        check("HAUL_STORE_UR", Some("HAUL_STORE_URL"));
        check("HAUL_API_TOKENS", Some("HAUL_API_TOKEN"));
        check("HAUL_CHANNELS_SMS_UR", Some("HAUL_CHANNELS_SMS_URL"));
        check("HAUL_NOTHING_LIKE_ANY", None);
    }
}

#[cfg(test)]
mod address_tests {
    use super::AddressRange;

    #[test]
    fn address_ranges_contain_what_their_prefix_says() {
        let check = |range: &str, ip: &str, want: bool| {
            let r = AddressRange::parse(range).unwrap();
            assert_eq!(r.contains(ip.parse().unwrap()), want, "{range} ∋ {ip}");
        };
        check("10.0.0.1", "10.0.0.1", true);
        check("10.0.0.1", "10.0.0.2", false);
        check("10.0.0.0/8", "10.255.1.2", true);
        check("10.0.0.0/8", "11.0.0.1", false);
        check("0.0.0.0/0", "8.8.8.8", true);
        check("192.168.1.0/24", "192.168.2.1", false);
        check("fd00::/8", "fd12::1", true);
        check("fd00::/8", "fe80::1", false);
        check("::1", "::1", true);
        check("10.0.0.0/8", "::1", false);
        check("::/0", "10.0.0.1", false);
        for bad in ["", "x", "10.0.0.0/33", "::/129", "10.0.0.0/x", "10.0.0"] {
            assert_eq!(AddressRange::parse(bad), None, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml: &str, expected_err: Option<&str>) {
        match (Config::from_toml(toml), expected_err) {
            (Ok(_), None) => {}
            (Err(e), Some(want)) => assert!(format!("{e:#}").contains(want), "{toml}: {e:#} lacks {want:?}"),
            (got, want) => panic!("{toml}: got {got:?}, want error {want:?}"),
        }
    }

    #[test]
    fn twilio_settings_are_checked_where_they_are_read() {
        const AC: &str = "account_sid = \"AC0123456789abcdef0123456789ABCDEF\"";
        let twilio = |rest: &str| format!("[channels.sms]\nkind = \"twilio\"\n[twilio]\n{rest}");
        check(&twilio(&format!("{AC}\nfrom = \"+15555550000\"")), None);
        check(&twilio(&format!("{AC}\nmessaging_service_sid = \"MG0123456789abcdef0123456789abcdef\"")), None);
        check(&twilio("from = \"+15555550000\""), Some("channels.sms.kind = \"twilio\" needs twilio.account_sid"));
        check(&twilio(AC), Some("needs twilio.from or twilio.messaging_service_sid"));
        check(&twilio("account_sid = \"AC123\""), Some("twilio.account_sid: \"AC123\" is not AC and 32 hex digits"));
        check(
            &twilio(&format!("{AC}\nfrom = \"+1\"\napi_key_sid = \"SK0123456789abcdef0123456789abcdeg\"")),
            Some("twilio.api_key_sid: \"SK0123456789abcdef0123456789abcdeg\" is not SK and 32 hex digits"),
        );
        check(
            &twilio(&format!("{AC}\nfrom = \"5555550000\"")),
            Some("twilio.from: \"5555550000\" is not a phone number"),
        );
        check(&twilio(&format!("{AC}\nfrom = \"+15555550000\"\nvalidity_period = \"11h\"")), Some("1s to 10h"));
        check("[channels.hero]\nkind = \"twilio\"", Some("channels.hero.kind: \"twilio\" is for channels.sms only"));
        check(
            "[channels.sms]\nkind = \"smpp\"",
            Some("channels.*.kind must be \"generic\" or \"twilio\", not \"smpp\""),
        );
        // [twilio] alone is checked, and used by nothing.
        check("[twilio]\nfrom = \"+15555550000\"", None);

        let c = Config::from_toml(&twilio(&format!("{AC}\nfrom = \"+15555550000\""))).unwrap();
        assert_eq!(c.channels.sms.service_url(), Some(TWILIO_API_URL));
        assert_eq!(Config::default().channels.sms.service_url(), None, "a generic channel without a url records");
        let validity = |toml: &str| Config::from_toml(toml).unwrap().twilio_validity().as_secs();
        assert_eq!(validity(""), 29 * 60, "the default ask interval less a minute");
        assert_eq!(validity("[clients.a.eta_request]\nretry_after = \"10m\""), 9 * 60, "the shortest client's");
        assert_eq!(validity("[clients.a.eta_request]\nretry_after = \"30s\""), 1, "at least a second");
        assert_eq!(validity("[clients.a.eta_request]\nretry_after = \"1d\""), 29 * 60, "the default is shorter");
        assert_eq!(validity("[twilio]\nvalidity_period = \"2h\""), 7200, "as set");
    }

    #[test]
    fn settings() {
        check("", None);
        check("[worker]\nconcurrency = 4\n[timers]\npoll = \"5s\"", None);
        check(
            "[clients.client_a.eta_request]\nretry_after = \"30m\"\nmax_attempts = 3\ntrigger_risk = \"medium\"",
            None,
        );
        check("[worker]\nconcurency = 4", Some("concurency"));
        check("[queue]\nkind = \"sqs\"", Some("queue.url"));
        check("[queue]\nkind = \"sqs\"\nurl = \"https://sqs.us-east-1.amazonaws.com/1/loads\"", Some(".fifo"));
        check(
            "[queue]\nkind = \"sqs\"\nurl = \"https://sqs.us-east-1.amazonaws.com/1/loads.fifo\"\nregion = \"us-east-1\"",
            None,
        );
        check("[timers]\npoll = \"45s\"", Some("timers.poll"));
        check("[timers]\npoll = \"soon\"", Some("bad duration"));
        check("[dispatcher.retry]\nmax_attempts = 1", Some("max_attempts"));
        check("[dispatcher]\nbatch = 16\nin_flight = 256", None);
        check("[dispatcher]\nin_flight = 0", Some("dispatcher.in_flight must be 1 to 1000, not 0"));
        check("[dispatcher]\nin_flight = 1001", Some("dispatcher.in_flight must be 1 to 1000, not 1001"));
        check("[store]\nurl = \"mysql://x\"", Some("store.url"));
        check("[channels.sms]\nurl = \"ftp://x\"", Some("channels.sms.url"));
        check("[clients.client_a.eta_request]\ntrigger_risk = \"extreme\"", Some("extreme"));
        check("[decider]\nkind = \"magic\"", Some("decider.kind"));
        check("[server]\nmax_connections = 64\nheader_read_timeout = \"5s\"\nbody_read_timeout = \"30s\"", None);
        check("[server]\nmax_connections = 0", Some("server.max_connections"));
        check("[server]\nmax_connections = 100000", Some("server.max_connections"));
        check("[server]\nheader_read_timeout = \"0s\"", Some("server.header_read_timeout"));
        check("[server]\nheader_read_timeout = \"2m\"", Some("server.header_read_timeout"));
        check("[server]\nbody_read_timeout = \"1h\"", Some("server.body_read_timeout"));
        check("[server]\nwrite_timeout = \"30s\"\ntrusted_proxies = [\"10.0.0.1\", \"fd00::/8\"]", None);
        check("[server]\nwrite_timeout = \"0s\"", Some("server.write_timeout"));
        check("[server]\ntrusted_proxies = [\"10.0.0.0/33\"]", Some("server.trusted_proxies"));
        check("[server]\ntrusted_proxies = [\"proxy.local\"]", Some("server.trusted_proxies"));
        check("[decider]\nkind = \"llm\"", Some("decider.llm.base_url"));
        check("[decider]\nkind = \"llm\"\nllm.base_url = \"http://127.0.0.1:9/v1\"", Some("decider.llm.model"));
        // The LLM's budgets and prices: a bad form names the setting; an unknown model is
        // refused at start.
        check("[decider.llm.budget]\nload_usd = \"two\"", Some("decider.llm.budget.load_usd"));
        check("[decider.llm.budget]\nclient_usd_per_day = -1.0", Some("decider.llm.budget.client_usd_per_day"));
        check("[decider.llm.budget]\nload_tokens = -5", Some("decider.llm.budget.load_tokens must be 0 or more"));
        check("[clients.a.llm_budget]\ntokens_per_day = -1", Some("clients.a.llm_budget.tokens_per_day"));
        check("[clients.a.llm_budget]\nusd_per_day = \"1.2.3\"", Some("clients.a.llm_budget.usd_per_day"));
        check("[decider.llm.budget]\nload_usd = \"$2.50\"\nclient_tokens_per_day = 1000", None);
        let llm = "[decider]\nkind = \"llm\"\nllm.base_url = \"http://127.0.0.1:9/v1\"\nllm.model = \"m1\"\n";
        let priced = |model: &str, input: &str| {
            format!("{llm}[decider.llm.prices.{model}]\ninput_usd_per_mtok = {input}\noutput_usd_per_mtok = 1.0\n")
        };
        check(&priced("m1", "0.5"), None);
        check(&priced("m2", "0.5"), Some("decider.llm.model = \"m1\" has no price in decider.llm.prices"));
        check(&priced("m1", "-0.5"), Some("decider.llm.prices.\"m1\".input_usd_per_mtok"));
        check(&format!("{llm}[decider.llm.budget]\nload_usd = 1\n"), Some("has no price"));
        check(&format!("{llm}[decider.llm.budget]\nload_tokens = 1000\n"), None);
    }

    #[test]
    fn budgets_read_to_the_micro_dollar_with_each_clients_own() {
        let c = Config::from_toml(
            "[decider.llm.budget]\nload_tokens = 100\nload_usd = 2.5\nclient_usd_per_day = \"10\"\n\
             [clients.big.llm_budget]\nusd_per_day = \"$100.25\"\n[clients.small.eta_request]\nmax_attempts = 2\n",
        )
        .unwrap();
        let b = c.decider.llm.budgets(&c.clients).unwrap();
        assert_eq!(b.load, Limit { tokens: Some(100), micro_usd: Some(2_500_000) });
        assert_eq!(b.client_day, Limit { tokens: None, micro_usd: Some(10_000_000) });
        assert_eq!(b.client_day_of(Some("big")), Limit { tokens: None, micro_usd: Some(100_250_000) });
        assert_eq!(b.client_day_of(Some("small")), b.client_day);
        assert_eq!(b.client_day_of(None), b.client_day);
    }

    #[test]
    fn environment_overrides_the_file() {
        let env = |pairs: &[(&str, &str)]| {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
        };
        let (c, unknown) = Config::load(
            None,
            env(&[
                ("HAUL_WORKER_CONCURRENCY", "3"),
                ("HAUL_TIMERS_POLL", "5s"),
                ("HAUL_PUBLIC_URL", "https://x.example"),
                ("HAUL_LOAD_LOCK_ENABLED", "true"),
                ("HAUL_SERVER_MAX_CONNECTIONS", "256"),
                ("HAUL_SERVER_HEADER_READ_TIMEOUT", "5s"),
                ("HAUL_SERVER_TRUSTED_PROXIES", "10.0.0.1, 192.168.0.0/16"),
                ("HAUL_API_TOKEN", "secret"),
                ("HAUL_NOPE", "1"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(c.worker.concurrency, 3);
        assert_eq!(c.timers.poll, Duration::from_secs(5));
        assert_eq!(c.server.public_url.as_deref(), Some("https://x.example"));
        assert!(c.load_lock.enabled);
        assert_eq!((c.server.max_connections, c.server.header_read_timeout), (256, Duration::from_secs(5)));
        assert_eq!(unknown, vec!["HAUL_NOPE".to_string()]);
        assert_eq!(c.server.trusted_proxies, ["10.0.0.1", "192.168.0.0/16"]);
        let err = Config::load(None, env(&[("HAUL_WORKER_CONCURRENCY", "lots")])).unwrap_err();
        assert!(format!("{err:#}").contains("HAUL_WORKER_CONCURRENCY"), "{err:#}");
        let err = Config::load(None, env(&[("HAUL_SERVER_MAX_CONNECTIONS", "0")])).unwrap_err();
        assert!(format!("{err:#}").contains("server.max_connections"), "{err:#}");
        let err = Config::load(None, env(&[("HAUL_TIMERS_POLL", "2m")])).unwrap_err();
        assert!(format!("{err:#}").contains("timers.poll"), "{err:#}");
    }

    /// Each channel's settings are `channels.{config name}`, in the file and in the
    /// environment: the config field `get` returns is the one named after the channel.
    #[test]
    fn every_channel_has_its_settings() {
        for ch in Channel::ALL {
            let name = ch.config_name();
            let c = Config::from_toml(&format!("[channels.{name}]\nurl = \"http://{name}.example\"")).unwrap();
            for other in Channel::ALL {
                let want = (other == ch).then(|| format!("http://{name}.example"));
                assert_eq!(c.channels.get(other).url, want, "{other} with [channels.{name}]");
            }
            let var = format!("HAUL_CHANNELS_{}_TIMEOUT", name.to_ascii_uppercase());
            let (c, unknown) = Config::load(None, vec![(var, "2s".to_string())].into_iter()).unwrap();
            assert!(unknown.is_empty(), "{unknown:?}");
            assert_eq!(c.channels.get(ch).timeout, Some(Duration::from_secs(2)), "{name}");
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> std::vec::IntoIter<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
    }

    #[test]
    fn a_bad_variable_is_named_with_its_value() {
        for (name, value, want) in [
            (
                "HAUL_DISPATCHER_LEASE",
                "90",
                "HAUL_DISPATCHER_LEASE=\"90\" (dispatcher.lease): bad duration \"90\": missing unit",
            ),
            ("HAUL_QUEUE_KIND", "magic", "HAUL_QUEUE_KIND=\"magic\" (queue.kind): queue.kind must be"),
            ("HAUL_WORKER_CONCURRENCY", "lots", "HAUL_WORKER_CONCURRENCY=\"lots\" (worker.concurrency)"),
            ("HAUL_LOAD_LOCK_ENABLED", "yes", "HAUL_LOAD_LOCK_ENABLED=\"yes\" (load_lock.enabled)"),
            ("HAUL_STORE_URL", "mysql://me:secret@db/x", "mysql://me@db/x"),
        ] {
            let err = format!("{:#}", Config::load(None, vars(&[(name, value)])).unwrap_err());
            assert!(err.contains(want), "{name}={value}: {err}");
            assert!(!err.contains("line "), "{name}={value}: {err}");
            assert!(!err.contains("secret"), "{name}={value}: {err}");
        }
    }

    #[test]
    fn the_shadow_file_makes_a_second_decider_and_a_bad_one_is_named() {
        let dir = std::env::temp_dir().join(format!("haul-config-shadow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shadow = dir.join("shadow.toml");
        std::fs::write(&shadow, "[clients.acme.eta_request]\nmax_attempts = 2\n").unwrap();
        let var = shadow.to_str().unwrap();
        let (c, _) = Config::load(None, vars(&[("HAUL_DECIDER_SHADOW", var), ("HAUL_DECIDER_KIND", "sop")])).unwrap();
        let s = c.shadow_config().unwrap().expect("shadow mode on");
        assert_eq!(s.clients["acme"].eta_request.max_attempts, Some(2));
        assert!(Config::default().shadow_config().unwrap().is_none(), "off by default");
        let check = |text: &str, want: &str| {
            std::fs::write(&shadow, text).unwrap();
            let err = format!("{:#}", c.shadow_config().unwrap_err());
            assert!(err.contains(&format!("decider.shadow = {:?}", shadow.display())), "{err}");
            assert!(err.contains(want), "{err}");
        };
        check("[decider]\nkind = \"magic\"\n", "decider.kind");
        check("[decider]\nkind = \"llm\"\n", "decider.llm.base_url");
        check(&format!("[decider]\nshadow = {var:?}\n"), "must be unset there");
        std::fs::remove_file(&shadow).unwrap();
        let err = format!("{:#}", c.shadow_config().unwrap_err());
        assert!(err.contains(&format!("decider.shadow = {:?}", shadow.display())) && err.contains("reading"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_rule_between_settings_names_where_each_was_set() {
        let dir = std::env::temp_dir().join(format!("haul-config-rule-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("haul.toml");
        std::fs::write(&file, "[queue]\nvisibility = \"2m\"\n").unwrap();
        let err = Config::load(Some(&file), vars(&[("HAUL_WORKER_RUN_TIMEOUT", "5m")])).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("queue.visibility must outlast worker.run_timeout"), "{err}");
        assert!(err.contains("queue.visibility from file"), "{err}");
        assert!(err.contains("worker.run_timeout from variable HAUL_WORKER_RUN_TIMEOUT"), "{err}");
        // A file that needs a variable to be whole is read with it, not alone.
        std::fs::write(&file, "[queue]\nkind = \"sqs\"\n").unwrap();
        let url = "https://sqs.us-east-1.amazonaws.com/1/loads.fifo";
        let (c, _) = Config::load(Some(&file), vars(&[("HAUL_QUEUE_URL", url)])).unwrap();
        assert_eq!(c.queue.url.as_deref(), Some(url));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sources_say_where_each_value_came_from() {
        let dir = std::env::temp_dir().join(format!("haul-config-sources-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("haul.toml");
        std::fs::write(&file, "[worker]\nconcurrency = 4\n[timers]\npoll = \"5s\"\n").unwrap();
        let mut l = Config::load_with_sources(Some(&file), vars(&[("HAUL_TIMERS_POLL", "7s")])).unwrap();
        l.set_by_flag("--db", "sqlite::memory:").unwrap();
        l.validate().unwrap();
        assert_eq!(l.source("worker.concurrency"), &Source::File(file.clone()));
        assert_eq!(l.source("timers.poll"), &Source::Variable("HAUL_TIMERS_POLL".into()));
        assert_eq!(l.source("store.url"), &Source::Flag("--db".into()));
        assert_eq!(l.source("dispatcher.lease"), &Source::Default);
        assert_eq!(l.config.timers.poll, Duration::from_secs(7));
        assert_eq!(l.config.store.url, "sqlite::memory:");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn variables_haul_reads_besides_settings_are_not_unknown() {
        let toml_env = [
            ("HAUL_SQS_ENDPOINT", "http://127.0.0.1:5000"),
            ("HAUL_LOG", "info"),
            ("HAUL_CHANNELS_SMS_URL", "http://127.0.0.1:9/sms"),
            ("HAUL_CHANNELS_SMS_TOKEN_ENV", "HAUL_SVC_TOKEN"),
            ("HAUL_SVC_TOKEN", "t0ken-123"),
            ("HAUL_TYPO_CONCURRENCY", "3"),
        ];
        let (_, unknown) = Config::load(None, vars(&toml_env)).unwrap();
        assert_eq!(unknown, vec!["HAUL_TYPO_CONCURRENCY".to_string()]);
    }

    #[test]
    fn values_print_every_setting_and_read_back() {
        let c = Config::default();
        let values = c.values();
        let paths: Vec<&str> = values.iter().map(|(p, _)| p.as_str()).collect();
        let settings: Vec<String> = env_settings().map(|(p, _)| p).collect();
        assert_eq!(paths, settings.iter().map(String::as_str).collect::<Vec<_>>(), "every setting a variable sets");
        assert!(paths.contains(&"channels.sms.url") && paths.contains(&"channels.ops.timeout"));
        let get = |p: &str| values.iter().find(|(x, _)| x == p).unwrap().1.clone();
        assert_eq!(get("dispatcher.lease").as_deref(), Some("\"1m30s\""));
        assert_eq!(get("store.url").as_deref(), Some("\"sqlite://haul.db\""));
        assert_eq!(get("queue.url"), None);
        assert!(c.unset_means("queue.visibility").unwrap().contains("6m"));
        // The serialized form is a config file that reads back to the same values.
        let text = toml::to_string(&c).unwrap();
        let back = Config::from_toml(&text).unwrap();
        assert_eq!(back.values(), values);
    }

    /// The fields serde accepts at `prefix` (a table path), read from the error that
    /// `deny_unknown_fields` gives for an unknown one.
    fn fields_at(prefix: &str) -> Option<Vec<String>> {
        let mut t = toml::Table::new();
        let probe = if prefix.is_empty() { "zz_probe".to_owned() } else { format!("{prefix}.zz_probe") };
        set_path(&mut t, &probe, toml::Value::Integer(0)).unwrap();
        let message = toml::Value::Table(t).try_into::<Config>().unwrap_err().message().to_owned();
        let (_, expected) = message.split_once("unknown field `zz_probe`, expected")?;
        Some(expected.split('`').skip(1).step_by(2).map(str::to_owned).collect())
    }

    /// Every leaf field of the config structs, as a dotted path.
    fn struct_paths(prefix: &str, out: &mut Vec<String>) {
        for f in fields_at(prefix).unwrap_or_else(|| panic!("{prefix:?} is not a table")) {
            let path = if prefix.is_empty() { f } else { format!("{prefix}.{f}") };
            if path == "clients" {
                struct_paths("clients.x", out);
            } else if path == "clients.x.rates" {
                struct_paths("clients.x.rates.y", out);
            } else if path == "decider.llm.prices" {
                struct_paths("decider.llm.prices.m", out);
            } else if fields_at(&path).is_some() {
                struct_paths(&path, out);
            } else {
                out.push(
                    path.replace("clients.x.", "clients.<name>.")
                        .replace(".rates.y.", ".rates.<channel>.")
                        .replace(".prices.m.", ".prices.<model>."),
                );
            }
        }
    }

    #[test]
    fn setting_paths_are_exactly_the_config_fields() {
        let mut fields = Vec::new();
        struct_paths("", &mut fields);
        fields.sort();
        let mut paths = Config::setting_paths();
        paths.sort();
        assert_eq!(
            fields, paths,
            "a new setting goes in ENV_SETTINGS (or FILE_SETTINGS), docs/config.md and examples/haul.toml"
        );
    }

    fn repo_file(rel: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Settings a TOML text names, set or commented out (`# key = …` under a table,
    /// itself maybe commented out); a client's name becomes `<name>`.
    fn keys_in_example(text: &str) -> Vec<String> {
        let mut table = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.trim_start_matches('#').trim();
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                table = name.to_owned();
            } else if let Some((key, _)) = line.split_once('=')
                && !key.trim().is_empty()
                && key.trim().chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                keys.push(format!("{table}.{}", key.trim()));
            }
        }
        keys.into_iter()
            .map(|k| match k.strip_prefix("clients.").and_then(|r| r.split_once('.')) {
                Some((_, rest)) => match rest.strip_prefix("rates.").and_then(|r| r.split_once('.')) {
                    Some((_, setting)) => format!("clients.<name>.rates.<channel>.{setting}"),
                    None => format!("clients.<name>.{rest}"),
                },
                None => match k.strip_prefix("decider.llm.prices.").and_then(|r| r.rsplit_once('.')) {
                    Some((_, setting)) => format!("decider.llm.prices.<model>.{setting}"),
                    None => k,
                },
            })
            .collect()
    }

    #[test]
    fn the_example_file_names_every_setting_at_its_default() {
        let text = repo_file("examples/haul.toml");
        let example = Config::from_toml(&text).expect("examples/haul.toml reads");
        assert_eq!(example.values(), Config::default().values(), "examples/haul.toml must hold the defaults");
        let mut keys = keys_in_example(&text);
        keys.sort();
        let mut paths = Config::setting_paths();
        paths.sort();
        assert_eq!(keys, paths, "examples/haul.toml must name every setting once");
    }

    /// The settings and variables in the first column of docs/config.md's tables.
    fn documented(text: &str) -> (Vec<String>, Vec<String>) {
        let (mut settings, mut variables) = (Vec::new(), Vec::new());
        for line in text.lines().filter(|l| l.starts_with("| `")) {
            let first = line.split('|').nth(1).unwrap_or_default().trim();
            let name = first.trim_matches('`').to_owned();
            // OpenTelemetry's own variables (one row) are read by span export, not as settings.
            if name.starts_with("HAUL_") || name.starts_with("OTEL_") || name == "DATABASE_URL" {
                variables.push(name);
            } else if !name.starts_with('-') && !name.starts_with("haul ") {
                settings.push(name);
            }
        }
        (settings, variables)
    }

    #[test]
    fn docs_config_md_lists_every_setting_and_variable_and_nothing_else() {
        let text = repo_file("docs/config.md");
        let (mut settings, variables) = documented(&text);
        settings.sort();
        let mut paths = Config::setting_paths();
        paths.sort();
        assert_eq!(settings, paths, "docs/config.md's settings table and Config::setting_paths() differ");
        for path in &paths {
            if let Some(var) = Config::variable_of(path) {
                let row = text.lines().find(|l| l.starts_with(&format!("| `{path}`"))).unwrap();
                assert!(row.contains(&format!("`{var}`")), "docs/config.md: the row of {path} must name {var}");
            }
        }
        for (var, _) in NOT_SETTINGS {
            assert!(variables.iter().any(|v| v == var), "docs/config.md must list {var}");
        }
        for (flag, path) in FLAGS {
            assert!(text.contains(&format!("`{flag}`")) && text.contains(path), "docs/config.md must list {flag}");
        }
    }

    #[test]
    fn config_errors_name_the_setting() {
        let mut c = LlmConfig::default();
        assert!(c.check().unwrap_err().to_string().contains("decider.llm.base_url"));
        c.base_url = Some("ftp://x".into());
        assert!(c.check().unwrap_err().to_string().contains("http://"));
        c.base_url = Some("http://127.0.0.1:1/v1".into());
        assert!(c.check().unwrap_err().to_string().contains("decider.llm.model"));
        c.model = Some("m".into());
        c.check().unwrap();
    }

    /// A send limit in a bad form is refused at start, naming the setting; a good one
    /// reads as a limit.
    #[test]
    fn a_send_limit_in_a_bad_form_names_the_setting() {
        for (toml, says) in [
            ("rate = \"fast\"", "channels.sms.rate: \"fast\" is not a rate"),
            ("rate = \"0/s\"", "channels.sms.rate: \"0/s\" allows no send"),
            ("rate = \"1/s\"\nburst = -1", "channels.sms.burst: -1 is not 1 to 10000"),
            ("rate = \"1/s\"\nburst = 0", "channels.sms.burst: burst 0 is not 1 to 10000"),
            ("burst = 5", "channels.sms.burst is set without channels.sms.rate"),
            ("in_flight = 0", "channels.sms.in_flight: 0 is not 1 to 10000"),
            ("in_flight = -3", "channels.sms.in_flight: -3 is not 1 to 10000"),
            ("in_flight = 10001", "channels.sms.in_flight: 10001 is not 1 to 10000"),
        ] {
            let e = Config::from_toml(&format!("[channels.sms]\n{toml}")).unwrap_err().to_string();
            assert!(e.contains(says), "{toml}: {e}");
        }
        let c = Config::from_toml("[channels.hero]\nrate = \"12/min\"\nburst = 3").unwrap();
        let limit = c.channels.hero.limit("hero").unwrap().unwrap();
        assert_eq!((limit.rate.to_string(), limit.burst), ("12/min".to_owned(), 3));
        assert_eq!(c.channels.sms.limit("sms").unwrap(), None);
        assert_eq!(c.channels.sms.in_flight_cap("sms").unwrap(), None);
        let c = Config::from_toml("[channels.sms]\nin_flight = 10").unwrap();
        assert_eq!(c.channels.sms.in_flight_cap("sms").unwrap(), Some(10), "a cap needs no rate");
        assert_eq!(
            Config::from_toml("[channels.sms]\nrate = \"1/s\"")
                .unwrap()
                .channels
                .sms
                .limit("sms")
                .unwrap()
                .unwrap()
                .burst,
            1
        );
    }

    /// A client's own send limit reads as a limit on its channel; a bad one, or one on
    /// a channel that does not exist, is refused naming the setting.
    #[test]
    fn a_clients_own_send_limit_names_the_setting() {
        for (toml, says) in [
            ("[clients.acme.rates.tms]\nrate = \"fast\"", "clients.acme.rates.tms.rate: \"fast\" is not a rate"),
            (
                "[clients.acme.rates.sms]\nburst = 2",
                "clients.acme.rates.sms.burst is set without clients.acme.rates.sms.rate",
            ),
            (
                "[clients.acme.rates.sms]\nrate = \"1/s\"\nburst = 0",
                "clients.acme.rates.sms.burst: burst 0 is not 1 to 10000",
            ),
            ("[clients.acme.rates.fax]\nrate = \"1/s\"", "clients.acme.rates.fax: no such channel"),
            ("[clients.acme.rates.tms]\nrate = \"1/s\"\nspeed = 2", "unknown field `speed`"),
        ] {
            let e = Config::from_toml(toml).unwrap_err().to_string();
            assert!(e.contains(says), "{toml}: {e}");
        }
        let c = Config::from_toml("[clients.acme.rates.tms]\nrate = \"5/s\"\nburst = 2").unwrap();
        let limit = c.clients["acme"].limit("acme", Channel::Tms).unwrap().unwrap();
        assert_eq!((limit.rate.to_string(), limit.burst), ("5/s".to_owned(), 2));
        assert_eq!(c.clients["acme"].limit("acme", Channel::Sms).unwrap(), None);
    }

    /// A client's weight outside 1 to 100 is refused naming the setting.
    #[test]
    fn a_send_weight_out_of_bounds_names_the_setting() {
        for (w, ok) in [("0", false), ("1", true), ("100", true), ("101", false)] {
            let got = Config::from_toml(&format!("[clients.acme]\nsend_weight = {w}"));
            match got {
                Ok(c) => assert!(ok && c.clients["acme"].send_weight == w.parse().ok(), "{w}"),
                Err(e) => assert!(
                    !ok && e.to_string().contains(&format!("clients.acme.send_weight must be 1 to 100, not {w}")),
                    "{w}: {e}"
                ),
            }
        }
        let e = Config::from_toml("[clients.acme]\nsend_weight = -1").unwrap_err().to_string();
        assert!(e.contains("clients.acme.send_weight must be 1 to 100, not -1"), "{e}");
    }

    #[test]
    fn client_policies_fall_back_to_defaults() {
        let c = Config::from_toml("[clients.b.eta_request]\nmax_attempts = 5").unwrap();
        let p = policies(&c.clients);
        assert_eq!(p.for_client(Some("b")).max_attempts, 5);
        assert_eq!(p.for_client(Some("b")).retry_after, Duration::from_secs(1800));
        assert_eq!(p.for_client(Some("zzz")), EtaPolicy::default());
    }
}
