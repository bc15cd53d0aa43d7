//! `RetryPolicy`: capped exponential backoff with jitter inside a budget (ADR 0003).
//!
//! The budget is measured from `first_attempt_at` (set when a row is first claimed),
//! not from commit, so a dispatcher backlog does not spend it. The first retry is
//! always allowed, so one transient error never kills a row; a later retry that would
//! land past the budget, or one past `max_attempts`, kills it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::{Timestamp, add, since};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts in all, the first send included.
    pub max_attempts: u32,
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(30),
            max_attempts: 8,
            budget: Duration::from_secs(150),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    RetryAt(Timestamp),
    /// No more attempts: the row is buried. Says why, for the failure text.
    Dead(String),
}

impl RetryPolicy {
    /// The backoff before retry number `attempts` (1 = the wait after the first failed
    /// attempt), with `jitter` in `[0, 1)` drawn by the caller: the wait is spread over
    /// `[d/2, d]` where `d = min(cap, base * 2^(attempts-1))` ("equal jitter"), so gaps
    /// still grow while two dispatchers do not retry in lockstep.
    pub fn backoff(&self, attempts: u32, jitter: f64) -> Duration {
        let exp = attempts.saturating_sub(1).min(30);
        let d = self.base.saturating_mul(1u32 << exp).min(self.cap);
        let jitter = if jitter.is_finite() { jitter.clamp(0.0, 1.0) } else { 0.0 };
        let half = d / 2;
        half + (d - half).mul_f64(jitter)
    }

    /// What to do after a failed attempt. `attempts` counts the attempts made so far,
    /// this one included.
    pub fn after_failure(
        &self,
        attempts: u32,
        first_attempt_at: Timestamp,
        now: Timestamp,
        jitter: f64,
    ) -> RetryDecision {
        let retry_at = add(now, self.backoff(attempts, jitter).max(Duration::from_millis(1)));
        if attempts <= 1 {
            return RetryDecision::RetryAt(retry_at);
        }
        if attempts >= self.max_attempts {
            return RetryDecision::Dead(format!("gave up after {attempts} attempts"));
        }
        let deadline = add(first_attempt_at, self.budget);
        if retry_at > deadline {
            return RetryDecision::Dead(format!(
                "retry budget of {}s spent ({}s since the first attempt)",
                self.budget.as_secs(),
                since(now, first_attempt_at).as_secs()
            ));
        }
        RetryDecision::RetryAt(retry_at)
    }
}
