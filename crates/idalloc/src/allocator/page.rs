//! [`Pool::list_page`]: one page of the pool's bindings, in ID order, with their holders, at a
//! cost of O(page) whatever the pool's size.
//!
//! Why not [`Pool::list`] and a cut: that reads the whole pool for every page, so paging through
//! B bindings `limit` at a time cost B²/limit records (the service's `GET …/bindings` did that:
//! 100 pages of a 100,000-binding pool read 10 million records). And why not a range read of the
//! store from the cursor on: ID records are keyed by the decimal ID, so the store's key order is
//! not the ID order the page promises.
//!
//! Instead the page's IDs come from the cache, which holds every binding already: its free-ID set
//! keeps the used IDs as runs in a search tree ([`IdSet::runs_from`](crate::idset::IdSet)), so the
//! walk starts at the cursor in O(log runs) and visits only the used IDs of the page (bound ones,
//! plus the few tombstones, reserved runs skipped whole). Then one txn per [`PER_TXN`] bindings
//! reads each binding's ID record and references: the holders, and a check that the ID still
//! binds that key when read (a binding released after the cache saw it is left out; the page is
//! "as of" its reads, like the pages of `list`, which are not at one revision either).

use super::handle::Pool;
use super::request::Class;
use super::types::Binding;
use crate::error::Result;
use crate::layout::IdRecord;
use crate::store::{GetRequest, KeyRange, OpResponse, TxnOp, TxnRequest, MAX_TXN_OPS};

/// Bindings whose records one txn reads: two gets each (ID record, references).
pub const PER_TXN: usize = MAX_TXN_OPS / 2;

/// One page of [`Pool::list_page`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BindingsPage {
    /// Bindings with an ID above the cursor, in ID order, at most the page's limit.
    pub bindings: Vec<Binding>,
    /// The cursor of the next page (the last ID here), `None` when this was the last page.
    pub next_after: Option<u64>,
    /// Used IDs of the cache's free set the walk looked at (bound or not): O(page), the figure
    /// the service's test checks against the pool's size.
    pub scanned: u64,
}

impl Pool {
    /// Up to `limit` bindings with an ID greater than `after` (all, from the lowest, with
    /// `None`), in ID order, with their holders read from the store. Waits until the cache is
    /// synced. One txn per 64 bindings; no listing.
    pub async fn list_page(&self, after: Option<u64>, limit: usize) -> Result<BindingsPage> {
        self.wait_synced().await?;
        let (candidates, scanned, more) = self.page_from_cache(after, limit);
        let name = self.state.spec.name();
        let layout = &self.inner.layout;
        let mut bindings = Vec::with_capacity(candidates.len());
        for chunk in candidates.chunks(PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .flat_map(|(id, key)| {
                    [
                        TxnOp::get_key(layout.id_key(name, *id)),
                        TxnOp::get(GetRequest::new(KeyRange::prefix(layout.ref_prefix(name, key)))),
                    ]
                })
                .collect();
            let req = &self.inner.req;
            // Many reads in one txn: admitted as bulk work, so a page yields to one-key calls.
            let _slot = req.admit(Class::Bulk).await;
            let resp = req.call(|| req.store.txn(TxnRequest::new().and_then(ops.clone()))).await?;
            let mut it = resp.responses.into_iter();
            for (id, key) in chunk {
                let (Some(OpResponse::Get(rec)), Some(OpResponse::Get(refs))) =
                    (it.next(), it.next())
                else {
                    break;
                };
                let still = rec.kvs.first().and_then(|kv| IdRecord::decode(&kv.value));
                if !matches!(&still, Some(IdRecord::Bound(k)) if k == key) {
                    continue;
                }
                let mut holders: Vec<String> = refs
                    .kvs
                    .iter()
                    .filter_map(|kv| layout.parse_ref_key(name, &kv.key))
                    .filter(|(k, _)| k == key)
                    .map(|(_, h)| h)
                    .collect();
                holders.sort();
                bindings.push(Binding { id: *id, key: key.clone(), holders });
            }
        }
        let next_after = if more { candidates.last().map(|(id, _)| *id) } else { None };
        Ok(BindingsPage { bindings, next_after, scanned })
    }

    /// The next `limit` bound IDs above `after` in the cache, with their keys; the used IDs
    /// looked at; and whether a bound ID follows them.
    fn page_from_cache(&self, after: Option<u64>, limit: usize) -> (Vec<(u64, String)>, u64, bool) {
        let spec = &*self.state.spec_now();
        let Some(mut from) = first_raw_after(spec, after) else {
            return (Vec::new(), 0, false);
        };
        let mut reserved: Vec<(u64, u64)> = spec.reserved().to_vec();
        reserved.sort_unstable();
        let mut cache = self.state.lock_cache();
        let mut out: Vec<(u64, String)> = Vec::with_capacity(limit.min(4096));
        let mut scanned = 0u64;
        loop {
            // Walk the used IDs from `from` (reserved runs skipped whole) for as many candidates
            // as the page still needs, plus one to know whether another page follows; then keep
            // the bound ones. Tombstones among them make another round, from where this one
            // stopped: O(page + tombstones) in all.
            let want = limit + 1 - out.len();
            let (batch, next) = walk(cache.free_ids(), &reserved, from, want);
            scanned += batch.len() as u64;
            for raw in batch {
                let id = spec.apply_prefix(raw);
                if let Some(k) = cache.key_of(id) {
                    if out.len() == limit {
                        return (out, scanned, true);
                    }
                    out.push((id, k.to_string()));
                }
            }
            match next {
                Some(n) => from = n,
                None => return (out, scanned, false),
            }
        }
    }
}

/// Up to `want` used, not reserved, raw IDs from `from` on, in order, and where to go on from
/// (`None`: the walk reached the end of the set).
fn walk(
    free: &crate::idset::IdSet,
    reserved: &[(u64, u64)],
    from: u64,
    want: usize,
) -> (Vec<u64>, Option<u64>) {
    let reserved_end = |raw: u64| {
        let i = reserved.partition_point(|r| r.0 <= raw);
        i.checked_sub(1).map(|i| reserved[i]).filter(|r| r.1 >= raw).map(|r| r.1)
    };
    let mut out = Vec::with_capacity(want.min(4096));
    for (start, end) in free.runs_from(from) {
        let mut raw = start.max(from);
        while raw <= end {
            if let Some(r_end) = reserved_end(raw) {
                match r_end.checked_add(1) {
                    Some(next) => raw = next,
                    None => return (out, None),
                }
                continue;
            }
            if out.len() == want {
                return (out, Some(raw));
            }
            out.push(raw);
            match raw.checked_add(1) {
                Some(n) => raw = n,
                None => return (out, None),
            }
        }
    }
    (out, None)
}

/// The lowest raw ID of the pool's range whose ID (prefix applied) is above `after`; `None` if
/// there is none. `apply_prefix` is increasing in the raw ID, so a binary search finds it.
fn first_raw_after(spec: &crate::pool::PoolSpec, after: Option<u64>) -> Option<u64> {
    let (mut lo, hi) = (spec.min().max(1), spec.max());
    let Some(a) = after else { return (lo <= hi).then_some(lo) };
    if lo > hi || spec.apply_prefix(hi) <= a {
        return None;
    }
    let mut hi = hi;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if spec.apply_prefix(mid) > a {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolSpec;

    #[test]
    fn the_cursor_maps_to_the_first_raw_id_above_it_with_and_without_prefix() {
        let plain = PoolSpec::new("p", 10, 20);
        assert_eq!(first_raw_after(&plain, None), Some(10));
        assert_eq!(first_raw_after(&plain, Some(3)), Some(10));
        assert_eq!(first_raw_after(&plain, Some(14)), Some(15));
        assert_eq!(first_raw_after(&plain, Some(20)), None);
        assert_eq!(first_raw_after(&plain, Some(u64::MAX)), None);
        let prefixed = PoolSpec::new("p", 1, 255).prefix(0x300);
        assert_eq!(first_raw_after(&prefixed, Some(0x305)), Some(6));
        assert_eq!(first_raw_after(&prefixed, Some(5)), Some(1));
        assert_eq!(first_raw_after(&prefixed, Some(0x3ff)), None);
    }
}
