//! Per-pool state shared by the pool handles, the sync task and the repairs, and the per-key
//! single-flight lock ([`KeyGuard`]): one async mutex per key makes concurrent acquires of the same
//! key share one request and orders acquire against release of it; the guard removes the key's
//! entry when the last user is gone, also when the future holding it is dropped mid-flight.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::lazy_broadcast::LazyBroadcast;
use crate::cache::{Batch, Event, PoolCache};
use crate::pool::PoolSpec;
use crate::remote::{Cluster, ClusterEvent, RemoteView};
use crate::store::{LeaseId, Revision};

/// A key this process holds through its session.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held {
    pub(super) id: u64,
    pub(super) count: u64,
}

/// One version of a pool's spec: what a resize replaces.
#[derive(Clone, Debug)]
pub(crate) struct SpecVersion {
    pub(crate) spec: Arc<PoolSpec>,
    /// The mod revision of the spec record holding `spec`.
    pub(crate) rev: Revision,
}

/// Per-pool state shared by the pool handles, the sync task and the repairs.
pub(crate) struct PoolState {
    /// The spec the pool was opened with. Its name, prefix, strategy and reclaim settings never
    /// change while the pool exists; its range and reserved IDs may (a resize): range-dependent
    /// decisions read [`PoolState::spec_now`].
    pub(crate) spec: PoolSpec,
    /// The create revision of the spec record `spec` was read from: the pool's incarnation (a
    /// deleted and re-created pool has another).
    pub(crate) spec_rev: Revision,
    /// The spec version decisions are made against now, and its record's mod revision: every
    /// write compares that mod revision (DESIGN §11), so nothing is written into a deleted,
    /// re-created or resized pool under a spec that no longer holds (docs/design/resize.md).
    pub(crate) now: RwLock<SpecVersion>,
    /// Keys with a bind attempt of this process's leased holder whose outcome is unknown (timed
    /// out): it may still be applied late, so the next release of the key bumps the holder's
    /// fence record, which makes such an attempt fail (docs/design/fences.md, "Late commits").
    pub(super) doubt: Mutex<HashSet<String>>,
    /// The session lease on which this process bumped its pinned holder's fence record in this
    /// pool before its first bind, while the cluster version is not finalized
    /// (`Inner::fence_earlier_lives`).
    pub(super) pinned_fenced: Mutex<Option<crate::store::LeaseId>>,
    pub(super) cache: Mutex<PoolCache>,
    /// Keys this process holds. Asked first by every `Pool::get`, so it hashes with foldhash (as the
    /// cache's bindings do: per-process random seed) rather than SipHash, which cost about 3× more
    /// on a 55-byte key (26 against 8–10 ns a lookup in a 1,000-key map, docs/benchmarks/findings.md).
    pub(super) held: Mutex<HashMap<String, Held, foldhash::fast::RandomState>>,
    pub(super) key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The pool's event channel; `None` once the state retired, which ends every subscription
    /// (the receivers see the channel closed after the last buffered event).
    pub(super) events: Mutex<Option<LazyBroadcast<Batch<Event>>>>,
    /// The cache's changes with their revisions (see [`super::events::Stamped`]), sent under the
    /// cache lock by the sync task only.
    pub(super) stamped: LazyBroadcast<super::events::Stamped>,
    /// The revision of the last `Stamped::Through` sent (under the cache lock): the cache is at a
    /// revision boundary when its revision equals this.
    pub(super) through: std::sync::atomic::AtomicI64,
    /// Events of every cluster of the pool (local and remote views), tagged.
    pub(super) mesh: LazyBroadcast<Batch<ClusterEvent>>,
    /// Remote views of this pool by name (lock order: this map, then the cache, then each view).
    /// A read-write lock: lookups across clusters (`key_of_any`, `ids_of`) only read it and must
    /// not queue behind each other; it is written when a remote is added or removed, or changes
    /// its ID space.
    pub(super) remotes: RwLock<Remotes>,
    /// A listing has been applied to the cache (set under the cache lock): replays end with
    /// `Synced`.
    pub(crate) listed: AtomicBool,
    /// The pool's follower (listing, then watch: `sync.rs`) was started. Set at open unless the
    /// allocator opens pools lazily (`AllocatorOptions::lazy_view`), then by the first thing that
    /// needs the whole view (`Inner::follow`). While unset, the cache holds no other process's
    /// bindings and nothing will ever fill it.
    pub(crate) following: AtomicBool,
    pub(super) synced: tokio::sync::watch::Sender<bool>,
    /// The store revision the cache has applied (watch events and listings).
    pub(super) applied: tokio::sync::watch::Sender<Revision>,
    /// Pages read by listings so far: `wait_synced` waits as long as this moves.
    pub(crate) list_progress: tokio::sync::watch::Sender<usize>,
    /// Why the last listing failed, when waiting for the next one is pointless (a damaged store
    /// file: `sync::ends_waits`). Cleared by a listing that succeeds. `wait_synced` returns it at
    /// once instead of waiting out its no-progress budget and reporting `Unavailable`.
    pub(crate) list_failure: Mutex<Option<crate::error::Error>>,
    /// A complete listing is being applied to the cache (set by `sync.rs` once the last page
    /// is in, cleared when the view is swapped): local work that cannot hang on the store, so
    /// `wait_synced` does not hold it to its no-progress budget. At 1M bindings on a loaded
    /// machine the apply alone can outlast that budget, and the waiter reported a pool that was
    /// a moment from synced as one that "could not be listed".
    pub(crate) applying: AtomicBool,
    pub(super) quarantine: tokio::sync::Mutex<Option<(LeaseId, Instant)>>,
    /// Asks the pool's follower to re-list (resync, pool deleted).
    pub(crate) relist: Arc<crate::feed::Relist>,
    pub(crate) idle_since: Mutex<HashMap<(String, i64), Instant>>,
    /// Coalescing of concurrent single-key acquires and releases (see `coalesce`).
    pub(super) lanes: super::lanes::Lanes<OwnedKeyGuard>,
    /// Set once a write found the pool deleted or re-created (or this allocator deleted it): the
    /// error every later operation on this state returns. A retired state never comes back; the
    /// caller opens the pool again (docs/design/protocol.md, "Pool incarnations").
    pub(super) retired: Mutex<Option<crate::error::Error>>,
    /// The pool's own background tasks (sync, sweeper), stopped when it retires.
    pub(super) tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these short, non-async critical sections would be a bug in this
    // crate; the data is still consistent at every await-free step, so keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The remote views of a pool: by name, and by ID space for lookups.
#[derive(Default)]
pub(crate) struct Remotes {
    by_name: std::collections::BTreeMap<String, Arc<RemoteView>>,
    /// `(lo, hi, view)` by `lo`, without refused views (they have no space); rebuilt on every
    /// change. A lookup by ID searches this short contiguous list instead of walking the map and
    /// reading each view's space (`key_of_any` ≤ 2x a local `key_of`).
    routes: Vec<(u64, u64, Arc<RemoteView>)>,
}

impl Remotes {
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<RemoteView>> {
        self.by_name.get(name)
    }

    pub(crate) fn contains_key(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The views by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Arc<RemoteView>)> {
        self.by_name.iter()
    }

    /// The views, by name.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<RemoteView>> {
        self.by_name.values()
    }

    pub(crate) fn insert(&mut self, name: String, view: Arc<RemoteView>) {
        self.by_name.insert(name, view);
        self.reroute();
    }

    pub(crate) fn remove(&mut self, name: &str) -> Option<Arc<RemoteView>> {
        let v = self.by_name.remove(name);
        self.reroute();
        v
    }

    /// Rebuilds the routes from the views' spaces (after one changed).
    pub(crate) fn reroute(&mut self) {
        self.routes = self
            .by_name
            .values()
            .map(|v| (v.space(), v))
            .filter(|((lo, hi), _)| lo <= hi)
            .map(|((lo, hi), v)| (lo, hi, v.clone()))
            .collect();
        self.routes.sort_unstable_by_key(|r| r.0);
    }

    /// The view whose ID space holds `id` (spaces never overlap, so at most one).
    pub(crate) fn route(&self, id: u64) -> Option<&Arc<RemoteView>> {
        let i = self.routes.partition_point(|r| r.0 <= id);
        let (_, hi, v) = self.routes.get(i.checked_sub(1)?)?;
        (id <= *hi).then_some(v)
    }
}

/// [`lock`] for reading a read-write lock.
pub(super) fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] for writing a read-write lock.
pub(super) fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

impl PoolState {
    /// Publishes the pool's gauges (bindings, free IDs, capacity, and cache lag behind `seen`, the
    /// newest revision this process has seen) from its cache.
    pub(crate) fn publish_gauges(&self, seen: crate::store::Revision) {
        let (bindings, free, applied) = {
            let mut c = self.lock_cache();
            (c.len(), c.free_ids().free_count(), c.revision())
        };
        crate::metrics::pool_gauges(
            self.spec.name(),
            bindings,
            free,
            self.spec_now().capacity(),
            seen - applied,
        );
    }
}

impl PoolState {
    /// The pool's spec as it is now (range and reserved IDs as last resized).
    pub(crate) fn spec_now(&self) -> Arc<PoolSpec> {
        read(&self.now).spec.clone()
    }

    /// [`PoolState::spec_now`] and [`PoolState::spec_fence`], read together.
    pub(crate) fn version(&self) -> (Arc<PoolSpec>, Revision) {
        let v = read(&self.now);
        (v.spec.clone(), v.rev)
    }

    /// The mod revision of the spec record [`PoolState::spec_now`] came from: what every write
    /// compares (see [`crate::protocol::Fences`]).
    pub(crate) fn spec_fence(&self) -> Revision {
        read(&self.now).rev
    }

    /// Adopts a newer version of this pool's spec record (a resize: same incarnation, higher mod
    /// revision): later decisions use its range, the free set is rebuilt from the bindings known,
    /// and the follower re-lists, so that records of IDs the old range ignored are counted.
    /// Returns false (and changes nothing) for a version not newer than the one in force.
    pub(crate) fn adopt(&self, spec: PoolSpec, rev: Revision) -> bool {
        {
            // Lock order: the cache, then the spec version (as `retire` takes them).
            let mut cache = self.lock_cache();
            let mut now = write(&self.now);
            if rev <= now.rev {
                return false;
            }
            tracing::info!(pool = %spec.name(), spec = %spec, "the pool was resized; using its new spec");
            let spec = Arc::new(spec);
            cache.set_spec((*spec).clone());
            *now = SpecVersion { spec: spec.clone(), rev };
            drop(now);
            // Under the cache lock, in order with the bindings' changes.
            self.emit_spec(rev, (*spec).clone());
        }
        self.relist.request();
        true
    }

    /// What a write that found the pool's spec record changed (`spec_now`, read back in the same
    /// txn) does: a newer version of the same incarnation is a resize, adopted (the state stays
    /// live) and answered with a retryable `Unavailable` (the write was decided against the old
    /// range; nothing was written); anything else (deleted, re-created, unreadable) retires the
    /// state with [`PoolState::gone_error`]. Returns the error for the write's caller.
    pub(crate) fn spec_moved(
        &self,
        spec_now: Option<crate::store::KeyValue>,
    ) -> crate::error::Error {
        if let Some(kv) = spec_now.as_ref().filter(|kv| kv.create_revision == self.spec_rev) {
            if kv.mod_revision <= self.spec_fence() {
                // Already adopted (another write or the spec watch got there first).
                return self.resized_error();
            }
            if let Ok(spec) = PoolSpec::from_json(&kv.value) {
                if spec.name() == self.spec.name() && spec.same_but_range(&self.spec) {
                    self.adopt(spec, kv.mod_revision);
                    return self.resized_error();
                }
            }
        }
        let name = self.spec.name();
        tracing::warn!(pool = %name, "the pool was deleted (or re-created) under this handle");
        let err = self.gone_error(spec_now.map(|kv| kv.value));
        self.retire(err.clone());
        self.live().err().unwrap_or(err)
    }

    /// The answer to a write decided against a spec version that a resize replaced meanwhile.
    pub(crate) fn resized_error(&self) -> crate::error::Error {
        crate::error::Error::unavailable(format!(
            "pool {:?} was resized while this request was under way; nothing was written: retry",
            self.spec.name()
        ))
    }

    /// `Err` with the reason if this state was retired (its pool deleted or re-created).
    pub(crate) fn live(&self) -> crate::error::Result<()> {
        match &*lock(&self.retired) {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// `Err` while the pool's last listing failed in a way no retry cures (see `list_failure`).
    pub(crate) fn listing_failed(&self) -> crate::error::Result<()> {
        match &*lock(&self.list_failure) {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }

    /// Why a write found this pool's spec changed, from the spec there now (`spec_now`, read back
    /// by the write's else branch): `PoolNotFound` (deleted), `RangeMismatch` (re-created with
    /// another spec) or `PoolReplaced` (re-created with the same spec; docs/design/protocol.md,
    /// "Pool handles outlive their pool").
    pub(crate) fn gone_error(&self, spec_now: Option<Vec<u8>>) -> crate::error::Error {
        use crate::error::Error;
        let name = self.spec.name().to_string();
        match spec_now.map(|b| PoolSpec::from_json(&b)) {
            None => Error::PoolNotFound { pool: name },
            Some(Ok(existing)) if existing != *self.spec_now() => Error::RangeMismatch {
                pool: name,
                existing: Box::new(existing),
                requested: Box::new((*self.spec_now()).clone()),
            },
            Some(_) => Error::PoolReplaced { pool: name },
        }
    }

    /// Retires the state for good (see [`PoolState::retired`]): later operations fail with `err`,
    /// its sync task and sweeper stop, and its view and holds are dropped (they described a pool
    /// that no longer exists; keeping them would serve reads of the dead pool as if current).
    pub(crate) fn retire(&self, err: crate::error::Error) {
        {
            let mut r = lock(&self.retired);
            if r.is_some() {
                return;
            }
            *r = Some(err);
        }
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        {
            // Subscribers mirror the pool from its events: tell them every binding is gone (a
            // pool deleted by another process shows the same `Delete`s through the watch, for
            // whatever the watch delivered first) and then end their streams, under the cache
            // lock so that no event of the old view follows (docs/design/protocol.md).
            let mut cache = self.lock_cache();
            let deletes: Vec<Event> =
                cache.snapshot().into_iter().map(|(id, key)| Event::Delete { id, key }).collect();
            self.emit_all(deletes);
            *cache = PoolCache::new((*self.spec_now()).clone());
            self.listed.store(false, std::sync::atomic::Ordering::Release);
            lock(&self.events).take();
        }
        lock(&self.held).clear();
        lock(&self.doubt).clear();
        // Wake anyone waiting for the first listing (it will never come).
        self.list_progress.send_modify(|pages| *pages += 1);
    }

    /// A receiver of the pool's events; one that is closed already once the state retired.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Batch<Event>> {
        match &*lock(&self.events) {
            Some(tx) => tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    pub(crate) fn lock_cache(&self) -> MutexGuard<'_, PoolCache> {
        lock(&self.cache)
    }

    /// [`PoolState::emit`] for a change of the store's history at `revision`: also sent to the
    /// stamped subscribers. Called with the cache lock held.
    pub(crate) fn emit_at(&self, revision: Revision, e: Event) {
        self.stamped.send(super::events::Stamped::Event { revision, event: e.clone() });
        self.emit(e);
    }

    /// [`PoolState::emit_all`] for a listing's changes at `revision`: also sent to the stamped
    /// subscribers, as one [`Stamped::Listing`](super::events::Stamped::Listing) (as `emit_all`
    /// sends one message), so that a re-listing of a big pool never makes them lag. Called with
    /// the cache lock held.
    pub(crate) fn emit_all_at(&self, revision: Revision, events: Vec<Event>) {
        // Subscribers subscribe under the cache lock, which the caller holds: a count of 0 stays
        // 0 until the events are out, and a listing of 1M bindings costs no 1M clones for nobody.
        if !events.is_empty() && self.stamped.receiver_count() > 0 {
            let listing: Batch<Event> = events.iter().cloned().collect();
            self.stamped.send(super::events::Stamped::Listing { revision, events: listing });
        }
        self.emit_all(events);
    }

    /// Whether anyone would receive a listing's changes (stamped, plain or mesh subscribers).
    /// Call with the cache lock held, under which subscribers subscribe: a `false` stays
    /// `false` until the caller has applied the listing.
    pub(crate) fn listening(&self) -> bool {
        self.stamped.receiver_count() > 0
            || self.mesh.receiver_count() > 0
            || lock(&self.events).as_ref().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Every change at or before `revision` has been emitted. Called with the cache lock held.
    pub(crate) fn emitted_through(&self, revision: Revision) {
        self.through.store(revision, std::sync::atomic::Ordering::Release);
        self.stamped.send(super::events::Stamped::Through { revision });
    }

    /// Tells the pool's subscribers (plain, cluster and stamped) that the spec version `rev` is
    /// now in force. Stamped subscribers get it as [`Stamped::Event`] at `rev` with no
    /// [`Stamped::Through`]: the bindings' watch may still deliver changes before `rev`, and
    /// only it says when a revision is complete. Call with the cache lock held.
    ///
    /// [`Stamped::Event`]: super::events::Stamped::Event
    /// [`Stamped::Through`]: super::events::Stamped::Through
    pub(crate) fn emit_spec(&self, rev: Revision, spec: PoolSpec) {
        self.emit_at(rev, Event::Spec(spec));
    }

    /// Sends `e` to the pool's subscribers. Changes of the cache's bindings are emitted with the
    /// cache lock held, so that a new subscriber's replay and its live events never overlap or
    /// leave a gap.
    pub(crate) fn emit(&self, e: Event) {
        self.emit_all(vec![e]);
    }

    /// Sends `events` (a listing's changes) to the pool's subscribers as one message, so that a
    /// listing never makes a subscriber lag (`events::Batch`). Call with the cache lock held.
    pub(crate) fn emit_all(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        // Only for subscribers there are (they subscribe under the cache lock the caller holds):
        // a first listing of 1M bindings with nobody listening copies nothing.
        let tagged: Option<Batch<ClusterEvent>> = (self.mesh.receiver_count() > 0).then(|| {
            events
                .iter()
                .map(|e| ClusterEvent { cluster: Cluster::Local, event: e.clone() })
                .collect()
        });
        // No subscriber is fine; a full buffer drops the oldest and the subscriber sees `Lagged`.
        if let Some(tx) = &*lock(&self.events) {
            if tx.receiver_count() > 0 {
                tx.send(Batch::from(events));
            }
        }
        if let Some(tagged) = tagged {
            self.mesh.send(tagged);
        }
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

    /// Takes the single-flight lock of `key` (waits for the current holder). The entry in the
    /// per-key map lives exactly as long as someone holds or waits for it: the returned guard, and
    /// the future while it waits, remove it when dropped, also when the caller is cancelled
    /// mid-flight (a dropped future, a `timeout`).
    pub(crate) async fn lock_key(&self, key: &str) -> KeyGuard<'_> {
        lock_key_in(self, key).await
    }

    /// [`PoolState::lock_key`] with a guard that owns its pool, so it can outlive the caller: a
    /// coalesced call hands it to its batch, which keeps the key locked until its txn is done even
    /// if the caller is cancelled meanwhile (see `coalesce`).
    pub(crate) async fn lock_key_owned(self: &Arc<Self>, key: &str) -> OwnedKeyGuard {
        lock_key_in(self.clone(), key).await
    }

    /// Keys with a single-flight lock held or waited for (tests: the map must not leak).
    #[cfg(test)]
    pub(crate) fn key_locks_len(&self) -> usize {
        lock(&self.key_locks).len()
    }
}

async fn lock_key_in<P: Deref<Target = PoolState>>(pool: P, key: &str) -> KeyGuardOf<P> {
    let lock = lock(&pool.key_locks).entry(key.to_string()).or_default().clone();
    let entry = KeyEntry { pool, key: key.to_string(), lock };
    let held = entry.lock.clone().lock_owned().await;
    KeyGuardOf { _held: held, _entry: entry }
}

/// One user's claim on a key's entry in the per-key lock map; removes the entry on drop if no
/// one else holds or waits for it. `P` is how it reaches the pool: borrowed, or owned (an `Arc`).
struct KeyEntry<P: Deref<Target = PoolState>> {
    pool: P,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl<P: Deref<Target = PoolState>> Drop for KeyEntry<P> {
    fn drop(&mut self) {
        let mut locks = lock(&self.pool.key_locks);
        // Two references: ours and the map's (others clone theirs under the map lock, which we
        // hold). Nobody else holds or waits, so the entry can go.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.key);
        }
    }
}

/// The per-key single-flight lock of one key, held (see [`PoolState::lock_key`]).
pub(crate) struct KeyGuardOf<P: Deref<Target = PoolState>> {
    // Field order matters: the mutex guard (which holds a reference to the mutex) goes first, so
    // the entry's drop sees only its own and the map's reference when nobody else is there.
    _held: tokio::sync::OwnedMutexGuard<()>,
    _entry: KeyEntry<P>,
}

/// A key's single-flight lock borrowed from its pool (the common case).
pub(crate) type KeyGuard<'a> = KeyGuardOf<&'a PoolState>;

/// A key's single-flight lock that owns its pool ([`PoolState::lock_key_owned`]).
pub(crate) type OwnedKeyGuard = KeyGuardOf<Arc<PoolState>>;
