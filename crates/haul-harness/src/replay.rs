//! `haul replay`, the edge: read the selected loads' logs through a [`LogReader`] (a
//! store opened read-only), hand each recorded decision and the state before it to the
//! candidate decider, and gather what `haul_core::replay` finds into a report (text,
//! JSON, one self-contained HTML page).
//!
//! Memory is one load's state and its current page, plus a bounded prefetch: a reader
//! task reads ahead at most [`PREFETCH_PAGES`] pages of at most `page` records while
//! the candidate decides, so a replay of a million loads holds no more than one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use haul_core::decision::Decision;
use haul_core::filter::filter;
use haul_core::ids::LoadId;
use haul_core::projection::{LoadState, Record};
use haul_core::replay::{self, Divergence, ONE_STEP_NOTE, SHADOW_NOTE, Summary, Walker, rule_for};
use haul_core::sop::{Policies, Rule, decide_with_rule};
use haul_core::{InboundEvent, Timestamp};
use haul_runtime::decider::Decider;
use haul_store::{LoadSelection, LogReader};
use serde::{Deserialize, Serialize};

use crate::testkit_llm::RecordedLlm;

/// Pages the reader task may read ahead of the candidate.
pub const PREFETCH_PAGES: usize = 8;
/// Load ids asked for at once.
const ID_PAGE: usize = 256;

/// Which loads to replay.
#[derive(Clone, Debug)]
pub enum Selection {
    /// These loads, in this order.
    Loads(Vec<LoadId>),
    /// Every load that passes the filter, in id order.
    Filter(LoadSelection),
}

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub selection: Selection,
    /// At most this many loads.
    pub limit: usize,
    /// Differences kept with their context (the first ones found).
    pub show: usize,
    /// Records per read.
    pub page: usize,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            selection: Selection::Filter(LoadSelection::default()),
            limit: usize::MAX,
            show: 20,
            page: 1024,
        }
    }
}

/// The decider set beside the record.
pub enum Candidate {
    /// The SOP with these policies (called directly: no model, no await).
    Sop(Policies),
    /// Any decider (the LLM decider), with the policies the SOP rule of each event is
    /// named by, and the recorded model server when the answers are recorded ones.
    Decider { decider: Arc<dyn Decider>, policies: Policies, recorded: Option<RecordedLlm> },
}

impl Candidate {
    pub fn name(&self) -> String {
        match self {
            Candidate::Sop(_) => "sop".into(),
            Candidate::Decider { decider, .. } => decider.name(),
        }
    }

    /// The candidate's decision on `state` before `event` at `now`, as a run would
    /// record it (the filter first, then the decider, a fallback for a failure or a
    /// decision that does not validate), and the SOP rule the event falls under.
    /// `None` when the decision cannot be had (no recorded model answer): not compared.
    async fn decide(
        &self,
        load: &LoadId,
        state: &LoadState,
        event: &InboundEvent,
        now: Timestamp,
    ) -> Result<(Decision, Rule), &'static str> {
        match self {
            Candidate::Sop(policies) => {
                let (d, rule) = match filter(load, state, event, now) {
                    Some(d) => (d, Rule::Filter),
                    None => decide_with_rule(policies, load, state, event, now),
                };
                Ok((replay::accept(load, state, event, now, "sop", Ok(d)), rule))
            }
            Candidate::Decider { decider, policies, recorded } => {
                let rule = rule_for(policies, load, state, event, now);
                if let Some(d) = filter(load, state, event, now) {
                    return Ok((d, rule));
                }
                let asked = recorded.as_ref().map_or(0, |r| r.requests().len());
                let answer = decider.decide(load, state, event, now).await.map_err(|e| format!("{e:#}"));
                if let Some(r) = recorded {
                    let requests = r.requests();
                    if requests.len() > asked && requests[asked..].iter().any(|q| !q.answered) {
                        return Err("no model answer (none recorded, or the live call budget spent)");
                    }
                }
                Ok((replay::accept(load, state, event, now, &decider.name(), answer), rule))
            }
        }
    }
}

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct ReplayReport {
    pub note: &'static str,
    /// The store, without credentials.
    pub store: String,
    pub candidate: String,
    pub summary: Summary,
    /// The first differences, with their context.
    pub differences: Vec<Divergence>,
    /// The first loads with a difference (`summary.loads_affected` counts them all).
    pub affected_loads: Vec<String>,
    pub seconds: f64,
}

/// Loads named in the report at most.
const AFFECTED_SHOWN: usize = 50;

enum Chunk {
    Records(LoadId, Vec<Record>),
    End(LoadId),
}

/// Reads the selected loads' logs, page by page, into `tx` (bounded: it waits for the
/// candidate when it is [`PREFETCH_PAGES`] ahead).
async fn read_ahead(
    reader: Arc<dyn LogReader>,
    opts: ReplayOptions,
    tx: tokio::sync::mpsc::Sender<anyhow::Result<Chunk>>,
) {
    let send_load = |load: LoadId| {
        let (reader, tx, page) = (reader.clone(), tx.clone(), opts.page.max(1));
        async move {
            let mut after = 0u64;
            loop {
                let records = reader.read_log_page(&load, after, page).await?;
                let n = records.len();
                after = records.last().map_or(after, |r| r.seq);
                if n > 0 && tx.send(Ok(Chunk::Records(load.clone(), records))).await.is_err() {
                    return anyhow::Ok(false);
                }
                if n < page {
                    return Ok(tx.send(Ok(Chunk::End(load))).await.is_ok());
                }
            }
        }
    };
    let run = async {
        let mut count = 0usize;
        match &opts.selection {
            Selection::Loads(loads) => {
                for l in loads.iter().take(opts.limit) {
                    if !send_load(l.clone()).await? {
                        return Ok(());
                    }
                }
            }
            Selection::Filter(f) => {
                let mut after: Option<LoadId> = None;
                while count < opts.limit {
                    let ids = reader.select_loads(f, after.as_ref(), ID_PAGE.min(opts.limit - count)).await?;
                    let Some(last) = ids.last().cloned() else { break };
                    for l in ids {
                        count += 1;
                        if !send_load(l).await? {
                            return Ok(());
                        }
                    }
                    after = Some(last);
                }
            }
        }
        anyhow::Ok(())
    };
    if let Err(e) = run.await {
        let _ = tx.send(Err(e)).await;
    }
}

/// Replays the selected loads against the candidate. `progress` sees the counts after
/// each load.
pub async fn replay(
    reader: Arc<dyn LogReader>,
    store: &str,
    candidate: &Candidate,
    opts: &ReplayOptions,
    mut progress: impl FnMut(&Summary),
) -> anyhow::Result<ReplayReport> {
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::channel(PREFETCH_PAGES);
    let reading = tokio::spawn(read_ahead(reader, opts.clone(), tx));
    let mut summary = Summary::default();
    let mut differences = Vec::new();
    let mut affected_loads = Vec::new();
    let mut walker: Option<(Walker, bool)> = None;
    while let Some(chunk) = rx.recv().await {
        match chunk? {
            Chunk::Records(load, records) => {
                let (w, affected) = walker.get_or_insert_with(|| (Walker::new(load.clone()), false));
                summary.records += records.len() as u64;
                for r in records {
                    let Some(step) = w.feed(r) else { continue };
                    let now = step.recorded.decided_at;
                    match candidate.decide(&load, w.state(), &step.event, now).await {
                        Ok((d, rule)) => {
                            let diff = replay::compare(&step.recorded, &d);
                            summary.add(rule, &diff);
                            if !diff.is_empty() {
                                *affected = true;
                                if differences.len() < opts.show {
                                    differences.push(Divergence::new(&step, rule, &d, diff));
                                }
                            }
                        }
                        Err(why) => summary.skip(why, 1),
                    }
                    w.finish(step);
                }
            }
            Chunk::End(load) => {
                let (w, affected) = walker.take().unwrap_or_else(|| (Walker::new(load.clone()), false));
                let (_, unpaired) = w.close();
                summary.skip("records that do not pair an event with its decision", unpaired);
                summary.loads += 1;
                if affected {
                    summary.loads_affected += 1;
                    if affected_loads.len() < AFFECTED_SHOWN {
                        affected_loads.push(load.to_string());
                    }
                }
                progress(&summary);
            }
        }
    }
    reading.await?;
    Ok(ReplayReport {
        note: ONE_STEP_NOTE,
        store: store.to_owned(),
        candidate: candidate.name(),
        summary,
        differences,
        affected_loads,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Shadow decisions read per request.
const SHADOW_PAGE: usize = 1024;

/// `haul replay --shadow`: the shadow decisions stored for the selected loads (shadow
/// mode, `decider.shadow`) set beside the decisions the primary recorded, counted and
/// shown as a replay's: the recorded side is the primary's, the candidate the
/// shadow's. Nothing decides here: both decisions were made live, on the same state,
/// event and time. A shadow that gave no decision (it failed, was late, or did not
/// validate) is counted under *not compared*.
pub async fn replay_shadow(
    reader: Arc<dyn LogReader>,
    store: &str,
    opts: &ReplayOptions,
    mut progress: impl FnMut(&Summary),
) -> anyhow::Result<ReplayReport> {
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut differences = Vec::new();
    let mut affected_loads = Vec::new();
    let mut shadows = std::collections::BTreeSet::new();
    let mut one_load = async |load: LoadId, summary: &mut Summary| -> anyhow::Result<()> {
        let mut after = haul_store::ShadowCursor::default();
        let mut affected = false;
        loop {
            let rows = reader.read_shadow_page(&load, &after, SHADOW_PAGE).await?;
            summary.records += rows.len() as u64;
            for row in &rows {
                shadows.insert(row.shadow.clone());
                match shadow_step(row) {
                    Err(why) => summary.skip(why, 1),
                    Ok((rule, primary, shadow)) => {
                        let diff = replay::compare(&primary, &shadow);
                        summary.add(rule, &diff);
                        if !diff.is_empty() {
                            affected = true;
                            if differences.len() < opts.show {
                                differences.push(shadow_divergence(row, rule, &primary, &shadow, diff));
                            }
                        }
                    }
                }
            }
            match rows.last() {
                Some(last) if rows.len() == SHADOW_PAGE => after = haul_store::ShadowCursor::after(last),
                _ => break,
            }
        }
        summary.loads += 1;
        if affected {
            summary.loads_affected += 1;
            if affected_loads.len() < AFFECTED_SHOWN {
                affected_loads.push(load.to_string());
            }
        }
        Ok(())
    };
    match &opts.selection {
        Selection::Loads(loads) => {
            for l in loads.iter().take(opts.limit) {
                one_load(l.clone(), &mut summary).await?;
                progress(&summary);
            }
        }
        Selection::Filter(f) => {
            let (mut after, mut count): (Option<LoadId>, usize) = (None, 0);
            while count < opts.limit {
                let ids = reader.select_loads(f, after.as_ref(), ID_PAGE.min(opts.limit - count)).await?;
                let Some(last) = ids.last().cloned() else { break };
                for l in ids {
                    count += 1;
                    one_load(l, &mut summary).await?;
                    progress(&summary);
                }
                after = Some(last);
            }
        }
    }
    let candidate = if shadows.is_empty() {
        "shadow (no shadow decisions stored)".to_owned()
    } else {
        format!("shadow {}", shadows.into_iter().collect::<Vec<_>>().join(", "))
    };
    Ok(ReplayReport {
        note: SHADOW_NOTE,
        store: store.to_owned(),
        candidate,
        summary,
        differences,
        affected_loads,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One stored shadow decision as (rule, primary's decision, shadow's decision), or why
/// it is not compared.
fn shadow_step(row: &haul_store::ShadowDecision) -> Result<(Rule, Decision, Decision), &'static str> {
    let shadow = match (&row.agreement, &row.decision) {
        (replay::Agreement::Error, _) | (_, None) => {
            return Err("the shadow gave no decision (it failed, was late, or did not validate)");
        }
        (_, Some(d)) => d,
    };
    const UNREADABLE: &str = "stored shadow decisions that do not read";
    let rule: Rule = serde_json::from_value(serde_json::Value::String(row.rule.clone())).map_err(|_| UNREADABLE)?;
    let primary = Decision::deserialize(&row.primary).map_err(|_| UNREADABLE)?;
    let shadow = Decision::deserialize(shadow).map_err(|_| UNREADABLE)?;
    Ok((rule, primary, shadow))
}

fn shadow_divergence(
    row: &haul_store::ShadowDecision,
    rule: Rule,
    primary: &Decision,
    shadow: &Decision,
    difference: replay::Difference,
) -> Divergence {
    Divergence {
        load_id: row.load_id.to_string(),
        event_id: row.event_id.clone(),
        event_kind: row.event.get("kind").and_then(|k| k.as_str()).unwrap_or_default().to_owned(),
        event_seq: row.event_seq,
        decided_at: row.decided_at,
        rule,
        event: row.event.clone(),
        recorded: replay::DecisionView::of(primary),
        candidate: replay::DecisionView::of(shadow),
        difference,
    }
}

/// Reads and folds the same logs, deciding nothing: the limit `haul bench replay` sets
/// a replay against. Returns (records, decisions) read.
pub async fn read_and_project(reader: Arc<dyn LogReader>, opts: &ReplayOptions) -> anyhow::Result<(u64, u64)> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(PREFETCH_PAGES);
    let reading = tokio::spawn(read_ahead(reader, opts.clone(), tx));
    let (mut records, mut decisions) = (0u64, 0u64);
    let mut state = LoadState::default();
    while let Some(chunk) = rx.recv().await {
        match chunk? {
            Chunk::Records(_, page) => {
                records += page.len() as u64;
                for r in &page {
                    decisions += u64::from(r.decision().is_some());
                    state.apply(r);
                }
            }
            Chunk::End(_) => {
                std::hint::black_box(&state);
                state = LoadState::default();
            }
        }
    }
    reading.await?;
    Ok((records, decisions))
}

// ---------------------------------------------------------------------------------
// Output.

/// Text for people: phone numbers masked, control characters shown escaped.
fn shown(s: &str) -> String {
    haul_core::mask::mask_secrets(s)
        .chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

fn opt(s: &Option<String>) -> String {
    s.as_deref().map_or("(none)".into(), |v| format!("\"{}\"", shown(v)))
}

/// The summary and the first differences, as text.
pub fn text(r: &ReplayReport) -> String {
    let s = &r.summary;
    let mut o = String::new();
    let _ = writeln!(o, "replay of {} against candidate {}", r.store, r.candidate);
    let _ = writeln!(o, "note: {}", r.note);
    let _ = writeln!(o);
    let _ = writeln!(o, "loads read          {}", s.loads);
    let _ = writeln!(o, "records read        {}", s.records);
    let _ = writeln!(o, "decisions compared  {}", s.compared);
    let _ = writeln!(o, "  same              {}", s.same);
    let _ = writeln!(o, "  different         {}", s.different);
    let more = if s.loads_affected as usize > r.affected_loads.len() { ", …" } else { "" };
    let _ = writeln!(
        o,
        "loads affected      {}{}",
        s.loads_affected,
        if r.affected_loads.is_empty() { String::new() } else { format!(" ({}{more})", r.affected_loads.join(", ")) }
    );
    for (why, n) in &s.not_compared {
        let _ = writeln!(o, "not compared        {n} ({why})");
    }
    let _ = writeln!(o, "\nby SOP rule                              compared  different");
    for rule in Rule::ALL {
        if let Some(c) = s.by_rule.get(rule.label()) {
            let _ = writeln!(o, "  {:<38} {:>8}  {:>9}", rule.label(), c.compared, c.different);
        }
    }
    if !s.by_action_type.is_empty() {
        let _ = writeln!(o, "\nby action type          added  removed  changed");
        for (t, c) in &s.by_action_type {
            let _ = writeln!(o, "  {t:<20} {:>6}  {:>7}  {:>7}", c.added, c.removed, c.changed);
        }
    }
    if !r.differences.is_empty() {
        let _ = writeln!(o, "\nfirst {} difference(s):", r.differences.len());
    }
    for d in &r.differences {
        let _ = writeln!(
            o,
            "\nload {}  event {} ({}, seq {})  at {}  [{}]",
            d.load_id,
            shown(&d.event_id),
            d.event_kind,
            d.event_seq,
            d.decided_at,
            d.rule.label()
        );
        let _ = writeln!(o, "  event: {}", shown(&d.event.to_string()));
        let side = |name: &str, v: &replay::DecisionView, o: &mut String| {
            let acts: Vec<String> = v.actions.iter().map(|a| a.get("type").cloned().unwrap_or_default()).collect();
            let _ = writeln!(
                o,
                "  {name:<9} {} {}{}: {}",
                v.decider,
                if v.filtered { "(filtered) " } else { "" },
                if acts.is_empty() { "no actions".into() } else { acts.join(", ") },
                shown(&v.rationale)
            );
        };
        side("recorded", &d.recorded, &mut o);
        side("candidate", &d.candidate, &mut o);
        if let Some((a, b)) = d.difference.filtered {
            let _ = writeln!(o, "    filtered: {a} → {b}");
        }
        for a in &d.difference.actions {
            match a {
                replay::ActionChange::Added { key, action_type } => {
                    let _ = writeln!(o, "    + {action_type} {}", shown(key));
                }
                replay::ActionChange::Removed { key, action_type } => {
                    let _ = writeln!(o, "    - {action_type} {}", shown(key));
                }
                replay::ActionChange::Changed { key, action_type, fields } => {
                    let _ = writeln!(o, "    ~ {action_type} {}", shown(key));
                    for f in fields {
                        let _ = writeln!(o, "        {}: {} → {}", f.field, opt(&f.recorded), opt(&f.candidate));
                    }
                }
            }
        }
        for a in &d.difference.asks {
            let _ = writeln!(o, "    ask {}: {} → {}", shown(&a.field), opt(&a.recorded), opt(&a.candidate));
        }
    }
    o
}

/// HTML-escapes text (`&`, `<`, `>`, quotes): everything shown may come from strangers.
pub use haul_core::html::escape;

/// One self-contained HTML page (no script, no outside resource), every value escaped
/// and phone numbers masked.
pub fn html(r: &ReplayReport) -> String {
    let e = |s: &str| escape(&haul_core::mask::mask_secrets(s));
    let s = &r.summary;
    let mut o = String::new();
    o.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    o.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n",
    );
    let _ = writeln!(o, "<title>haul replay: {} against {}</title>", e(&r.store), e(&r.candidate));
    o.push_str("<style>body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:1em 0}\
        td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}pre{white-space:pre-wrap;margin:0}\
        .add{background:#e6ffec}.del{background:#ffebe9}.note{background:#fff8c5;padding:.6em}</style></head><body>\n");
    let _ = writeln!(
        o,
        "<h1>haul replay</h1>\n<p>Store <code>{}</code>, candidate <code>{}</code>, {:.1} s.</p>",
        e(&r.store),
        e(&r.candidate),
        r.seconds
    );
    let _ = writeln!(o, "<p class=\"note\">{}</p>", e(r.note));
    o.push_str("<table>\n");
    for (k, v) in [
        ("loads read", s.loads),
        ("records read", s.records),
        ("decisions compared", s.compared),
        ("same", s.same),
        ("different", s.different),
        ("loads affected", s.loads_affected),
    ] {
        let _ = writeln!(o, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    for (why, n) in &s.not_compared {
        let _ = writeln!(o, "<tr><th>not compared: {}</th><td>{n}</td></tr>", e(why));
    }
    o.push_str("</table>\n");
    if !r.affected_loads.is_empty() {
        let _ = writeln!(
            o,
            "<p>Loads affected: {}</p>",
            r.affected_loads.iter().map(|l| format!("<code>{}</code>", e(l))).collect::<Vec<_>>().join(", ")
        );
    }
    o.push_str("<h2>By SOP rule</h2>\n<table><tr><th>rule</th><th>compared</th><th>different</th></tr>\n");
    for rule in Rule::ALL {
        if let Some(c) = s.by_rule.get(rule.label()) {
            let _ = writeln!(o, "<tr><td>{}</td><td>{}</td><td>{}</td></tr>", e(rule.label()), c.compared, c.different);
        }
    }
    o.push_str("</table>\n<h2>By action type</h2>\n<table><tr><th>type</th><th>added</th><th>removed</th><th>changed</th></tr>\n");
    for (t, c) in &s.by_action_type {
        let _ =
            writeln!(o, "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", e(t), c.added, c.removed, c.changed);
    }
    o.push_str("</table>\n");
    let _ = writeln!(o, "<h2>First {} difference(s)</h2>", r.differences.len());
    for d in &r.differences {
        let _ = writeln!(
            o,
            "<h3>Load <code>{}</code>, event <code>{}</code> ({}, seq {}) at {}: {}</h3>",
            e(&d.load_id),
            e(&d.event_id),
            e(&d.event_kind),
            d.event_seq,
            d.decided_at,
            e(d.rule.label())
        );
        let _ = writeln!(o, "<pre>{}</pre>", e(&serde_json::to_string_pretty(&d.event).unwrap_or_default()));
        o.push_str("<table><tr><th></th><th>recorded</th><th>candidate</th></tr>\n");
        let _ = writeln!(
            o,
            "<tr><th>decider</th><td>{}</td><td>{}</td></tr>",
            e(&d.recorded.decider),
            e(&d.candidate.decider)
        );
        let _ =
            writeln!(o, "<tr><th>filtered</th><td>{}</td><td>{}</td></tr>", d.recorded.filtered, d.candidate.filtered);
        let _ = writeln!(
            o,
            "<tr><th>rationale</th><td><pre>{}</pre></td><td><pre>{}</pre></td></tr>",
            e(&d.recorded.rationale),
            e(&d.candidate.rationale)
        );
        let mut keys: Vec<&String> = Vec::new();
        for a in d.recorded.actions.iter().chain(&d.candidate.actions) {
            if let Some(k) = a.get("key").filter(|k| !keys.contains(k)) {
                keys.push(k);
            }
        }
        let find = |v: &replay::DecisionView, k: &str| {
            v.actions.iter().find(|a| a.get("key").map(String::as_str) == Some(k)).cloned()
        };
        for k in keys {
            let (a, b) = (find(&d.recorded, k), find(&d.candidate, k));
            let cell = |x: &Option<BTreeMap<String, String>>, class: &str| match x {
                None => format!("<td class=\"{class}\">(none)</td>"),
                Some(m) => format!(
                    "<td><pre>{}</pre></td>",
                    m.iter()
                        .filter(|(k, _)| *k != "key")
                        .map(|(k, v)| format!("{}: {}", e(k), e(v)))
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            };
            let _ = writeln!(o, "<tr><th><code>{}</code></th>{}{}</tr>", e(k), cell(&a, "del"), cell(&b, "add"));
        }
        for a in &d.difference.asks {
            let _ = writeln!(
                o,
                "<tr><th>ask <code>{}</code></th><td>{}</td><td>{}</td></tr>",
                e(&a.field),
                e(a.recorded.as_deref().unwrap_or("(none)")),
                e(a.candidate.as_deref().unwrap_or("(none)"))
            );
        }
        o.push_str("</table>\n");
    }
    o.push_str("</body></html>\n");
    o
}
