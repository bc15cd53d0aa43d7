//! The pure domain core of haul (docs/design.md, ADR 0003).
//!
//! Everything here is a function of its inputs and an explicit `now`: no IO, no
//! async, no clock reads, no randomness of its own (callers pass random draws in).
//! That is what lets the worker, the evals and the simulator replay decisions exactly.

/// An enum of plain variants whose every variant is in its `ALL`, in declaration order,
/// by construction: a list the compiler keeps, where a hand-kept one would silently
/// miss a new variant (a row that decodes as corrupt, a tool never offered).
#[macro_export]
macro_rules! listed_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)+ }) => {
        $(#[$meta])* $vis enum $name { $($(#[$vmeta])* $variant,)+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$(stringify!($variant)),+].len()] = [$($name::$variant),+];
        }
    };
}

pub mod action;
pub mod channel;
pub mod clock;
pub mod consent;
pub mod decision;
pub mod derived;
pub mod dispatch;
pub mod disposition;
pub mod error;
pub mod event;
pub mod filter;
pub mod html;
pub mod ids;
pub mod limit;
pub mod log;
pub mod mask;
pub mod operator;
pub mod outcome;
pub mod projection;
pub mod queue_mode;
pub mod receipt;
pub mod redact;
pub mod replay;
pub mod retry;
pub mod sop;
pub mod spend;
pub mod time;
pub mod timers;
pub mod tools;
pub mod trace;
pub mod validate;

pub use action::{Action, ActionKind, ActionType, ChannelClass, Request, ServiceCall, Target, Urgency};
pub use channel::{Channel, PerChannel};
pub use clock::{Clock, FakeClock};
pub use decision::{AskChange, AskStatus, DECISION_RECORDED, Decision, InboxChange, InboxState};
pub use error::BadInput;
pub use event::{EventBody, InboundEvent, OperatorAction, OperatorCommand, Risk};
pub use ids::{AskId, EventId, LoadId, TimerId};
pub use outcome::OutcomeStatus;
pub use projection::{LoadState, OpenAsk, project};
pub use queue_mode::QueueMode;
pub use retry::{RetryDecision, RetryPolicy};
pub use time::{Timestamp, parse_duration};

#[cfg(test)]
mod testing;
