//! What the crate's unit tests share: the load they decide for, its driver's phone,
//! and events read from JSON as the API would take them.

use serde_json::Value;

use crate::event::InboundEvent;
use crate::ids::LoadId;

/// The driver's phone of the tests' load.
pub const PHONE: &str = "+15555550100";

/// The tests' load.
pub fn load() -> LoadId {
    LoadId::parse("481207").unwrap()
}

/// An event of the tests' load, from its JSON form.
pub fn ev(v: Value) -> InboundEvent {
    InboundEvent::from_json(load(), v).unwrap()
}
