//! Fault points: named places where a test or the simulator can make a run stop as
//! if the process died there.
//!
//! This is not a mock: the worker, dispatcher and pump run their production code and
//! ask `Faults::check` at each point; in production the hook is absent and the check
//! is a branch on `None`. A crash returns `Crash`, and the caller unwinds at once
//! without acking, marking or cleaning up, exactly what a dead process leaves behind.

use std::fmt;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultPoint {
    /// Worker: the log was read, nothing decided.
    AfterRead,
    /// Worker: decided, not appended.
    AfterDecide,
    /// Worker: appended, not acked.
    AfterAppend,
    /// Worker: the append committed but reported an error (the answer was lost).
    AppendAnswerLost,
    /// Dispatcher: rows claimed, nothing sent.
    AfterClaim,
    /// Dispatcher: the service applied the effect, nothing marked or published.
    AfterSend,
    /// Dispatcher: the outcome was published, the row not marked.
    AfterPublish,
    /// Dispatcher: the row was marked, the OpsAlert (if any) not raised.
    AfterMark,
    /// Pump: `timer_fired` published, `mark_fired` not done.
    AfterPumpPublish,
}

impl FaultPoint {
    pub const ALL: [FaultPoint; 9] = [
        FaultPoint::AfterRead,
        FaultPoint::AfterDecide,
        FaultPoint::AfterAppend,
        FaultPoint::AppendAnswerLost,
        FaultPoint::AfterClaim,
        FaultPoint::AfterSend,
        FaultPoint::AfterPublish,
        FaultPoint::AfterMark,
        FaultPoint::AfterPumpPublish,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterRead => "after_read",
            FaultPoint::AfterDecide => "after_decide",
            FaultPoint::AfterAppend => "after_append",
            FaultPoint::AppendAnswerLost => "append_answer_lost",
            FaultPoint::AfterClaim => "after_claim",
            FaultPoint::AfterSend => "after_send",
            FaultPoint::AfterPublish => "after_publish",
            FaultPoint::AfterMark => "after_mark",
            FaultPoint::AfterPumpPublish => "after_pump_publish",
        }
    }
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The process "died" at a fault point.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("crashed at fault point {point} ({context})")]
pub struct Crash {
    pub point: FaultPoint,
    pub context: String,
}

type Hook = dyn Fn(FaultPoint, &str) -> bool + Send + Sync;
type Observer = dyn Fn(Observed<'_>) + Send + Sync;

/// Bugs that the simulator's own test plants to prove it catches them. Never set
/// outside `haul sim --plant` and that test.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlantedBugs {
    /// The worker appends a stale decision at the current version instead of re-deciding.
    pub skip_version_check: bool,
    /// The dispatcher marks a row dispatched before publishing its outcome.
    pub mark_before_publish: bool,
    /// The worker acks the message before appending.
    pub ack_before_append: bool,
    /// The decider takes every load update for a delivery (SOP rule 7's guard on any
    /// update): it closes the open asks and cancels their timers. The simulator plants
    /// it in its own decider; nothing in the runtime reads it.
    pub rule7_on_any_update: bool,
    /// Liveness: the dispatcher gives up every row it has tried before (a retry is
    /// claimed, never sent, and its lease lapses, again and again).
    pub never_reclaim: bool,
    /// Liveness: the timer pump never fires a follow-up (a timer of step 2 or later).
    pub timer_never_pumped: bool,
}

impl PlantedBugs {
    pub fn parse(name: &str) -> Option<Self> {
        let mut b = PlantedBugs::default();
        match name {
            "skip_version_check" => b.skip_version_check = true,
            "mark_before_publish" => b.mark_before_publish = true,
            "ack_before_append" => b.ack_before_append = true,
            "rule7_on_any_update" => b.rule7_on_any_update = true,
            "never_reclaim" => b.never_reclaim = true,
            "timer_never_pumped" => b.timer_never_pumped = true,
            _ => return None,
        }
        Some(b)
    }
}

/// What the dispatcher reports to an observer (the simulator checks claims with it).
#[derive(Clone, Copy, Debug)]
pub enum Observed<'a> {
    Claimed { outbox_id: &'a str, token: &'a str },
    Marked { outbox_id: &'a str, token: &'a str },
}

/// The hooks; `Faults::default()` never crashes, observes nothing and plants nothing.
#[derive(Clone, Default)]
pub struct Faults {
    hook: Option<Arc<Hook>>,
    observer: Option<Arc<Observer>>,
    pub bugs: PlantedBugs,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.hook.is_some() { "Faults(hooked)" } else { "Faults(none)" })
    }
}

impl Faults {
    /// `hook(point, context)` returns true to crash there. `context` is the outbox id,
    /// event id or timer id at hand.
    pub fn new(hook: impl Fn(FaultPoint, &str) -> bool + Send + Sync + 'static) -> Self {
        Faults { hook: Some(Arc::new(hook)), ..Faults::default() }
    }

    pub fn with_observer(mut self, observer: impl Fn(Observed<'_>) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    pub fn with_bugs(mut self, bugs: PlantedBugs) -> Self {
        self.bugs = bugs;
        self
    }

    pub fn check(&self, point: FaultPoint, context: &str) -> Result<(), Crash> {
        match &self.hook {
            Some(hook) if hook(point, context) => Err(Crash { point, context: context.to_owned() }),
            _ => Ok(()),
        }
    }

    pub fn observe(&self, what: Observed<'_>) {
        if let Some(o) = &self.observer {
            o(what);
        }
    }
}
