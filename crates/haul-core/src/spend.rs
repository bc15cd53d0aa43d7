//! What the agent's model calls cost, and the budgets that stop a runaway.
//!
//! An LLM decision records its usage ([`LlmUsage`]: model, tokens in and out, cost,
//! the prompt's hashes) in its `decision_recorded`; a load's lifetime spend is then a
//! fold of its log (`LoadState::spend`) and a client's spend per day is derived data
//! written in the same append (`derived::SpendDelta`). Before a model call the
//! budgets ([`Budgets`]) are checked against both; past one the SOP decides and the
//! decision says why ([`BudgetExceeded`]).
//!
//! Money is kept in whole micro-dollars (`u64`), so sums are exact in every store and
//! across processes: a price in USD per million tokens times a token count *is* a cost
//! in micro-dollars.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// One model call's cost, as its decision records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmUsage {
    /// The model asked for: the price table's key (`decider.llm.model`).
    pub model: String,
    /// The model the endpoint says answered (a dated version of `model`), when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The cost by the price table; absent when the model has no price there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// SHA-256 (hex) of the fixed part of the prompt: the system message, the tools,
    /// the model's settings. Its text is stored once in the store's prompts.
    pub prompt_hash: String,
    /// SHA-256 (hex) of the user message (the load's state, the event, `now`, the
    /// policy); its text is stored in the store's prompts, not in the log.
    pub input_hash: String,
    /// The client the call is charged to (the load's, when it has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// A model's price, in USD per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_usd_per_mtok: f64,
    pub output_usd_per_mtok: f64,
}

impl Price {
    /// The cost of a call in micro-dollars, rounded to the nearest.
    pub fn cost_micro_usd(&self, input_tokens: u64, output_tokens: u64) -> u64 {
        let micro = input_tokens as f64 * self.input_usd_per_mtok + output_tokens as f64 * self.output_usd_per_mtok;
        micro.round().max(0.0) as u64
    }

    /// Why this price cannot be used, naming the setting (`at`).
    pub fn check(&self, at: &str) -> Result<(), String> {
        for (name, v) in
            [("input_usd_per_mtok", self.input_usd_per_mtok), ("output_usd_per_mtok", self.output_usd_per_mtok)]
        {
            if !v.is_finite() || !(0.0..=1_000_000.0).contains(&v) {
                return Err(format!("{at}.{name} must be a price from 0 to 1000000 USD per million tokens, not {v}"));
            }
        }
        Ok(())
    }
}

/// Spend so far: a load's lifetime or a client's day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spend {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micro_usd: u64,
    /// Model calls counted.
    pub calls: u64,
}

impl Spend {
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// One call's spend.
    pub fn add(&mut self, u: &LlmUsage) {
        let call = Spend {
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cost_micro_usd: u.cost_micro_usd.unwrap_or(0),
            calls: 1,
        };
        self.absorb(&call);
    }

    /// Another spend (of the same load or client day) added to this one.
    pub fn absorb(&mut self, other: &Spend) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_micro_usd = self.cost_micro_usd.saturating_add(other.cost_micro_usd);
        self.calls = self.calls.saturating_add(other.calls);
    }

    pub fn is_zero(&self) -> bool {
        *self == Spend::default()
    }
}

/// One budget's limits; a limit not set does not bind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_usd: Option<u64>,
}

impl Limit {
    /// The first of the limits `spent` has reached: (unit, limit, spent).
    fn reached(&self, spent: &Spend) -> Option<(Unit, u64, u64)> {
        if let Some(t) = self.tokens.filter(|t| spent.tokens() >= *t) {
            return Some((Unit::Tokens, t, spent.tokens()));
        }
        self.micro_usd.filter(|m| spent.cost_micro_usd >= *m).map(|m| (Unit::MicroUsd, m, spent.cost_micro_usd))
    }

    pub fn is_set(&self) -> bool {
        self.tokens.is_some() || self.micro_usd.is_some()
    }
}

/// The budgets: one load's whole life, one client's UTC day, and a client's own
/// day budget over the default one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Budgets {
    pub load: Limit,
    pub client_day: Limit,
    pub clients_day: BTreeMap<String, Limit>,
}

impl Budgets {
    /// The day budget of `client` (its own, else the default).
    pub fn client_day_of(&self, client: Option<&str>) -> Limit {
        client.and_then(|c| self.clients_day.get(c)).copied().unwrap_or(self.client_day)
    }

    /// Whether any budget binds, so the per-day spend needs reading at all.
    pub fn any(&self) -> bool {
        self.load.is_set() || self.client_day.is_set() || self.clients_day.values().any(Limit::is_set)
    }

    /// Whether any money budget binds (so the model needs a price).
    pub fn any_money(&self) -> bool {
        self.load.micro_usd.is_some()
            || self.client_day.micro_usd.is_some()
            || self.clients_day.values().any(|l| l.micro_usd.is_some())
    }

    /// The budget a model call would go past, if any: the load's first, then the
    /// client's day. `day_capped` says the client's day was already capped by an
    /// earlier decision (so this one does not raise the alert again).
    pub fn check(
        &self,
        client: Option<&str>,
        load: &LoadSpend,
        day: &Spend,
        day_capped: bool,
    ) -> Option<BudgetExceeded> {
        if let Some((unit, limit, spent)) = self.load.reached(&load.spend) {
            return Some(BudgetExceeded { scope: Scope::Load, client: None, unit, limit, spent, first: !load.capped });
        }
        let (unit, limit, spent) = self.client_day_of(client).reached(day)?;
        Some(BudgetExceeded {
            scope: Scope::ClientDay,
            client: client.map(str::to_owned),
            unit,
            limit,
            spent,
            first: !day_capped,
        })
    }
}

/// A load's lifetime spend, as its log folds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadSpend {
    #[serde(flatten)]
    pub spend: Spend,
    /// A decision of this load was already made by the SOP past the load's budget.
    #[serde(default)]
    pub capped: bool,
}

impl LoadSpend {
    pub fn is_zero(&self) -> bool {
        self.spend.is_zero() && !self.capped
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The load's whole life.
    Load,
    /// The client's UTC day.
    ClientDay,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Load => "load",
            Scope::ClientDay => "client_day",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Tokens,
    MicroUsd,
}

/// A budget a decision found spent: the SOP decided instead of the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetExceeded {
    pub scope: Scope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    pub unit: Unit,
    pub limit: u64,
    pub spent: u64,
    /// The first decision past this budget (its load's, or its client's day): the one
    /// that raises the OpsAlert.
    pub first: bool,
}

impl fmt::Display for BudgetExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whose = match (&self.scope, &self.client) {
            (Scope::Load, _) => "the load's lifetime LLM budget".to_owned(),
            (Scope::ClientDay, Some(c)) => format!("client {c}'s LLM budget for the day"),
            (Scope::ClientDay, None) => "the LLM budget for the day of loads without a client".to_owned(),
        };
        match self.unit {
            Unit::Tokens => write!(f, "{whose} is spent: {} of {} tokens", self.spent, self.limit),
            Unit::MicroUsd => write!(f, "{whose} is spent: {} of {}", usd(self.spent), usd(self.limit)),
        }
    }
}

/// Micro-dollars as dollars, to the micro-dollar: `$0.001250`.
pub fn usd(micro: u64) -> String {
    format!("${}.{:06}", micro / 1_000_000, micro % 1_000_000)
}

/// A budget in dollars (`2.50`, `"$2.50"`) as micro-dollars; an error says what was
/// wrong, for the caller to name the setting.
pub fn parse_usd(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_prefix('$').unwrap_or(t);
    let (whole, frac) = t.split_once('.').unwrap_or((t, ""));
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (!frac.is_empty() && !digits(frac)) || frac.len() > 6 || whole.len() > 9 {
        return Err(format!("{s:?} is not an amount of dollars (like 2.50, at most 6 decimals)"));
    }
    let whole: u64 = whole.parse().map_err(|_| format!("{s:?} is not an amount of dollars"))?;
    let frac_micro: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<6}").parse().unwrap_or(0) };
    Ok(whole * 1_000_000 + frac_micro)
}

/// Whether `s` is a prompt's hash as decisions name them: SHA-256, 64 lowercase hex.
pub fn is_prompt_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The UTC day a time falls on, `YYYY-MM-DD`: a client's day budget's key.
pub fn day_of(t: Timestamp) -> String {
    t.strftime("%Y-%m-%d").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, cost: Option<u64>) -> LlmUsage {
        LlmUsage {
            model: "m".into(),
            model_version: None,
            input_tokens: input,
            output_tokens: output,
            cost_micro_usd: cost,
            finish_reason: None,
            prompt_hash: "p".into(),
            input_hash: "i".into(),
            client: None,
        }
    }

    #[test]
    fn a_price_per_million_tokens_times_tokens_is_micro_dollars() {
        let check = |p: (f64, f64), tokens: (u64, u64), want: u64| {
            let price = Price { input_usd_per_mtok: p.0, output_usd_per_mtok: p.1 };
            assert_eq!(price.cost_micro_usd(tokens.0, tokens.1), want, "{p:?} {tokens:?}");
        };
        check((2.5, 10.0), (1_000_000, 0), 2_500_000);
        check((2.5, 10.0), (1000, 100), 3500);
        check((0.15, 0.6), (1234, 56), 219);
        check((0.0, 0.0), (5, 5), 0);
    }

    #[test]
    fn prices_outside_reason_name_the_setting() {
        let bad = Price { input_usd_per_mtok: -1.0, output_usd_per_mtok: 1.0 };
        let e = bad.check("decider.llm.prices.m").unwrap_err();
        assert!(e.contains("decider.llm.prices.m.input_usd_per_mtok"), "{e}");
        let nan = Price { input_usd_per_mtok: 1.0, output_usd_per_mtok: f64::NAN };
        assert!(nan.check("x").unwrap_err().contains("x.output_usd_per_mtok"));
        assert!(Price { input_usd_per_mtok: 0.0, output_usd_per_mtok: 1e6 }.check("x").is_ok());
    }

    #[test]
    fn dollars_read_and_print_to_the_micro_dollar() {
        let check = |s: &str, want: Result<u64, ()>| assert_eq!(parse_usd(s).map_err(|_| ()), want, "{s}");
        check("2.50", Ok(2_500_000));
        check("$2.5", Ok(2_500_000));
        check("0.000001", Ok(1));
        check("7", Ok(7_000_000));
        check("123456789", Ok(123_456_789_000_000));
        check(" 3.25 ", Ok(3_250_000));
        for bad in ["", "-1", "1.2.3", "abc", "1.0000001", "$", "1e3", "9999999999"] {
            check(bad, Err(()));
        }
        assert_eq!(usd(2_500_000), "$2.500000");
        assert_eq!(usd(1250), "$0.001250");
        assert_eq!(usd(0), "$0.000000");
    }

    #[test]
    fn spend_adds_calls_and_their_costs() {
        let mut s = Spend::default();
        assert!(s.is_zero());
        s.add(&usage(100, 20, Some(50)));
        s.add(&usage(10, 2, None));
        assert_eq!(s, Spend { input_tokens: 110, output_tokens: 22, cost_micro_usd: 50, calls: 2 });
        assert_eq!(s.tokens(), 132);
        assert!(!s.is_zero());
    }

    #[test]
    fn a_budget_binds_once_its_limit_is_reached() {
        let budgets = Budgets {
            load: Limit { tokens: Some(1000), micro_usd: None },
            client_day: Limit { tokens: None, micro_usd: Some(5_000_000) },
            clients_day: [("big".to_owned(), Limit { tokens: None, micro_usd: Some(50_000_000) })].into(),
        };
        let load = |tokens: u64, capped: bool| LoadSpend {
            spend: Spend { input_tokens: tokens, output_tokens: 0, cost_micro_usd: 0, calls: 1 },
            capped,
        };
        let day = |micro: u64| Spend { cost_micro_usd: micro, ..Spend::default() };
        let check =
            |client: Option<&str>, l: LoadSpend, d: Spend, capped: bool, want: Option<(Scope, Unit, u64, bool)>| {
                let got = budgets.check(client, &l, &d, capped).map(|b| (b.scope, b.unit, b.limit, b.first));
                assert_eq!(got, want, "{client:?} {l:?} {d:?}");
            };
        check(Some("a"), load(999, false), day(4_999_999), false, None);
        check(Some("a"), load(1000, false), day(0), false, Some((Scope::Load, Unit::Tokens, 1000, true)));
        check(Some("a"), load(1000, true), day(0), false, Some((Scope::Load, Unit::Tokens, 1000, false)));
        check(
            Some("a"),
            load(10, false),
            day(5_000_000),
            false,
            Some((Scope::ClientDay, Unit::MicroUsd, 5_000_000, true)),
        );
        check(
            Some("a"),
            load(10, false),
            day(5_000_000),
            true,
            Some((Scope::ClientDay, Unit::MicroUsd, 5_000_000, false)),
        );
        check(Some("big"), load(10, false), day(5_000_000), false, None);
        check(None, load(10, false), day(5_000_000), false, Some((Scope::ClientDay, Unit::MicroUsd, 5_000_000, true)));
        assert!(budgets.any() && budgets.any_money());
        assert!(!Budgets::default().any());
        let tokens_only = Budgets { load: Limit { tokens: Some(1), micro_usd: None }, ..Budgets::default() };
        assert!(tokens_only.any() && !tokens_only.any_money());
    }

    /// Whether a budget binds at all, and whether one is in dollars: each limit alone.
    #[test]
    fn any_limit_binds_and_only_dollars_need_a_price() {
        let tokens = Limit { tokens: Some(1), micro_usd: None };
        let usd = Limit { tokens: None, micro_usd: Some(1) };
        let check = |b: Budgets, want: (bool, bool)| assert_eq!((b.any(), b.any_money()), want, "{b:?}");
        check(Budgets::default(), (false, false));
        check(Budgets { load: tokens, ..Budgets::default() }, (true, false));
        check(Budgets { load: usd, ..Budgets::default() }, (true, true));
        check(Budgets { client_day: tokens, ..Budgets::default() }, (true, false));
        check(Budgets { client_day: usd, ..Budgets::default() }, (true, true));
        let own = |l: Limit| Budgets { clients_day: [("c".to_owned(), l)].into(), ..Budgets::default() };
        check(own(tokens), (true, false));
        check(own(usd), (true, true));
        check(own(Limit::default()), (false, false));
    }

    /// A load's spend is left out of its state's JSON only when it is nothing at all.
    #[test]
    fn a_loads_spend_is_zero_only_with_no_call_and_no_cap() {
        let check = |l: LoadSpend, want: bool| assert_eq!(l.is_zero(), want, "{l:?}");
        check(LoadSpend::default(), true);
        check(LoadSpend { capped: true, ..LoadSpend::default() }, false);
        check(LoadSpend { spend: Spend { calls: 1, ..Spend::default() }, capped: false }, false);
    }

    /// A scope's name is its name on the wire (the decision's `budget.scope`, metrics).
    #[test]
    fn scopes_are_named_as_they_are_written() {
        for (scope, name) in [(Scope::Load, "load"), (Scope::ClientDay, "client_day")] {
            assert_eq!(scope.as_str(), name);
            assert_eq!(serde_json::to_value(scope).unwrap(), serde_json::json!(name));
        }
    }

    #[test]
    fn what_an_exceeded_budget_says() {
        let b = |scope, client: Option<&str>, unit, limit, spent| BudgetExceeded {
            scope,
            client: client.map(str::to_owned),
            unit,
            limit,
            spent,
            first: true,
        };
        assert_eq!(
            b(Scope::Load, None, Unit::Tokens, 1000, 1200).to_string(),
            "the load's lifetime LLM budget is spent: 1200 of 1000 tokens"
        );
        assert_eq!(
            b(Scope::ClientDay, Some("acme"), Unit::MicroUsd, 5_000_000, 5_000_100).to_string(),
            "client acme's LLM budget for the day is spent: $5.000100 of $5.000000"
        );
    }

    #[test]
    fn a_prompt_hash_is_64_lowercase_hex() {
        let check = |s: &str, want: bool| assert_eq!(is_prompt_hash(s), want, "{s}");
        check(&"0a".repeat(32), true);
        check(&"f9".repeat(32), true);
        check(&"0a".repeat(31), false);
        check(&"0A".repeat(32), false);
        check(&"0g".repeat(32), false);
        check(&format!("{}/", "a".repeat(63)), false);
        check("", false);
    }

    #[test]
    fn a_day_is_the_utc_date() {
        let t: Timestamp = "2026-03-02T23:59:59.9Z".parse().unwrap();
        assert_eq!(day_of(t), "2026-03-02");
    }
}
