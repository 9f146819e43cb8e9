//! Where each read of a paged listing ([`super::list_all`], [`super::Pages`]) may look: the read
//! *window*, a sub-range of the listed range, sized from the keys already read. Pure decisions,
//! no I/O.
//!
//! Why windows: a limited range read is not O(limit). etcd counts every key from the read's
//! start to the end of the requested range on each read (its index walk for `count`; 3.4 even
//! collects all of their revisions), whatever the limit. Paging a range of n records by asking
//! for `[last, end)` each time therefore costs n²/page: `check` on 100k bindings read for 28 s
//! on the file store and `list` on 200k for over 5 min (docs/scale.md, "Linear cost and bounded
//! memory"). Reading `[start, window_end)` instead makes each read cost what the window holds.
//!
//! How big a window: about one page. The keys of the last page tell how densely keys sit just
//! before the next read's start: their spread, read as numbers (16 bytes of them, from a few
//! bytes above where the page's keys start to differ), divided by how many there were, is the
//! room one key takes. The next window is `limit` keys' worth of that room, so each read counts
//! about what it returns, whatever the range's size (the counted/returned ratio
//! must not grow with n; prefix windows, one byte of the key at a time, were a factor of up to
//! 256 too coarse and let it creep from 3.6 at 10k records to 7.7 at 200k). The store's `count`
//! is not needed at all, so the same windows serve every store, and one that stops counting at
//! the limit ([`super::GetRequest::loose_count`]) loses nothing.
//!
//! Empty windows (the end of a run of keys, a gap between sections of the range) widen the next
//! one 256 times, one byte; after [`EMPTY_RUN`] of them in a row the next read is the whole rest
//! of the range, whose first page names the density again. Works for any key bytes (no
//! assumption about the layout): windows are plain key ranges inside the listed one.
//!
//! [`prefix_end`], the arithmetic of range ends, lives here too (re-exported by `store`).

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

/// Bytes of the frame above the first byte where a page's keys differ: room for a window to
/// grow many times (gaps, sparser regions) before it runs off its frame.
const HEADROOM: usize = 8;

/// Empty windows in a row after which the next read is the whole rest of the range (keys with a
/// 12 KB shared run, one byte per empty read, would otherwise take thousands of reads).
const EMPTY_RUN: u32 = 8;

/// How much wider the window after an empty one is.
const GROWTH: u128 = 16;

/// How the next window is sized: keys sharing their first `base` bytes with the read's start,
/// read as the number their next bytes make (see [`Alphabet`]), within `width` of the start's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frame {
    base: usize,
    width: u128,
}

/// The byte values seen at each position of the listed keys, in order. A key's bytes read as digits of these alphabets (a mixed-radix number,
/// one radix per position) make the numbers windows are measured in. Read as plain base-256,
/// decimal IDs would use 10 values of each byte's 256 and leave gaps 25 times the room of the
/// keys between them at every digit: a window sized from a page found nothing, then far too much
/// (the counted/returned ratio grew with n in the simulation below). One alphabet for all
/// positions still left such gaps where digits sit beside letters (`pod-000123.node…`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Alphabet {
    /// Bit `b` of `seen[i]`: byte `b` was seen at position `i`.
    seen: Vec<[u64; 4]>,
}

/// Positions in one frame at most (keys of 12 KB would otherwise make frames of that many
/// single-letter positions).
const MAX_FRAME: usize = 64;

impl Alphabet {
    /// The letters of position `i` (`0x00` alone where no key was long enough: a missing byte
    /// reads as `0x00`).
    fn at(&self, i: usize) -> [u64; 4] {
        match self.seen.get(i) {
            Some(s) if s.iter().any(|w| *w != 0) => *s,
            _ => [1, 0, 0, 0],
        }
    }

    /// Adds the bytes of `key`.
    fn learn(&mut self, key: &[u8]) {
        if self.seen.len() < key.len() {
            self.seen.resize(key.len(), [0; 4]);
        }
        for (set, &b) in self.seen.iter_mut().zip(key) {
            if set[(b >> 6) as usize] & (1 << (b & 63)) != 0 {
                continue;
            }
            // A digit or a letter stands for its whole class: the keys not read yet are likely
            // to use the rest of it (an alphabet that lags makes windows run to `0xff`).
            let class = match b {
                b'0'..=b'9' => b'0'..=b'9',
                b'a'..=b'z' => b'a'..=b'z',
                b'A'..=b'Z' => b'A'..=b'Z',
                _ => b..=b,
            };
            for c in class {
                set[(c >> 6) as usize] |= 1 << (c & 63);
            }
        }
    }

    /// The radices of the frame at `base`: as many positions as fit in 120 bits, up to the end
    /// of the longest key seen.
    fn radices(&self, base: usize) -> Vec<u128> {
        let mut out = Vec::new();
        let mut acc = 1u128;
        while base + out.len() < self.seen.len() && out.len() < MAX_FRAME {
            let r =
                u128::from(self.at(base + out.len()).iter().map(|w| w.count_ones()).sum::<u32>());
            match acc.checked_mul(r).filter(|&v| v <= 1u128 << 120) {
                Some(v) => {
                    acc = v;
                    out.push(r);
                }
                None => break,
            }
        }
        out
    }

    /// The number `key[base..]` makes in the frame of `radices`, missing bytes read as the
    /// smallest letter. A byte that is no letter of its position reads as the next letter up (past
    /// the last letter: one more than the last, which carries into the position above), the rest
    /// as zeros: the number of the smallest key of letters at or after `key`, so a window measured
    /// from it starts at or after `key`, never before.
    fn position(&self, key: &[u8], base: usize, radices: &[u128]) -> u128 {
        let tail = key.get(base..).unwrap_or(&[]);
        let mut p = 0u128;
        let mut rounded = false;
        for (i, &r) in radices.iter().enumerate() {
            let d = match tail.get(i) {
                Some(&b) if !rounded => {
                    let set = self.at(base + i);
                    rounded = set[(b >> 6) as usize] & (1 << (b & 63)) == 0;
                    rank(&set, b)
                }
                _ => 0,
            };
            p = p * r + u128::from(d);
        }
        p
    }

    /// The frame bytes of number `p` (its digits' letters).
    fn bytes(&self, mut p: u128, base: usize, radices: &[u128]) -> Vec<u8> {
        let mut out = vec![0u8; radices.len()];
        for (i, &r) in radices.iter().enumerate().rev() {
            out[i] = select(&self.at(base + i), (p % r) as u32);
            p /= r;
        }
        out
    }
}

/// Letters of `set` below `b`: the digit of the smallest letter `>= b`.
fn rank(set: &[u64; 4], b: u8) -> u32 {
    let (w, bit) = ((b >> 6) as usize, b & 63);
    set[..w].iter().map(|x| x.count_ones()).sum::<u32>()
        + (set[w] & ((1u64 << bit) - 1)).count_ones()
}

/// The letter of digit `d` in `set` (`0xff` past the last, which no caller asks for).
fn select(set: &[u64; 4], d: u32) -> u8 {
    let mut left = d;
    for b in 0..=255u8 {
        if set[(b >> 6) as usize] & (1 << (b & 63)) != 0 {
            if left == 0 {
                return b;
            }
            left -= 1;
        }
    }
    0xff
}

/// The adaptive windows of one listing of `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The listed range's exclusive end (`[0]`: the end of the keyspace).
    end: Vec<u8>,
    /// Bytes every key of the range shares (the common prefix of its start and end): no frame
    /// starts above them.
    floor: usize,
    /// `None`: the next read is the whole rest of the range (at first, and after a run of
    /// empty windows).
    frame: Option<Frame>,
    alphabet: Alphabet,
    /// Empty windows read in a row.
    empty_run: u32,
}

impl Windows {
    /// Windows over `[start, end)`, the first as wide as the range (its first page tells how
    /// dense the keys are).
    pub(crate) fn new(start: &[u8], end: &[u8]) -> Windows {
        Windows {
            end: end.to_vec(),
            floor: common_prefix(start, end),
            frame: None,
            alphabet: Alphabet::default(),
            empty_run: 0,
        }
    }

    /// The exclusive end of the window that a read starting at `start` uses: always past
    /// `start`, never past the range's end.
    pub(crate) fn window_end(&self, start: &[u8]) -> Vec<u8> {
        let Some(f) = self.frame else { return self.end.clone() };
        // A start shorter than the frame's base reads as if padded with zeros (every key
        // between them is in the window too).
        let mut prefix: Vec<u8> = start.iter().copied().take(f.base).collect();
        prefix.resize(f.base, 0);
        let radices = self.alphabet.radices(f.base);
        let top = radices.iter().product::<u128>();
        let at = self.alphabet.position(start, f.base, &radices).checked_add(f.width.max(1));
        let e = match at.filter(|&p| p < top) {
            Some(p) => {
                prefix.extend_from_slice(&self.alphabet.bytes(p, f.base, &radices));
                prefix
            }
            // Past the frame: to the end of the keys that share the base.
            None => prefix_end(&prefix),
        };
        if e.as_slice() <= start || e == [0] || (self.end != [0] && e >= self.end) {
            self.end.clone()
        } else {
            e
        }
    }

    /// True if `window_end` is the end of the whole range.
    pub(crate) fn is_last(&self, window_end: &[u8]) -> bool {
        window_end == self.end.as_slice()
    }

    /// Learns from one read: it returned `keys` (in key order), `more` if its window holds more,
    /// with at most `limit` asked for. The next window is sized to hold about `limit` keys at
    /// the density of the page's second half (a page that straddles the end of one run of keys
    /// and the start of a denser one is judged by the denser end).
    pub(crate) fn learn(&mut self, keys: &[&[u8]], more: bool, limit: i64) {
        let limit = u128::try_from(limit.max(1)).unwrap_or(1);
        let m = keys.len();
        if m == 0 {
            self.empty_run += 1;
        } else {
            self.empty_run = 0;
        }
        for key in keys {
            self.alphabet.learn(key);
        }
        if m >= 2 {
            let i0 = if m >= 4 { m / 2 } else { 0 };
            let (a, b) = (keys[i0], keys[m - 1]);
            let base = common_prefix(a, b).saturating_sub(HEADROOM).max(self.floor);
            let radices = self.alphabet.radices(base);
            let spread = self
                .alphabet
                .position(b, base, &radices)
                .saturating_sub(self.alphabet.position(a, base, &radices))
                .max(1);
            let per_key = spread / (m - 1 - i0) as u128;
            self.frame = Some(Frame { base, width: per_key.max(1).saturating_mul(limit) });
        } else if !more {
            if self.empty_run >= EMPTY_RUN {
                self.frame = None;
                self.empty_run = 0;
            } else if let Some(f) = &mut self.frame {
                // Sparse here: wider, by as much as an empty window, by `limit` with a key.
                let factor = if m == 0 { GROWTH } else { limit.clamp(2, GROWTH) };
                f.width = f.width.saturating_mul(factor);
            }
        }
    }
}

/// Where a listing of one range is, and which window it reads next: the pure half of
/// [`super::Pages`], so that simulations drive exactly the decisions the listings make. Ranges
/// are etcd's `(key, range_end)` pairs (an empty `range_end`: the single key `key`).
#[derive(Clone, Debug)]
pub(crate) struct Cursor {
    /// True if the listed range is one key.
    single: bool,
    /// Where the next read starts; `None` once the range is exhausted.
    start: Option<Vec<u8>>,
    windows: Windows,
}

impl Cursor {
    /// A listing of `[key, range_end)` that has read nothing yet.
    pub(crate) fn new(key: &[u8], range_end: &[u8]) -> Cursor {
        let single = range_end.is_empty();
        let end = if single { [key, &[0]].concat() } else { range_end.to_vec() };
        Cursor { single, start: Some(key.to_vec()), windows: Windows::new(key, &end) }
    }

    /// Where the next read starts; `None` when the listing is done.
    pub(crate) fn start(&self) -> Option<&[u8]> {
        self.start.as_deref()
    }

    /// The `(key, range_end)` the next read asks for; `None` when the listing is done.
    pub(crate) fn next_read(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let start = self.start.clone()?;
        if self.single {
            return Some((start, Vec::new()));
        }
        let end = self.windows.window_end(&start);
        Some((start, end))
    }

    /// Moves past a read whose window ended at `window_end` (from [`Cursor::next_read`]) and
    /// returned `keys`, `more` if its window held more, with at most `limit` asked for.
    pub(crate) fn advance(&mut self, window_end: &[u8], keys: &[&[u8]], more: bool, limit: i64) {
        self.windows.learn(keys, more, limit);
        self.start = match keys.last() {
            // The window holds more: the next read starts right after the last key seen.
            Some(last) if more => Some([last, &[0][..]].concat()),
            // The window is done: the next starts where it ended, unless that was the end.
            _ if self.single || self.windows.is_last(window_end) => None,
            _ => Some(window_end.to_vec()),
        };
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a listing of `range` over the sorted `keys` costs, read by the same [`Cursor`] as
    /// the real listings against a store that counts exactly (as etcd does): the keys it
    /// returned in order, the reads, and the records the reads counted.
    fn simulate(keys: &[Vec<u8>], range: (&[u8], &[u8]), limit: i64) -> (Vec<Vec<u8>>, u64, u64) {
        let mut c = Cursor::new(range.0, range.1);
        let (mut out, mut reads, mut counted) = (Vec::new(), 0u64, 0u64);
        while let Some((from, to)) = c.next_read() {
            reads += 1;
            assert!(reads < 10_000_000, "the listing does not end");
            let lo = keys.partition_point(|k| k.as_slice() < from.as_slice());
            let hi = if to == [0] {
                keys.len()
            } else {
                keys.partition_point(|k| k.as_slice() < to.as_slice())
            };
            let hi = hi.max(lo);
            counted += (hi - lo) as u64;
            let got = (hi - lo).min(limit as usize);
            let page: Vec<&[u8]> = keys[lo..lo + got].iter().map(|k| k.as_slice()).collect();
            out.extend(page.iter().map(|k| k.to_vec()));
            c.advance(&to, &page, hi - lo > got, limit);
        }
        (out, reads, counted)
    }

    /// A pool's records as the layout names them (`id/<ID>`, `key/<key>`, `ref/<key>/<holder>`),
    /// `n` bindings, IDs spread at random over a 24-bit range or dense from 1, sorted.
    fn pool_keys(n: u64, dense: bool) -> Vec<Vec<u8>> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut ids = std::collections::BTreeSet::new();
        while (ids.len() as u64) < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids.insert(if dense { ids.len() as u64 + 1 } else { 1 + x % 16_777_215 });
        }
        let mut keys = Vec::new();
        for (i, id) in ids.into_iter().enumerate() {
            let key = format!("pod-{i:012}.node-17.cluster-a.example");
            keys.push(format!("idalloc/data/p/id/{id}").into_bytes());
            keys.push(format!("idalloc/data/p/key/{key}").into_bytes());
            keys.push(format!("idalloc/data/p/ref/{key}/h").into_bytes());
        }
        keys.sort();
        keys
    }

    /// Records counted per record returned, for a listing of the whole pool
    /// and of its `id/` range (what a sync reads), at 10k and at 300k bindings.
    fn ratios(dense: bool) -> Vec<(u64, f64, f64)> {
        [10_000, 300_000]
            .into_iter()
            .map(|n| {
                let keys = pool_keys(n, dense);
                let all = (&b"idalloc/data/p/"[..], &b"idalloc/data/p0"[..]);
                let (got, reads, counted) = simulate(&keys, all, 1000);
                assert_eq!(got, keys, "every record once, in key order");
                assert!(reads >= got.len() as u64 / 1000);
                let ids = (&b"idalloc/data/p/id/"[..], &b"idalloc/data/p/id0"[..]);
                let (got_ids, _, counted_ids) = simulate(&keys, ids, 1000);
                assert_eq!(got_ids.len() as u64, n);
                (n, counted as f64 / got.len() as f64, counted_ids as f64 / n as f64)
            })
            .collect()
    }

    #[test]
    fn records_counted_per_record_returned_stay_flat_as_the_pool_grows() {
        for dense in [false, true] {
            let r = ratios(dense);
            eprintln!("dense IDs {dense}: (bindings, counted/returned whole pool, id/ only) {r:?}");
            let (small, big) = (r[0], r[1]);
            for (what, s, b) in [("pool", small.1, big.1), ("id/", small.2, big.2)] {
                assert!(s < 3.5 && b < 3.5, "{what}, dense {dense}: {r:?}");
                assert!(b <= s * 1.15, "{what}, dense {dense}: the ratio grows with n: {r:?}");
            }
        }
    }

    #[test]
    fn the_first_window_is_the_whole_range() {
        let w = Windows::new(b"p/", b"p0");
        assert_eq!(w.window_end(b"p/"), b"p0");
        assert!(w.is_last(b"p0"));
        let all = Windows::new(b"m", &[0]);
        assert_eq!(all.window_end(b"m"), vec![0]);
    }

    #[test]
    fn a_page_sizes_the_next_window_to_about_a_page() {
        // 10 keys `p/k00`..`p/k09` in a range of `p/k00`..`p/k99`: the next window, from right
        // after `p/k09`, holds about 10 more.
        let keys: Vec<Vec<u8>> = (0..100).map(|i| format!("p/k{i:02}").into_bytes()).collect();
        let mut w = Windows::new(b"p/", b"p0");
        let page: Vec<&[u8]> = keys[..10].iter().map(|k| k.as_slice()).collect();
        w.learn(&page, true, 10);
        let end = w.window_end(b"p/k09\0");
        let inside = keys.iter().filter(|k| k.as_slice() > b"p/k09".as_slice() && **k < end);
        assert!((8..=12).contains(&inside.count()), "{end:?}");
        // Never past the range's end, and always past the start.
        let mut w = Windows::new(b"p/a", b"p/b");
        w.learn(&[b"p/a1", b"p/a\xff\xff"], false, 1_000_000);
        assert_eq!(w.window_end(b"p/a\xff\xff\0"), b"p/b");
        assert!(w.window_end(b"p/a1\0").as_slice() > b"p/a1\0".as_slice());
    }

    #[test]
    fn a_start_shorter_than_the_frame_reads_as_padded() {
        let mut w = Windows::new(b"", &[0]);
        w.learn(&[b"abcdefghijklmn0", b"abcdefghijklmn9"], true, 2);
        let end = w.window_end(b"ab");
        assert!(end.as_slice() > b"ab".as_slice() && end.starts_with(b"ab"), "{end:?}");
        // All 0xff bytes past the frame: the window is the rest of the range.
        let mut w = Windows::new(b"", &[0]);
        w.learn(&[b"\xff\xff\x00", b"\xff\xff\x01"], true, 2);
        w.frame = w.frame.map(|f| Frame { width: u128::MAX / 2, ..f });
        assert_eq!(w.window_end(b"\xff\xff\xff"), vec![0]);
    }

    #[test]
    fn a_run_of_empty_windows_goes_back_to_the_whole_range() {
        // Keys sharing a long run: a page sized the windows 1,000 bytes deep.
        let long = |tail: &str| [&[b'/'; 1000][..], tail.as_bytes()].concat();
        let mut w = Windows::new(b"", &[0]);
        w.learn(&[&long("000"), &long("009")], true, 10);
        let near = w.window_end(&long("0090"));
        assert!(near.starts_with(&[b'/'; 990]), "a narrow window");
        for _ in 0..EMPTY_RUN {
            w.learn(&[], false, 10);
        }
        // Not one byte wider per empty read for 1,000 reads: the whole range.
        assert_eq!(w.window_end(&long("100")), vec![0]);
    }

    /// The 12 KB keys of the CLI's key-size test: escaped `/`s, a page or two of them, with a
    /// gap after. The listing ends in a few reads, every key once.
    #[test]
    fn keys_with_a_long_shared_run_list_in_few_reads() {
        let mut keys: Vec<Vec<u8>> = (0..300)
            .map(|i| format!("big/{}{i:06}", "%2F".repeat(4090)).into_bytes())
            .chain((0..50).map(|i| format!("zz/{i}").into_bytes()))
            .collect();
        keys.sort();
        let (got, reads, _) = simulate(&keys, (b"", &[0]), 100);
        assert_eq!(got, keys);
        assert!(reads < 40, "{reads} reads");
    }
}
