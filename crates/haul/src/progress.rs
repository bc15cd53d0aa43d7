//! Progress on stderr for the commands that run for minutes (bench, sim over many
//! seeds, eval over many files, prune): one line rewritten in place, at most five
//! times a second, erased at the end. Only when stderr is a terminal: piped or in a
//! journal, nothing is written (stdout's report is the record).

use std::io::Write;
use std::time::{Duration, Instant};

/// Fewest time between two redraws.
const REDRAW: Duration = Duration::from_millis(200);

pub struct Progress {
    out: Option<Box<dyn Write + Send>>,
    what: String,
    total: Option<u64>,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    /// Progress of `total` items (when known) on stderr, if stderr is a terminal.
    pub fn stderr(what: &str, total: Option<u64>) -> Self {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let out: Option<Box<dyn Write + Send>> = if terminal { Some(Box::new(std::io::stderr())) } else { None };
        Self::to(out, what, total)
    }

    /// Progress written to `out`; `None` writes nothing.
    pub fn to(out: Option<Box<dyn Write + Send>>, what: &str, total: Option<u64>) -> Self {
        Progress { out, what: what.to_owned(), total, started: Instant::now(), drawn: None }
    }

    /// The line for `done` items and a note (the item at hand).
    pub fn line(&self, done: u64, note: &str, elapsed: Duration) -> String {
        let count = match self.total {
            Some(t) => format!("{done}/{t}"),
            None => done.to_string(),
        };
        let note = if note.is_empty() { String::new() } else { format!("  {note}") };
        format!("{} {count}  {}s{note}", self.what, elapsed.as_secs())
    }

    /// Redraws the line (if the last redraw is old enough).
    pub fn update(&mut self, done: u64, note: &str) {
        if self.out.is_none() || self.drawn.is_some_and(|d| d.elapsed() < REDRAW) {
            return;
        }
        let line = self.line(done, note, self.started.elapsed());
        if let Some(out) = &mut self.out {
            let _ = write!(out, "\r{line}\x1b[K");
            let _ = out.flush();
        }
        self.drawn = Some(Instant::now());
    }

    /// Erases the line.
    pub fn finish(&mut self) {
        if let Some(out) = &mut self.out
            && self.drawn.is_some()
        {
            let _ = write!(out, "\r\x1b[K");
            let _ = out.flush();
        }
        self.drawn = None;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_say_what_how_far_and_how_long() {
        let p = Progress::to(None, "eval", Some(40));
        assert_eq!(p.line(3, "evals/a.toml", Duration::from_millis(2500)), "eval 3/40  2s  evals/a.toml");
        let p = Progress::to(None, "prune: batches", None);
        assert_eq!(p.line(12, "", Duration::from_secs(61)), "prune: batches 12  61s");
    }

    #[test]
    fn a_terminal_gets_one_line_redrawn_then_erased_and_no_terminal_gets_nothing() {
        let buf = Buf::default();
        let mut p = Progress::to(Some(Box::new(buf.clone())), "sim", Some(3));
        p.update(1, "seed 1");
        p.update(2, "seed 2"); // within 200 ms: not redrawn
        p.finish();
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "\rsim 1/3  0s  seed 1\x1b[K\r\x1b[K");
        let mut quiet = Progress::to(None, "sim", Some(3));
        quiet.update(1, "seed 1");
        quiet.finish();
    }
}
