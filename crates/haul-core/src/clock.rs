//! The `Clock` trait: the only way haul learns the time.
//!
//! The system clock lives in the runtime (it reads the OS); this crate only has the
//! trait and the `FakeClock` that evals and the simulator move by hand.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::time::{Timestamp, from_ms, to_ms};

pub trait Clock: Send + Sync + 'static {
    /// The current time, truncated to whole milliseconds.
    fn now(&self) -> Timestamp;
}

/// A clock that moves only when told. Never goes backwards on its own; `set` may be
/// asked to, and callers (the eval runner) refuse that before it gets here.
#[derive(Debug)]
pub struct FakeClock {
    ms: AtomicI64,
}

impl FakeClock {
    pub fn new(start: Timestamp) -> Self {
        FakeClock { ms: AtomicI64::new(to_ms(start)) }
    }

    pub fn set(&self, t: Timestamp) {
        self.ms.store(to_ms(t), Ordering::SeqCst);
    }

    pub fn advance(&self, d: Duration) {
        self.ms.fetch_add(d.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Timestamp {
        from_ms(self.ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fake_clock_moves_only_when_told() {
        let t0: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let c = FakeClock::new(t0);
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now(), "2026-03-02T07:00:01.500Z".parse::<Timestamp>().unwrap());
        c.set(t0);
        assert_eq!(c.now(), t0);
    }
}
