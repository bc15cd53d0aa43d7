//! haul's runtime: everything with IO, at the edges of the pure core.

pub mod bench;
pub mod channels;
pub mod clock;
pub mod config;
pub mod crashtest;
pub mod decider;
pub mod dispatcher;
pub mod eval;
pub mod faults;
pub mod inspect;
pub mod llm;
pub mod pipeline;
pub mod projector;
pub mod pump;
pub mod queue;
pub mod serve;
pub mod sim;
pub mod store;
pub mod testkit;
pub mod testkit_llm;
pub mod twilio;
pub mod worker;
