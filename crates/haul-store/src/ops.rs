//! Queries across loads, for operators: which loads need a person, the dead outbox
//! rows, the overdue timers, the unmatched SMS, and the figures monitoring reads from
//! the store at scrape time.
//!
//! Every list is a keyset page (a cursor names a position, never an offset) with a
//! bound, and every statement behind it is served by an index (on PostgreSQL the
//! EXPLAIN test holds that). A load's stage, its asks and its last activity are a small
//! summary on the `loads` row, kept by `append` in the append's own transaction
//! (`NewEntry::derived`, made by `haul_core::derived` from the typed entry): the log
//! stays the source of truth, and the summary is the fold of its stage and ask changes,
//! as the projection folds them.

use async_trait::async_trait;
use haul_core::action::{ActionType, ChannelClass};
use haul_core::decision::InboxState;
use haul_core::ids::LoadId;
use haul_core::time::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{OpsAlertRecord, OutboxRow, RowCursor, SmsConsent, StoreError, Timer, UnmatchedSms};

/// Items per page when the caller names no limit.
pub const DEFAULT_PAGE: usize = 50;
/// The most items one page holds.
pub const MAX_PAGE: usize = 500;
/// Loads one page of [`OpsQueries::loads_page`] examines at most, in load id order.
/// A filter that few loads match gives short (even empty) pages with a cursor to go on
/// from, so no page costs more than this many rows of `loads` and their probes.
pub const LOADS_SCANNED_PER_PAGE: usize = 5000;

/// Which loads [`OpsQueries::loads_page`] returns: every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadFilter {
    /// The load's stage is this one.
    pub stage: Option<String>,
    /// At least one ask is open.
    pub open_asks: bool,
    /// At least one ask was escalated to a person.
    pub escalated: bool,
    /// At least one outbox row is dead.
    pub has_dead: bool,
    /// A pending outbox row was created at or before this (its age is over the limit).
    pub pending_created_by: Option<Timestamp>,
    /// A scheduled timer was due at or before this (it is overdue by that much).
    pub timer_due_by: Option<Timestamp>,
    /// The last record was appended before this.
    pub active_before: Option<Timestamp>,
    /// The last record was appended at or after this.
    pub active_since: Option<Timestamp>,
}

/// One load's summary: what `loads` keeps besides the version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadSummary {
    pub load_id: LoadId,
    /// `seq` of the last record.
    pub version: u64,
    pub stage: Option<String>,
    pub open_asks: u32,
    pub escalated_asks: u32,
    pub created_at: Timestamp,
    /// When the last record was appended.
    pub last_activity_at: Timestamp,
}

/// A page of loads and where the next one starts (`None`: nothing after it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadsPage {
    pub loads: Vec<LoadSummary>,
    pub next_after: Option<LoadId>,
}

/// Where a problem stands in the operators' inbox (a dead row, the OpsAlert about
/// one, an unmatched SMS), what took it out and when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxMark {
    pub state: InboxState,
    /// What took it out: the event whose decision marked a dead row; the operator
    /// event an unmatched SMS was assigned by; the operator who dismissed one.
    pub by: Option<String>,
    pub at: Option<Timestamp>,
}

impl InboxMark {
    pub const OPEN: InboxMark = InboxMark { state: InboxState::Open, by: None, at: None };

    /// From a row's stored state (NULL: open), `by` and `at` (ms).
    pub fn stored(state: Option<&str>, by: Option<String>, at: Option<i64>) -> Option<InboxMark> {
        let state = match state {
            None => return Some(InboxMark::OPEN),
            Some(s) => InboxState::parse(s)?,
        };
        Some(InboxMark { state, by, at: at.map(haul_core::time::from_ms) })
    }
}

/// A dead outbox row and when it died.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadRow {
    pub row: OutboxRow,
    pub dead_at: Timestamp,
    /// When its failed outcome reached the log, and for a Hero-channel or internal row
    /// the OpsAlert was delivered (the dispatcher marks it after both); `None` while
    /// either is still to do (the sweep retries).
    pub outcome_published_at: Option<Timestamp>,
    /// Where it stands in the operators' inbox.
    pub inbox: InboxMark,
}

/// An OpsAlert with where the dead row it is about stands in the inbox (open when the
/// row is gone: retention removed it).
#[derive(Clone, Debug, PartialEq)]
pub struct InboxAlert {
    pub alert: OpsAlertRecord,
    pub inbox: InboxMark,
}

/// An unmatched SMS with where it stands in the inbox: handled once assigned to a
/// load, dismissed with a reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxSms {
    pub sms: UnmatchedSms,
    pub inbox: InboxMark,
    /// The load it was assigned to.
    pub assigned_load: Option<LoadId>,
    /// Why an operator dismissed it.
    pub dismissed_reason: Option<String>,
}

/// What [`OpsQueries::dismiss_unmatched_sms`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SmsDismissal {
    /// Dismissed now.
    Dismissed,
    /// Dismissed before (by this or another request).
    Already { by: String, at: Timestamp },
    /// Assigned to a load (by the operator event `event_id`) before: handled, not to
    /// be dismissed.
    Assigned { load_id: LoadId, event_id: String },
    /// No unmatched SMS has this MessageSid.
    NotFound,
}

/// Open problems, each count at most the bound it was counted to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InboxCounts {
    /// Open dead rows by action type (types with none left out).
    pub dead: Vec<(ActionType, u64)>,
    /// OpsAlerts whose dead row is open.
    pub alerts: u64,
    /// Unmatched SMS neither assigned nor dismissed.
    pub unmatched: u64,
}

impl InboxCounts {
    /// Open dead rows of a class (`external`, `hero_channel`, `internal`).
    pub fn dead_of(&self, class: ChannelClass) -> u64 {
        self.dead.iter().filter(|(t, _)| t.class() == class).map(|(_, n)| n).sum()
    }
}

/// The state filter as the statements take it: `None` (every state) or the name.
pub fn state_param(state: Option<InboxState>) -> Option<&'static str> {
    state.map(InboxState::as_str)
}

impl DeadRow {
    /// The cursor of the page after this row (newest first: the next page is older).
    pub fn cursor(&self) -> RowCursor {
        RowCursor { created_at: self.dead_at, id: self.row.id.clone() }
    }
}

/// A load whose appends the version check refused: how often, and when last.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictLoad {
    pub load_id: LoadId,
    pub conflicts: u64,
    pub last_conflict_at: Timestamp,
}

/// `external`, `hero_channel` or `internal`.
pub fn class_name(class: ChannelClass) -> &'static str {
    match class {
        ChannelClass::External => "external",
        ChannelClass::HeroChannel => "hero_channel",
        ChannelClass::Internal => "internal",
    }
}

/// The action types of a class named by [`class_name`]; `None` for another name.
pub fn class_types(name: &str) -> Option<Vec<ActionType>> {
    let class = [ChannelClass::External, ChannelClass::HeroChannel, ChannelClass::Internal]
        .into_iter()
        .find(|c| class_name(*c) == name)?;
    Some(ActionType::ALL.into_iter().filter(|t| t.class() == class).collect())
}

/// The action types as the statements take them: `,send_sms,set_timer,` (every type
/// when `types` is empty), matched with `',' || action_type || ','`.
pub fn types_param(types: &[ActionType]) -> String {
    let types = if types.is_empty() { &ActionType::ALL[..] } else { types };
    let mut s = String::from(",");
    for t in types {
        s.push_str(t.as_str());
        s.push(',');
    }
    s
}

#[async_trait]
pub trait OpsQueries: Send + Sync {
    /// `fire_at` of the earliest scheduled timer due at `now` (`fire_at <= now`): how
    /// late the pump is, whether or not a pump runs.
    async fn oldest_due_timer(&self, now: Timestamp) -> Result<Option<Timestamp>, StoreError>;

    /// Loads after `after` (load id order) that match `filter`, at most `limit`, among
    /// at most [`LOADS_SCANNED_PER_PAGE`] loads examined.
    async fn loads_page(
        &self,
        filter: &LoadFilter,
        after: Option<&LoadId>,
        limit: usize,
    ) -> Result<LoadsPage, StoreError>;

    /// Dead rows of these action types (all when empty) in this inbox state (any when
    /// `None`), newest first (`dead_at`, then id, descending), before the position
    /// `before`, at most `limit`.
    async fn dead_rows_page(
        &self,
        types: &[ActionType],
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<DeadRow>, StoreError>;

    /// Scheduled timers due at or before `due_by`, the most overdue first (`fire_at`,
    /// then timer id), after the position `after`, at most `limit`.
    async fn overdue_timers_page(
        &self,
        due_by: Timestamp,
        after: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<Timer>, StoreError>;

    /// The phones opted out of SMS now, the latest opt-out first (`changed_at`, then
    /// phone, descending), before the position `before`, at most `limit`.
    async fn opted_out_page(&self, before: Option<&RowCursor>, limit: usize) -> Result<Vec<SmsConsent>, StoreError>;

    /// Unmatched SMS in this inbox state (any when `None`), newest first
    /// (`received_at`, then sid, descending), before the position `before`, at most
    /// `limit`.
    async fn unmatched_sms_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxSms>, StoreError>;

    /// The OpsAlerts raised whose dead row is in this inbox state (any when `None`),
    /// newest first (`raised_at`, then outbox id, descending), before the position
    /// `before`, at most `limit`.
    async fn ops_alerts_page(
        &self,
        state: Option<InboxState>,
        before: Option<&RowCursor>,
        limit: usize,
    ) -> Result<Vec<InboxAlert>, StoreError>;

    /// The unmatched SMS `message_sid` with where it stands, if the list holds it.
    async fn unmatched_sms_one(&self, message_sid: &str) -> Result<Option<InboxSms>, StoreError>;

    /// The open problems, each kind counted to at most `bound`.
    async fn inbox_counts(&self, bound: usize) -> Result<InboxCounts, StoreError>;

    /// Takes the unmatched SMS `message_sid` out of the inbox for good: `by` (an
    /// operator) says why. An assigned one is handled already and stays so.
    async fn dismiss_unmatched_sms(
        &self,
        message_sid: &str,
        by: &str,
        reason: &str,
        now: Timestamp,
    ) -> Result<SmsDismissal, StoreError>;

    /// Counts one append of `load_id` the version check refused at `now`. Written
    /// outside the refused append's transaction (which rolled back): a count for
    /// operators, not part of the log.
    async fn record_conflict(&self, load_id: &LoadId, now: Timestamp) -> Result<(), StoreError>;

    /// The loads with the most refused appends (then load id), at most `limit`; loads
    /// with none are left out.
    async fn conflict_loads(&self, limit: usize) -> Result<Vec<ConflictLoad>, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_name_their_types() {
        assert_eq!(class_types("hero_channel"), Some(vec![ActionType::CreateHeroTask, ActionType::PostHeroSlack]));
        assert_eq!(class_types("external"), Some(vec![ActionType::SendSms]));
        assert_eq!(class_types("nope"), None);
        assert_eq!(types_param(&[ActionType::SendSms]), ",send_sms,");
        assert!(types_param(&[]).contains(",update_stage,"));
    }
}
