//! The pieces of `scripts/crash-test` (hidden `haul testkit` subcommands): the fake
//! services as a process, a load generator posting events over HTTP, and the checker
//! that waits for everything to drain and then checks what must hold after `kill -9`
//! of role processes and PostgreSQL restarts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use haul_core::action::ChannelClass;
use haul_core::ids::{LoadId, action_outcome_event_id, ops_alert_key};
use haul_core::{Channel, Clock, OutcomeStatus};
use haul_store::{OutboxStatus, Store};
use serde_json::{Value, json};

use haul_runtime::clock::SystemClock;

/// Posts events for `loads` loads for `seconds`, and writes `load event_id` for each one
/// the API accepted (202, or 200 for a duplicate) to `accepted`.
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
        let mut done = false;
        for attempt in 0..5u32 {
            match client.post(&url).bearer_auth(token).json(&event).send().await {
                Ok(r) if r.status().as_u16() == 202 || r.status().as_u16() == 200 => {
                    lines.push(format!("{} {}", loads[i], event["event_id"].as_str().unwrap_or("")));
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

/// Waits (up to `timeout_s`) until the queue is empty, no outbox row is pending and no
/// timer is overdue; then checks the invariants. Errors name what broke.
pub async fn check(store: Arc<dyn Store>, services: &str, accepted: &Path, timeout_s: u64) -> anyhow::Result<()> {
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
    let text = std::fs::read_to_string(accepted).with_context(|| format!("reading {}", accepted.display()))?;
    let mut by_load: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (l, e) = line.split_once(' ').context("accepted file: bad line")?;
        by_load.entry(l.to_owned()).or_default().push(e.to_owned());
    }
    let stats: Value = reqwest::get(format!("{services}/stats")).await?.json().await?;
    if let Some(c) = stats["conflicts"].as_array().and_then(|a| a.first()) {
        bail!("{c} reached its service twice with different payloads");
    }
    let (mut events, mut rows) = (0usize, 0usize);
    for (l, ids) in &by_load {
        let load = LoadId::parse(l)?;
        let (recs, _) = store.read(&load).await?;
        if recs.iter().enumerate().any(|(i, r)| r.seq != i as u64 + 1) {
            bail!("the log of {l} has a gap in seq");
        }
        for id in ids {
            let n = recs.iter().filter(|r| &r.entry_id == id).count();
            if n != 1 {
                bail!("accepted event {id} of {l} is in the log {n} times");
            }
            events += 1;
        }
        let has = |id: haul_core::EventId| recs.iter().any(|r| r.entry_id == id.as_str());
        for row in store.rows_for_load(&load).await? {
            rows += 1;
            let channel = row.action_type.channel().map(Channel::config_name);
            match row.status {
                OutboxStatus::Pending => bail!("outbox row {} is stuck pending", row.id),
                OutboxStatus::Dispatched => {
                    if let Some(c) = channel {
                        let n = stats["effects"][format!("{c} {}", row.id)].as_u64().unwrap_or(0);
                        if n != 1 {
                            bail!("dispatched row {} has {n} effects at the {c} service", row.id);
                        }
                    }
                    if !has(action_outcome_event_id(&row.id, OutcomeStatus::Delivered)) {
                        bail!("dispatched row {} has no delivered outcome in the log", row.id);
                    }
                }
                OutboxStatus::Dead => {
                    let ok = match row.action_type.class() {
                        ChannelClass::External => has(action_outcome_event_id(&row.id, OutcomeStatus::Failed)),
                        ChannelClass::HeroChannel | ChannelClass::Internal => {
                            let effect = format!("{} {}", Channel::Ops.config_name(), ops_alert_key(&row.id));
                            stats["effects"][effect].as_u64() == Some(1)
                        }
                    };
                    if !ok {
                        bail!("dead row {} has neither its failed outcome nor an OpsAlert", row.id);
                    }
                }
            }
        }
    }
    println!(
        "crash test: {events} accepted events each logged once, {rows} outbox rows settled, {} effects, no stuck rows",
        stats["effects"].as_object().map_or(0, |m| m.len())
    );
    Ok(())
}
