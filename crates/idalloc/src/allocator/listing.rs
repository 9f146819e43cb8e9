//! [`Pool::list_each`]: every binding of the pool in ID order, handed over a page at a time, so a
//! caller that prints them (`idalloc list`) holds a page, not the pool.
//!
//! Why not one pass over the pool's records: ID records are named by the decimal ID, so the store
//! lists them in string order (`10` before `9`), not the ID order `list` promises; and a merge by
//! key of `key/` and `ref/` is wrong too, because escaped keys do not sort alike in the two
//! families (docs/design/listings.md). So, at one revision:
//! 1. the names of `id/` are read keys only, page by page (`used_ids.rs`, as a lazy `lowest` bind
//!    reads them), into a [`DecimalIds`]: one or two bytes per ID, in ID order;
//! 2. walking those IDs in order, one txn reads the next [`MAX_TXN_OPS`] ID records (their keys;
//!    tombstones and unreadable values are left out, as [`Pool::list`] leaves them) and a second
//!    one the references of the bound ones (one prefix read per key): that page is handed over
//!    and dropped.
//!
//! Every read names the revision of step 1, so the listing is of one revision, like
//! [`Pool::list`]'s; every read is bounded and retried on its own (`Requester::call`), so a long
//! listing has a per-page bound, not one for the whole pool.

use super::handle::Pool;
use super::request::Class;
use super::types::Binding;
use super::used_ids;
use crate::decimal_ids::DecimalIds;
use crate::error::{Error, Result};
use crate::layout::IdRecord;
use crate::point_reads;
use crate::store::{GetRequest, KeyRange, OpResponse, Revision, TxnOp, TxnRequest, MAX_TXN_OPS};

impl Pool {
    /// Every binding with its holders, in ID order, at one revision, passed to `each` a page (at
    /// most 128 bindings) at a time; returns how many there were. Memory: a page, plus one or two
    /// bytes per ID record of the pool. An error of `each` ends the listing with that error.
    pub async fn list_each<E: From<Error>>(
        &self,
        mut each: impl FnMut(&[Binding]) -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, E> {
        let (ids, revision) = self.id_names().await?;
        let mut all = ids.iter().peekable();
        let mut count = 0u64;
        while all.peek().is_some() {
            let chunk: Vec<u64> = all.by_ref().take(MAX_TXN_OPS).collect();
            let page = self.bindings_of(&chunk, revision).await?;
            count += page.len() as u64;
            if !page.is_empty() {
                each(&page)?;
            }
        }
        Ok(count)
    }

    /// Step 1: the IDs of every ID record name (canonical decimal names only, as
    /// [`Pool::list`] reads them), and the revision they were read at.
    async fn id_names(&self) -> Result<(DecimalIds, Revision)> {
        let inner = &self.inner;
        let name = self.state.spec.name();
        let range = KeyRange::prefix(inner.layout.id_prefix(name));
        let page = inner.opts.list_page.saturating_mul(used_ids::PAGE_FACTOR);
        let mut ids = DecimalIds::new();
        let mut misordered = None;
        // Page by page, not `used_ids::for_each_page`: a pass that started over at a new
        // revision after a compaction would feed `ids` its names a second time; here a
        // compaction ends the listing with its error instead (nothing printed is repeated).
        let mut pages =
            inner.req.pages(&range, format!("pool {name:?}")).keys_only().page_size(page);
        while let Some(kvs) = pages.next_page().await? {
            for kv in &kvs {
                if let Some(id) = inner.layout.parse_id_key(name, &kv.key) {
                    if !ids.push(id) && misordered.is_none() {
                        misordered = Some(id);
                    }
                }
            }
        }
        let revision = pages.revision();
        if let Some(id) = misordered {
            return Err(Error::unavailable_for_good(format!(
                "the store listed the ID records of pool {name:?} out of key order (at ID {id}); \
                 the listing was stopped rather than printed out of order"
            )));
        }
        Ok((ids, revision))
    }

    /// Step 2 for one chunk of IDs: the bound ones with their holders, in the chunk's order.
    async fn bindings_of(&self, chunk: &[u64], revision: Revision) -> Result<Vec<Binding>> {
        let inner = &self.inner;
        let name = self.state.spec.name();
        let layout = &inner.layout;
        let at = |r: GetRequest| TxnOp::get(r.at_revision(revision));
        let ops: Vec<TxnOp> =
            chunk.iter().map(|id| at(GetRequest::key(layout.id_key(name, *id)))).collect();
        let resp = self.read_txn(ops).await?;
        let mut bound: Vec<(u64, String)> = Vec::with_capacity(chunk.len());
        for (id, r) in chunk.iter().zip(resp) {
            let key = match r {
                OpResponse::Get(g) => {
                    g.kvs.into_iter().next().map(|kv| IdRecord::decode(&kv.value))
                }
                _ => None,
            };
            if let Some(Some(IdRecord::Bound(key))) = key {
                bound.push((*id, key));
            }
        }
        let ops: Vec<TxnOp> = bound
            .iter()
            .map(|(_, key)| at(GetRequest::new(KeyRange::prefix(layout.ref_prefix(name, key)))))
            .collect();
        let refs = if ops.is_empty() { Vec::new() } else { self.read_txn(ops).await? };
        Ok(bound
            .into_iter()
            .zip(refs.into_iter().map(Some).chain(std::iter::repeat_with(|| None)))
            .map(|((id, key), r)| {
                let mut holders: Vec<String> = match r {
                    Some(OpResponse::Get(g)) => g
                        .kvs
                        .iter()
                        .filter_map(|kv| layout.parse_ref_key(name, &kv.key))
                        .filter(|(k, _)| *k == key)
                        .map(|(_, h)| h)
                        .collect(),
                    _ => Vec::new(),
                };
                holders.sort();
                Binding { id, key, holders }
            })
            .collect())
    }

    /// Reads, in as many txns as they take ([`point_reads::batches`]), each bounded and retried;
    /// their answers in order.
    async fn read_txn(&self, ops: Vec<TxnOp>) -> Result<Vec<OpResponse>> {
        let store = &self.inner.req.store;
        let mut out = Vec::with_capacity(ops.len());
        for batch in point_reads::batches(ops) {
            let n = batch.len();
            let req = TxnRequest::new().and_then(batch);
            let _slot = self.inner.req.admit(Class::Bulk).await;
            let resp = self.inner.req.call(|| store.txn(req.clone())).await?;
            if resp.responses.len() != n {
                return Err(Error::unavailable_for_good(format!(
                    "the store answered {} of the {n} reads of one txn",
                    resp.responses.len()
                )));
            }
            out.extend(resp.responses);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::layout::{IdRecord, Layout};
    use crate::pool::PoolSpec;
    use crate::store::embedded::EmbeddedStore;
    use crate::store::{Store, TxnOp, TxnRequest};
    use crate::{Allocator, AllocatorOptions};

    /// The pages of [`Pool::list_each`](super::Pool::list_each) are [`Pool::list`] cut in
    /// pieces: the same bindings, holders and order (IDs of 1 to 4 digits, whose names sort
    /// otherwise; tombstones, unreadable values, out-of-range IDs and stray names among them),
    /// each page at most 128 bindings, on small listing pages.
    #[tokio::test]
    async fn pages_are_the_whole_listing_in_pieces() {
        let store = Arc::new(EmbeddedStore::memory());
        let opts =
            AllocatorOptions { list_page: 7, lazy_view: true, ..AllocatorOptions::default() };
        let alloc = Allocator::from_arc(store.clone(), opts).unwrap();
        let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 9999)).await.unwrap();
        let l = Layout::default();
        let mut ops = Vec::new();
        for id in (1..=9999u64).step_by(31).chain([2, 3, 10, 100, 1000]) {
            let key = format!("k/{id}");
            let value = match id % 7 {
                0 => IdRecord::Tombstone(key.clone()).encode(),
                1 => b"".to_vec(),
                _ => IdRecord::Bound(key.clone()).encode(),
            };
            ops.push(TxnOp::put(l.id_key("p", id), value));
            for h in 0..id % 3 {
                ops.push(TxnOp::put(l.ref_key("p", &key, &format!("h{h}")), id.to_string()));
            }
        }
        ops.push(TxnOp::put(l.id_key("p", 123456), b"far".to_vec()));
        ops.push(TxnOp::put(b"idalloc/data/p/id/007".to_vec(), b"stray".to_vec()));
        for op in ops {
            store.txn(TxnRequest::new().and_then([op])).await.unwrap();
        }
        let whole = pool.list().await.unwrap();
        assert!(whole.len() > 200, "{}", whole.len());
        let mut pages = Vec::new();
        let n = pool
            .list_each(|page| {
                assert!(!page.is_empty() && page.len() <= 128, "{}", page.len());
                pages.push(page.to_vec());
                Ok::<_, crate::Error>(())
            })
            .await
            .unwrap();
        assert!(pages.len() > 1);
        assert_eq!(n, whole.len() as u64);
        assert_eq!(pages.concat(), whole);
        // An error of the caller ends the listing with it.
        let mut calls = 0;
        let stopped = pool
            .list_each(|_| {
                calls += 1;
                Err(crate::Error::unavailable("stop"))
            })
            .await;
        assert!(stopped.is_err() && calls == 1, "{stopped:?} after {calls} calls");
    }
}
