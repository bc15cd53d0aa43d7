//! What the dispatcher does with a claimed row, as a plan of effects (ADR 0003).
//!
//! After a row's send, everything that follows is decided here, from the row's facts,
//! the send's result, `now`, the `RetryPolicy`, a jitter draw and the queue mode: the
//! outcome is published before the row is marked (a crash between them re-sends and
//! re-publishes, both deduplicated; the reverse order could lose the outcome), when a
//! failure is retried and when the row is buried, which OpsAlert a dead row's channel
//! class calls for and that it is raised only once the outcome is published. The
//! runtime executes a plan's effects in order and comes back here when one fails;
//! it decides nothing itself, so the rules are tested as data.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::action::{ActionType, ChannelClass, ServiceCall};
use crate::channel::Channel;
use crate::event::{ActionOutcome, EventBody, InboundEvent};
use crate::ids::{LoadId, action_outcome_event_id, ops_alert_key};
use crate::outcome::OutcomeStatus;
use crate::queue_mode::QueueMode;
use crate::retry::{RetryDecision, RetryPolicy};
use crate::time::{Timestamp, add};
use crate::trace::TraceParent;

/// What the plans need to know about a claimed (or dead) row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub outbox_id: String,
    pub load_id: LoadId,
    pub action_type: ActionType,
    /// Failed attempts before this one.
    pub attempts: u32,
    /// Set on the row's first claim; the retry budget runs from it.
    pub first_attempt_at: Option<Timestamp>,
    /// When the worker made it: a 429 holds it back without an attempt only for
    /// [`THROTTLE_WINDOW`] from here.
    pub created_at: Timestamp,
    /// The trace context of the run that decided the row: its sends continue it, and
    /// its outcome is published with it (so the outcome's run links back to the decision).
    pub trace: Option<TraceParent>,
}

/// How a send ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The service (or the TimerStore) applied it; its receipt.
    Delivered { receipt: String },
    /// It may succeed later.
    Retryable(String),
    /// It will not succeed by retrying.
    Permanent(String),
    /// The service is over its rate (429) and said when to come back (`Retry-After`).
    Throttled { retry_after: Duration, why: String },
}

/// The longest `Retry-After` honoured: a longer one holds the row this long and no more.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);
/// The shortest wait after a 429, whatever its `Retry-After` says (`0` included), so a
/// throttled row is never claimed again in the same breath.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long after its row was made a 429 holds it back without spending an attempt.
/// Past it a 429 is a failed attempt like any other: a service that never stops
/// answering 429 still ends in a dead row (and its Hero task), not a row held forever.
pub const THROTTLE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// One thing the dispatcher does to the queue, the outbox or the ops service.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Publish an `action_outcome` to the load queue.
    Publish(InboundEvent),
    /// Mark the row dispatched (needs the claim).
    MarkDispatched { receipt: String },
    /// `Publish` then `MarkDispatched` in one transaction of the store that is also
    /// the queue ([`QueueMode::StoreQueue`]).
    PublishAndMark { event: InboundEvent, receipt: String },
    /// Record a failed attempt; the row is due again at `retry_at` (needs the claim).
    MarkRetry { retry_at: Timestamp, attempts: u32, failure: String },
    /// Mark the row dead (needs the claim).
    MarkDead { failure: String },
    /// Hold the row back until `until` with no attempt spent, `note` saying why (needs
    /// the claim).
    Hold { until: Timestamp, note: String },
    /// Hold the row's channel back until `until` too, when it has a send rate (best
    /// effort: a failure leaves the other dispatchers to meet the 429 themselves).
    PauseChannel { until: Timestamp },
    /// Send an OpsAlert to the ops service.
    RaiseAlert(Alert),
    /// Record that a dead row's outcome (and alert) went out, so the sweep leaves it.
    MarkOutcomePublished,
}

/// What a failed effect means. A stale claim always stops the plan: the row is
/// another dispatcher's, and every later effect would be refused too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfFailed {
    /// The attempt failed: plan again with [`after_failure`], the effect's error as
    /// the reason.
    FailAttempt,
    /// The send was delivered and its outcome published, and marking the row failed:
    /// a failed attempt too, planned with [`after_mark_failure`]. The row backs off and
    /// is sent again (the service and the queue dedupe both), and once its attempts are
    /// spent it is buried with no failed outcome: its delivered one is out.
    FailMark,
    /// Stop: nothing more is done, the lease lapses and the row is claimed again.
    Stop,
    /// Best effort: the later `LeaveToSweep` steps are skipped (an alert only after
    /// its outcome, the settled mark only after both) and the others still run; the
    /// sweep repeats the skipped ones on a later pass.
    LeaveToSweep,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub effect: Effect,
    pub if_failed: IfFailed,
}

/// How a row ends when every step of its plan succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    Delivered,
    Retrying {
        retry_at: Timestamp,
    },
    /// Held back, no attempt spent; due again at `until`.
    Held {
        until: Timestamp,
    },
    Buried,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub settled: Settled,
}

/// What comes after a send.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    Plan(Plan),
    /// The attempt failed for this reason: the plan is [`after_failure`]'s, with the
    /// row's jitter for this attempt ([`crate::retry::jitter`]).
    AttemptFailed(String),
    /// The send was delivered, its outcome published, and the mark failed for this
    /// reason: the plan is [`after_mark_failure`]'s.
    MarkFailed(String),
}

/// The OpsAlert a dead row's channel class calls for: a failed Hero-channel or
/// internal action is an infrastructure incident, never a Hero task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    HeroChannelFailure,
    InternalFailure,
}

impl AlertKind {
    pub const ALL: [AlertKind; 2] = [AlertKind::HeroChannelFailure, AlertKind::InternalFailure];

    pub fn for_class(class: ChannelClass) -> Option<AlertKind> {
        match class {
            ChannelClass::External => None,
            ChannelClass::HeroChannel => Some(AlertKind::HeroChannelFailure),
            ChannelClass::Internal => Some(AlertKind::InternalFailure),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::HeroChannelFailure => "hero_channel_failure",
            AlertKind::InternalFailure => "internal_failure",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        AlertKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub kind: AlertKind,
    pub outbox_id: String,
    pub load_id: LoadId,
    pub action_type: ActionType,
    pub failure: String,
}

impl Alert {
    /// The ops service's idempotency key: one alert per row, however often raised.
    pub fn key(&self) -> String {
        ops_alert_key(&self.outbox_id)
    }

    pub fn call(&self) -> ServiceCall {
        ServiceCall {
            channel: Channel::Ops,
            path: "/v1/alerts".into(),
            body: json!({
                "kind": self.kind.as_str(),
                "load_id": self.load_id,
                "outbox_id": self.outbox_id,
                "action_type": self.action_type,
                "failure": self.failure,
            }),
        }
    }
}

fn step(effect: Effect, if_failed: IfFailed) -> Step {
    Step { effect, if_failed }
}

/// Whether a claim must be checked with the store before its send. Another dispatcher
/// takes a row over only once its lease lapses, so a claim whose lease has at least a
/// third of `lease` left (a margin for clocks that disagree between processes) is
/// almost surely still ours and skips the round trip; an older one (a batch that
/// waited, a fake clock moved on) is checked. Almost: a store that lost the claim in a
/// crash (PostgreSQL commits claims without waiting for the WAL flush) may hand the row
/// to another dispatcher at once, and both send; the service deduplicates on the
/// idempotency key, and the marks check the token again whatever this says.
pub fn claim_needs_check(lease_until: Option<Timestamp>, now: Timestamp, lease: Duration) -> bool {
    match lease_until {
        Some(until) => crate::time::add(now, lease / 3) >= until,
        None => true,
    }
}

/// When a call of a claimed row may first have reached its service, if one may have
/// before this claim: an attempt failed (`attempts > 0`), or an earlier claim lapsed
/// mid-call (`first_attempt_at` is older than this claim, which began `lease` before
/// `lease_until`). A claim's own first try is `None`: nothing can be there yet. A
/// service that honours no idempotency key (Twilio) is asked what it has before it is
/// called again.
pub fn tried_since(
    attempts: u32,
    first_attempt_at: Option<Timestamp>,
    lease_until: Option<Timestamp>,
    lease: Duration,
) -> Option<Timestamp> {
    let first = first_attempt_at?;
    let claimed_before = lease_until.is_none_or(|until| crate::time::add(first, lease) < until);
    (attempts > 0 || claimed_before).then_some(first)
}

/// After a send: a delivery is published and marked, a permanent failure buried, a
/// retryable one is a failed attempt, a throttled one held back ([`throttled`]).
pub fn after_send(row: &Row, sent: Sent, mode: QueueMode, now: Timestamp) -> Next {
    match sent {
        Sent::Delivered { receipt } => Next::Plan(delivered(row, receipt, mode)),
        Sent::Retryable(why) => Next::AttemptFailed(why),
        Sent::Permanent(why) => Next::Plan(bury(row, why)),
        Sent::Throttled { retry_after, why } => match throttled(row, retry_after, &why, now) {
            Some(plan) => Next::Plan(plan),
            None => Next::AttemptFailed(why),
        },
    }
}

/// A 429 with `Retry-After`: waiting for the service's rate is not failing, so the row
/// is held back for as long as the service asked (bounded by [`MIN_RETRY_AFTER`] and
/// [`MAX_RETRY_AFTER`]) with no attempt spent and its budget's clock moved on, and its
/// channel is held back with it, so the other rows do not meet the same 429. `None`
/// once the row is older than [`THROTTLE_WINDOW`]: the 429 is then a failed attempt.
pub fn throttled(row: &Row, retry_after: Duration, why: &str, now: Timestamp) -> Option<Plan> {
    if now >= add(row.created_at, THROTTLE_WINDOW) {
        return None;
    }
    let until = add(now, retry_after.clamp(MIN_RETRY_AFTER, MAX_RETRY_AFTER));
    Some(Plan {
        steps: vec![
            step(Effect::Hold { until, note: format!("throttled: {why}") }, IfFailed::Stop),
            step(Effect::PauseChannel { until }, IfFailed::Stop),
        ],
        settled: Settled::Held { until },
    })
}

/// Whether a claimed row may have been overtaken while it waited: an ask's SMS that
/// was held back (by a rate, a 429) or retried before this claim (it is due later than
/// it was made). If a later step of its ask was decided meanwhile, sending it would
/// ask the driver a question already asked again, so the store is asked
/// (`Outbox::supersede`); a row claimed as it was made costs no such check.
pub fn may_be_superseded(action_type: ActionType, created_at: Timestamp, due_at: Timestamp) -> bool {
    action_type == ActionType::SendSms && !as_made(created_at, due_at)
}

/// Whether a row is claimed as it was made: due when it was made, never held back or
/// retried. Such a row cannot have been overtaken, so a claim takes its send from the
/// channel's rate in the claim's own transaction (`SendRates::claim_taking`).
pub fn as_made(created_at: Timestamp, due_at: Timestamp) -> bool {
    due_at <= created_at
}

/// Outcome first, mark second; in one transaction on the store's own queue. A failed
/// publish is a failed attempt like any other (the service dedupes the resend).
pub fn delivered(row: &Row, receipt: String, mode: QueueMode) -> Plan {
    let event = outcome_event(row, OutcomeStatus::Delivered, Some(&receipt), None);
    let steps = match mode {
        QueueMode::StoreQueue => vec![step(Effect::PublishAndMark { event, receipt }, IfFailed::FailAttempt)],
        QueueMode::Separate => vec![
            step(Effect::Publish(event), IfFailed::FailAttempt),
            step(Effect::MarkDispatched { receipt }, IfFailed::FailMark),
        ],
    };
    Plan { steps, settled: Settled::Delivered }
}

/// A failed attempt (`why`): retried by the policy, or buried once attempts or the
/// budget are spent. `jitter` in `[0, 1)`.
pub fn after_failure(row: &Row, why: &str, now: Timestamp, policy: &RetryPolicy, jitter: f64) -> Plan {
    let attempts = row.attempts + 1;
    let first_attempt_at = row.first_attempt_at.unwrap_or(now);
    match policy.after_failure(attempts, first_attempt_at, now, jitter) {
        RetryDecision::RetryAt(retry_at) => Plan {
            steps: vec![step(
                Effect::MarkRetry { retry_at, attempts, failure: format!("attempt {attempts}: {why}") },
                IfFailed::Stop,
            )],
            settled: Settled::Retrying { retry_at },
        },
        RetryDecision::Dead(spent) => bury(row, format!("{why} ({spent})")),
    }
}

/// A failed mark after a delivered send whose outcome is published (`why`): retried
/// as [`after_failure`] would; once attempts or the budget are spent, the row is dead
/// and settled with no failed outcome and no OpsAlert, since the action did happen and
/// its delivered outcome is in the queue.
pub fn after_mark_failure(row: &Row, why: &str, now: Timestamp, policy: &RetryPolicy, jitter: f64) -> Plan {
    let attempts = row.attempts + 1;
    let first_attempt_at = row.first_attempt_at.unwrap_or(now);
    match policy.after_failure(attempts, first_attempt_at, now, jitter) {
        RetryDecision::RetryAt(_) => after_failure(row, why, now, policy, jitter),
        RetryDecision::Dead(spent) => Plan {
            steps: vec![
                step(
                    Effect::MarkDead { failure: format!("{why} ({spent}); delivered, and its outcome published") },
                    IfFailed::Stop,
                ),
                step(Effect::MarkOutcomePublished, IfFailed::LeaveToSweep),
            ],
            settled: Settled::Buried,
        },
    }
}

/// How the sweep backs off a dead row it could not settle (the queue or the ops
/// service is down): 1 s after the first failed pass, doubling up to 5 minutes, with
/// equal jitter; it never gives up, since the outcome and the alert must get out.
pub const SETTLE_BACKOFF: RetryPolicy = RetryPolicy {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(300),
    max_attempts: u32::MAX,
    budget: Duration::MAX,
};

/// When the sweep tries a dead row again after its `failed_passes`-th failed pass
/// (1 for the first), with the row's jitter for that pass.
pub fn settle_retry_at(failed_passes: u32, now: Timestamp, jitter: f64) -> Timestamp {
    add(now, SETTLE_BACKOFF.backoff(failed_passes, jitter).max(Duration::from_millis(1)))
}

/// The failed outcome (best effort), the row dead, then the OpsAlert its class calls
/// for and the settled mark, both only once the outcome is out: an outage leaves them
/// to the sweep instead of paging on every pass.
pub fn bury(row: &Row, why: String) -> Plan {
    let mut steps = vec![
        step(Effect::Publish(outcome_event(row, OutcomeStatus::Failed, None, Some(&why))), IfFailed::LeaveToSweep),
        step(Effect::MarkDead { failure: why.clone() }, IfFailed::Stop),
    ];
    steps.extend(settle(row, why));
    Plan { steps, settled: Settled::Buried }
}

/// A dead row whose failed outcome never reached the queue: publish it, then settle
/// as [`bury`] would have.
pub fn sweep(row: &Row, last_failure: Option<&str>) -> Plan {
    let why = last_failure.unwrap_or("unknown failure").to_owned();
    let mut steps = vec![step(
        Effect::Publish(outcome_event(row, OutcomeStatus::Failed, None, Some(&why))),
        IfFailed::LeaveToSweep,
    )];
    steps.extend(settle(row, why));
    Plan { steps, settled: Settled::Buried }
}

fn settle(row: &Row, why: String) -> Vec<Step> {
    let alert = AlertKind::for_class(row.action_type.class()).map(|kind| {
        let alert = Alert {
            kind,
            outbox_id: row.outbox_id.clone(),
            load_id: row.load_id.clone(),
            action_type: row.action_type,
            failure: why,
        };
        step(Effect::RaiseAlert(alert), IfFailed::LeaveToSweep)
    });
    alert.into_iter().chain([step(Effect::MarkOutcomePublished, IfFailed::LeaveToSweep)]).collect()
}

/// The `action_outcome` of a row, as the event the load queue carries.
pub fn outcome_event(row: &Row, status: OutcomeStatus, receipt: Option<&str>, failure: Option<&str>) -> InboundEvent {
    let class = row.action_type.class();
    let outcome = ActionOutcome {
        outbox_id: row.outbox_id.clone(),
        action_type: row.action_type,
        status,
        // Bounded and cleaned as the event validator requires: a service's answer must
        // not turn the outcome into a message the worker cannot read.
        receipt: receipt.map(|r| clean(r, 256)),
        failure: failure.map(|f| clean(f, 2000)),
        hero_channel: class == ChannelClass::HeroChannel,
        internal: class == ChannelClass::Internal,
    };
    InboundEvent {
        load_id: row.load_id.clone(),
        event_id: action_outcome_event_id(&row.outbox_id, status),
        body: EventBody::ActionOutcome(outcome),
    }
}

fn clean(s: &str, max_chars: usize) -> String {
    s.chars().map(|c| if c.is_control() { ' ' } else { c }).take(max_chars).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_claim_skips_its_check_and_an_old_or_unknown_one_does_not() {
        let lease = Duration::from_secs(90);
        let check = |until: Option<&str>, now: &str, expected: bool| {
            assert_eq!(claim_needs_check(until.map(t), t(now), lease), expected, "lease until {until:?} at {now}");
        };
        check(Some("07:01:30"), "07:00:00", false);
        check(Some("07:01:30"), "07:00:59", false);
        check(Some("07:01:30"), "07:01:00", true);
        check(Some("07:01:30"), "07:02:00", true);
        check(None, "07:00:00", true);
    }

    fn t(s: &str) -> Timestamp {
        format!("2026-03-02T{s}Z").parse().unwrap()
    }

    fn row(action_type: ActionType, attempts: u32) -> Row {
        Row {
            outbox_id: format!("L1/e1/{action_type}"),
            load_id: LoadId::parse("L1").unwrap(),
            action_type,
            attempts,
            first_attempt_at: (attempts > 0).then(|| t("07:00:00")),
            created_at: t("07:00:00"),
            trace: None,
        }
    }

    /// A step as one line: the effect, its key facts, and what its failure means.
    fn line(s: &Step) -> String {
        let outcome = |e: &InboundEvent| match &e.body {
            EventBody::ActionOutcome(o) => {
                let why = o.failure.as_deref().or(o.receipt.as_deref()).unwrap_or("");
                let class = if o.hero_channel {
                    " hero_channel"
                } else if o.internal {
                    " internal"
                } else {
                    ""
                };
                format!("{} {why}{class}", o.status.as_str())
            }
            other => panic!("not an outcome: {other:?}"),
        };
        let effect = match &s.effect {
            Effect::Publish(e) => format!("publish {}", outcome(e)),
            Effect::MarkDispatched { receipt } => format!("mark_dispatched {receipt}"),
            Effect::PublishAndMark { event, receipt } => format!("publish_and_mark {} {receipt}", outcome(event)),
            Effect::MarkRetry { retry_at, attempts, failure } => {
                format!("mark_retry {} #{attempts} {failure}", retry_at.strftime("%H:%M:%S%.3f"))
            }
            Effect::MarkDead { failure } => format!("mark_dead {failure}"),
            Effect::Hold { until, note } => format!("hold {} {note}", until.strftime("%H:%M:%S%.3f")),
            Effect::PauseChannel { until } => format!("pause_channel {}", until.strftime("%H:%M:%S%.3f")),
            Effect::RaiseAlert(a) => format!("alert {} {}", a.kind.as_str(), a.failure),
            Effect::MarkOutcomePublished => "mark_outcome_published".into(),
        };
        let if_failed = match s.if_failed {
            IfFailed::FailAttempt => "fail_attempt",
            IfFailed::FailMark => "fail_mark",
            IfFailed::Stop => "stop",
            IfFailed::LeaveToSweep => "sweep",
        };
        format!("{effect} | {if_failed}")
    }

    fn check_plan(plan: Plan, expected: (&[&str], Settled)) {
        let got: Vec<String> = plan.steps.iter().map(line).collect();
        assert_eq!((got.iter().map(String::as_str).collect::<Vec<_>>().as_slice(), plan.settled), expected);
    }

    fn check(row: Row, sent: Sent, mode: QueueMode, expected: Result<(&[&str], Settled), &str>) {
        match (after_send(&row, sent.clone(), mode, t("07:00:10")), expected) {
            (Next::Plan(plan), Ok(want)) => check_plan(plan, want),
            (Next::AttemptFailed(why), Err(want)) => assert_eq!(why, want),
            (got, want) => panic!("{sent:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn after_a_send() {
        use ActionType::*;
        use QueueMode::*;
        let ok = || Sent::Delivered { receipt: "r-1".into() };
        check(
            row(SendSms, 0),
            ok(),
            Separate,
            // A failed mark is a failed attempt too: it backs off, and is buried when spent.
            Ok((&["publish delivered r-1 | fail_attempt", "mark_dispatched r-1 | fail_mark"], Settled::Delivered)),
        );
        check(
            row(SendSms, 0),
            ok(),
            StoreQueue,
            Ok((&["publish_and_mark delivered r-1 r-1 | fail_attempt"], Settled::Delivered)),
        );
        check(row(SendSms, 3), Sent::Retryable("HTTP 503".into()), Separate, Err("HTTP 503"));
        check(
            row(SendSms, 0),
            Sent::Permanent("HTTP 422".into()),
            StoreQueue,
            Ok((
                &["publish failed HTTP 422 | sweep", "mark_dead HTTP 422 | stop", "mark_outcome_published | sweep"],
                Settled::Buried,
            )),
        );
        check(
            row(CreateHeroTask, 0),
            Sent::Permanent("HTTP 400".into()),
            Separate,
            Ok((
                &[
                    "publish failed HTTP 400 hero_channel | sweep",
                    "mark_dead HTTP 400 | stop",
                    "alert hero_channel_failure HTTP 400 | sweep",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            )),
        );
        check(
            row(SetTimer, 0),
            Sent::Permanent("bad".into()),
            Separate,
            Ok((
                &[
                    "publish failed bad internal | sweep",
                    "mark_dead bad | stop",
                    "alert internal_failure bad | sweep",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            )),
        );
    }

    #[test]
    fn a_429_holds_the_row_and_its_channel_back_for_a_while() {
        let check = |now: &str, retry_after_s: u64, expected: Option<(&[&str], Settled)>| {
            let plan = throttled(&row(ActionType::SendSms, 2), Duration::from_secs(retry_after_s), "HTTP 429", t(now));
            match (plan, expected) {
                (Some(plan), Some(want)) => check_plan(plan, want),
                (None, None) => {}
                (got, want) => panic!("{now} {retry_after_s}s: got {got:?}, want {want:?}"),
            }
        };
        let held = |at: &str| Settled::Held { until: t(at) };
        check(
            "07:00:10",
            5,
            Some((
                &["hold 07:00:15.000 throttled: HTTP 429 | stop", "pause_channel 07:00:15.000 | stop"],
                held("07:00:15"),
            )),
        );
        // `Retry-After: 0` still waits a second; a day waits five minutes.
        check(
            "07:00:10",
            0,
            Some((
                &["hold 07:00:11.000 throttled: HTTP 429 | stop", "pause_channel 07:00:11.000 | stop"],
                held("07:00:11"),
            )),
        );
        check(
            "07:00:10",
            86_400,
            Some((
                &["hold 07:05:10.000 throttled: HTTP 429 | stop", "pause_channel 07:05:10.000 | stop"],
                held("07:05:10"),
            )),
        );
        // Made at 07:00: held until 07:15, a failed attempt from then on.
        check(
            "07:14:59",
            5,
            Some((
                &["hold 07:15:04.000 throttled: HTTP 429 | stop", "pause_channel 07:15:04.000 | stop"],
                held("07:15:04"),
            )),
        );
        check("07:15:00", 5, None);
        let sent = Sent::Throttled { retry_after: Duration::from_secs(5), why: "HTTP 429".into() };
        assert!(
            matches!(after_send(&row(ActionType::SendSms, 0), sent.clone(), QueueMode::Separate, t("07:00:10")), Next::Plan(p) if p.settled == held("07:00:15"))
        );
        assert_eq!(
            after_send(&row(ActionType::SendSms, 0), sent, QueueMode::Separate, t("07:20:00")),
            Next::AttemptFailed("HTTP 429".into())
        );
    }

    #[test]
    fn only_an_asks_sms_that_waited_is_checked_for_a_later_step() {
        let check = |action_type: ActionType, due: &str, expected: bool| {
            assert_eq!(may_be_superseded(action_type, t("07:00:00"), t(due)), expected, "{action_type} {due}");
        };
        check(ActionType::SendSms, "07:00:01", true);
        check(ActionType::SendSms, "07:00:00", false);
        check(ActionType::CreateHeroTask, "07:00:01", false);
        check(ActionType::SetTimer, "07:00:01", false);
        assert!(as_made(t("07:00:00"), t("07:00:00")));
        assert!(as_made(t("07:00:01"), t("07:00:00")), "due before it was made: as made");
        assert!(!as_made(t("07:00:00"), t("07:00:01")));
    }

    #[test]
    fn after_a_failed_attempt() {
        let policy = RetryPolicy::default();
        let check = |attempts: u32, now: &str, jitter: f64, expected: (&[&str], Settled)| {
            check_plan(after_failure(&row(ActionType::SendSms, attempts), "boom", t(now), &policy, jitter), expected)
        };
        let retrying = |at: &str| Settled::Retrying { retry_at: t(at) };
        // The first failure: 1s base, equal jitter over [0.5s, 1s].
        check(0, "07:00:00", 0.0, (&["mark_retry 07:00:00.500 #1 attempt 1: boom | stop"], retrying("07:00:00.5")));
        check(0, "07:00:00", 1.0, (&["mark_retry 07:00:01.000 #1 attempt 1: boom | stop"], retrying("07:00:01")));
        // The fourth: d = 8s, 6s at jitter 0.5.
        check(3, "07:00:10", 0.5, (&["mark_retry 07:00:16.000 #4 attempt 4: boom | stop"], retrying("07:00:16")));
        // Attempts spent: buried with the reason.
        check(
            7,
            "07:01:00",
            0.5,
            (
                &[
                    "publish failed boom (gave up after 8 attempts) | sweep",
                    "mark_dead boom (gave up after 8 attempts) | stop",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            ),
        );
        // Budget spent (150 s from the first attempt at 07:00:00).
        check(
            2,
            "07:02:29",
            1.0,
            (
                &[
                    "publish failed boom (retry budget of 150s spent (149s since the first attempt)) | sweep",
                    "mark_dead boom (retry budget of 150s spent (149s since the first attempt)) | stop",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            ),
        );
    }

    #[test]
    fn after_a_failed_mark_of_a_delivered_send() {
        let policy = RetryPolicy::default();
        let check = |attempts: u32, now: &str, expected: (&[&str], Settled)| {
            let row = row(ActionType::SendSms, attempts);
            check_plan(after_mark_failure(&row, "mark_dispatched failed: down", t(now), &policy, 0.5), expected)
        };
        // Retried like any failed attempt: the row is not re-sent every lease.
        check(
            0,
            "07:00:00",
            (
                &["mark_retry 07:00:00.750 #1 attempt 1: mark_dispatched failed: down | stop"],
                Settled::Retrying { retry_at: t("07:00:00.75") },
            ),
        );
        // Spent: dead, with no failed outcome (the delivered one is out) and no alert.
        check(
            7,
            "07:01:00",
            (
                &[
                    "mark_dead mark_dispatched failed: down (gave up after 8 attempts); delivered, and its outcome \
                     published | stop",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            ),
        );
        let hero = row(ActionType::CreateHeroTask, 7);
        let plan = after_mark_failure(&hero, "x", t("07:01:00"), &policy, 0.5);
        assert!(plan.steps.iter().all(|s| !matches!(s.effect, Effect::RaiseAlert(_) | Effect::Publish(_))));
    }

    #[test]
    fn the_sweep_backs_off_a_row_it_could_not_settle() {
        let check = |passes: u32, jitter: f64, expected: &str| {
            assert_eq!(settle_retry_at(passes, t("07:00:00"), jitter), t(expected), "pass {passes} jitter {jitter}");
        };
        check(1, 0.0, "07:00:00.5");
        check(1, 0.5, "07:00:00.75");
        check(3, 1.0, "07:00:04");
        check(9, 1.0, "07:04:16");
        // Capped at 5 minutes, however many passes failed.
        check(10, 1.0, "07:05:00");
        check(u32::MAX, 0.0, "07:02:30");
    }

    #[test]
    fn the_sweep_settles_as_a_burial_would() {
        check_plan(
            sweep(&row(ActionType::PostHeroSlack, 8), Some("HTTP 500")),
            (
                &[
                    "publish failed HTTP 500 hero_channel | sweep",
                    "alert hero_channel_failure HTTP 500 | sweep",
                    "mark_outcome_published | sweep",
                ],
                Settled::Buried,
            ),
        );
        check_plan(
            sweep(&row(ActionType::SendSms, 8), None),
            (&["publish failed unknown failure | sweep", "mark_outcome_published | sweep"], Settled::Buried),
        );
    }

    #[test]
    fn alert_kinds_read_back_by_their_names() {
        for k in AlertKind::ALL {
            assert_eq!(AlertKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(AlertKind::parse("hero_channel_failure"), Some(AlertKind::HeroChannelFailure));
        assert_eq!(AlertKind::parse("internal_failure"), Some(AlertKind::InternalFailure));
        assert_eq!(AlertKind::parse("Hero_channel_failure"), None);
        assert_eq!(AlertKind::parse(""), None);
    }

    #[test]
    fn outcomes_are_bounded_and_clean() {
        let long = format!("a\u{0}b{}", "x".repeat(3000));
        let e = outcome_event(&row(ActionType::UpdateStage, 0), OutcomeStatus::Failed, Some("r\n1"), Some(&long));
        assert_eq!(e.event_id.as_str(), "evt:out:L1/e1/update_stage:failed");
        let EventBody::ActionOutcome(o) = &e.body else { panic!() };
        assert_eq!(o.receipt.as_deref(), Some("r 1"));
        assert_eq!(o.failure.as_ref().map(|f| f.chars().count()), Some(2000));
        assert!(o.failure.as_deref().unwrap().starts_with("a b"));
        assert!(o.internal && !o.hero_channel);
        // What the worker will read back.
        assert!(InboundEvent::from_json(e.load_id.clone(), e.to_json()).is_ok());
    }

    #[test]
    fn alerts() {
        let alert = Alert {
            kind: AlertKind::InternalFailure,
            outbox_id: "L1/e1/set_timer".into(),
            load_id: LoadId::parse("L1").unwrap(),
            action_type: ActionType::SetTimer,
            failure: "store down".into(),
        };
        assert_eq!(alert.key(), "alert:L1/e1/set_timer");
        let call = alert.call();
        assert_eq!((call.channel, call.path.as_str()), (Channel::Ops, "/v1/alerts"));
        assert_eq!(
            call.body,
            json!({"kind": "internal_failure", "load_id": "L1", "outbox_id": "L1/e1/set_timer",
                   "action_type": "set_timer", "failure": "store down"})
        );
        for t in ActionType::ALL {
            let kind = AlertKind::for_class(t.class());
            assert_eq!(kind.is_none(), t.class() == ChannelClass::External, "{t}");
        }
    }

    #[test]
    fn a_call_may_have_reached_the_service_after_a_failure_or_a_lapsed_claim() {
        let lease = Duration::from_secs(90);
        let t = |s: u64| crate::time::add(Timestamp::UNIX_EPOCH, Duration::from_secs(s));
        let check = |attempts: u32, first: Option<u64>, until: Option<u64>, want: Option<u64>| {
            assert_eq!(
                tried_since(attempts, first.map(t), until.map(t), lease),
                want.map(t),
                "{attempts} {first:?} {until:?}"
            );
        };
        // This claim's own first try: first_attempt_at is when it claimed.
        check(0, Some(100), Some(190), None);
        // Never tried (a row not yet claimed).
        check(0, None, Some(190), None);
        check(3, None, Some(190), None);
        // A failed attempt before.
        check(1, Some(100), Some(500), Some(100));
        check(1, Some(100), Some(190), Some(100));
        // An earlier claim lapsed mid-call: first tried a millisecond or more before this claim.
        check(0, Some(100), Some(191), Some(100));
        check(0, Some(100), Some(400), Some(100));
        // No lease to tell by: assume it may have.
        check(0, Some(100), None, Some(100));
    }
}
