//! haul's runtime: the load worker, the dispatcher and the timer pump, with what they
//! need at the edges of the pure core (channel clients, deciders, the operators'
//! queries and actions). It knows no backend: it takes the `haul_store` traits it is
//! handed (`haul-backends` opens them).
//!
//! Everything here does IO; what it decides is `haul-core`'s. Nothing here serves HTTP
//! (that is `haul-server`) and nothing here is a test double (that is `haul-harness`).

pub mod budget;
pub mod channels;
pub mod clock;
pub mod decider;
pub mod dispatcher;
pub mod faults;
pub mod inspect;
pub mod llm;
pub mod loops;
pub mod metrics_label;
pub mod operator;
pub mod pipeline;
pub mod projector;
pub mod pump;
pub mod queries;
pub mod queue;
pub mod rates;
pub mod secrets;
pub mod shadow;
pub mod spans;
pub mod timeline;
pub mod trace;
pub mod worker;
