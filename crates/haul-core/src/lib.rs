//! The pure domain core of haul (docs/design.md, ADR 0003).
//!
//! Everything here is a function of its inputs and an explicit `now`: no IO, no
//! async, no clock reads, no randomness of its own (callers pass random draws in).
//! That is what lets the worker, the evals and the simulator replay decisions exactly.

pub mod action;
pub mod clock;
pub mod decision;
pub mod event;
pub mod filter;
pub mod ids;
pub mod projection;
pub mod retry;
pub mod sop;
pub mod time;
pub mod tools;
pub mod validate;

pub use action::{Action, ActionKind, ActionType, ChannelClass, Urgency};
pub use clock::{Clock, FakeClock};
pub use decision::{AskChange, DECISION_RECORDED, Decision};
pub use event::{BadInput, EventBody, InboundEvent, OutcomeStatus, Risk};
pub use ids::{AskId, EventId, LoadId, TimerId};
pub use projection::{AskStatus, LoadState, OpenAsk, project};
pub use retry::{RetryDecision, RetryPolicy};
pub use time::{Timestamp, parse_duration};
