//! The one request path: every store request of the driver goes through a [`Requester`], which
//! bounds each attempt by the request timeout and retries `Unavailable` with ONE backoff policy
//! ([`Backoff`], from [`RetryPolicy`]; whole listings through [`Requester::pages`], which bounds
//! and retries each page the same way). It also keeps the newest store revision seen in a response
//! (the fence of binds, docs/design/fences.md "Late commits") and the per-pool quarantine lease for
//! tombstones (DESIGN §8, G5). It knows nothing of pools' registry, sessions or repairs, so the sync
//! task and the sweeper can use it without reaching into the allocator.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::pool_state::PoolState;
use super::turns::{Interactive, Turn, Turns};
use super::types::RetryPolicy;
use crate::error::{Error, Result};
pub(crate) use crate::retry::Backoff;
use crate::store::listing::{BoundedPages, PageBound};
use crate::store::{
    KeyRange, LeaseId, Revision, Store, StoreError, StoreResult, TxnRequest, TxnResponse,
};

/// Which kind of call a store request serves: what [`Requester::admit`] lets through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// A call for one key, or the coalesced flight of such calls (already bounded: two flights a
    /// lane, `lanes::MAX_FLIGHTS`). Never waits for admission.
    Interactive,
    /// A call for many keys (`acquire_many`, `release_many` and their durable and session forms)
    /// or the repair task's re-binding of held keys, and the reads of a page or listing: at
    /// most [`AllocatorOptions::bulk_in_flight`](super::AllocatorOptions::bulk_in_flight) such
    /// txns of this process at the store at once, one while others are about, in turns between
    /// clients ([`Turns`]).
    Bulk,
}

/// The store and how to talk to it: timeout, retries, page size.
pub(crate) struct Requester {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) request_timeout: Duration,
    pub(crate) retry: RetryPolicy,
    /// Keys per page when listing.
    pub(crate) list_page: i64,
    /// A sweep folds a pool's holder fence records when it finds more than this many.
    pub(crate) fold_fences_above: usize,
    /// The newest store revision seen in a response: the fence of this process's binds.
    seen: AtomicI64,
    /// Admission of [`Class::Bulk`] txns ([`Turns`]). Why: the store applies txns one at a
    /// time in the order they arrive (etcd's raft log), so a txn waits for every txn sent before
    /// it. Without a bound, a restart storm through `idalloc serve` (1,000 sessions re-acquiring
    /// 100 keys each, one txn of ~100 keys apiece) queued about a thousand txns at etcd, and one
    /// key's acquire sent meanwhile waited behind all of them (p99 1.8 s). Queued here instead,
    /// bulk txns leave the store's queue short, single-key calls pass them, and the store stays
    /// as busy: a few ~100-key txns in flight are as fast as many (docs/benchmarks/findings.md,
    /// the 8× target: 8 in flight as fast as 64).
    turns: Arc<Turns>,
}

impl Requester {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        request_timeout: Duration,
        retry: RetryPolicy,
        list_page: i64,
        fold_fences_above: usize,
        bulk_in_flight: usize,
    ) -> Requester {
        Requester {
            store,
            request_timeout,
            retry,
            list_page,
            fold_fences_above,
            seen: AtomicI64::new(0),
            turns: Turns::new(bulk_in_flight),
        }
    }

    /// Notes a single-key call for as long as the guard lives: bulk txns yield to it
    /// ([`Turns::interactive`]).
    pub(crate) fn interactive(&self) -> Interactive<'_> {
        self.turns.interactive()
    }

    /// Keys a txn of `class` packed now may hold: a coalesced flight of single-key calls is
    /// one round trip for all of them; a bulk txn holds fewer while single-key calls go on
    /// ([`Turns::batch_keys`]).
    pub(crate) fn batch_keys(&self, class: Class) -> usize {
        match class {
            Class::Interactive => crate::batch::MAX_BATCH_KEYS,
            Class::Bulk => self.turns.batch_keys(),
        }
    }

    /// Waits until a txn of `class` may go to the store; the turn, if any, is its slot until
    /// dropped (after the txn's answer, retries included). The request timeout starts after
    /// admission: time in this queue is not the store's.
    pub(crate) async fn admit(&self, class: Class) -> Option<Turn> {
        match class {
            Class::Interactive => None,
            Class::Bulk => Some(self.turns.admit().await),
        }
    }

    /// The newest store revision seen in a response.
    pub(crate) fn seen(&self) -> Revision {
        self.seen.load(Ordering::Acquire)
    }

    /// One attempt of a store request, bounded by the request timeout (a timeout is `Unavailable`).
    pub(super) async fn bounded<T>(
        &self,
        request: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(r) => r,
            Err(_) => {
                Err(StoreError::Unavailable(format!("no answer within {:?}", self.request_timeout)))
            }
        }
    }

    /// One store request with the timeout and retry policy. Only `Unavailable` is retried; every
    /// request the allocator sends is safe to repeat (its compares make a second apply a no-op or
    /// a fresh decision).
    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> StoreResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let mut backoff = Backoff::new(&self.retry);
        loop {
            match self.bounded(f()).await {
                Err(e) if backoff.retry(&e).await => {}
                other => return other,
            }
        }
    }

    /// A whole listing of `range` (named `what` in its errors: `pool "p"`), each page bounded by
    /// the request timeout and retried like one request, the listing itself unbounded (a listing
    /// that makes progress is never cut off). Every whole listing of the
    /// allocator reads through this; the pool's follower has its own loop (`feed.rs`). Each page
    /// takes a bulk turn ([`Turns`]): a page of a thousand records (a sweep reads its whole pool
    /// every interval) costs etcd about what a bulk txn does.
    pub(crate) fn pages<'a>(
        &'a self,
        range: &KeyRange,
        what: impl Into<String>,
    ) -> BoundedPages<'a, dyn Store> {
        let bound = PageBound {
            timeout: Some(self.request_timeout),
            retry: self.retry.clone(),
            ..PageBound::default()
        };
        let turns = &self.turns;
        BoundedPages::new(&*self.store, range, self.list_page, bound).named(what).gated(Box::new(
            move || Box::pin(async move { Box::new(turns.admit().await) as Box<dyn Send> }),
        ))
    }

    pub(crate) async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        let resp = self.call(|| self.store.txn(req.clone())).await?;
        self.seen.fetch_max(resp.revision, Ordering::AcqRel);
        Ok(resp)
    }

    /// [`Requester::txn`] that also tells whether an attempt may have been applied without this
    /// process learning it (an attempt timed out or failed after it may have been sent): such an
    /// attempt can still commit late.
    pub(crate) async fn txn_noting_doubt(
        &self,
        req: TxnRequest,
    ) -> (StoreResult<TxnResponse>, bool) {
        // Attempts sent minus attempts answered: a timeout drops an attempt without an answer,
        // and a retryable error may come after the request reached the store.
        let unanswered = std::sync::atomic::AtomicUsize::new(0);
        let result = self
            .call(|| {
                let req = req.clone();
                let unanswered = &unanswered;
                async move {
                    unanswered.fetch_add(1, Ordering::Relaxed);
                    let r = self.store.txn(req).await;
                    if !matches!(&r, Err(e) if e.is_retryable()) {
                        unanswered.fetch_sub(1, Ordering::Relaxed);
                    }
                    r
                }
            })
            .await;
        if let Ok(resp) = &result {
            self.seen.fetch_max(resp.revision, Ordering::AcqRel);
        }
        (result, unanswered.load(Ordering::Relaxed) > 0)
    }

    /// Notes a store revision this process has seen (txn headers, reads).
    pub(crate) fn note_seen(&self, revision: Revision) {
        self.seen.fetch_max(revision, Ordering::AcqRel);
    }
    /// The pool's quarantine lease for tombstones: shared by every release in one time bucket, so
    /// tombstones cost no extra round trip but the first of each bucket (DESIGN §8).
    pub(crate) async fn quarantine_lease(&self, pool: &PoolState) -> Result<Option<LeaseId>> {
        let delay = pool.spec.reuse_delay_duration();
        if delay.is_zero() {
            return Ok(None);
        }
        let mut q = pool.quarantine.lock().await;
        let now = Instant::now();
        if let Some((lease, usable_until)) = *q {
            if now < usable_until {
                return Ok(Some(lease));
            }
        }
        // A tombstone sent at any time in [now, now + bucket] lives at least `delay`: the lease
        // expires no earlier than now + delay + bucket + timeout (its TTL is counted from after
        // `now`). Callers fetch the lease for every attempt (`txn_with_quarantine`), never reuse
        // one across retries.
        // The request carrying a tombstone is sent within the bucket but may be applied up to a
        // request timeout later, so the TTL covers that too.
        let bucket = (delay / 8).max(Duration::from_secs(1));
        let ttl = ttl_secs(delay + bucket + self.request_timeout);
        let lease = self.call(|| self.store.lease_grant(ttl)).await?;
        *q = Some((lease.id, now + bucket));
        Ok(Some(lease.id))
    }

    /// Sends a txn that may write tombstones, with the retry policy. Each attempt takes the
    /// quarantine lease afresh (`build` gets it), so a retry never writes a tombstone on a lease
    /// granted too long ago to cover the reuse delay (G5); a quarantine lease that has vanished is
    /// replaced.
    pub(crate) async fn txn_with_quarantine(
        &self,
        pool: &PoolState,
        tombstones: bool,
        build: impl Fn(Option<LeaseId>) -> TxnRequest,
    ) -> Result<TxnResponse> {
        match self.txn_with_leases(pool, tombstones, None, build).await? {
            Some(resp) => Ok(resp),
            None => Err(Error::unavailable_for_good("unreachable: no session lease used")),
        }
    }

    /// [`Requester::txn_with_quarantine`] for a txn that also writes on the session lease `session`:
    /// `Ok(None)` if the store says that lease is gone (nothing was written).
    pub(crate) async fn txn_with_leases(
        &self,
        pool: &PoolState,
        tombstones: bool,
        session: Option<LeaseId>,
        build: impl Fn(Option<LeaseId>) -> TxnRequest,
    ) -> Result<Option<TxnResponse>> {
        let mut backoff = Backoff::new(&self.retry);
        loop {
            let lease = if tombstones { self.quarantine_lease(pool).await? } else { None };
            let req = build(lease);
            let result = self.bounded(self.store.txn(req)).await;
            match result {
                Ok(resp) => {
                    self.seen.fetch_max(resp.revision, Ordering::AcqRel);
                    return Ok(Some(resp));
                }
                Err(StoreError::LeaseNotFound(l)) if session == Some(l) => return Ok(None),
                Err(StoreError::LeaseNotFound(l)) if lease == Some(l) => {
                    let mut q = pool.quarantine.lock().await;
                    if matches!(*q, Some((ql, _)) if ql == l) {
                        *q = None;
                    }
                }
                Err(e) if backoff.retry(&e).await => continue,
                Err(e) => return Err(e.into()),
            }
            // A vanished quarantine lease: again at once, with a fresh one.
            backoff.again();
            if backoff.attempt() > self.retry.max_attempts + 2 {
                return Err(Error::unavailable(format!(
                    "pool {:?}: quarantine lease kept vanishing",
                    pool.spec.name()
                )));
            }
        }
    }
}

pub(super) fn ttl_secs(d: Duration) -> i64 {
    // Lease TTLs are whole seconds; round up so a lease never lives shorter than asked.
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1) as i64
}
