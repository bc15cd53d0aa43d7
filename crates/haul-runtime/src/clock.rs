//! The system clock: the one place in haul that reads the time of day.

use haul_core::Clock;
use haul_core::time::{Timestamp, trunc_ms};

#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the OS clock
    fn now(&self) -> Timestamp {
        trunc_ms(Timestamp::now())
    }
}
