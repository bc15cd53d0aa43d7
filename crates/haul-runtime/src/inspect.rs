//! One load, whole: its log, projected state, outbox rows and timers. Serves
//! `GET /v1/loads/{id}` and `haul inspect`.

use std::fmt::Write;

use haul_core::decision::DECISION_RECORDED;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, Record, project};
use haul_store::{OutboxRow, RecordedDelivery, Store, StoreError, Timer};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct LoadView {
    pub load_id: LoadId,
    pub version: u64,
    pub state: LoadState,
    pub log: Vec<Record>,
    pub outbox: Vec<OutboxRow>,
    pub timers: Vec<Timer>,
    /// What record mode kept in place of calls to unconfigured channels.
    pub recorded: Vec<RecordedDelivery>,
}

/// `None` for a load with no records.
pub async fn load_view(store: &dyn Store, load_id: &LoadId) -> Result<Option<LoadView>, StoreError> {
    let (log, version) = store.read(load_id).await?;
    if version == 0 {
        return Ok(None);
    }
    let state = project(&log);
    let outbox = store.rows_for_load(load_id).await?;
    let timers = store.timers_for_load(load_id).await?;
    let recorded = store.deliveries(Some(load_id), 1000).await?;
    Ok(Some(LoadView { load_id: load_id.clone(), version, state, log, outbox, timers, recorded }))
}

fn hms(t: haul_core::Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S").to_string()
}

/// A readable timeline for a person at a terminal.
pub fn timeline(v: &LoadView) -> String {
    let mut out = String::new();
    let s = &v.state;
    let or_dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "load {}  version {}  client {}  stage {}  driver {}  next stop {}",
        v.load_id,
        v.version,
        or_dash(&s.client),
        or_dash(&s.stage),
        or_dash(&s.driver_phone),
        or_dash(&s.next_stop)
    );
    if s.unreadable > 0 {
        let _ = writeln!(out, "warning: {} record(s) could not be read", s.unreadable);
    }
    let _ = writeln!(out, "\nasks:");
    if s.asks.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for a in s.asks.values() {
        let _ = writeln!(
            out,
            "  {:<40} {:<9} step {}  opened {}  step since {}",
            a.ask_id.as_str(),
            a.status.as_str(),
            a.step,
            hms(a.opened_at),
            hms(a.step_decided_at)
        );
    }
    let _ = writeln!(out, "\ntimeline:");
    for r in &v.log {
        if r.kind == DECISION_RECORDED {
            let p = &r.payload;
            let decider = p["decider"].as_str().unwrap_or("?");
            let filtered = if p["filtered"] == true { " (filtered)" } else { "" };
            let _ = writeln!(
                out,
                "  #{:<4} {}  decision by {decider}{filtered}: {}",
                r.seq,
                hms(r.recorded_at),
                p["rationale"].as_str().unwrap_or("")
            );
            for a in p["actions"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "          → {:<17} {}",
                    a["type"].as_str().unwrap_or("?"),
                    a["key"].as_str().unwrap_or("?")
                );
            }
        } else {
            let _ = writeln!(
                out,
                "  #{:<4} {}  {:<15} {}  {}",
                r.seq,
                hms(r.recorded_at),
                r.kind,
                r.entry_id,
                summary(&r.payload)
            );
        }
    }
    let _ = writeln!(out, "\noutbox:");
    if v.outbox.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for o in &v.outbox {
        let detail = match (&o.receipt, &o.last_failure) {
            (Some(r), _) => format!("receipt {r}"),
            (None, Some(f)) => format!("last failure: {f}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:<10} {:<16} attempts {}  {}  {detail}",
            o.status.as_str(),
            o.action_type.as_str(),
            o.attempts,
            o.id
        );
    }
    let _ = writeln!(out, "\ntimers:");
    if v.timers.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for t in &v.timers {
        let _ = writeln!(out, "  {:<10} fire_at {}  {}", t.status.as_str(), hms(t.fire_at), t.timer_id);
    }
    if !v.recorded.is_empty() {
        let _ = writeln!(out, "\nrecorded (record mode: channels with no URL):");
        for d in &v.recorded {
            let _ = writeln!(out, "  {}  {:<5} {}  {}", hms(d.created_at), d.channel, d.key, summary(&d.payload));
        }
    }
    out
}

/// The payload's fields on one line, long text clipped.
fn summary(p: &serde_json::Value) -> String {
    let Some(obj) = p.as_object() else { return p.to_string() };
    obj.iter()
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) if s.chars().count() > 60 => {
                    format!("{:?}…", s.chars().take(60).collect::<String>())
                }
                other => other.to_string(),
            };
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}
