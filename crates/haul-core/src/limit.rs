//! Send rates: how fast a channel's service takes calls (docs/design.md, "Send
//! rates").
//!
//! A service on the other side has a rate it can take (a Twilio long code about one
//! segment a second, a 10DLC brand its trust score's), and past it answers 429; a
//! dispatcher claiming thousands of rows a second spends rows' retry budgets on those
//! answers. So a channel may have a [`Limit`]: a rate and a burst. The limiter is the
//! generic cell rate algorithm (GCRA): its whole state is one instant per channel, the
//! theoretical arrival time (`tat`) of the next send, so the store can keep it in one
//! row shared by every dispatcher, and taking permits is one read and one write under
//! that row's lock. Here are the parsing and the arithmetic; the store keeps `tat` and
//! the dispatcher holds back what was not granted.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most sends a rate may allow per period: a bound well past any service's (Twilio's
/// fastest short code takes 100 a second).
pub const MAX_SENDS: u32 = 100_000;
/// Largest burst: as many sends at once as a dispatcher claims in a few batches.
pub const MAX_BURST: u32 = 10_000;

/// `N/s`, `N/min` (or `N/m`), `N/h`: at most N sends per period, spread evenly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Rate {
    pub sends: u32,
    pub per: Duration,
}

impl Rate {
    /// Reads `"50/s"`, `"12/min"`, `"3600/h"`; says what is wrong otherwise.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let shape = || format!("{s:?} is not a rate: write N/s, N/min or N/h, N from 1 to {MAX_SENDS} (e.g. \"1/s\")");
        let (n, unit) = s.trim().split_once('/').ok_or_else(shape)?;
        let sends: u32 = n.trim().parse().map_err(|_| shape())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(shape()),
        };
        if sends == 0 {
            return Err(format!("{s:?} allows no send at all: a rate is at least 1 per period"));
        }
        if sends > MAX_SENDS {
            return Err(shape());
        }
        Ok(Rate { sends, per })
    }

    /// The time between two sends at this rate, in microseconds (at least 1).
    pub fn interval_us(&self) -> i64 {
        (self.per.as_micros() as i64 / i64::from(self.sends)).max(1)
    }

    /// Sends per second, for metrics.
    pub fn per_second(&self) -> f64 {
        f64::from(self.sends) / self.per.as_secs_f64()
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "min",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.sends)
    }
}

impl TryFrom<String> for Rate {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Rate::parse(&s)
    }
}

impl From<Rate> for String {
    fn from(r: Rate) -> Self {
        r.to_string()
    }
}

/// A channel's limit: sends spread at `rate`, up to `burst` at once after a quiet spell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub rate: Rate,
    pub burst: u32,
}

impl Limit {
    /// A limit, or why the burst cannot be.
    pub fn new(rate: Rate, burst: u32) -> Result<Limit, String> {
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(format!("burst {burst} is not 1 to {MAX_BURST}"));
        }
        Ok(Limit { rate, burst })
    }

    /// How far ahead of now `tat` may run: the burst's sends less the one being made.
    pub fn tolerance_us(&self) -> i64 {
        self.rate.interval_us() * i64::from(self.burst - 1)
    }
}

/// What [`take`] granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Sends allowed now, at most the number wanted.
    pub granted: u32,
    /// The state to keep: the theoretical arrival time of the next send (µs).
    pub tat_us: i64,
    /// When the next send is allowed (µs): now if some are still, else later.
    pub next_at_us: i64,
}

impl Grant {
    /// `granted` sends taken at `now_us` that left the limiter's state at `tat_us`: the
    /// next send is allowed once `tat` is within the burst's tolerance of now.
    pub fn kept(limit: &Limit, granted: u32, tat_us: i64, now_us: i64) -> Grant {
        Grant { granted, tat_us, next_at_us: (tat_us - limit.tolerance_us()).max(now_us) }
    }
}

/// Takes up to `wanted` sends at `now_us` from a limiter whose state is `tat_us` (none:
/// never used). Each granted send moves `tat` one interval on; a send is allowed while
/// `tat` is no further ahead of now than the burst allows.
pub fn take(limit: &Limit, tat_us: Option<i64>, now_us: i64, wanted: u32) -> Grant {
    let interval = limit.rate.interval_us();
    let tolerance = limit.tolerance_us();
    let start = tat_us.map_or(now_us, |t| t.max(now_us));
    // Sends that fit before `start` passes `now + tolerance`.
    let room = (now_us + tolerance - start).div_euclid(interval) + 1;
    let granted = room.clamp(0, i64::from(wanted)) as u32;
    Grant::kept(limit, granted, start + interval * i64::from(granted), now_us)
}

/// Two grants one claim took in turn from one limiter (`first` with the claim, if it
/// took any, `then` after): the sends of both, the state and next send as the later
/// left them.
pub fn after_both(first: Option<Grant>, then: Grant) -> Grant {
    let granted = first.map_or(0, |g| g.granted) + then.granted;
    Grant { granted, ..then }
}

/// The state after the service asked the channel to wait until `until_us` (a 429's
/// `Retry-After`): no send before it, then one an interval, no burst (the service has
/// just said it is full). A limiter already further ahead stays as it is.
pub fn paused(limit: &Limit, tat_us: Option<i64>, until_us: i64) -> i64 {
    let paused = until_us + limit.tolerance_us();
    tat_us.map_or(paused, |t| t.max(paused))
}

/// When each of `held` rows for one key is due again, after a grant that did not
/// cover them: one interval apart from when the next send is allowed, so they come
/// back at the rate and not all at once.
pub fn held_until_us(grant: &Grant, limit: &Limit, held: usize) -> Vec<i64> {
    let interval = limit.rate.interval_us();
    (0..held as i64).map(|i| grant.next_at_us + i * interval).collect()
}

/// The rate key of a client's own limit on a channel (`{channel}@{client}`), apart
/// from the channel's (`{channel}`) and the client's queue on it (`{channel}|{client}`).
pub fn client_rate_key(channel: &str, client: &str) -> String {
    format!("{channel}@{client}")
}

/// A channel's call time (µs) after a send that took `took_us`, from `was_us` before
/// it: a moving average, a fifth of each new send; the first send's own time.
pub fn call_time_after(was_us: Option<i64>, took_us: i64) -> i64 {
    was_us.map_or(took_us, |was| was + (took_us - was) / 5)
}

/// How long one send takes (µs), as the average of recent sends says, within 10 ms
/// and 10 s; 100 ms before any send.
pub fn call_time_us(average_us: Option<i64>) -> i64 {
    average_us.unwrap_or(100_000).clamp(10_000, 10_000_000)
}

/// When each of `n` rows past a cap of `cap` sends in flight is due again (µs), when
/// none was queued before them: `cap` sends end per call time, so one call time from
/// `now_us`, then one call time / `cap` apart (at least 1 µs). Answers the first and
/// the spacing.
pub fn in_flight_slots(now_us: i64, call_us: i64, cap: u32) -> (i64, i64) {
    (now_us + call_us, (call_us / i64::from(cap.max(1))).max(1))
}

/// The queue of a channel's rows held back by its cap on sends in flight
/// (`{channel}#in_flight`), apart from its clients' queues (`{channel}|…`).
pub fn in_flight_queue_key(channel: &str) -> String {
    format!("{channel}#in_flight")
}

/// The key under which a rate's last pause is kept (`{rate_key}!paused`, its state
/// when paused): a change of the rate's limit starts it afresh, but not before a pause
/// the service asked for ends.
pub fn pause_key(rate_key: &str) -> String {
    format!("{rate_key}!paused")
}

/// Most a client's weight may be: its share of a saturated channel against a client of
/// weight 1 (the default).
pub const MAX_WEIGHT: u32 = 100;

/// The store key of one client's queue on the rate kept under `rate_key` (none: the
/// loads with no client, one queue together).
pub fn queue_key(rate_key: &str, client: Option<&str>) -> String {
    format!("{rate_key}|{}", client.unwrap_or(""))
}

/// How far apart a client's held rows are queued: the rate's interval over the
/// client's weight, so a client of weight 2 has twice as many rows come due as one of
/// weight 1 and, the grants going to rows in the order they come due, about twice the
/// sends while both wait.
pub fn spacing_us(limit: &Limit, weight: u32) -> i64 {
    (limit.rate.interval_us() / i64::from(weight.max(1))).max(1)
}

/// Where `n` (at least 1) more held rows join a client's queue whose last slot is
/// `tail_us` (none: never used): the first one spacing after it, or at `from_us` (when
/// the channel's next send is allowed) if that is later, the rest one spacing apart.
/// Answers the first slot and the queue's new last slot.
///
/// Each client's rows are queued behind its own, not behind every client's, so a
/// client's 10 asks made behind another's 5,000 are due within 10 spacings, not after
/// the 5,000: fairness is in when rows come due, and each row is held once to its own
/// slot rather than all to the next free one (where they would meet and be held again).
pub fn queued(tail_us: Option<i64>, from_us: i64, spacing_us: i64, n: u32) -> (i64, i64) {
    let first = tail_us.map_or(from_us, |t| (t + spacing_us).max(from_us));
    (first, first + spacing_us * (i64::from(n.max(1)) - 1))
}

/// How far ahead of `now_us` the last of the held rows is due (0 when none is, or it
/// is due already): a channel's backlog at its rate, in time, what the saturation
/// alert watches.
pub fn backlog_us(last_until_us: Option<i64>, now_us: i64) -> i64 {
    last_until_us.map_or(0, |last| (last - now_us).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_parse(s: &str, want: Result<(u32, u64), &str>) {
        let got = Rate::parse(s).map(|r| (r.sends, r.per.as_secs()));
        match want {
            Ok(w) => assert_eq!(got, Ok(w), "{s}"),
            Err(part) => assert!(got.as_ref().is_err_and(|e| e.contains(part)), "{s}: {got:?}"),
        }
    }

    #[test]
    fn rates_read_as_people_write_them() {
        check_parse("1/s", Ok((1, 1)));
        check_parse(" 50 / s ", Ok((50, 1)));
        check_parse("12/min", Ok((12, 60)));
        check_parse("12/m", Ok((12, 60)));
        check_parse("3600/h", Ok((3600, 3600)));
        check_parse("100000/s", Ok((100_000, 1)));
        check_parse("fast", Err("is not a rate"));
        check_parse("0/s", Err("allows no send"));
        check_parse("-1/s", Err("is not a rate"));
        check_parse("1.5/s", Err("is not a rate"));
        check_parse("5/day", Err("is not a rate"));
        check_parse("100001/s", Err("is not a rate"));
        for s in ["1/s", "12/min", "3600/h"] {
            let rate = Rate::parse(s).unwrap();
            assert_eq!(rate.to_string(), s);
            // Settings and records carry a rate as people write it.
            let json = serde_json::to_value(rate).unwrap();
            assert_eq!(json, serde_json::json!(s));
            assert_eq!(serde_json::from_value::<Rate>(json).unwrap(), rate);
        }
        assert!(
            serde_json::from_value::<Rate>(serde_json::json!("fast")).unwrap_err().to_string().contains("not a rate")
        );
        assert_eq!(Rate::parse("3/s").unwrap().interval_us(), 333_333);
        assert_eq!(Rate::parse("12/min").unwrap().per_second(), 0.2);
        assert!(Limit::new(Rate::parse("1/s").unwrap(), 0).unwrap_err().contains("burst 0"));
        assert!(Limit::new(Rate::parse("1/s").unwrap(), MAX_BURST + 1).is_err());
    }

    const S: i64 = 1_000_000;

    /// (tat before, now, wanted) → (granted, tat after, next allowed), at 1/s burst 5.
    fn check(tat: Option<i64>, now: i64, wanted: u32, want: (u32, i64, i64)) {
        let limit = Limit::new(Rate::parse("1/s").unwrap(), 5).unwrap();
        let g = take(&limit, tat, now, wanted);
        assert_eq!((g.granted, g.tat_us, g.next_at_us), want, "tat {tat:?} now {now} wanted {wanted}");
    }

    #[test]
    fn a_quiet_channel_sends_its_burst_then_one_an_interval() {
        // Never used: the burst at once, the next a second later.
        check(None, 100 * S, 10, (5, 105 * S, 101 * S));
        check(None, 100 * S, 3, (3, 103 * S, 100 * S));
        check(None, 100 * S, 0, (0, 100 * S, 100 * S));
        // Just spent: nothing until an interval has passed, then one.
        check(Some(105 * S), 100 * S, 1, (0, 105 * S, 101 * S));
        check(Some(105 * S), 101 * S, 3, (1, 106 * S, 102 * S));
        check(Some(105 * S), 101 * S - 1, 1, (0, 105 * S, 101 * S));
        // Half a second on: still one; quiet for long: the burst again, not more.
        check(Some(105 * S), 101 * S + S / 2, 3, (1, 106 * S, 102 * S));
        check(Some(105 * S), 1_000 * S, 9, (5, 1_005 * S, 1_001 * S));
    }

    #[test]
    fn a_claims_two_takes_add_up_to_one() {
        let limit = Limit::new(Rate::parse("1/s").unwrap(), 5).unwrap();
        let first = take(&limit, None, 100 * S, 3);
        let then = take(&limit, Some(first.tat_us), 100 * S, 4);
        let both = after_both(Some(first), then);
        assert_eq!(both, Grant { granted: 5, ..then }, "the burst between them, as one take of 7");
        assert_eq!(both, take(&limit, None, 100 * S, 7));
        assert_eq!(after_both(None, then), then);
    }

    #[test]
    fn held_rows_come_back_at_the_rate() {
        let limit = Limit::new(Rate::parse("4/s").unwrap(), 2).unwrap();
        let g = take(&limit, None, 10 * S, 5);
        assert_eq!((g.granted, g.next_at_us), (2, 10 * S + S / 4));
        assert_eq!(held_until_us(&g, &limit, 3), vec![10 * S + S / 4, 10 * S + S / 2, 10 * S + 3 * S / 4]);
        assert!(held_until_us(&g, &limit, 0).is_empty());
        assert_eq!(backlog_us(held_until_us(&g, &limit, 3).last().copied(), 10 * S), 3 * S / 4);
        assert_eq!(backlog_us(None, 10 * S), 0);
        assert_eq!(backlog_us(Some(9 * S), 10 * S), 0, "never negative");
    }

    /// (tail, from, spacing, n) → (first slot, new tail).
    fn check_queued(tail: Option<i64>, from: i64, spacing: i64, n: u32, want: (i64, i64)) {
        assert_eq!(queued(tail, from, spacing, n), want, "tail {tail:?} from {from} spacing {spacing} n {n}");
    }

    #[test]
    fn each_clients_held_rows_queue_behind_its_own() {
        check_queued(None, 100, 10, 3, (100, 120));
        check_queued(Some(150), 100, 10, 3, (160, 180));
        // A queue that ran dry starts again where the channel's next send is allowed.
        check_queued(Some(50), 100, 10, 1, (100, 100));
        check_queued(Some(90), 100, 10, 2, (100, 110));
        check_queued(Some(95), 100, 10, 2, (105, 115));
        check_queued(Some(0), 100, 10, 0, (100, 100));
        let limit = Limit::new(Rate::parse("50/s").unwrap(), 5).unwrap();
        assert_eq!((spacing_us(&limit, 1), spacing_us(&limit, 2), spacing_us(&limit, 0)), (20_000, 10_000, 20_000));
        let fast = Limit::new(Rate::parse("100000/s").unwrap(), 1).unwrap();
        assert_eq!(spacing_us(&fast, MAX_WEIGHT), 1, "never zero: the slots would all be one");
        assert_eq!(queue_key("sms", Some("acme")), "sms|acme");
        assert_eq!(queue_key("sms", None), "sms|");
        assert_eq!(pause_key("sms"), "sms!paused", "not a queue of the rate: forgetting its queues keeps it");
        // Kept in the store: a client's own limit and the in-flight queue are neither
        // the channel's rate nor one of its clients' queues (`{channel}|`, forgotten
        // when its limit changes).
        assert_eq!(client_rate_key("tms", "acme"), "tms@acme");
        // A channel's call time: the first send's, then a fifth of each new one.
        assert_eq!(call_time_after(None, 400_000), 400_000);
        assert_eq!(call_time_after(Some(400_000), 900_000), 500_000);
        assert_eq!(call_time_after(Some(500_000), 0), 400_000);
        assert_eq!(
            (call_time_us(None), call_time_us(Some(0)), call_time_us(Some(i64::MAX))),
            (100_000, 10_000, 10_000_000)
        );
        assert_eq!(call_time_us(Some(250_000)), 250_000);
        assert_eq!(in_flight_slots(1_000, 400_000, 2), (401_000, 200_000));
        assert_eq!(in_flight_slots(0, 10_000, 10_000), (10_000, 1), "never zero: the slots would all be one");
        assert_eq!(in_flight_queue_key("hero"), "hero#in_flight");
    }

    #[test]
    fn a_pause_lets_nothing_through_before_its_end_then_one_at_a_time() {
        let limit = Limit::new(Rate::parse("1/s").unwrap(), 5).unwrap();
        let tat = paused(&limit, None, 110 * S);
        assert_eq!(tat, 114 * S);
        assert_eq!(take(&limit, Some(tat), 110 * S - 1, 5).granted, 0);
        let g = take(&limit, Some(tat), 110 * S, 5);
        assert_eq!((g.granted, g.next_at_us), (1, 111 * S));
        // Already further ahead than the pause: unchanged; behind it: moved on.
        assert_eq!(paused(&limit, Some(200 * S), 110 * S), 200 * S);
        assert_eq!(paused(&limit, Some(100 * S), 110 * S), 114 * S);
    }

    /// Over any span, the sends granted are at most the burst plus the rate's share of
    /// the span, whatever the pattern of asks.
    #[test]
    fn no_span_gets_more_than_the_rate_allows() {
        let limit = Limit::new(Rate::parse("50/s").unwrap(), 5).unwrap();
        let mut tat = None;
        let mut sent: Vec<i64> = vec![];
        let mut now = 0i64;
        for i in 0..5_000u32 {
            now += i64::from(i % 7) * 3_000;
            let g = take(&limit, tat, now, i % 4);
            assert!(g.next_at_us >= now);
            tat = Some(g.tat_us);
            sent.extend(std::iter::repeat_n(now, g.granted as usize));
        }
        for (i, t) in sent.iter().enumerate() {
            let within = sent[i..].iter().take_while(|u| **u < t + S).count();
            assert!(within <= 50 + 5, "{within} sends in the second from {t}");
        }
        // Asked for more than the rate all along: it got the rate, not less.
        let allowed = now / S * 50;
        assert!(sent.len() as i64 >= allowed * 95 / 100, "{} sent of {allowed}: starved", sent.len());
    }
}
