//! A [`Store`] wrapper that counts round trips per request kind.
//!
//! The design budgets every allocator operation in round trips (DESIGN.md §5); tests and the
//! benchmark harness check those budgets by wrapping the real store in [`CountingStore`]. One
//! method call on [`Store`] is one round trip, whatever it returns (errors count too: the request
//! was sent). A watch counts once when it is opened, not per message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idalloc::store::{Store, StoreResult};

use crate::hooked::{Answer, Hook, HookedStore, Kind, Request, Response};

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

    /// The round trips an operation made: all of them except lease keep-alives. A session's
    /// keep-alive loop renews its lease every TTL/3 in the background through the same store, so
    /// on a real-time backend a renewal can land inside any measured window; it is not part of
    /// the operation's budget (DESIGN.md §5 budgets per call), and counting it made budget checks
    /// flaky. Tests of keep-alives themselves read [`RoundTrips::lease_keep_alive`].
    pub fn excluding_keep_alives(&self) -> u64 {
        self.total() - self.lease_keep_alive
    }
}

/// The [`Hook`] of a [`CountingStore`]: one lock-free counter per request kind.
#[derive(Default)]
pub struct Counter {
    txn: AtomicU64,
    get: AtomicU64,
    lease_grant: AtomicU64,
    lease_keep_alive: AtomicU64,
    lease_revoke: AtomicU64,
    watch: AtomicU64,
    compact: AtomicU64,
    records_returned: AtomicU64,
    records_counted: AtomicU64,
    largest_count: AtomicU64,
}

/// What the [`Store::get`] calls of a [`CountingStore`] cost the store: a limited range read is
/// not O(limit), since etcd (and the embedded store) count every key of the range to answer
/// `count`. A listing whose reads counted far more records than they returned is quadratic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// Records returned by all reads.
    pub returned: u64,
    /// Sum of the reads' `count` (the records each read had to walk).
    pub counted: u64,
    /// The largest `count` of one read.
    pub largest_count: u64,
}

impl Counter {
    fn slot(&self, kind: Kind) -> &AtomicU64 {
        match kind {
            Kind::Txn => &self.txn,
            Kind::Get => &self.get,
            Kind::LeaseGrant => &self.lease_grant,
            Kind::LeaseKeepAlive => &self.lease_keep_alive,
            Kind::LeaseRevoke => &self.lease_revoke,
            Kind::Watch => &self.watch,
            Kind::Compact => &self.compact,
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> Hook<S> for Counter {
    async fn before(&self, _inner: &Arc<S>, req: Request) -> StoreResult<Request> {
        self.slot(req.kind()).fetch_add(1, Ordering::Relaxed);
        Ok(req)
    }

    async fn after(&self, _inner: &Arc<S>, _kind: Kind, result: Answer) -> Answer {
        if let Ok(Response::Get(r)) = &result {
            let count = u64::try_from(r.count).unwrap_or(0);
            self.records_returned.fetch_add(r.kvs.len() as u64, Ordering::Relaxed);
            self.records_counted.fetch_add(count, Ordering::Relaxed);
            self.largest_count.fetch_max(count, Ordering::Relaxed);
        }
        result
    }
}

/// Wraps a store and counts each request (see the module docs). Counting never changes what the
/// inner store sees or returns.
pub type CountingStore<S> = HookedStore<S, Counter>;

impl<S: Store> CountingStore<S> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        HookedStore::with_hook(inner, Counter::default())
    }

    /// The counts so far.
    pub fn counts(&self) -> RoundTrips {
        let c = self.hook();
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

    /// What the reads so far cost (see [`Reads`]).
    pub fn reads(&self) -> Reads {
        let c = self.hook();
        Reads {
            returned: c.records_returned.load(Ordering::Relaxed),
            counted: c.records_counted.load(Ordering::Relaxed),
            largest_count: c.largest_count.load(Ordering::Relaxed),
        }
    }

    /// Waits until no request but keep-alives was sent for `quiet`, at most 100 such windows: a
    /// test's setup may leave background work still to send (a follower's listing, then its
    /// watch; the spec watch's one read of a newly followed pool) that would count against what
    /// the test measures next. On a paused clock the windows pass at once.
    pub async fn settle(&self, quiet: std::time::Duration) {
        for _ in 0..100 {
            let before = self.counts().excluding_keep_alives();
            tokio::time::sleep(quiet).await;
            if self.counts().excluding_keep_alives() == before {
                return;
            }
        }
    }

    /// Sets every count back to zero (e.g. after a test's setup).
    pub fn reset(&self) {
        let c = self.hook();
        for a in [
            &c.records_returned,
            &c.records_counted,
            &c.largest_count,
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

#[cfg(test)]
mod tests {
    use super::*;
    use idalloc::store::embedded::EmbeddedStore;
    use idalloc::store::{GetRequest, KeyRange, TxnOp, TxnRequest};

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
        assert_eq!(c.excluding_keep_alives(), 7);
        s.reset();
        assert_eq!(s.counts(), RoundTrips::default());
        assert_eq!(s.counts().total(), 0);
    }
}
