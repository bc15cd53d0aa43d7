//! Where the runtime draws trace and span ids (`haul_core::trace` draws none).
//!
//! Ids come from a thread-local generator seeded from the system's randomness: they
//! must be unique, not secret (W3C Trace Context asks for no more).

use haul_core::trace::TraceParent;

/// A new trace: what an edge starts for a request that brought no context it can read.
pub fn root() -> TraceParent {
    TraceParent::root(fastrand::u128(..), fastrand::u64(..))
}

/// A new span continuing `of`.
pub fn child(of: &TraceParent) -> TraceParent {
    of.child(fastrand::u64(..))
}

/// What the edge makes of a request's `traceparent` header, and how it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// It read: the request's work (`own`) continues the caller's trace.
    Continued { own: TraceParent, caller: TraceParent },
    /// None given: a new root.
    Started(TraceParent),
    /// Given but unreadable: a new root, counted (never refused).
    Malformed(TraceParent),
}

impl Incoming {
    /// The request's own context: a child of the caller's, or a new root.
    pub fn of_header(header: Option<&[u8]>) -> Incoming {
        match header {
            None => Incoming::Started(root()),
            Some(h) => match std::str::from_utf8(h).ok().and_then(TraceParent::parse) {
                Some(caller) => Incoming::Continued { own: child(&caller), caller },
                None => Incoming::Malformed(root()),
            },
        }
    }

    pub fn context(self) -> TraceParent {
        match self {
            Incoming::Continued { own: t, .. } | Incoming::Started(t) | Incoming::Malformed(t) => t,
        }
    }

    /// The caller's context, when the request continues one.
    pub fn caller(self) -> Option<TraceParent> {
        match self {
            Incoming::Continued { caller, .. } => Some(caller),
            Incoming::Started(_) | Incoming::Malformed(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_request_continues_the_callers_trace_or_starts_one() {
        let given = TraceParent::parse(GIVEN).unwrap();
        let incoming = Incoming::of_header(Some(GIVEN.as_bytes()));
        let Incoming::Continued { own: t, .. } = incoming else { panic!("read") };
        assert_eq!(incoming.caller(), Some(given));
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(t.span_id_hex(), "00f067aa0ba902b7", "a span of its own");
        for header in [Some(&b"00-zz"[..]), Some(&[0xff, 0xfe][..]), None] {
            let got = Incoming::of_header(header);
            assert_eq!(matches!(got, Incoming::Malformed(_)), header.is_some(), "{header:?}");
            assert_eq!(got.caller(), None);
            assert_ne!(got.context().trace_id, given.trace_id);
            assert_ne!(got.context().trace_id, root().trace_id, "a new trace each time");
        }
    }
}
