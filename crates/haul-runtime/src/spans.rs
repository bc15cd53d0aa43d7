//! Spans: what each hop of an event's trace records of itself, handed to a sink.
//!
//! A span here is a finished record (its ids, its parent, its links, when it started
//! and ended by the `Clock`, what it did) made by the hop that did the work, with the
//! span id that hop drew and stored (`crate::trace`). So the span a store row names
//! and the span an exporter sends are one, across processes and restarts. The sink
//! (`haul-otel` exports over OTLP) must never block: `SpanSink::record` is called
//! inside runs, sends and requests.
//!
//! Off (the default) nothing is built: `Spans::record` takes a closure it never calls.
//! A hop without a trace context (evals, the simulator, replay) records nothing.

use std::fmt;
use std::sync::Arc;

use haul_core::Timestamp;
use haul_core::trace::TraceParent;

/// The span's role, as OpenTelemetry names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An API or webhook request haul answers.
    Server,
    /// A call haul makes (a send to a channel service).
    Client,
    /// A message haul queues.
    Producer,
    /// A worker run handling a queued message.
    Consumer,
    /// Work inside a run (the decision).
    Internal,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    StrList(Vec<String>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Value {
        Value::Int(i64::from(n))
    }
}

impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Value {
        Value::StrList(v)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// Low-cardinality: `process loads`, `send sms`, `POST /v1/events`.
    pub name: String,
    pub kind: Kind,
    /// The span's own context: its trace id and the span id the hop drew.
    pub context: TraceParent,
    /// The span it is a child of, in the same trace; `None` for a root.
    pub parent_span_id: Option<[u8; 8]>,
    /// Whether that parent is another process's (a caller's `traceparent`).
    pub parent_is_remote: bool,
    /// Contexts it follows from across a queue hop (the messaging conventions' links).
    pub links: Vec<TraceParent>,
    pub start: Timestamp,
    pub end: Timestamp,
    pub attributes: Vec<(&'static str, Value)>,
    /// `Some` when the span's work failed, saying how.
    pub error: Option<String>,
}

impl Span {
    /// A span of `kind` with the context `context`, the child of `parent` (whose
    /// trace it continues), from `start` to `end`, with nothing else yet.
    pub fn new(
        name: impl Into<String>,
        kind: Kind,
        context: TraceParent,
        parent: Option<&TraceParent>,
        start: Timestamp,
        end: Timestamp,
    ) -> Span {
        Span {
            name: name.into(),
            kind,
            context,
            parent_span_id: parent.filter(|p| p.trace_id == context.trace_id).map(|p| p.span_id),
            parent_is_remote: false,
            links: vec![],
            start,
            end,
            attributes: vec![],
            error: None,
        }
    }

    pub fn attr(mut self, key: &'static str, value: impl Into<Value>) -> Span {
        self.attributes.push((key, value.into()));
        self
    }

    /// Adds the attribute when there is a value.
    pub fn attr_opt<V: Into<Value>>(self, key: &'static str, value: Option<V>) -> Span {
        match value {
            Some(v) => self.attr(key, v),
            None => self,
        }
    }

    pub fn link(mut self, to: TraceParent) -> Span {
        self.links.push(to);
        self
    }

    pub fn remote_parent(mut self) -> Span {
        self.parent_is_remote = self.parent_span_id.is_some();
        self
    }

    /// Marks the span failed: `error.type` names the class, `why` the detail.
    pub fn failed(mut self, error_type: impl Into<String>, why: impl Into<String>) -> Span {
        self.attributes.push(("error.type", Value::Str(error_type.into())));
        self.error = Some(why.into());
        self
    }
}

/// Where finished spans go. Never blocks: a sink that cannot keep up drops and counts.
pub trait SpanSink: Send + Sync {
    fn record(&self, span: Span);
}

/// The runtime's handle on its sink: off, or one sink shared by every hop.
#[derive(Clone, Default)]
pub struct Spans(Option<Arc<dyn SpanSink>>);

impl fmt::Debug for Spans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "Spans(on)" } else { "Spans(off)" })
    }
}

impl Spans {
    /// Records nothing.
    pub const OFF: Spans = Spans(None);

    pub fn off() -> Spans {
        Spans::OFF
    }

    pub fn to(sink: Arc<dyn SpanSink>) -> Spans {
        Spans(Some(sink))
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Builds the span and hands it to the sink; off, `make` is not called.
    pub fn record(&self, make: impl FnOnce() -> Span) {
        if let Some(sink) = &self.0 {
            sink.record(make());
        }
    }
}

/// A sink keeping what it is given, for tests.
#[derive(Default)]
pub struct Kept(pub std::sync::Mutex<Vec<Span>>);

impl Kept {
    pub fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl SpanSink for Kept {
    fn record(&self, span: Span) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(span);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(span: u64) -> TraceParent {
        TraceParent::root(7, 1).child(span)
    }

    #[test]
    fn a_span_is_the_child_only_of_a_parent_in_its_own_trace() {
        let t = Timestamp::UNIX_EPOCH;
        let s = Span::new("x", Kind::Consumer, ctx(2), Some(&ctx(1)), t, t);
        assert_eq!(s.parent_span_id, Some(ctx(1).span_id));
        let other = TraceParent::root(8, 1);
        assert_eq!(Span::new("x", Kind::Consumer, ctx(2), Some(&other), t, t).parent_span_id, None);
        assert!(!s.clone().parent_is_remote && s.clone().remote_parent().parent_is_remote);
        let root = Span::new("x", Kind::Server, ctx(2), None, t, t).remote_parent();
        assert!(!root.parent_is_remote, "no parent, nothing remote");
        let failed = s.failed("timeout", "late");
        assert_eq!(failed.error.as_deref(), Some("late"));
        assert_eq!(failed.attributes, vec![("error.type", Value::Str("timeout".into()))]);
    }

    #[test]
    fn off_builds_nothing_and_on_hands_each_span_over() {
        let t = Timestamp::UNIX_EPOCH;
        Spans::off().record(|| panic!("built while off"));
        let kept = Arc::new(Kept::default());
        let spans = Spans::to(kept.clone());
        assert!(spans.is_on() && !Spans::off().is_on());
        spans.record(|| {
            Span::new("a", Kind::Internal, ctx(2), None, t, t).attr_opt("n", Some(3u64)).attr_opt::<u64>("m", None)
        });
        assert_eq!(kept.spans().len(), 1);
        assert_eq!(kept.spans()[0].attributes, vec![("n", Value::Int(3))]);
    }
}
