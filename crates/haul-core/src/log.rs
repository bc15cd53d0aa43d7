//! A log record, decoded once.
//!
//! The store keeps a record's payload as JSON; it decodes each record as it hands it
//! up ([`Record::decode`]), and everything above it (the projection, replay, the
//! timelines, the invariants, export) matches on the typed [`Entry`]. Nobody above the
//! store picks a field out of JSON by name, and a record that cannot be read is one
//! case ([`Entry::Unreadable`]) every reader handles the same: counted, shown, never a
//! panic. JSON is made again only at the edges that show a record as JSON (the API's
//! view of a load, `--keep`), by [`Record::payload`], which gives back what was
//! stored (a test holds the golden logs to that).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::decision::{DECISION_RECORDED, Decision};
use crate::event::{EventBody, InboundEvent};
use crate::ids::EventId;
use crate::time::Timestamp;
use crate::trace::TraceParent;

/// What one record says.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    /// An inbound event, as the worker appended it.
    Event { event_id: EventId, body: EventBody },
    /// A `decision_recorded`.
    Decision(Decision),
    /// A record this build cannot read (a corrupt row, a kind or a field from a newer
    /// build): kept as stored, so it is shown as it is and skipped by every fold.
    Unreadable { kind: String, payload: Value, reason: String },
}

/// One log record: `{seq, entry_id, kind, payload, recorded_at, trace?}` on the wire
/// and in the store, typed in between.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub seq: u64,
    pub entry_id: String,
    pub entry: Entry,
    pub recorded_at: Timestamp,
    /// The trace context of the run that appended it (`crate::trace`), when it had one.
    pub trace: Option<TraceParent>,
}

impl Entry {
    /// Reads a stored entry: its id, kind and payload.
    pub fn decode(entry_id: &str, kind: &str, payload: Value) -> Entry {
        if kind == DECISION_RECORDED {
            return match Decision::deserialize(&payload) {
                Ok(d) => Entry::Decision(d),
                Err(e) => Entry::Unreadable { kind: kind.to_owned(), payload, reason: e.to_string() },
            };
        }
        let event_id = match EventId::parse(entry_id) {
            Ok(id) => id,
            Err(e) => return Entry::Unreadable { kind: kind.to_owned(), payload, reason: e.message },
        };
        match EventBody::from_payload(kind, payload.clone()) {
            Ok(body) => Entry::Event { event_id, body },
            Err(e) => Entry::Unreadable { kind: kind.to_owned(), payload, reason: e.message },
        }
    }

    /// The record's kind: the event's, `decision_recorded`, or what an unreadable one says.
    pub fn kind(&self) -> &str {
        match self {
            Entry::Event { body, .. } => body.kind(),
            Entry::Decision(_) => DECISION_RECORDED,
            Entry::Unreadable { kind, .. } => kind,
        }
    }

    /// The payload as stored: what the API shows and the store keeps.
    pub fn payload(&self) -> Value {
        match self {
            Entry::Event { body, .. } => body.payload(),
            Entry::Decision(d) => serde_json::to_value(d).expect("a decision always serializes"),
            Entry::Unreadable { payload, .. } => payload.clone(),
        }
    }
}

impl Record {
    /// A stored record, decoded: what the stores hand up.
    pub fn decode(seq: u64, entry_id: String, kind: &str, payload: Value, recorded_at: Timestamp) -> Record {
        let entry = Entry::decode(&entry_id, kind, payload);
        Record { seq, entry_id, entry, recorded_at, trace: None }
    }

    /// The record, appended in the trace `trace`.
    pub fn with_trace(self, trace: Option<TraceParent>) -> Record {
        Record { trace, ..self }
    }

    /// The records a run's append of `event` and its decision `d`, checked against
    /// `version`, writes: a log's `seq` runs 1, 2, ... without a gap. What a run folds
    /// into its snapshot after its append, without reading the records back.
    pub fn appended(version: u64, event: &InboundEvent, d: &Decision, recorded_at: Timestamp) -> [Record; 2] {
        [
            Record {
                seq: version + 1,
                entry_id: event.event_id.to_string(),
                entry: Entry::Event { event_id: event.event_id.clone(), body: event.body.clone() },
                recorded_at,
                trace: None,
            },
            Record {
                seq: version + 2,
                entry_id: d.decision_id.clone(),
                entry: Entry::Decision(d.clone()),
                recorded_at,
                trace: None,
            },
        ]
    }

    /// The records of a run's whole append: each event with its decision in order
    /// (the run's own, then the outcomes it settled, `crate::timers`), `seq` going on
    /// from `version` without a gap.
    pub fn appended_all<'a>(
        version: u64,
        pairs: impl IntoIterator<Item = (&'a InboundEvent, &'a Decision)>,
        recorded_at: Timestamp,
    ) -> Vec<Record> {
        let mut records = Vec::new();
        for (event, d) in pairs {
            records.extend(Record::appended(version + records.len() as u64, event, d, recorded_at));
        }
        records
    }

    pub fn kind(&self) -> &str {
        self.entry.kind()
    }

    pub fn payload(&self) -> Value {
        self.entry.payload()
    }

    /// The decision this record holds, if it is one.
    pub fn decision(&self) -> Option<&Decision> {
        match &self.entry {
            Entry::Decision(d) => Some(d),
            _ => None,
        }
    }

    /// The event this record holds, if it is one.
    pub fn event(&self) -> Option<(&EventId, &EventBody)> {
        match &self.entry {
            Entry::Event { event_id, body } => Some((event_id, body)),
            _ => None,
        }
    }
}

/// The record's form on the wire and in files.
#[derive(Serialize, Deserialize)]
struct Wire {
    seq: u64,
    entry_id: String,
    kind: String,
    payload: Value,
    recorded_at: Timestamp,
    /// Absent without one: records from evals, replays and older logs read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace: Option<TraceParent>,
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            seq: self.seq,
            entry_id: self.entry_id.clone(),
            kind: self.kind().to_owned(),
            payload: self.payload(),
            recorded_at: self.recorded_at,
            trace: self.trace,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Record {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        Ok(Record::decode(w.seq, w.entry_id, &w.kind, w.payload, w.recorded_at).with_trace(w.trace))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(kind: &str, entry_id: &str, payload: Value, readable: bool) {
        let at: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let r = Record::decode(3, entry_id.into(), kind, payload.clone(), at);
        assert_eq!(!matches!(r.entry, Entry::Unreadable { .. }), readable, "{kind} {payload}");
        assert_eq!((r.kind(), r.payload()), (kind, payload), "what was stored comes back");
        let wire = serde_json::to_value(&r).unwrap();
        assert!(wire.get("trace").is_none(), "no trace, no key: {wire}");
        assert_eq!(serde_json::from_value::<Record>(wire).unwrap(), r);
        // A record appended in a trace keeps it on the wire too.
        let trace = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let traced = r.clone().with_trace(trace);
        let wire = serde_json::to_value(&traced).unwrap();
        assert_eq!(wire["trace"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(serde_json::from_value::<Record>(wire).unwrap(), traced);
    }

    #[test]
    fn records_decode_once_and_give_back_what_was_stored() {
        check("load_update", "e1", json!({"client": "acme", "stage": "in_transit"}), true);
        check(
            "location_ping",
            "e2",
            json!({"at": "2026-03-02T07:00:00Z", "lat": 41.5, "lon": -87.25, "risk": "high"}),
            true,
        );
        check("location_ping", "e2", json!({"risk": "extreme"}), false);
        check("teleport", "e3", json!({"to": "mars"}), false);
        check("load_update", "not an id!", json!({}), false);
        check(DECISION_RECORDED, "dec:e1", json!({"no": "decision"}), false);
    }

    #[test]
    fn appended_records_continue_from_the_version() {
        let at: Timestamp = "2026-03-02T07:00:00Z".parse().unwrap();
        let load = crate::ids::LoadId::parse("L1").unwrap();
        let event = InboundEvent::from_json(
            load.clone(),
            json!({"event_id": "e3", "kind": "load_update", "stage": "at_pickup"}),
        )
        .unwrap();
        let d = Decision::new(&event.event_id, at, "sop", vec![], vec![], "nothing to do");
        let [e, dr] = Record::appended(7, &event, &d, at);
        assert_eq!((e.seq, e.entry_id.as_str(), e.kind(), e.recorded_at), (8, "e3", "load_update", at));
        assert_eq!((dr.seq, dr.kind(), dr.decision()), (9, DECISION_RECORDED, Some(&d)));
        assert_eq!(e.event(), Some((&event.event_id, &event.body)));
        assert_eq!((e.decision(), dr.event()), (None, None));
        let other =
            InboundEvent::from_json(load, json!({"event_id": "e4", "kind": "load_update", "stage": "delivered"}))
                .unwrap();
        let d2 = Decision::new(&other.event_id, at, "sop", vec![], vec![], "nothing to do");
        let all = Record::appended_all(7, [(&event, &d), (&other, &d2)], at);
        let seqs: Vec<(u64, &str)> = all.iter().map(|r| (r.seq, r.entry_id.as_str())).collect();
        assert_eq!(seqs, [(8, "e3"), (9, d.decision_id.as_str()), (10, "e4"), (11, d2.decision_id.as_str())]);
    }
}
