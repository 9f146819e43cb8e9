//! The async driver: runs the protocol's decisions against a store, and owns everything a process
//! keeps between calls: local reference counts, the session lease and its keep-alive, one cache per
//! pool, and the repairs of DESIGN §7.
//!
//! Concurrency model: no store-side locks. Inside the process, one async mutex per key makes
//! concurrent acquires of the same key share one request (the first does the round trip, the others
//! then find it held and only count) and orders acquire against release of the same key. Background
//! tasks (keep-alive, per-pool sync, repairs, optional sweeper) hold only weak references, so dropping
//! every handle without `close()` behaves like a crash: the keep-alive stops and the lease runs out.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{broadcast, mpsc};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::cache::{Event, PoolCache};
use crate::error::{Error, Result};
use crate::layout::{IdRecord, Layout};
use crate::pool::{validate_holder, validate_key, validate_pool_name, PoolSpec, Strategy};
use crate::protocol::{
    self, decide, init_pool_outcome, BindOutcome, BindPlan, Decision, LastRelease, RefTarget,
    ReleasePlan,
};
use crate::remote::{self, Cluster, ClusterEvent, RemoteOptions, RemotePool, RemoteView};
use crate::store::{
    Compare, GetRequest, KeyRange, LeaseId, OpResponse, Revision, Store, StoreError, StoreResult,
    TxnOp, TxnRequest, TxnResponse,
};

/// Attempts of one bind loop before giving up with `Unavailable` (each attempt is one round trip and
/// only repeats because another writer changed the records in between).
const MAX_BIND_ATTEMPTS: usize = 64;

/// How store requests are retried when the store is unreachable or times out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per request, including the first (at least 1).
    pub max_attempts: u32,
    /// Wait before the second attempt; doubles each time up to `max_backoff`.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
        }
    }
}

/// How an [`Allocator`] is set up.
#[derive(Clone, Debug)]
pub struct AllocatorOptions {
    /// Root of every store key (DESIGN §4).
    pub prefix: String,
    /// This process's holder name, used for its leased references. Default: the host name plus a
    /// random suffix, so two processes on one host never share references.
    pub holder: Option<String>,
    /// TTL of the session lease; keep-alives go out every third of it.
    pub session_ttl: Duration,
    /// Bound on every single store request.
    pub request_timeout: Duration,
    pub retry: RetryPolicy,
    /// Seed for candidate choice; `None` seeds from the OS. A fixed seed makes a run reproducible.
    pub seed: Option<u64>,
    /// Keys per page when listing a pool.
    pub list_page: i64,
    /// Events buffered per subscriber before it is told it lagged.
    pub event_buffer: usize,
    /// Run a sweeper in the background for every pool this allocator opens, at this interval.
    pub sweep_interval: Option<Duration>,
}

impl Default for AllocatorOptions {
    fn default() -> Self {
        AllocatorOptions {
            prefix: "idalloc".into(),
            holder: None,
            session_ttl: Duration::from_secs(15),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            seed: None,
            list_page: 1000,
            event_buffer: 4096,
            sweep_interval: None,
        }
    }
}

/// The result of an acquire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub id: u64,
    /// True if this call created the binding (the key had no ID before).
    pub new: bool,
}

/// The result of a release. Releasing what is not held is not an error: `held` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The caller held the key (a local count for leased references; the reference record for
    /// durable ones). For a durable release, `false` can also mean that a request retried after
    /// its answer was lost found the reference already removed by its own first attempt.
    pub held: bool,
    /// This release removed the binding (it was the last reference and the pool has no idle grace).
    pub reclaimed: bool,
}

/// One binding as [`Pool::list`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub id: u64,
    pub key: String,
    /// Holders with a reference (leased or durable), sorted.
    pub holders: Vec<String>,
}

/// A key this process holds through its session.
#[derive(Clone, Copy, Debug)]
struct Held {
    id: u64,
    count: u64,
}

/// Per-pool state shared by the pool handles, the sync task and the repairs.
pub(crate) struct PoolState {
    pub(crate) spec: PoolSpec,
    cache: Mutex<PoolCache>,
    held: Mutex<HashMap<String, Held>>,
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    events: broadcast::Sender<Event>,
    /// Events of every cluster of the pool (local and remote views), tagged.
    mesh: broadcast::Sender<ClusterEvent>,
    /// Remote views of this pool by name (lock order: this map, then the cache, then each view).
    remotes: Mutex<std::collections::BTreeMap<String, Arc<RemoteView>>>,
    /// A listing has been applied to the cache (set under the cache lock): replays end with
    /// `Synced`.
    pub(crate) listed: AtomicBool,
    synced: tokio::sync::watch::Sender<bool>,
    /// The store revision the cache has applied (watch events and listings).
    applied: tokio::sync::watch::Sender<Revision>,
    /// Pages read by listings so far: `wait_synced` waits as long as this moves.
    pub(crate) list_progress: tokio::sync::watch::Sender<usize>,
    quarantine: tokio::sync::Mutex<Option<(LeaseId, Instant)>>,
    /// Asks the pool's follower to re-list (resync, pool deleted).
    pub(crate) relist: Arc<crate::feed::Relist>,
    pub(crate) idle_since: Mutex<HashMap<(String, i64), Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these short, non-async critical sections would be a bug in this
    // crate; the data is still consistent at every await-free step, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PoolState {
    pub(crate) fn lock_cache(&self) -> MutexGuard<'_, PoolCache> {
        lock(&self.cache)
    }

    /// Sends `e` to the pool's subscribers. Changes of the cache's bindings are emitted with the
    /// cache lock held, so that a new subscriber's replay and its live events never overlap or
    /// leave a gap.
    pub(crate) fn emit(&self, e: Event) {
        // No subscriber is fine; a full buffer drops the oldest and the subscriber sees `Lagged`.
        let _ = self.events.send(e.clone());
        let _ = self.mesh.send(ClusterEvent { cluster: Cluster::Local, event: e });
    }

    /// Publishes how far the cache has caught up with the store.
    pub(crate) fn note_applied(&self, revision: Revision) {
        self.applied.send_if_modified(|r| {
            let newer = revision > *r;
            if newer {
                *r = revision;
            }
            newer
        });
    }

    /// Marks the first listing done (the `Synced` event goes out with the listing's changes).
    pub(crate) fn mark_synced(&self) {
        self.synced.send_replace(true);
    }

    fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.key_locks).entry(key.to_string()).or_default().clone()
    }

    fn drop_key_lock(&self, key: &str, l: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = lock(&self.key_locks);
        // Two references: ours and the map's. Nobody else waits, so the entry can go.
        if Arc::strong_count(&l) == 2 {
            locks.remove(key);
        }
    }
}

/// What a repair task should do.
enum Repair {
    /// Re-reference every held key on the current session lease (after the lease was lost).
    All,
    /// Re-create the binding of one held key (its ID record vanished or went to another key).
    Key(Arc<PoolState>, String),
    /// Complete a release whose outcome was unknown.
    Release(Arc<PoolState>, String, u64),
}

/// On which lease a bind puts the holder's reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefLease {
    /// No lease: a durable reference.
    Durable,
    /// The allocator's own session lease (granted on first use, kept alive by the library).
    Session,
    /// A client session's lease (kept alive by its client; see [`crate::ClientSession`]).
    Client(LeaseId),
}

struct Session {
    lease: Option<LeaseId>,
    keepalive_started: bool,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) layout: Layout,
    pub(crate) opts: AllocatorOptions,
    holder: String,
    session: tokio::sync::Mutex<Session>,
    pools: Mutex<HashMap<String, Arc<PoolState>>>,
    rng: Mutex<StdRng>,
    tasks: Mutex<Vec<AbortHandle>>,
    repairs: mpsc::UnboundedSender<Repair>,
    closed: AtomicBool,
    /// The newest store revision this allocator has seen in a txn response: the fence of its binds.
    seen: std::sync::atomic::AtomicI64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
    }
}

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
    format!("{host}-{:08x}", rand::random::<u32>())
}

fn ttl_secs(d: Duration) -> i64 {
    // Lease TTLs are whole seconds; round up so a lease never lives shorter than asked.
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1) as i64
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
        validate_holder(&holder)?;
        crate::metrics::describe();
        let store: Arc<dyn Store> = Arc::new(crate::metrics::MeteredStore::new(store));
        if opts.session_ttl < Duration::from_secs(1) {
            return Err(Error::invalid(
                "session TTL",
                format!("{:?}", opts.session_ttl),
                "the session lease TTL is at least 1 s",
            ));
        }
        if opts.retry.max_attempts == 0 {
            return Err(Error::invalid("retry attempts", "0", "at least 1 attempt"));
        }
        let rng = match opts.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::seed_from_u64(rand::random()),
        };
        let (repairs, repair_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            store,
            layout,
            opts,
            holder,
            session: tokio::sync::Mutex::new(Session { lease: None, keepalive_started: false }),
            pools: Mutex::new(HashMap::new()),
            rng: Mutex::new(rng),
            tasks: Mutex::new(Vec::new()),
            repairs,
            closed: AtomicBool::new(false),
            seen: std::sync::atomic::AtomicI64::new(0),
        });
        let task = tokio::spawn(repair_loop(Arc::downgrade(&inner), repair_rx));
        lock(&inner.tasks).push(task.abort_handle());
        Ok(Allocator { inner })
    }

    /// A new client session with its own lease of `ttl` (whole seconds, at least 1 s), kept alive
    /// by its caller ([`crate::ClientSession::keep_alive`]), not by this allocator: the session
    /// of a remote client (`idalloc serve`) that must lose its references when the client stops
    /// renewing, exactly as a crashed process does (G4). One round trip.
    pub async fn client_session(&self, ttl: Duration) -> Result<crate::ClientSession> {
        crate::client_session::open(&self.inner, ttl).await
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
        let spec = self.inner.init_pool(spec).await?;
        Ok(self.inner.open_state(spec))
    }

    /// A handle on an existing pool; `PoolNotFound` if there is none. Starts the pool's cache.
    pub async fn pool(&self, name: &str) -> Result<Pool> {
        validate_pool_name(name)?;
        if let Some(p) = lock(&self.inner.pools).get(name) {
            return Ok(Pool { inner: self.inner.clone(), state: p.clone() });
        }
        let spec = self
            .inner
            .read_spec(name)
            .await?
            .ok_or_else(|| Error::PoolNotFound { pool: name.to_string() })?;
        Ok(self.inner.open_state(spec))
    }

    /// Deletes a pool's spec. Refuses (`InvalidInput`) while the pool has any record (binding,
    /// reference or tombstone) unless `force`, which deletes the spec and every record in one txn.
    /// Returns false if there was no such pool. One round trip.
    pub async fn delete_pool(&self, name: &str, force: bool) -> Result<bool> {
        validate_pool_name(name)?;
        let inner = &self.inner;
        let spec_key = inner.layout.pool_spec_key(name);
        let data = KeyRange::prefix(inner.layout.pool_data_prefix(name));
        let mut txn = TxnRequest::new().and_then([TxnOp::delete(spec_key.clone())]);
        if force {
            txn = txn.and_then([TxnOp::delete_range(data)]);
        } else {
            txn = txn
                .when([Compare::range_empty(data.clone())])
                .or_else([TxnOp::get(GetRequest::new(data).count_only())]);
        }
        let resp = inner.txn(txn).await?;
        if !resp.succeeded {
            let records = match resp.responses.first() {
                Some(OpResponse::Get(g)) => g.count,
                _ => 0,
            };
            return Err(Error::invalid(
                "pool to delete",
                name,
                format!("the pool still has {records} records (bindings, references, tombstones); release them or delete with force"),
            ));
        }
        if let Some(p) = lock(&inner.pools).remove(name) {
            p.relist.interrupt();
        }
        Ok(matches!(resp.responses.first(), Some(OpResponse::Delete { deleted }) if *deleted > 0))
    }

    /// Contiv's `ReleaseID(pool, label)`: [`Pool::release_durable`] on pool `pool`, where a pool
    /// that does not exist is a no-op (`held == false`) rather than `PoolNotFound`: there is
    /// nothing to release in it.
    pub async fn release_durable(&self, pool: &str, key: &str, holder: &str) -> Result<Released> {
        validate_key(key)?;
        validate_holder(holder)?;
        match self.pool(pool).await {
            Ok(p) => p.release_durable(key, holder).await,
            Err(Error::PoolNotFound { .. }) => Ok(Released { held: false, reclaimed: false }),
            Err(e) => Err(e),
        }
    }

    /// Every usable pool spec, sorted by name. Spec records that cannot be used (unreadable, or
    /// naming another pool than their record) are left out and logged; [`Allocator::pool_listing`]
    /// returns them too. One broken spec never hides the others (issue 9, item 8).
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
        let (kvs, _) = inner
            .call(|| crate::store::list_all(&*inner.store, &range, inner.opts.list_page))
            .await?;
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
            inner.call(|| inner.store.lease_revoke(lease)).await?;
        }
        Ok(())
    }
}

impl Inner {
    /// Publishes the pool's gauges (bindings, free IDs, capacity, cache lag) from its cache.
    pub(crate) fn publish_gauges(&self, pool: &PoolState) {
        let (bindings, free, applied) = {
            let mut c = pool.lock_cache();
            (c.len(), c.free_ids().free_count(), c.revision())
        };
        let lag = self.seen.load(Ordering::Acquire) - applied;
        crate::metrics::pool_gauges(pool.spec.name(), bindings, free, pool.spec.capacity(), lag);
    }

    /// The store and the bounded-retry request helper, for [`crate::ClientSession`].
    pub(crate) async fn lease_call<T, F, Fut>(&self, f: F) -> StoreResult<T>
    where
        F: Fn(Arc<dyn Store>) -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        self.call(|| f(self.store.clone())).await
    }

    /// This allocator's holder name.
    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    /// One attempt of a store request, bounded by the request timeout (a timeout is `Unavailable`).
    async fn bounded<T>(&self, request: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        match tokio::time::timeout(self.opts.request_timeout, request).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.opts.request_timeout
            ))),
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
        let mut backoff = self.opts.retry.initial_backoff;
        let mut attempt = 1;
        loop {
            let result = self.bounded(f()).await;
            match result {
                Err(e) if e.is_retryable() && attempt < self.opts.retry.max_attempts => {
                    warn!(attempt, error = %e, "store request failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.opts.retry.max_backoff);
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn txn(&self, req: TxnRequest) -> StoreResult<TxnResponse> {
        let resp = self.call(|| self.store.txn(req.clone())).await?;
        self.seen.fetch_max(resp.revision, Ordering::AcqRel);
        Ok(resp)
    }

    /// The fence for a bind of `pool` sent now: the newest revision seen in a response or applied
    /// by the pool's cache (both happened before this send).
    fn fence(&self, pool: &PoolState) -> Revision {
        self.seen.load(Ordering::Acquire).max(*pool.applied.borrow())
    }

    /// The spec of pool `name`, `None` if it has none. A spec record that cannot be used
    /// (unreadable, or holding another pool's spec: issue 9, item 7) is an error naming the
    /// record, never trusted.
    async fn read_spec(&self, name: &str) -> Result<Option<PoolSpec>> {
        let key = self.layout.pool_spec_key(name);
        let resp = self.call(|| self.store.get(GetRequest::key(key.clone()))).await?;
        match resp.kvs.first() {
            None => Ok(None),
            Some(kv) => crate::records::parse_spec(&self.layout, kv)
                .map(Some)
                .map_err(|p| Error::Unavailable { reason: format!("(not retryable) {p}") }),
        }
    }

    async fn init_pool(&self, spec: &PoolSpec) -> Result<PoolSpec> {
        spec.validate()?;
        let json = spec.to_json();
        let resp = self.txn(protocol::init_pool_txn(&self.layout, spec.name(), json)).await?;
        match init_pool_outcome(&resp).map_err(protocol_error)? {
            None => {
                info!(pool = %spec.name(), spec = %spec, "pool created");
                Ok(spec.clone())
            }
            Some(existing) => {
                let existing = PoolSpec::from_json(&existing).map_err(|e| Error::Unavailable {
                    reason: format!("pool spec of {:?} is unreadable: {e}", spec.name()),
                })?;
                if existing == *spec {
                    Ok(existing)
                } else {
                    Err(Error::RangeMismatch {
                        pool: spec.name().to_string(),
                        existing: Box::new(existing),
                        requested: Box::new(spec.clone()),
                    })
                }
            }
        }
    }

    fn open_state(self: &Arc<Self>, spec: PoolSpec) -> Pool {
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get(spec.name()) {
            return Pool { inner: self.clone(), state: p.clone() };
        }
        let (events, _) = broadcast::channel(self.opts.event_buffer.max(1));
        let (mesh, _) = broadcast::channel(self.opts.event_buffer.max(1));
        let (synced, _) = tokio::sync::watch::channel(false);
        let (applied, _) = tokio::sync::watch::channel(0);
        let (list_progress, _) = tokio::sync::watch::channel(0);
        let state = Arc::new(PoolState {
            cache: Mutex::new(PoolCache::new(spec.clone())),
            spec,
            held: Mutex::new(HashMap::new()),
            key_locks: Mutex::new(HashMap::new()),
            events,
            mesh,
            remotes: Mutex::new(std::collections::BTreeMap::new()),
            listed: AtomicBool::new(false),
            synced,
            applied,
            list_progress,
            quarantine: tokio::sync::Mutex::new(None),
            relist: Arc::default(),
            idle_since: Mutex::new(HashMap::new()),
        });
        pools.insert(state.spec.name().to_string(), state.clone());
        drop(pools);
        let task = tokio::spawn(crate::sync::run(Arc::downgrade(self), state.clone()));
        lock(&self.tasks).push(task.abort_handle());
        if let Some(interval) = self.opts.sweep_interval {
            let task =
                tokio::spawn(crate::sweeper::run(Arc::downgrade(self), state.clone(), interval));
            lock(&self.tasks).push(task.abort_handle());
        }
        Pool { inner: self.clone(), state }
    }

    /// The session lease, granted (and its keep-alive started) on first use.
    async fn session_lease(self: &Arc<Self>) -> Result<LeaseId> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Unavailable { reason: "the allocator is closed".into() });
        }
        let mut s = self.session.lock().await;
        if let Some(l) = s.lease {
            return Ok(l);
        }
        let ttl = ttl_secs(self.opts.session_ttl);
        let lease = self.call(|| self.store.lease_grant(ttl)).await?;
        info!(holder = %self.holder, lease = lease.id, ttl = lease.ttl, "session lease granted");
        s.lease = Some(lease.id);
        if !s.keepalive_started {
            s.keepalive_started = true;
            let task = tokio::spawn(keepalive_loop(Arc::downgrade(self)));
            lock(&self.tasks).push(task.abort_handle());
        }
        Ok(lease.id)
    }

    /// Forgets a lost session lease (once, whoever notices first) and schedules the re-referencing
    /// of every held key on a new one.
    async fn session_lost(&self, lost: LeaseId) {
        let mut s = self.session.lock().await;
        if s.lease == Some(lost) {
            warn!(holder = %self.holder, lease = lost, "session lease lost; re-referencing held keys on a new lease");
            crate::metrics::session_lost(crate::metrics::SessionKind::Process);
            s.lease = None;
            let _ = self.repairs.send(Repair::All);
        }
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
        let ttl = ttl_secs(delay + bucket + self.opts.request_timeout);
        let lease = self.call(|| self.store.lease_grant(ttl)).await?;
        *q = Some((lease.id, now + bucket));
        Ok(Some(lease.id))
    }

    /// Runs the bind loop for `key` until it is bound (with `holder`'s reference, if given).
    /// `preferred` is the ID to keep if at all possible (repairs). Returns the ID and whether this
    /// call created the binding.
    async fn bind(
        self: &Arc<Self>,
        pool: &PoolState,
        key: &str,
        holder: Option<&str>,
        leased: RefLease,
        preferred: Option<u64>,
    ) -> Result<Acquired> {
        self.wait_synced(pool).await?;
        let name = pool.spec.name();
        let mut key_rec = pool.lock_cache().get(key);
        // Whether `key_rec` comes from the store (a failed attempt's read-back or a direct read)
        // rather than from the cache, which may not have seen the key's binding yet.
        let mut key_rec_read = false;
        let mut observed: HashMap<u64, Option<IdRecord>> = HashMap::new();
        // Candidates that turned out taken: spreads `lowest` picks after collisions.
        let mut lost = 0u32;
        for attempt in 0..MAX_BIND_ATTEMPTS {
            let decision = {
                let cache = pool.lock_cache();
                decide(
                    key,
                    key_rec,
                    |id| match observed.get(&id) {
                        Some(rec) => Some(rec.clone()),
                        // The cache may lag behind the store (a broken watch, a partition): it
                        // may still show an ID under a key it no longer belongs to. Only a record
                        // read from the store may prove that an ID belongs to another key (which
                        // moves this key to a fresh ID); an unverified "not ours" counts as
                        // unknown, so the next txn compares on it and reads it back.
                        None => match cache.record(id) {
                            Some(rec) if rec.key() == key => Some(Some(rec)),
                            _ => None,
                        },
                    },
                    preferred,
                )
            };
            let (plan, claimed) = match decision {
                Decision::Send(plan) => (plan, false),
                Decision::NeedCandidate { expect_key, moved_from } => {
                    match self.pick_candidate(pool, lost) {
                        Ok(id) => (BindPlan { expect_key, id, expect_id: None, moved_from }, true),
                        Err(exhausted) if key_rec_read => return Err(exhausted),
                        Err(exhausted) => {
                            // A full pool is only final once the store confirms the key has no
                            // binding yet (the cache may lag behind another node's bind of it).
                            key_rec = self.read_key_record(pool, key).await?;
                            key_rec_read = true;
                            if key_rec.is_none() && preferred.is_none() {
                                return Err(exhausted);
                            }
                            continue;
                        }
                    }
                }
            };
            let lease = match leased {
                RefLease::Durable => 0,
                RefLease::Session => self.session_lease().await?,
                RefLease::Client(l) => l,
            };
            let target = holder.map(|h| RefTarget { holder: h, lease });
            let req = plan.txn_fenced(&self.layout, name, key, target, Some(self.fence(pool)));
            let resp = match self.txn(req).await {
                Ok(r) => r,
                Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Client(l) => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    return Err(crate::client_session::lease_gone(l));
                }
                Err(StoreError::LeaseNotFound(l)) if leased == RefLease::Session => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    self.session_lost(l).await;
                    continue;
                }
                Err(e) => {
                    if claimed {
                        pool.lock_cache().learn(plan.id, false);
                    }
                    return Err(e.into());
                }
            };
            match plan.outcome(&resp).map_err(protocol_error)? {
                BindOutcome::Bound { id, .. } => {
                    pool.lock_cache().learn(id, true);
                    debug!(pool = %name, key, id, attempt, "bound");
                    return Ok(Acquired { id, new: plan.creates_binding() });
                }
                BindOutcome::Observed(obs) => {
                    debug!(pool = %name, key, ?obs, attempt, "bind compare failed; deciding again");
                    pool.lock_cache().learn(obs.id, obs.id_rec.is_some());
                    if claimed && obs.id_rec.is_some() {
                        lost += 1;
                    }
                    // Let the cache catch up with what the failed attempt saw before choosing
                    // again: a collision usually means others are binding too, and the watch
                    // teaches all their IDs at once where the read-back teaches one.
                    self.wait_applied(pool, obs.records_revision).await;
                    observed.insert(obs.id, obs.id_rec);
                    if let Some((from, rec)) = obs.moved_from {
                        observed.insert(from, rec);
                    }
                    key_rec = obs.key_rec;
                    key_rec_read = true;
                }
            }
        }
        warn!(pool = %name, key, "gave up binding after {MAX_BIND_ATTEMPTS} contended attempts");
        Err(Error::Unavailable {
            reason: format!(
                "key {key:?} in pool {name:?} stayed contended for {MAX_BIND_ATTEMPTS} attempts"
            ),
        })
    }

    async fn read_key_record(&self, pool: &PoolState, key: &str) -> Result<Option<u64>> {
        let k = self.layout.key_key(pool.spec.name(), key);
        let resp = self.call(|| self.store.get(GetRequest::key(k.clone()))).await?;
        match resp.kvs.first() {
            None => Ok(None),
            Some(kv) => {
                protocol::parse_id_value(&kv.value).map(Some).ok_or_else(|| Error::Unavailable {
                    reason: format!(
                        "key record of {key:?} holds {:?}, not an ID",
                        String::from_utf8_lossy(&kv.value)
                    ),
                })
            }
        }
    }

    /// Waits (briefly, bounded) until the pool's cache has applied `revision`.
    async fn wait_applied(&self, pool: &PoolState, revision: Revision) {
        if revision == 0 {
            return;
        }
        let mut rx = pool.applied.subscribe();
        let bound = self.opts.request_timeout.min(Duration::from_millis(500));
        let _ =
            tokio::time::timeout(bound, async { rx.wait_for(|r| *r >= revision).await.is_ok() })
                .await;
    }

    /// Picks a free ID and marks it used locally, so concurrent binds in this process do not race
    /// for the same candidate. After `lost` collisions, `lowest` picks among the lowest
    /// `2^lost` (at most 64) free IDs instead of always the lowest, so nodes that keep choosing the
    /// same ID spread out.
    fn pick_candidate(&self, pool: &PoolState, lost: u32) -> Result<u64> {
        let mut cache = pool.lock_cache();
        let raw = {
            let mut rng = lock(&self.rng);
            let free = cache.free_ids();
            match pool.spec.strategy_kind() {
                Strategy::Lowest if lost > 0 => {
                    let spread = (1u64 << lost.min(6)).min(free.free_count());
                    if spread == 0 {
                        None
                    } else {
                        free.nth_free(rng.random_range(0..spread))
                    }
                }
                strategy => free.pick(strategy, &mut *rng),
            }
        };
        match raw {
            Some(raw) => {
                cache.free_ids().insert(raw);
                Ok(pool.spec.apply_prefix(raw))
            }
            None => Err(Error::Exhausted {
                pool: pool.spec.name().to_string(),
                min: pool.spec.min(),
                max: pool.spec.max(),
                capacity: pool.spec.capacity(),
            }),
        }
    }

    /// Waits until the pool's cache holds the whole pool. A large pool takes many pages to list;
    /// the wait gives up only when no page has arrived for a whole request budget (timeout ×
    /// attempts), not after a fixed total.
    async fn wait_synced(&self, pool: &PoolState) -> Result<()> {
        let mut synced = pool.synced.subscribe();
        let mut progress = pool.list_progress.subscribe();
        let bound = self.opts.request_timeout * self.opts.retry.max_attempts;
        loop {
            if *synced.borrow_and_update() {
                return Ok(());
            }
            let moved = tokio::time::timeout(bound, async {
                tokio::select! {
                    biased;
                    r = synced.changed() => r.is_ok(),
                    r = progress.changed() => r.is_ok(),
                }
            })
            .await;
            if !matches!(moved, Ok(true)) {
                return Err(Error::Unavailable {
                    reason: format!(
                        "pool {:?} could not be listed from the store: no progress within {bound:?}",
                        pool.spec.name()
                    ),
                });
            }
        }
    }

    /// Sends a release txn for `holder`'s reference, retrying with a new quarantine lease if the
    /// old one has run out.
    async fn release_ref(
        &self,
        pool: &PoolState,
        key: &str,
        id: u64,
        holder: &str,
        durable: bool,
    ) -> Result<Released> {
        let reclaim = pool.spec.idle_grace_duration().is_zero();
        let (mut id, mut require_own_ref) = (id, durable);
        let mut held: Option<bool> = None;
        loop {
            let plan = |tombstone_lease| ReleasePlan {
                key,
                id,
                holder,
                last: if reclaim {
                    LastRelease::Reclaim { tombstone_lease }
                } else {
                    LastRelease::Touch
                },
                require_own_ref,
            };
            let resp = self
                .txn_with_quarantine(pool, reclaim, |lease| {
                    plan(lease).txn(&self.layout, pool.spec.name())
                })
                .await?;
            let out = plan(None).outcome(&resp).map_err(protocol_error)?;
            let first = held.is_none();
            let had_ref = *held.get_or_insert(out.had_ref);
            if out.reclaimed {
                debug!(pool = %pool.spec.name(), key, id, "last reference released; binding reclaimed");
            }
            match out.key_now {
                // The ID came from a cache that had not seen the key rebound: the reference is
                // gone, but the last-holder check ran against the wrong ID. Finish on the real one
                // (found by the chaos test's review: a durable release could leak the binding).
                Some(now) if first && had_ref && !resp.succeeded && now != id => {
                    debug!(pool = %pool.spec.name(), key, stale_id = id, id = now, "released with a stale ID; finishing on the key's real ID");
                    id = now;
                    require_own_ref = false;
                }
                _ => return Ok(Released { held: had_ref, reclaimed: out.reclaimed }),
            }
        }
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
        let mut backoff = self.opts.retry.initial_backoff;
        let mut attempt = 1;
        loop {
            let lease = if tombstones { self.quarantine_lease(pool).await? } else { None };
            let req = build(lease);
            let result = self.bounded(self.store.txn(req)).await;
            match result {
                Ok(resp) => {
                    self.seen.fetch_max(resp.revision, Ordering::AcqRel);
                    return Ok(resp);
                }
                Err(StoreError::LeaseNotFound(l)) if lease == Some(l) => {
                    let mut q = pool.quarantine.lock().await;
                    if matches!(*q, Some((ql, _)) if ql == l) {
                        *q = None;
                    }
                }
                Err(e) if e.is_retryable() && attempt < self.opts.retry.max_attempts => {
                    warn!(attempt, error = %e, "store request failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.opts.retry.max_backoff);
                }
                Err(e) => return Err(e.into()),
            }
            attempt += 1;
            if attempt > self.opts.retry.max_attempts + 2 {
                return Err(Error::Unavailable {
                    reason: format!("pool {:?}: quarantine lease kept vanishing", pool.spec.name()),
                });
            }
        }
    }

    /// Finishes a release whose outcome was unknown (the store did not answer): sends it again
    /// unless the process holds the key again meanwhile. The release txn is idempotent: if the
    /// first one took effect, this one only finds nothing to do.
    async fn finish_release(
        self: &Arc<Self>,
        pool: &Arc<PoolState>,
        key: &str,
        id: u64,
    ) -> Result<()> {
        let l = pool.key_lock(key);
        let result = {
            let _g = l.lock().await;
            if lock(&pool.held).contains_key(key) {
                Ok(())
            } else {
                let holder = self.holder.clone();
                self.release_ref(pool, key, id, &holder, false).await.map(|_| ())
            }
        };
        pool.drop_key_lock(key, l);
        result
    }

    /// Called by the sync task for every cache event: a held key whose ID record vanished or went
    /// to another key gets repaired (Cilium's master-key protection, DESIGN §7).
    pub(crate) fn after_cache_event(
        &self,
        pool: &Arc<PoolState>,
        event: &Event,
        before: Option<(u64, String)>,
    ) {
        let affected = match event {
            Event::Delete { id, key } => Some((*id, key.clone())),
            Event::Upsert { id, key } => before.filter(|(_, k)| k != key).map(|(_, k)| (*id, k)),
            _ => None,
        };
        if let Some((id, key)) = affected {
            let held = lock(&pool.held).get(&key).map(|h| h.id);
            if held == Some(id) {
                warn!(pool = %pool.spec.name(), key, id, "the ID record of a held key vanished; re-creating it");
                let _ = self.repairs.send(Repair::Key(pool.clone(), key));
            }
        }
    }

    /// After a re-list: repairs every held key the cache no longer shows with its ID.
    pub(crate) fn check_held(&self, pool: &Arc<PoolState>) {
        let mut held: Vec<(String, u64)> =
            lock(&pool.held).iter().map(|(k, h)| (k.clone(), h.id)).collect();
        held.sort(); // fixed repair order (reproducible simulations)
        let cache = pool.lock_cache();
        for (key, id) in held {
            if cache.get(&key) != Some(id) {
                let _ = self.repairs.send(Repair::Key(pool.clone(), key));
            }
        }
    }

    /// Re-references (and if needed re-creates) one held key with its ID; emits `Conflict` if the
    /// ID had to change.
    async fn repair_key(self: &Arc<Self>, pool: &Arc<PoolState>, key: &str) -> Result<()> {
        let l = pool.key_lock(key);
        let result = {
            let _g = l.lock().await;
            let old = lock(&pool.held).get(key).map(|h| h.id);
            match old {
                None => Ok(()),
                Some(old) => self.rebind_held(pool, key, old).await,
            }
        };
        pool.drop_key_lock(key, l);
        result
    }

    async fn rebind_held(
        self: &Arc<Self>,
        pool: &Arc<PoolState>,
        key: &str,
        old: u64,
    ) -> Result<()> {
        let holder = self.holder.clone();
        let a = self.bind(pool, key, Some(&holder), RefLease::Session, Some(old)).await?;
        if let Some(h) = lock(&pool.held).get_mut(key) {
            h.id = a.id;
        }
        if a.id != old {
            warn!(pool = %pool.spec.name(), key, old_id = old, new_id = a.id, "held key lost its ID to another key; rebound");
            crate::metrics::conflict(pool.spec.name());
            pool.emit(Event::Conflict { key: key.to_string(), old_id: old, new_id: a.id });
        } else {
            info!(pool = %pool.spec.name(), key, id = old, "held key re-referenced with its ID");
        }
        Ok(())
    }
}

fn protocol_error(e: protocol::ProtocolError) -> Error {
    Error::Unavailable { reason: e.to_string() }
}

/// Renews the session lease every TTL/3. A lease the store says is gone, or one not renewed for a
/// whole TTL (the store will have expired it), is replaced and every held key re-referenced.
async fn keepalive_loop(inner: Weak<Inner>) {
    let (period, ttl) = match inner.upgrade() {
        Some(i) => (i.opts.session_ttl / 3, i.opts.session_ttl),
        None => return,
    };
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else { return };
        let Some(lease) = inner.session.lock().await.lease else {
            last_ok = Instant::now();
            continue;
        };
        let result =
            tokio::time::timeout(inner.opts.request_timeout, inner.store.lease_keep_alive(lease))
                .await;
        match result {
            Ok(Ok(Some(_))) => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, Some(true));
                last_ok = Instant::now()
            }
            Ok(Ok(None)) => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, Some(false));
                inner.session_lost(lease).await;
                last_ok = Instant::now();
            }
            Ok(Err(e)) if !e.is_retryable() => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, Some(false));
                warn!(lease, error = %e, "keep-alive rejected; treating the lease as lost");
                inner.session_lost(lease).await;
                last_ok = Instant::now();
            }
            other => {
                crate::metrics::renewal(crate::metrics::SessionKind::Process, None);
                let why = match other {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                warn!(lease, error = %why, "keep-alive failed");
                if last_ok.elapsed() >= ttl {
                    inner.session_lost(lease).await;
                    last_ok = Instant::now();
                }
            }
        }
    }
}

/// Runs repairs one at a time; a repair that fails (store unreachable) is retried with back-off.
async fn repair_loop(inner: Weak<Inner>, mut rx: mpsc::UnboundedReceiver<Repair>) {
    let mut backoff = Duration::from_millis(100);
    while let Some(job) = rx.recv().await {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if let Repair::Release(p, k, id) = job {
            if let Err(e) = strong.finish_release(&p, &k, id).await {
                warn!(pool = %p.spec.name(), key = %k, error = %e, "completing a release failed; will retry");
                let _ = strong.repairs.send(Repair::Release(p, k, id));
                drop(strong);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            continue;
        }
        let jobs: Vec<(Arc<PoolState>, String)> = match job {
            Repair::Release(..) => Vec::new(),
            Repair::Key(p, k) => vec![(p, k)],
            Repair::All => {
                let mut all: Vec<(Arc<PoolState>, String)> = lock(&strong.pools)
                    .values()
                    .flat_map(|p| {
                        lock(&p.held).keys().map(|k| (p.clone(), k.clone())).collect::<Vec<_>>()
                    })
                    .collect();
                // Hash maps iterate in a per-process random order; repairs run in a fixed one so
                // that a simulation seed replays the same history.
                all.sort_by(|a, b| (a.0.spec.name(), &a.1).cmp(&(b.0.spec.name(), &b.1)));
                all
            }
        };
        let mut failed = false;
        for (p, k) in &jobs {
            if let Err(e) = strong.repair_key(p, k).await {
                warn!(pool = %p.spec.name(), key = %k, error = %e, "repair failed; will retry");
                let _ = strong.repairs.send(Repair::Key(p.clone(), k.clone()));
                failed = true;
            }
        }
        drop(strong);
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

/// A handle on one pool of an [`Allocator`]. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
    state: Arc<PoolState>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("spec", &self.state.spec).finish()
    }
}

impl Pool {
    /// The pool's spec.
    pub fn spec(&self) -> &PoolSpec {
        &self.state.spec
    }

    /// The ID of `key`, with a reference of this process on its session lease (refcounted: each
    /// acquire needs one release). Round trips: 0 if this process already holds the key, else 1
    /// when uncontended (DESIGN §5).
    pub async fn acquire(&self, key: &str) -> Result<Acquired> {
        crate::metrics::timed(self.spec().name(), "acquire", self.acquire_untimed(key)).await
    }

    async fn acquire_untimed(&self, key: &str) -> Result<Acquired> {
        validate_key(key)?;
        if let Some(a) = self.count_up(key) {
            return Ok(a);
        }
        let l = self.state.key_lock(key);
        let result = {
            let _g = l.lock().await;
            match self.count_up(key) {
                Some(a) => Ok(a),
                None => {
                    let holder = self.inner.holder.clone();
                    let r = self
                        .inner
                        .bind(&self.state, key, Some(&holder), RefLease::Session, None)
                        .await;
                    if let Ok(a) = &r {
                        lock(&self.state.held).insert(key.to_string(), Held { id: a.id, count: 1 });
                    }
                    r
                }
            }
        };
        self.state.drop_key_lock(key, l);
        result
    }

    fn count_up(&self, key: &str) -> Option<Acquired> {
        let mut held = lock(&self.state.held);
        let h = held.get_mut(key)?;
        h.count += 1;
        Some(Acquired { id: h.id, new: false })
    }

    /// The ID of `key` with a durable reference of `holder`: not on any lease, it stays until
    /// `release_durable(key, holder)` (Contiv's owner semantics; what the CLI uses). Idempotent per
    /// holder. One round trip when uncontended.
    pub async fn acquire_durable(&self, key: &str, holder: &str) -> Result<Acquired> {
        let f = self.acquire_durable_untimed(key, holder);
        crate::metrics::timed(self.spec().name(), "acquire_durable", f).await
    }

    async fn acquire_durable_untimed(&self, key: &str, holder: &str) -> Result<Acquired> {
        validate_key(key)?;
        validate_holder(holder)?;
        let l = self.state.key_lock(key);
        let result = {
            let _g = l.lock().await;
            self.inner.bind(&self.state, key, Some(holder), RefLease::Durable, None).await
        };
        self.state.drop_key_lock(key, l);
        result
    }

    /// The ID of `key` with `holder`'s reference on `lease` (a client session's: see
    /// [`crate::ClientSession::acquire`]). Idempotent per holder, like a durable reference.
    pub(crate) async fn acquire_on_lease(
        &self,
        key: &str,
        holder: &str,
        lease: LeaseId,
    ) -> Result<Acquired> {
        validate_key(key)?;
        let l = self.state.key_lock(key);
        let result = {
            let _g = l.lock().await;
            self.inner.bind(&self.state, key, Some(holder), RefLease::Client(lease), None).await
        };
        self.state.drop_key_lock(key, l);
        result
    }

    /// Drops one local use of `key`. The last local use removes this process's reference (one
    /// round trip) and, if it was the last reference and the pool has no idle grace, the binding in
    /// the same txn. Releasing a key this process does not hold is a no-op (`held == false`).
    pub async fn release(&self, key: &str) -> Result<Released> {
        let r =
            crate::metrics::timed(self.spec().name(), "release", self.release_untimed(key)).await;
        self.count_reclaim(&r);
        r
    }

    fn count_reclaim(&self, r: &Result<Released>) {
        if matches!(r, Ok(Released { reclaimed: true, .. })) {
            crate::metrics::reclaimed(self.spec().name(), "release", 1);
        }
    }

    async fn release_untimed(&self, key: &str) -> Result<Released> {
        validate_key(key)?;
        let l = self.state.key_lock(key);
        let result = {
            let _g = l.lock().await;
            let last_id = {
                let mut held = lock(&self.state.held);
                match held.get_mut(key) {
                    None => Err(false),
                    Some(h) if h.count > 1 => {
                        h.count -= 1;
                        Err(true)
                    }
                    Some(h) => {
                        let id = h.id;
                        held.remove(key);
                        Ok(id)
                    }
                }
            };
            match last_id {
                Err(held) => Ok(Released { held, reclaimed: false }),
                Ok(id) => {
                    let holder = self.inner.holder.clone();
                    match self.inner.release_ref(&self.state, key, id, &holder, false).await {
                        Ok(r) => Ok(Released { held: true, reclaimed: r.reclaimed }),
                        Err(Error::Unavailable { reason }) => {
                            // The store may or may not have applied the release. Restoring the
                            // local hold could claim a key whose reference is gone (and whose
                            // ID another key may take); keeping nothing could leak the
                            // reference. So the key stays released here and the release is
                            // completed in the background, idempotently.
                            warn!(pool = %self.state.spec.name(), key, id, %reason, "release outcome unknown; completing it in the background");
                            let _ = self.inner.repairs.send(Repair::Release(
                                self.state.clone(),
                                key.to_string(),
                                id,
                            ));
                            Err(Error::Unavailable {
                                reason: format!(
                                    "{reason}; the release is completed in the background"
                                ),
                            })
                        }
                        Err(e) => {
                            // Rejected, so not applied: nothing changed, the caller may retry.
                            lock(&self.state.held).insert(key.to_string(), Held { id, count: 1 });
                            Err(e)
                        }
                    }
                }
            }
        };
        self.state.drop_key_lock(key, l);
        result
    }

    /// Removes `holder`'s durable reference to `key`; reclaims the binding if it was the last
    /// reference and the pool has no idle grace. A no-op (`held == false`) if `holder` held nothing.
    pub async fn release_durable(&self, key: &str, holder: &str) -> Result<Released> {
        let f = self.release_durable_untimed(key, holder);
        let r = crate::metrics::timed(self.spec().name(), "release_durable", f).await;
        self.count_reclaim(&r);
        r
    }

    async fn release_durable_untimed(&self, key: &str, holder: &str) -> Result<Released> {
        validate_key(key)?;
        validate_holder(holder)?;
        let l = self.state.key_lock(key);
        let result = async {
            let _g = l.lock().await;
            let id = match self.inner.wait_synced(&self.state).await.ok().and_then(|_| self.get(key)) {
                Some(id) => Some(id),
                None => self.get_consistent(key).await?,
            };
            match id {
                Some(id) => self.inner.release_ref(&self.state, key, id, holder, true).await,
                None => {
                    // No binding: at most a stray reference is left; remove it.
                    let own = self.inner.layout.ref_key(self.state.spec.name(), key, holder);
                    let resp = self.inner.txn(TxnRequest::new().and_then([TxnOp::delete(own)])).await?;
                    let held = matches!(resp.responses.first(), Some(OpResponse::Delete { deleted }) if *deleted > 0);
                    Ok(Released { held, reclaimed: false })
                }
            }
        }
        .await;
        self.state.drop_key_lock(key, l);
        result
    }

    /// The ID bound to `key`, from the cache (no round trip; this process's own keys are seen at
    /// once, other nodes' as soon as the watch delivers them).
    pub fn get(&self, key: &str) -> Option<u64> {
        if let Some(h) = lock(&self.state.held).get(key) {
            return Some(h.id);
        }
        self.state.lock_cache().get(key)
    }

    /// The key bound to `id`, from the cache (no round trip).
    pub fn key_of(&self, id: u64) -> Option<String> {
        self.state.lock_cache().key_of(id).map(str::to_string)
    }

    /// [`Pool::get`] read from the store (one round trip).
    pub async fn get_consistent(&self, key: &str) -> Result<Option<u64>> {
        validate_key(key)?;
        self.inner.read_key_record(&self.state, key).await
    }

    /// [`Pool::key_of`] read from the store (one round trip).
    pub async fn key_of_consistent(&self, id: u64) -> Result<Option<String>> {
        let k = self.inner.layout.id_key(self.state.spec.name(), id);
        let resp = self.inner.call(|| self.inner.store.get(GetRequest::key(k.clone()))).await?;
        Ok(resp.kvs.first().and_then(|kv| match IdRecord::decode(&kv.value) {
            Some(IdRecord::Bound(key)) => Some(key),
            _ => None,
        }))
    }

    /// Every binding with its holders, read from the store at one revision (one round trip per
    /// page), sorted by ID. Tombstones are not bindings and are left out.
    pub async fn list(&self) -> Result<Vec<Binding>> {
        let inner = &self.inner;
        let name = self.state.spec.name();
        let range = KeyRange::prefix(inner.layout.pool_data_prefix(name));
        let (kvs, _) = inner
            .call(|| crate::store::list_all(&*inner.store, &range, inner.opts.list_page))
            .await?;
        let mut holders: HashMap<String, Vec<String>> = HashMap::new();
        let mut bound = Vec::new();
        for kv in &kvs {
            if let Some(id) = inner.layout.parse_id_key(name, &kv.key) {
                if let Some(IdRecord::Bound(key)) = IdRecord::decode(&kv.value) {
                    bound.push((id, key));
                }
            } else if let Some((key, holder)) = inner.layout.parse_ref_key(name, &kv.key) {
                holders.entry(key).or_default().push(holder);
            }
        }
        bound.sort();
        Ok(bound
            .into_iter()
            .map(|(id, key)| {
                let mut h = holders.remove(&key).unwrap_or_default();
                h.sort();
                Binding { id, key, holders: h }
            })
            .collect())
    }

    /// Every binding in the cache, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        self.state.lock_cache().snapshot()
    }

    /// Subscribes to the pool's events. A subscriber that falls more than `event_buffer` events
    /// behind gets [`Event::Lagged`] and should re-read [`Pool::snapshot`]; it never slows
    /// allocation down.
    ///
    /// The subscription starts with the pool as the cache holds it: every binding as an `Upsert`
    /// (by ID) and, if the pool has been listed, one `Synced`; then every change after that, in
    /// order, none twice and none missing. So a subscriber that arrives late, or on another
    /// thread, still sees a complete picture.
    pub fn events(&self) -> Events {
        let cache = self.state.lock_cache();
        let replay = remote::replay(&cache, self.state.listed.load(Ordering::Acquire));
        let rx = self.state.events.subscribe();
        drop(cache);
        Events::new(replay, rx)
    }

    /// Like [`Pool::events`] for every cluster of the pool: the local cache and each remote view
    /// replay their bindings (then one `Synced` each, if listed), then live events of all of them
    /// follow, each tagged with its cluster; events of one cluster keep their order. A `Lagged`
    /// (tagged `local`) means events of any cluster were missed: re-read
    /// [`Pool::snapshot_all`].
    pub fn cluster_events(&self) -> ClusterEvents {
        let remotes = lock(&self.state.remotes);
        let cache = self.state.lock_cache();
        let views: Vec<_> = remotes.values().map(|v| (v.clone(), v.lock())).collect();
        let mut replay = VecDeque::new();
        let local = remote::replay(&cache, self.state.listed.load(Ordering::Acquire));
        replay
            .extend(local.into_iter().map(|event| ClusterEvent { cluster: Cluster::Local, event }));
        for (v, g) in &views {
            let r = remote::replay(&g.cache, g.listed);
            replay.extend(
                r.into_iter().map(|event| ClusterEvent { cluster: v.cluster.clone(), event }),
            );
        }
        let rx = self.state.mesh.subscribe();
        drop(views);
        drop(cache);
        drop(remotes);
        ClusterEvents { replay, rx }
    }

    /// Starts a read-only view of this pool in another cluster's `store` (Cilium's
    /// `WatchRemoteKVStore`): reads the remote pool's spec (one round trip; `PoolNotFound` if it has
    /// none), refuses it if its ID space overlaps this pool's or another remote's, then follows its
    /// bindings in the background. Never writes to `store`. Local operations never wait for it.
    pub async fn watch_remote(
        &self,
        name: &str,
        store: Arc<dyn Store>,
        opts: RemoteOptions,
    ) -> Result<RemotePool> {
        remote::validate_remote_name(name)?;
        if lock(&self.state.remotes).contains_key(name) {
            return Err(Error::invalid_str(
                "remote name",
                name,
                "this pool already has a remote view of that name; remove it first",
            ));
        }
        let others = self.spaces();
        let view =
            remote::open(name, &self.state.spec, store, opts, &others, self.state.mesh.clone())
                .await?;
        let mut remotes = lock(&self.state.remotes);
        // Checked again: another call may have added a remote while the spec was read.
        let now: Vec<_> = remotes.values().map(|v| (v.cluster.clone(), v.space())).collect();
        let clash = remotes.contains_key(name)
            || now.iter().any(|(_, (lo, hi))| view.space().0 <= *hi && *lo <= view.space().1);
        if clash {
            view.abort_tasks();
            return Err(Error::invalid_str(
                "remote name",
                name,
                "another remote view of this pool was added meanwhile with this name or an overlapping ID space",
            ));
        }
        remotes.insert(name.to_string(), view.clone());
        Ok(RemotePool { view })
    }

    /// Drops remote view `name` (Cilium's `RemoveRemoteKVStore`): stops following it and emits a
    /// `Delete` for every binding it contributed. False if there was none.
    pub fn remove_remote(&self, name: &str) -> bool {
        let mut remotes = lock(&self.state.remotes);
        match remotes.remove(name) {
            Some(v) => {
                v.shut();
                true
            }
            None => false,
        }
    }

    /// The remote views of this pool, by name.
    pub fn remotes(&self) -> Vec<RemotePool> {
        lock(&self.state.remotes).values().map(|v| RemotePool { view: v.clone() }).collect()
    }

    /// Remote view `name`, if this pool has one.
    pub fn remote(&self, name: &str) -> Option<RemotePool> {
        lock(&self.state.remotes).get(name).map(|v| RemotePool { view: v.clone() })
    }

    fn spaces(&self) -> Vec<(Cluster, (u64, u64))> {
        let mut v = vec![(Cluster::Local, remote::id_space(&self.state.spec))];
        v.extend(lock(&self.state.remotes).values().map(|r| (r.cluster.clone(), r.space())));
        v
    }

    /// The key bound to `id` in any cluster, and which one (no round trip). ID spaces of the
    /// clusters never overlap, so the ID alone picks the one view to ask.
    pub fn key_of_any(&self, id: u64) -> Option<(Cluster, String)> {
        let (lo, hi) = remote::id_space(&self.state.spec);
        if id >= lo && id <= hi {
            return self.key_of(id).map(|k| (Cluster::Local, k));
        }
        let view = lock(&self.state.remotes)
            .values()
            .find(|v| id >= v.space().0 && id <= v.space().1)
            .cloned()?;
        let k = view.lock().cache.key_of(id).map(str::to_string)?;
        Some((view.cluster.clone(), k))
    }

    /// Every (cluster, ID) `key` is bound to: local first, then remotes by name (no round trip).
    pub fn ids_of(&self, key: &str) -> Vec<(Cluster, u64)> {
        let mut out = Vec::new();
        if let Some(id) = self.get(key) {
            out.push((Cluster::Local, id));
        }
        for v in lock(&self.state.remotes).values() {
            if let Some(id) = v.lock().cache.get(key) {
                out.push((v.cluster.clone(), id));
            }
        }
        out
    }

    /// Every binding of every cluster (Cilium's `ForeachCache`): local first, then remotes by
    /// name, each sorted by ID. Each view is read at one instant; views are read one after another.
    pub fn snapshot_all(&self) -> Vec<(Cluster, u64, String)> {
        let mut out: Vec<(Cluster, u64, String)> =
            self.snapshot().into_iter().map(|(id, k)| (Cluster::Local, id, k)).collect();
        let views: Vec<_> = lock(&self.state.remotes).values().cloned().collect();
        for v in views {
            let snap = v.lock().cache.snapshot();
            out.extend(snap.into_iter().map(|(id, k)| (v.cluster.clone(), id, k)));
        }
        out
    }

    /// Calls `f` on every binding of every cluster, in [`Pool::snapshot_all`]'s order, without
    /// copying keys; each view is locked while it is visited, so keep `f` short.
    pub fn foreach_all(&self, mut f: impl FnMut(&Cluster, u64, &str)) {
        for (id, k) in self.state.lock_cache().snapshot() {
            f(&Cluster::Local, id, &k);
        }
        let views: Vec<_> = lock(&self.state.remotes).values().cloned().collect();
        for v in views {
            let g = v.lock();
            for (id, k) in g.cache.snapshot() {
                f(&v.cluster, id, &k);
            }
        }
    }

    /// Waits until the cache holds the whole pool (the first listing is done).
    pub async fn wait_synced(&self) -> Result<()> {
        self.inner.wait_synced(&self.state).await
    }

    /// Re-lists the pool and re-references every key this process holds (DESIGN §7).
    pub async fn resync(&self) -> Result<()> {
        self.state.synced.send_replace(false);
        self.state.relist.request();
        self.wait_synced().await?;
        let mut keys: Vec<String> = lock(&self.state.held).keys().cloned().collect();
        keys.sort(); // fixed repair order (reproducible simulations)
        for k in keys {
            self.inner.repair_key(&self.state, &k).await?;
        }
        Ok(())
    }

    /// One sweep of the pool now: reclaims bindings that have had no reference for the pool's idle
    /// grace (DESIGN §8). Safe to run in many processes at once and alongside acquires.
    pub async fn sweep(&self) -> Result<crate::sweeper::SweepReport> {
        let f = crate::sweeper::sweep(&self.inner, &self.state, false);
        let r = crate::metrics::timed(self.spec().name(), "sweep", f).await;
        crate::metrics::swept(self.spec().name(), &r);
        if let Ok(report) = &r {
            crate::metrics::reclaimed(self.spec().name(), "sweep", report.reclaimed.len());
        }
        r
    }

    /// What a sweep would reclaim now, without reclaiming it.
    pub async fn sweep_dry_run(&self) -> Result<crate::sweeper::SweepReport> {
        crate::sweeper::sweep(&self.inner, &self.state, true).await
    }

    /// Keys this process holds through its session, with their IDs and local counts.
    pub fn held(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> =
            lock(&self.state.held).iter().map(|(k, h)| (k.clone(), h.id, h.count)).collect();
        v.sort();
        v
    }
}

/// A subscription to one pool's (or one remote view's) events: a replay, then live events.
pub struct Events {
    replay: VecDeque<Event>,
    rx: broadcast::Receiver<Event>,
}

impl Events {
    pub(crate) fn new(replay: VecDeque<Event>, rx: broadcast::Receiver<Event>) -> Events {
        Events { replay, rx }
    }

    /// The next event; `None` once the allocator is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Event::Lagged { missed: n }),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<Event> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.try_recv() {
            Ok(e) => Some(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Event::Lagged { missed: n }),
            Err(_) => None,
        }
    }

    /// As a `Stream`.
    pub fn into_stream(self) -> futures::stream::BoxStream<'static, Event> {
        Box::pin(futures::stream::unfold(
            self,
            |mut ev| async move { ev.recv().await.map(|e| (e, ev)) },
        ))
    }
}

/// A subscription to the events of every cluster of a pool ([`Pool::cluster_events`]).
pub struct ClusterEvents {
    replay: VecDeque<ClusterEvent>,
    rx: broadcast::Receiver<ClusterEvent>,
}

impl ClusterEvents {
    fn lagged(missed: u64) -> ClusterEvent {
        ClusterEvent { cluster: Cluster::Local, event: Event::Lagged { missed } }
    }

    /// The next event; `None` once the allocator is gone.
    pub async fn recv(&mut self) -> Option<ClusterEvent> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.recv().await {
            Ok(e) => Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Self::lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<ClusterEvent> {
        if let Some(e) = self.replay.pop_front() {
            return Some(e);
        }
        match self.rx.try_recv() {
            Ok(e) => Some(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Self::lagged(n)),
            Err(_) => None,
        }
    }
}
