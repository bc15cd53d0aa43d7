//! The operators' queries across loads, one implementation for `GET /v1/ops/{query}`
//! and `haul query {query}`: the same parameter names (the command's flags are the
//! query's parameters with `-` for `_`), the same bounds, the same answer: typed rows
//! here, made JSON only where they leave the process (the API layer).
//!
//! Each query is a keyset page of the store's [`OpsQueries`]: `limit` items (default
//! [`DEFAULT_PAGE`], at most [`MAX_PAGE`]) and the cursor of the next page (`next_after`
//! or `next_before`, `null` on the last page), passed back as given. An unknown
//! parameter, one given twice, or a value out of form is `bad_query`: a misspelt filter
//! would otherwise silently list everything.

use std::time::Duration;

use haul_core::BadInput;
use haul_core::action::ActionType;
use haul_core::decision::InboxState;
use haul_core::ids::LoadId;
use haul_core::time::{Timestamp, from_ms, since, to_ms};
use haul_store::ops::{ConflictLoad, DEFAULT_PAGE, DeadRow, LoadSummary, MAX_PAGE, class_types};
use haul_store::{ClientDaySpend, InboxAlert, InboxSms, LoadFilter, RowCursor, SmsConsent, Store, StoreError, Timer};

/// One of the queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// Loads by filter.
    Loads,
    /// Dead outbox rows across loads, newest first.
    Dead,
    /// Timers due and not fired, the most overdue first.
    Timers,
    /// Inbound SMS that went to no load, newest first.
    Unmatched,
    /// OpsAlerts raised (dead Hero-channel and internal rows), newest first, with
    /// where each is: pending, delivered or refused.
    Alerts,
    /// The loads whose appends the version check refused most often.
    Conflicts,
    /// Phones opted out of SMS (the consent ledger), the latest opt-out first.
    OptedOut,
    /// What the model calls cost, per client and UTC day, the latest day first.
    Spend,
}

impl Query {
    pub const ALL: [Query; 8] = [
        Query::Loads,
        Query::Dead,
        Query::Timers,
        Query::Unmatched,
        Query::Alerts,
        Query::Conflicts,
        Query::OptedOut,
        Query::Spend,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Query::Loads => "loads",
            Query::Dead => "dead",
            Query::Timers => "timers",
            Query::Unmatched => "unmatched",
            Query::Alerts => "alerts",
            Query::Conflicts => "conflicts",
            Query::OptedOut => "opted-out",
            Query::Spend => "spend",
        }
    }

    pub fn parse(name: &str) -> Option<Query> {
        Query::ALL.into_iter().find(|q| q.name() == name)
    }

    /// The parameters it takes.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            Query::Loads => &[
                "stage",
                "open_asks",
                "escalated",
                "has_dead",
                "pending_over",
                "overdue_over",
                "idle_over",
                "active_within",
                "after",
                "limit",
            ],
            Query::Dead => &["action_type", "class", "inbox", "before", "limit"],
            Query::Timers => &["overdue_over", "after", "limit"],
            Query::Unmatched | Query::Alerts => &["inbox", "before", "limit"],
            Query::Conflicts => &["limit"],
            Query::OptedOut => &["before", "limit"],
            Query::Spend => &["from", "to", "client", "after", "limit"],
        }
    }
}

/// Why a query gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{}", .0.message)]
    Bad(BadInput),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<BadInput> for QueryError {
    fn from(e: BadInput) -> Self {
        QueryError::Bad(e)
    }
}

fn bad(message: String) -> BadInput {
    BadInput::new("bad_query", message)
}

/// The parameters given, each known to `query` and given once.
struct Params<'a> {
    query: Query,
    values: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn new(query: Query, pairs: &'a [(String, String)]) -> Result<Self, BadInput> {
        let mut values: Vec<(&str, &str)> = Vec::new();
        for (name, value) in pairs {
            if !query.params().contains(&name.as_str()) {
                let name: String = name.chars().take(40).collect();
                return Err(bad(format!(
                    "unknown query parameter {name:?} for {} (one of {})",
                    query.name(),
                    query.params().join(", ")
                )));
            }
            if values.iter().any(|(n, _)| n == name) {
                return Err(bad(format!("query parameter {name} is given twice")));
            }
            values.push((name, value));
        }
        Ok(Params { query, values })
    }

    fn get(&self, name: &str) -> Option<&'a str> {
        debug_assert!(self.query.params().contains(&name));
        self.values.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    fn limit(&self) -> Result<usize, BadInput> {
        match self.get("limit") {
            None => Ok(DEFAULT_PAGE),
            Some(s) => s
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| bad(format!("limit {:?}: a whole number from 1 to {MAX_PAGE}", clip(s)))),
        }
    }

    fn flag(&self, name: &str) -> Result<bool, BadInput> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") | Some("") => Ok(true),
            Some(s) => Err(bad(format!("{name} {:?}: true or false", clip(s)))),
        }
    }

    fn duration(&self, name: &str) -> Result<Option<Duration>, BadInput> {
        self.get(name)
            .map(|s| haul_core::time::parse_duration(s).map_err(|e| bad(format!("{name}: {}", e.message))))
            .transpose()
    }

    /// `inbox`: where a problem stands in the operators' inbox, `open`, `handled` or
    /// `dismissed`; `all` or none given: every state (the answers as they were before
    /// the inbox existed). Not `state`, which an alert's answer uses for its delivery.
    fn inbox(&self) -> Result<Option<InboxState>, BadInput> {
        match self.get("inbox") {
            None | Some("all") => Ok(None),
            Some(s) => InboxState::parse(s)
                .map(Some)
                .ok_or_else(|| bad(format!("inbox {:?}: open, handled, dismissed or all", clip(s)))),
        }
    }

    /// A UTC day, `YYYY-MM-DD`.
    fn day(&self, name: &str) -> Result<Option<jiff::civil::Date>, BadInput> {
        self.get(name)
            .map(|s| {
                s.parse::<jiff::civil::Date>()
                    .ok()
                    .filter(|_| s.len() == 10)
                    .ok_or_else(|| bad(format!("{name} {:?}: a day, YYYY-MM-DD", clip(s))))
            })
            .transpose()
    }

    fn cursor(&self, name: &str) -> Result<Option<RowCursor>, BadInput> {
        self.get(name)
            .map(|s| {
                RowCursor::parse(s)
                    .ok_or_else(|| bad(format!("{name} {:?} is not a cursor this query gave ({{ms}}.{{id}})", clip(s))))
            })
            .transpose()
    }
}

fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

/// `now - d`, or the earliest time for a duration past it.
fn ago(now: Timestamp, d: Duration) -> Timestamp {
    from_ms(to_ms(now).saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
}

fn seconds(now: Timestamp, t: Timestamp) -> f64 {
    since(now, t).as_secs_f64().round()
}

/// One page of a query's answer: the rows as the store gave them, where the next page
/// starts (`None` on the last page), and the `now` the rows' ages are counted from.
#[derive(Clone, Debug, PartialEq)]
pub struct Page<T> {
    pub rows: Vec<T>,
    /// The next page's cursor, as the query's `after` or `before` takes it.
    pub next: Option<String>,
    pub now: Timestamp,
}

impl<T> Page<T> {
    /// The age in whole seconds, as the answers give it.
    pub fn age_s(&self, t: Timestamp) -> f64 {
        seconds(self.now, t)
    }
}

/// A query's answer, typed: what the API and `haul query --json` write as JSON and
/// what the console and `haul query` show.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Loads(Page<LoadSummary>),
    Dead(Page<DeadRow>),
    Timers(Page<Timer>),
    Unmatched(Page<InboxSms>),
    Alerts(Page<InboxAlert>),
    /// The loads that lost most races; one page only (`next` is always `None`).
    Conflicts(Page<ConflictLoad>),
    OptedOut(Page<SmsConsent>),
    Spend(Page<ClientDaySpend>),
}

impl Answer {
    /// How many rows the page holds, and the next page's cursor.
    fn shape(&self) -> (usize, Option<&str>) {
        fn of<T>(p: &Page<T>) -> (usize, Option<&str>) {
            (p.rows.len(), p.next.as_deref())
        }
        match self {
            Answer::Loads(p) => of(p),
            Answer::Dead(p) => of(p),
            Answer::Timers(p) => of(p),
            Answer::Unmatched(p) => of(p),
            Answer::Alerts(p) => of(p),
            Answer::Conflicts(p) => of(p),
            Answer::OptedOut(p) => of(p),
            Answer::Spend(p) => of(p),
        }
    }

    /// True when the page holds no row.
    pub fn is_empty(&self) -> bool {
        self.shape().0 == 0
    }

    /// The next page's cursor.
    pub fn next(&self) -> Option<&str> {
        self.shape().1
    }
}

/// The page's cursor for what comes after its last row, when the page is full.
fn next_of<T>(rows: &[T], limit: usize, cursor: impl Fn(&T) -> String) -> Option<String> {
    if rows.len() == limit { rows.last().map(cursor) } else { None }
}

/// Runs `query` with `pairs` (name, value) at `now`.
pub async fn run(
    store: &dyn Store,
    query: Query,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Answer, QueryError> {
    Ok(match query {
        Query::Loads => Answer::Loads(loads(store, pairs, now).await?),
        Query::Dead => Answer::Dead(dead(store, pairs, now).await?),
        Query::Timers => Answer::Timers(timers(store, pairs, now).await?),
        Query::Unmatched => Answer::Unmatched(unmatched(store, pairs, now).await?),
        Query::Alerts => Answer::Alerts(alerts(store, pairs, now).await?),
        Query::Conflicts => Answer::Conflicts(conflicts(store, pairs, now).await?),
        Query::OptedOut => Answer::OptedOut(opted_out(store, pairs, now).await?),
        Query::Spend => Answer::Spend(spend(store, pairs, now).await?),
    })
}

/// Loads by filter, in id order.
pub async fn loads(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<LoadSummary>, QueryError> {
    let p = Params::new(Query::Loads, pairs)?;
    let limit = p.limit()?;
    let filter = LoadFilter {
        stage: p.get("stage").map(str::to_owned),
        open_asks: p.flag("open_asks")?,
        escalated: p.flag("escalated")?,
        has_dead: p.flag("has_dead")?,
        pending_created_by: p.duration("pending_over")?.map(|d| ago(now, d)),
        timer_due_by: p.duration("overdue_over")?.map(|d| ago(now, d)),
        active_before: p.duration("idle_over")?.map(|d| ago(now, d)),
        active_since: p.duration("active_within")?.map(|d| ago(now, d)),
    };
    let after = p
        .get("after")
        .map(|s| LoadId::parse(s).map_err(|_| bad(format!("after {:?} is not a load id", clip(s)))))
        .transpose()?;
    let page = store.loads_page(&filter, after.as_ref(), limit).await?;
    Ok(Page { rows: page.loads, next: page.next_after.map(|l| l.to_string()), now })
}

/// Dead outbox rows, newest first.
pub async fn dead(store: &dyn Store, pairs: &[(String, String)], now: Timestamp) -> Result<Page<DeadRow>, QueryError> {
    let p = Params::new(Query::Dead, pairs)?;
    let limit = p.limit()?;
    let types: Vec<ActionType> = match (p.get("action_type"), p.get("class")) {
        (Some(_), Some(_)) => return Err(bad("give action_type or class, not both".into()).into()),
        (Some(t), None) => {
            vec![ActionType::parse(t).ok_or_else(|| bad(format!("action_type {:?} is not one", clip(t))))?]
        }
        (None, Some(c)) => {
            class_types(c).ok_or_else(|| bad(format!("class {:?}: external, hero_channel or internal", clip(c))))?
        }
        (None, None) => vec![],
    };
    let (state, before) = (p.inbox()?, p.cursor("before")?);
    let rows = store.dead_rows_page(&types, state, before.as_ref(), limit).await?;
    let next = next_of(&rows, limit, |r| r.cursor().to_string());
    Ok(Page { rows, next, now })
}

/// OpsAlerts raised, newest first.
pub async fn alerts(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<InboxAlert>, QueryError> {
    let p = Params::new(Query::Alerts, pairs)?;
    let limit = p.limit()?;
    let (state, before) = (p.inbox()?, p.cursor("before")?);
    let rows = store.ops_alerts_page(state, before.as_ref(), limit).await?;
    let next = next_of(&rows, limit, |a| a.alert.cursor().to_string());
    Ok(Page { rows, next, now })
}

/// The loads whose appends lost most races.
pub async fn conflicts(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<ConflictLoad>, QueryError> {
    let p = Params::new(Query::Conflicts, pairs)?;
    let rows = store.conflict_loads(p.limit()?).await?;
    Ok(Page { rows, next: None, now })
}

/// Timers due and not fired, the most overdue first.
pub async fn timers(store: &dyn Store, pairs: &[(String, String)], now: Timestamp) -> Result<Page<Timer>, QueryError> {
    let p = Params::new(Query::Timers, pairs)?;
    let limit = p.limit()?;
    let over = p.duration("overdue_over")?.unwrap_or(Duration::ZERO);
    let after = p.cursor("after")?;
    let rows = store.overdue_timers_page(ago(now, over), after.as_ref(), limit).await?;
    let next = next_of(&rows, limit, |t| RowCursor { created_at: t.fire_at, id: t.timer_id.to_string() }.to_string());
    Ok(Page { rows, next, now })
}

/// Phones opted out of SMS, the latest opt-out first.
pub async fn opted_out(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<SmsConsent>, QueryError> {
    let p = Params::new(Query::OptedOut, pairs)?;
    let limit = p.limit()?;
    let rows = store.opted_out_page(p.cursor("before")?.as_ref(), limit).await?;
    let next = next_of(&rows, limit, |c| RowCursor { created_at: c.changed_at, id: c.phone.clone() }.to_string());
    Ok(Page { rows, next, now })
}

/// Inbound SMS that went to no load, newest first.
pub async fn unmatched(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<InboxSms>, QueryError> {
    let p = Params::new(Query::Unmatched, pairs)?;
    let limit = p.limit()?;
    let (state, before) = (p.inbox()?, p.cursor("before")?);
    let rows = store.unmatched_sms_page(state, before.as_ref(), limit).await?;
    let next = next_of(&rows, limit, |u| {
        RowCursor { created_at: u.sms.received_at, id: u.sms.message_sid.clone() }.to_string()
    });
    Ok(Page { rows, next, now })
}

/// Days a `spend` query may cover at most.
pub const MAX_SPEND_DAYS: i64 = 366;

/// What the model calls cost per client and UTC day, from `from` to `to` (default:
/// today; `from` defaults to `to`), the latest day first, then by client.
pub async fn spend(
    store: &dyn Store,
    pairs: &[(String, String)],
    now: Timestamp,
) -> Result<Page<ClientDaySpend>, QueryError> {
    let p = Params::new(Query::Spend, pairs)?;
    let limit = p.limit()?;
    let today = haul_core::spend::day_of(now).parse::<jiff::civil::Date>().map_err(|e| bad(format!("today: {e}")))?;
    let to = p.day("to")?.unwrap_or(today);
    let from = p.day("from")?.unwrap_or(to);
    if from > to {
        return Err(bad(format!("from {from} is after to {to}")).into());
    }
    if (to - from).get_days() as i64 >= MAX_SPEND_DAYS {
        return Err(bad(format!("from {from} to {to}: at most {MAX_SPEND_DAYS} days at once")).into());
    }
    let client = p.get("client");
    if let Some(c) = client {
        haul_core::event::validate_client(c).map_err(|e| bad(format!("client: {}", e.message)))?;
    }
    let after = match p.get("after") {
        None => None,
        Some(s) => {
            Some(s.split_once('.').filter(|(d, _)| d.parse::<jiff::civil::Date>().is_ok()).ok_or_else(|| {
                bad(format!("after {:?} is not a cursor this query gave ({{day}}.{{client}})", clip(s)))
            })?)
        }
    };
    let (from, to) = (from.to_string(), to.to_string());
    let rows = store.spend_page(&from, &to, client, after, limit).await?;
    let next = next_of(&rows, limit, |d| format!("{}.{}", d.day, d.client));
    Ok(Page { rows, next, now })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn parameters_are_checked_before_the_store_is_asked() {
        let check = |query: Query, p: &[(&str, &str)], expected: Result<(), &str>| {
            let pairs = pairs(p);
            let got = Params::new(query, &pairs).and_then(|p| {
                p.limit()?;
                for name in query.params() {
                    match *name {
                        "open_asks" | "escalated" | "has_dead" => drop(p.flag(name)?),
                        "pending_over" | "overdue_over" | "idle_over" | "active_within" => drop(p.duration(name)?),
                        "before" => drop(p.cursor(name)?),
                        "inbox" => drop(p.inbox()?),
                        "after" if query == Query::Spend => {}
                        "from" | "to" => drop(p.day(name)?),
                        "after" if query != Query::Loads => drop(p.cursor(name)?),
                        _ => {}
                    }
                }
                Ok(())
            });
            match (got, expected) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(part)) => {
                    assert_eq!(e.code, "bad_query");
                    assert!(e.message.contains(part), "{p:?}: {}", e.message);
                }
                (got, expected) => panic!("{query:?} {p:?}: got {got:?}, expected {expected:?}"),
            }
        };
        check(Query::Loads, &[], Ok(()));
        check(Query::Loads, &[("stage", "in_transit"), ("escalated", "true"), ("pending_over", "5m")], Ok(()));
        check(Query::Loads, &[("limit", "500")], Ok(()));
        check(Query::Loads, &[("limit", "501")], Err("from 1 to 500"));
        check(Query::Loads, &[("limit", "0")], Err("from 1 to 500"));
        check(Query::Loads, &[("stage", "a"), ("stage", "b")], Err("given twice"));
        check(Query::Loads, &[("stag", "a")], Err("unknown query parameter \"stag\""));
        check(Query::Loads, &[("escalated", "yes")], Err("true or false"));
        check(Query::Loads, &[("pending_over", "5")], Err("pending_over"));
        check(Query::Timers, &[("overdue_over", "15m"), ("after", "1772434800000.tmr:L1:ask:x:p:1")], Ok(()));
        check(Query::Timers, &[("after", "L1")], Err("not a cursor"));
        check(Query::Dead, &[("before", "x.y")], Err("not a cursor"));
        check(Query::Unmatched, &[("stage", "x")], Err("one of inbox, before, limit"));
        check(Query::OptedOut, &[("before", "1772434800000.+15555550100"), ("limit", "10")], Ok(()));
        check(Query::Spend, &[("from", "2026-03-01"), ("to", "2026-03-02"), ("client", "acme")], Ok(()));
        check(Query::Spend, &[("from", "2026-3-1")], Err("from \"2026-3-1\": a day, YYYY-MM-DD"));
        check(Query::Spend, &[("to", "yesterday")], Err("to \"yesterday\": a day"));
        check(Query::OptedOut, &[("inbox", "open")], Err("one of before, limit"));
        check(Query::OptedOut, &[("before", "+15555550100")], Err("not a cursor"));
        for state in ["open", "handled", "dismissed", "all"] {
            check(Query::Dead, &[("inbox", state)], Ok(()));
            check(Query::Alerts, &[("inbox", state)], Ok(()));
        }
        check(Query::Unmatched, &[("inbox", "closed")], Err("inbox \"closed\": open, handled, dismissed or all"));
        check(Query::Timers, &[("inbox", "open")], Err("unknown query parameter \"inbox\""));
        check(Query::Conflicts, &[("limit", "10")], Ok(()));
        check(
            Query::Conflicts,
            &[("before", "1.x")],
            Err("unknown query parameter \"before\" for conflicts (one of limit)"),
        );
    }
}
