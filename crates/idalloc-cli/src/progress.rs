//! The progress line of long batch commands (`acquire --from`): one small reporter, so the output
//! loop only says "one more done" and never decides about terminals or redraw rates.
//!
//! Drawn only for people: on a terminal, outside CI (`CI=true`), and for inputs long enough to
//! need it. Anywhere else it is silent, so piped output and CI logs hold no `\r` lines.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Inputs at least this long get a progress line.
const MIN_TOTAL: usize = 1000;

/// How often the line is redrawn at most.
const REDRAW: Duration = Duration::from_millis(200);

/// A `\r`-redrawn line `acquired N/TOTAL (P%)` on stderr, or nothing.
pub struct Progress {
    out: Option<Box<dyn Write>>,
    verb: &'static str,
    total: usize,
    done: usize,
    last_draw: Option<Instant>,
    interval: Duration,
}

impl Progress {
    /// A reporter for `total` items that draws on stderr only if a person is watching it.
    pub fn stderr(verb: &'static str, total: usize) -> Progress {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let show = !ci && total >= MIN_TOTAL && std::io::stderr().is_terminal();
        let out: Option<Box<dyn Write>> =
            if show { Some(Box::new(std::io::stderr())) } else { None };
        Progress { out, verb, total, done: 0, last_draw: None, interval: REDRAW }
    }

    /// Counts one item done; redraws if the last draw is old enough or this was the last item.
    pub fn tick(&mut self) {
        self.done += 1;
        let due = self.last_draw.is_none_or(|t| t.elapsed() >= self.interval);
        if due || self.done == self.total {
            self.draw();
        }
    }

    fn draw(&mut self) {
        let Some(out) = self.out.as_mut() else { return };
        self.last_draw = Some(Instant::now());
        let pct = self.done as f64 * 100.0 / self.total.max(1) as f64;
        // A broken stderr must not fail the command: progress is a courtesy.
        let _ = write!(out, "\r{} {}/{} ({pct:.0}%)", self.verb, self.done, self.total);
        let _ = out.flush();
    }

    /// Ends the line (if one was drawn), so what follows starts on a line of its own.
    pub fn finish(mut self) {
        if let (Some(out), Some(_)) = (self.out.as_mut(), self.last_draw) {
            let _ = writeln!(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn drawing(total: usize, interval: Duration) -> (Progress, Shared) {
        let buf = Shared::default();
        let p = Progress {
            out: Some(Box::new(buf.clone())),
            verb: "acquired",
            total,
            done: 0,
            last_draw: None,
            interval,
        };
        (p, buf)
    }

    fn text(s: &Shared) -> String {
        String::from_utf8(s.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn redraws_are_rate_limited_but_the_last_count_is_always_drawn() {
        let (mut p, buf) = drawing(4, Duration::from_secs(3600));
        for _ in 0..4 {
            p.tick();
        }
        p.finish();
        assert_eq!(text(&buf), "\racquired 1/4 (25%)\racquired 4/4 (100%)\n");
    }

    #[test]
    fn every_tick_draws_without_a_rate_limit() {
        let (mut p, buf) = drawing(2, Duration::ZERO);
        p.tick();
        p.tick();
        p.finish();
        assert_eq!(text(&buf), "\racquired 1/2 (50%)\racquired 2/2 (100%)\n");
    }

    #[test]
    fn nothing_drawn_means_no_newline_either() {
        let (p, buf) = drawing(10, Duration::ZERO);
        p.finish();
        assert_eq!(text(&buf), "");
    }

    #[test]
    fn not_on_a_terminal_or_under_ci_it_stays_silent() {
        // Under `cargo test` stderr is captured (not a terminal), and short inputs never draw.
        assert!(Progress::stderr("acquired", 10).out.is_none());
        if !std::io::stderr().is_terminal() {
            assert!(Progress::stderr("acquired", 1_000_000).out.is_none());
        }
    }
}
