//! `RetryPolicy`: capped exponential backoff with jitter inside a budget (ADR 0003).
//!
//! The budget is measured from `first_attempt_at` (set when a row is first claimed),
//! not from commit, so a dispatcher backlog does not spend it. The first retry is
//! always allowed, so one transient error never kills a row; a later retry that would
//! land past the budget, or one past `max_attempts`, kills it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::time::{Timestamp, add, since};

/// The jitter, in `[0, 1)`, for retry number `attempt` of the outbox row `id`, from
/// `seed`: a pure function of the three, so the wait a row gets never depends on the
/// order in which a batch's concurrent sends happened to fail, and a run with the same
/// seed repeats exactly. Rows differ by id, so their retries still spread out.
pub fn jitter(seed: u64, id: &str, attempt: u32) -> f64 {
    // FNV-1a over the id, then SplitMix64's finalizer over it, the seed and the attempt.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h ^ seed.rotate_left(29) ^ u64::from(attempt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..2 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
    }
    // The top 53 bits as a fraction: exactly representable, below 1.
    (z >> 11) as f64 / (1u64 << 53) as f64
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_a_function_of_seed_row_and_attempt() {
        let j = |seed, id: &str, attempt| jitter(seed, id, attempt);
        // The same three, the same draw, however often and in whatever order asked.
        let ids = ["L1/a/send_sms", "L2/a/send_sms", "L3/a/send_sms", "L4/a/send_sms"];
        let once: Vec<f64> = ids.iter().map(|id| j(1, id, 1)).collect();
        let reversed: Vec<f64> = ids.iter().rev().map(|id| j(1, id, 1)).rev().collect();
        assert_eq!(once, reversed);
        // Another row, attempt or seed: another draw.
        let mut all: Vec<f64> = once.clone();
        all.extend([j(1, ids[0], 2), j(2, ids[0], 1)]);
        let mut sorted = all.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.dedup();
        assert_eq!(sorted.len(), all.len(), "{all:?}");
        // In [0, 1), and spread over it: each tenth gets a share of 10 000 draws.
        let mut tenths = [0u32; 10];
        for n in 0..10_000u32 {
            let x = j(7, &format!("L{n}/e/send_sms"), n % 8 + 1);
            assert!((0.0..1.0).contains(&x), "{x}");
            tenths[(x * 10.0) as usize] += 1;
        }
        assert!(tenths.iter().all(|&c| (850..1150).contains(&c)), "{tenths:?}");
    }

    /// `after_failure` under the default policy (1 s base, 30 s cap, 8 attempts, 150 s
    /// budget) with the largest jitter: the wait after attempt `attempts`, `since_first_ms`
    /// after the first, as "retry in N ms" or the reason the row dies.
    #[test]
    fn a_row_retries_until_its_attempts_or_its_budget_are_spent() {
        let first: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let check = |attempts: u32, since_first_ms: u64, want: &str| {
            let now = add(first, Duration::from_millis(since_first_ms));
            let got = match RetryPolicy::default().after_failure(attempts, first, now, 1.0) {
                RetryDecision::RetryAt(t) => format!("retry in {} ms", since(t, now).as_millis()),
                RetryDecision::Dead(why) => why,
            };
            assert_eq!(got, want, "attempt {attempts}, {since_first_ms} ms after the first");
        };
        // The wait doubles up to the cap: 1, 2, 4 … 30 s.
        check(1, 0, "retry in 1000 ms");
        check(2, 0, "retry in 2000 ms");
        check(6, 0, "retry in 30000 ms");
        // The budget's edge: a retry landing exactly at 150 s still goes; a millisecond
        // later it would land past the budget, and the row dies.
        check(2, 148_000, "retry in 2000 ms");
        check(2, 148_001, "retry budget of 150s spent (148s since the first attempt)");
        // The first failure always retries, whatever the clock says.
        check(1, 400_000, "retry in 1000 ms");
        // The eighth attempt is the last.
        check(7, 0, "retry in 30000 ms");
        check(8, 0, "gave up after 8 attempts");
    }

    /// The draws themselves are pinned: a seeded run (an eval, a simulator seed)
    /// repeats across builds only while `jitter` gives the same numbers.
    #[test]
    fn jitter_gives_the_same_draws_in_every_build() {
        let got: Vec<f64> = [(1, "L1/a/send_sms", 1), (1, "L1/a/send_sms", 2), (7, "481207/x/create_hero_task", 5)]
            .into_iter()
            .map(|(seed, id, attempt)| jitter(seed, id, attempt))
            .collect();
        assert_eq!(got, [0.7140659957530049, 0.11827606771363364, 0.31173774327939163]);
    }
}
