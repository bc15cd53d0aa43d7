//! haul's runtime: everything with IO at the edges of the pure core.

pub mod clock;
pub mod store;
