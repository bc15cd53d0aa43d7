//! What a log entry changes in the data derived from logs: the load's summary (its
//! stage, each ask's status: what the operators' queries read) and its facts (the
//! driver's phone, whether it is active: what the Twilio webhook routes by).
//!
//! One pure delta per entry, made where the entry is typed, handed to the append with
//! the entry and written in the append's transaction. So the derived data never lags
//! its log or needs a second write that can fail on its own, and the store writes
//! what it is given without knowing a kind of event.
//!
//! A decision's timers are derived data too when the TimerStore is the store's own
//! database (`TimerRoute::WithDecision`): the worker puts its
//! `set_timer`/`cancel_timer` writes in the delta, and they commit with the decision.

use serde_json::{Map, Value};

use crate::consent::ConsentChange;
use crate::decision::Decision;
use crate::event::EventBody;
use crate::ids::{EventId, TimerId};
use crate::log::Entry;
use crate::projection::STAGE_DELIVERED;
use crate::spend::{Scope, Spend, day_of};
use crate::time::Timestamp;

/// A TimerStore write that commits in an append, as `TimerStore::schedule` and
/// `TimerStore::cancel` would make it (a cancel with nothing scheduled leaves a
/// canceled row, so a late schedule stays a noop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TimerWrite {
    Schedule { timer_id: TimerId, fire_at: Timestamp },
    Cancel { timer_id: TimerId },
}

impl TimerWrite {
    pub fn is_schedule(&self) -> bool {
        matches!(self, TimerWrite::Schedule { .. })
    }
}

/// What one entry (or, merged, one append) changes in its load's derived data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Derived {
    /// The stage a `load_update` set.
    pub stage: Option<String>,
    /// The driver phone a `load_update` set.
    pub driver_phone: Option<String>,
    /// The client a `load_update` set: whose fair share of a saturated channel the
    /// load's sends take (docs/design.md, "Send rates").
    pub client: Option<String>,
    /// Each ask's status a decision gave, `(ask_id, status)`, in order.
    pub asks: Vec<(String, String)>,
    /// The dead rows a decision took out of the operators' inbox: `(outbox_id, state,
    /// the event decided)`, in order.
    pub inbox: Vec<(String, String, String)>,
    /// The timers a decision schedules and cancels in its append, in its actions'
    /// order; empty unless the worker commits timers with their decision.
    pub timers: Vec<TimerWrite>,
    /// What an inbound STOP or START changed in its sender's consent, and the event's
    /// id: written to the store's per-phone ledger, which loads the SMS never reached
    /// go by (`crate::consent::ConsentChange`).
    pub consent: Option<(ConsentChange, String)>,
    /// What a decision's model call adds to its client's spend of the day, or that it
    /// found the client's day budget spent (`crate::spend`).
    pub spend: Vec<SpendDelta>,
    /// The prompt texts a decision's model call was given, by their SHA-256 (hex): kept
    /// once each in the store's prompts, so the log holds only the hashes. The worker
    /// puts them here; a copied log has none (its prompts are where they were).
    pub prompts: Vec<(String, String)>,
}

/// One client's day of model spend, as one decision changes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpendDelta {
    /// The client charged; empty for a load without one.
    pub client: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    pub spend: Spend,
    /// The client's day budget was found spent (the SOP decided): its OpsAlert is raised.
    pub capped: bool,
}

impl SpendDelta {
    /// What `d` changes in its client's day, if anything.
    pub fn of_decision(d: &Decision) -> Option<SpendDelta> {
        let capped = d.budget.as_ref().filter(|b| b.scope == Scope::ClientDay);
        let client = match (&d.llm, capped) {
            (Some(u), _) => u.client.clone(),
            (None, Some(b)) => b.client.clone(),
            (None, None) => return None,
        };
        let mut spend = Spend::default();
        if let Some(u) = &d.llm {
            spend.add(u);
        }
        Some(SpendDelta {
            client: client.unwrap_or_default(),
            day: day_of(d.decided_at),
            spend,
            capped: capped.is_some(),
        })
    }
}

impl Derived {
    /// What `entry` changes.
    pub fn of(entry: &Entry) -> Derived {
        match entry {
            Entry::Event { event_id, body } => Derived::of_event(event_id, body),
            Entry::Decision(d) => Derived::of_decision(d),
            Entry::Unreadable { .. } => Derived::default(),
        }
    }

    /// What an event changes: a `load_update`'s stage, phone and client; an inbound
    /// STOP's or START's sender's consent.
    pub fn of_event(event_id: &EventId, body: &EventBody) -> Derived {
        match body {
            EventBody::LoadUpdate(u) => {
                let (stage, driver_phone, client) = (u.stage.clone(), u.driver_phone.clone(), u.client.clone());
                Derived { stage, driver_phone, client, ..Derived::default() }
            }
            EventBody::InboundSms(sms) => Derived {
                consent: ConsentChange::of_sms(&sms.from, &sms.body).map(|c| (c, event_id.to_string())),
                ..Derived::default()
            },
            _ => Derived::default(),
        }
    }

    /// What a decision changes: the statuses of the asks it opened or moved, and the
    /// dead rows it took out of the inbox.
    pub fn of_decision(d: &Decision) -> Derived {
        let asks = d.asks.iter().map(|a| (a.ask_id.to_string(), a.status.as_str().to_owned())).collect();
        let inbox = d
            .inbox
            .iter()
            .map(|c| (c.outbox_id.clone(), c.state.as_str().to_owned(), d.event_id.to_string()))
            .collect();
        let spend = SpendDelta::of_decision(d).into_iter().collect();
        Derived { asks, inbox, spend, ..Derived::default() }
    }

    /// What the entries change together, in order: a later stage, phone or client wins,
    /// the asks' statuses follow one another, a client's day spend adds up, and a
    /// prompt is kept once.
    pub fn merged<'a>(deltas: impl IntoIterator<Item = &'a Derived>) -> Derived {
        let mut out = Derived::default();
        for d in deltas {
            if d.stage.is_some() {
                out.stage.clone_from(&d.stage);
            }
            if d.driver_phone.is_some() {
                out.driver_phone.clone_from(&d.driver_phone);
            }
            if d.client.is_some() {
                out.client.clone_from(&d.client);
            }
            out.asks.extend(d.asks.iter().cloned());
            out.inbox.extend(d.inbox.iter().cloned());
            out.timers.extend(d.timers.iter().cloned());
            if d.consent.is_some() {
                out.consent.clone_from(&d.consent);
            }
            // One delta per client and day, one text per hash: a store writes each as one
            // row, and one statement cannot change a row twice.
            for s in &d.spend {
                match out.spend.iter_mut().find(|o| o.client == s.client && o.day == s.day) {
                    Some(o) => {
                        o.spend.absorb(&s.spend);
                        o.capped |= s.capped;
                    }
                    None => out.spend.push(s.clone()),
                }
            }
            for p in &d.prompts {
                if !out.prompts.iter().any(|o| o.0 == p.0) {
                    out.prompts.push(p.clone());
                }
            }
        }
        out
    }

    /// Whether the load is still active after this, when the delta says (a stage).
    pub fn active(&self) -> Option<bool> {
        self.stage.as_deref().map(|s| s != STAGE_DELIVERED)
    }

    /// True when the load's facts (phone, active, client) change.
    pub fn changes_facts(&self) -> bool {
        self.stage.is_some() || self.driver_phone.is_some() || self.client.is_some()
    }

    /// True when no ask changes (the stage, if any, is a plain overwrite).
    pub fn asks_unchanged(&self) -> bool {
        self.asks.is_empty()
    }

    /// The summary's asks (`{ask_id: status}` as JSON text) after this delta, and the
    /// counts of open and escalated asks in it. A `before` that is not an object counts
    /// as no asks.
    pub fn fold_asks(&self, before: &str) -> (String, i64, i64) {
        let mut asks = match serde_json::from_str::<Value>(before) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for (id, status) in &self.asks {
            asks.insert(id.clone(), Value::String(status.clone()));
        }
        let count = |s: &str| asks.values().filter(|v| v.as_str() == Some(s)).count() as i64;
        let (open, escalated) = (count("open"), count("escalated"));
        (Value::Object(asks).to_string(), open, escalated)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::decision::DECISION_RECORDED;

    fn entry(kind: &str, payload: Value) -> Entry {
        let id = if kind == DECISION_RECORDED { "dec:e1" } else { "e1" };
        Entry::decode(id, kind, payload)
    }

    fn decision(asks: Value) -> Entry {
        entry(
            DECISION_RECORDED,
            json!({"decision_id": "dec:e1", "event_id": "e1", "decided_at": "2026-03-02T07:00:00Z", "decider": "sop",
                   "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": [], "asks": asks}),
        )
    }

    /// (stage, phone, client, asks, open, escalated) after `entries` over `before`.
    type Want<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>, Value, i64, i64);

    fn check(entries: Vec<Entry>, before: &str, want: Want) {
        let deltas: Vec<Derived> = entries.iter().map(Derived::of).collect();
        let d = Derived::merged(&deltas);
        let (text, open, escalated) = d.fold_asks(before);
        let asks = serde_json::from_str::<Value>(&text).unwrap();
        let got = (d.stage.as_deref(), d.driver_phone.as_deref(), d.client.as_deref(), asks, open, escalated);
        assert_eq!(got, want, "{entries:?}");
        assert_eq!(d.changes_facts(), d.stage.is_some() || d.driver_phone.is_some() || d.client.is_some());
    }

    #[test]
    fn the_delta_is_the_last_stage_phone_and_client_and_each_asks_last_status() {
        let update = |p: Value| entry("load_update", p);
        check(vec![], "{}", (None, None, None, json!({}), 0, 0));
        check(vec![update(json!({"stage": "in_transit"}))], "{}", (Some("in_transit"), None, None, json!({}), 0, 0));
        check(vec![update(json!({"client": "c"}))], "{}", (None, None, Some("c"), json!({}), 0, 0));
        check(
            vec![
                update(json!({"driver_phone": "+15555550100", "stage": "at_pickup", "client": "a"})),
                update(json!({"stage": "delivered", "client": "b"})),
                update(json!({"stage": "delivered"})),
            ],
            "{}",
            (Some("delivered"), Some("+15555550100"), Some("b"), json!({}), 0, 0),
        );
        check(
            vec![decision(json!([{"ask_id": "ask:eta_request:p1", "step": 1, "status": "open"}]))],
            r#"{"ask:eta_request:p0":"escalated"}"#,
            (None, None, None, json!({"ask:eta_request:p0": "escalated", "ask:eta_request:p1": "open"}), 1, 1),
        );
        check(
            vec![decision(json!([{"ask_id": "ask:eta_request:p1", "step": 2, "status": "answered"}]))],
            r#"{"ask:eta_request:p1":"open"}"#,
            (None, None, None, json!({"ask:eta_request:p1": "answered"}), 0, 0),
        );
        // What this build cannot read changes nothing; a broken summary counts as none.
        check(
            vec![entry("load_update", json!({"stage": 3})), decision(json!("x"))],
            "not json",
            (None, None, None, json!({}), 0, 0),
        );
    }

    /// The timers of several entries are written in their order, each entry's own.
    #[test]
    fn timer_writes_follow_one_another_in_the_entries_order() {
        let timer_id = crate::TimerId::parse("tmr:L1:ask:eta_request:p1:1").unwrap();
        let fire_at: crate::Timestamp = "2026-03-02T07:30:00Z".parse().unwrap();
        let schedule = TimerWrite::Schedule { timer_id: timer_id.clone(), fire_at };
        let cancel = TimerWrite::Cancel { timer_id };
        assert!(schedule.is_schedule() && !cancel.is_schedule());
        let d = |t: &TimerWrite| Derived { timers: vec![t.clone()], ..Derived::default() };
        assert_eq!(Derived::merged(&[d(&schedule), Derived::default(), d(&cancel)]).timers, [schedule, cancel]);
    }

    /// An inbound STOP or START is its sender's consent, whichever load it reached; the
    /// last in an append wins.
    #[test]
    fn an_inbound_stop_or_start_changes_its_senders_consent() {
        let sms =
            |id: &str, body: &str| Entry::decode(id, "inbound_sms", json!({"from": "+15555550100", "body": body}));
        let consent = |entries: &[Entry]| {
            let deltas: Vec<Derived> = entries.iter().map(Derived::of).collect();
            Derived::merged(&deltas).consent.map(|(c, id)| (c.phone, c.opted_out, id))
        };
        let phone = "+15555550100".to_owned();
        assert_eq!(consent(&[sms("e1", " stop ")]), Some((phone.clone(), true, "e1".into())));
        assert_eq!(
            consent(&[sms("e1", "STOP"), sms("e2", "eta 9"), sms("e3", "START")]),
            Some((phone.clone(), false, "e3".into()))
        );
        assert_eq!(consent(&[sms("e1", "STOP"), sms("e2", "HELP")]), Some((phone, true, "e1".into())));
        assert_eq!(consent(&[sms("e1", "running late")]), None);
        assert_eq!(consent(&[entry("load_update", json!({"driver_phone": "+15555550100"}))]), None);
    }

    #[test]
    fn a_load_is_active_until_delivered() {
        let d = |stage: Option<&str>| Derived { stage: stage.map(str::to_owned), ..Derived::default() };
        assert_eq!(d(None).active(), None);
        assert_eq!(d(Some("in_transit")).active(), Some(true));
        assert_eq!(d(Some(STAGE_DELIVERED)).active(), Some(false));
        assert!(!d(None).changes_facts() && d(Some("x")).changes_facts());
    }

    #[test]
    fn only_a_decision_with_asks_changes_the_asks() {
        assert!(Derived::of(&entry("load_update", json!({"stage": "in_transit"}))).asks_unchanged());
        assert!(Derived::of(&decision(json!([]))).asks_unchanged());
        let opened = decision(json!([{"ask_id": "ask:eta_request:p1", "step": 1, "status": "open"}]));
        assert!(!Derived::of(&opened).asks_unchanged());
    }

    /// A decision's model call adds to its client's day; one that found the day's
    /// budget spent caps it; a load's own budget or no model call changes no day.
    #[test]
    fn a_model_call_adds_to_its_clients_day() {
        let check = |extra: Value, want: Option<(&str, &str, u64, u64, u64, bool)>| {
            let mut payload = json!({"decision_id": "dec:e1", "event_id": "e1", "decided_at": "2026-03-02T23:59:59Z",
                "decider": "llm:m", "filtered": false, "needs_hero_task": false, "rationale": "r", "actions": []});
            for (k, v) in extra.as_object().unwrap() {
                payload[k] = v.clone();
            }
            let d = Derived::of(&entry(DECISION_RECORDED, payload.clone()));
            let got: Vec<_> = d
                .spend
                .iter()
                .map(|s| {
                    (
                        s.client.as_str(),
                        s.day.as_str(),
                        s.spend.tokens(),
                        s.spend.cost_micro_usd,
                        s.spend.calls,
                        s.capped,
                    )
                })
                .collect();
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{payload}");
            // Twice the same decision: one delta of that client's day with twice its spend.
            let twice = Derived::merged([&d, &d]);
            let doubled: Vec<_> = d
                .spend
                .iter()
                .map(|s| (s.client.as_str(), s.day.as_str(), 2 * s.spend.tokens(), 2 * s.spend.calls, s.capped))
                .collect();
            let got: Vec<_> = twice
                .spend
                .iter()
                .map(|s| (s.client.as_str(), s.day.as_str(), s.spend.tokens(), s.spend.calls, s.capped))
                .collect();
            assert_eq!(got, doubled, "{payload}");
        };
        let usage = |client: Value| {
            json!({"model": "m", "input_tokens": 100, "output_tokens": 20, "cost_micro_usd": 7,
                   "prompt_hash": "p", "input_hash": "i", "client": client})
        };
        check(json!({}), None);
        check(json!({"llm": usage(json!("acme"))}), Some(("acme", "2026-03-02", 120, 7, 1, false)));
        check(json!({"llm": usage(Value::Null)}), Some(("", "2026-03-02", 120, 7, 1, false)));
        let budget = |scope: &str| json!({"scope": scope, "client": "acme", "unit": "tokens", "limit": 1, "spent": 2, "first": true});
        check(json!({"budget": budget("client_day")}), Some(("acme", "2026-03-02", 0, 0, 0, true)));
        check(json!({"budget": budget("load")}), None);
        // Days of other clients, or other days, stay apart; a capped day stays capped.
        let day = |client: &str, day: &str, calls: u64, capped: bool| Derived {
            spend: vec![SpendDelta {
                client: client.into(),
                day: day.into(),
                spend: Spend { calls, ..Spend::default() },
                capped,
            }],
            ..Derived::default()
        };
        let merged = Derived::merged([
            &day("acme", "2026-03-02", 1, true),
            &day("beta", "2026-03-02", 1, false),
            &day("acme", "2026-03-03", 1, false),
            &day("acme", "2026-03-02", 2, false),
        ]);
        let got: Vec<_> =
            merged.spend.iter().map(|s| (s.client.as_str(), s.day.as_str(), s.spend.calls, s.capped)).collect();
        assert_eq!(
            got,
            [("acme", "2026-03-02", 3, true), ("beta", "2026-03-02", 1, false), ("acme", "2026-03-03", 1, false)]
        );
        // A prompt is kept once, its first text.
        let with = |prompts: &[(&str, &str)]| Derived {
            prompts: prompts.iter().map(|(h, t)| (h.to_string(), t.to_string())).collect(),
            ..Derived::default()
        };
        let merged = Derived::merged([&with(&[("h1", "a"), ("h2", "b")]), &with(&[("h1", "c")])]);
        let texts = [("h1", "a"), ("h2", "b")].map(|(h, t)| (h.to_owned(), t.to_owned()));
        assert_eq!(merged.prompts, texts.to_vec());
    }
}
