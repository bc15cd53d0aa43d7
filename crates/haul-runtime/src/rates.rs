//! Send limits changed while haul runs (docs/design.md, "Send rates"): a carrier cuts
//! a number's throughput, a 10DLC brand's trust score moves, an incident calls for a
//! slower Hero channel, and nobody should have to restart every dispatcher for it. An
//! operator's change (`haul operator set-rate`, `POST /v1/operator/channel-rate`) is
//! kept in the store with who and why; every dispatcher reads the channels' current
//! changes at least once a second ([`REFRESH`]) and lays them over its settings
//! ([`effective`]).

use std::time::Duration;

use haul_core::action::ActionType;
use haul_core::ids::check_request_id;
use haul_core::limit::{Limit, Rate};
use haul_core::time::Timestamp;
use haul_core::{BadInput, Channel, PerChannel};
use haul_store::{RateChange, Store};
use serde::Serialize;
use tracing::info;

use crate::operator::{OperatorError, Requester};

/// How often a dispatcher reads the operators' changes: one is in force within this.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Changes the API's `GET /v1/operator/channel-rates` lists.
pub const MAX_HISTORY: usize = 50;

/// Each channel's limit: its latest change's, else its settings'. A change with no
/// limit puts the settings' back.
pub fn effective(configured: &PerChannel<Option<Limit>>, current: &[RateChange]) -> PerChannel<Option<Limit>> {
    PerChannel::from_fn(|c| {
        let settings = *configured.get(c);
        current.iter().find(|r| r.channel == c.config_name()).map_or(settings, |r| r.limit.or(settings))
    })
}

/// What a change request asks: a channel's new rate and burst, or (no rate) its
/// settings' limit again.
#[derive(Clone, Debug, Default)]
pub struct RateRequest {
    pub channel: String,
    /// `N/s`, `N/min`, `N/h`; `None`: back to the settings.
    pub rate: Option<String>,
    /// Sends at once after a quiet spell (1 when not given); only with a rate.
    pub burst: Option<u32>,
}

impl RateRequest {
    /// The channel and its new limit, or what is wrong (naming the field).
    pub fn check(&self) -> Result<(Channel, Option<Limit>), BadInput> {
        let channel = Channel::from_config_name(&self.channel).ok_or_else(|| {
            let names: Vec<&str> = Channel::ALL.map(Channel::config_name).to_vec();
            BadInput::new(
                "bad_channel",
                format!("channel {:?} is not one of {}", clip(&self.channel), names.join(", ")),
            )
        })?;
        let limit = match (&self.rate, self.burst) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(BadInput::new("bad_rate", "burst without a rate: give the rate too, or neither"));
            }
            (Some(rate), burst) => {
                let rate = Rate::parse(rate).map_err(|e| BadInput::new("bad_rate", format!("rate: {e}")))?;
                Some(Limit::new(rate, burst.unwrap_or(1)).map_err(|e| BadInput::new("bad_rate", e))?)
            }
        };
        Ok((channel, limit))
    }
}

fn clip(s: &str) -> String {
    s.chars().take(32).collect()
}

/// What a change did: the change as kept, and the channel's limit before and after.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RateChanged {
    /// `changed`, or `duplicate` (a retry of a request already made: nothing more).
    pub status: &'static str,
    #[serde(flatten)]
    pub change: RateChange,
    /// The channel's limit before (`null`: none).
    pub previous: Option<Limit>,
    /// The channel's limit now, once the dispatchers have read it (within a second).
    pub effective: Option<Limit>,
    /// The settings' limit (`channels.*.rate`), what a change with no rate puts back.
    pub configured: Option<Limit>,
    /// The channel's rows held back by its old limit that were made due again, to be
    /// held anew at the limit now in force (a duplicate does it again).
    pub held_requeued: u64,
}

/// Records an operator's change of a channel's limit, once per request id. A retry
/// answers `duplicate` with the change as first made; the id reused for another
/// change is refused (`request_id_reused`).
pub async fn change_rate(
    store: &dyn Store,
    configured: &PerChannel<Option<Limit>>,
    who: &Requester,
    request: &RateRequest,
    now: Timestamp,
) -> Result<RateChanged, OperatorError> {
    check_request_id(&who.request_id)?;
    haul_core::event::validate_actor_and_reason(&who.actor, &who.reason)?;
    let (channel, limit) = request.check()?;
    let before = effective(configured, &store.current_rates().await?);
    let change = RateChange {
        request_id: who.request_id.clone(),
        channel: channel.config_name().to_owned(),
        limit,
        actor: who.actor.clone(),
        reason: who.reason.clone(),
        changed_at: now,
    };
    let (kept, made) = store.change_rate(&change).await?;
    let same = (&kept.channel, kept.limit, &kept.actor, &kept.reason)
        == (&change.channel, change.limit, &change.actor, &change.reason);
    if !same {
        return Err(OperatorError::RateRequestReused(who.request_id.clone()));
    }
    let status = if made { "changed" } else { "duplicate" };
    let after = effective(configured, &store.current_rates().await?);
    // Rows held at the old limit were given slots at its spacing: spaced again at the
    // new one (a raise would otherwise wait out the old slots). A retry does it again,
    // so one whose first try failed here finishes the change.
    let types = ActionType::of_channel(channel);
    let held_requeued = store.requeue_held(channel.config_name(), &types, now).await?;
    if made {
        let (rate, burst) = (limit.map(|l| l.rate.to_string()), limit.map(|l| l.burst));
        info!(channel = channel.config_name(), rate, burst, held_requeued, actor = %who.actor, reason = %who.reason, request_id = %who.request_id, "send limit changed");
    }
    Ok(RateChanged {
        status,
        change: kept,
        previous: *before.get(channel),
        effective: *after.get(channel),
        configured: *configured.get(channel),
        held_requeued,
    })
}

/// Every channel's limit as the dispatchers apply it, with where it comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChannelRate {
    pub channel: &'static str,
    pub effective: Option<Limit>,
    pub configured: Option<Limit>,
    /// The operator's change in force, if any.
    pub changed: Option<RateChange>,
}

/// Each channel's limit now, and the latest changes, newest first.
pub async fn channel_rates(
    store: &dyn Store,
    configured: &PerChannel<Option<Limit>>,
) -> Result<(Vec<ChannelRate>, Vec<RateChange>), OperatorError> {
    let current = store.current_rates().await?;
    let live = effective(configured, &current);
    let rates = Channel::ALL
        .into_iter()
        .map(|c| ChannelRate {
            channel: c.config_name(),
            effective: *live.get(c),
            configured: *configured.get(c),
            changed: current.iter().find(|r| r.channel == c.config_name() && r.limit.is_some()).cloned(),
        })
        .collect();
    Ok((rates, store.rate_changes(MAX_HISTORY).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: &str, burst: u32) -> Option<Limit> {
        Some(Limit::new(Rate::parse(rate).unwrap(), burst).unwrap())
    }

    fn change(channel: &str, l: Option<Limit>) -> RateChange {
        RateChange {
            request_id: "r".into(),
            channel: channel.into(),
            limit: l,
            actor: "a".into(),
            reason: "why".into(),
            changed_at: haul_core::time::from_ms(0),
        }
    }

    #[test]
    fn a_change_overrides_the_settings_and_no_rate_puts_them_back() {
        let configured = PerChannel::from_fn(|c| if c == Channel::Sms { limit("1/s", 5) } else { None });
        let check = |current: &[RateChange], sms: Option<Limit>, hero: Option<Limit>| {
            let e = effective(&configured, current);
            assert_eq!((*e.get(Channel::Sms), *e.get(Channel::Hero)), (sms, hero), "{current:?}");
        };
        check(&[], limit("1/s", 5), None);
        check(&[change("sms", limit("10/s", 2))], limit("10/s", 2), None);
        check(&[change("sms", None)], limit("1/s", 5), None);
        check(&[change("hero", limit("12/min", 1))], limit("1/s", 5), limit("12/min", 1));
        check(&[change("nonsense", limit("12/min", 1))], limit("1/s", 5), None);
    }

    fn check(channel: &str, rate: Option<&str>, burst: Option<u32>, want: Result<Option<Limit>, &str>) {
        let r = RateRequest { channel: channel.into(), rate: rate.map(str::to_owned), burst };
        match (r.check(), want) {
            (Ok((_, got)), Ok(want)) => assert_eq!(got, want),
            (Err(e), Err(part)) => assert!(e.message.contains(part), "{}: {}", e.code, e.message),
            (got, want) => panic!("{channel} {rate:?} {burst:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn a_request_says_what_is_wrong_with_it() {
        check("sms", Some("10/s"), Some(3), Ok(limit("10/s", 3)));
        check("sms", Some("10/s"), None, Ok(limit("10/s", 1)));
        check("hero", None, None, Ok(None));
        check("fax", Some("1/s"), None, Err("channel \"fax\" is not one of sms, hero"));
        check("sms", Some("fast"), None, Err("rate: \"fast\" is not a rate"));
        check("sms", Some("0/s"), None, Err("allows no send"));
        check("sms", Some("1/s"), Some(0), Err("burst 0 is not 1 to"));
        check("sms", None, Some(3), Err("burst without a rate"));
        let e = RateRequest { channel: "fax".into(), ..Default::default() }.check().unwrap_err();
        assert_eq!(e.code, "bad_channel");
        let e = RateRequest { channel: "sms".into(), rate: Some("x".into()), burst: None }.check().unwrap_err();
        assert_eq!(e.code, "bad_rate");
    }
}
