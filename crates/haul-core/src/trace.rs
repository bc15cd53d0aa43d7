//! W3C Trace Context (`traceparent`): the one value that ties an event's hops together.
//!
//! An event's trace context is kept with everything that carries the event on (the
//! queued message, the outbox row, the timer), so the chain from the API call to the
//! delivered outcome survives crashes, redeliveries and restarts: a hop reads the
//! context its input was stored with, never one held in a process's memory.
//!
//! Parsing follows the recommendation's rules for a receiver
//! (<https://www.w3.org/TR/trace-context/#traceparent-header>): lowercase hex only,
//! no all-zero id, version `ff` refused, a later version read by its first four fields.
//! A header that does not read is never an error to the sender: the edge starts a new
//! root and counts it. Ids are drawn by the caller (this crate draws nothing).

use std::fmt;

/// A span's place in a trace: what `traceparent` carries.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    /// The span this context names: the parent of whatever continues from it.
    pub span_id: [u8; 8],
    /// Bit 0 is `sampled`; the others are kept as they came.
    pub flags: u8,
}

/// The parts of a `traceparent` value, as lengths in characters.
const V00_LEN: usize = 55;

impl TraceParent {
    /// Reads a `traceparent` header value; `None` when it does not read.
    pub fn parse(header: &str) -> Option<TraceParent> {
        let s = header.trim_matches([' ', '\t']);
        let version = hex_byte(s.get(0..2)?)?;
        let fits = match version {
            0xff => false,
            0 => s.len() == V00_LEN,
            // A later version may add fields after a dash; its first four read as 00's.
            _ => s.len() == V00_LEN || s.as_bytes().get(V00_LEN) == Some(&b'-'),
        };
        let b = s.as_bytes();
        if !fits || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id: [u8; 16] = hex_bytes(s.get(3..35)?)?;
        let span_id: [u8; 8] = hex_bytes(s.get(36..52)?)?;
        let flags = hex_byte(s.get(53..55)?)?;
        let zero = trace_id.iter().all(|&x| x == 0) || span_id.iter().all(|&x| x == 0);
        (!zero).then_some(TraceParent { trace_id, span_id, flags })
    }

    /// A new root: a trace of its own, from two random draws (a zero draw is made one,
    /// as an all-zero id is invalid). Sampled.
    pub fn root(trace_draw: u128, span_draw: u64) -> TraceParent {
        TraceParent { trace_id: trace_draw.max(1).to_be_bytes(), span_id: span_draw.max(1).to_be_bytes(), flags: 1 }
    }

    /// The context of a span that continues this one (same trace, same flags).
    pub fn child(&self, span_draw: u64) -> TraceParent {
        TraceParent { span_id: span_draw.max(1).to_be_bytes(), ..*self }
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    pub fn span_id_hex(&self) -> String {
        hex(&self.span_id)
    }
}

/// The `traceparent` value, version 00.
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "00-{}-{}-{:02x}", hex(&self.trace_id), hex(&self.span_id), self.flags)
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

/// A context in JSON is its `traceparent` text.
impl serde::Serialize for TraceParent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TraceParent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        TraceParent::parse(&text).ok_or_else(|| serde::de::Error::custom(format!("not a traceparent: {text:?}")))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(s: &str) -> Option<u8> {
    match s.as_bytes() {
        [hi, lo] => Some((hex_digit(*hi)? << 4) + hex_digit(*lo)?),
        _ => None,
    }
}

fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (hex_digit(b[2 * i])? << 4) + hex_digit(b[2 * i + 1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// `expected` is the value written back, `None` when the header does not read.
    fn check(header: &str, expected: Option<&str>) {
        assert_eq!(TraceParent::parse(header).map(|t| t.to_string()).as_deref(), expected, "{header:?}");
    }

    #[test]
    fn a_traceparent_reads_by_the_recommendations_rules() {
        check(GOOD, Some(GOOD));
        check(&format!(" {GOOD}\t"), Some(GOOD));
        check(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
        );
        // A later version: its first four fields, and whatever follows a dash.
        check("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Some(GOOD));
        check(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-the-future-holds",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09"),
        );
        check("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09.x", None);
        // Version 00 has exactly four fields.
        check(&format!("{GOOD}-"), None);
        check(&format!("{GOOD}0"), None);
        check(&GOOD[..54], None);
        check("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
        check("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", None);
        check("00-00000000000000000000000000000000-00f067aa0ba902b7-01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", None);
        check("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x", None);
        check("0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
        check("", None);
        check("00-é", None);
        check("00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01", None);
        check("é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
    }

    #[test]
    fn a_root_and_its_children_share_the_trace() {
        let root = TraceParent::root(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736, 0x00f0_67aa_0ba9_02b7);
        assert_eq!(root.to_string(), GOOD);
        assert!(root.sampled());
        let child = root.child(7);
        assert_eq!(child.to_string(), "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000007-01");
        assert_eq!(child.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(child.span_id_hex(), "0000000000000007");
        // A zero draw would make an invalid id.
        assert_eq!(TraceParent::parse(&TraceParent::root(0, 0).to_string()), Some(TraceParent::root(1, 1)));
        assert_eq!(root.child(0).span_id, [0, 0, 0, 0, 0, 0, 0, 1]);
        for (flags, sampled) in [("00", false), ("01", true), ("02", false), ("03", true)] {
            let t =
                TraceParent::parse(&format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}")).unwrap();
            assert_eq!(t.sampled(), sampled, "{flags}");
        }
        assert_eq!(format!("{root:?}"), format!("TraceParent({GOOD})"));
    }
}
