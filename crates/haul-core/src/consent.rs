//! A driver's consent to SMS: STOP and START, as US carriers and the FCC require them
//! honoured, whichever decider a load runs under.
//!
//! An SMS from the driver that is a keyword, and nothing else (any case, surrounding
//! whitespace and punctuation ignored), is decided in the deterministic filter
//! (`filter.rs`),
//! before any decider: STOP (STOPALL, UNSUBSCRIBE, CANCEL, END, QUIT) opts the
//! driver's phone out; START (UNSTOP, YES) opts it back in (from a phone that is not
//! opted out, it is an ordinary SMS, the decider's); HELP (INFO) is Twilio's to answer
//! and changes nothing. Twilio refusing a send because the number opted out
//! (error 21610) opts it out too. The projection keeps the opt-out
//! (`LoadState::sms_opt_out`); while it holds, the SOP decides no SMS to that phone
//! (an ask goes to a person: "driver opted out of SMS: call them"), the LLM's
//! `send_sms` does not validate, and no operator action can send one.

/// The decider a consent keyword's decision names.
pub const CONSENT_DECIDER: &str = "consent";

/// Twilio's refusal of a send to a number that opted out.
pub const OPTED_OUT_REFUSAL: &str = "twilio error 21610";

/// The dispatcher's refusal of a send to a phone the consent ledger has opted out
/// (a STOP that reached another load, or none): what Twilio would answer, said first.
pub const LEDGER_REFUSAL: &str = "not sent: the phone opted out of SMS (consent ledger)";

/// What a keyword SMS asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyword {
    OptOut,
    OptIn,
    Help,
}

/// The keyword `body` is, when the whole message is one.
pub fn keyword(body: &str) -> Option<Keyword> {
    let word = body.trim_matches(|c: char| c.is_whitespace() || c.is_ascii_punctuation()).to_ascii_uppercase();
    match word.as_str() {
        "STOP" | "STOPALL" | "UNSUBSCRIBE" | "CANCEL" | "END" | "QUIT" => Some(Keyword::OptOut),
        "START" | "UNSTOP" | "YES" => Some(Keyword::OptIn),
        "HELP" | "INFO" => Some(Keyword::Help),
        _ => None,
    }
}

/// The failure of an SMS the dispatcher did not send: the ledger's opt-out, and the
/// event that made it.
pub fn ledger_refusal(event_id: &str, at: crate::time::Timestamp) -> String {
    format!("{LEDGER_REFUSAL}: {event_id} at {at}")
}

/// Whether a send's failure is the service, or the dispatcher, refusing an opted-out
/// number.
pub fn refused_as_opted_out(failure: &str) -> bool {
    failure.contains(OPTED_OUT_REFUSAL) || failure.starts_with(LEDGER_REFUSAL)
}

/// What an SMS does to its sender's consent across loads (the per-phone ledger the
/// store keeps, `sms_consent`): STOP opts the phone out, START opts it back in; HELP
/// and any other text change nothing. The ledger is what a load the STOP never reached
/// (a later load of the same driver) learns it from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsentChange {
    pub phone: String,
    pub opted_out: bool,
}

impl ConsentChange {
    /// The change an SMS `from` with `body` makes, when it makes one.
    pub fn of_sms(from: &str, body: &str) -> Option<ConsentChange> {
        let opted_out = match keyword(body)? {
            Keyword::OptOut => true,
            Keyword::OptIn => false,
            Keyword::Help => return None,
        };
        (!from.is_empty()).then(|| ConsentChange { phone: from.to_owned(), opted_out })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_whole_messages_in_any_case() {
        let check = |body: &str, want: Option<Keyword>| assert_eq!(keyword(body), want, "{body:?}");
        for stop in ["STOP", "stop", " Stop. ", "STOPALL", "unsubscribe", "Cancel!", "END", "quit", "\"STOP\""] {
            check(stop, Some(Keyword::OptOut));
        }
        for start in ["START", "unstop", "Yes", "yes!"] {
            check(start, Some(Keyword::OptIn));
        }
        check("HELP", Some(Keyword::Help));
        check("info?", Some(Keyword::Help));
        for other in ["", "please stop texting me", "STOP IT", "stopp", "ETA 9:15", "no", "S T O P"] {
            check(other, None);
        }
    }

    #[test]
    fn an_sms_changes_its_senders_consent_only_when_it_is_stop_or_start() {
        let check = |from: &str, body: &str, want: Option<bool>| {
            let got = ConsentChange::of_sms(from, body);
            assert_eq!(got.as_ref().map(|c| c.opted_out), want, "{from:?} {body:?}");
            if let Some(c) = got {
                assert_eq!(c.phone, from);
            }
        };
        check(PHONE, "Stop", Some(true));
        check(PHONE, "unsubscribe.", Some(true));
        check(PHONE, "START", Some(false));
        check(PHONE, "yes", Some(false));
        check(PHONE, "HELP", None);
        check(PHONE, "ETA 9:15", None);
        check("", "STOP", None);
    }

    #[test]
    fn both_refusals_are_opt_outs_and_nothing_else_is() {
        assert!(refused_as_opted_out("HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient"));
        assert!(refused_as_opted_out(&ledger_refusal("sms:SM1", at(0))));
        assert_eq!(ledger_refusal("sms:SM1", at(0)), format!("{LEDGER_REFUSAL}: sms:SM1 at 2026-03-02T07:00:00Z"));
        assert!(!refused_as_opted_out("HTTP 400: twilio error 21211: invalid To"));
        assert!(!refused_as_opted_out(&format!("timeout; {LEDGER_REFUSAL}")));
    }

    use crate::action::{ActionKind, ActionType, Urgency};
    use crate::decision::{AskStatus, Decision};
    use crate::projection::{LoadState, Record, project};
    use crate::sop::{Policies, decide as sop_decide};
    use crate::testing::{PHONE, ev, load};
    use crate::time::Timestamp;
    use serde_json::json;

    fn at(min: u64) -> Timestamp {
        crate::time::add("2026-03-02T07:00:00Z".parse().unwrap(), std::time::Duration::from_secs(min * 60))
    }

    /// A load's life as the worker runs it: the filter, then the SOP.
    struct Load {
        records: Vec<Record>,
    }

    impl Load {
        fn new() -> Self {
            let mut l = Load { records: vec![] };
            l.run(
                0,
                json!({"event_id": "load:init", "kind": "load_update", "driver_phone": PHONE, "stage": "in_transit"}),
            );
            l
        }

        fn state(&self) -> LoadState {
            project(&self.records)
        }

        /// The decision on `event` at minute `min`: its decider and action types.
        fn run(&mut self, min: u64, event: serde_json::Value) -> (String, Vec<&'static str>, Decision) {
            let e = ev(event);
            let state = self.state();
            let d = crate::filter::filter(&load(), &state, &e, at(min))
                .unwrap_or_else(|| sop_decide(&Policies::default(), &load(), &state, &e, at(min)));
            self.records.extend(Record::appended(self.records.len() as u64, &e, &d, at(min)));
            let types = d.actions.iter().map(|a| a.kind.action_type().as_str()).collect();
            (d.decider.clone(), types, d)
        }
    }

    fn ping(id: &str) -> serde_json::Value {
        json!({"event_id": id, "kind": "location_ping", "lat": 1.0, "lon": 2.0, "risk": "high"})
    }

    fn sms(id: &str, from: &str, body: &str) -> serde_json::Value {
        json!({"event_id": id, "kind": "inbound_sms", "from": from, "body": body})
    }

    #[test]
    fn stop_closes_the_ask_asks_a_person_and_no_sms_follows_until_start() {
        let mut l = Load::new();
        let (_, types, _) = l.run(0, ping("ping_0700"));
        assert_eq!(types, ["send_sms", "set_timer"]);
        // STOP from the driver: consent's, not an answer; the ask closed, its timer canceled.
        let (decider, types, d) = l.run(5, sms("sms:SM1", PHONE, " stop. "));
        assert_eq!((decider.as_str(), types), (CONSENT_DECIDER, vec!["cancel_timer", "create_hero_task"]));
        assert!(d.needs_hero_task);
        let ActionKind::CreateHeroTask { title, body, urgency } = &d.actions[1].kind else { panic!() };
        assert_eq!((title.as_str(), *urgency), ("Load 481207: driver opted out of SMS, call them", Urgency::Urgent));
        assert!(body.contains("***0100") && !body.contains(PHONE), "{body}");
        assert_eq!(d.asks[0].status, AskStatus::Closed);
        let state = l.state();
        assert!(state.sms_opted_out() && state.sms_phone().is_none());
        assert_eq!(state.sms_opt_out.as_ref().map(|o| o.event_id.as_str()), Some("sms:SM1"));
        // A high-risk ping while opted out: a person calls, no SMS.
        let (decider, types, _) = l.run(10, ping("ping_0710"));
        assert_eq!((decider.as_str(), types), ("sop", vec!["create_hero_task"]));
        // An LLM's send_sms to that phone does not validate.
        let send = ev(ping("ping_0711"));
        let mut candidate = sop_decide(&Policies::default(), &load(), &Load::new().state(), &send, at(11));
        assert!(candidate.actions.iter().any(|a| a.kind.action_type() == ActionType::SendSms));
        candidate.decider = "llm:test".into();
        let refused = crate::validate::validate_decision(&load(), &l.state(), &send, &candidate).unwrap_err();
        assert!(refused.contains("opted out"), "{refused}");
        // HELP changes nothing; a STOP from another number is not the driver's consent.
        let (decider, types, _) = l.run(12, sms("sms:SM2", PHONE, "HELP"));
        assert_eq!((decider.as_str(), types.len()), (CONSENT_DECIDER, 0));
        assert!(l.state().sms_opted_out());
        let (decider, _, _) = l.run(13, sms("sms:SM3", "+15555550199", "START"));
        assert_eq!(decider, "sop", "a stranger's START is an SMS for a person");
        assert!(l.state().sms_opted_out());
        // STOP again: nothing new for a person.
        let (decider, types, _) = l.run(13, sms("sms:SM5", PHONE, "STOP"));
        assert_eq!((decider.as_str(), types.len()), (CONSENT_DECIDER, 0));
        // START from the driver: SMS again.
        let (decider, types, _) = l.run(14, sms("sms:SM4", PHONE, "Start"));
        assert_eq!((decider.as_str(), types.len()), (CONSENT_DECIDER, 0));
        assert!(!l.state().sms_opted_out() && l.state().sms_opt_out.is_none());
        let (_, types, _) = l.run(20, ping("ping_0720"));
        assert_eq!(types, ["send_sms", "set_timer"]);
        // YES from a driver who never opted out answers the ask (rule 4), as before.
        let (decider, types, d) = l.run(21, sms("sms:SM6", PHONE, "yes"));
        assert_eq!((decider.as_str(), types), ("sop", vec!["cancel_timer"]), "{}", d.rationale);
    }

    #[test]
    fn a_refusal_for_an_opted_out_number_opts_the_phone_out_and_a_new_phone_starts_afresh() {
        let mut l = Load::new();
        l.run(0, ping("ping_0700"));
        let id = "481207/ask:eta_request:ping_0700/1/send_sms";
        let refused = |failure: &str| {
            json!({"event_id": format!("evt:out:{id}:failed"), "kind": "action_outcome", "outbox_id": id,
                   "action_type": "send_sms", "status": "failed", "failure": failure,
                   "hero_channel": false, "internal": false})
        };
        let mut other = Load::new();
        other.run(0, ping("ping_0700"));
        other.run(1, refused("HTTP 400: twilio error 21211: invalid"));
        assert!(!other.state().sms_opted_out(), "another refusal is not an opt-out");
        l.run(1, refused("HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient"));
        assert!(l.state().sms_opted_out());
        // The step-1 timer fires: no follow-up SMS, a person.
        let t = "tmr:481207:ask:eta_request:ping_0700:1";
        let timer = json!({"event_id": format!("evt:{t}"), "kind": "timer_fired", "timer_id": t,
                           "ask_id": "ask:eta_request:ping_0700", "step": 1, "fire_at": at(30)});
        let (_, types, d) = l.run(30, timer);
        assert!(!types.contains(&"send_sms") && types.contains(&"create_hero_task"), "{types:?}");
        assert!(d.rationale.contains("opted out"), "{}", d.rationale);
        // A new driver phone is not opted out.
        l.run(40, json!({"event_id": "u2", "kind": "load_update", "driver_phone": "+15555550111"}));
        assert!(!l.state().sms_opted_out());
        assert_eq!(l.state().sms_phone(), Some("+15555550111"));
        // The prompt says so only while it holds.
        let policy = crate::sop::EtaPolicy::default();
        let e = ev(ping("ping_0800"));
        assert!(
            crate::tools::prompt_input(&load(), &l.state(), &e, &policy, at(41))["state"]
                .get("sms_opted_out")
                .is_none()
        );
        let mut stopped = Load::new();
        stopped.run(1, sms("sms:SM1", PHONE, "STOP"));
        assert_eq!(
            crate::tools::prompt_input(&load(), &stopped.state(), &e, &policy, at(41))["state"]["sms_opted_out"],
            true
        );
    }

    #[test]
    fn an_operators_assigned_stop_is_the_drivers_opt_out() {
        let mut l = Load::new();
        l.run(0, ping("ping_0700"));
        let assign = |id: &str, sid: &str, body: &str| {
            json!({"event_id": id, "kind": "operator_action", "actor": "ana", "reason": "it is theirs",
                   "command": {"type": "assign_sms", "message_sid": sid, "from": PHONE, "body": body}})
        };
        let (decider, types, d) = l.run(5, assign("op:r1", "SM7", "Stop"));
        assert_eq!(
            (decider.as_str(), types),
            ("operator", vec!["cancel_timer", "create_hero_task"]),
            "{}",
            d.rationale
        );
        assert!(l.state().sms_opted_out());
        let (_, types, _) = l.run(10, ping("ping_0710"));
        assert_eq!(types, ["create_hero_task"]);
        l.run(12, assign("op:r2", "SM8", "START"));
        assert!(!l.state().sms_opted_out());
    }

    #[test]
    fn a_21610_refusal_is_an_opt_out() {
        assert!(refused_as_opted_out("HTTP 400: twilio error 21610: Attempt to send to unsubscribed recipient"));
        assert!(!refused_as_opted_out("HTTP 400: twilio error 21211: invalid To"));
        assert!(!refused_as_opted_out("HTTP 500: 21610"));
    }
}
