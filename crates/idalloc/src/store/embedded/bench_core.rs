//! The memory store's state machine ([`Mvcc`]) driven synchronously, for the model checker
//! (`crates/idalloc-model`). Compiled only with the unstable `bench` feature.
//!
//! Why a wrapper rather than the memory [`EmbeddedStore`](super::EmbeddedStore): an exhaustive
//! search branches every store state into all its successors, so it needs a store it can clone
//! and step without a runtime, a clock or a writer task. This is the same `Mvcc` the memory and
//! file stores apply every request to (`Core::txn` calls [`Mvcc::txn`] unchanged); only the
//! persistence and the watch fan-out around it are left out. Every change is taken out of the
//! delta buffer at once (nothing here persists or publishes it), so a long search does not
//! accumulate it, and history is compacted to the current revision after each write: the checker
//! reads only the latest state.

use tokio::time::Instant;

use super::mvcc::Mvcc;
use crate::store::{
    GetRequest, GetResponse, KeyRange, LeaseId, Revision, StoreResult, TxnRequest, TxnResponse,
};

/// A synchronous, clonable in-memory etcd-semantics store (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct MemoryCore {
    mvcc: Mvcc,
}

impl MemoryCore {
    /// An empty store at revision 1.
    pub fn new() -> Self {
        MemoryCore { mvcc: Mvcc::new() }
    }

    /// Applies one txn, exactly as the memory store does.
    pub fn txn(&mut self, req: &TxnRequest) -> StoreResult<TxnResponse> {
        let resp = self.mvcc.txn(req);
        self.settle();
        resp
    }

    /// A read at the current revision.
    pub fn get(&self, req: &GetRequest) -> StoreResult<GetResponse> {
        self.mvcc.get(req)
    }

    /// Every live record under `prefix`, at the current revision.
    pub fn list(&self, prefix: &[u8]) -> StoreResult<GetResponse> {
        self.mvcc.get(&GetRequest::new(KeyRange::prefix(prefix.to_vec())))
    }

    /// Grants a lease (the TTL only matters to expiry by clock, which the checker replaces by
    /// explicit [`MemoryCore::lease_revoke`]).
    pub fn lease_grant(&mut self, ttl: i64) -> StoreResult<LeaseId> {
        let lease = self.mvcc.lease_grant(ttl, 1, Instant::now())?;
        self.settle();
        Ok(lease.id)
    }

    /// Revokes a lease with its keys, as an expiry does (one revision for all its keys).
    pub fn lease_revoke(&mut self, id: LeaseId) -> bool {
        let done = self.mvcc.lease_revoke(id);
        self.settle();
        done
    }

    /// The current revision.
    pub fn revision(&self) -> Revision {
        self.mvcc.revision()
    }

    /// The next lease ID this store will grant (part of its state: a checker that hashes states
    /// must include it).
    pub fn next_lease(&self) -> LeaseId {
        self.mvcc.meta().next_lease
    }

    fn settle(&mut self) {
        let _ = self.mvcc.take_delta();
        let rev = self.mvcc.revision();
        // Compacting to the current revision never fails (it is neither in the future nor below
        // the previous compaction point); if it did, keeping the history changes nothing the
        // checker reads.
        let _ = self.mvcc.compact(rev);
    }
}
