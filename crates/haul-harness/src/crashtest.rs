//! The pieces of `scripts/crash-test` (hidden `haul testkit` subcommands): the fake
//! services as a process, a load generator posting events over HTTP, and the checker
//! that waits for everything to drain and then checks what must hold after `kill -9`
//! of role processes and PostgreSQL restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use haul_core::ids::LoadId;
use haul_core::{Channel, Clock};
use haul_store::{OutboxStatus, Store};
use serde_json::{Value, json};

use haul_runtime::clock::SystemClock;

use crate::invariants;

/// Posts events for `loads` loads for `seconds`, each in a trace of its own (a
/// `traceparent`), and writes `load event_id trace_id` for each one the API accepted
/// (202, or 200 for a duplicate) to `accepted`.
pub async fn load(
    api: &str,
    token: &str,
    loads: usize,
    seconds: u64,
    seed: u64,
    accepted: &Path,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut n = 0u64;
    let (mut ok, mut refused) = (0u64, 0u64);
    let loads: Vec<String> = (0..loads).map(|i| format!("C{i}")).collect();
    let mut initialized = vec![false; loads.len()];
    while Instant::now() < deadline {
        let i = rng.usize(0..loads.len());
        n += 1;
        let phone = format!("+1555556{:04}", 1000 + i);
        let event = if !initialized[i] {
            json!({"event_id": "load:init", "kind": "load_update", "client": "client_a", "driver_phone": phone, "stage": "in_transit"})
        } else {
            match rng.u32(0..10) {
                0..=5 => {
                    json!({"event_id": format!("p{n}"), "kind": "location_ping", "lat": 41.0, "lon": -87.0, "risk": "high"})
                }
                6..=7 => json!({"event_id": format!("s{n}"), "kind": "inbound_sms", "from": phone, "body": "ETA 9:15"}),
                8 => {
                    json!({"event_id": format!("x{n}"), "kind": "inbound_sms", "from": "+15555559999", "body": "hello"})
                }
                _ => json!({"event_id": format!("u{n}"), "kind": "load_update", "next_stop": format!("stop {n}")}),
            }
        };
        let url = format!("{api}/v1/loads/{}/events", loads[i]);
        let trace = haul_core::trace::TraceParent::root(rng.u128(..), rng.u64(..));
        let mut done = false;
        for attempt in 0..5u32 {
            let post = client.post(&url).bearer_auth(token).header("traceparent", trace.to_string()).json(&event);
            match post.send().await {
                Ok(r) if r.status().as_u16() == 202 || r.status().as_u16() == 200 => {
                    let event_id = event["event_id"].as_str().unwrap_or("");
                    lines.push(format!("{} {event_id} {}", loads[i], trace.trace_id_hex()));
                    initialized[i] = true;
                    done = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt + 1))).await,
            }
        }
        if done {
            ok += 1
        } else {
            refused += 1
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(20..120))).await;
    }
    std::fs::write(accepted, lines.join("\n") + "\n").with_context(|| format!("writing {}", accepted.display()))?;
    println!("load generator: {ok} events accepted, {refused} given up after retries");
    Ok(())
}

/// The accepted file's `load event_id trace_id` lines (the trace id is absent in a file
/// of an older build).
fn read_accepted(accepted: &Path) -> anyhow::Result<Vec<(String, String, Option<String>)>> {
    let text = std::fs::read_to_string(accepted).with_context(|| format!("reading {}", accepted.display()))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split(' ');
        let (Some(l), Some(e)) = (fields.next(), fields.next()) else { bail!("accepted file: bad line {line:?}") };
        out.push((l.to_owned(), e.to_owned(), fields.next().map(str::to_owned)));
    }
    Ok(out)
}

/// Waits (up to `timeout_s`) until the queue is empty, no outbox row is pending and no
/// timer is overdue; then checks the invariants. Errors name what broke. Fewer than
/// `min_events` accepted events is an error too: with none, every check would pass.
pub async fn check(
    store: Arc<dyn Store>,
    services: &str,
    accepted: &Path,
    timeout_s: u64,
    min_events: usize,
) -> anyhow::Result<()> {
    let clock = SystemClock;
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        let depth = store.depth().await?;
        let pending = store.count_by_status(OutboxStatus::Pending).await?;
        let overdue = store.due(clock.now(), 1).await?.len();
        if depth == 0 && pending == 0 && overdue == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "did not drain within {timeout_s}s: queue depth {depth}, pending outbox rows {pending}, overdue timers {overdue}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut by_load: BTreeMap<String, Vec<(String, Option<String>)>> = BTreeMap::new();
    for (l, e, t) in read_accepted(accepted)? {
        by_load.entry(l).or_default().push((e, t));
    }
    let total: usize = by_load.values().map(Vec::len).sum();
    if total < min_events.max(1) {
        bail!(
            "the API accepted {total} events (at least {} expected): the crash test tested nothing; is the API up?",
            min_events.max(1)
        );
    }
    let stats: Value = reqwest::get(format!("{services}/stats")).await?.json().await?;
    let conflicts: Vec<String> =
        stats["conflicts"].as_array().into_iter().flatten().filter_map(|c| c.as_str().map(str::to_owned)).collect();
    invariants::one_payload_per_key(&conflicts)?;
    // Killed dispatchers resend keys; the services dedupe, so one effect per key is the
    // check, and the sends are reported beside it.
    let deduped_effects =
        |c: Channel, key: &str| stats["effects"][format!("{} {key}", c.config_name())].as_u64().unwrap_or(0) as usize;
    let refused = invariants::refused_alerts(store.as_ref(), 100).await?;
    let (mut events, mut rows) = (0usize, 0usize);
    for (l, ids) in &by_load {
        let load = LoadId::parse(l)?;
        let (recs, _) = store.read(&load).await?;
        invariants::events_logged_once(&load, &recs, ids.iter().map(|(e, _)| e.as_str()))?;
        invariants::log_is_sound(&load, &recs)?;
        let traced = ids.iter().filter_map(|(e, t)| Some((e.as_str(), t.as_deref()?)));
        invariants::traces_continued(&load, &recs, traced)?;
        let outbox = store.rows_for_load(&load).await?;
        invariants::outbox_settled(&load, &recs, &outbox, &refused, deduped_effects)?;
        invariants::requeued_once(&load, &outbox)?;
        events += ids.len();
        rows += outbox.len();
    }
    println!(
        "crash test: {events} accepted events each logged once in its trace, {rows} outbox rows settled, {} keys with one effect each at services that dedupe ({} calls taken), no stuck rows",
        stats["effects"].as_object().map_or(0, |m| m.len()),
        stats["sends"]
    );
    Ok(())
}

/// The spans the roles exported to the OTLP receiver at `otlp` (`haul testkit otlp`)
/// across the kills: none twice, every run of an accepted event in the trace it came
/// in, whichever process ran it. A run a `kill -9` took before its span was exported
/// is counted, not an error: the trace is in the store, and the next run continues it.
pub async fn check_spans(otlp: &str, accepted: &Path) -> anyhow::Result<()> {
    // The roles still running export what they queued within their batch delay.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let spans: Vec<crate::testkit_otlp::ReceivedSpan> =
        reqwest::get(format!("{otlp}/spans")).await?.error_for_status()?.json().await?;
    let traces: std::collections::HashMap<(String, String), String> =
        read_accepted(accepted)?.into_iter().filter_map(|(l, e, t)| Some(((l, e), t?))).collect();
    let c = invariants::spans_continued(&spans, &traces)?;
    if c.runs == 0 {
        bail!("no span of a run of an accepted event reached the receiver: was export on?");
    }
    println!(
        "spans: {} from {} processes, none exported twice; {} runs of {} accepted events each in its event's trace, {} events run by two or more processes; {} events' runs not exported (a kill took them)",
        c.spans,
        c.processes,
        c.runs,
        traces.len(),
        c.events_run_by_several,
        c.events_without_a_run
    );
    Ok(())
}
