//! A [`Store`] wrapper that counts round trips per request kind.
//!
//! The design budgets every allocator operation in round trips (DESIGN.md §5); tests and the
//! benchmark harness check those budgets by wrapping the real store in [`CountingStore`]. One
//! method call on [`Store`] is one round trip, whatever it returns (errors count too: the request
//! was sent). A watch counts once when it is opened, not per message.

use std::sync::atomic::{AtomicU64, Ordering};

use idalloc::store::{
    GetRequest, GetResponse, KeyRange, Lease, LeaseId, Revision, Store, StoreResult, TxnRequest,
    TxnResponse, WatchStream,
};

/// Round trips per request kind, as counted by a [`CountingStore`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips {
    /// [`Store::txn`] calls.
    pub txn: u64,
    /// [`Store::get`] calls (one per page of a paginated read).
    pub get: u64,
    /// [`Store::lease_grant`] calls.
    pub lease_grant: u64,
    /// [`Store::lease_keep_alive`] calls.
    pub lease_keep_alive: u64,
    /// [`Store::lease_revoke`] calls.
    pub lease_revoke: u64,
    /// [`Store::watch`] calls (streams opened, not messages received).
    pub watch: u64,
    /// [`Store::compact`] calls.
    pub compact: u64,
}

impl RoundTrips {
    /// All round trips together.
    pub fn total(&self) -> u64 {
        self.txn
            + self.get
            + self.lease_grant
            + self.lease_keep_alive
            + self.lease_revoke
            + self.watch
            + self.compact
    }
}

#[derive(Default)]
struct Counters {
    txn: AtomicU64,
    get: AtomicU64,
    lease_grant: AtomicU64,
    lease_keep_alive: AtomicU64,
    lease_revoke: AtomicU64,
    watch: AtomicU64,
    compact: AtomicU64,
}

/// Wraps a store and counts each request (see the module docs). Counting is lock-free and never
/// changes what the inner store sees or returns.
pub struct CountingStore<S> {
    inner: S,
    counters: Counters,
}

impl<S: Store> CountingStore<S> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        CountingStore { inner, counters: Counters::default() }
    }

    /// The wrapped store (requests made through it are not counted).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The counts so far.
    pub fn counts(&self) -> RoundTrips {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RoundTrips {
            txn: get(&c.txn),
            get: get(&c.get),
            lease_grant: get(&c.lease_grant),
            lease_keep_alive: get(&c.lease_keep_alive),
            lease_revoke: get(&c.lease_revoke),
            watch: get(&c.watch),
            compact: get(&c.compact),
        }
    }

    /// Sets every count back to zero (e.g. after a test's setup).
    pub fn reset(&self) {
        let c = &self.counters;
        for a in [
            &c.txn,
            &c.get,
            &c.lease_grant,
            &c.lease_keep_alive,
            &c.lease_revoke,
            &c.watch,
            &c.compact,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

#[async_trait::async_trait]
impl<S: Store> Store for CountingStore<S> {
    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        bump(&self.counters.txn);
        self.inner.txn(req).await
    }
    async fn get(&self, req: GetRequest) -> StoreResult<GetResponse> {
        bump(&self.counters.get);
        self.inner.get(req).await
    }
    async fn lease_grant(&self, ttl: i64) -> StoreResult<Lease> {
        bump(&self.counters.lease_grant);
        self.inner.lease_grant(ttl).await
    }
    async fn lease_keep_alive(&self, id: LeaseId) -> StoreResult<Option<i64>> {
        bump(&self.counters.lease_keep_alive);
        self.inner.lease_keep_alive(id).await
    }
    async fn lease_revoke(&self, id: LeaseId) -> StoreResult<bool> {
        bump(&self.counters.lease_revoke);
        self.inner.lease_revoke(id).await
    }
    async fn watch(&self, range: KeyRange, start_revision: Revision) -> StoreResult<WatchStream> {
        bump(&self.counters.watch);
        self.inner.watch(range, start_revision).await
    }
    async fn compact(&self, revision: Revision) -> StoreResult<()> {
        bump(&self.counters.compact);
        self.inner.compact(revision).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::embedded::EmbeddedStore;
    use idalloc::store::TxnOp;

    #[tokio::test]
    async fn counts_each_call_once_per_kind_including_errors() {
        let s = CountingStore::new(EmbeddedStore::memory());
        s.txn(TxnRequest::new().and_then([TxnOp::put("a", "1")])).await.unwrap();
        s.txn(TxnRequest::new().and_then([TxnOp::put("", "1")])).await.unwrap_err();
        s.get(GetRequest::key("a")).await.unwrap();
        let l = s.lease_grant(10).await.unwrap();
        s.lease_keep_alive(l.id).await.unwrap();
        s.lease_revoke(l.id).await.unwrap();
        let _w = s.watch(KeyRange::key("a"), 0).await.unwrap();
        s.compact(2).await.unwrap();
        s.inner().get(GetRequest::key("a")).await.unwrap(); // not counted
        let c = s.counts();
        assert_eq!(
            c,
            RoundTrips {
                txn: 2,
                get: 1,
                lease_grant: 1,
                lease_keep_alive: 1,
                lease_revoke: 1,
                watch: 1,
                compact: 1
            }
        );
        assert_eq!(c.total(), 8);
        s.reset();
        assert_eq!(s.counts(), RoundTrips::default());
        assert_eq!(s.counts().total(), 0);
    }
}
