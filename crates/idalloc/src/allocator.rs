//! The async driver: runs the protocol's decisions against a store, and owns everything a process
//! keeps between calls: local reference counts, the session lease and its keep-alive, one cache per
//! pool, and the repairs of DESIGN §7.
//!
//! Concurrency model: no store-side locks. Inside the process, one async mutex per key makes
//! concurrent acquires of the same key share one request (the first does the round trip, the others
//! then find it held and only count) and orders acquire against release of the same key. Background
//! tasks (keep-alive, per-pool sync, repairs, optional sweeper) hold only weak references, so dropping
//! every handle without `close()` behaves like a crash: the keep-alive stops and the lease runs out.

mod batch;
mod bind;
pub mod client_session;
mod cluster_events;
mod coalesce;
mod events;
mod handle;
mod lanes;
mod lazy_broadcast;
mod listing;
mod options;
mod page;
pub(crate) mod pool_state;
mod registry;
mod release;
mod repair;
pub(crate) mod repair_queue;
pub(crate) mod request;
pub(crate) mod resize;
mod session;
mod spec_watch;
pub(crate) mod sweeper;
mod sync;
#[cfg(test)]
mod tests;
mod turns;
mod types;
mod used_ids;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use tracing::warn;

use crate::error::{Error, Input, Result};
use crate::layout::Layout;
use crate::pool::{validate_holder, validate_key, validate_pool_name, PoolSpec};
use crate::store::{Compare, GetRequest, KeyRange, LeaseId, OpResponse, Store, TxnOp, TxnRequest};

pub use cluster_events::ClusterEvents;
pub use events::{Events, Stamped, StampedEvents};
pub use handle::Pool;
pub use options::{AllocatorOptionsBuilder, RetryPolicyBuilder};
pub use page::BindingsPage;
pub use turns::as_client;
pub use types::{
    Acquired, AllocatorOptions, Binding, Released, RetryPolicy, DEFAULT_BULK_IN_FLIGHT,
};

pub(crate) use bind::RefLease;
use pool_state::lock;
pub(crate) use registry::Inner;
use registry::Session;
use repair_queue::RepairQueue;
use request::Requester;

/// The entry point: one per process and store. Cheap to clone.
#[derive(Clone)]
pub struct Allocator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("holder", &self.inner.holder)
            .field("prefix", &self.inner.opts.prefix)
            .finish()
    }
}

fn default_holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_string());
    // In the leased namespace, which durable holder names may not use (`LEASED_HOLDER_PREFIX`).
    format!("{}{host}-{:08x}", crate::pool::LEASED_HOLDER_PREFIX, rand::random::<u32>())
}

impl Allocator {
    /// Builds an allocator on `store`. Makes no request yet: the session lease is granted on the
    /// first leased acquire, so a process that only uses durable references never creates one.
    pub fn new(store: impl Store, opts: AllocatorOptions) -> Result<Allocator> {
        Self::from_arc(Arc::new(store), opts)
    }

    /// Like [`Allocator::new`] for a store that is already shared.
    pub fn from_arc(store: Arc<dyn Store>, opts: AllocatorOptions) -> Result<Allocator> {
        let layout = Layout::new(&opts.prefix)?;
        let holder = match &opts.holder {
            Some(h) => h.clone(),
            None => default_holder(),
        };
        opts.validate()?;
        validate_holder(&holder)?;
        let rng = match opts.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::seed_from_u64(rand::random()),
        };
        let (repairs, repair_rx) = RepairQueue::new();
        crate::metrics::describe();
        let store: Arc<dyn Store> = Arc::new(crate::metrics::MeteredStore::new(store));
        let req = Arc::new(Requester::new(
            store,
            opts.request_timeout,
            opts.retry.clone(),
            opts.list_page,
            opts.fold_fences_above,
            opts.bulk_in_flight,
        ));
        let inner = Arc::new(Inner {
            req,
            layout,
            opts,
            holder,
            session: tokio::sync::Mutex::new(Session::default()),
            pools: Mutex::new(HashMap::new()),
            rng: Mutex::new(rng),
            tasks: Mutex::new(Vec::new()),
            repairs,
            closed: AtomicBool::new(false),
            cluster_version: std::sync::atomic::AtomicU32::new(0),
            spec_watch: Arc::default(),
        });
        let task = tokio::spawn(repair::repair_loop(Arc::downgrade(&inner), repair_rx));
        lock(&inner.tasks).push(task.abort_handle());
        Ok(Allocator { inner })
    }

    /// A new client session with its own lease of `ttl` (whole seconds, at least 1 s), kept alive
    /// by its caller ([`crate::ClientSession::keep_alive`]), not by this allocator: the session
    /// of a remote client (`idalloc serve`) that must lose its references when the client stops
    /// renewing, exactly as a crashed process does (G4). One round trip.
    pub async fn client_session(&self, ttl: Duration) -> Result<crate::ClientSession> {
        client_session::open(&self.inner, ttl).await
    }

    /// A client session that any process on this store can adopt (several
    /// `serve` replicas sharing one etcd, and a client failing over between them). Like
    /// [`Allocator::client_session`], plus: its holder name derives from the lease alone
    /// ([`client_session::shared_holder`]`(holder_prefix, lease)`), not from this allocator, and
    /// `record` is put at `P/sessions/<lease>` on the lease, so it vanishes with the session. The
    /// opener keeps there what another process needs to verify a client's claim to the session
    /// (never a secret in clear). Two round trips.
    pub async fn shared_client_session(
        &self,
        ttl: Duration,
        holder_prefix: &str,
        record: &[u8],
    ) -> Result<crate::ClientSession> {
        client_session::open_shared(&self.inner, ttl, holder_prefix, record).await
    }

    /// The record of the shared client session on `lease` ([`Allocator::shared_client_session`]),
    /// or `None` if there is none: the lease is gone (the session ended or expired) or was never
    /// a shared session's. One round trip.
    pub async fn client_session_record(&self, lease: LeaseId) -> Result<Option<Vec<u8>>> {
        client_session::shared_record(&self.inner, lease).await
    }

    /// A handle on the shared client session on `lease`, opened by this or another process with
    /// [`Allocator::shared_client_session`] and the same `holder_prefix`: the references it makes
    /// and releases are the session's own (same holder, same lease), and
    /// [`crate::ClientSession::keep_alive`] renews the session's lease. No request: verify the
    /// caller's claim first ([`Allocator::client_session_record`]); the store judges the lease on
    /// every use.
    pub fn adopt_client_session(
        &self,
        lease: LeaseId,
        ttl: Duration,
        holder_prefix: &str,
    ) -> Result<crate::ClientSession> {
        client_session::adopt(&self.inner, lease, ttl, holder_prefix)
    }

    /// This process's holder name (its leased references are `ref/<key>/<holder>`).
    pub fn holder(&self) -> &str {
        &self.inner.holder
    }

    /// The session lease, if one was granted (for tests and diagnostics).
    pub async fn session_lease(&self) -> Option<LeaseId> {
        self.inner.session.lock().await.lease
    }

    /// Creates pool `spec.name()`, or succeeds if an equal spec exists; a different one gives
    /// `RangeMismatch` naming both (Contiv's `InitPool`). One round trip.
    pub async fn init_pool(&self, spec: &PoolSpec) -> Result<()> {
        self.inner.init_pool(spec).await.map(|_| ())
    }

    /// [`Allocator::init_pool`], then a handle on the pool (no extra round trip for the spec).
    pub async fn ensure_pool(&self, spec: &PoolSpec) -> Result<Pool> {
        let read = self.inner.init_pool(spec).await?;
        Ok(Pool::new(self.inner.clone(), self.inner.open_state(read)))
    }

    /// A handle on an existing pool; `PoolNotFound` if there is none. Starts the pool's cache.
    pub async fn pool(&self, name: &str) -> Result<Pool> {
        validate_pool_name(name)?;
        if let Some(p) = lock(&self.inner.pools).get(name) {
            // A retired state (its pool deleted or re-created, found by a background sweep)
            // is never handed out again: read the spec afresh.
            if p.live().is_ok() {
                return Ok(Pool::new(self.inner.clone(), p.clone()));
            }
        }
        let read = self
            .inner
            .read_spec(name)
            .await?
            .ok_or_else(|| Error::PoolNotFound { pool: name.to_string() })?;
        Ok(Pool::new(self.inner.clone(), self.inner.open_state(read)))
    }

    /// Deletes a pool's spec. Refuses (`InvalidInput`) while the pool has any record (binding,
    /// reference or tombstone) unless `force`, which deletes the spec and every record in one txn.
    /// Returns false if there was no such pool. One round trip.
    pub async fn delete_pool(&self, name: &str, force: bool) -> Result<bool> {
        validate_pool_name(name)?;
        let inner = &self.inner;
        let l = &inner.layout;
        let spec_key = l.pool_spec_key(name);
        // The pool's own records: bindings, references, holder fence records. Only these go
        // with the pool; another deployment whose prefix is `P/data/<name>` keeps its records
        // under `P/data/<name>/pools/` and `…/data/`, never deleted: the txn
        // refuses while they exist.
        // The service's quota records (`quota/`) go with the pool too: they count its
        // references and name the slot that counts the pool.
        let own = [
            l.id_prefix(name),
            l.key_prefix(name),
            l.refs_prefix(name),
            l.holders_prefix(name),
            l.quota_prefix(name),
        ]
        .map(KeyRange::prefix);
        // The fence floor goes with the pool too: a bind of the old pool fails
        // its spec compare, so nothing relies on it any more.
        let nested = l.nested_in_pool_ranges(name);
        let count = |r: &KeyRange| TxnOp::get(GetRequest::new(r.clone()).count_only());
        // One txn either way, so a delete is atomic against binds: every bind compares the spec's
        // create revision, so a bind after the delete fails, and (without force) a bind committed
        // before it makes a compared range non-empty.
        let mut compares: Vec<Compare> = nested.iter().cloned().map(Compare::range_empty).collect();
        let mut counts: Vec<TxnOp> = nested.iter().map(count).collect();
        if !force {
            compares.extend(own[..3].iter().cloned().map(Compare::range_empty));
            counts.extend(own[..3].iter().map(count));
        }
        let txn = TxnRequest::new()
            .when(compares)
            .and_then([TxnOp::delete(spec_key.clone())])
            .and_then(own.iter().cloned().map(TxnOp::delete_range))
            .and_then([TxnOp::delete(l.fence_floor_key(name))])
            .or_else(counts);
        let resp = inner.req.txn(txn).await?;
        if !resp.succeeded {
            let count_at = |i: usize| match resp.responses.get(i) {
                Some(OpResponse::Get(g)) => g.count,
                _ => 0,
            };
            let foreign = count_at(0) + count_at(1);
            if foreign > 0 {
                let data = String::from_utf8_lossy(&l.pool_data_prefix(name)).into_owned();
                return Err(Error::invalid(
                    Input::PoolInUse,
                    "pool to delete",
                    name,
                    format!(
                        "{data} holds {foreign} records of another idalloc deployment (one whose \
                         prefix is {} lies inside this one's); refusing to delete them: move that \
                         deployment to a prefix outside {:?} first",
                        data.trim_end_matches('/'),
                        l.prefix()
                    ),
                ));
            }
            // Counted as users count them: a binding is one key record (its ID record and
            // references are part of it); an ID record without a key is a quarantined ID.
            let (ids, bound, refs) = (count_at(2), count_at(3), count_at(4));
            let quarantined = (ids - bound).max(0);
            let plural =
                |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            let mut held = plural(bound, "binding", "bindings");
            held.push_str(&format!(" ({})", plural(refs, "reference", "references")));
            if quarantined > 0 {
                held.push_str(&format!(
                    " and {}",
                    plural(quarantined, "quarantined ID", "quarantined IDs")
                ));
            }
            return Err(Error::invalid(
                Input::PoolInUse,
                "pool to delete",
                name,
                format!("the pool still has {held}; release them or delete with force"),
            ));
        }
        let removed = lock(&inner.pools).remove(name);
        if let Some(p) = removed {
            p.retire(Error::PoolNotFound { pool: name.to_string() });
        }
        Ok(matches!(resp.responses.first(), Some(OpResponse::Delete { deleted }) if *deleted > 0))
    }

    /// Contiv's `ReleaseID(pool, label)`: [`Pool::release_durable`] on pool `pool`, where a pool
    /// that does not exist is a no-op (`held == false`) rather than `PoolNotFound`: there is
    /// nothing to release in it.
    pub async fn release_durable(&self, pool: &str, key: &str, holder: &str) -> Result<Released> {
        validate_key(key)?;
        crate::pool::validate_durable_holder(holder)?;
        match self.pool(pool).await {
            Ok(p) => p.release_durable(key, holder).await,
            Err(Error::PoolNotFound { .. }) => Ok(Released { held: false, reclaimed: false }),
            Err(e) => Err(e),
        }
    }

    /// Every usable pool spec, sorted by name. Spec records that cannot be used (unreadable, or
    /// naming another pool than their record) are left out and logged; [`Allocator::pool_listing`]
    /// returns them too. One broken spec never hides the others.
    pub async fn list_pools(&self) -> Result<Vec<PoolSpec>> {
        let listing = self.pool_listing().await?;
        for p in &listing.broken {
            warn!(problem = %p, "pool spec record skipped");
        }
        Ok(listing.pools)
    }

    /// Every spec record under `P/pools/`, read at one revision: the usable specs sorted by name,
    /// and the records that cannot be used with the reason.
    pub async fn pool_listing(&self) -> Result<crate::records::PoolListing> {
        let inner = &self.inner;
        let range = KeyRange::prefix(inner.layout.pools_prefix());
        let (kvs, _) = inner.req.pages(&range, "of the pool specs").collect().await?;
        Ok(crate::records::parse_pool_listing(&inner.layout, &kvs))
    }

    /// Ends the session: revokes the lease so every leased reference of this process vanishes at
    /// once (the sweeper or the last release then reclaims), and stops background work. Durable
    /// references stay. Dropping the allocator without `close()` behaves like a crash instead.
    pub async fn close(self) -> Result<()> {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Release);
        for t in lock(&inner.tasks).drain(..) {
            t.abort();
        }
        let lease = inner.session.lock().await.lease.take();
        for p in lock(&inner.pools).values() {
            lock(&p.held).clear();
        }
        if let Some(lease) = lease {
            inner.req.call(|| inner.req.store.lease_revoke(lease)).await?;
        }
        Ok(())
    }
}
