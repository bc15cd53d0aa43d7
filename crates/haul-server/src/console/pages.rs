//! The console's pages, rendered on the server from what the operators' queries
//! (`haul_runtime::queries`) and the load view (`haul_runtime::inspect`) answer: the
//! same functions as `GET /v1/ops/*` and `GET /v1/loads/{id}`, never queries of
//! their own. Every value is escaped ([`super::html`]); no inline script or style.

use std::collections::HashMap;
use std::fmt::Write;

use haul_core::action::{Action, ActionType};
use haul_core::decision::Decision;
use haul_core::decision::InboxState;
use haul_core::mask::mask_phone;
use haul_core::time::{Timestamp, since};
use haul_runtime::inspect::{LoadView, PAGE_DEFAULT, sends};
use haul_runtime::queries::Page as QueryPage;
use haul_runtime::timeline::{Carried, What, items as timeline_items};
use haul_store::ops::{DeadRow, LoadSummary, class_name};
use haul_store::{InboxAlert, InboxCounts, InboxMark, InboxSms, OutboxRow, OutboxStatus, Timer};
use serde_json::Value;

use super::html::{age, anchor, esc, id, is_phone_key, query, seg, time, time_ago, value_text};
use super::session::{Role, Session};

/// Which page the navigation marks as the current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    Overview,
    Loads,
    Dead,
    Timers,
    Unmatched,
    Alerts,
    None,
}

/// What every signed-in page needs: who looks, and the CSRF token of their forms.
pub struct Ctx<'a> {
    pub session: &'a Session,
    pub csrf: String,
    /// The open problems, for the navigation's counts (`None`: not read, or the store
    /// did not answer; then no count is shown).
    pub inbox: Option<&'a InboxCounts>,
}

impl Ctx<'_> {
    pub fn operator(&self) -> bool {
        self.session.role == Role::Operator
    }

    /// The hidden fields every state-changing form carries.
    pub fn hidden(&self) -> String {
        format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", esc(&self.csrf))
    }
}

const NAV: [(Nav, &str, &str); 6] = [
    (Nav::Overview, "/console", "Overview"),
    (Nav::Loads, "/console/loads", "Loads"),
    (Nav::Dead, "/console/dead", "Dead rows"),
    (Nav::Timers, "/console/timers", "Overdue timers"),
    (Nav::Unmatched, "/console/unmatched", "Unmatched SMS"),
    (Nav::Alerts, "/console/alerts", "OpsAlerts"),
];

/// The stylesheet and the icon, linked by every console page, the error pages too.
pub const ASSET_LINKS: &str = "<link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
    <link rel=\"icon\" href=\"/console/assets/favicon.svg\" type=\"image/svg+xml\">";

fn head(title: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · haul console</title>{ASSET_LINKS}\
         <script src=\"/console/assets/console.js\" defer></script></head>",
        esc(title)
    )
}

/// A signed-in page: navigation, who is signed in, sign-out, then `body`.
pub fn layout(ctx: &Ctx, title: &str, nav: Nav, body: &str) -> String {
    let mut links = String::new();
    for (n, href, label) in NAV {
        let current = if n == nav { " aria-current=\"page\"" } else { "" };
        let open = ctx.inbox.and_then(|c| match n {
            Nav::Dead => Some(c.dead.iter().map(|(_, n)| n).sum::<u64>()),
            Nav::Unmatched => Some(c.unmatched),
            Nav::Alerts => Some(c.alerts),
            _ => None,
        });
        let count = match open {
            Some(k) if k > 0 => format!(" <span class=\"count\" title=\"open\">{}</span>", count_text(k)),
            _ => String::new(),
        };
        let _ = write!(links, "<li><a href=\"{href}\"{current}>{label}{count}</a></li>");
    }
    let role = match ctx.session.role {
        Role::Operator => "operator",
        Role::Read => "read only",
    };
    format!(
        "{}<body><header><nav aria-label=\"Console\"><a class=\"brand\" href=\"/console\">haul</a><ul>{links}</ul></nav>\
         <form class=\"who\" method=\"post\" action=\"/console/sign-out\">{}<span>Signed in as <strong>{}</strong> \
         (<span id=\"role\">{role}</span>)</span> <button type=\"submit\">Sign out</button></form></header>\
         <main id=\"main\"><h1>{}</h1>{body}</main></body></html>",
        head(title),
        ctx.hidden(),
        esc(&ctx.session.actor),
        esc(title),
    )
}

/// A count of open problems: the bound it was counted to shows as `999+`.
fn count_text(n: u64) -> String {
    if n >= INBOX_COUNT_BOUND as u64 { format!("{}+", INBOX_COUNT_BOUND - 1) } else { n.to_string() }
}

/// How far the open problems are counted (one more than shown, to know there are more).
pub const INBOX_COUNT_BOUND: usize = 1000;

/// The inbox states a list shows, as tabs: open by default.
fn inbox_tabs(path: &str, pairs: &[(&str, &str)], open: Option<u64>) -> String {
    let current = value_of(pairs, "inbox");
    let kept: Vec<(&str, &str)> = pairs.iter().filter(|(n, _)| *n != "inbox" && *n != "before").copied().collect();
    let mut out = String::from("<nav class=\"tabs\" aria-label=\"Inbox state\"><ul>");
    for (state, label) in [("open", "Open"), ("handled", "Handled"), ("dismissed", "Dismissed"), ("all", "All")] {
        let mut q = kept.clone();
        q.push(("inbox", state));
        let mark = if current == state { " aria-current=\"page\"" } else { "" };
        let n = match (state, open) {
            ("open", Some(n)) => format!(" ({})", count_text(n)),
            _ => String::new(),
        };
        let _ = write!(out, "<li><a href=\"{path}{}\"{mark}>{label}{n}</a></li>", esc(&query(&q)));
    }
    out.push_str("</ul></nav>");
    out
}

/// Where a problem stands: open, or handled/dismissed by what and when.
fn inbox_cell(m: &InboxMark, load: Option<&str>) -> String {
    match m.state {
        InboxState::Open => status_badge("open"),
        state => {
            let by = match (&m.by, load) {
                (Some(by), Some(l)) => format!(" by <a href=\"/console/loads/{}\">{}</a>", esc(&seg(l)), esc(by)),
                (Some(by), None) => format!(" by {}", esc(by)),
                (None, _) => String::new(),
            };
            let at = m.at.map(|t| format!(" {}", time(t))).unwrap_or_default();
            format!("{}{by}{at}", status_badge(state.as_str()))
        }
    }
}

/// The sign-in page: a token and a name.
pub fn sign_in(message: Option<&str>) -> String {
    let message = message.map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(m))).unwrap_or_default();
    format!(
        "{}<body class=\"signin\"><main id=\"main\"><h1>haul console</h1>{message}\
         <form method=\"post\" action=\"/console/sign-in\">\
         <p><label for=\"actor\">Your name (recorded with every action you take)</label>\
         <input id=\"actor\" name=\"actor\" required maxlength=\"64\" pattern=\"[A-Za-z0-9_.@+\\-]{{1,64}}\" autocomplete=\"username\"></p>\
         <p><label for=\"token\">Token: an operator token to act, an API token to read</label>\
         <input id=\"token\" name=\"token\" type=\"password\" required autocomplete=\"current-password\"></p>\
         <p><button type=\"submit\">Sign in</button></p></form>\
         <p class=\"note\">The token is checked and forgotten: the session cookie holds a signature, never the token. \
         Sessions last 8 hours and end when the tokens rotate.</p></main></body></html>",
        head("Sign in")
    )
}

/// A message page: what an action did (a refusal is [`refused`]).
pub fn message(ctx: &Ctx, title: &str, text: &str, links: &[(String, &str)]) -> String {
    let body = format!("<p class=\"result\" role=\"status\">{}</p>{}", esc(text), link_list(links));
    layout(ctx, title, Nav::None, &body)
}

/// A refused action: drawn as an error (an alert, in red), never as a result, so a
/// refusal cannot be read as done.
pub fn refused(ctx: &Ctx, text: &str, links: &[(String, &str)]) -> String {
    let body = format!("{}{}", error_box(text), link_list(links));
    layout(ctx, "Refused", Nav::None, &body)
}

fn link_list(links: &[(String, &str)]) -> String {
    let mut list = String::from("<ul>");
    for (href, label) in links {
        let _ = write!(list, "<li><a href=\"{}\">{}</a></li>", esc(href), esc(label));
    }
    list.push_str("</ul>");
    list
}

/// A refused request (bad filter, store down), on the page that asked.
pub fn error_box(text: &str) -> String {
    format!("<p class=\"error\" role=\"alert\">{}</p>", esc(text))
}

/// Quoted text from outside, or a dash for none.
fn quoted(text: Option<&str>) -> String {
    text.map_or_else(|| "–".to_string(), |t| format!("<q>{}</q>", esc(t)))
}

fn link_load(load: &str) -> String {
    format!("<a href=\"/console/loads/{}\">{}</a>", esc(&seg(load)), esc(load))
}

fn next_link(path: &str, pairs: &[(&str, &str)], label: &str) -> String {
    format!("<p class=\"pager\"><a rel=\"next\" href=\"{}{}\">{}</a></p>", path, esc(&query(pairs)), esc(label))
}

/// The link to a list's next page: the filters `pairs` kept, the cursor `name` set to
/// `cursor`.
fn next_page(path: &str, pairs: &[(&str, &str)], name: &str, cursor: &str, label: &str) -> String {
    let mut next: Vec<(&str, &str)> = pairs.iter().filter(|(n, _)| *n != name).copied().collect();
    next.push((name, cursor));
    next_link(path, &next, label)
}

/// The pairs of a filter form that hold a value: empty fields are not sent on.
pub fn given<'a>(pairs: &'a [(String, String)], names: &[&str]) -> Vec<(&'a str, &'a str)> {
    pairs
        .iter()
        .filter(|(n, v)| names.contains(&n.as_str()) && !v.is_empty())
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect()
}

fn value_of<'a>(pairs: &[(&'a str, &'a str)], name: &str) -> &'a str {
    pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).unwrap_or("")
}

// ---------------------------------------------------------------- overview

/// The overview's figures, read by the caller.
pub struct Figures {
    pub oldest_pending: Option<Timestamp>,
    /// Per class: dead rows buried in the last hour, and whether the count stopped at
    /// the page's bound.
    pub dead_last_hour: Vec<(&'static str, usize, bool)>,
    pub dead_in_store: Option<u64>,
    pub oldest_due_timer: Option<Timestamp>,
    /// `haul_append_conflicts_total` of this process.
    pub conflicts: Option<f64>,
    /// The loads with the most refused appends in the store (a few).
    pub conflict_loads: Option<Vec<haul_store::ConflictLoad>>,
    pub queue_depth: Option<u64>,
    /// The open problems (`None`: the store did not answer).
    pub inbox: Option<InboxCounts>,
    /// Loads with an escalated ask, counted to a bound (and whether it stopped there).
    pub escalated_loads: Option<(usize, bool)>,
    /// Send-rate keys that held rows back within [`SATURATED_WITHIN`], with when.
    pub saturated: Option<Vec<(String, Timestamp)>>,
    pub now: Timestamp,
}

/// A channel whose send rate held rows back this recently is saturated.
pub const SATURATED_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

pub fn overview(f: &Figures) -> String {
    let ago = |t: Option<Timestamp>| match t {
        Some(t) => format!("{} <span class=\"sub\">(since {})</span>", age(since(f.now, t).as_secs_f64()), time(t)),
        None => "none".into(),
    };
    let mut dead = String::new();
    for (class, n, more) in &f.dead_last_hour {
        let more = if *more { "+" } else { "" };
        let state = if *n > 0 { "warn" } else { "ok" };
        let _ =
            write!(dead, "<li class=\"{state}\"><a href=\"/console/dead?class={class}\">{class}: {n}{more}</a></li>");
    }
    let opt = |n: Option<u64>| n.map_or("unknown (the store did not answer)".to_string(), |n| n.to_string());
    let most_conflicts = match &f.conflict_loads {
        None => "<p class=\"sub\">Loads: unknown (the store did not answer).</p>".to_string(),
        Some(l) if l.is_empty() => "<p class=\"sub\">No load has had a conflict.</p>".to_string(),
        Some(l) => {
            let mut out = String::from("<p class=\"sub\">The loads with the most, in the store:</p><ul>");
            for c in l {
                let _ = write!(
                    out,
                    "<li>{} {} <span class=\"sub\">(last {})</span></li>",
                    link_load(c.load_id.as_str()),
                    c.conflicts,
                    time(c.last_conflict_at)
                );
            }
            out.push_str("</ul>");
            out
        }
    };
    let inbox = match &f.inbox {
        None => "<p class=\"figure\">unknown (the store did not answer)</p>".to_string(),
        Some(c) => {
            let mut out = String::from("<ul class=\"figure\">");
            let mut item = |href: String, label: String, n: u64| {
                let state = if n > 0 { "warn" } else { "ok" };
                let _ = write!(out, "<li class=\"{state}\"><a href=\"{href}\">{label}: {}</a></li>", count_text(n));
            };
            for class in classes() {
                let n = match haul_store::ops::class_types(class) {
                    Some(types) => c.dead.iter().filter(|(t, _)| types.contains(t)).map(|(_, n)| n).sum(),
                    None => 0,
                };
                item(format!("/console/dead?class={class}&amp;inbox=open"), format!("dead {class}"), n);
            }
            item("/console/alerts?inbox=open".into(), "OpsAlerts".into(), c.alerts);
            item("/console/unmatched?inbox=open".into(), "unmatched SMS".into(), c.unmatched);
            if let Some((n, more)) = f.escalated_loads {
                let n = if more { INBOX_COUNT_BOUND as u64 } else { n as u64 };
                item("/console/loads?escalated=true".into(), "loads with an escalated ask".into(), n);
            }
            if let Some(keys) = &f.saturated {
                let label = if keys.is_empty() {
                    "saturated channels".to_owned()
                } else {
                    let held: Vec<String> = keys
                        .iter()
                        .map(|(k, at)| format!("{} {} ago", esc(k), age(since(f.now, *at).as_secs_f64())))
                        .collect();
                    format!("saturated channels (rows held back: {})", held.join(", "))
                };
                item("/console/loads?pending_over=1s".into(), label, keys.len() as u64);
            }
            out.push_str("</ul>");
            out
        }
    };
    format!(
        "<section class=\"figures\" aria-label=\"The open problems\">\
         <article class=\"inbox\"><h2>Open problems</h2>{inbox}\
         <p class=\"sub\">Each stays open until an operator handles it (a requeued copy delivered, an SMS assigned) \
         or dismisses it with a reason.</p></article></section>\
         <section class=\"figures\" aria-label=\"The four figures\">\
         <article><h2>Oldest pending outbox row</h2><p class=\"figure\">{}</p>\
         <p><a href=\"/console/loads?pending_over=1s\">Loads with a pending row</a></p></article>\
         <article><h2>Dead rows in the last hour, by class</h2><ul class=\"figure\">{dead}</ul>\
         <p><a href=\"/console/dead\">All dead rows</a> ({} in the store)</p></article>\
         <article><h2>Oldest overdue timer</h2><p class=\"figure\">{}</p>\
         <p><a href=\"/console/timers\">Overdue timers</a></p></article>\
         <article><h2>Version conflicts</h2><p class=\"figure\">{}</p>\
         <p class=\"sub\">Appends refused by the version check in this process since it started \
         (<code>haul_append_conflicts_total</code>; the other processes' are on their <code>/metrics</code>).</p>\
         {most_conflicts}<p><a href=\"/metrics\">This process's metrics</a></p></article>\
         <article><h2>Queue depth</h2><p class=\"figure\">{}</p>\
         <p class=\"sub\">Messages waiting in the load queue.</p>\
         <p><a href=\"/console/loads?active_within=1h\">Loads active in the last hour</a></p></article>\
         </section>\
         <section><h2>Where to look</h2><ul>\
         <li><a href=\"/console/loads?escalated=true\">Loads with an escalated ask</a></li>\
         <li><a href=\"/console/loads?has_dead=true\">Loads with a dead outbox row</a></li>\
         <li><a href=\"/console/unmatched\">Unmatched SMS</a></li>\
         <li><a href=\"/console/alerts\">OpsAlerts</a></li></ul></section>",
        ago(f.oldest_pending),
        opt(f.dead_in_store),
        ago(f.oldest_due_timer),
        f.conflicts.map_or("unknown".to_string(), |c| format!("{c}")),
        opt(f.queue_depth),
    )
}

// ---------------------------------------------------------------- loads

pub fn loads(ctx: &Ctx, pairs: &[(&str, &str)], answer: Result<&QueryPage<LoadSummary>, String>) -> String {
    let v = |n| esc(value_of(pairs, n));
    let checked = |n| if value_of(pairs, n) == "true" { " checked" } else { "" };
    let mut body = format!(
        "<form class=\"search\" method=\"get\" action=\"/console/loads\" role=\"search\">\
         <label for=\"load_id\">Load id</label> <input id=\"load_id\" name=\"load_id\" required maxlength=\"64\">\
         <button type=\"submit\">Open load</button></form>\
         <form class=\"filters\" method=\"get\" action=\"/console/loads\"><fieldset><legend>Filter</legend>\
         <p><label for=\"stage\">Stage</label> <input id=\"stage\" name=\"stage\" value=\"{}\"></p>\
         <p><input type=\"checkbox\" id=\"open_asks\" name=\"open_asks\" value=\"true\"{}> <label for=\"open_asks\">Has an open ask</label></p>\
         <p><input type=\"checkbox\" id=\"escalated\" name=\"escalated\" value=\"true\"{}> <label for=\"escalated\">Has an escalated ask</label></p>\
         <p><input type=\"checkbox\" id=\"has_dead\" name=\"has_dead\" value=\"true\"{}> <label for=\"has_dead\">Has a dead outbox row</label></p>\
         <p><label for=\"pending_over\">A row pending longer than</label> <input id=\"pending_over\" name=\"pending_over\" placeholder=\"5m\" value=\"{}\"></p>\
         <p><label for=\"overdue_over\">A timer overdue by more than</label> <input id=\"overdue_over\" name=\"overdue_over\" placeholder=\"15m\" value=\"{}\"></p>\
         <p><label for=\"idle_over\">Idle longer than</label> <input id=\"idle_over\" name=\"idle_over\" placeholder=\"1h\" value=\"{}\"></p>\
         <p><label for=\"active_within\">Active within</label> <input id=\"active_within\" name=\"active_within\" placeholder=\"1h\" value=\"{}\"></p>\
         <p><label for=\"limit\">Per page</label> <input id=\"limit\" name=\"limit\" type=\"number\" min=\"1\" max=\"500\" value=\"{}\"></p>\
         <p><button type=\"submit\">Filter</button> <a href=\"/console/loads\">Clear</a></p></fieldset></form>",
        v("stage"),
        checked("open_asks"),
        checked("escalated"),
        checked("has_dead"),
        v("pending_over"),
        v("overdue_over"),
        v("idle_over"),
        v("active_within"),
        v("limit"),
    );
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            body.push_str(&error_box(&e));
            return layout(ctx, "Loads", Nav::Loads, &body);
        }
    };
    let rows = &answer.rows;
    body.push_str(
        "<div class=\"scroll\"><table><caption>Loads, in id order</caption><thead><tr><th scope=\"col\">Load</th><th scope=\"col\">Stage</th>\
         <th scope=\"col\">Open asks</th><th scope=\"col\">Escalated asks</th><th scope=\"col\">Version</th>\
         <th scope=\"col\">Last activity</th></tr></thead><tbody>",
    );
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"6\">No load on this page matches.</td></tr>");
    }
    for l in rows {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} <span class=\"sub\">({} idle)</span></td></tr>",
            link_load(l.load_id.as_str()),
            esc(l.stage.as_deref().unwrap_or("–")),
            l.open_asks,
            l.escalated_asks,
            l.version,
            time(l.last_activity_at),
            age(answer.age_s(l.last_activity_at)),
        );
    }
    body.push_str("</tbody></table></div>");
    if let Some(next) = answer.next.as_deref() {
        body.push_str(&next_page("/console/loads", pairs, "after", next, "Next page"));
    }
    layout(ctx, "Loads", Nav::Loads, &body)
}

// ---------------------------------------------------------------- one load

fn status_badge(status: &str) -> String {
    // The status is the word itself; the colour only repeats it.
    format!("<span class=\"status s-{}\">{}</span>", esc(status), esc(status))
}

fn outbox_state(row: &OutboxRow) -> String {
    let mut s = format!("{} · sends {}", status_badge(row.status.as_str()), sends(row));
    if row.status == OutboxStatus::Pending {
        let _ = write!(s, " · next try {}", time(row.due_at));
    }
    if let Some(r) = &row.receipt {
        let _ = write!(s, " · receipt <code>{}</code>", esc(r));
    }
    if let Some(f) = &row.last_failure {
        // A superseded row did not fail: the text says why it was not sent.
        let label = if row.status == OutboxStatus::Superseded { "why" } else { "last failure" };
        let _ = write!(s, " · {label}: <q>{}</q>", esc(f));
    }
    s
}

fn payload_list(p: &Value) -> String {
    let Some(obj) = p.as_object() else { return format!("<p>{}</p>", esc(&p.to_string())) };
    let mut out = String::from("<dl>");
    for (k, v) in obj {
        let shown = match v {
            Value::String(s) if is_phone_key(k) => esc(&mask_phone(s)),
            Value::String(s) => esc(s),
            other => value_text(k, other),
        };
        let _ = write!(out, "<dt>{}</dt><dd>{shown}</dd>", esc(k));
    }
    out.push_str("</dl>");
    out
}

/// What an action says or does, as a person reads it: the SMS's text (to a masked
/// number), the Hero task's title, urgency and body, the Slack text, the timer's time.
fn action_content(a: &Action) -> String {
    use haul_core::action::ActionKind;
    let content = match &a.kind {
        ActionKind::SendSms { to, body } => format!("to {}: <q>{}</q>", esc(&mask_phone(to)), esc(body)),
        ActionKind::CreateHeroTask { title, body, urgency } => format!(
            "<strong>{}</strong> {} <q>{}</q>",
            esc(title),
            status_badge(
                serde_json::to_value(urgency).ok().and_then(|u| u.as_str().map(str::to_owned)).as_deref().unwrap_or("")
            ),
            esc(body)
        ),
        ActionKind::PostHeroSlack { channel, text } => format!("{}: <q>{}</q>", esc(channel), esc(text)),
        ActionKind::SetTimer { fire_at, .. } => format!("fires at {}", time(*fire_at)),
        ActionKind::CancelTimer { timer_id } => format!("cancels {}", esc(timer_id.as_str())),
        ActionKind::UpdateStage { stage } => format!("stage → {}", esc(stage)),
    };
    format!("<div class=\"content\">{content}</div>")
}

/// A decision's rationale, its actions with their outbox rows' state, and the asks it moved.
fn decision_items(out: &mut String, d: &Decision, actions: &[(&Action, Carried)]) {
    let filtered = if d.filtered { " (by the filter)" } else { "" };
    let _ = write!(
        out,
        "<p>Decision by <strong>{}</strong>{filtered}: <q class=\"rationale\">{}</q></p>",
        esc(&d.decider),
        esc(&d.rationale)
    );
    if let Some(u) = &d.llm {
        // Which model and prompt decided, and what it cost: the prompts' texts are in
        // the store by these hashes.
        let version = u.model_version.as_deref().map(|v| format!(" ({})", esc(v))).unwrap_or_default();
        let cost = u.cost_micro_usd.map(|c| format!(", {}", esc(&haul_core::spend::usd(c)))).unwrap_or_default();
        let _ = write!(
            out,
            "<p class=\"sub llm\">Model {}{version}: {} tokens in, {} out{cost} · prompt <code>{}</code> · input <code>{}</code></p>",
            esc(&u.model),
            u.input_tokens,
            u.output_tokens,
            esc(&u.prompt_hash.chars().take(12).collect::<String>()),
            esc(&u.input_hash.chars().take(12).collect::<String>()),
        );
    }
    if d.actions.is_empty() {
        out.push_str("<p class=\"sub\">No action.</p>");
    } else {
        out.push_str("<ul class=\"actions\">");
        for (a, row) in actions {
            let key = a.key.as_str();
            let state = match row {
                Carried::Row(row) => outbox_state(row),
                Carried::WithDecision(o) => format!(
                    "{} · receipt <code>{}</code>",
                    status_badge(o.status.as_str()),
                    esc(o.receipt.as_deref().unwrap_or_default())
                ),
                Carried::Elsewhere => "<span class=\"sub\">(outbox row or outcome on another page)</span>".into(),
            };
            let _ = write!(
                out,
                "<li><a href=\"#{}\">{}</a> {} — {state}{}</li>",
                anchor(key),
                esc(a.action_type().as_str()),
                id(key),
                action_content(a),
            );
        }
        out.push_str("</ul>");
    }
    for change in &d.asks {
        let _ = write!(
            out,
            "<p class=\"sub\">Ask {} step {} → {}</p>",
            esc(change.ask_id.as_str()),
            change.step,
            esc(change.status.as_str())
        );
    }
}

/// The order a load's timeline is shown in: newest first unless asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    #[default]
    NewestFirst,
    OldestFirst,
}

impl Order {
    /// From the page's `order` parameter (`oldest`; anything else is newest first).
    pub fn of(param: Option<&str>) -> Order {
        if param == Some("oldest") { Order::OldestFirst } else { Order::NewestFirst }
    }
}

/// The timeline section of a load's page: also what the live refresh fetches.
/// Echoes (a delivered or failed outcome, a decision the filter made) are folded: one
/// line, opened on demand.
pub fn timeline(v: &LoadView, page_query: &str, order: Order) -> String {
    let path = format!("/console/loads/{}", seg(v.load_id.as_str()));
    let (shown, toggle) = match order {
        Order::NewestFirst => ("newest first", format!("<a href=\"{}?order=oldest\">Oldest first</a>", esc(&path))),
        Order::OldestFirst => ("oldest first", format!("<a href=\"{}\">Newest first</a>", esc(&path))),
    };
    let mut out = format!(
        "<section id=\"timeline\" data-version=\"{}\" data-live=\"/console/loads/{}/timeline{}\" aria-labelledby=\"timeline-h\">\
         <h2 id=\"timeline-h\">Timeline <span class=\"sub\">({shown}; version {})</span></h2>\
         <p class=\"sub\">{toggle}</p><p class=\"live\" aria-live=\"polite\"></p><ol class=\"timeline\">",
        v.version,
        esc(&seg(v.load_id.as_str())),
        esc(page_query),
        v.version,
    );
    let mut items = timeline_items(&v.log, &v.outbox);
    if order == Order::NewestFirst {
        items.reverse();
    }
    for item in items {
        let kind = item.kind;
        let echo = match &item.what {
            What::Outcome { .. } => true,
            What::Decision { decision, .. } => decision.filtered,
            _ => false,
        };
        // The trace id, to find the record's trace in the operators' tracing tool.
        let trace = item.trace.map_or(String::new(), |t| {
            format!(" <span class=\"sub trace\" title=\"trace id\">trace {}</span>", esc(&t.trace_id_hex()))
        });
        let head = format!(
            "<span class=\"seq\">#{}</span> {} <strong>{}</strong> {}{trace}",
            item.seq,
            time(item.recorded_at),
            esc(kind),
            id(item.entry_id)
        );
        if echo {
            let _ = write!(
                out,
                "<li class=\"k-{} echo\" data-seq=\"{}\"><details><summary class=\"rec\">{head}</summary>",
                esc(kind),
                item.seq
            );
        } else {
            let _ = write!(out, "<li class=\"k-{}\"><p class=\"rec\">{head}</p>", esc(kind));
        }
        match &item.what {
            What::Decision { decision, actions } => decision_items(&mut out, decision, actions),
            What::Outcome { outcome: o, fields } => {
                let key = &o.outbox_id;
                let _ = write!(
                    out,
                    "<p>Outcome of <a href=\"#{}\">{}</a>: {}</p>{}",
                    anchor(key),
                    esc(key),
                    status_badge(o.status.as_str()),
                    payload_list(fields)
                );
            }
            What::Operator { action: op, fields, .. } => {
                let _ = write!(
                    out,
                    "<p>Operator <strong>{}</strong>: {} — reason: <q>{}</q></p>{}",
                    esc(&op.actor),
                    esc(op.command.name()),
                    esc(&op.reason),
                    payload_list(fields)
                );
            }
            What::Event { fields } => out.push_str(&payload_list(fields)),
            What::Unreadable { reason, fields } => {
                let _ = write!(
                    out,
                    "<p class=\"sub\">Unreadable by this build: {}</p>{}",
                    esc(reason),
                    payload_list(fields)
                );
            }
        }
        out.push_str(if echo { "</details></li>" } else { "</li>" });
    }
    out.push_str("</ol>");
    if let Some(next) = v.next_after_seq {
        let n = next.to_string();
        out.push_str(&next_link(&path, &[("after_seq", &n)], "Later records"));
        // The newest page, for a long log.
        let latest = v.version.saturating_sub(PAGE_DEFAULT as u64).to_string();
        out.push_str(&next_link(&path, &[("after_seq", &latest)], "The latest records"));
    }
    out.push_str("<h2 id=\"outbox-h\">Outbox</h2><div class=\"scroll\"><table aria-labelledby=\"outbox-h\"><thead><tr>\
        <th scope=\"col\">Action</th><th scope=\"col\">Id</th><th scope=\"col\">State</th><th scope=\"col\">Created</th></tr></thead><tbody>");
    if v.outbox.is_empty() {
        out.push_str("<tr><td colspan=\"4\">None.</td></tr>");
    }
    for row in &v.outbox {
        let requeue_of = row
            .action
            .get("requeue_of")
            .and_then(|d| d.as_str())
            .map(|d| format!("<br><span class=\"sub\">requeues <a href=\"#{}\">{}</a></span>", anchor(d), esc(d)))
            .unwrap_or_default();
        // What the delivery reports said of its SMS (Twilio's status callbacks).
        let mut reported = String::new();
        for r in v.reports_of(&row.id) {
            let code = r.error_code.as_deref().map(|c| format!(" (error {})", esc(c))).unwrap_or_default();
            let _ = write!(reported, " · {}{code} {}", status_badge(&r.status), time(r.reported_at));
        }
        let _ = write!(
            out,
            "<tr id=\"{}\"><td>{}</td><td>{}{requeue_of}</td><td>{}{reported}</td><td>{}</td></tr>",
            anchor(&row.id),
            esc(row.action_type.as_str()),
            id(&row.id),
            outbox_state(row),
            time(row.created_at),
        );
    }
    out.push_str("</tbody></table></div>");
    if let Some(next) = &v.next_outbox_after {
        out.push_str(&next_link(
            &format!("/console/loads/{}", seg(v.load_id.as_str())),
            &[("outbox_after", next)],
            "More outbox rows",
        ));
    }
    out.push_str(
        "<h2 id=\"timers-h\">Timers</h2><div class=\"scroll\"><table aria-labelledby=\"timers-h\"><thead><tr>\
        <th scope=\"col\">Timer</th><th scope=\"col\">State</th><th scope=\"col\">Fires at</th></tr></thead><tbody>",
    );
    if v.timers.is_empty() {
        out.push_str("<tr><td colspan=\"3\">None.</td></tr>");
    }
    for t in &v.timers {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            id(t.timer_id.as_str()),
            status_badge(t.status.as_str()),
            time(t.fire_at)
        );
    }
    out.push_str("</tbody></table></div>");
    if let Some(next) = &v.next_timers_after {
        out.push_str(&next_link(
            &format!("/console/loads/{}", seg(v.load_id.as_str())),
            &[("timers_after", next)],
            "More timers",
        ));
    }
    out.push_str("</section>");
    out
}

pub fn load(
    ctx: &Ctx,
    v: &LoadView,
    page_query: &str,
    order: Order,
    new_request: &mut dyn FnMut() -> String,
) -> String {
    let body = format!("{}{}", summary(ctx, v, new_request), timeline(v, page_query, order));
    layout(ctx, &format!("Load {}", v.load_id), Nav::Loads, &body)
}

/// The last message from the driver on this page of the log: an SMS the webhook routed
/// here, or one an operator assigned.
fn last_driver_message(v: &LoadView) -> Option<(Timestamp, &str)> {
    use haul_core::event::{EventBody, OperatorCommand};
    use haul_core::log::Entry;
    v.log.iter().rev().find_map(|r| match &r.entry {
        Entry::Event { body: EventBody::InboundSms(sms), .. } => Some((r.recorded_at, sms.body.as_str())),
        Entry::Event { body: EventBody::OperatorAction(op), .. } => match &op.command {
            OperatorCommand::AssignSms { body, .. } => Some((r.recorded_at, body.as_str())),
            _ => None,
        },
        _ => None,
    })
}

/// The top of a load's page: its facts, the driver's last message, its asks and dead
/// rows with their forms. The live refresh replaces it with the timeline, so a row a
/// colleague re-sent loses its form here too.
pub fn summary(ctx: &Ctx, v: &LoadView, new_request: &mut dyn FnMut() -> String) -> String {
    let s = &v.state;
    let dash = |o: &Option<String>| esc(o.as_deref().unwrap_or("–"));
    let mut body = format!(
        "<section id=\"summary\" data-version=\"{}\" aria-label=\"The load now\">\
         <p>Load {}</p><dl class=\"facts\"><dt>Client</dt><dd>{}</dd><dt>Stage</dt><dd>{}</dd>\
         <dt>Driver</dt><dd>{}</dd><dt>Next stop</dt><dd>{}</dd><dt>Version</dt><dd>{}</dd></dl>",
        v.version,
        id(v.load_id.as_str()),
        dash(&s.client),
        dash(&s.stage),
        esc(&s.driver_phone.as_deref().map(mask_phone).unwrap_or_else(|| "–".into())),
        dash(&s.next_stop),
        v.version,
    );
    // What the load's model calls cost over its life (a fold of its log).
    let spend = &s.spend;
    if !spend.is_zero() {
        let _ = write!(
            body,
            "<p class=\"spend\">Model spend: {} call(s), {} tokens ({} in, {} out), {}{}</p>",
            spend.spend.calls,
            spend.spend.tokens(),
            spend.spend.input_tokens,
            spend.spend.output_tokens,
            esc(&haul_core::spend::usd(spend.spend.cost_micro_usd)),
            if spend.capped { ". Its LLM budget is spent: the SOP decides for it now." } else { "" }
        );
    }
    if let Some(o) = &s.sms_opt_out {
        let since = o.at.map(time).unwrap_or_else(|| "–".into());
        let _ = write!(
            body,
            "<p class=\"opted-out\" role=\"status\">The driver opted out of SMS (STOP) {since}: haul texts them nothing \
             until they reply START. Call them.</p>"
        );
    }
    if let Some((at, text)) = last_driver_message(v) {
        let _ = write!(
            body,
            "<p class=\"last-message\">The driver's last message on this page, {}: <q>{}</q></p>",
            time(at),
            esc(text)
        );
    }
    if s.unreadable > 0 {
        body.push_str(&error_box(&format!("{} record(s) of this log could not be read", s.unreadable)));
    }
    body.push_str("<h2 id=\"asks-h\">Asks</h2><div class=\"scroll\"><table aria-labelledby=\"asks-h\"><thead><tr><th scope=\"col\">Ask</th>\
        <th scope=\"col\">Status</th><th scope=\"col\">Step</th><th scope=\"col\">Opened</th><th scope=\"col\">Step since</th></tr></thead><tbody>");
    if s.asks.is_empty() {
        body.push_str("<tr><td colspan=\"5\">None.</td></tr>");
    }
    for a in s.asks.values() {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            id(a.ask_id.as_str()),
            status_badge(a.status.as_str()),
            a.step,
            time(a.opened_at),
            time(a.step_decided_at)
        );
    }
    body.push_str("</tbody></table></div>");
    let dead: Vec<&OutboxRow> = v.outbox.iter().filter(|r| r.status == OutboxStatus::Dead).collect();
    if !dead.is_empty() {
        body.push_str("<h2 id=\"dead-h\">Dead rows of this load</h2><div class=\"scroll\"><table aria-labelledby=\"dead-h\"><thead><tr>\
            <th scope=\"col\">Row</th><th scope=\"col\">State</th><th scope=\"col\">Inbox</th>");
        if ctx.operator() {
            body.push_str("<th scope=\"col\">Act</th>");
        }
        body.push_str("</tr></thead><tbody>");
        // A dead row requeued already (on this page of rows) says by which row.
        let copies: HashMap<&str, &str> =
            v.outbox.iter().filter_map(|r| Some((r.action.get("requeue_of")?.as_str()?, r.id.as_str()))).collect();
        for (i, row) in dead.iter().enumerate() {
            // Open unless the log took it out (the fold's inbox, as the inbox lists read it).
            let inbox = v.state.inbox.get(&row.id).copied().unwrap_or(InboxState::Open);
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td>",
                id(&row.id),
                outbox_state(row),
                status_badge(inbox.as_str())
            );
            if let Some(copy) = copies.get(row.id.as_str()) {
                let _ = write!(body, "<td>Requeued as <a href=\"#{}\">{}</a></td>", anchor(copy), esc(copy));
            } else if ctx.operator() && inbox == InboxState::Open {
                let _ = write!(
                    body,
                    "<td><form method=\"post\" action=\"/console/dead/requeue\">{}{}\
                     <input type=\"hidden\" name=\"outbox_id\" value=\"{}\">{} <button type=\"submit\">Requeue</button></form>{}</td>",
                    ctx.hidden(),
                    request_field(&new_request()),
                    esc(&row.id),
                    reason_field(&format!("load-{i}")),
                    dismiss_form(
                        ctx,
                        "/console/dead/dismiss",
                        "outbox_id",
                        &row.id,
                        &format!("load-d{i}"),
                        &new_request()
                    ),
                );
            } else if ctx.operator() {
                body.push_str("<td>–</td>");
            }
            body.push_str("</tr>");
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("</section>");
    body
}

// ---------------------------------------------------------------- dead rows

fn options(selected: &str, values: &[&str], any: &str) -> String {
    let mut out = format!("<option value=\"\">{}</option>", esc(any));
    for v in values {
        let sel = if *v == selected { " selected" } else { "" };
        let _ = write!(out, "<option value=\"{0}\"{sel}>{0}</option>", esc(v));
    }
    out
}

fn type_names() -> Vec<&'static str> {
    ActionType::ALL.iter().map(|t| t.as_str()).collect()
}

/// A fresh request id for a form: the same form sent twice is the same request.
pub fn request_field(request_id: &str) -> String {
    format!("<input type=\"hidden\" name=\"request_id\" value=\"{}\">", esc(request_id))
}

/// The form that dismisses a problem from the inbox, with its reason.
fn dismiss_form(ctx: &Ctx, action: &str, name: &str, value: &str, id_suffix: &str, request_id: &str) -> String {
    format!(
        "<form class=\"dismiss\" method=\"post\" action=\"{action}\">{}{}<input type=\"hidden\" name=\"{name}\" value=\"{}\">\
         {} <button type=\"submit\">Dismiss</button></form>",
        ctx.hidden(),
        request_field(request_id),
        esc(value),
        reason_field(id_suffix),
    )
}

fn reason_field(id_suffix: &str) -> String {
    format!(
        "<label for=\"reason-{0}\">Reason</label> <input id=\"reason-{0}\" name=\"reason\" required maxlength=\"500\">",
        esc(id_suffix)
    )
}

pub fn dead(
    ctx: &Ctx,
    pairs: &[(&str, &str)],
    answer: Result<&QueryPage<DeadRow>, String>,
    new_request: &mut dyn FnMut() -> String,
    now: Timestamp,
) -> String {
    let classes = ["external", "hero_channel", "internal"];
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/dead\"><fieldset><legend>Filter</legend>\
         <p><label for=\"class\">Channel class</label> <select id=\"class\" name=\"class\">{}</select></p>\
         <p><label for=\"action_type\">Action type</label> <select id=\"action_type\" name=\"action_type\">{}</select></p>\
         <input type=\"hidden\" name=\"inbox\" value=\"{}\">\
         <p><button type=\"submit\">Filter</button> <a href=\"/console/dead\">Clear</a></p></fieldset></form>",
        options(value_of(pairs, "class"), &classes, "any"),
        options(value_of(pairs, "action_type"), &type_names(), "any"),
        esc(value_of(pairs, "inbox")),
    );
    if ctx.operator() {
        let since = haul_core::time::from_ms(haul_core::time::to_ms(now) - 24 * 3600 * 1000);
        let since = since.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let _ = write!(
            body,
            "<form class=\"bulk\" method=\"post\" action=\"/console/dead/bulk-requeue\">{}{}\
             <fieldset><legend>Requeue all dead rows of a type (a dry run counts them first)</legend>\
             <p><label for=\"bulk-type\">Action type</label> <select id=\"bulk-type\" name=\"action_type\" required>{}</select></p>\
             <p><label for=\"bulk-since\">Buried since (UTC)</label> <input id=\"bulk-since\" name=\"since\" required value=\"{}\"></p>\
             <p>{}</p><input type=\"hidden\" name=\"dry_run\" value=\"true\">\
             <p><button type=\"submit\">Count them (dry run)</button></p></fieldset></form>",
            ctx.hidden(),
            request_field(&new_request()),
            options(value_of(pairs, "action_type"), &type_names(), "choose one"),
            esc(&since),
            reason_field("bulk"),
        );
    }
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            body.push_str(&error_box(&e));
            return layout(ctx, "Dead rows", Nav::Dead, &body);
        }
    };
    let rows = &answer.rows;
    let open = ctx.inbox.map(|c| {
        let class = haul_store::ops::class_types(value_of(pairs, "class"));
        let of_type = ActionType::parse(value_of(pairs, "action_type"));
        c.dead
            .iter()
            .filter(|(t, _)| class.as_ref().is_none_or(|types| types.contains(t)) && of_type.is_none_or(|o| o == *t))
            .map(|(_, n)| n)
            .sum()
    });
    body.push_str(&inbox_tabs("/console/dead", pairs, open));
    body.push_str("<div class=\"scroll\"><table class=\"cards\"><caption>Dead outbox rows, newest first</caption><thead><tr><th scope=\"col\">Row</th><th scope=\"col\">Load</th>\
        <th scope=\"col\">Type</th><th scope=\"col\">Sends failed</th><th scope=\"col\">Last failure</th><th scope=\"col\">Died</th>\
        <th scope=\"col\">Inbox</th>");
    if ctx.operator() {
        body.push_str("<th scope=\"col\">Act</th>");
    }
    body.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"8\">No dead row matches.</td></tr>");
    }
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(
            body,
            "<tr><td data-label=\"Row\">{}</td><td data-label=\"Load\">{}</td><td data-label=\"Type\">{} <span class=\"sub\">({})</span></td>\
             <td data-label=\"Sends failed\">{}</td><td data-label=\"Last failure\">{}</td><td data-label=\"Died\">{}</td>\
             <td data-label=\"Inbox\">{}</td>",
            id(&r.row.id),
            link_load(r.row.load_id.as_str()),
            esc(r.row.action_type.as_str()),
            esc(class_name(r.row.action_type.class())),
            r.row.attempts,
            quoted(r.row.last_failure.as_deref()),
            time_ago(r.dead_at, answer.age_s(r.dead_at)),
            inbox_cell(&r.inbox, Some(r.row.load_id.as_str())),
        );
        if ctx.operator() {
            body.push_str("<td data-label=\"Act\">");
            if r.inbox.state == InboxState::Open {
                let _ = write!(
                    body,
                    "<form method=\"post\" action=\"/console/dead/requeue\">{}{}\
                     <input type=\"hidden\" name=\"outbox_id\" value=\"{}\">{} <button type=\"submit\">Requeue</button></form>{}",
                    ctx.hidden(),
                    request_field(&new_request()),
                    esc(&r.row.id),
                    reason_field(&i.to_string()),
                    dismiss_form(
                        ctx,
                        "/console/dead/dismiss",
                        "outbox_id",
                        &r.row.id,
                        &format!("d{i}"),
                        &new_request()
                    ),
                );
            } else {
                body.push('–');
            }
            body.push_str("</td>");
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table></div>");
    if let Some(next) = answer.next.as_deref() {
        body.push_str(&next_page("/console/dead", pairs, "before", next, "Older rows"));
    }
    layout(ctx, "Dead rows", Nav::Dead, &body)
}

/// What a bulk requeue did, or with a dry run would do, and the form that does it.
pub fn bulk(ctx: &Ctx, a: &haul_runtime::operator::BulkAnswer, reason: &str, new_request: String) -> String {
    let mut body = String::new();
    let title = if a.dry_run { "Bulk requeue: dry run" } else { "Bulk requeue: done" };
    // Only what goes out counts: a row another request requeued, or one refused, is
    // listed with its reason and left out of the count.
    let n = a.rows.iter().filter(|r| r.goes_out()).count();
    let skipped = a.rows.len() - n;
    let more = if a.truncated { " (more match: run it again for the next ones)" } else { "" };
    let skipped = match skipped {
        0 => String::new(),
        k => format!(" {k} more matched and are left out: see why below."),
    };
    let _ = write!(
        body,
        "<p class=\"result\" role=\"status\">{} {n} dead {} row(s) buried since {}{more}.{skipped}</p>",
        if a.dry_run { "Would requeue" } else { "Requeued" },
        esc(a.filter.action_type.as_str()),
        time(a.filter.since),
    );
    body.push_str("<div class=\"scroll\"><table><thead><tr><th scope=\"col\">Row</th><th scope=\"col\">Load</th><th scope=\"col\">Died</th>\
        <th scope=\"col\">Last failure</th><th scope=\"col\">Result</th></tr></thead><tbody>");
    for r in &a.rows {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            id(&r.outbox_id),
            link_load(r.load_id.as_str()),
            time(r.dead_at),
            quoted(r.last_failure.as_deref()),
            match &r.requeued_as {
                Some(key) => format!("{} as {}", status_badge(&r.status), id(key)),
                None => status_badge(&r.status),
            },
        );
    }
    body.push_str("</tbody></table></div>");
    if a.dry_run && n > 0 && ctx.operator() {
        let since = a.filter.since.strftime("%Y-%m-%dT%H:%M:%S%.fZ").to_string();
        let _ = write!(
            body,
            "<form method=\"post\" action=\"/console/dead/bulk-requeue\">{}{}\
             <input type=\"hidden\" name=\"action_type\" value=\"{}\"><input type=\"hidden\" name=\"since\" value=\"{}\">\
             <input type=\"hidden\" name=\"dry_run\" value=\"false\">\
             <p><label for=\"reason-confirm\">Reason</label> <input id=\"reason-confirm\" name=\"reason\" required maxlength=\"500\" value=\"{}\"></p>\
             <p><button type=\"submit\">Requeue these {n} rows</button></p></form>",
            ctx.hidden(),
            request_field(&new_request),
            esc(a.filter.action_type.as_str()),
            esc(&since),
            esc(reason),
        );
    }
    body.push_str("<p><a href=\"/console/dead\">Back to the dead rows</a></p>");
    layout(ctx, title, Nav::Dead, &body)
}

// ---------------------------------------------------------------- timers, unmatched, alerts

pub fn timers(ctx: &Ctx, pairs: &[(&str, &str)], answer: Result<&QueryPage<Timer>, String>) -> String {
    let mut body = format!(
        "<form class=\"filters\" method=\"get\" action=\"/console/timers\"><fieldset><legend>Filter</legend>\
         <p><label for=\"overdue_over\">Overdue by more than</label> <input id=\"overdue_over\" name=\"overdue_over\" placeholder=\"15m\" value=\"{}\"></p>\
         <p><button type=\"submit\">Filter</button></p></fieldset></form>",
        esc(value_of(pairs, "overdue_over"))
    );
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            body.push_str(&error_box(&e));
            return layout(ctx, "Overdue timers", Nav::Timers, &body);
        }
    };
    body.push_str("<div class=\"scroll\"><table><caption>Timers due and not fired, the most overdue first</caption><thead><tr>\
        <th scope=\"col\">Timer</th><th scope=\"col\">Load</th><th scope=\"col\">Fire at</th><th scope=\"col\">Overdue by</th></tr></thead><tbody>");
    let timers = &answer.rows;
    if timers.is_empty() {
        body.push_str("<tr><td colspan=\"4\">No timer is overdue.</td></tr>");
    }
    for t in timers {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            id(t.timer_id.as_str()),
            link_load(t.load_id.as_str()),
            time(t.fire_at),
            age(answer.age_s(t.fire_at)),
        );
    }
    body.push_str("</tbody></table></div>");
    if let Some(next) = answer.next.as_deref() {
        body.push_str(&next_page("/console/timers", pairs, "after", next, "Next page"));
    }
    layout(ctx, "Overdue timers", Nav::Timers, &body)
}

/// `choices[i]`: the active loads with the number of the page's `i`th SMS.
pub fn unmatched(
    ctx: &Ctx,
    pairs: &[(&str, &str)],
    answer: Result<&QueryPage<InboxSms>, String>,
    choices: &[Vec<haul_core::ids::LoadId>],
    new_request: &mut dyn FnMut() -> String,
) -> String {
    let mut body = inbox_tabs("/console/unmatched", pairs, ctx.inbox.map(|c| c.unmatched));
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            body.push_str(&error_box(&e));
            return layout(ctx, "Unmatched SMS", Nav::Unmatched, &body);
        }
    };
    body.push_str("<div class=\"scroll\"><table class=\"cards\"><caption>Inbound SMS that went to no load, newest first</caption><thead><tr>\
        <th scope=\"col\">MessageSid</th><th scope=\"col\">From</th><th scope=\"col\">To</th><th scope=\"col\">Body</th>\
        <th scope=\"col\">Received</th><th scope=\"col\">Why unmatched</th><th scope=\"col\">Inbox</th>");
    if ctx.operator() {
        body.push_str("<th scope=\"col\">Assign to a load</th>");
    }
    body.push_str("</tr></thead><tbody>");
    let list = &answer.rows;
    if list.is_empty() {
        body.push_str("<tr><td colspan=\"8\">None.</td></tr>");
    }
    for (i, entry) in list.iter().enumerate() {
        let u = &entry.sms;
        let loads = choices.get(i).map(Vec::as_slice).unwrap_or_default();
        let offered = match loads {
            [] => "No active load has this number.".to_owned(),
            _ => format!(
                "Active loads with this number: {}",
                loads.iter().map(|l| link_load(l.as_str())).collect::<Vec<_>>().join(", ")
            ),
        };
        let _ = write!(
            body,
            "<tr><td data-label=\"MessageSid\">{}</td><td data-label=\"From\">{}</td><td data-label=\"To\">{}</td>\
             <td class=\"body\" data-label=\"Body\">{}</td><td data-label=\"Received\">{}</td>\
             <td data-label=\"Why unmatched\">{}<br><span class=\"sub\">{offered}</span></td><td data-label=\"Inbox\">{}{}</td>",
            id(&u.message_sid),
            esc(&mask_phone(&u.from)),
            esc(&mask_phone(&u.to)),
            esc(&u.body),
            time_ago(u.received_at, answer.age_s(u.received_at)),
            esc(&u.reason),
            inbox_cell(&entry.inbox, entry.assigned_load.as_ref().map(|l| l.as_str())),
            match (&entry.assigned_load, &entry.dismissed_reason) {
                (Some(l), _) => format!("<br><span class=\"sub\">assigned to {}</span>", link_load(l.as_str())),
                (None, Some(why)) => format!("<br><span class=\"sub\">{}</span>", quoted(Some(why))),
                (None, None) => String::new(),
            },
        );
        if let (true, Some(_)) = (ctx.operator(), &entry.assigned_load) {
            // Assigned by mistake: moved to the right load (the wrong one's asks it
            // answered go to a person).
            let _ = write!(
                body,
                "<td data-label=\"Assign to a load\"><form method=\"post\" action=\"/console/unmatched/reassign\">{}{}\
                 <input type=\"hidden\" name=\"message_sid\" value=\"{}\">\
                 <label for=\"move-{i}\">Move to load</label> <input id=\"move-{i}\" name=\"load_id\" required \
                 maxlength=\"64\"> {} <button type=\"submit\">Move</button></form></td>",
                ctx.hidden(),
                request_field(&new_request()),
                esc(&u.message_sid),
                reason_field(&format!("m{i}")),
            );
        } else if ctx.operator() && entry.inbox.state != InboxState::Open {
            body.push_str("<td data-label=\"Assign to a load\">–</td>");
        } else if ctx.operator() {
            let options: String = loads.iter().map(|l| format!("<option value=\"{}\">", esc(l.as_str()))).collect();
            let _ = write!(
                body,
                "<td data-label=\"Assign to a load\"><form method=\"post\" action=\"/console/unmatched/assign\">{}{}\
                 <input type=\"hidden\" name=\"message_sid\" value=\"{}\">\
                 <label for=\"load-{i}\">Load id</label> <input id=\"load-{i}\" name=\"load_id\" required maxlength=\"64\" \
                 list=\"loads-{i}\"><datalist id=\"loads-{i}\">{options}</datalist> \
                 {} <button type=\"submit\">Assign</button></form>{}</td>",
                ctx.hidden(),
                request_field(&new_request()),
                esc(&u.message_sid),
                reason_field(&i.to_string()),
                dismiss_form(
                    ctx,
                    "/console/unmatched/dismiss",
                    "message_sid",
                    &u.message_sid,
                    &format!("d{i}"),
                    &new_request()
                ),
            );
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table></div>");
    if let Some(next) = answer.next.as_deref() {
        body.push_str(&next_page("/console/unmatched", pairs, "before", next, "Older messages"));
    }
    layout(ctx, "Unmatched SMS", Nav::Unmatched, &body)
}

/// A refused assignment to a load that does not exist: what was wrong, in red, and
/// the active loads with the SMS's number, each a one-click assignment with the reason
/// given (at most 10).
pub fn assign_refused(
    ctx: &Ctx,
    text: &str,
    message_sid: &str,
    reason: &str,
    loads: &[haul_core::ids::LoadId],
    new_request: &mut dyn FnMut() -> String,
) -> String {
    let mut body = format!("<p class=\"error\" role=\"alert\">{}</p>", esc(text));
    if loads.is_empty() {
        body.push_str("<p>No active load has this SMS's number: type the load id again.</p>");
    } else {
        body.push_str("<p>The active loads with this SMS's number:</p><ul class=\"choices\">");
        for l in loads.iter().take(10) {
            let _ = write!(
                body,
                "<li><form method=\"post\" action=\"/console/unmatched/assign\">{}{}\
                 <input type=\"hidden\" name=\"message_sid\" value=\"{}\"><input type=\"hidden\" name=\"load_id\" value=\"{}\">\
                 <input type=\"hidden\" name=\"reason\" value=\"{}\">{} <button type=\"submit\">Assign to {}</button></form></li>",
                ctx.hidden(),
                request_field(&new_request()),
                esc(message_sid),
                esc(l.as_str()),
                esc(reason),
                link_load(l.as_str()),
                esc(l.as_str()),
            );
        }
        body.push_str("</ul>");
    }
    body.push_str("<p><a href=\"/console/unmatched\">Unmatched SMS</a></p>");
    layout(ctx, "Refused", Nav::Unmatched, &body)
}

pub fn alerts(
    ctx: &Ctx,
    pairs: &[(&str, &str)],
    answer: Result<&QueryPage<InboxAlert>, String>,
    new_request: &mut dyn FnMut() -> String,
) -> String {
    let mut body = String::from(
        "<p class=\"sub\">An OpsAlert is raised when a Hero-channel or internal outbox row dies, and sent to the ops \
         service: <strong>delivered</strong> (taken), <strong>refused</strong> (a 4xx: kept, not sent again), or \
         <strong>pending</strong> (not taken yet; the dispatcher sends it again). It stays <strong>open</strong> in \
         the inbox until its row is requeued and the copy delivered (handled), or an operator dismisses it.</p>",
    );
    body.push_str(&inbox_tabs("/console/alerts", pairs, ctx.inbox.map(|c| c.alerts)));
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            body.push_str(&error_box(&e));
            return layout(ctx, "OpsAlerts", Nav::Alerts, &body);
        }
    };
    body.push_str(
        "<div class=\"scroll\"><table class=\"cards\"><caption>OpsAlerts, newest first</caption><thead><tr><th scope=\"col\">Kind</th>\
        <th scope=\"col\">Row</th><th scope=\"col\">Load</th><th scope=\"col\">Failure</th><th scope=\"col\">Raised</th>\
        <th scope=\"col\">State</th><th scope=\"col\">Sends</th><th scope=\"col\">Last error</th>\
        <th scope=\"col\">Last send</th><th scope=\"col\">Inbox</th></tr></thead><tbody>",
    );
    let list = &answer.rows;
    if list.is_empty() {
        body.push_str("<tr><td colspan=\"10\">None.</td></tr>");
    }
    for (i, entry) in list.iter().enumerate() {
        let a = &entry.alert;
        // An open alert is handled on its row: requeue it from the dead rows, or
        // dismiss it here.
        let act = if entry.inbox.state == InboxState::Open && ctx.operator() {
            dismiss_form(ctx, "/console/dead/dismiss", "outbox_id", &a.outbox_id, &format!("a{i}"), &new_request())
        } else {
            String::new()
        };
        let _ = write!(
            body,
            "<tr><td data-label=\"Kind\">{}</td><td data-label=\"Row\">{}</td><td data-label=\"Load\">{}</td>\
             <td data-label=\"Failure\">{}</td><td data-label=\"Raised\">{}</td><td data-label=\"State\">{}</td>\
             <td data-label=\"Sends\">{}</td><td data-label=\"Last error\">{}</td><td data-label=\"Last send\">{}</td>\
             <td data-label=\"Inbox\">{}{act}</td></tr>",
            esc(a.kind.as_str()),
            id(&a.outbox_id),
            link_load(a.load_id.as_str()),
            quoted(Some(&a.failure)),
            time_ago(a.raised_at, answer.age_s(a.raised_at)),
            status_badge(a.state.as_str()),
            a.sends,
            quoted(a.last_error.as_deref()),
            time_ago(a.updated_at, answer.age_s(a.updated_at)),
            inbox_cell(&entry.inbox, Some(a.load_id.as_str())),
        );
    }
    body.push_str("</tbody></table></div>");
    if let Some(next) = answer.next.as_deref() {
        body.push_str(&next_page("/console/alerts", pairs, "before", next, "Older alerts"));
    }
    layout(ctx, "OpsAlerts", Nav::Alerts, &body)
}

/// Class names in the order the overview shows them.
pub fn classes() -> [&'static str; 3] {
    [
        class_name(haul_core::action::ChannelClass::External),
        class_name(haul_core::action::ChannelClass::HeroChannel),
        class_name(haul_core::action::ChannelClass::Internal),
    ]
}

#[cfg(test)]
mod tests {
    use haul_core::action::{Action, ActionKind, Urgency};
    use haul_core::event::{ActionOutcome, EventBody, InboundSms, OperatorAction, OperatorCommand};
    use haul_core::ids::{EventId, LoadId};
    use haul_core::log::Entry;
    use haul_core::projection::{LoadState, Record};
    use haul_runtime::inspect::StateView;
    use haul_store::{OpsAlertRecord, UnmatchedSms};
    use serde_json::json;

    use super::super::session::{self, Role};
    use super::*;

    const HOSTILE: &str = "<script>window.__pwned=1</script><img src=x onerror=alert(1)>\"'&";

    fn session(role: Role) -> (Session, [u8; 32]) {
        let key = session::session_key(&[5; 32], &["api-token-1".into()], &["op-token-1".into()]).unwrap();
        let cookie = session::issue(&key, role, "ana", 0, [3; 16]);
        (session::verify(&key, &cookie, 1).unwrap(), key)
    }

    /// No tag or attribute from outside survives: each hostile string is there escaped.
    fn assert_inert(html: &str) {
        assert!(!html.contains("<script>window"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(
            html.contains(
                "&lt;script&gt;window.__pwned=1&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&quot;&#39;&amp;"
            ),
            "{html}"
        );
        // Nothing inline for the Content-Security-Policy to refuse.
        assert!(!html.contains(" style=") && !html.contains(" onclick=") && !html.contains("<script>"), "{html}");
    }

    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn text_from_outside_is_shown_as_text_on_every_page() {
        let (s, key) = session(Role::Operator);
        let ctx = Ctx { session: &s, csrf: s.csrf(&key), inbox: None };
        let t: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let load_id = LoadId::parse("481207").unwrap();
        let record =
            |seq: u64, entry: Entry| Record { seq, entry_id: format!("e{seq}"), entry, recorded_at: t, trace: None };
        let key_id = "481207/sms_1/create_hero_task";
        let hero_task = Action {
            key: key_id.into(),
            kind: ActionKind::CreateHeroTask { title: HOSTILE.into(), body: HOSTILE.into(), urgency: Urgency::Normal },
            ask_id: None,
            step: None,
            requeue_of: None,
        };
        let sms_id = EventId::parse("sms_1").unwrap();
        let sms = InboundSms { from: "+15555550100".into(), body: HOSTILE.into() };
        let mut decision = Decision::new(&sms_id, t, "llm:m", vec![hero_task.clone()], vec![], HOSTILE);
        // The model's version comes from the model's endpoint: shown as text too.
        let usage = haul_core::spend::LlmUsage {
            model: "m".into(),
            model_version: Some(HOSTILE.into()),
            input_tokens: 1200,
            output_tokens: 80,
            cost_micro_usd: Some(3040),
            finish_reason: None,
            prompt_hash: "a".repeat(64),
            input_hash: "b".repeat(64),
            client: None,
        };
        decision.llm = Some(usage.clone());
        let mut spent = LoadState::default();
        spent.spend.spend.add(&usage);
        spent.spend.capped = true;
        let requeue = OperatorAction {
            actor: "ana".into(),
            reason: HOSTILE.into(),
            command: OperatorCommand::Requeue { outbox_id: key_id.into(), action: hero_task },
        };
        let view = LoadView {
            load_id: load_id.clone(),
            version: 4,
            state: StateView::of(&spent),
            log: vec![
                record(1, Entry::Event { event_id: sms_id.clone(), body: EventBody::InboundSms(sms) })
                    .with_trace(haul_core::trace::TraceParent::parse(TRACE)),
                record(2, Entry::Decision(decision)),
                record(
                    3,
                    Entry::Event {
                        event_id: EventId::parse("op:r1").unwrap(),
                        body: EventBody::OperatorAction(requeue),
                    },
                ),
                record(
                    4,
                    Entry::Unreadable {
                        kind: HOSTILE.into(),
                        payload: json!({HOSTILE: HOSTILE}),
                        reason: HOSTILE.into(),
                    },
                ),
                record(
                    5,
                    Entry::Event {
                        event_id: EventId::parse("evt:out:481207/sms_1/create_hero_task:failed").unwrap(),
                        body: EventBody::ActionOutcome(ActionOutcome {
                            outbox_id: key_id.into(),
                            action_type: ActionType::CreateHeroTask,
                            status: haul_core::OutcomeStatus::Failed,
                            receipt: None,
                            failure: Some(HOSTILE.into()),
                            hero_channel: true,
                            internal: false,
                        }),
                    },
                ),
            ],
            next_after_seq: None,
            outbox: vec![OutboxRow {
                id: key_id.into(),
                load_id: load_id.clone(),
                action_type: ActionType::CreateHeroTask,
                action: Value::Null,
                status: OutboxStatus::Dead,
                attempts: 1,
                due_at: t,
                first_attempt_at: Some(t),
                claim_token: None,
                lease_until: None,
                last_failure: Some(HOSTILE.into()),
                receipt: None,
                created_at: t,
                updated_at: t,
                trace: None,
            }],
            next_outbox_after: None,
            timers: vec![],
            next_timers_after: None,
            recorded: vec![],
            sms_reports: vec![haul_store::SmsReport {
                message_sid: "SM1".into(),
                status: "undelivered".into(),
                error_code: Some("30006".into()),
                outbox_id: Some(key_id.into()),
                load_id: Some(load_id.clone()),
                reason: None,
                reported_at: t,
            }],
        };
        let mut ids = || "console-1".to_string();
        let page = load(&ctx, &view, "", Order::NewestFirst, &mut ids);
        assert_inert(&page);
        assert!(page.contains("s-undelivered\">undelivered</span> (error 30006)"), "the row's delivery report");
        assert!(page.contains("***0100") && !page.contains("+15555550100"), "phones are masked");
        // What the load's model calls cost, and each decision's call.
        assert!(
            page.contains("Model spend: 1 call(s), 1280 tokens (1200 in, 80 out), $0.003040. Its LLM budget is spent")
        );
        assert!(page.contains("1200 tokens in, 80 out, $0.003040 · prompt <code>aaaaaaaaaaaa</code>"), "{page}");
        assert!(page.contains("action=\"/console/dead/requeue\""), "an operator may requeue the dead row");
        // A record appended in a trace names its trace id; the others none.
        assert!(page.contains("title=\"trace id\">trace 4bf92f3577b34da6a3ce929d0e0e4736</span>"), "{page}");
        assert_eq!(page.matches("title=\"trace id\"").count(), 1, "{page}");
        // The Hero task's content is on the page (escaped), with its urgency, and the
        // driver's last message is at the top.
        assert!(page.contains("<div class=\"content\"><strong>&lt;script&gt;") && page.contains(">normal<"), "{page}");
        assert!(
            page.contains("<p class=\"last-message\">The driver&#39;s last message")
                || page.contains("<p class=\"last-message\">The driver's last message"),
            "{page}"
        );

        fn page_of<T>(rows: Vec<T>) -> QueryPage<T> {
            QueryPage { rows, next: None, now: "2026-03-02T07:00:00Z".parse().unwrap() }
        }
        let sms = |from: &str, body: &str, reason: &str| InboxSms {
            sms: UnmatchedSms {
                message_sid: "SM1".into(),
                from: from.into(),
                to: "+15555550000".into(),
                body: body.into(),
                received_at: t,
                reason: reason.into(),
            },
            inbox: InboxMark::OPEN,
            assigned_load: None,
            dismissed_reason: Some(HOSTILE.into()),
        };
        let page = unmatched(&ctx, &[], Ok(&page_of(vec![sms("+15555559999", HOSTILE, HOSTILE)])), &[], &mut ids);
        assert_inert(&page);
        assert!(!page.contains("+15555559999"));
        assert!(page.contains("No active load has this number."));
        // The loads with the number are offered as links and as the field's choices.
        let two = [vec![LoadId::parse("481207").unwrap(), LoadId::parse("481208").unwrap()]];
        let page = unmatched(&ctx, &[], Ok(&page_of(vec![sms("+15555559999", "hi", "2 loads")])), &two, &mut ids);
        assert!(page.contains("Active loads with this number: <a href=\"/console/loads/481207\">481207</a>, <a href=\"/console/loads/481208\">481208</a>"), "{page}");
        assert!(page.contains("list=\"loads-0\"><datalist id=\"loads-0\"><option value=\"481207\"><option value=\"481208\"></datalist>"), "{page}");
        let mut row = view.outbox[0].clone();
        row.last_failure = Some(HOSTILE.into());
        let dead_row = DeadRow { row, dead_at: t, outcome_published_at: None, inbox: InboxMark::OPEN };
        assert_inert(&dead(&ctx, &[], Ok(&page_of(vec![dead_row])), &mut ids, t));
        let alert = OpsAlertRecord {
            outbox_id: key_id.into(),
            load_id: load_id.clone(),
            kind: haul_core::dispatch::AlertKind::HeroChannelFailure,
            action_type: ActionType::CreateHeroTask,
            failure: HOSTILE.into(),
            state: haul_store::AlertState::Refused,
            sends: 1,
            last_error: Some(HOSTILE.into()),
            raised_at: t,
            updated_at: t,
        };
        let mark = InboxMark { state: InboxState::Dismissed, by: Some(HOSTILE.into()), at: Some(t) };
        let page = alerts(&ctx, &[("inbox", HOSTILE)], Ok(&page_of(vec![InboxAlert { alert, inbox: mark }])), &mut ids);
        assert_inert(&page);
        assert!(page.contains(">refused<"), "{page}");
        // A filter value echoed back into its field.
        assert_inert(&loads(&ctx, &[("stage", HOSTILE)], Err(HOSTILE.into())));
    }

    #[test]
    fn a_read_only_session_sees_no_action() {
        let (s, key) = session(Role::Read);
        let ctx = Ctx { session: &s, csrf: s.csrf(&key), inbox: None };
        let mut ids = || "console-1".to_string();
        let t: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let row = OutboxRow {
            id: "481207/a/send_sms".into(),
            load_id: LoadId::parse("481207").unwrap(),
            action_type: ActionType::SendSms,
            action: Value::Null,
            status: OutboxStatus::Dead,
            attempts: 3,
            due_at: t,
            first_attempt_at: Some(t),
            claim_token: None,
            lease_until: None,
            last_failure: None,
            receipt: None,
            created_at: t,
            updated_at: t,
            trace: None,
        };
        let dead_rows = QueryPage {
            rows: vec![DeadRow { row, dead_at: t, outcome_published_at: None, inbox: InboxMark::OPEN }],
            next: None,
            now: t,
        };
        let page = dead(&ctx, &[], Ok(&dead_rows), &mut ids, t);
        assert!(!page.contains("/console/dead/requeue") && !page.contains("/console/dead/bulk-requeue"), "{page}");
        let sms = UnmatchedSms {
            message_sid: "SM1".into(),
            from: "+1".into(),
            to: "+2".into(),
            body: "b".into(),
            received_at: t,
            reason: "r".into(),
        };
        let sms = InboxSms { sms, inbox: InboxMark::OPEN, assigned_load: None, dismissed_reason: None };
        let unmatched_rows = QueryPage { rows: vec![sms], next: None, now: t };
        let page = unmatched(&ctx, &[], Ok(&unmatched_rows), &[], &mut ids);
        assert!(!page.contains("/console/unmatched/assign") && !page.contains("/console/unmatched/dismiss"), "{page}");
        assert!(!dead(&ctx, &[], Ok(&dead_rows), &mut ids, t).contains("/console/dead/dismiss"));
    }

    /// Each SMS offers what can be done with it: an open one an assignment, an
    /// assigned one a move to another load, a dismissed one nothing.
    #[test]
    fn an_sms_offers_what_can_be_done_with_it() {
        let (s, key) = session(Role::Operator);
        let ctx = Ctx { session: &s, csrf: s.csrf(&key), inbox: None };
        let mut ids = || "console-1".to_string();
        let t: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let sms = UnmatchedSms {
            message_sid: "SM1".into(),
            from: "+15555550100".into(),
            to: "+15555550000".into(),
            body: "ETA 9".into(),
            received_at: t,
            reason: "r".into(),
        };
        let handled = InboxMark { state: InboxState::Handled, by: Some("op:a1".into()), at: Some(t) };
        let dismissed = InboxMark { state: InboxState::Dismissed, by: Some("ana".into()), at: Some(t) };
        for (inbox, assigned, offers) in [
            (InboxMark::OPEN, None, Some("/console/unmatched/assign")),
            (handled, Some(LoadId::parse("L1").unwrap()), Some("/console/unmatched/reassign")),
            (dismissed, None, None),
        ] {
            let entry = InboxSms { sms: sms.clone(), inbox, assigned_load: assigned, dismissed_reason: None };
            let page = unmatched(&ctx, &[], Ok(&QueryPage { rows: vec![entry], next: None, now: t }), &[], &mut ids);
            for form in ["/console/unmatched/assign", "/console/unmatched/reassign"] {
                assert_eq!(page.contains(form), offers == Some(form), "{form}: {page}");
            }
        }
    }

    /// The overview counts a saturated channel (one whose send rate held rows back in
    /// the last minute) among the open problems, naming it and when.
    #[test]
    fn the_overview_counts_saturated_channels() {
        let now: Timestamp = "2026-03-02T07:00:30Z".parse().unwrap();
        let figures = |saturated| Figures {
            oldest_pending: None,
            dead_last_hour: vec![],
            dead_in_store: Some(0),
            oldest_due_timer: None,
            conflicts: None,
            conflict_loads: Some(vec![]),
            queue_depth: Some(0),
            inbox: Some(InboxCounts { dead: vec![], alerts: 0, unmatched: 0 }),
            escalated_loads: Some((0, false)),
            saturated,
            now,
        };
        let held = vec![("sms".to_owned(), "2026-03-02T07:00:25Z".parse().unwrap())];
        let page = overview(&figures(Some(held)));
        assert!(page.contains("<li class=\"warn\"><a href=\"/console/loads?pending_over=1s\">saturated channels (rows held back: sms 5s ago): 1</a>"), "{page}");
        let page = overview(&figures(Some(vec![])));
        assert!(
            page.contains("<li class=\"ok\"><a href=\"/console/loads?pending_over=1s\">saturated channels: 0</a>"),
            "{page}"
        );
        assert!(!overview(&figures(None)).contains("saturated"), "unknown: not shown as none");
    }
}
