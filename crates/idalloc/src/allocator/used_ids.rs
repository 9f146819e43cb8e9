//! The used IDs of a pool, read by name only: what a lazily opened `lowest` pool needs to find its
//! lowest free ID for a new key (issue 21 item 0; `Candidates::UsedIds` in `protocol/bind_step.rs`).
//!
//! One keys-only pass over `id/` at one revision, handed to the caller a page at a time, so the
//! process holds a page and the free set, never the listing. How the pass is cut matters more than
//! the bytes: etcd 3.4 walks its index over the whole requested range on every read (to count it),
//! whatever the limit, so paging 1M names through one range read the index O(n) times per page.
//! The pass is therefore cut as the cache's own listing is (`feed.rs`, `list_range`): a first page
//! tells how many records there are, and a big range is read in sub-ranges split at the next one
//! to three decimal digits after the prefix (ID records are named by decimal IDs), each about ten
//! pages, so each read walks about what it returns. Measured before this split (windowed pages of
//! the whole range): 4.6 s for a 100,000-binding pool where the full view took 1.1 s
//! (docs/scale.md, "One key").
//!
//! The split itself ([`subranges`]) is pure and tested here; the reading is in [`for_each_page`].

use super::request::{Backoff, Requester};
use crate::store::{GetRequest, KeyRange, KeyValue, Pages, Revision, StoreResult};

/// Names per page of the pass, per record of a listing page (`AllocatorOptions::list_page`): names
/// only (about 30 bytes each in the answer), so a page may hold ten times as many records (10,000
/// by default) and stay far below etcd's 4 MiB answers.
pub(super) const PAGE_FACTOR: i64 = 10;

/// A sub-range should hold about this many pages.
const PAGES_PER_SUBRANGE: i64 = 10;

/// The sub-ranges a pass over the prefix range `range` holding `count` records reads, in key
/// order: the whole range when it holds at most [`PAGES_PER_SUBRANGE`] pages; else split before
/// every decimal of `d` digits without a leading zero (`prefix` + `10`, …, `prefix` + `99` for
/// `d = 2`), with the smallest `d` ≤ 3 that makes the pieces small enough. Every key of the range
/// falls in exactly one sub-range (they tile it).
pub(super) fn subranges(range: &KeyRange, count: i64, page: i64) -> Vec<KeyRange> {
    let page = page.max(1);
    let pieces = |digits: u32| if digits == 0 { 1 } else { 9 * 10i64.pow(digits - 1) };
    let mut digits = 0u32;
    while digits < 3 && count / pieces(digits) > PAGES_PER_SUBRANGE * page {
        digits += 1;
    }
    if digits == 0 {
        return vec![range.clone()];
    }
    let lo = 10u64.pow(digits - 1);
    let mut bounds: Vec<Vec<u8>> = Vec::with_capacity(pieces(digits) as usize + 2);
    bounds.push(range.key.clone());
    bounds.extend((lo..lo * 10).map(|n| {
        let mut b = range.key.clone();
        b.extend_from_slice(n.to_string().as_bytes());
        b
    }));
    bounds.push(range.range_end.clone());
    bounds.windows(2).map(|w| KeyRange { key: w[0].clone(), range_end: w[1].clone() }).collect()
}

/// Reads the names of every record in the prefix range `range`, keys only, at one revision, and
/// calls `on_page` with each non-empty page in key order; returns that revision. Each read is
/// bounded by the request timeout and retried as any request of `req` (a failed page is read
/// again from where the pass stands).
pub(super) async fn for_each_page(
    req: &Requester,
    range: &KeyRange,
    page: i64,
    mut on_page: impl FnMut(&[KeyValue]),
) -> StoreResult<Revision> {
    let store = &*req.store;
    let first = GetRequest::new(range.clone()).with_limit(page).keys_only();
    let probe = req.call(|| store.get(first.clone())).await?;
    if !probe.more {
        if !probe.kvs.is_empty() {
            on_page(&probe.kvs);
        }
        return Ok(probe.revision);
    }
    let revision = probe.revision;
    drop(probe.kvs);
    for sub in subranges(range, probe.count, page) {
        let mut pages = Pages::at(store, &sub, page, revision).keys_only();
        loop {
            let mut backoff = Backoff::new(&req.retry);
            let next = loop {
                match req.bounded(pages.next_page()).await {
                    Err(e) if backoff.retry(&e).await => {}
                    other => break other?,
                }
            };
            let Some(kvs) = next else { break };
            on_page(&kvs);
        }
    }
    Ok(revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(p: &str) -> KeyRange {
        KeyRange::prefix(p.as_bytes().to_vec())
    }

    fn names(r: &[KeyRange]) -> Vec<(String, String)> {
        r.iter()
            .map(|k| {
                (
                    String::from_utf8_lossy(&k.key).into_owned(),
                    String::from_utf8_lossy(&k.range_end).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn a_small_range_is_read_whole() {
        // Up to ten pages: one range, as a plain listing.
        let r = prefix("p/id/");
        assert_eq!(subranges(&r, 100_000, 10_000), vec![r.clone()]);
        assert_eq!(subranges(&r, 0, 10_000), vec![r]);
    }

    #[test]
    fn a_big_range_is_split_at_decimal_digits_and_tiled() {
        // 1M names in pages of 10,000: one digit gives pieces of ~111k (too big), two digits
        // ~11k: 90 pieces plus the ones before `10` and from `99` on, tiling the range.
        let r = prefix("p/id/");
        let subs = subranges(&r, 1_000_000, 10_000);
        assert_eq!(subs.len(), 91);
        let n = names(&subs);
        assert_eq!(n[0], ("p/id/".into(), "p/id/10".into()));
        assert_eq!(n[1], ("p/id/10".into(), "p/id/11".into()));
        assert_eq!(n[90], ("p/id/99".into(), "p/id0".into()));
        for w in subs.windows(2) {
            assert_eq!(w[0].range_end, w[1].key, "no gap, no overlap");
        }
        // Every ID's name falls in exactly one piece.
        for id in [1u64, 9, 10, 99, 100, 123_456, 999_999, 1_000_000, u64::MAX] {
            let k = format!("p/id/{id}").into_bytes();
            assert_eq!(subs.iter().filter(|s| s.contains(&k)).count(), 1, "{id}");
        }
    }

    #[test]
    fn the_split_stops_at_three_digits() {
        // 900 pieces at most, however big the range: each read still walks at most its piece.
        let subs = subranges(&prefix("p/id/"), 1_000_000_000, 1_000);
        assert_eq!(subs.len(), 901);
        assert_eq!(names(&subs)[1], ("p/id/100".into(), "p/id/101".into()));
    }
}
