//! The used IDs of a pool, read by name only: what a lazily opened `lowest` pool needs to find its
//! lowest free ID for a new key (`Candidates::UsedIds` in `protocol/bind_step.rs`).
//!
//! One keys-only pass over `id/` at one revision, handed to the caller a page at a time, so the
//! process holds a page and the free set, never the listing. The pass pages as every listing of
//! the crate does ([`Pages`], `store/window.rs`: each read's window sized from the names read so
//! far to hold about a page), because etcd 3.4 walks its index over the whole requested range on
//! every read whatever the limit: paging 1M names through one open range walked the index O(n)
//! times per page (4.6 s for a 100,000-binding pool where the full view took 1.1 s, with the
//! fixed-size windows the listing used before; docs/scale.md, "One key").

use super::request::Requester;
use crate::store::{KeyRange, KeyValue, Revision, StoreResult};

/// Names per page of the pass, per record of a listing page (`AllocatorOptions::list_page`): names
/// only (about 30 bytes each in the answer), so a page may hold ten times as many records (10,000
/// by default) and stay far below etcd's 4 MiB answers.
pub(super) const PAGE_FACTOR: i64 = 10;

/// Reads the names of every record in the prefix range `range`, keys only, at one revision, and
/// calls `on_page` with each non-empty page in key order; returns that revision. Each page is
/// bounded and retried as one request of `req` ([`Requester::pages`]: a failed page is read
/// again from where the pass stands). If the revision is compacted away the pass starts over at
/// a new one; the IDs already marked stay marked, which is safe (a used ID that was freed meanwhile
/// is only a candidate less, as for any stale knowledge: the bind's compares decide).
pub(super) async fn for_each_page(
    req: &Requester,
    range: &KeyRange,
    page: i64,
    what: &str,
    mut on_page: impl FnMut(&[KeyValue]),
) -> StoreResult<Revision> {
    let pages = req.pages(range, what).keys_only().page_size(page);
    let ((), revision) = pages.fold(|| (), |_, kvs| on_page(&kvs)).await?;
    Ok(revision)
}
