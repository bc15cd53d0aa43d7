//! The command line's shape: every command, flag and its `--help` text.
//!
//! One way to name the store: `--db` over `store.url` (`HAUL_STORE_URL`, the config
//! file) for every command that opens haul's own store (serve, inspect, migrate,
//! prune); `--config` wherever settings apply. The test-and-measure commands (eval,
//! sim, bench) make throwaway stores instead: SQLite in memory or in a temporary
//! folder, or fresh schemas in the PostgreSQL of `DATABASE_URL`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `haul --version`: the version, the git commit, the optional features built in and
/// the schema version this build writes (a database a newer haul migrated past it is
/// refused unless declared readable by it: docs/operations.md, "Upgrades").
pub static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "{} (commit {}, features: {}, schema {})",
        env!("CARGO_PKG_VERSION"),
        env!("BUILD_HAUL_COMMIT"),
        env!("BUILD_HAUL_FEATURES"),
        haul_backends::SCHEMA_VERSION
    )
});

/// haul: a durable runtime for an AI dispatch agent running freight loads.
///
/// Settings come from defaults, a TOML file (--config), HAUL_* variables, then flags;
/// `haul config show` prints them with where each came from. docs/ has the reference.
#[derive(Parser, Debug)]
#[command(name = "haul", version = VERSION.as_str(), about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The settings: a file, and the store over `store.url`.
#[derive(Args, Debug, Clone, Default)]
pub struct ConfigArgs {
    /// A TOML settings file (docs/config.md, examples/haul.toml); HAUL_* variables and
    /// flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The store: sqlite://PATH, sqlite::memory: or postgres://… (overrides store.url
    /// and HAUL_STORE_URL; default sqlite://haul.db).
    #[arg(long, value_name = "URL")]
    pub db: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum QueueKind {
    /// The store's own queue.
    Store,
    /// SQS FIFO on a local emulator: HAUL_SQS_ENDPOINT, or a moto_server started for the run
    /// (needs a build with `--features sqs`).
    Sqs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeciderKind {
    Sop,
    Llm,
}

/// The crash test's tools (scripts/crash-test); not for production.
#[derive(Subcommand, Debug)]
pub enum Testkit {
    /// Run the fake channel services on ADDR until killed (GET /stats reports effects).
    Services {
        #[arg(long)]
        listen: String,
    },
    /// Run an OTLP trace receiver on ADDR until killed (POST /v1/traces; GET /spans).
    Otlp {
        #[arg(long)]
        listen: String,
    },
    /// Create a fresh schema in DATABASE_URL and print a store URL that uses it.
    Schema {
        #[arg(long)]
        db: String,
    },
    /// Post events over HTTP for a while; write the accepted ones to a file.
    Load {
        #[arg(long)]
        api: String,
        #[arg(long, env = "HAUL_API_TOKEN")]
        token: String,
        #[arg(long, default_value_t = 20)]
        loads: usize,
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        accepted: PathBuf,
    },
    /// Wait for everything to drain, then check the crash test's invariants.
    Check {
        #[arg(long)]
        db: String,
        #[arg(long)]
        services: String,
        #[arg(long)]
        accepted: PathBuf,
        #[arg(long, default_value_t = 180)]
        timeout: u64,
        /// The OTLP receiver the roles exported their spans to (`testkit otlp`).
        #[arg(long)]
        otlp: Option<String>,
        /// Fewer accepted events than this fails the check: a run that tested nothing.
        #[arg(long, default_value_t = 1)]
        min_events: usize,
    },
}

#[derive(Subcommand, Debug)]
pub enum Command {
    #[command(subcommand, hide = true)]
    Testkit(Testkit),
    /// Run the ingestion API, the load workers, the dispatcher and the timer pump.
    /// With no configuration: SQLite file haul.db, the store-backed queue, record mode
    /// for every channel, listening on 127.0.0.1:8080.
    Serve {
        #[command(flatten)]
        settings: ConfigArgs,
        /// Address for the API, /metrics and /healthz (overrides server.listen).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Which roles this process runs: any of api,worker,dispatcher,pump.
        #[arg(long, default_value = "api,worker,dispatcher,pump")]
        roles: String,
    },
    /// Deterministic simulation with fault injection: a seed reproduces a run exactly.
    /// Prints one line per seed (with its trace digest), the coverage of faults, and
    /// `N passed, N failed`; a failure prints the seed, the broken invariant and the
    /// trace lines that show it.
    Sim {
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// How many seeds to run, from --seed up.
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        /// Loads per run.
        #[arg(long, default_value_t = 4)]
        loads: usize,
        /// Steps of the fault phase per run.
        #[arg(long, default_value_t = 200)]
        steps: usize,
        /// Faults to inject: all, none, or some of crash,duplicate,redelivery,interleave,outage,service,clock,operator (operator actions: requeues, bulk requeues, resolved asks, assigned SMS).
        #[arg(long, default_value = "all")]
        faults: String,
        /// The backend: SQLite in memory, or a fresh schema per seed in the PostgreSQL of
        /// DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test; not store.url).
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// Plant a known bug, to check the simulator catches it (test use only).
        #[arg(long, hide = true)]
        plant: Option<String>,
        /// Seeds run at once, each on its own store (default: the machine's cores).
        /// Reports come out in seed order, with the digests a serial run gives.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
        jobs: Option<u32>,
        /// A soak: run seeds from --seed on until this much time has passed (e.g. 8h,
        /// 30m), instead of --seeds; a progress line every minute; stops at the first
        /// failing seed.
        #[arg(long = "for", value_name = "DURATION", value_parser = duration_arg, conflicts_with = "seeds")]
        soak_for: Option<std::time::Duration>,
    },
    /// Benchmark workloads; each throughput is reported with the limit measured in the
    /// same run (append, projection, contention, e2e, e2e-http, dispatch, timers, replay, burst).
    Bench {
        /// Workloads to run (default: all).
        workloads: Vec<String>,
        /// The backend: a SQLite file in a temporary folder, or a fresh schema in the
        /// PostgreSQL of DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test; not store.url).
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// Print one JSON object { "<workload>": { "<figure>": number } }.
        #[arg(long)]
        json: bool,
        /// Smaller sizes, for a quick look.
        #[arg(long)]
        quick: bool,
    },
    /// Show one load as a readable timeline: events, decisions with their actions and
    /// rationale, outbox rows with attempts and status, timers.
    Inspect {
        load_id: String,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the load as JSON (the body of GET /v1/loads/{id}).
        #[arg(long)]
        json: bool,
        /// Log records after this seq (the page's next_after_seq).
        #[arg(long)]
        after_seq: Option<String>,
        /// Records, outbox rows and timers per page (1 to 1000; default 100).
        #[arg(long)]
        limit: Option<String>,
        /// Outbox rows after this cursor (the page's next_outbox_after).
        #[arg(long)]
        outbox_after: Option<String>,
        /// Timers after this cursor (the page's next_timers_after).
        #[arg(long)]
        timers_after: Option<String>,
    },
    /// Create or upgrade the database schema of store.url (serve does it too).
    Migrate {
        #[command(flatten)]
        settings: ConfigArgs,
    },
    /// Delete finished rows older than the retention age, in bounded batches until none
    /// is left: dispatched outbox rows and dead ones whose outcome was published, fired
    /// and canceled timers, acked queue messages. Never the log, a pending or claimed
    /// row, a dead row still waiting for its outcome, a scheduled timer or an unacked
    /// message. Safe to run while haul serves (cron it, e.g. hourly).
    Prune {
        #[command(flatten)]
        settings: ConfigArgs,
        /// Retention age: rows that finished longer ago than this go. At least 5m, the
        /// queue's shortest dedup window; an acked event id older than this is no
        /// longer deduplicated by the queue (the log still drops it).
        #[arg(long, default_value = "7d")]
        older_than: String,
        /// Rows per table per batch; each batch is its own short transaction.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        batch: u32,
    },
    /// Run eval scenarios (TOML files, or folders of them) through the real pipeline
    /// on a fake clock. Prints one line per scenario and `N passed, N failed`.
    ///
    /// With `--decider llm --llm-answers FILE` the worker decides with the real LLM
    /// decider, pointed at a recorded chat-completions server on 127.0.0.1 that replies
    /// with the answers in FILE (matched by load id and event id); a model request with
    /// no recorded answer fails the scenario. Example:
    /// `haul eval --decider llm --llm-answers evals-llm/answers.toml evals-llm/scenarios/`
    Eval {
        /// Scenario files and folders (every *.toml below a folder, sorted).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print one JSON report instead of lines.
        #[arg(long)]
        json: bool,
        /// The backend: SQLite in memory, or a fresh schema per scenario in the PostgreSQL
        /// of DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test; not store.url).
        #[arg(long, value_enum, default_value = "sqlite")]
        store: StoreKind,
        /// The load queue: the store's own, or a fresh SQS FIFO queue per scenario.
        #[arg(long, value_enum, default_value = "store")]
        queue: QueueKind,
        /// The decider: the SOP, or the LLM decider against recorded answers (--llm-answers).
        #[arg(long, value_enum, default_value = "sop")]
        decider: DeciderKind,
        /// The recorded answers (TOML) the LLM decider's stand-in server replies with.
        #[arg(long, value_name = "FILE", required_if_eq("decider", "llm"))]
        llm_answers: Option<PathBuf>,
        /// For each failing scenario, print its loads' timelines (as `haul inspect` shows
        /// them) after its FAIL line.
        #[arg(long, short)]
        verbose: bool,
        /// Also write a JUnit XML report to FILE (one test case per scenario), for CI systems.
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Copy every scenario's logs into the store at URL (created if needed) instead
        /// of only a throwaway one, renaming load ids and clients that collide.
        #[arg(long, value_name = "URL")]
        keep: Option<String>,
        /// With --keep: write the kept clients' policies (a settings file for haul replay).
        #[arg(long, value_name = "FILE", requires = "keep")]
        keep_config: Option<PathBuf>,
        /// Export the runs' and sends' spans over OTLP, as serve does (the OTEL_*
        /// variables; an endpoint must be set), under haul.role "eval" and the fake
        /// clock's times. Without it an eval exports nothing, whatever OTEL_* says.
        #[arg(long)]
        export_spans: bool,
    },
    /// Replay recorded decisions against a candidate decider, read-only: for each
    /// decision of the selected loads, the candidate decides on the state the log had
    /// before its event, at the recorded time, and the two are compared (filtered or
    /// not, the actions, the ask changes). Each step is a one-step what-if on the
    /// recorded history. The candidate is the SOP (or the LLM decider) with the
    /// settings of --config (a candidate.toml with other client policies); with
    /// --shadow, the shadow decisions shadow mode stored. Exit status 0 when nothing
    /// differs, 2 when something does, 1 on an error. docs/replay.md.
    Replay {
        #[command(flatten)]
        settings: ConfigArgs,
        /// These loads (repeat the flag or list several).
        #[arg(long = "load", value_name = "ID", num_args = 1..)]
        loads: Vec<String>,
        /// Loads with a record this recent (e.g. 7d, 36h).
        #[arg(long, value_name = "AGE")]
        since: Option<String>,
        /// Loads of this client (a load_update naming it).
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// Every load (still bounded by --limit).
        #[arg(long)]
        all: bool,
        /// At most this many loads.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// Report the stored shadow decisions (shadow mode, decider.shadow) instead of
        /// deciding: recorded = the primary's decision, candidate = the shadow's.
        #[arg(long, conflicts_with_all = ["decider", "llm_answers", "live"])]
        shadow: bool,
        /// The candidate decider (default: decider.kind of the settings).
        #[arg(long, value_enum)]
        decider: Option<DeciderKind>,
        /// With --decider llm: the recorded model answers (the haul eval answers format).
        #[arg(long, value_name = "FILE")]
        llm_answers: Option<PathBuf>,
        /// With --decider llm: ask the model of decider.llm.* what --llm-answers does not
        /// hold (at most --max-calls times), and add its answers to that file.
        #[arg(long, requires = "max_calls")]
        live: bool,
        /// With --live: model calls at most; decisions past it are not compared.
        #[arg(long, value_name = "N")]
        max_calls: Option<usize>,
        /// Print the whole report as JSON instead of the summary.
        #[arg(long)]
        json: bool,
        /// Also write the report as one self-contained HTML file.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Differences shown with their context.
        #[arg(long, value_name = "N", default_value_t = 10)]
        show: usize,
    },
    /// Write one load's log as an eval scenario (docs/scenarios.md), read-only: its
    /// events at the times they were decided, its failed actions as faults, what its
    /// decisions imply as expectations. Phone numbers become fixed fakes unless
    /// --keep-phones; SMS bodies stay unless --mask-bodies. The clients' policies come
    /// from the settings (--config).
    ExportScenario {
        load_id: String,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Replace inbound SMS bodies (keeping whether they report trouble).
        #[arg(long)]
        mask_bodies: bool,
        /// Keep phone numbers as recorded.
        #[arg(long)]
        keep_phones: bool,
        /// Write to this file instead of stdout.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Queries across loads, for operators: loads by filter, dead outbox rows, overdue
    /// timers, unmatched SMS, OpsAlerts. Read-only: opens an existing store (never
    /// creates or migrates one). One page at a time, with the flag that gives the next
    /// (`--after`/`--before`); `--json` prints GET /v1/ops/{query}'s answer.
    #[command(subcommand)]
    Query(QueryCommand),
    /// Check or print the settings serve, inspect, migrate and prune would run with.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Operator actions on the store of store.url: each publishes one operator_action
    /// event (who, why, what) to the load's queue, which the load worker appends with
    /// its decision, so the log records it. The same as the /v1/operator routes. A
    /// request id names the action for good: the same request again does nothing new.
    #[command(subcommand)]
    Operator(OperatorCommand),
    /// Post an inbound SMS to `haul serve`'s Twilio webhook, signed as Twilio signs it
    /// (HMAC-SHA1 of the URL and the form under HAUL_TWILIO_AUTH_TOKEN): try the webhook
    /// and the SMS rules without Twilio. Prints the webhook's answer; exit 1 unless 200.
    ///
    /// The URL it signs is the settings' server.public_url (as the server checks it), or
    /// --url.
    SendTestSms {
        /// The sender, E.164 (the driver's phone to reach their load).
        #[arg(long)]
        from: String,
        /// The text.
        #[arg(long)]
        body: String,
        /// The haul number the SMS was sent to.
        #[arg(long, default_value = "+15550000000")]
        to: String,
        /// Twilio's id of the message (default: a new random SM… id).
        #[arg(long)]
        message_sid: Option<String>,
        /// The server's URL as Twilio reaches it (default: server.public_url of the settings).
        #[arg(long)]
        url: Option<String>,
        #[command(flatten)]
        settings: ConfigArgs,
    },
    /// Print a shell completion script for bash, zsh or fish.
    ///
    /// bash: `haul completions bash > /etc/bash_completion.d/haul`;
    /// zsh: `haul completions zsh > "${fpath[1]}/_haul"`;
    /// fish: `haul completions fish > ~/.config/fish/completions/haul.fish`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Who asks, why, and the request's id: every operator command takes them.
#[derive(clap::Args, Debug, Clone)]
pub struct Requester {
    /// Names this action for good ([A-Za-z0-9_.-], at most 64): its event id is
    /// op:REQUEST_ID, so running the command again does nothing twice.
    #[arg(long)]
    pub request_id: String,
    /// Who asks (kept in the log).
    #[arg(long)]
    pub actor: String,
    /// Why (kept in the log; 1 to 500 characters).
    #[arg(long)]
    pub reason: String,
    /// How long to wait for the load's decision on the action and say what it was
    /// (`0s`: only queue it). A worker must be running (`haul serve`).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_arg)]
    pub wait: std::time::Duration,
}

fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    haul_core::parse_duration(s).map_err(|e| e.message)
}

#[derive(Subcommand, Debug)]
pub enum OperatorCommand {
    /// Requeue a dead outbox row: a new row carries its action again (key
    /// LOAD/op:REQUEST_ID/TYPE, linked to the dead row, which stays dead).
    Requeue {
        /// The dead row's key (haul inspect lists it).
        outbox_id: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Requeue the dead rows of one action type that died since a time, at most
    /// --limit, oldest first; --dry-run lists them and publishes nothing.
    BulkRequeue {
        /// The action type, e.g. create_hero_task.
        #[arg(long = "type", value_name = "ACTION_TYPE")]
        action_type: String,
        /// Rows that died at or after this time (RFC 3339, e.g. 2026-03-02T07:00:00Z).
        #[arg(long)]
        since: String,
        /// At most this many rows (1 to 100).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// List what would be requeued; publish nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give an SMS of the unmatched list to a load, which takes it as its inbound_sms.
    AssignSms {
        /// The SMS's MessageSid (GET /v1/webhooks/twilio/unmatched lists them).
        message_sid: String,
        /// The load that takes it.
        #[arg(long)]
        load: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a channel's send limit while haul runs: in force at every dispatcher
    /// within a second, kept with who and why. `--reset` puts the settings' limit
    /// (channels.*.rate) back.
    SetRate {
        /// The channel: sms, hero, slack, tms or ops.
        channel: String,
        /// At most N sends per second, minute or hour: N/s, N/min, N/h.
        #[arg(long, required_unless_present = "reset", conflicts_with = "reset")]
        rate: Option<String>,
        /// Sends at once after a quiet spell (1 when not given).
        #[arg(long, requires = "rate")]
        burst: Option<u32>,
        /// Back to the settings' limit.
        #[arg(long)]
        reset: bool,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Each channel's send limit in force, its settings' beside it, and the latest
    /// changes.
    Rates {
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move an SMS assigned to the wrong load to the right one: the wrong load's asks
    /// it answered go to a person (a Hero task), and the right load takes it.
    ReassignSms {
        /// The SMS's MessageSid.
        message_sid: String,
        /// The load that takes it now.
        #[arg(long)]
        load: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take a dead row (with the rest of its requeue chain) out of the inbox:
    /// nothing more is to be done about it, for the reason given (kept in the log).
    Dismiss {
        /// The dead row's key (haul query dead lists them).
        outbox_id: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take an SMS of the unmatched list out of the inbox: it goes to no load (the
    /// store keeps who and why).
    DismissSms {
        /// The SMS's MessageSid (haul query unmatched lists them).
        message_sid: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Close an ask by hand (the driver called in) and cancel its timer.
    ResolveAsk {
        load_id: String,
        /// The ask, e.g. ask:eta_request:ping_0700.
        ask_id: String,
        #[command(flatten)]
        who: Requester,
        #[command(flatten)]
        settings: ConfigArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Read the defaults, the file, the HAUL_* variables and the flags, check every
    /// rule, and exit 0; or print one error line and exit 1. Also checks that the
    /// variables the settings name (channel tokens, the model's key) are set.
    Check {
        #[command(flatten)]
        settings: ConfigArgs,
        /// As serve's --listen.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Print every setting's effective value and where it came from (default, file,
    /// variable, flag), then the other HAUL_* variables haul reads. Secrets are masked
    /// and passwords in URLs redacted.
    Show {
        #[command(flatten)]
        settings: ConfigArgs,
        /// As serve's --listen.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
}

/// What every query takes besides its filters.
#[derive(Args, Debug, Clone, Default)]
pub struct QueryArgs {
    #[command(flatten)]
    pub settings: ConfigArgs,
    /// Items per page (1 to 500; default 50).
    #[arg(long)]
    pub limit: Option<String>,
    /// Print the page as JSON (the body of GET /v1/ops/{query}).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum QueryCommand {
    /// Loads by filter, in load id order; every filter given must hold. A page looks at
    /// up to 5000 loads, so with a rare filter it may be short and still name a next page.
    Loads {
        #[command(flatten)]
        args: QueryArgs,
        /// The load's stage.
        #[arg(long)]
        stage: Option<String>,
        /// At least one ask is open.
        #[arg(long)]
        open_asks: bool,
        /// At least one ask was escalated to a person.
        #[arg(long)]
        escalated: bool,
        /// At least one outbox row is dead.
        #[arg(long)]
        has_dead: bool,
        /// A pending outbox row is older than this (e.g. 5m).
        #[arg(long, value_name = "DURATION")]
        pending_over: Option<String>,
        /// A timer has been due for longer than this (0s: any overdue timer).
        #[arg(long, value_name = "DURATION")]
        overdue_over: Option<String>,
        /// No record appended for longer than this.
        #[arg(long, value_name = "DURATION")]
        idle_over: Option<String>,
        /// A record appended within this.
        #[arg(long, value_name = "DURATION")]
        active_within: Option<String>,
        /// The page after this load (the previous page's next).
        #[arg(long, value_name = "LOAD_ID")]
        after: Option<String>,
    },
    /// Dead outbox rows across loads, newest first, with their failure and age.
    Dead {
        #[command(flatten)]
        args: QueryArgs,
        /// Only rows of this action type (send_sms, create_hero_task, ...).
        #[arg(long)]
        action_type: Option<String>,
        /// Only rows of this channel class: external, hero_channel or internal.
        #[arg(long)]
        class: Option<String>,
        /// Where it stands in the operators' inbox: open, handled, dismissed or all
        /// (the default: every state).
        #[arg(long, value_name = "STATE")]
        inbox: Option<String>,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        before: Option<String>,
    },
    /// Timers due and not fired, the most overdue first.
    Timers {
        #[command(flatten)]
        args: QueryArgs,
        /// Only timers due for longer than this (default 0s: every due one).
        #[arg(long, value_name = "DURATION")]
        overdue_over: Option<String>,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
    },
    /// Inbound SMS that went to no load, newest first.
    Unmatched {
        #[command(flatten)]
        args: QueryArgs,
        /// Where it stands in the operators' inbox: open, handled, dismissed or all
        /// (the default: every state).
        #[arg(long, value_name = "STATE")]
        inbox: Option<String>,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        before: Option<String>,
    },
    /// OpsAlerts raised (dead Hero-channel and internal rows), newest first: what
    /// failed, when, and whether the ops service took the alert (pending, delivered,
    /// refused).
    Alerts {
        #[command(flatten)]
        args: QueryArgs,
        /// Where it stands in the operators' inbox: open, handled, dismissed or all
        /// (the default: every state).
        #[arg(long, value_name = "STATE")]
        inbox: Option<String>,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        before: Option<String>,
    },
    /// Drivers' phones opted out of SMS (they replied STOP, on any load), the latest
    /// first: no SMS goes to them until they reply START.
    OptedOut {
        #[command(flatten)]
        args: QueryArgs,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        before: Option<String>,
    },
    /// The loads whose appends the version check refused most often (workers racing
    /// on one load), most first.
    Conflicts {
        #[command(flatten)]
        args: QueryArgs,
    },
    /// What the agent's model calls cost per client and UTC day (tokens in and out,
    /// dollars by decider.llm.prices, calls), the latest day first; a day whose budget
    /// was spent says when.
    Spend {
        #[command(flatten)]
        args: QueryArgs,
        /// The first day, YYYY-MM-DD (default: the last day).
        #[arg(long, value_name = "DAY")]
        from: Option<String>,
        /// The last day, YYYY-MM-DD (default: today, UTC).
        #[arg(long, value_name = "DAY")]
        to: Option<String>,
        /// One client's days only.
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// The page after this cursor (the previous page's next).
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
    },
}

impl QueryCommand {
    /// The query, its common flags, and its filters as the API's (name, value) pairs.
    pub fn into_parts(self) -> (haul_runtime::queries::Query, QueryArgs, Vec<(String, String)>) {
        use haul_runtime::queries::Query;
        let mut pairs = Vec::new();
        let mut opt = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                pairs.push((name.to_owned(), v));
            }
        };
        let flag = |on: bool| on.then(|| "true".to_owned());
        let (query, args) = match self {
            QueryCommand::Loads {
                args,
                stage,
                open_asks,
                escalated,
                has_dead,
                pending_over,
                overdue_over,
                idle_over,
                active_within,
                after,
            } => {
                opt("stage", stage);
                opt("open_asks", flag(open_asks));
                opt("escalated", flag(escalated));
                opt("has_dead", flag(has_dead));
                opt("pending_over", pending_over);
                opt("overdue_over", overdue_over);
                opt("idle_over", idle_over);
                opt("active_within", active_within);
                opt("after", after);
                (Query::Loads, args)
            }
            QueryCommand::Dead { args, action_type, class, inbox, before } => {
                opt("action_type", action_type);
                opt("class", class);
                opt("inbox", inbox);
                opt("before", before);
                (Query::Dead, args)
            }
            QueryCommand::Timers { args, overdue_over, after } => {
                opt("overdue_over", overdue_over);
                opt("after", after);
                (Query::Timers, args)
            }
            QueryCommand::Unmatched { args, inbox, before } => {
                opt("inbox", inbox);
                opt("before", before);
                (Query::Unmatched, args)
            }
            QueryCommand::Alerts { args, inbox, before } => {
                opt("inbox", inbox);
                opt("before", before);
                (Query::Alerts, args)
            }
            QueryCommand::OptedOut { args, before } => {
                opt("before", before);
                (Query::OptedOut, args)
            }
            QueryCommand::Conflicts { args } => (Query::Conflicts, args),
            QueryCommand::Spend { args, from, to, client, after } => {
                opt("from", from);
                opt("to", to);
                opt("client", client);
                opt("after", after);
                (Query::Spend, args)
            }
        };
        opt("limit", args.limit.clone());
        (query, args, pairs)
    }
}
