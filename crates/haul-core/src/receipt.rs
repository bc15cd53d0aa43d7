//! Delivery receipts: what an SMS service reports of a message after it took it (Twilio's
//! status callbacks), and the failed `action_outcome` a message that will not arrive
//! becomes.
//!
//! One function for every door: the webhook (`POST /v1/webhooks/twilio/status`) and the
//! eval scenarios' `sms_status` make the same outcome from the same report, so what an
//! eval shows is what production does. The outcome's event id is the one the dispatcher
//! gives a failed row: several reports of one message, a replay, and a row the
//! dispatcher buried itself all make one failed outcome.

use crate::dispatch::{Row, outcome_event};
use crate::event::InboundEvent;
use crate::ids::is_message_sid;
use crate::outcome::OutcomeStatus;

/// Every `MessageStatus` Twilio sends for an outbound message.
pub const MESSAGE_STATUSES: &[&str] = &[
    "accepted",
    "scheduled",
    "canceled",
    "queued",
    "sending",
    "sent",
    "failed",
    "delivered",
    "undelivered",
    "receiving",
    "received",
    "read",
    "partially_delivered",
];

/// How a failure a delivery report made begins (`twilio status undelivered: …`).
pub const FAILURE_PREFIX: &str = "twilio status ";

/// Whether an outcome's failure came from a delivery report, not from a send: the
/// service took the message, then reported it undelivered.
pub fn is_report_failure(failure: &str) -> bool {
    failure.starts_with(FAILURE_PREFIX)
}

/// Longest error code taken, in digits.
const MAX_ERROR_CODE_DIGITS: usize = 10;

/// What a person reads for Twilio's commonest delivery errors.
pub fn error_meaning(code: &str) -> &'static str {
    match code {
        "30003" => "unreachable handset (off or out of coverage)",
        "30004" => "message blocked by the handset or the carrier",
        "30005" => "unknown number: it may no longer be in service",
        "30006" => "landline or unreachable carrier: call instead",
        "30007" => "filtered by the carrier",
        "30008" => "unknown carrier error",
        "21610" => "the driver opted out (replied STOP)",
        _ => "see Twilio's error reference",
    }
}

/// A delivery report, checked: the message's sid, its status, the service's error code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryReport {
    pub sid: String,
    pub status: String,
    pub error_code: Option<String>,
}

impl DeliveryReport {
    /// The report in a status callback's form fields (`MessageSid`, `MessageStatus`,
    /// `ErrorCode`), or the first field that is wrong, named.
    pub fn from_form(params: &[(String, String)]) -> Result<DeliveryReport, String> {
        let field = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        Self::new(field("MessageSid"), field("MessageStatus"), field("ErrorCode"))
    }

    /// The report of these fields, or the first that is wrong, named as Twilio names it.
    pub fn new(sid: Option<&str>, status: Option<&str>, error_code: Option<&str>) -> Result<DeliveryReport, String> {
        let sid = match sid {
            None | Some("") => return Err("MessageSid is missing".into()),
            Some(sid) if !is_message_sid(sid) => return Err("MessageSid is not a message SID".into()),
            Some(sid) => sid.to_owned(),
        };
        let status = match status {
            None | Some("") => return Err("MessageStatus is missing".into()),
            Some(status) if !MESSAGE_STATUSES.contains(&status) => {
                let shown: String = status.chars().take(40).collect();
                return Err(format!("MessageStatus {shown:?} is not a status Twilio sends"));
            }
            Some(status) => status.to_owned(),
        };
        let error_code = match error_code {
            None | Some("") => None,
            Some(code) if code.len() <= MAX_ERROR_CODE_DIGITS && code.bytes().all(|b| b.is_ascii_digit()) => {
                Some(code.to_owned())
            }
            Some(_) => return Err("ErrorCode is not a number".into()),
        };
        Ok(DeliveryReport { sid, status, error_code })
    }

    /// Whether the message will not arrive.
    pub fn failed(&self) -> bool {
        matches!(self.status.as_str(), "failed" | "undelivered")
    }

    /// Whether it says how the message ended (arrived, or will not): the reports kept;
    /// the others (queued, sent, …) are steps on the way, counted only.
    pub fn is_final(&self) -> bool {
        self.failed() || self.status == "delivered"
    }

    /// The failure a failed outcome carries: the status, the code and what it means.
    pub fn failure(&self) -> String {
        match &self.error_code {
            Some(code) => {
                let meaning = error_meaning(code);
                format!("{FAILURE_PREFIX}{}: error {code}, {meaning} (message {})", self.status, self.sid)
            }
            None => format!("{FAILURE_PREFIX}{} (message {})", self.status, self.sid),
        }
    }

    /// The failed `action_outcome` of `row` when the message will not arrive; `None`
    /// when it may (a `delivered`, `sent` or `queued` report changes nothing).
    pub fn outcome(&self, row: &Row) -> Option<InboundEvent> {
        self.failed().then(|| outcome_event(row, OutcomeStatus::Failed, Some(&self.sid), Some(&self.failure())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ActionType;
    use crate::event::EventBody;
    use crate::ids::LoadId;
    use crate::time::Timestamp;

    #[test]
    fn a_report_is_checked_field_by_field() {
        let check = |pairs: &[(&str, &str)], want: Result<(&str, &str, Option<&str>), &str>| {
            let form: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let want = want
                .map(|(sid, status, code)| DeliveryReport {
                    sid: sid.into(),
                    status: status.into(),
                    error_code: code.map(str::to_owned),
                })
                .map_err(str::to_owned);
            assert_eq!(DeliveryReport::from_form(&form), want, "{pairs:?}");
        };
        check(&[("MessageSid", "SM1"), ("MessageStatus", "delivered")], Ok(("SM1", "delivered", None)));
        check(
            &[("MessageSid", "SM1"), ("MessageStatus", "undelivered"), ("ErrorCode", "30006")],
            Ok(("SM1", "undelivered", Some("30006"))),
        );
        check(&[("MessageSid", "SM1"), ("MessageStatus", "sent"), ("ErrorCode", "")], Ok(("SM1", "sent", None)));
        check(
            &[("MessageSid", "SM1"), ("MessageStatus", "failed"), ("ErrorCode", "1234567890")],
            Ok(("SM1", "failed", Some("1234567890"))),
        );
        check(&[("MessageStatus", "failed")], Err("MessageSid is missing"));
        check(&[("MessageSid", ""), ("MessageStatus", "failed")], Err("MessageSid is missing"));
        check(&[("MessageSid", "SM/1"), ("MessageStatus", "failed")], Err("MessageSid is not a message SID"));
        check(&[("MessageSid", "SM1")], Err("MessageStatus is missing"));
        check(&[("MessageSid", "SM1"), ("MessageStatus", "")], Err("MessageStatus is missing"));
        check(
            &[("MessageSid", "SM1"), ("MessageStatus", "lost")],
            Err("MessageStatus \"lost\" is not a status Twilio sends"),
        );
        check(
            &[("MessageSid", "SM1"), ("MessageStatus", "failed"), ("ErrorCode", "3x")],
            Err("ErrorCode is not a number"),
        );
        check(
            &[("MessageSid", "SM1"), ("MessageStatus", "failed"), ("ErrorCode", "12345678901")],
            Err("ErrorCode is not a number"),
        );
    }

    fn report(status: &str, code: Option<&str>) -> DeliveryReport {
        DeliveryReport { sid: "SM1".into(), status: status.into(), error_code: code.map(str::to_owned) }
    }

    /// The reports kept are those that say how the message ended; the steps on the way
    /// are counted only.
    #[test]
    fn a_report_is_final_when_the_message_arrived_or_never_will() {
        for status in MESSAGE_STATUSES {
            let report = DeliveryReport::new(Some("SM1"), Some(status), None).unwrap();
            let want = matches!(*status, "delivered" | "undelivered" | "failed");
            assert_eq!(report.is_final(), want, "{status}");
        }
    }

    #[test]
    fn only_a_message_that_will_not_arrive_is_a_failed_outcome() {
        let row = Row {
            outbox_id: "L1/ask:eta_request:p1/1/send_sms".into(),
            load_id: LoadId::parse("L1").unwrap(),
            action_type: ActionType::SendSms,
            attempts: 0,
            first_attempt_at: None,
            created_at: Timestamp::UNIX_EPOCH,
            trace: None,
        };
        for status in MESSAGE_STATUSES {
            let outcome = report(status, Some("30006")).outcome(&row);
            assert_eq!(outcome.is_some(), ["failed", "undelivered"].contains(status), "{status}");
        }
        let event = report("undelivered", Some("30006")).outcome(&row).unwrap();
        assert_eq!(event.event_id.as_str(), "evt:out:L1/ask:eta_request:p1/1/send_sms:failed");
        let EventBody::ActionOutcome(o) = &event.body else { panic!("{event:?}") };
        assert_eq!((o.status, o.receipt.as_deref()), (OutcomeStatus::Failed, Some("SM1")));
        assert_eq!(
            o.failure.as_deref(),
            Some("twilio status undelivered: error 30006, landline or unreachable carrier: call instead (message SM1)")
        );
        assert_eq!(report("failed", None).failure(), "twilio status failed (message SM1)");
        assert!(is_report_failure(&report("failed", None).failure()));
        assert!(!is_report_failure("HTTP 400: twilio error 21610: unsubscribed"));
        assert_eq!(
            report("failed", Some("99999")).failure(),
            "twilio status failed: error 99999, see Twilio's error reference (message SM1)"
        );
        for (code, meaning) in [
            ("30003", "unreachable handset"),
            ("30004", "blocked"),
            ("30005", "unknown number"),
            ("30007", "filtered"),
            ("30008", "unknown carrier error"),
            ("21610", "opted out"),
        ] {
            assert!(error_meaning(code).contains(meaning), "{code}");
        }
    }
}
