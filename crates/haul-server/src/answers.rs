//! The operators' queries' answers as JSON: the wire form of `GET /v1/ops/{query}`,
//! which `haul query --json` prints too. The queries answer typed rows
//! (`haul_runtime::queries`); this is the one place they become JSON, so the API's
//! answers keep their fields whoever else reads the rows.

use haul_runtime::queries::{Answer, Page};
use haul_store::ops::{ConflictLoad, DeadRow, LoadSummary, class_name};
use haul_store::{ClientDaySpend, InboxAlert, InboxMark, InboxSms, SmsConsent, Timer};
use serde_json::{Value, json};

/// `answer` as the API writes it: the page's rows under the query's list name, and
/// the next page's cursor (`next_after` or `next_before`, `null` on the last page).
pub fn answer_json(answer: &Answer) -> Value {
    match answer {
        Answer::Loads(p) => json!({"loads": rows(p, load), "next_after": p.next}),
        Answer::Dead(p) => json!({"rows": rows(p, dead), "next_before": p.next}),
        Answer::Timers(p) => json!({"timers": rows(p, timer), "next_after": p.next}),
        Answer::Unmatched(p) => json!({"unmatched": rows(p, unmatched), "next_before": p.next}),
        Answer::Alerts(p) => json!({"alerts": rows(p, alert), "next_before": p.next}),
        Answer::Conflicts(p) => json!({"loads": rows(p, conflict)}),
        Answer::OptedOut(p) => json!({"opted_out": rows(p, opted_out), "next_before": p.next}),
        Answer::Spend(p) => json!({"spend": rows(p, spend), "next_after": p.next}),
    }
}

fn rows<T>(p: &Page<T>, one: fn(&Page<T>, &T) -> Value) -> Vec<Value> {
    p.rows.iter().map(|r| one(p, r)).collect()
}

fn load(p: &Page<LoadSummary>, l: &LoadSummary) -> Value {
    json!({
        "load_id": l.load_id,
        "stage": l.stage,
        "open_asks": l.open_asks,
        "escalated_asks": l.escalated_asks,
        "version": l.version,
        "created_at": l.created_at,
        "last_activity_at": l.last_activity_at,
        "idle_s": p.age_s(l.last_activity_at),
    })
}

fn dead(p: &Page<DeadRow>, d: &DeadRow) -> Value {
    let r = &d.row;
    json!({
        "id": r.id,
        "load_id": r.load_id,
        "action_type": r.action_type,
        "class": class_name(r.action_type.class()),
        "attempts": r.attempts,
        "last_failure": r.last_failure,
        "created_at": r.created_at,
        "dead_at": d.dead_at,
        "age_s": p.age_s(d.dead_at),
        "outcome_published_at": d.outcome_published_at,
        "inbox": inbox(&d.inbox),
    })
}

/// Where a problem stands in the operators' inbox: `state` (`open`, `handled`,
/// `dismissed`), what took it out (`by`: an event id, or for an unmatched SMS the
/// operator who dismissed it) and when (`at`); `null`s while open.
fn inbox(m: &InboxMark) -> Value {
    json!({"state": m.state.as_str(), "by": m.by, "at": m.at})
}

fn timer(p: &Page<Timer>, t: &Timer) -> Value {
    json!({
        "timer_id": t.timer_id,
        "load_id": t.load_id,
        "fire_at": t.fire_at,
        "overdue_s": p.age_s(t.fire_at),
        "created_at": t.created_at,
    })
}

fn spend(_: &Page<ClientDaySpend>, d: &ClientDaySpend) -> Value {
    let s = &d.spend;
    json!({
        "client": (!d.client.is_empty()).then_some(&d.client),
        "day": d.day,
        "input_tokens": s.input_tokens,
        "output_tokens": s.output_tokens,
        "cost_micro_usd": s.cost_micro_usd,
        "cost_usd": haul_core::spend::usd(s.cost_micro_usd),
        "calls": s.calls,
        "capped_at": d.capped_at,
    })
}

fn opted_out(p: &Page<SmsConsent>, c: &SmsConsent) -> Value {
    json!({
        "phone": c.phone,
        "event_id": c.event_id,
        "load_id": c.load_id,
        "opted_out_at": c.changed_at,
        "age_s": p.age_s(c.changed_at),
    })
}

fn unmatched(p: &Page<InboxSms>, i: &InboxSms) -> Value {
    let u = &i.sms;
    json!({
        "message_sid": u.message_sid,
        "from": u.from,
        "to": u.to,
        "body": u.body,
        "received_at": u.received_at,
        "age_s": p.age_s(u.received_at),
        "reason": u.reason,
        "inbox": inbox(&i.inbox),
        "assigned_load": i.assigned_load,
        "dismissed_reason": i.dismissed_reason,
    })
}

/// An OpsAlert as the dispatcher recorded it: raised once per dead Hero-channel or
/// internal row, then `pending` (the ops service is down; the sweep sends it again),
/// `delivered` or `refused` (a 4xx; not sent again). `sends` counts the sends so far
/// and `last_error` is what the last failed one got. `inbox` is where its dead row
/// stands in the operators' inbox.
fn alert(p: &Page<InboxAlert>, i: &InboxAlert) -> Value {
    let a = &i.alert;
    json!({
        "kind": a.kind.as_str(),
        "outbox_id": a.outbox_id,
        "load_id": a.load_id,
        "action_type": a.action_type,
        "failure": a.failure,
        "state": a.state.as_str(),
        "sends": a.sends,
        "last_error": a.last_error,
        "raised_at": a.raised_at,
        "updated_at": a.updated_at,
        "age_s": p.age_s(a.raised_at),
        "inbox": inbox(&i.inbox),
    })
}

fn conflict(p: &Page<ConflictLoad>, c: &ConflictLoad) -> Value {
    json!({
        "load_id": c.load_id,
        "conflicts": c.conflicts,
        "last_conflict_at": c.last_conflict_at,
        "since_last_s": p.age_s(c.last_conflict_at),
    })
}
