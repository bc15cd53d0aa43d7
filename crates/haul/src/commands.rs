//! One function per command: each turns its flags into calls on the crates that do
//! the work (`haul-server`, `haul-runtime`, `haul-harness`) and prints the result.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use haul_backends as store;
use haul_harness::eval::{EvalDecider, EvalOptions, EvalQueue, EvalStore};
use haul_harness::{bench, crashtest, eval, sim};
use std::sync::Arc;

use crate::cli::{Cli, Command, ConfigArgs, ConfigCommand, DeciderKind, QueryCommand, QueueKind, StoreKind, Testkit};
use crate::progress::Progress;
use crate::shared::{load_config, load_settings, say};

/// The shortest `haul prune --older-than`: the queue's dedup promise (LoadQueue::publish).
const MIN_RETENTION: Duration = Duration::from_secs(300);
/// Batches one `haul prune` runs at most (100M rows per table at the default batch).
const MAX_PRUNE_BATCHES: usize = 100_000;

pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve { settings, listen, roles } => serve(&settings, listen, &roles).await,
        Command::Inspect { load_id, settings, json, after_seq, limit, outbox_after, timers_after } => {
            let page = haul_runtime::inspect::Page::parse(
                after_seq.as_deref(),
                limit.as_deref(),
                outbox_after.as_deref(),
                timers_after.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
            inspect(&load_id, &settings, json, &page).await
        }
        Command::Migrate { settings } => migrate(&settings).await,
        Command::Query(q) => query(q).await,
        Command::Prune { settings, older_than, batch } => prune(&settings, &older_than, batch).await,
        Command::Operator(op) => crate::operator::run(op).await,
        Command::Config(ConfigCommand::Check { settings, listen }) => config_check(&settings, listen),
        Command::Config(ConfigCommand::Show { settings, listen }) => config_show(&settings, listen),
        Command::Completions { shell } => {
            // The hidden commands (the crash test's tools) are not offered.
            let full = <Cli as clap::CommandFactory>::command();
            let mut cmd = full
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .fold(clap::Command::new("haul").version(crate::cli::VERSION.as_str()), |cmd, c| {
                    cmd.subcommand(c.clone())
                });
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "haul", &mut script);
            say(String::from_utf8_lossy(&script).trim_end());
            Ok(ExitCode::SUCCESS)
        }
        Command::Testkit(t) => testkit(t).await,
        Command::SendTestSms { from, body, to, message_sid, url, settings } => {
            send_test_sms(&from, &body, &to, message_sid, url, &settings).await
        }
        Command::Bench { workloads, store, json, quick } => bench(workloads, store, json, quick).await,
        Command::Sim { seed, seeds, loads, steps, faults, store, plant, jobs, soak_for } => {
            let jobs = jobs.map_or_else(|| std::thread::available_parallelism().map_or(1, usize::from), |j| j as usize);
            let until = match soak_for {
                Some(d) => SimUntil::Time(d),
                None => SimUntil::Seeds(seeds),
            };
            let run = SimRun { first: seed, until, loads, steps, faults, store, plant, jobs };
            simulate(run).await
        }
        Command::Eval {
            paths,
            json,
            store,
            queue,
            decider,
            llm_answers,
            verbose,
            junit,
            keep,
            keep_config,
            export_spans,
        } => {
            let out = EvalOutput { json, verbose, junit };
            let keep = Keep { url: keep, config: keep_config };
            // Asked for: the exporter starts before any scenario and flushes after the last.
            let exporting = if export_spans { Some(eval_span_export()?) } else { None };
            let spans = exporting.as_ref().map(haul_otel::Exporting::spans).unwrap_or_default();
            let done = evaluate(&paths, &out, store, queue, decider, llm_answers.as_deref(), keep, spans).await;
            if let Some(e) = exporting {
                e.stop().await;
            }
            done
        }
        Command::Replay {
            settings,
            loads,
            since,
            client,
            all,
            limit,
            shadow,
            decider,
            llm_answers,
            live,
            max_calls,
            json,
            html,
            show,
        } => {
            let select = Select { loads, since, client, all, limit };
            if shadow {
                return replay_shadow(&settings, select, json, html.as_deref(), show).await;
            }
            let llm = Llm { answers: llm_answers, live: if live { max_calls } else { None } };
            replay(&settings, select, decider, llm, json, html.as_deref(), show).await
        }
        Command::ExportScenario { load_id, settings, mask_bodies, keep_phones, output } => {
            export_scenario(&load_id, &settings, mask_bodies, keep_phones, output.as_deref()).await
        }
    }
}

fn config_check(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<ExitCode> {
    let loaded = load_settings(args, listen)?;
    loaded.validate()?;
    let shadow = loaded.config.shadow_config()?;
    if loaded.config.queue.kind == haul_config::QueueKind::Sqs && !cfg!(feature = "sqs") {
        anyhow::bail!(
            "queue.kind \"sqs\" needs a build with --features sqs (haul --version lists the features built in)"
        );
    }
    for (var, setting) in loaded.config.named_variables() {
        if std::env::var(&var).map_or(true, |v| v.trim().is_empty()) {
            anyhow::bail!("{setting} names {var}, which is not set");
        }
    }
    for note in loaded.notes() {
        eprintln!("warning: {note}");
    }
    let c = &loaded.config;
    let shadow = match (&shadow, &c.decider.shadow) {
        (Some(s), Some(file)) => format!(", shadow {} ({})", s.decider.kind, file.display()),
        _ => String::new(),
    };
    let sms = match c.channels.sms.kind() {
        haul_config::ChannelKind::Twilio => ", sms through twilio",
        haul_config::ChannelKind::Generic => "",
    };
    say(format_args!(
        "ok: store {}, queue {}, decider {}{shadow}{sms}, listening on {}",
        store::describe(&c.store.url),
        c.queue.kind,
        c.decider.kind,
        c.server.listen
    ));
    Ok(ExitCode::SUCCESS)
}

/// A value for people: a URL with its password as `***` (and no other credential).
fn shown(value: &str) -> String {
    if !value.contains("://") {
        return value.to_owned();
    }
    let redacted = haul_config::redact_url(value);
    let had_password = value
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?', '#']).next()?.rsplit_once('@'))
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    match redacted.split_once("://") {
        Some((scheme, rest)) if had_password => match rest.split_once('@') {
            Some((user, host)) => format!("{scheme}://{user}:***@{host}"),
            None => redacted,
        },
        _ => redacted,
    }
}

fn config_show(args: &ConfigArgs, listen: Option<String>) -> anyhow::Result<ExitCode> {
    let loaded = load_settings(args, listen)?;
    let c = &loaded.config;
    let mut lines = Vec::new();
    for (path, value) in c.values() {
        let left = match &value {
            Some(v) => format!("{path} = {}", shown(v)),
            None => format!("{path} unset ({})", c.unset_means(&path).unwrap_or_default()),
        };
        lines.push((left, loaded.source(&path).to_string()));
    }
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0).min(72);
    say("# setting = value   # where it came from");
    for (left, source) in &lines {
        say(format_args!("{left:<width$}  # {source}"));
    }
    say("\n# other variables haul reads");
    let mut vars: Vec<(String, String, bool)> = haul_config::NOT_SETTINGS
        .iter()
        .map(|(n, what)| (n.to_string(), what.to_string(), what.starts_with("secret")))
        .collect();
    for (var, setting) in c.named_variables() {
        if !vars.iter().any(|(n, _, _)| *n == var) {
            vars.push((var, format!("secret: named by {setting}"), true));
        }
    }
    let width = vars.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    for (name, what, secret) in vars {
        let value = match std::env::var(&name) {
            Ok(v) if secret && !v.is_empty() => "set (masked)".to_owned(),
            Ok(v) => format!("{:?}", shown(&v)),
            Err(_) => "unset".to_owned(),
        };
        say(format_args!("{name:<width$}  {value:<16}  # {what}"));
    }
    for note in loaded.notes() {
        say(format_args!("# note: {note}"));
    }
    Ok(ExitCode::SUCCESS)
}

/// The store each scenario (or seed) runs on; PostgreSQL is checked first, so a
/// database that is down or missing is one line, not a failure per scenario.
async fn eval_store(kind: StoreKind) -> anyhow::Result<EvalStore> {
    Ok(match kind {
        StoreKind::Sqlite => EvalStore::SqliteMemory,
        StoreKind::Postgres => EvalStore::Postgres(haul_harness::scratch_database().await?),
    })
}

async fn serve(settings: &ConfigArgs, listen: Option<String>, roles: &str) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, listen)?;
    let roles = haul_server::Roles::parse(roles)?;
    haul_server::metrics::set_build_info(
        env!("CARGO_PKG_VERSION"),
        env!("BUILD_HAUL_COMMIT"),
        env!("BUILD_HAUL_FEATURES"),
    );
    let backends = Backends { config: config.clone() };
    haul_server::serve(config, roles, &backends, haul_server::shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

/// The backends `serve` opens: those the settings name.
struct Backends {
    config: haul_config::Config,
}

#[async_trait::async_trait]
impl haul_server::Backends for Backends {
    async fn store(&self) -> anyhow::Result<Arc<dyn haul_store::Store>> {
        store::open(&self.config.store.url, None).await
    }

    async fn queue(
        &self,
        store: &Arc<dyn haul_store::Store>,
    ) -> anyhow::Result<(Arc<dyn haul_store::LoadQueue>, haul_core::QueueMode)> {
        Ok(match self.config.queue.kind {
            haul_config::QueueKind::Store => (store.clone(), haul_core::QueueMode::StoreQueue),
            haul_config::QueueKind::Sqs => (store::open_sqs(&self.config.queue).await?, haul_core::QueueMode::Separate),
        })
    }

    fn wake_bridge(
        &self,
        runs_worker: bool,
        runs_dispatcher: bool,
        wake_worker: Arc<tokio::sync::Notify>,
        wake_dispatcher: Arc<tokio::sync::Notify>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        store::spawn_wake_bridge(&self.config.store.url, runs_worker, runs_dispatcher, wake_worker, wake_dispatcher)
    }

    fn describe(&self) -> String {
        store::describe(&self.config.store.url)
    }
}

async fn inspect(
    load_id: &str,
    settings: &ConfigArgs,
    json: bool,
    page: &haul_runtime::inspect::Page,
) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let load = haul_core::ids::LoadId::parse(load_id).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    // Only reads: never creates a store where there was none.
    let store = store::open_read_only(&config.store.url).await?;
    let Some(view) = haul_runtime::inspect::load_view(store.as_ref(), &load, page).await? else {
        eprintln!("load {load} has no records in {}", store::describe(&config.store.url));
        return Ok(ExitCode::from(2));
    };
    if json {
        say(format_args!("{}", serde_json::to_string_pretty(&view)?));
    } else {
        say(haul_runtime::inspect::timeline(&view).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

/// `haul query ...`: one page of an operators' query, on a store that exists.
async fn query(q: QueryCommand) -> anyhow::Result<ExitCode> {
    use haul_runtime::queries::{Answer, Query, QueryError};
    use haul_store::AlertState;
    let (query, args, pairs) = q.into_parts();
    let config = load_config(&args.settings, None)?;
    let store = store::open_read_only(&config.store.url).await?;
    let now = haul_core::Clock::now(&haul_runtime::clock::SystemClock);
    let answer = match haul_runtime::queries::run(store.as_ref(), query, &pairs, now).await {
        Ok(a) => a,
        // The message names the API's parameter: the flag with `_` for `-`.
        Err(QueryError::Bad(e)) => anyhow::bail!("haul query {}: {}", query.name(), e.message),
        Err(QueryError::Store(e)) => return Err(e.into()),
    };
    if args.json {
        say(serde_json::to_string_pretty(&haul_server::answers::answer_json(&answer))?);
        return Ok(ExitCode::SUCCESS);
    }
    let ago = |s: f64| haul_core::time::format_duration(Duration::from_secs(s.max(0.0) as u64));
    let dash = |s: Option<&str>| s.unwrap_or("-").to_owned();
    let lines: Vec<String> = match &answer {
        Answer::Loads(p) => p
            .rows
            .iter()
            .map(|l| {
                format!(
                    "{}  stage {}  open asks {}  escalated {}  last activity {} ago  (version {})",
                    l.load_id,
                    dash(l.stage.as_deref()),
                    l.open_asks,
                    l.escalated_asks,
                    ago(p.age_s(l.last_activity_at)),
                    l.version
                )
            })
            .collect(),
        Answer::Dead(p) => p
            .rows
            .iter()
            .map(|d| {
                format!(
                    "{}  {} ({})  died {} ago after {} attempts: {}{}",
                    d.row.id,
                    d.row.action_type.as_str(),
                    haul_store::ops::class_name(d.row.action_type.class()),
                    ago(p.age_s(d.dead_at)),
                    d.row.attempts,
                    dash(d.row.last_failure.as_deref()),
                    inbox_note(&d.inbox)
                )
            })
            .collect(),
        Answer::Timers(p) => p
            .rows
            .iter()
            .map(|t| format!("{}  load {}  due {} ({} ago)", t.timer_id, t.load_id, t.fire_at, ago(p.age_s(t.fire_at))))
            .collect(),
        Answer::Unmatched(p) => p
            .rows
            .iter()
            .map(|i| {
                let u = &i.sms;
                format!(
                    "{}  from {}  {} ago  {}: {:?}{}",
                    u.message_sid,
                    haul_core::mask::mask_phone(&u.from),
                    ago(p.age_s(u.received_at)),
                    u.reason,
                    u.body.chars().take(80).collect::<String>(),
                    inbox_note(&i.inbox)
                )
            })
            .collect(),
        Answer::Alerts(p) => p
            .rows
            .iter()
            .map(|i| {
                let a = &i.alert;
                format!(
                    "{}  {}  {}  raised {} ago  {} after {} send(s){}: {}{}",
                    a.kind.as_str(),
                    a.outbox_id,
                    a.action_type.as_str(),
                    ago(p.age_s(a.raised_at)),
                    match a.state {
                        AlertState::Pending => "NOT delivered yet (the sweep sends it again)",
                        AlertState::Refused => "REFUSED by the ops service",
                        AlertState::Delivered => "delivered",
                    },
                    a.sends,
                    a.last_error.as_deref().map(|e| format!(" (last error: {e})")).unwrap_or_default(),
                    a.failure,
                    inbox_note(&i.inbox)
                )
            })
            .collect(),
        Answer::OptedOut(p) => p
            .rows
            .iter()
            .map(|c| {
                let load = c.load_id.as_ref().map_or_else(|| "no load".to_owned(), |l| format!("load {l}"));
                format!(
                    "{}  opted out {} ago  by {} ({load}): no SMS until they reply START",
                    haul_core::mask::mask_phone(&c.phone),
                    ago(p.age_s(c.changed_at)),
                    c.event_id
                )
            })
            .collect(),
        Answer::Conflicts(p) => p
            .rows
            .iter()
            .map(|c| {
                format!("{}  {} conflicts, the last {} ago", c.load_id, c.conflicts, ago(p.age_s(c.last_conflict_at)))
            })
            .collect(),
        Answer::Spend(p) => p
            .rows
            .iter()
            .map(|d| {
                let s = &d.spend;
                format!(
                    "{}  {}  {} call(s)  {} tokens ({} in, {} out)  {}{}",
                    d.day,
                    if d.client.is_empty() { "(no client)" } else { d.client.as_str() },
                    s.calls,
                    s.tokens(),
                    s.input_tokens,
                    s.output_tokens,
                    haul_core::spend::usd(s.cost_micro_usd),
                    d.capped_at.map(|t| format!("  BUDGET SPENT at {t}: the SOP decided after")).unwrap_or_default()
                )
            })
            .collect(),
    };
    for line in &lines {
        say(line);
    }
    let (next_flag, empty) = match query {
        Query::Loads => ("--after", "no load matches"),
        Query::Dead => ("--before", "no dead rows"),
        Query::Timers => ("--after", "no timer is overdue"),
        Query::Unmatched => ("--before", "no unmatched SMS"),
        Query::Alerts => ("--before", "no OpsAlert raised (within retention)"),
        Query::Conflicts => ("", "no load has had a conflict"),
        Query::OptedOut => ("--before", "no phone is opted out of SMS"),
        Query::Spend => ("--after", "no model call was made on these days"),
    };
    match (answer.is_empty(), answer.next()) {
        (true, None) => say(empty),
        // The loads query looks at a bounded window of loads per page.
        (true, Some(_)) => say("none on this page"),
        _ => {}
    }
    if let Some(next) = answer.next() {
        say(format_args!("next page: {next_flag} {next}"));
    }
    Ok(ExitCode::SUCCESS)
}

async fn migrate(settings: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let db = config.store.url.as_str();
    let store = store::open(db, None).await?;
    drop(store);
    say(format_args!("schema of {} is up to date", store::describe(db)));
    Ok(ExitCode::SUCCESS)
}

async fn prune(settings: &ConfigArgs, older_than: &str, batch: u32) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let db = config.store.url.as_str();
    let age =
        haul_core::time::parse_duration(older_than).map_err(|e| anyhow::anyhow!("--older-than: {}", e.message))?;
    if age < MIN_RETENTION {
        anyhow::bail!(
            "--older-than {older_than}: at least 5m (the queue deduplicates event ids for at least five minutes)"
        );
    }
    let store = store::open(db, None).await?;
    let now = haul_core::Clock::now(&haul_runtime::clock::SystemClock);
    let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    let cutoff = haul_core::time::from_ms(haul_core::time::to_ms(now).saturating_sub(age_ms));
    let mut batches = 0u64;
    let mut progress = Progress::stderr("prune: batches", None);
    let mut deleted = 0u64;
    let sum = haul_store::prune_all(store.as_ref(), cutoff, batch as usize, MAX_PRUNE_BATCHES, |b| {
        batches += 1;
        deleted += b.total();
        progress.update(batches, &format!("{deleted} rows deleted"));
        tracing::debug!(
            outbox = b.outbox,
            timers = b.timers,
            queue = b.queue,
            shadow = b.shadow,
            reports = b.reports,
            "prune batch"
        );
    })
    .await?;
    progress.finish();
    say(format_args!(
        "pruned {} outbox rows, {} timers, {} queue messages, {} shadow decisions, {} delivery reports finished before {cutoff} ({batches} batches of at most {batch} per table)",
        sum.outbox, sum.timers, sum.queue, sum.shadow, sum.reports
    ));
    if batches as usize >= MAX_PRUNE_BATCHES {
        say(format_args!("stopped after {MAX_PRUNE_BATCHES} batches; run it again for the rest"));
    }
    Ok(ExitCode::SUCCESS)
}

async fn testkit(t: Testkit) -> anyhow::Result<ExitCode> {
    match t {
        Testkit::Services { listen } => {
            let svc = haul_harness::testkit::FakeServices::start_on(&listen, None).await?;
            say(format_args!("fake services on {}", svc.addr));
            haul_server::shutdown_signal().await;
        }
        Testkit::Otlp { listen } => {
            let receiver = haul_harness::testkit_otlp::OtlpReceiver::start_on(&listen).await?;
            say(format_args!("OTLP receiver on {}", receiver.base_url));
            haul_server::shutdown_signal().await;
        }
        Testkit::Schema { db } => say(haul_harness::fresh_schema_url(&db).await.map_err(|e| anyhow::anyhow!(e.0))?.1),
        Testkit::Load { api, token, loads, seconds, seed, accepted } => {
            crashtest::load(&api, &token, loads, seconds, seed, &accepted).await?;
        }
        Testkit::Check { db, services, accepted, timeout, otlp, min_events } => {
            let store = store::open_read_only(&db).await?;
            crashtest::check(store, &services, &accepted, timeout, min_events).await?;
            if let Some(otlp) = otlp {
                crashtest::check_spans(&otlp, &accepted).await?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn bench(workloads: Vec<String>, store: StoreKind, json: bool, quick: bool) -> anyhow::Result<ExitCode> {
    let workloads: Vec<String> =
        if workloads.is_empty() { bench::WORKLOADS.iter().map(|w| w.to_string()).collect() } else { workloads };
    let dir = std::env::temp_dir().join(format!("haul-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = match store {
        StoreKind::Sqlite => bench::BenchStore::Sqlite(dir.clone()),
        StoreKind::Postgres => bench::BenchStore::Postgres(haul_harness::scratch_database().await?),
    };
    let mut all = BTreeMap::new();
    let mut progress = Progress::stderr("bench: workloads done", Some(workloads.len() as u64));
    for (i, w) in workloads.iter().enumerate() {
        // A workload runs for minutes without a word: say which one is running, and
        // keep the clock moving while it does.
        let run = bench::run_workload(w, &store, quick);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        let figures = loop {
            tokio::select! {
                r = &mut run => break r?,
                _ = tick.tick() => progress.update(i as u64, &format!("running {w}")),
            }
        };
        progress.finish();
        if !json {
            for (k, v) in &figures {
                say(format_args!("{w}.{k} = {v:.3}{}", unit_of(k)));
            }
        }
        all.insert(w.clone(), figures);
    }
    progress.finish();
    let _ = std::fs::remove_dir_all(&dir);
    if json {
        say(serde_json::to_string_pretty(&all)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `haul send-test-sms`: a signed inbound SMS to the webhook, as Twilio would post it.
async fn send_test_sms(
    from: &str,
    body: &str,
    to: &str,
    message_sid: Option<String>,
    url: Option<String>,
    settings: &ConfigArgs,
) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let token = std::env::var("HAUL_TWILIO_AUTH_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .context("HAUL_TWILIO_AUTH_TOKEN is not set: the webhook checks signatures with it, and so does this")?;
    let base =
        url.or_else(|| config.server.public_url.clone()).unwrap_or_else(|| format!("http://{}", config.server.listen));
    let url = format!("{}/v1/webhooks/twilio/sms", base.trim_end_matches('/'));
    let sid = message_sid.unwrap_or_else(|| format!("SM{:032x}", fastrand::u128(..)));
    let form: Vec<(String, String)> = [("From", from), ("To", to), ("Body", body), ("MessageSid", sid.as_str())]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let signature = haul_server::twilio::signature(&token, &url, &form);
    let answer = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .header("X-Twilio-Signature", signature)
        .body(serde_urlencoded::to_string(&form)?)
        .send()
        .await
        .with_context(|| format!("posting to {url}"))?;
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    say(format_args!("{status}  MessageSid {sid}  {}", text.trim()));
    Ok(if status.is_success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The unit a benchmark figure is in, from its name (`runs_per_s_…` is per second,
/// `p99_ms_…` milliseconds, `ratio…` a ratio to the physical limit measured beside it).
fn unit_of(figure: &str) -> &'static str {
    let has = |part: &str| figure.split('_').any(|p| p == part);
    if figure.contains("_per_s") {
        " per second"
    } else if has("ms") {
        " ms"
    } else if figure.ends_with("_s") || figure.ends_with("_seconds") {
        " s"
    } else if has("mib") {
        " MiB"
    } else if figure.starts_with("ratio") || figure.contains("_vs_") || figure.starts_with("wasted_per_") {
        " (ratio)"
    } else {
        " (count)"
    }
}

/// How long `haul sim` runs.
enum SimUntil {
    /// This many seeds.
    Seeds(u64),
    /// Seeds until this much time has passed, or one fails (a soak).
    Time(Duration),
}

/// What `haul sim` runs.
struct SimRun {
    first: u64,
    until: SimUntil,
    loads: usize,
    steps: usize,
    faults: String,
    store: StoreKind,
    plant: Option<String>,
    jobs: usize,
}

/// How often a soak says how far it got.
const SOAK_PROGRESS_EVERY: Duration = Duration::from_secs(60);

async fn simulate(run: SimRun) -> anyhow::Result<ExitCode> {
    let SimRun { first, until, loads, steps, jobs, .. } = run;
    let faults = sim::FaultSet::parse(&run.faults)?;
    let bugs = match run.plant.as_deref() {
        None => haul_runtime::faults::PlantedBugs::default(),
        Some(name) => haul_runtime::faults::PlantedBugs::parse(name)
            .ok_or_else(|| anyhow::anyhow!("--plant: unknown bug {name:?}"))?,
    };
    // What else a failing seed's command line needs to fail the same way.
    let mut also = String::new();
    if run.faults != "all" {
        also += &format!(" --faults {}", run.faults);
    }
    if run.store == StoreKind::Postgres {
        also += " --store postgres";
    }
    if let Some(bug) = &run.plant {
        also += &format!(" --plant {bug}");
    }
    let store = Arc::new(eval_store(run.store).await?);
    let (end, deadline) = match until {
        SimUntil::Seeds(n) => (first.saturating_add(n), None),
        SimUntil::Time(d) => (u64::MAX, Some(std::time::Instant::now() + d)),
    };
    let started = std::time::Instant::now();
    let (mut passed, mut failed, mut events, mut most_drain_rounds) = (0u64, 0u64, 0u64, 0usize);
    let mut coverage = BTreeMap::<String, u64>::new();
    let total = match until {
        SimUntil::Seeds(n) => Some(n),
        SimUntil::Time(_) => None,
    };
    let mut progress = Progress::stderr("sim: seeds", total);
    let mut last_soak_line = started;
    // Seeds run at once, each on its own store and services; reports wait for the
    // seeds before them, so the output reads as a serial run's.
    let mut running = tokio::task::JoinSet::new();
    let mut done = BTreeMap::<u64, anyhow::Result<sim::SimReport>>::new();
    let (mut next_start, mut next_report) = (first, first);
    let mut stop = false;
    loop {
        let time_is_up = deadline.is_some_and(|d| std::time::Instant::now() >= d);
        while !time_is_up && running.len() < jobs.max(1) && next_start < end {
            let (s, store) = (next_start, store.clone());
            let opts = sim::SimOptions { seed: s, loads, steps, faults, bugs };
            running.spawn(async move { (s, sim::run(&opts, &store).await) });
            next_start += 1;
        }
        let Some(joined) = running.join_next().await else { break };
        let (s, report) = joined.context("a seed's task panicked")?;
        done.insert(s, report);
        while let Some(report) = done.remove(&next_report) {
            let s = next_report;
            next_report += 1;
            progress.finish(); // erased before the seed's line, so the report reads as it would piped
            let report = report.with_context(|| format!("seed {s}"))?;
            for (k, v) in &report.coverage {
                *coverage.entry(k.clone()).or_default() += v;
            }
            events += report.events as u64;
            most_drain_rounds = most_drain_rounds.max(report.drain_rounds);
            match &report.violation {
                None => {
                    passed += 1;
                    say(format_args!(
                        "seed {s}: ok  digest {}  events {}  effects {}",
                        report.digest, report.events, report.effects
                    ));
                }
                Some(v) => {
                    failed += 1;
                    say(format_args!("seed {s}: FAILED  digest {}: {v}", report.digest));
                    say(format_args!("  reproduce: haul sim --seed {s} --loads {loads} --steps {steps}{also}"));
                    for line in &report.excerpt {
                        say(format_args!("  | {line}"));
                    }
                    // A soak stops at its first failure: the seeds after it are left.
                    if deadline.is_some() {
                        stop = true;
                        break;
                    }
                }
            }
            progress.update(next_report - first, &format!("seed {}, {failed} failed", next_report));
        }
        if stop {
            // Seeds after the failing one that were already running are not reported.
            running.abort_all();
            while running.join_next().await.is_some() {}
            break;
        }
        if deadline.is_some() && last_soak_line.elapsed() >= SOAK_PROGRESS_EVERY {
            last_soak_line = std::time::Instant::now();
            progress.finish();
            eprintln!("{}", soak_line(next_report - first, failed, started.elapsed(), &coverage));
        }
    }
    progress.finish();
    for failure in haul_harness::eval::drop_scratch_schemas(&store).await {
        eprintln!("warning: a scratch schema was left: {failure}");
    }
    let cov: Vec<String> = coverage.iter().map(|(k, v)| format!("{k}={v}")).collect();
    say(format_args!("coverage: {}", cov.join(" ")));
    let rare = sim::rare_fault_points(&coverage, passed + failed);
    if !rare.is_empty() {
        let rare: Vec<String> = rare.iter().map(|(k, n)| format!("{k}={n}")).collect();
        say(format_args!(
            "coverage: under {} hits a seed (1,000 in 10,000): {}",
            sim::MIN_HITS_PER_SEED,
            rare.join(" ")
        ));
    }
    say(format_args!(
        "liveness: the most drain rounds a seed took was {most_drain_rounds} (limit {}: past it, a seed fails)",
        sim::REST_WITHIN_ROUNDS
    ));
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let seeds = passed + failed;
    let peak = sim::resident_memory().map_or_else(String::new, |(_, peak)| format!(", peak RSS {} MiB", peak >> 20));
    say(format_args!(
        "speed: {:.2} seeds/s, {:.0} events/s, {jobs} at once, {:.0} s{peak}",
        seeds as f64 / secs,
        events as f64 / secs,
        secs
    ));
    // The last line stays `N passed, M failed` alone: scripts read it.
    say(format_args!("{passed} passed, {failed} failed"));
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// A soak's progress: seeds so far, their rate, and the fault point hit least.
fn soak_line(seeds: u64, failed: u64, elapsed: Duration, coverage: &BTreeMap<String, u64>) -> String {
    let points = sim::fault_point_hits(coverage);
    let least = points.iter().min_by_key(|(_, n)| *n);
    let least = least.map_or_else(|| "none".to_owned(), |(k, n)| format!("{k} ({n})"));
    format!(
        "soak: {seeds} seeds in {:.0} min, {:.2} seeds/s, {failed} failed; least-hit fault point {least}",
        elapsed.as_secs_f64() / 60.0,
        seeds as f64 / elapsed.as_secs_f64().max(1e-9)
    )
}

/// How `haul eval` reports.
struct EvalOutput {
    json: bool,
    verbose: bool,
    junit: Option<PathBuf>,
}

/// `haul eval --keep URL [--keep-config FILE]`.
struct Keep {
    url: Option<String>,
    config: Option<PathBuf>,
}

/// `haul eval --export-spans`: the exporter `serve` would start from the same
/// variables, its spans marked with the role `eval`.
fn eval_span_export() -> anyhow::Result<haul_otel::Exporting> {
    let settings = haul_otel::Settings::from_env(|name| std::env::var(name).ok())?.ok_or_else(|| {
        anyhow::anyhow!(
            "--export-spans: span export is not set up (set OTEL_EXPORTER_OTLP_ENDPOINT or \
             OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER=none turn it off)"
        )
    })?;
    Ok(haul_otel::Exporting::start(&settings, "eval")?)
}

#[allow(clippy::too_many_arguments)]
async fn evaluate(
    paths: &[PathBuf],
    out: &EvalOutput,
    store: StoreKind,
    queue: QueueKind,
    decider: DeciderKind,
    llm_answers: Option<&Path>,
    keep: Keep,
    spans: haul_runtime::spans::Spans,
) -> anyhow::Result<ExitCode> {
    let store = eval_store(store).await?;
    let decider = match (decider, llm_answers) {
        (DeciderKind::Llm, Some(file)) => {
            EvalDecider::Llm(haul_harness::testkit_llm::Answers::from_file(file).context("--llm-answers")?)
        }
        (DeciderKind::Llm, None) => anyhow::bail!("--decider llm needs --llm-answers FILE"),
        (DeciderKind::Sop, Some(_)) => anyhow::bail!("--llm-answers goes with --decider llm"),
        (DeciderKind::Sop, None) => EvalDecider::Sop,
    };
    let queue = match queue {
        QueueKind::Store => EvalQueue::Store,
        QueueKind::Sqs => EvalQueue::sqs_emulator().await?,
    };
    let kept = match &keep.url {
        Some(url) => Some(std::sync::Arc::new(
            eval::keep::Keep::open(url).await.with_context(|| format!("--keep {}", store::describe(url)))?,
        )),
        None => None,
    };
    let opts = EvalOptions { queue, decider, timelines: out.verbose, keep: kept.clone(), spans };
    let total = eval::collect(paths).len() as u64;
    let mut progress = Progress::stderr("eval: scenarios", Some(total));
    let (mut done, mut failed) = (0u64, 0u64);
    let report = eval::run_paths_with(paths, &store, &opts, |r| {
        done += 1;
        failed += u64::from(!r.passed);
        // Erased before a line is printed, so the report reads as it would piped.
        progress.finish();
        if !out.json {
            say(format_args!("{}", r.line()));
            for line in r.timeline.iter().flat_map(|t| t.lines()) {
                say(format_args!("  | {line}"));
            }
        }
        progress.update(done, &format!("{failed} failed"));
    })
    .await;
    progress.finish();
    for failure in eval::drop_scratch_schemas(&store).await {
        eprintln!("warning: a scratch schema was left: {failure}");
    }
    if let Some(file) = &out.junit {
        std::fs::write(file, eval::junit(&report)).with_context(|| format!("--junit {}", file.display()))?;
    }
    if let (Some(k), Some(url)) = (&kept, &keep.url) {
        let (loads, renamed) = k.counts().await;
        eprintln!("kept {loads} loads in {} ({} renamed: their ids were taken)", store::describe(url), renamed.len());
        if let Some(file) = &keep.config {
            std::fs::write(file, k.clients_toml().await)
                .with_context(|| format!("--keep-config {}", file.display()))?;
            eprintln!("their clients' policies: {}", file.display());
        }
    }
    if out.json {
        say(format_args!("{}", serde_json::to_string_pretty(&report)?));
    } else {
        say(format_args!("{} passed, {} failed", report.passed, report.failed));
    }
    if report.scenarios.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        eprintln!("error: no scenario files (*.toml) in {}: nothing was tested", shown.join(" "));
        return Ok(ExitCode::FAILURE);
    }
    Ok(if report.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Which loads `haul replay` reads.
struct Select {
    loads: Vec<String>,
    since: Option<String>,
    client: Option<String>,
    all: bool,
    limit: Option<usize>,
}

impl Select {
    fn selection(&self, now: haul_core::Timestamp) -> anyhow::Result<haul_harness::replay::Selection> {
        use haul_harness::replay::Selection;
        let filtered = self.since.is_some() || self.client.is_some();
        if !self.loads.is_empty() {
            anyhow::ensure!(
                !filtered && !self.all,
                "--load names the loads: it goes without --since, --client and --all"
            );
            let loads = self
                .loads
                .iter()
                .map(|l| haul_core::ids::LoadId::parse(l).map_err(|e| anyhow::anyhow!("--load {l}: {}", e.message)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Selection::Loads(loads));
        }
        anyhow::ensure!(
            filtered || self.all,
            "name the loads to replay: --load ID…, --since AGE, --client NAME or --all"
        );
        let since = match &self.since {
            None => None,
            Some(age) => {
                let d = haul_core::time::parse_duration(age).map_err(|e| anyhow::anyhow!("--since: {}", e.message))?;
                let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                Some(haul_core::time::from_ms(haul_core::time::to_ms(now).saturating_sub(ms)))
            }
        };
        if let Some(c) = &self.client {
            haul_core::event::validate_client(c).map_err(|e| anyhow::anyhow!("--client: {}", e.message))?;
        }
        Ok(Selection::Filter(haul_store::LoadSelection { since, client: self.client.clone() }))
    }
}

/// Progress on stderr, at most a few times a second, only when it is a terminal.
struct ReplayProgress {
    on: bool,
    last: std::time::Instant,
}

impl ReplayProgress {
    fn new() -> Self {
        ReplayProgress { on: std::io::IsTerminal::is_terminal(&std::io::stderr()), last: std::time::Instant::now() }
    }

    fn show(&mut self, s: &haul_core::replay::Summary) {
        if self.on && self.last.elapsed() > Duration::from_millis(250) {
            self.last = std::time::Instant::now();
            eprint!("\r{} loads, {} decisions compared, {} different ", s.loads, s.compared, s.different);
        }
    }

    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// `haul replay --llm-answers FILE [--live --max-calls N]`.
struct Llm {
    answers: Option<PathBuf>,
    /// The call budget, with --live.
    live: Option<usize>,
}

async fn replay(
    settings: &ConfigArgs,
    select: Select,
    decider: Option<DeciderKind>,
    llm: Llm,
    json: bool,
    html: Option<&Path>,
    show: usize,
) -> anyhow::Result<ExitCode> {
    use haul_harness::replay::{Candidate, ReplayOptions};
    use haul_harness::testkit_llm::{Answers, RECORDED_API_KEY, RecordedLlm, Upstream};
    let config = load_config(settings, None)?;
    let now = haul_core::Clock::now(&haul_runtime::clock::SystemClock);
    let selection = select.selection(now)?;
    let policies = haul_config::policies(&config.clients);
    let kind = match decider {
        Some(DeciderKind::Sop) => haul_config::DeciderKind::Sop,
        Some(DeciderKind::Llm) => haul_config::DeciderKind::Llm,
        None => config.decider.kind,
    };
    let mut recorded_answers: Option<(Answers, PathBuf)> = None;
    let candidate = match (kind, &llm.answers) {
        (haul_config::DeciderKind::Sop, None) if llm.live.is_none() => Candidate::Sop(policies),
        (haul_config::DeciderKind::Sop, _) => anyhow::bail!("--llm-answers and --live go with --decider llm"),
        (haul_config::DeciderKind::Llm, None) => anyhow::bail!(
            "the LLM candidate replays recorded answers: --llm-answers FILE (with --live --max-calls N, the model \
             of decider.llm.* answers what FILE does not hold, and its answers are added to FILE)"
        ),
        (haul_config::DeciderKind::Llm, Some(file)) => {
            let upstream = match llm.live {
                None => None,
                Some(max_calls) => {
                    let c = &config.decider.llm;
                    c.check()?;
                    let api_key = std::env::var(&c.api_key_env)
                        .ok()
                        .filter(|k| !k.trim().is_empty())
                        .ok_or_else(|| anyhow::anyhow!("--live: {} is not set", c.api_key_env))?;
                    Some(Upstream { base_url: c.base_url.clone().unwrap_or_default(), api_key, max_calls })
                }
            };
            let answers = match (&upstream, file.exists()) {
                (Some(_), false) => Answers {
                    model: config.decider.llm.model.clone().unwrap_or_default(),
                    timeout: config.decider.llm.timeout,
                    answers: vec![],
                },
                _ => Answers::from_file(file).context("--llm-answers")?,
            };
            if upstream.is_some() {
                anyhow::ensure!(
                    Some(&answers.model) == config.decider.llm.model.as_ref(),
                    "--llm-answers {} holds answers of model {:?}, not of decider.llm.model",
                    file.display(),
                    answers.model
                );
                recorded_answers = Some((answers.clone(), file.clone()));
            }
            let server = RecordedLlm::start_with(answers.clone(), RECORDED_API_KEY, upstream).await?;
            let settings = haul_runtime::llm::LlmSettings {
                base_url: server.base_url(),
                model: answers.model.clone(),
                api_key: RECORDED_API_KEY.into(),
                timeout: answers.timeout,
            };
            let decider = std::sync::Arc::new(haul_runtime::llm::LlmDecider::new(settings, policies.clone())?);
            Candidate::Decider { decider, policies, recorded: Some(server) }
        }
    };
    let db = config.store.url.as_str();
    let reader =
        store::open_log_reader(db).await.with_context(|| format!("opening {} read-only", store::describe(db)))?;
    let opts = ReplayOptions { selection, limit: select.limit.unwrap_or(usize::MAX), show, ..ReplayOptions::default() };
    let mut progress = ReplayProgress::new();
    let report =
        haul_harness::replay::replay(reader, &store::describe(db), &candidate, &opts, |s| progress.show(s)).await?;
    progress.done();
    if let (Some((mut answers, file)), Candidate::Decider { recorded: Some(server), .. }) =
        (recorded_answers, &candidate)
    {
        let live = server.live_answers();
        if !live.is_empty() {
            let n = live.len();
            answers.answers.extend(live);
            std::fs::write(&file, answers.to_toml()?).with_context(|| format!("--llm-answers {}", file.display()))?;
            eprintln!("{n} live answers added to {}: the same replay now runs without the model", file.display());
        }
    }
    replay_report(&report, json, html)
}

/// A replay's report as text or JSON on stdout, and as HTML in `html`; the exit status.
fn replay_report(
    report: &haul_harness::replay::ReplayReport,
    json: bool,
    html: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    if let Some(file) = html {
        std::fs::write(file, haul_harness::replay::html(report))
            .with_context(|| format!("--html {}", file.display()))?;
    }
    if json {
        say(serde_json::to_string_pretty(report)?);
    } else {
        say(haul_harness::replay::text(report).trim_end());
        if let Some(file) = html {
            say(format_args!("\nreport: {}", file.display()));
        }
    }
    Ok(if report.summary.different == 0 { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// `haul replay --shadow`: the stored shadow decisions of the selected loads, read-only.
async fn replay_shadow(
    settings: &ConfigArgs,
    select: Select,
    json: bool,
    html: Option<&Path>,
    show: usize,
) -> anyhow::Result<ExitCode> {
    use haul_harness::replay::ReplayOptions;
    let config = load_config(settings, None)?;
    let now = haul_core::Clock::now(&haul_runtime::clock::SystemClock);
    let selection = select.selection(now)?;
    let db = config.store.url.as_str();
    let reader =
        store::open_log_reader(db).await.with_context(|| format!("opening {} read-only", store::describe(db)))?;
    let opts = ReplayOptions { selection, limit: select.limit.unwrap_or(usize::MAX), show, ..ReplayOptions::default() };
    let mut progress = ReplayProgress::new();
    let report = haul_harness::replay::replay_shadow(reader, &store::describe(db), &opts, |s| progress.show(s)).await?;
    progress.done();
    replay_report(&report, json, html)
}

/// Records one export reads at most: a scenario has at most 1000 steps anyway.
const MAX_EXPORT_RECORDS: usize = 100_000;

async fn export_scenario(
    load_id: &str,
    settings: &ConfigArgs,
    mask_bodies: bool,
    keep_phones: bool,
    output: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let config = load_config(settings, None)?;
    let load = haul_core::ids::LoadId::parse(load_id).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let db = config.store.url.as_str();
    let reader =
        store::open_log_reader(db).await.with_context(|| format!("opening {} read-only", store::describe(db)))?;
    let mut records = Vec::new();
    loop {
        let after = records.last().map_or(0, |r: &haul_core::projection::Record| r.seq);
        let page = reader.read_log_page(&load, after, 1000).await?;
        let n = page.len();
        records.extend(page);
        anyhow::ensure!(records.len() <= MAX_EXPORT_RECORDS, "load {load} has more than {MAX_EXPORT_RECORDS} records");
        if n < 1000 {
            break;
        }
    }
    if records.is_empty() {
        eprintln!("load {load} has no records in {}", store::describe(db));
        return Ok(ExitCode::from(2));
    }
    let opts = haul_harness::export::ExportOptions { keep_phones, mask_bodies };
    let text = haul_harness::export::scenario(&load, &records, &config.clients, opts)?;
    match output {
        Some(file) => std::fs::write(file, text).with_context(|| format!("--output {}", file.display()))?,
        None => say(text.trim_end()),
    }
    Ok(ExitCode::SUCCESS)
}

/// Where a problem stands in the inbox, after its line: nothing while open.
fn inbox_note(m: &haul_store::InboxMark) -> String {
    if m.state == haul_core::InboxState::Open {
        return String::new();
    }
    let by = m.by.as_deref().map(|b| format!(" by {b}")).unwrap_or_default();
    let at = m.at.map(|t| format!(" at {t}")).unwrap_or_default();
    format!("  [{}{by}{at}]", m.state.as_str())
}

#[cfg(test)]
mod unit_tests {
    #[test]
    fn every_benchmark_figure_says_its_unit() {
        for (figure, unit) in [
            ("runs_per_s_saturation", " per second"),
            ("units_per_s_16_callers", " per second"),
            ("p99_ms_16_callers", " ms"),
            ("full_fold_ms_1000", " ms"),
            ("lag_p99_s", " s"),
            ("setup_seconds", " s"),
            ("peak_rss_mib", " MiB"),
            ("ratio_4_dispatchers", " (ratio)"),
            ("growth_10000_vs_100", " (ratio)"),
            ("records", " (count)"),
        ] {
            assert_eq!(super::unit_of(figure), unit, "{figure}");
        }
    }
}
