//! One load's view: its projected state and pages of its log, outbox rows and timers.
//! Serves `GET /v1/loads/{id}`, the console's load pages and `haul inspect`.
//!
//! A view is bounded whatever the load's length. The log, the outbox rows and the
//! timers come in pages of at most [`PAGE_MAX`] with a cursor for the next page, and
//! the state shows the load's facts with its most recent asks and outcomes (at most
//! [`STATE_ENTRIES_MAX`] of each, and the totals). The state is the fold of the whole
//! log, read [`FOLD_PAGE`] records at a time, each page folded and dropped: a long log
//! is never in memory whole, only the state and the page being shown.
//!
//! A server serves its views through [`LoadViews`]: the fold of each load recently
//! viewed is kept and caught up with the log's tail (the log is append-only), so a view
//! costs what its page shows; views of one load take turns (a second finds the fold
//! caught up by the first) and hold one of the [`LOAD_VIEWS_AT_ONCE`] permits only
//! while they read, so pollers of one hot load cannot starve the views of the others.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use haul_core::AskStatus;
use haul_core::BadInput;
use haul_core::decision::InboxState;
use haul_core::event::OperatorAction;
use haul_core::ids::{AskId, LoadId};
use haul_core::projection::{LoadState, OpenAsk, OutcomeSeen, Record, SmsOptOut};
use haul_core::spend::LoadSpend;
use haul_core::time::Timestamp;
use haul_store::{OutboxRow, RecordedDelivery, RowCursor, SmsReport, Store, StoreError, Timer};
use serde::Serialize;

use crate::timeline::{self, What};

/// Items of each list in a page when the caller names no limit.
pub const PAGE_DEFAULT: usize = 100;
/// Items of each list in a page at most (`limit`).
pub const PAGE_MAX: usize = 1000;
/// Log records read per step of the state's fold: the most a view holds besides its page.
pub const FOLD_PAGE: usize = 256;
/// Asks and outcomes a view's state shows at most (the most recent; `totals` counts all).
pub const STATE_ENTRIES_MAX: usize = 100;
/// Views being read at once by one server; more wait (each for its own load's turn
/// first, so the waiters of one load hold none of these).
pub const LOAD_VIEWS_AT_ONCE: usize = 4;
/// Loads whose fold a server keeps (the least recently viewed tenth goes past it).
pub const VIEWED_LOADS_KEPT: usize = 256;

/// Which page of each list a view shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Log records after this `seq` (0: from the first).
    pub after_seq: u64,
    /// At most this many log records, outbox rows, timers and recorded deliveries;
    /// 1 to [`PAGE_MAX`].
    pub limit: usize,
    /// Outbox rows after this position (`None`: from the first).
    pub outbox_after: Option<RowCursor>,
    /// Timers after this position (`None`: from the first).
    pub timers_after: Option<RowCursor>,
}

impl Default for Page {
    fn default() -> Self {
        Page { after_seq: 0, limit: PAGE_DEFAULT, outbox_after: None, timers_after: None }
    }
}

impl Page {
    /// A page from its outside form (the API's query parameters, `haul inspect`'s
    /// flags); a value out of form is `bad_query`.
    pub fn parse(
        after_seq: Option<&str>,
        limit: Option<&str>,
        outbox_after: Option<&str>,
        timers_after: Option<&str>,
    ) -> Result<Page, BadInput> {
        let bad = |what: String| BadInput::new("bad_query", what);
        let after_seq = match after_seq {
            None => 0,
            Some(s) => s.parse().map_err(|_| bad(format!("after_seq {:?} is not a seq (0 or more)", clip(s))))?,
        };
        let limit = match limit {
            None => PAGE_DEFAULT,
            Some(s) => s
                .parse()
                .ok()
                .filter(|n| (1..=PAGE_MAX).contains(n))
                .ok_or_else(|| bad(format!("limit {:?} is not a number from 1 to {PAGE_MAX}", clip(s))))?,
        };
        let cursor = |name: &str, s: Option<&str>| {
            s.map(|s| {
                RowCursor::parse(s).ok_or_else(|| {
                    bad(format!("{name} {:?} is not a cursor this API gave (next_{name} of a page)", clip(s)))
                })
            })
            .transpose()
        };
        Ok(Page {
            after_seq,
            limit,
            outbox_after: cursor("outbox_after", outbox_after)?,
            timers_after: cursor("timers_after", timers_after)?,
        })
    }
}

/// Untrusted text shortened for an error message.
fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

#[derive(Debug, Serialize)]
pub struct LoadView {
    pub load_id: LoadId,
    /// The `seq` of the last record: the version the state is the fold of.
    pub version: u64,
    pub state: StateView,
    /// Records after the page's `after_seq`, in `seq` order.
    pub log: Vec<Record>,
    /// `after_seq` of the next page of the log; `null` on the last.
    pub next_after_seq: Option<u64>,
    pub outbox: Vec<OutboxRow>,
    /// `outbox_after` of the next page of outbox rows; `null` on the last.
    pub next_outbox_after: Option<String>,
    pub timers: Vec<Timer>,
    /// `timers_after` of the next page of timers; `null` on the last.
    pub next_timers_after: Option<String>,
    /// What record mode kept in place of calls to unconfigured channels (the first
    /// `limit`).
    pub recorded: Vec<RecordedDelivery>,
    /// The delivery reports that said how the load's SMS ended (Twilio's `delivered`,
    /// `undelivered`, `failed`), the latest `limit` first.
    pub sms_reports: Vec<SmsReport>,
}

impl LoadView {
    /// What the delivery reports said of the row `outbox_id`, the earliest first.
    pub fn reports_of(&self, outbox_id: &str) -> Vec<&SmsReport> {
        self.sms_reports.iter().rev().filter(|r| r.outbox_id.as_deref() == Some(outbox_id)).collect()
    }
}

/// A load's state as a view shows it: the projection's facts, its open asks and most
/// recent others, its most recent outcomes, and how many of each the whole state has.
/// The projection's sets of processed and decided event ids, which grow with the log,
/// are counted, not listed.
#[derive(Debug, Serialize)]
pub struct StateView {
    pub version: u64,
    pub client: Option<String>,
    pub driver_phone: Option<String>,
    pub stage: Option<String>,
    pub next_stop: Option<String>,
    /// Open asks, then the others last moved most recently; at most [`STATE_ENTRIES_MAX`].
    pub asks: BTreeMap<AskId, OpenAsk>,
    /// The latest outcome per action key, most recent first; at most [`STATE_ENTRIES_MAX`].
    pub outcomes: BTreeMap<String, OutcomeSeen>,
    /// The dead rows taken out of the operators' inbox (`handled`, `dismissed`) by
    /// outbox id; a dead row not here is open. At most [`STATE_ENTRIES_MAX`]; left out
    /// when none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub inbox: BTreeMap<String, InboxState>,
    pub unreadable: u64,
    pub last_recorded_at: Option<Timestamp>,
    /// The driver phone's opt-out of SMS while it holds (`haul_core::consent`); left
    /// out when the driver can be texted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sms_opt_out: Option<SmsOptOut>,
    /// What the load's model calls cost over its life; left out when it made none.
    #[serde(skip_serializing_if = "LoadSpend::is_zero")]
    pub spend: LoadSpend,
    pub totals: StateTotals,
}

/// Sizes of the whole state.
#[derive(Debug, Serialize)]
pub struct StateTotals {
    pub asks: usize,
    pub outcomes: usize,
    pub processed: usize,
    pub decided: usize,
    /// Dead rows out of the inbox.
    pub inbox: usize,
}

impl StateView {
    /// What a view shows of `state`: only the shown entries are copied.
    pub fn of(state: &LoadState) -> Self {
        let totals = StateTotals {
            asks: state.asks.len(),
            outcomes: state.outcomes.len(),
            processed: state.processed.len(),
            decided: state.decided.len(),
            inbox: state.inbox.len(),
        };
        let mut asks: Vec<(&AskId, &OpenAsk)> = state.asks.iter().collect();
        asks.sort_by_key(|(_, a)| (a.status != AskStatus::Open, Reverse(a.step_decided_at)));
        asks.truncate(STATE_ENTRIES_MAX);
        let mut outcomes: Vec<(&String, &OutcomeSeen)> = state.outcomes.iter().collect();
        outcomes.sort_by_key(|(_, o)| Reverse(o.at));
        outcomes.truncate(STATE_ENTRIES_MAX);
        StateView {
            version: state.version,
            client: state.client.clone(),
            driver_phone: state.driver_phone.clone(),
            stage: state.stage.clone(),
            next_stop: state.next_stop.clone(),
            asks: asks.into_iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            outcomes: outcomes.into_iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            inbox: state.inbox.iter().take(STATE_ENTRIES_MAX).map(|(k, v)| (k.clone(), *v)).collect(),
            unreadable: state.unreadable,
            last_recorded_at: state.last_recorded_at,
            sms_opt_out: state.sms_opt_out.clone().filter(|_| state.sms_opted_out()),
            spend: state.spend,
            totals,
        }
    }
}

/// A server's views of loads: the folds kept, the turns per load, the permits.
pub struct LoadViews {
    permits: tokio::sync::Semaphore,
    folds: Mutex<Folds>,
    /// Log records read for views so far (folds caught up and pages), for tests and
    /// measurements.
    records_read: std::sync::atomic::AtomicU64,
}

/// Each kept load's fold (behind its turn) with the tick of its last view.
#[derive(Default)]
struct Folds {
    loads: HashMap<LoadId, (Arc<tokio::sync::Mutex<LoadState>>, u64)>,
    tick: u64,
}

impl Default for LoadViews {
    fn default() -> Self {
        LoadViews {
            permits: tokio::sync::Semaphore::new(LOAD_VIEWS_AT_ONCE),
            folds: Mutex::new(Folds::default()),
            records_read: Default::default(),
        }
    }
}

impl std::fmt::Debug for LoadViews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadViews")
    }
}

impl LoadViews {
    /// Log records read for views so far.
    pub fn records_read(&self) -> u64 {
        self.records_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The fold of `load` kept, made (empty) when missing; the least recently viewed
    /// tenth is dropped past [`VIEWED_LOADS_KEPT`].
    fn fold_of(&self, load: &LoadId) -> Arc<tokio::sync::Mutex<LoadState>> {
        let mut guard = self.folds.lock().unwrap_or_else(|p| p.into_inner());
        let Folds { loads, tick } = &mut *guard;
        *tick += 1;
        let now = *tick;
        let fold = {
            let entry = loads.entry(load.clone()).or_insert_with(|| (Default::default(), now));
            entry.1 = now;
            entry.0.clone()
        };
        if loads.len() > VIEWED_LOADS_KEPT {
            let mut ticks: Vec<u64> = loads.values().map(|(_, t)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[ticks.len() / 10];
            loads.retain(|_, (_, t)| *t > cut);
        }
        fold
    }

    /// The view of `load` (`None` for a load with no records): its kept fold caught up
    /// with the log's tail, and the page read.
    pub async fn view(&self, store: &dyn Store, load: &LoadId, page: &Page) -> Result<Option<LoadView>, StoreError> {
        let fold = self.fold_of(load);
        // This load's turn first: its other views wait here, holding no permit.
        let mut state = fold.lock().await;
        let _permit = self.permits.acquire().await.ok();
        let mut read = 0;
        loop {
            let records = store.read_page(load, state.version, FOLD_PAGE).await?;
            read += records.len();
            let more = records.len() == FOLD_PAGE;
            for r in &records {
                state.apply(r);
            }
            if !more {
                break;
            }
        }
        let limit = page.limit.clamp(1, PAGE_MAX);
        let version = state.version;
        let log: Vec<Record> = if page.after_seq < version {
            store.read_page(load, page.after_seq, limit).await?.into_iter().filter(|r| r.seq <= version).collect()
        } else {
            Vec::new()
        };
        read += log.len();
        self.records_read.fetch_add(read as u64, std::sync::atomic::Ordering::Relaxed);
        metrics::counter!("haul_load_view_records_read_total").increment(read as u64);
        let shown = StateView::of(&state);
        drop(state);
        view_from(store, load, page, shown, log).await
    }
}

/// `None` for a load with no records.
pub async fn load_view(store: &dyn Store, load_id: &LoadId, page: &Page) -> Result<Option<LoadView>, StoreError> {
    let limit = page.limit.clamp(1, PAGE_MAX);
    // The fold reads the whole log a page at a time, and keeps the records the view
    // shows as they go by: the state and the log page come from the same reads.
    let mut state = LoadState::default();
    let mut log = Vec::new();
    let mut after = 0;
    loop {
        let records = store.read_page(load_id, after, FOLD_PAGE).await?;
        let Some(last) = records.last() else { break };
        after = last.seq;
        let more = records.len() == FOLD_PAGE;
        for r in records {
            state.apply(&r);
            if r.seq > page.after_seq && log.len() < limit {
                log.push(r);
            }
        }
        if !more {
            break;
        }
    }
    view_from(store, load_id, page, StateView::of(&state), log).await
}

/// The view of a load whose state shows as `state` with `log` its page of records:
/// the outbox rows, timers and recorded deliveries read for the page.
async fn view_from(
    store: &dyn Store,
    load_id: &LoadId,
    page: &Page,
    state: StateView,
    log: Vec<Record>,
) -> Result<Option<LoadView>, StoreError> {
    let limit = page.limit.clamp(1, PAGE_MAX);
    let version = state.version;
    if version == 0 {
        return Ok(None);
    }
    let next_after_seq = log.last().map(|r| r.seq).filter(|&last| log.len() == limit && last < version);

    // One more than the page: whether there is a next one.
    let start = RowCursor::start();
    let mut outbox = store.rows_for_load_page(load_id, page.outbox_after.as_ref().unwrap_or(&start), limit + 1).await?;
    let next_outbox_after = if outbox.len() > limit {
        outbox.truncate(limit);
        outbox.last().map(|r| RowCursor::after_outbox_row(r).to_string())
    } else {
        None
    };
    let mut timers =
        store.timers_for_load_page(load_id, page.timers_after.as_ref().unwrap_or(&start), limit + 1).await?;
    let next_timers_after = if timers.len() > limit {
        timers.truncate(limit);
        timers.last().map(|t| RowCursor::after_timer(t).to_string())
    } else {
        None
    };
    let recorded = store.deliveries(Some(load_id), limit).await?;
    let sms_reports = store.sms_reports_for_load(load_id, limit).await?;
    Ok(Some(LoadView {
        load_id: load_id.clone(),
        version,
        state,
        log,
        next_after_seq,
        outbox,
        next_outbox_after,
        timers,
        next_timers_after,
        recorded,
        sms_reports,
    }))
}

/// A time with its zone: haul keeps every time in UTC and says so.
fn hms(t: haul_core::Timestamp) -> String {
    t.strftime("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// The sends a row has had: its failed attempts, and the one that went through for
/// a dispatched row (the store counts failures; a person asks "how often was it sent").
pub fn sends(row: &OutboxRow) -> u32 {
    row.attempts + u32::from(row.status == haul_store::OutboxStatus::Dispatched)
}

/// An `operator_action` in one line: who, what, on which row, SMS or ask, and why.
fn operator_summary(op: &OperatorAction, target: &str) -> String {
    format!("by {}: {} {target}, reason: {}", op.actor, op.command.name(), clip_line(&op.reason))
}

/// One line of at most 200 characters.
fn clip_line(s: &str) -> String {
    let line: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).take(200).collect();
    if s.chars().count() > 200 { format!("{line}…") } else { line }
}

/// `haul inspect`'s text: the load's facts, asks, the timeline's items, outbox rows,
/// timers and recorded deliveries.
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
    if let Some(o) = &s.sms_opt_out {
        let at = o.at.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "sms: the driver opted out ({} at {at}): no SMS until they reply START", o.event_id);
    }
    if !s.spend.is_zero() {
        let p = &s.spend.spend;
        let capped = if s.spend.capped { "; its LLM budget is spent: the SOP decides for it" } else { "" };
        let _ = writeln!(
            out,
            "model spend: {} call(s), {} tokens ({} in, {} out), {}{capped}",
            p.calls,
            p.tokens(),
            p.input_tokens,
            p.output_tokens,
            haul_core::spend::usd(p.cost_micro_usd)
        );
    }
    if s.unreadable > 0 {
        let _ = writeln!(out, "warning: {} record(s) could not be read", s.unreadable);
    }
    let _ = writeln!(out, "\nasks:");
    if s.asks.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    if s.totals.asks > s.asks.len() {
        let _ = writeln!(out, "  ({} of {} asks: the open ones and the latest)", s.asks.len(), s.totals.asks);
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
    for item in timeline::items(&v.log, &v.outbox) {
        let what = match &item.what {
            What::Decision { decision: d, actions } => {
                let filtered = if d.filtered { " (filtered)" } else { "" };
                let (seq, at, decider) = (item.seq, hms(item.recorded_at), &d.decider);
                let _ = writeln!(out, "  #{seq:<4} {at}  decision by {decider}{filtered}: {}", d.rationale);
                if let Some(u) = &d.llm {
                    let cost = u.cost_micro_usd.map(|c| format!(", {}", haul_core::spend::usd(c))).unwrap_or_default();
                    let _ = writeln!(
                        out,
                        "          model {}{}: {} in, {} out{cost}; prompt {:.12}, input {:.12}",
                        u.model,
                        u.model_version.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
                        u.input_tokens,
                        u.output_tokens,
                        u.prompt_hash,
                        u.input_hash
                    );
                }
                for (a, _) in actions {
                    let _ = writeln!(out, "          → {:<17} {}", a.action_type().as_str(), a.key);
                }
                continue;
            }
            What::Operator { action: op, target, .. } => operator_summary(op, target),
            What::Outcome { fields, .. } | What::Event { fields } => summary(fields),
            What::Unreadable { reason, fields } => format!("unreadable ({}): {}", clip_line(reason), summary(fields)),
        };
        let (seq, at) = (item.seq, hms(item.recorded_at));
        let _ = writeln!(out, "  #{seq:<4} {at}  {:<15} {}  {what}", item.kind, item.entry_id);
    }
    if let Some(next) = v.next_after_seq {
        let _ = writeln!(out, "  … more records: --after-seq {next}");
    }
    let _ = writeln!(out, "\noutbox:");
    if v.outbox.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for o in &v.outbox {
        let mut detail = match (&o.receipt, &o.last_failure) {
            (Some(r), _) => format!("receipt {r}"),
            (None, Some(f)) => format!("last failure: {f}"),
            _ => String::new(),
        };
        if let Some(dead) = o.action.get("requeue_of").and_then(|d| d.as_str()) {
            detail = format!("{detail}  (requeues {dead})");
        }
        for r in v.reports_of(&o.id) {
            let code = r.error_code.as_deref().map(|c| format!(" (error {c})")).unwrap_or_default();
            detail = format!("{detail}  {}{code} at {}", r.status, hms(r.reported_at));
        }
        let _ = writeln!(
            out,
            "  {:<10} {:<16} sends {}  created {}  due {}  {}  {detail}",
            o.status.as_str(),
            o.action_type.as_str(),
            sends(o),
            hms(o.created_at),
            hms(o.due_at),
            o.id
        );
    }
    if let Some(next) = &v.next_outbox_after {
        let _ = writeln!(out, "  … more outbox rows: --outbox-after {next}");
    }
    let _ = writeln!(out, "\ntimers:");
    if v.timers.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for t in &v.timers {
        let _ = writeln!(
            out,
            "  {:<10} fire_at {}  created {}  {}",
            t.status.as_str(),
            hms(t.fire_at),
            hms(t.created_at),
            t.timer_id
        );
    }
    if let Some(next) = &v.next_timers_after {
        let _ = writeln!(out, "  … more timers: --timers-after {next}");
    }
    if !v.recorded.is_empty() {
        let _ = writeln!(out, "\nrecorded (record mode: channels with no URL):");
        for d in &v.recorded {
            let _ = writeln!(out, "  {}  {:<5} {}  {}", hms(d.created_at), d.channel, d.key, summary(&d.payload));
        }
    }
    out
}

/// The payload's fields on one line, long text clipped; ids and keys are always
/// whole (a clipped id cannot be looked up).
fn summary(p: &serde_json::Value) -> String {
    let Some(obj) = p.as_object() else { return p.to_string() };
    obj.iter()
        .map(|(k, v)| {
            let is_id = k == "id" || k == "key" || k.ends_with("_id");
            let v = match v {
                serde_json::Value::String(s) if !is_id && s.chars().count() > 60 => {
                    format!("{:?}…", s.chars().take(60).collect::<String>())
                }
                other => other.to_string(),
            };
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use haul_core::OutcomeStatus;
    use haul_core::event::OperatorCommand;
    use haul_core::ids::EventId;
    use haul_core::time::{add, from_ms};

    use super::*;

    #[test]
    fn an_operator_action_reads_as_who_what_and_why() {
        let action = haul_core::Action {
            key: "L1/x/create_hero_task".into(),
            kind: haul_core::ActionKind::CreateHeroTask {
                title: "t".into(),
                body: "b".into(),
                urgency: haul_core::Urgency::Normal,
            },
            ask_id: None,
            step: None,
            requeue_of: None,
        };
        let op =
            |actor: &str, reason: &str, command| OperatorAction { actor: actor.into(), reason: reason.into(), command };
        let requeue =
            op("ana", "Hero fixed\n(INC-42)", OperatorCommand::Requeue { outbox_id: action.key.clone(), action });
        let assign = op(
            "bo",
            "x",
            OperatorCommand::AssignSms { message_sid: "SM1".into(), from: "+1".into(), body: "b".into() },
        );
        for (op, want) in [
            (&requeue, "by ana: requeue L1/x/create_hero_task, reason: Hero fixed (INC-42)"),
            (&assign, "by bo: assign_sms SM1, reason: x"),
        ] {
            assert_eq!(operator_summary(op, timeline::target(&op.command)), want);
        }
    }

    #[test]
    fn a_views_state_keeps_open_asks_and_the_latest_others_and_counts_all() {
        let at = |s: u64| add(from_ms(0), Duration::from_secs(s));
        let mut state = LoadState::default();
        for n in 0..150u64 {
            let ask_id = AskId::new("eta_request", &EventId::parse(&format!("p{n}")).unwrap()).unwrap();
            // Three open asks among the oldest.
            let status = if n < 3 { AskStatus::Open } else { AskStatus::Closed };
            let ask = OpenAsk {
                ask_id: ask_id.clone(),
                kind: "eta_request".into(),
                step: 1,
                opened_at: at(n),
                step_decided_at: at(n),
                status,
                answered_by: None,
            };
            state.asks.insert(ask_id, ask);
            let seen = OutcomeSeen { status: OutcomeStatus::Delivered, event_id: format!("evt:{n}"), at: at(n) };
            state.outcomes.insert(format!("L1/p{n}/send_sms"), seen);
            state.processed.insert(EventId::parse(&format!("p{n}")).unwrap());
        }
        let view = StateView::of(&state);
        assert_eq!((view.totals.asks, view.totals.outcomes, view.totals.processed), (150, 150, 150));
        assert_eq!((view.asks.len(), view.outcomes.len()), (STATE_ENTRIES_MAX, STATE_ENTRIES_MAX));
        assert_eq!(view.asks.values().filter(|a| a.status == AskStatus::Open).count(), 3, "every open ask");
        let oldest_closed = view.asks.values().filter(|a| a.status != AskStatus::Open).map(|a| a.opened_at).min();
        assert_eq!(oldest_closed, Some(at(53)), "then the 97 latest closed ones");
        assert_eq!(view.outcomes.values().map(|o| o.at).min(), Some(at(50)), "the 100 latest outcomes");
    }

    /// `haul inspect`'s text: due and created times, every time with its zone, ids
    /// never clipped, and sends (not failures) per outbox row.
    #[test]
    fn the_timeline_shows_whole_ids_zoned_times_and_sends() {
        let t = |s: &str| -> Timestamp { format!("2026-03-02T{s}Z").parse().unwrap() };
        let load = LoadId::parse("481207").unwrap();
        let long_key = format!("481207/ask:eta_request:{}/1/send_sms", "p".repeat(70));
        let row = |id: &str, status: haul_store::OutboxStatus, attempts: u32| OutboxRow {
            id: id.into(),
            load_id: load.clone(),
            action_type: haul_core::ActionType::SendSms,
            action: serde_json::Value::Null,
            status,
            attempts,
            due_at: t("07:00:05"),
            first_attempt_at: None,
            claim_token: None,
            lease_until: None,
            last_failure: None,
            receipt: None,
            created_at: t("07:00:00"),
            updated_at: t("07:00:05"),
            trace: None,
        };
        let outcome = serde_json::json!({"outbox_id": long_key, "action_type": "send_sms", "status": "delivered", "failure": "x".repeat(80)});
        let view = LoadView {
            load_id: load.clone(),
            version: 1,
            state: StateView::of(&LoadState::default()),
            log: vec![Record::decode(1, "evt:out".into(), "action_outcome", outcome, t("07:01:00"))],
            next_after_seq: None,
            outbox: vec![
                row("481207/a/send_sms", haul_store::OutboxStatus::Dispatched, 0),
                row("481207/b/send_sms", haul_store::OutboxStatus::Dead, 3),
                row("481207/c/send_sms", haul_store::OutboxStatus::Pending, 2),
            ],
            next_outbox_after: None,
            timers: vec![],
            next_timers_after: None,
            recorded: vec![],
            // The latest first, as the store reads them; a row lists its own in order.
            sms_reports: ["delivered", "sent"]
                .iter()
                .zip(["07:03:00", "07:02:00"])
                .map(|(status, at)| SmsReport {
                    message_sid: "SM1".into(),
                    status: (*status).into(),
                    error_code: None,
                    outbox_id: Some("481207/a/send_sms".into()),
                    load_id: Some(load.clone()),
                    reason: None,
                    reported_at: t(at),
                })
                .collect(),
        };
        let text = timeline(&view);
        let a = text.lines().find(|l| l.contains("481207/a/send_sms")).unwrap();
        assert!(a.ends_with("sent at 2026-03-02 07:02:00 UTC  delivered at 2026-03-02 07:03:00 UTC"), "{a}");
        assert!(text.contains("#1    2026-03-02 07:01:00 UTC  action_outcome"), "{text}");
        assert!(!text.contains("unreadable"), "{text}");
        assert!(text.contains(&format!("outbox_id=\"{long_key}\"")), "the id is whole: {text}");
        assert!(text.contains(&format!("failure=\"{}\"…", "x".repeat(60))), "text is clipped: {text}");
        for (id, sends) in [("a", 1), ("b", 3), ("c", 2)] {
            let line = text.lines().find(|l| l.contains(&format!("481207/{id}/send_sms"))).unwrap();
            assert!(line.contains(&format!("sends {sends} ")), "{line}");
            assert!(line.contains("created 2026-03-02 07:00:00 UTC  due 2026-03-02 07:00:05 UTC"), "{line}");
        }
    }

    /// `haul inspect` says what the load's model calls cost, and each call's model,
    /// tokens, cost and prompt.
    #[test]
    fn the_text_shows_what_the_model_calls_cost() {
        let t = |s: &str| -> Timestamp { format!("2026-03-02T{s}Z").parse().unwrap() };
        let decision = serde_json::json!({"decision_id": "dec:p1", "event_id": "p1", "decided_at": "2026-03-02T07:00:00Z",
            "decider": "llm:m", "filtered": false, "needs_hero_task": false, "rationale": "nothing to do", "actions": [],
            "llm": {"model": "m", "model_version": "m-2026", "input_tokens": 1200, "output_tokens": 80,
                    "cost_micro_usd": 3040, "prompt_hash": "a".repeat(64), "input_hash": "b".repeat(64)}});
        let log = vec![Record::decode(1, "dec:p1".into(), "decision_recorded", decision, t("07:00:00"))];
        let mut state = LoadState::default();
        for r in &log {
            state.apply(r);
        }
        let view = LoadView {
            load_id: LoadId::parse("481207").unwrap(),
            version: 1,
            state: StateView::of(&state),
            log,
            next_after_seq: None,
            outbox: vec![],
            next_outbox_after: None,
            timers: vec![],
            next_timers_after: None,
            recorded: vec![],
            sms_reports: vec![],
        };
        let text = timeline(&view);
        assert!(text.contains("model spend: 1 call(s), 1280 tokens (1200 in, 80 out), $0.003040\n"), "{text}");
        assert!(
            text.contains("model m (m-2026): 1200 in, 80 out, $0.003040; prompt aaaaaaaaaaaa, input bbbbbbbbbbbb\n"),
            "{text}"
        );
        state.spend.capped = true;
        let capped = timeline(&LoadView { state: StateView::of(&state), ..view });
        assert!(capped.contains("$0.003040; its LLM budget is spent: the SOP decides for it"), "{capped}");
    }

    #[test]
    fn pages_parse_their_outside_form() {
        assert_eq!(Page::parse(None, None, None, None).unwrap(), Page::default());
        let p = Page::parse(Some("200"), Some("1000"), Some("5.L1/a"), Some("6.tmr:L1:x")).unwrap();
        assert_eq!((p.after_seq, p.limit), (200, 1000));
        assert_eq!(p.outbox_after.map(|c| c.id), Some("L1/a".to_string()));
        for (after, limit, cursor) in [
            (Some("-1"), None, None),
            (Some("x"), None, None),
            (None, Some("0"), None),
            (None, Some("1001"), None),
            (None, Some("ten"), None),
            (None, None, Some("L1/a")),
        ] {
            let err = Page::parse(after, limit, cursor, None).unwrap_err();
            assert_eq!(err.code, "bad_query", "{after:?} {limit:?} {cursor:?}");
        }
    }
}
