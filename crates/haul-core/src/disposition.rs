//! What becomes of a run's message, from what happened to the run (ADR 0003).
//!
//! The rules the worker lives by, in one place: a message is acked once its event is
//! in the log (or can never get there: poison), given back with a delay when the run
//! cannot append now, a conflict decides again within the conflict retries, and a
//! reused action key falls back once, whatever the retries (with none, a reused key
//! would otherwise leave the message on the queue for good, and its load behind it). The worker finds out what happened and carries out the
//! disposition; the rules are tested here as data.

use std::time::Duration;

/// How long a message waits when a run of its load is still going on in this process:
/// that run has appended and is finishing its epilogue, so a moment, not a
/// redelivery delay.
pub const BUSY_HERE_DELAY: Duration = Duration::from_millis(5);

/// Why a message gets no run at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The message is not an event of its load (only a bug upstream makes one).
    Poison(String),
    /// A run of the load is going on in this process.
    BusyHere,
    /// Another process holds the load's LoadLock.
    LockedElsewhere,
}

/// What happened to a run, as far as its message is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happened {
    /// Reading the log failed.
    ReadFailed(String),
    /// The event is in the log already: a redelivery.
    AlreadyProcessed,
    /// The process is shutting down and the run stopped before its append.
    Stopping,
    /// The run outlasted its time limit before its append.
    TimedOut,
    /// The run's log entries or outbox rows could not be encoded.
    Unencodable(String),
    /// The append committed; `with_ack` when the message's ack was in its transaction.
    Appended { with_ack: bool },
    /// The append committed but its answer was lost: as far as the run knows, it did not.
    AnswerLost,
    /// The log moved since the run read it.
    Conflict,
    /// The event's entry id is taken: a concurrent run logged it.
    DuplicateEntry,
    /// The decision reused this action key.
    DuplicateActionKey(String),
    /// The append failed.
    AppendFailed(String),
}

/// What to do with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// Take it off the queue.
    Ack,
    /// Give it back, visible again after `delay`; its load waits meanwhile.
    Nack { delay: Duration },
    /// Nothing: the append acked it in its own transaction.
    AckedWithAppend,
}

/// How a run ended, for its report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Committed,
    AlreadyProcessed,
    Duplicate,
    /// Not appended; the queue redelivers.
    Left(String),
    Busy,
    Poison(String),
}

/// The run is over: do `message`, report `end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    pub message: Message,
    pub end: End,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disposition {
    Finish(Finish),
    /// Read, project and decide again: another run appended first.
    Redecide,
    /// Read again and record the fallback decision, for this reason.
    Fallback(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Re-decisions after the first decision, before the message is left to the queue.
    pub conflict_retries: u32,
    /// How long a message given back after a failure waits.
    pub redelivery_delay: Duration,
}

/// What becomes of a message that gets no run.
pub fn refuse(refused: Refused, policy: &Policy) -> Finish {
    match refused {
        Refused::Poison(why) => Finish { message: Message::Ack, end: End::Poison(why) },
        Refused::BusyHere => Finish { message: Message::Nack { delay: BUSY_HERE_DELAY }, end: End::Busy },
        Refused::LockedElsewhere => {
            Finish { message: Message::Nack { delay: policy.redelivery_delay }, end: End::Busy }
        }
    }
}

/// The disposition after `happened` ended attempt number `attempt` (0 for the first
/// decision, one more per re-decision); `fallback` when that attempt was the fallback
/// decision.
pub fn dispose(happened: Happened, attempt: u32, fallback: bool, policy: &Policy) -> Disposition {
    let finish = |message, end| Disposition::Finish(Finish { message, end });
    let left = |why: String| finish(Message::Nack { delay: policy.redelivery_delay }, End::Left(why));
    let retries_left = attempt < policy.conflict_retries;
    match happened {
        Happened::ReadFailed(e) => left(format!("reading the log failed: {e}")),
        Happened::AlreadyProcessed => finish(Message::Ack, End::AlreadyProcessed),
        // Another process takes it at once.
        Happened::Stopping => {
            finish(Message::Nack { delay: Duration::ZERO }, End::Left("shutting down; abandoned before append".into()))
        }
        Happened::TimedOut => left("the run outlasted worker.run_timeout; abandoned before append".into()),
        Happened::Unencodable(e) => left(e),
        Happened::Appended { with_ack: true } => finish(Message::AckedWithAppend, End::Committed),
        Happened::Appended { with_ack: false } => finish(Message::Ack, End::Committed),
        Happened::AnswerLost => left("the append's answer was lost".into()),
        Happened::Conflict if retries_left => Disposition::Redecide,
        Happened::Conflict => left(format!("{} conflict retries spent", policy.conflict_retries)),
        // Not a race: deciding again would reuse the key again. The fallback's own key
        // is the event's, so it can only be taken by a bug: then the queue keeps it.
        Happened::DuplicateActionKey(key) if !fallback => {
            Disposition::Fallback(format!("the decision reused action key {key}"))
        }
        Happened::DuplicateActionKey(key) => left(format!("the fallback decision reused action key {key}")),
        // The event is in the log: acked, nothing written.
        Happened::DuplicateEntry => finish(Message::Ack, End::Duplicate),
        Happened::AppendFailed(e) => left(format!("append failed: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy { conflict_retries: 2, redelivery_delay: Duration::from_secs(1) };

    fn check(happened: Happened, attempt: u32, expected: Disposition) {
        check_with(POLICY, happened, attempt, false, expected);
    }

    fn check_with(policy: Policy, happened: Happened, attempt: u32, fallback: bool, expected: Disposition) {
        let got = dispose(happened.clone(), attempt, fallback, &policy);
        assert_eq!(got, expected, "{happened:?} at attempt {attempt} (fallback {fallback}), {policy:?}");
    }

    fn finish(message: Message, end: End) -> Disposition {
        Disposition::Finish(Finish { message, end })
    }

    fn nack(ms: u64) -> Message {
        Message::Nack { delay: Duration::from_millis(ms) }
    }

    fn left(why: &str) -> Disposition {
        finish(nack(1000), End::Left(why.into()))
    }

    #[test]
    fn refusals() {
        let check = |refused: Refused, expected: Disposition| {
            assert_eq!(Disposition::Finish(refuse(refused.clone(), &POLICY)), expected, "{refused:?}");
        };
        check(Refused::Poison("bad json".into()), finish(Message::Ack, End::Poison("bad json".into())));
        check(Refused::BusyHere, finish(nack(5), End::Busy));
        check(Refused::LockedElsewhere, finish(nack(1000), End::Busy));
    }

    #[test]
    fn dispositions() {
        use Happened::*;
        check(ReadFailed("store error: down".into()), 0, left("reading the log failed: store error: down"));
        check(AlreadyProcessed, 1, finish(Message::Ack, End::AlreadyProcessed));
        check(Stopping, 0, finish(nack(0), End::Left("shutting down; abandoned before append".into())));
        check(TimedOut, 0, left("the run outlasted worker.run_timeout; abandoned before append"));
        check(Unencodable("cannot encode the decision".into()), 0, left("cannot encode the decision"));
        check(Appended { with_ack: false }, 0, finish(Message::Ack, End::Committed));
        check(Appended { with_ack: true }, 2, finish(Message::AckedWithAppend, End::Committed));
        check(AnswerLost, 0, left("the append's answer was lost"));
        check(DuplicateEntry, 0, finish(Message::Ack, End::Duplicate));
        check(AppendFailed("store error: down".into()), 0, left("append failed: store error: down"));
    }

    #[test]
    fn conflicts_redecide_within_the_retries() {
        use Happened::*;
        check(Conflict, 0, Disposition::Redecide);
        check(Conflict, 1, Disposition::Redecide);
        check(Conflict, 2, left("2 conflict retries spent"));
        check(
            DuplicateActionKey("L1/e1/send_sms".into()),
            0,
            Disposition::Fallback("the decision reused action key L1/e1/send_sms".into()),
        );
    }

    #[test]
    fn a_reused_action_key_falls_back_once_whatever_the_retries() {
        use Happened::*;
        let key = || DuplicateActionKey("L1/e1/send_sms".into());
        let fallback = || Disposition::Fallback("the decision reused action key L1/e1/send_sms".into());
        let none = Policy { conflict_retries: 0, ..POLICY };
        // With no conflict retries the fallback still comes (it used to need one).
        check_with(none, key(), 0, false, fallback());
        check_with(POLICY, key(), 2, false, fallback());
        check_with(POLICY, key(), 5, false, fallback());
        // The fallback's own key taken: left to the queue, not a loop.
        let left_fb = left("the fallback decision reused action key L1/e1/send_sms");
        check_with(none, key(), 1, true, left_fb.clone());
        check_with(POLICY, key(), 1, true, left_fb);
        // The fallback's append meeting a conflict: the retries as usual.
        check_with(none, Conflict, 1, true, left("0 conflict retries spent"));
        check_with(POLICY, Conflict, 1, true, Disposition::Redecide);
    }
}
