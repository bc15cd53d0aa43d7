//! The pure domain core of haul (docs/design.md, ADR 0003).
//!
//! Everything here is a function of its inputs and an explicit `now`: no IO, no
//! async, no clock reads, no randomness of its own (callers pass random draws in).
//! That is what lets the worker, the evals and the simulator replay decisions exactly.

pub mod action;
pub mod channel;
pub mod clock;
pub mod decision;
pub mod dispatch;
pub mod disposition;
pub mod error;
pub mod event;
pub mod filter;
pub mod html;
pub mod ids;
pub mod mask;
pub mod operator;
pub mod outcome;
pub mod projection;
pub mod queue_mode;
pub mod redact;
pub mod replay;
pub mod retry;
pub mod sop;
pub mod time;
pub mod tools;
pub mod validate;

pub use action::{Action, ActionKind, ActionType, ChannelClass, Request, ServiceCall, Target, Urgency};
pub use channel::{Channel, PerChannel};
pub use clock::{Clock, FakeClock};
pub use decision::{AskChange, AskStatus, DECISION_RECORDED, Decision};
pub use error::BadInput;
pub use event::{EventBody, InboundEvent, OperatorAction, OperatorCommand, Risk};
pub use ids::{AskId, EventId, LoadId, TimerId};
pub use outcome::OutcomeStatus;
pub use projection::{LoadState, OpenAsk, project};
pub use queue_mode::QueueMode;
pub use retry::{RetryDecision, RetryPolicy};
pub use time::{Timestamp, parse_duration};
