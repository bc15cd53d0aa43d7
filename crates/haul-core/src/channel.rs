//! The channel services haul sends to, as data: one list, and each channel's names.
//!
//! Two names per channel, both public contracts: the config name
//! (`channels.{name}.url`, the fake services' path prefix, record mode's log) and the
//! scenario name (`[[fault]] channel` and `expect.sent.channel` in eval files). Code
//! that goes over channels matches on [`Channel`] without a catch-all arm, so a new
//! channel is a variant here with its names, plus its config field; the compiler names
//! every other place.

use std::fmt;

crate::listed_enum! {
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Channel {
        /// Texts to drivers.
        Sms,
        /// Hero tasks.
        Hero,
        /// Hero team Slack posts.
        Slack,
        /// The TMS (load stages).
        Tms,
        /// OpsAlerts: independent of the Hero tooling, so a Hero outage cannot loop.
        Ops,
    }
}

impl Channel {
    pub const COUNT: usize = Channel::ALL.len();

    /// The channel's place in [`Channel::ALL`] (declaration order), for tables indexed
    /// by channel.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// `channels.{name}` in the config; also the fake services' path prefix and the
    /// channel recorded in record mode.
    pub fn config_name(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Hero => "hero",
            Channel::Slack => "slack",
            Channel::Tms => "tms",
            Channel::Ops => "ops",
        }
    }

    /// Whether actions go out on this channel (an SMS, a task, a Slack post, a stage);
    /// OpsAlerts are raised about actions, never decided as one.
    pub fn carries_actions(self) -> bool {
        match self {
            Channel::Sms | Channel::Hero | Channel::Slack | Channel::Tms => true,
            Channel::Ops => false,
        }
    }

    /// The name in eval scenario files (docs/scenarios.md).
    pub fn scenario_name(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Hero => "hero_task",
            Channel::Slack => "hero_slack",
            Channel::Tms => "stage",
            Channel::Ops => "ops",
        }
    }

    pub fn from_config_name(name: &str) -> Option<Channel> {
        Channel::ALL.into_iter().find(|c| c.config_name() == name)
    }

    pub fn from_scenario_name(name: &str) -> Option<Channel> {
        Channel::ALL.into_iter().find(|c| c.scenario_name() == name)
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.config_name())
    }
}

/// A table with one value per channel, indexed by [`Channel`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerChannel<T>([T; Channel::COUNT]);

impl<T> PerChannel<T> {
    pub fn from_fn(mut f: impl FnMut(Channel) -> T) -> Self {
        PerChannel(Channel::ALL.map(&mut f))
    }

    /// Like [`PerChannel::from_fn`], stopping at the first error.
    pub fn try_from_fn<E>(mut f: impl FnMut(Channel) -> Result<T, E>) -> Result<Self, E> {
        let mut values = Vec::with_capacity(Channel::COUNT);
        for c in Channel::ALL {
            values.push(f(c)?);
        }
        let mut values = values.into_iter();
        Ok(PerChannel(std::array::from_fn(|_| values.next().expect("one value per channel"))))
    }

    pub fn get(&self, c: Channel) -> &T {
        &self.0[c.index()]
    }

    pub fn get_mut(&mut self, c: Channel) -> &mut T {
        &mut self.0[c.index()]
    }

    pub fn iter(&self) -> impl Iterator<Item = (Channel, &T)> {
        Channel::ALL.into_iter().zip(self.0.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(c: Channel, config: &str, scenario: &str) {
        assert_eq!(c.config_name(), config);
        assert_eq!(c.to_string(), config);
        // Every channel but the OpsAlerts' carries decided actions.
        assert_eq!(c.carries_actions(), c != Channel::Ops, "{c}");
        assert_eq!(c.scenario_name(), scenario);
        assert_eq!(Channel::from_config_name(config), Some(c));
        assert_eq!(Channel::from_scenario_name(scenario), Some(c));
        assert_eq!(Channel::ALL[c.index()], c);
    }

    #[test]
    fn names() {
        check(Channel::Sms, "sms", "sms");
        check(Channel::Hero, "hero", "hero_task");
        check(Channel::Slack, "slack", "hero_slack");
        check(Channel::Tms, "tms", "stage");
        check(Channel::Ops, "ops", "ops");
        assert_eq!(Channel::from_config_name("hero_task"), None);
        assert_eq!(Channel::from_scenario_name("hero"), None);
    }

    #[test]
    fn per_channel_tables() {
        let t = PerChannel::from_fn(Channel::config_name);
        assert_eq!(*t.get(Channel::Tms), "tms");
        assert_eq!(t.iter().map(|(c, _)| c).collect::<Vec<_>>(), Channel::ALL);
        let e: Result<PerChannel<u8>, Channel> =
            PerChannel::try_from_fn(|c| if c == Channel::Slack { Err(c) } else { Ok(0) });
        assert_eq!(e, Err(Channel::Slack));
        let mut n = PerChannel::from_fn(|_| 0);
        *n.get_mut(Channel::Hero) += 2;
        assert_eq!(
            n.iter().map(|(_, v)| *v).collect::<Vec<_>>(),
            Channel::ALL.map(|c| u8::from(c == Channel::Hero) * 2)
        );
    }
}
