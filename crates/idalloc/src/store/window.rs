//! Where each page of a paged listing ([`super::list_all`], [`super::Pages`]) may read: the read
//! *window*, a sub-range of the listed range. Pure decisions, no I/O.
//!
//! Why windows: a limited range read is not O(limit). etcd counts every key from the page's start
//! to the range's end on each read (its index visit for `count`; 3.4 even collects all of their
//! revisions), and the embedded store does the same to answer `count`. Paging a range of n records
//! by asking for `[last, end)` each time therefore costs n²/page: `check` on 100k bindings read
//! for 28 s on the file store and `list` on 200k for over 5 min (docs/scale.md, "Linear cost and
//! bounded memory"). Reading `[start, window)` instead, where the window ends where the records
//! sharing the first `depth` bytes of `start` end, makes each read cost what the window holds, and
//! `depth` adapts so a window holds about one page: deeper after a read that found many more
//! records than it returned, shallower after one that found few.
//!
//! Works for any key bytes (no assumption about the layout): windows are prefix ranges, and
//! `count` says how big the last one was. A store that reports no count (0) only ever widens the
//! window back to the whole range, which is the old behaviour.
//!
//! [`prefix_end`], the arithmetic windows are made of, lives here too (re-exported by `store`).

/// The smallest key greater than every key that starts with `prefix` (etcd's `GetPrefixRangeEnd`).
/// An empty prefix, or one made only of `0xff` bytes, has no such key: the result is `[0]`, etcd's
/// "to the end of the keyspace".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Keys in a window beyond this many pages' worth make the next window narrower.
const TOO_MANY_PAGES: i64 = 4;

/// The adaptive window of one listing of `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The listed range's exclusive end (`[0]`: the end of the keyspace).
    end: Vec<u8>,
    /// Bytes of a page's start that name its window (the window is every key sharing them).
    depth: usize,
    /// The shallowest useful depth: at it the window is already the whole (remaining) range.
    floor: usize,
    /// Empty windows read in a row.
    empty_run: u32,
}

/// Empty windows in a row after which the next window is the whole rest of the range.
const EMPTY_RUN: u32 = 8;

impl Windows {
    /// Windows over `[start, end)`, starting as wide as the range (the first read also tells how
    /// big the range is).
    pub(crate) fn new(start: &[u8], end: &[u8]) -> Windows {
        let floor = common_prefix(start, end);
        Windows { end: end.to_vec(), depth: floor, floor, empty_run: 0 }
    }

    /// The exclusive end of the window that a read starting at `start` uses.
    pub(crate) fn window_end(&self, start: &[u8]) -> Vec<u8> {
        let d = self.depth.min(start.len());
        if d <= self.floor {
            return self.end.clone();
        }
        let pe = prefix_end(&start[..d]);
        if pe == [0] || (self.end != [0] && pe >= self.end) {
            self.end.clone()
        } else {
            pe
        }
    }

    /// True if `window_end` is the end of the whole range.
    pub(crate) fn is_last(&self, window_end: &[u8]) -> bool {
        window_end == self.end.as_slice()
    }

    /// Learns from a read of one window: it returned `returned` records (the first and last
    /// keys given, if any), of `count` in the window from the read's start, with at most `limit`
    /// asked for. Narrows the next windows after a crowded one, widens them after a sparse one.
    pub(crate) fn learn(
        &mut self,
        keys: Option<(&[u8], &[u8])>,
        returned: usize,
        count: i64,
        limit: i64,
    ) {
        let limit = limit.max(1);
        if returned == 0 && count == 0 {
            self.empty_run += 1;
        } else {
            self.empty_run = 0;
        }
        if count > TOO_MANY_PAGES * limit {
            // The records of one page share `lcp` bytes: a window named by them holds about a
            // page. Always at least one byte deeper, so a crowded window never repeats.
            let lcp = keys.map_or(0, |(a, b)| common_prefix(a, b));
            self.depth = lcp.max(self.depth + 1);
        } else if (returned as i64) >= count && count < limit / 4 {
            // The window was exhausted with room to spare: the next may be wider. One byte at a
            // time, except after `EMPTY_RUN` empty windows in a row: keys with a long shared run
            // (12 KB keys of escaped `/`s) would otherwise cost one empty read per byte of it
            // (thousands, past the listing's timeout), so the next read is the whole rest of
            // the range, whose first page names the depth to narrow to.
            if self.empty_run >= EMPTY_RUN {
                self.depth = self.floor;
                self.empty_run = 0;
            } else {
                self.depth = self.depth.saturating_sub(1).max(self.floor);
            }
        }
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_window_is_the_whole_range() {
        let w = Windows::new(b"p/", b"p0");
        assert_eq!(w.window_end(b"p/"), b"p0");
        assert!(w.is_last(b"p0"));
        let all = Windows::new(b"m", &[0]);
        assert_eq!(all.window_end(b"m"), vec![0]);
    }

    #[test]
    fn a_crowded_window_narrows_to_what_one_page_shared() {
        let mut w = Windows::new(b"p/", b"p0");
        // 1,000 of 100,000 keys came back, all starting "p/key-000".
        w.learn(Some((b"p/key-00000000", b"p/key-00000999")), 1000, 100_000, 1000);
        assert_eq!(w.window_end(b"p/key-00000999\0"), b"p/key-00001");
        // Never past the range's end.
        let mut w = Windows::new(b"p/a", b"p/b");
        w.learn(Some((b"p/a1", b"p/a1")), 1, 10_000, 1);
        assert_eq!(w.window_end(b"p/a\xff"), b"p/b");
    }

    #[test]
    fn a_sparse_window_widens_back_to_the_range() {
        let mut w = Windows::new(b"p/", b"p0");
        w.learn(Some((b"p/k00", b"p/k09")), 10, 1000, 10);
        assert_eq!(w.window_end(b"p/k10"), b"p/k2");
        for _ in 0..10 {
            w.learn(None, 0, 0, 10);
        }
        assert_eq!(w.window_end(b"p/k10"), b"p0", "back at the whole range");
        // A store without counts never narrows.
        let mut w = Windows::new(b"p/", b"p0");
        w.learn(Some((b"p/k00", b"p/k09")), 10, 0, 10);
        assert_eq!(w.window_end(b"p/k10"), b"p0");
    }

    #[test]
    fn a_start_shorter_than_the_depth_names_its_own_prefix() {
        let mut w = Windows::new(b"", &[0]);
        w.learn(Some((b"abcdef", b"abcdeg")), 2, 100, 2);
        assert_eq!(w.window_end(b"ab"), b"ac");
        // All 0xff bytes have no prefix end: the window is the rest of the range.
        assert_eq!(w.window_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn a_run_of_empty_windows_goes_back_to_the_whole_range() {
        // Keys sharing a long run: a page narrowed the window to 1,000 bytes deep.
        let long = |tail: &str| [&[b'/'; 1000][..], tail.as_bytes()].concat();
        let mut w = Windows::new(b"", &[0]);
        w.learn(Some((&long("000"), &long("009"))), 10, 1000, 10);
        assert_eq!(w.depth, 1002);
        for _ in 0..EMPTY_RUN {
            w.learn(None, 0, 0, 10);
        }
        // Not 1,002 − 8 bytes deep (one byte per empty read): the whole range.
        assert_eq!(w.window_end(&long("100")), vec![0]);
    }
}
